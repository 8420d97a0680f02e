"""The storage sections of bench/RESULTS.md: the storage engine alone (tessera_bench_storage:
bench/out/tessera.jsonl) against fio (fio_pass1.jsonl, fio_pass2.jsonl: bench/peers/disk_fio.sh)
and torch.save/torch.load (torch.jsonl: bench/peers/save_torch.py) of the same session. Its
rows of the Targets table and the notes under it; then "Save, every configuration", "Read,
every configuration", "Compression ratio", "Index merge", "Peers measured in this session",
"Noise" and "Where the time goes". Standard library only (bench/report.py runs it with
Debian's /usr/bin/python3)."""
import os

from report_common import (HEADLINE_THREADS, gb, load, med, ratio, ratio_text, runs_text,
                           verdict)

# Targets of the storage work, as ratios to the peer measured in the same session.
WRITE_VS_FIO = 0.9   # save ≥ 0.9x fio sequential write (buffered + end fsync, 1 job)
READ_VS_FIO = 0.9    # read ≥ 0.9x fio read_direct (1 job)
VS_TORCH = 2.0       # save ≥ 2x torch.save+fsync, read ≥ 2x torch.load (cold and warm)

# zstd -b1 ratios on the same kinds of data, from bench/peers/results/zstd_run*.jsonl
# (bench/peers/zstd_speed.sh; not re-run by run.sh, ratios are deterministic).
ZSTD_CLI_RATIO = {"float32": 1.083, "bfloat16": 1.282}


class Storage:
    """This session's storage figures: ours, fio's and torch's."""

    def __init__(self, out_dir):
        self.fio = [load(os.path.join(out_dir, f"fio_pass{i}.jsonl")) for i in (1, 2)]
        self.torch_rows = load(os.path.join(out_dir, "torch.jsonl"))
        self.ours = load(os.path.join(out_dir, "tessera.jsonl"))

        # --- peers ---
        self.fio_wbuf = med(self.fio_values("write_buffered_fsync"))
        self.fio_wdirect = med(self.fio_values("write_direct"))
        self.fio_rdirect = med(self.fio_values("read_direct"))
        self.t_save = med(self.torch_values("torch.save+fsync"))
        self.t_cold = med(self.torch_values("torch.load_cold"))
        self.t_warm = med(self.torch_values("torch.load_warm"))
        self.torch_version = next((r.get("torch") for r in self.torch_rows
                                   if r.get("op") == "dcp"), "?")

        # --- ours ---
        ours = self.ours
        self.config = next((r for r in ours if r.get("op") == "config"), {})
        self.runs = [r for r in ours
                     if "stat" not in r and r.get("op") in ("save", "read_cold", "read_warm")]
        self.merges = [r for r in ours if r.get("op") == "index_merge"]
        self.configs = []
        for r in self.runs:
            key = (r["dtype"], r["codec"], r["threads"])
            if key not in self.configs:
                self.configs.append(key)

    def fio_values(self, op, jobs=1):
        return [r["GBps"] for rows in self.fio for r in rows
                if r.get("bench") == "fio" and r["op"] == op and r["jobs"] == jobs]

    def torch_values(self, op):
        return [r["GBps"] for r in self.torch_rows if r.get("op") == op and "GBps" in r]

    def pick(self, op, key, field="GBps"):
        return [r[field] for r in self.runs
                if r["op"] == op and (r["dtype"], r["codec"], r["threads"]) == key]

    def engine(self):
        """The float32 zstd-1 save with HEADLINE_THREADS threads, GB/s (the cluster's peer)."""
        return med(self.pick("save", ("float32", "zstd-1", HEADLINE_THREADS)))

    # --- the Targets table ---
    def write_targets_intro(self, w):
        w(f"Our figures are float32 (the peers' state) with {HEADLINE_THREADS} threads (both cores); "
          "every configuration is in the detail tables below, with the same ratios. Peers are "
          "medians of this session: fio over its two passes (before and after ours), torch over "
          "save_torch.py's two runs. The storage rows are in GB/s.")
        w("")

    def write_target_rows(self, w):
        pick, fio_wbuf, fio_wdirect, fio_rdirect = (self.pick, self.fio_wbuf, self.fio_wdirect,
                                                    self.fio_rdirect)
        t_save, t_cold, t_warm = self.t_save, self.t_cold, self.t_warm

        def ours_med(op, codec, dtype="float32", threads=HEADLINE_THREADS):
            return med(pick(op, (dtype, codec, threads)))

        # (our measure, its label, the peer's label and figure, the target or None, a note)
        rows = [
            ("save", "save {} vs fio write, buffered + end fsync, 1 job", fio_wbuf, WRITE_VS_FIO, None),
            ("save", "(reference) save {} vs fio write, O_DIRECT, 1 job", fio_wdirect, None, "—"),
            ("read_cold", "read cold {} vs fio read, O_DIRECT, 1 job", fio_rdirect, READ_VS_FIO, None),
            ("read_warm", "(reference) read warm {} vs fio read, O_DIRECT, 1 job", fio_rdirect, None,
             "page cache, not the disk"),
            ("save", "save {} vs torch.save + fsync", t_save, VS_TORCH, None),
            ("read_cold", "read cold {} vs torch.load cold", t_cold, VS_TORCH, None),
            ("read_warm", "read warm {} vs torch.load warm", t_warm, VS_TORCH, None),
        ]
        for op, label, peer, needed, note in rows:
            for codec in ("zstd-1", "none"):
                o = ours_med(op, codec)
                r = ratio(o, peer)
                target = f"≥ {needed}× | {verdict(r, needed)}" if needed else f"— | {note}"
                w(f"| {label.format(codec)} | {gb(o)} | {gb(peer)} | {ratio_text(r)} | {target} |")

    def write_target_notes(self, w):
        """What the Targets table's storage rows rest on, under the table."""
        pick, torch_values, t_cold, t_warm = self.pick, self.torch_values, self.t_cold, self.t_warm
        zc = pick("save", ("float32", "zstd-1", HEADLINE_THREADS), "chunks_zstd")
        rc = pick("save", ("float32", "zstd-1", HEADLINE_THREADS), "chunks_raw")
        if zc and rc and rc[0] > zc[0]:
            w(f"**Note:** in the float32 \"zstd-1\" saves the writer stored {rc[0]} of "
              f"{zc[0] + rc[0]} chunks raw (its sampling found zstd saves < 10 % on float32 "
              "weights; see Compression ratio), so those rows mostly measure raw I/O; the "
              "bfloat16 rows below are the ones that exercise zstd.")
            w("")
        if t_cold and t_warm and t_warm < t_cold:
            w(f"**Caution:** torch.load warm ({runs_text(torch_values('torch.load_warm'))} GB/s) ran "
              f"slower than torch.load cold ({runs_text(torch_values('torch.load_cold'))} GB/s) in "
              "this session. Each torch.load allocates fresh tensors, so it likely paid the page "
              "faults of fresh memory again (slow on this VM, see Noise). The "
              "\"read warm vs torch.load warm\" ratios rest on that figure; compare with "
              "the reference runs' 1.5–9 GB/s (bench/peers/README.md) before leaning on them.")
            w("")
        w("Reading the verdicts: \"cold\" drops the guest's page cache only (fdatasync + "
          "posix_fadvise DONTNEED on every file, as save_torch.py does); the host very likely "
          "still caches the virtual disk, so cold reads (ours and torch's) can beat fio's O_DIRECT "
          "read, which always goes to the device. torch.load allocates fresh tensors (its page "
          "faults are in its time); our reads fill buffers that were allocated and touched before "
          "the timer started, as DCP's load does.")
        w("")

    # --- the detail sections ---
    def write_details(self, w, steps):
        """From "Save, every configuration" to "Where the time goes (this run)"; `steps`: the rows
        of steps.jsonl, for the load around the storage steps."""
        pick, fio_values, torch_values = self.pick, self.fio_values, self.torch_values
        fio, torch_rows, config = self.fio, self.torch_rows, self.config
        runs, merges, configs = self.runs, self.merges, self.configs
        fio_wbuf, fio_rdirect = self.fio_wbuf, self.fio_rdirect
        t_save, t_cold, t_warm = self.t_save, self.t_cold, self.t_warm

        w("## Save, every configuration")
        w("")
        w("SaveCheckpoint timed as a whole: chunking, checksums, zstd, write(2), fsync of the shard, "
          "fragment, index merge, directory fsyncs and the atomic rename. \"data\" is the time until "
          "the last chunk was handed to write(2) (from ShardOptions::on_progress); the rest is "
          "the fsync of the shard plus the index and commit.")
        w("")
        w("| dtype | codec | threads | runs GB/s | median GB/s | median s | data s | fsync + index + "
          "commit s | stored bytes | ratio | × fio buffered+fsync | × torch.save |")
        w("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for key in configs:
            dtype, codec, threads = key
            g = pick("save", key)
            o = med(g)
            stored = pick("save", key, "stored_bytes")
            rat = pick("save", key, "ratio")
            vs_torch = ratio_text(ratio(o, t_save)) if dtype == "float32" else "— (other state)"
            w(f"| {dtype} | {codec} | {threads} | {runs_text(g)} | {gb(o)} | "
              f"{gb(med(pick('save', key, 'time_s')))} | {gb(med(pick('save', key, 'data_s')))} | "
              f"{gb(med(pick('save', key, 'sync_commit_s')))} | {stored[0]:,} | {rat[0]:.3f} | "
              f"{ratio_text(ratio(o, fio_wbuf))} | {vs_torch} |")
        w("")

        # --- read details ---
        w("## Read, every configuration")
        w("")
        w("Every tensor read whole: CheckpointIndex::Open, then PlanRead + ExecuteRead per tensor "
          "into a preallocated, pre-touched buffer, sharing one ShardCache and a ThreadPool of "
          "`threads` threads; the time runs from opening the index to the last byte. After each "
          "read (untimed) every byte is compared with what was saved: all runs below verified.")
        w("")
        w("| dtype | codec | threads | cold runs GB/s | cold median | warm runs GB/s | warm median "
          "| cold × fio read_direct | cold × torch.load cold | warm × torch.load warm |")
        w("|---|---|---:|---|---:|---|---:|---:|---:|---:|")
        for key in configs:
            dtype, codec, threads = key
            c, wm = pick("read_cold", key), pick("read_warm", key)
            oc, ow = med(c), med(wm)
            tc = ratio_text(ratio(oc, t_cold)) if dtype == "float32" else "— (other state)"
            tw = ratio_text(ratio(ow, t_warm)) if dtype == "float32" else "— (other state)"
            w(f"| {dtype} | {codec} | {threads} | {runs_text(c)} | {gb(oc)} | {runs_text(wm)} | "
              f"{gb(ow)} | {ratio_text(ratio(oc, fio_rdirect))} | {tc} | {tw} |")
        unverified = [r for r in runs if r["op"].startswith("read") and not r.get("verified")]
        if unverified:
            w("")
            w(f"**{len(unverified)} read runs were not verified.**")
        w("")

        # --- compression ---
        w("## Compression ratio")
        w("")
        w("Logical bytes over the bytes of the shard file (header, chunk table and trailer "
          "included; index.sqlite not). Chunks that zstd cannot shrink by 1/64 are stored raw.")
        w("")
        w("| data | logical bytes | zstd-1 stored bytes | ratio | chunks stored zstd / raw | "
          "`zstd -b1` on 64 MiB of the same kind (bench/peers/results, not this run) |")
        w("|---|---:|---:|---:|---:|---:|")
        raw_notes = []
        for dtype in ("float32", "bfloat16"):
            key = next((k for k in configs if k[0] == dtype and k[1] == "zstd-1"), None)
            if key is None:
                continue
            stored = pick("save", key, "stored_bytes")[0]
            logical = next(r["bytes"] for r in runs if r["dtype"] == dtype)
            zc = pick("save", key, "chunks_zstd")
            rc = pick("save", key, "chunks_raw")
            chunks = f"{zc[0]} / {rc[0]}" if zc and rc else "—"
            w(f"| {dtype} N(0, 0.02){' truncated' if dtype == 'bfloat16' else ''} | {logical:,} | "
              f"{stored:,} | {logical / stored:.3f} | {chunks} | {ZSTD_CLI_RATIO[dtype]} |")
            if zc and rc and rc[0] > zc[0]:
                raw_notes.append(dtype)
        w("")
        for dtype in raw_notes:
            w(f"With codec zstd-1, most {dtype} chunks were stored raw: the shard writer samples "
              "each slice larger than one chunk and stores it raw when zstd would save less than "
              "ShardOptions::min_savings (10 %) of the sample. The one-chunk tensors are still "
              f"compressed. So the {dtype} \"zstd-1\" figures above mostly measure raw writes "
              "and reads, by the engine's own choice.")
            w("")

        # --- index merge ---
        w("## Index merge")
        w("")
        if merges:
            m0 = merges[0]
            w(f"{m0['fragments']} fragments × {m0['tensors'] // m0['fragments']} tensors "
              f"({m0['tensors']:,} tensors, each one slice of one chunk), written with "
              "FragmentBuilder::WriteTo into a staging dir (untimed, "
              f"{m0['build_fragments_s']:.1f} s once); each run merges a fresh copy of them. "
              "No peer and no numeric target; reported so regressions show.")
            w("")
            w("| measure | runs s | median s |")
            w("|---|---|---:|")
            ms = [r["time_s"] for r in merges]
            os_ = [r["open_s"] for r in merges]
            w(f"| MergeFragments (read + attach every fragment, checks, index build, fsync) | "
              f"{runs_text(ms)} | {gb(med(ms))} |")
            w(f"| CheckpointIndex::Open of the result ({m0['index_bytes']:,} bytes) | "
              f"{runs_text(os_)} | {gb(med(os_))} |")
        else:
            w("Not measured.")
        w("")

        # --- peers ---
        w("## Peers measured in this session")
        w("")
        w("### disk_fio.sh, both passes (pass 1 before our benchmark, pass 2 after)")
        w("")
        w("| op | jobs / streams | pass 1 | pass 2 | median | pass 2 / pass 1 |")
        w("|---|---:|---:|---:|---:|---:|")
        keys = []
        for rows in fio:
            for r in rows:
                k = (r.get("bench"), r.get("op"), r.get("jobs", r.get("streams")))
                if k not in keys:
                    keys.append(k)
        for k in keys:
            vals = []
            for rows in fio:
                v = next((r for r in rows if (r.get("bench"), r.get("op"),
                                              r.get("jobs", r.get("streams"))) == k), None)
                if v is None:
                    vals.append(None)
                elif "GBps" in v:
                    vals.append(v["GBps"])
                else:
                    vals.append(v.get("median_us"))
            unit = "µs RTT" if k[1] == "pingpong_1B_rtt" else "GB/s"
            got = [v for v in vals if v is not None]
            drift = ratio_text(ratio(vals[1], vals[0])) if len(got) == 2 else "—"
            w(f"| {k[0]} {k[1]} ({unit}) | {k[2] if k[2] is not None else '—'} | "
              f"{gb(vals[0]) if vals else '—'} | {gb(vals[1]) if len(vals) > 1 else '—'} | "
              f"{gb(med(got))} | {drift} |")
        first_touch = [r.get("first_GBps") for rows in fio for r in rows if r.get("bench") == "memcpy"]
        if first_touch:
            w("")
            w(f"memcpy into fresh pages (first copy, page faults): {runs_text(first_touch)} GB/s.")
        w("")
        w("### save_torch.py (1.00 GiB float32 state dict)")
        w("")
        w("| op | runs GB/s | median GB/s |")
        w("|---|---|---:|")
        ops = []
        for r in torch_rows:
            if "GBps" in r and r["op"] not in ops:
                ops.append(r["op"])
        for op in ops:
            v = torch_values(op)
            label = op + (f" ({next(r['ranks'] for r in torch_rows if r['op'] == op)} ranks)"
                          if op.startswith("dcp") else "")
            w(f"| {label} | {runs_text(v)} | {gb(med(v))} |")
        note = next((r.get("note") for r in torch_rows if r.get("op") == "dcp"), None)
        if note:
            w("")
            w(f"DCP: {note}.")
        w("")

        # --- noise ---
        w("## Noise")
        w("")
        spreads = []
        for op in ("write_direct", "write_buffered_fsync", "read_direct"):
            v = fio_values(op)
            if len(v) == 2 and min(v) > 0:
                spreads.append(f"{op} {max(v) / min(v):.2f}×")
        w("- **fio between its two passes** (max / min, 1 job): " + (", ".join(spreads) or "—") +
          ". The reference runs (bench/peers/README.md) saw the buffered + fsync write move "
          "0.48–1.57 GB/s in one afternoon.")
        worst = []
        for op in ("save", "read_cold", "read_warm"):
            best = None
            for key in configs:
                v = pick(op, key)
                if len(v) >= 2 and min(v) > 0:
                    s = max(v) / min(v)
                    if best is None or s > best[0]:
                        best = (s, key)
            if best:
                worst.append(f"{op} {best[0]:.2f}× ({best[1][0]} {best[1][1]}, threads={best[1][2]})")
        w("- **Our runs** (largest max / min of one configuration): " + (", ".join(worst) or "—") +
          ".")
        busy = [s for s in steps
                if s["step"] in ("fio_pass1", "torch", "tessera", "cluster", "fio_pass2")
                and max(s.get("loadavg_before", 0), s.get("loadavg_after", 0)) > 1.5]
        if busy:
            w("- **Other load during the measurements:** the 1-min load average exceeded 1.5 "
              "around " + ", ".join(f"{s['step']} ({s.get('loadavg_before')} → "
                                    f"{s.get('loadavg_after')})" for s in busy) +
              ". The steps raise it themselves (fio's tasks in I/O wait count, save_torch.py runs "
              "4 DCP ranks, ours 2–3 threads), so this is only a hint; a load that is already high "
              "before a step means other processes shared the 2 vCPUs.")
        w("- This is a 2-vCPU KVM guest whose disk, CPU and memory bandwidth move between runs "
          "(bench/peers/README.md: disk up to 3×, zstd about 1.4×). Only ratios within one "
          "session mean something; run `bash bench/run.sh` again before trusting a verdict "
          "near its threshold.")
        w("- The first large allocation in a process is slow here (1–4 GB/s of page faults). "
          "Our benchmark allocates and touches every buffer before timing; the first save of a "
          "process still pays for creating threads and zstd contexts, which is why the runs are "
          "all listed.")
        w("")

        # --- where the time goes ---
        w("## Where the time goes (this run)")
        w("")
        w("Medians of each part, so the parts need not add up exactly.")
        w("")
        for dtype in ("float32", "bfloat16"):
            for codec in ("zstd-1", "none"):
                key = (dtype, codec, HEADLINE_THREADS)
                t, d, s = (med(pick("save", key, f)) for f in ("time_s", "data_s", "sync_commit_s"))
                if t and d:
                    nbytes = config.get(f"bytes_{dtype}", 0)
                    w(f"- save {dtype} {codec}, {HEADLINE_THREADS} threads: {t:.2f} s = {d:.2f} s to "
                      f"hand every chunk to write(2) ({nbytes / d / 1e9:.2f} GB/s) + {s:.2f} s of "
                      "fsync, index and commit, one after the other.")
        for dtype in ("float32", "bfloat16"):
            for codec in ("zstd-1", "none"):
                key = (dtype, codec, HEADLINE_THREADS)
                c, wm = med(pick("read_cold", key)), med(pick("read_warm", key))
                if c and wm:
                    w(f"- read {dtype} {codec}, {HEADLINE_THREADS} threads: cold {c:.2f} GB/s, warm "
                      f"{wm:.2f} GB/s" + (" — about the same, so decoding, not the disk, sets the "
                                          "pace." if wm < 1.3 * c else "."))
        w("")
        w("Profiling notes (perf record, perf stat and strace -T on 2026-11-22, outside run.sh, "
          "so not re-measured by it): in a zstd save about a third of the CPU went to "
          "`EncodeChunk` allocating and zero-filling a fresh ZSTD_compressBound-sized "
          "`std::string` per 4 MiB chunk (memset, and page faults because the pool threads' malloc "
          "arenas hand the memory back between chunks). With malloc told to keep its memory "
          "(GLIBC_TUNABLES mmap/trim thresholds, a test only) the bfloat16 zstd-1 save, 2 threads, "
          "went from 0.44–0.54 to 0.64–0.90 GB/s and page faults fell by ~45 000 per save; float32 "
          "before the min_savings sampling showed the same (~0.55 → ~0.9 GB/s). The shard's fsync "
          "is 0.5–0.7 s of every 1 GiB save and starts only after the last write; fragment, merge "
          "and commit add ~20 ms. Reads of zstd chunks spend ~75 % of their CPU in zstd's "
          "decoder.")
        w("")
