#!/usr/bin/python3
"""Writes bench/RESULTS.md from the JSON lines of one bench/run.sh session.

Reads, in --out: fio_pass1.jsonl and fio_pass2.jsonl (bench/peers/disk_fio.sh),
torch.jsonl (bench/peers/save_torch.py), tessera.jsonl (tessera_bench_storage),
cluster.jsonl (tessera_bench_cluster), s3_cluster.jsonl and s3_boto3_<i>.jsonl (the
cluster on a Ceph RGW, and boto3's transfers to it), the collectives' gloo<i>.jsonl
(bench/peers/allreduce_torch_gloo.py), mpi<i>.jsonl (bench/peers/allreduce_mpi.sh),
ours<i>.jsonl and ours_inproc.jsonl (tessera_bench_collectives), rest_barrier.jsonl
(tessera_bench_rest_barrier), memory_tier.jsonl (bench/memory_tier.py: the memory tier
against a memcpy, the POSIX root, S3 and iperf3), float_codec.jsonl (bench/float_codec.py:
the float codec against python3-blosc and zstd-1), incremental.json (bench/incremental.py:
incremental saves against full ones), and steps.jsonl (wall time of every
step). Our figures
and the peers' come from the same session on the same machine, because this VM's disk
moves by up to 3x between runs (bench/peers/README.md) and only a same-session
ratio means anything. Medians are used wherever there are several runs; every run is
shown. With --only storage or --only collectives, only that part is reported.

  /usr/bin/python3 bench/report.py --out bench/out --results bench/RESULTS.md
  /usr/bin/python3 bench/report.py --section memory_tier   # only that section of RESULTS.md
  /usr/bin/python3 bench/report.py --section float_codec
  /usr/bin/python3 bench/report.py --section incremental
"""
import argparse
import glob
import json
import os
import re
import platform
import statistics
import subprocess
import sys

# Targets of the storage work, as ratios to the peer measured in the same session.
WRITE_VS_FIO = 0.9   # save ≥ 0.9x fio sequential write (buffered + end fsync, 1 job)
READ_VS_FIO = 0.9    # read ≥ 0.9x fio read_direct (1 job)
VS_TORCH = 2.0       # save ≥ 2x torch.save+fsync, read ≥ 2x torch.load (cold and warm)
HEADLINE_THREADS = 2  # both cores of this machine; 1-thread figures are in the detail tables

# Targets of the collectives work, 4 ranks on loopback TCP.
AR_VS_GLOO = 1.2         # all_reduce busbw ≥ 1.2x torch Gloo at ≥ 16 MiB
AR_VS_MPI = 1.0          # all_reduce busbw ≥ 1.0x Open MPI (TCP BTL) at 1 MiB and ≥ 16 MiB
LAT_VS_MPI = 1.0         # all_reduce time ≤ 1.0x Open MPI (TCP BTL) at ≤ 4 KiB and 64 KiB
BCAST_VS_GLOO = 1.2      # broadcast 16 MiB busbw ≥ 1.2x torch Gloo
BARRIER_US = 100.0       # engine barrier p50 < 100 µs
REST_BARRIER_US = 2000.0  # tesserad REST barrier p50 < 2 ms

# zstd -b1 ratios on the same kinds of data, from bench/peers/results/zstd_run*.jsonl
# (bench/peers/zstd_speed.sh; not re-run by run.sh, ratios are deterministic).
ZSTD_CLI_RATIO = {"float32": 1.083, "bfloat16": 1.282}


def load(path):
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - machine facts are best effort
        return ""


def med(xs):
    return statistics.median(xs) if xs else None


def gb(x, digits=3):
    return "—" if x is None else f"{x:.{digits}f}"


def runs_text(xs, digits=3):
    return " / ".join(f"{x:.{digits}f}" for x in xs) if xs else "—"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def ratio_text(r):
    return "—" if r is None else f"{r:.2f}×"


def verdict(r, need):
    if r is None:
        return "not measured"
    return "**met**" if r >= need else "**not met**"


def verdict_below(r, limit, strict=False):
    """Met when r ≤ limit (r < limit when strict)."""
    if r is None:
        return "not measured"
    return "**met**" if (r < limit if strict else r <= limit) else "**not met**"


def machine_facts(out_dir):
    mem = sh("free -h | awk '/^Mem:/ {print $2 \" total, \" $7 \" available\"}'")
    df = sh(f"df -hT {out_dir} | tail -n 1").split()
    disk = (f"`{df[0]}`, {df[1]}, {df[2]} in size, {df[3]} used, {df[4]} available "
            f"(`df -hT` of bench/out)") if len(df) >= 5 else "unknown"
    cpu = sh("lscpu | sed -n 's/^Model name: *//p'") or platform.processor()
    tpc = sh("lscpu | sed -n 's/^Thread(s) per core: *//p'")
    hyp = sh("lscpu | sed -n 's/^Hypervisor vendor: *//p'")
    return {
        "nproc": sh("nproc") or str(os.cpu_count()),
        "cpu": (cpu + (f", {tpc} thread per core" if tpc else "")
                + (f", {hyp} guest" if hyp else "")),
        "memory": mem,
        "kernel": platform.release(),
        "disk": disk,
        "os": sh(". /etc/os-release && echo $PRETTY_NAME"),
        "gcc": sh("g++ --version | head -n 1"),
        "fio": sh("fio --version"),
        "mpi": sh("mpirun --version 2>/dev/null | head -n 1"),
        "zstd": sh("pkg-config --modversion libzstd"),
        "python": sys.version.split()[0],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--results", default="bench/RESULTS.md")
    ap.add_argument("--started", default="")
    ap.add_argument("--finished", default="")
    ap.add_argument("--command", default="bash bench/run.sh")
    ap.add_argument("--scale", default="1.0")
    ap.add_argument("--repeat", default="2")
    ap.add_argument("--only", default="all",
                    choices=("all", "storage", "collectives", "s3", "history"))
    ap.add_argument("--rounds", default="2")
    ap.add_argument("--targets", default="",
                    help="the build step's targets, as run.sh built them (space-separated)")
    ap.add_argument("--peers", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "peers"),
        help="bench/peers, for the peers' reference runs in its results/")
    ap.add_argument("--section", choices=tuple(SECTIONS), default=None,
                    help="rewrite only this section of --results, from --out's rows, leaving "
                         "the rest of the file as it is (appended when it is not there yet)")
    a = ap.parse_args()
    if a.section:
        return rewrite_section(a.results, a.section, a.out)
    do_storage = a.only in ("all", "storage")
    do_coll = a.only in ("all", "collectives")

    fio = [load(os.path.join(a.out, f"fio_pass{i}.jsonl")) for i in (1, 2)]
    torch_rows = load(os.path.join(a.out, "torch.jsonl"))
    ours = load(os.path.join(a.out, "tessera.jsonl"))
    steps = load(os.path.join(a.out, "steps.jsonl"))
    if do_storage and not ours:
        sys.exit(f"report.py: no results in {a.out}/tessera.jsonl")
    coll = Collectives(a.out, steps, a.peers) if do_coll else None
    if coll is not None and not coll.ours:
        sys.exit(f"report.py: no collectives results in {a.out}/ours*.jsonl")

    # --- peers ---
    def fio_values(op, jobs=1):
        return [r["GBps"] for rows in fio for r in rows
                if r.get("bench") == "fio" and r["op"] == op and r["jobs"] == jobs]

    fio_wbuf = med(fio_values("write_buffered_fsync"))
    fio_wdirect = med(fio_values("write_direct"))
    fio_rdirect = med(fio_values("read_direct"))

    def torch_values(op):
        return [r["GBps"] for r in torch_rows if r.get("op") == op and "GBps" in r]

    t_save = med(torch_values("torch.save+fsync"))
    t_cold = med(torch_values("torch.load_cold"))
    t_warm = med(torch_values("torch.load_warm"))
    torch_version = next((r.get("torch") for r in torch_rows if r.get("op") == "dcp"), "?")

    # --- ours ---
    config = next((r for r in ours if r.get("op") == "config"), {})
    runs = [r for r in ours
            if "stat" not in r and r.get("op") in ("save", "read_cold", "read_warm")]
    merges = [r for r in ours if r.get("op") == "index_merge"]
    configs = []
    for r in runs:
        key = (r["dtype"], r["codec"], r["threads"])
        if key not in configs:
            configs.append(key)

    def pick(op, key, field="GBps"):
        return [r[field] for r in runs
                if r["op"] == op and (r["dtype"], r["codec"], r["threads"]) == key]

    scale = float(config.get("scale", a.scale))
    full = abs(scale - 1.0) < 1e-9 or not do_storage
    facts = machine_facts(a.out)
    L = []
    w = L.append

    w("# Benchmarks: results")
    w("")
    w(f"Generated by `bench/report.py` from the JSON lines of one `{a.command}` session "
      "(`bench/out/*.jsonl`). GB is 10^9 bytes; GB/s is the state's logical bytes over the "
      "wall time. Medians over runs; every run is listed in the detail tables.")
    w("")
    if a.only != "all":
        w(f"> **Only the {a.only} part** of `bash bench/run.sh` ran in this session "
          f"(TESSERA_BENCH_ONLY={a.only}); `bench/RESULTS.md` comes from full runs only.")
        w("")
    if not full:
        w(f"> **Scale {scale}:** our state was {config.get('bytes_float32', 0):,} bytes instead "
          "of 1,075,838,976, so our figures are not comparable with the peers' 1 GiB ones. "
          "Run `bash bench/run.sh` without TESSERA_BENCH_SCALE for real numbers.")
        w("")
    w("## When and where")
    w("")
    w(f"- **Date:** {a.started or '?'} to {a.finished or '?'} (UTC, machine clock).")
    w(f"- **Machine:** `nproc` = {facts['nproc']} ({facts['cpu']}); memory {facts['memory']} "
      f"(`free -h`); kernel {facts['kernel']}; {facts['os']}.")
    w(f"- **Disk:** {facts['disk']}. Every step wrote to one temp dir under `bench/out/` "
      "on that disk.")
    if coll is not None:
        torch_version = coll.torch_version or torch_version
    w(f"- **Software:** {facts['gcc']}; {facts['fio'] or 'fio not installed'}; libzstd "
      f"{facts['zstd']}; /usr/bin/python3 {facts['python']} with torch {torch_version}; "
      f"{facts['mpi'] or 'Open MPI not installed'}.")
    targets = a.targets.split()
    if not targets:  # a report of a run from before run.sh passed them
        if do_storage:
            targets += ["tessera_bench_storage", "tessera_bench_cluster", "tessera-worker"]
        if do_coll:
            targets += ["tessera_bench_collectives", "tessera_bench_rest_barrier"]
        targets.append("tesserad")
    w(f"- **Command** (from the repository root): `{a.command}`. It builds "
      f"{', '.join(f'`{t}`' for t in targets)} (Release, `build-bench/`), then runs, in "
      "this order:")
    w("")
    w("| step | command | wall time | exit status | 1-min load average before → after | "
      "CPU s: the step / other processes |")
    w("|---|---|---:|---:|---|---|")
    step_cmd = {
        "build": "cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release && "
                 f"cmake --build build-bench -j2 --target {' '.join(targets)}",
        "fio_pass1": "DIR=$tmp bench/peers/disk_fio.sh",
        "torch": "/usr/bin/python3 bench/peers/save_torch.py --dir $tmp",
        "tessera": f"build-bench/bin/tessera_bench_storage --dir $tmp --json --scale {a.scale} "
                   f"--repeat {a.repeat}",
        "cluster": f"build-bench/bin/tessera_bench_cluster --dir $tmp --scale {a.scale} "
                   "--repeat 3",
        "export": "TESSERA_BIN=build-bench/bin /usr/bin/python3 bench/export.py --runs 3",
        "worker_loss": "TESSERA_BIN=build-bench/bin /usr/bin/python3 bench/worker_loss.py --runs 3",
        "memory_tier": "TESSERA_BIN=build-bench/bin /usr/bin/python3 bench/memory_tier.py "
                       "--fresh",
        "float_codec": "TESSERA_BIN=build-bench/bin /usr/bin/python3 bench/float_codec.py",
        "incremental": "TESSERA_BIN=build-bench/bin /usr/bin/python3 bench/incremental.py "
                       "--dir $tmp",
        "fio_pass2": "DIR=$tmp bench/peers/disk_fio.sh",
        "ours_inproc": "build-bench/bin/tessera_bench_collectives --ranks 4 --transport inproc",
        "rest_barrier": "build-bench/bin/tessera_bench_rest_barrier --ranks 4",
    }
    for s in steps:
        name = s["step"]
        cmd = step_cmd.get(name)
        if cmd is None and re.fullmatch(r"gloo\d+", name):
            cmd = (f"/usr/bin/python3 bench/peers/allreduce_torch_gloo.py --ranks 4 "
                   f"--port {29510 + int(name[4:])}")
        elif cmd is None and re.fullmatch(r"sparse_gloo\d+", name):
            cmd = (f"/usr/bin/python3 bench/sparse_torch_gloo.py --ranks 4 "
                   f"--port {29520 + int(name[11:])}")
        elif cmd is None and re.fullmatch(r"mpi\d+", name):
            cmd = "NP=4 bench/peers/allreduce_mpi.sh"
        elif cmd is None and re.fullmatch(r"ours\d+", name):
            cmd = "build-bench/bin/tessera_bench_collectives --ranks 4 --transport tcp"
        if "skipped" in s:
            w(f"| {name} | `{cmd or '?'}` | skipped: {s['skipped']} | — | — | — |")
            continue
        cpu = (f"{s['cpu_s']:.1f} / {s['other_cpu_s']:.1f}" if "other_cpu_s" in s else "—")
        w(f"| {name} | `{cmd or '?'}` | {s['wall_s']:.1f} s | "
          f"{s.get('status', '?')} | {s.get('loadavg_before', '?')} → "
          f"{s.get('loadavg_after', '?')} | {cpu} |")
    w("")
    if any("other_cpu_s" in s for s in steps):
        w("CPU s: user + system time of the step's own processes, and of everything else on "
          "the machine during the step (/proc/stat minus the step's; other processes on the 2 "
          "vCPUs, such as another build or test run, move every figure).")
        w("")
    if any(s.get("status") and s["step"].startswith("fio") for s in steps) and not sh(
            "command -v iperf3"):
        w("disk_fio.sh exited non-zero because iperf3 is not installed on this machine: it "
          "stops after its fio and memcpy lines (all used here), before its loopback TCP part. "
          "run.sh installs it where it can (root or sudo); `apt-get install -y iperf3` restores "
          "those figures.")
        w("")
    if do_storage:
        w(f"- **State:** {config.get('tensors', 64)} tensors of (912·k·scale, 1024), "
          f"k = i % 8 + 1, as in save_torch.py: {config.get('bytes_float32', 0):,} bytes of "
          "float32 ~ N(0, 0.02) (FillSynthetic), and the same values truncated to bfloat16 "
          f"({config.get('bytes_bfloat16', 0):,} bytes). Chunks of "
          f"{config.get('chunk_size', 0) // (1 << 20)} MiB, mesh `{{d:1}}`, every tensor "
          f"replicated. {a.repeat} runs of each configuration, the runs interleaved.")
        w("")

    # --- targets ---
    w("## Targets")
    w("")
    if do_storage:
        w(f"Our figures are float32 (the peers' state) with {HEADLINE_THREADS} threads (both cores); "
          "every configuration is in the detail tables below, with the same ratios. Peers are "
          "medians of this session: fio over its two passes (before and after ours), torch over "
          "save_torch.py's two runs. The storage rows are in GB/s.")
        w("")
    if coll is not None:
        w("Collectives rows: 4 ranks on loopback TCP, medians of this session's runs "
          "(ours: tessera_bench_collectives; peers: allreduce_torch_gloo.py and "
          "allreduce_mpi.sh, alternated with ours); details in the Collectives section.")
        w("")
    w("| target | ours | peer | ratio | needed | verdict |")
    w("|---|---:|---:|---:|---:|---|")

    if do_storage:
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
    if coll is not None:
        for row in coll.target_rows():
            w(row)
    w("")
    if do_storage:
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

    if do_storage:
        # --- save details ---
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

        engine = med(pick("save", ("float32", "zstd-1", HEADLINE_THREADS)))
        cluster_rows = load(os.path.join(a.out, "cluster.jsonl"))
        cluster_section(w, cluster_rows, t_save, t_cold, t_warm, engine)
        s3_section(w, load(os.path.join(a.out, "s3_cluster.jsonl")),
                   load(os.path.join(a.out, "s3_boto3_1.jsonl")) +
                   load(os.path.join(a.out, "s3_boto3_2.jsonl")),
                   cluster_rows, [r for r in steps if r.get("step", "").startswith("s3")])

    if a.only == "s3":
        s3_section(w, load(os.path.join(a.out, "s3_cluster.jsonl")),
                   load(os.path.join(a.out, "s3_boto3_1.jsonl")) +
                   load(os.path.join(a.out, "s3_boto3_2.jsonl")),
                   [], [r for r in steps if r.get("step", "").startswith("s3")])

    if coll is not None:
        coll.write(w)

    exports = os.path.join(a.out, "export.jsonl")
    if a.only in ("all", "storage") and os.path.exists(exports):
        import export  # noqa: PLC0415 - bench/, beside this script
        L.extend(export.markdown(load(exports)))
    losses = os.path.join(a.out, "worker_loss.jsonl")
    if a.only in ("all", "storage") and os.path.exists(losses):
        import worker_loss  # noqa: PLC0415 - bench/, beside this script
        L.extend(worker_loss.markdown(load(losses)))

    memory = os.path.join(a.out, "memory_tier.jsonl")
    if a.only in ("all", "storage") and os.path.exists(memory):
        import memory_tier  # noqa: PLC0415 - bench/, beside this script
        L.extend(memory_tier.markdown(load(memory)))

    codec = os.path.join(a.out, "float_codec.jsonl")
    if a.only in ("all", "storage") and os.path.exists(codec):
        import float_codec  # noqa: PLC0415 - bench/, beside this script
        L.append("")
        L.extend(float_codec.markdown(load(codec)))

    incremental = os.path.join(a.out, "incremental.json")
    if a.only in ("all", "storage") and os.path.exists(incremental):
        import incremental_report  # noqa: PLC0415 - bench/, beside this script
        L.append("")
        L.extend(incremental_report.markdown(load(incremental)))

    dcp_rows = os.path.join(a.out, "dcp.jsonl")
    if a.only in ("all", "storage") and os.path.exists(dcp_rows):
        import dcp_report  # noqa: PLC0415 - bench/, beside this script
        L.append("")
        L.extend(dcp_report.markdown(load(dcp_rows)))

    jax_rows = os.path.join(a.out, "jax_orbax.jsonl")
    if a.only in ("all", "storage") and os.path.exists(jax_rows):
        import jax_orbax_report  # noqa: PLC0415 - bench/, beside this script
        L.append("")
        L.extend(jax_orbax_report.markdown(load(jax_rows)))

    history = os.path.join(a.out, "job_history.json")
    if a.only in ("all", "history") and os.path.exists(history):
        import job_history  # noqa: PLC0415 - bench/, beside this script
        with open(history) as f:
            L.extend(job_history.markdown(json.load(f)))

    with open(a.results, "w") as f:
        f.write("\n".join(L))
    return 0


# section: (its heading in RESULTS.md, the bench/ module whose markdown(rows) makes it,
# the rows' file in --out)
SECTIONS = {"memory_tier": ("## The memory tier", "memory_tier", "memory_tier.jsonl"),
            "float_codec": ("## The float codec", "float_codec", "float_codec.jsonl"),
            # incremental.json is one JSON object on one line: load() reads it as one row.
            "incremental": ("## Incremental saves", "incremental_report", "incremental.json"),
            "dcp": ("## PyTorch DCP", "dcp_report", "dcp.jsonl"),
            "jax": ("## JAX and Orbax", "jax_orbax_report", "jax_orbax.jsonl")}


def rewrite_section(results, section, out_dir):
    """Replaces one section of `results` (from its heading to the next "## " heading)
    with the one made from out_dir's rows; appends it when the file has none."""
    import importlib  # noqa: PLC0415
    head, module, jsonl = SECTIONS[section]
    rows = load(os.path.join(out_dir, jsonl))
    if not rows:
        sys.exit(f"report.py: no rows in {out_dir}/{jsonl}")
    new = importlib.import_module(module).markdown(rows)
    while new and not new[0].strip():
        new = new[1:]
    with open(results) as f:
        lines = f.read().split("\n")
    start = next((i for i, x in enumerate(lines) if x.startswith(head)), None)
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += [""] + new
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        tail = lines[end:]
        body = new + ([""] if tail else [])
        lines = lines[:start] + body + tail
    text = "\n".join(lines)
    with open(results, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    return 0


S3_VS_BOTO3 = 1.0  # save and restore through the cluster ≥ 1.0x boto3 upload_file/download_file


def s3_section(w, ours, boto, posix, steps):
    """The cluster checkpointing into a Ceph RGW, next to boto3's managed transfers of
    the same number of bytes to the same gateway, and the cluster's POSIX figures."""
    w("## Cluster on S3: tesserad + 4 workers → Ceph RGW, against boto3")
    w("")
    skipped = [r["skipped"] for r in steps if "skipped" in r]
    if skipped or not ours or not boto:
        why = "; ".join(skipped) or "no results (see bench/out/s3_*.jsonl and rgw.log)"
        w(f"Not measured in this session: {why}.")
        w("")
        return
    w("The same 1.00 GiB state as above, with `--checkpoint-root s3://tessera-bench/cluster` on "
      "a throwaway single-node Ceph (tools/s3/rgw.sh: one monitor, one memstore OSD, radosgw) "
      "on this machine. The peer is boto3's `upload_file` / `download_file` (multipart, 8 MiB "
      "parts, 10 threads, as shipped) of a 1 GiB file of the same kind of data, to the same "
      "gateway, in two runs around ours. Ours: each worker streams its shard in 8 MiB parts, 4 "
      "at a time; a restore reads 4 MiB chunks with ranged GETs on each worker's I/O threads "
      "and verifies every checksum. The gateway and the OSD share the 2 vCPUs with the client "
      "in both cases, so both are bound by the server.")
    w("")
    by = lambda b, op=None: [r for r in ours if r.get("bench") == b and
                             (op is None or r.get("compression") == op)]
    up = med([r["GBps"] for r in boto if r.get("op") == "upload"])
    down = med([r["GBps"] for r in boto if r.get("op") == "download"])
    p_save = med([r["GBps"] for r in posix if r.get("bench") == "save" and r.get("compression") == "none"])
    p_restore = med([r["GBps"] for r in posix if r.get("bench") == "restore"])
    w("| target | ours (S3) | boto3 | ratio | needed | verdict | ours, POSIX root (above) |")
    w("|---|---:|---:|---:|---:|---|---:|")
    for label, rows, peer, posix_fig in (
            ("save, no compression (trainer call → commit) vs upload_file", by("s3_save", "none"), up, p_save),
            ("save, zstd-1 vs upload_file", by("s3_save", "zstd"), up, None),
            ("restore (REST call → job end) vs download_file", by("s3_restore"), down, p_restore)):
        g = med([r["GBps"] for r in rows])
        if g is None or peer is None:
            continue
        r_ = g / peer
        pf = f"{posix_fig:.3f} GB/s" if posix_fig else "—"
        w(f"| {label} | {g:.3f} GB/s | {peer:.3f} GB/s | {r_:.2f}× | ≥ {S3_VS_BOTO3:.1f}× | "
          f"{'met' if r_ >= S3_VS_BOTO3 else '**not met**'} | {pf} |")
    w("")
    w("Every run, in order (GB/s):")
    w("")
    w(f"- boto3 upload_file: {runs_text([r['GBps'] for r in boto if r.get('op') == 'upload'])}")
    w(f"- boto3 download_file: {runs_text([r['GBps'] for r in boto if r.get('op') == 'download'])}")
    for c in ("none", "zstd"):
        w(f"- ours, save ({c}): {runs_text([r['GBps'] for r in by('s3_save', c)])}; write phase "
          f"{', '.join(str(r.get('phases_ms', {}).get('write', '?')) + ' ms' for r in by('s3_save', c))}")
    w(f"- ours, restore: {runs_text([r['GBps'] for r in by('s3_restore')])}")
    w("")


def cluster_section(w, rows, t_save, t_cold, t_warm, engine=None):
    """A real local cluster next to torch.save/torch.load and the storage engine alone
    (`engine`: tessera_bench_storage's float32 zstd-1 save, GB/s) of this session."""
    if not rows:
        return
    by = lambda name: [r for r in rows if r.get("bench") == name]
    memcpy = (by("memcpy") or [{}])[0]
    w("## Cluster: tesserad + 4 workers (tessera_bench_cluster)")
    w("")
    w("The same 64-tensor float32 state (1.00 GiB) sharded over a `{data:4}` mesh, each shard "
      "held by its worker in a `/dev/shm` mapping that the benchmark (the trainers) maps and "
      "fills. Saves are started by 4 trainer threads calling `/v1/save` together; a save's time "
      "runs from those calls to the job's commit (snapshot, write, fsync, merge, rename). "
      "Restores run from the REST call to the job's end, every chunk's checksum verified. All "
      "processes share the 2 vCPUs.")
    w("")
    saves = {c: by("save") and [r for r in by("save") if r["compression"] == c] for c in ("zstd", "none")}
    restores, reshards = by("restore"), by("reshard")
    one, four = memcpy.get("one_worker_ms"), memcpy.get("four_workers_at_once_ms")
    steady = [r["stall_ms_max"] for c in saves.values() for r in c if r["rep"] > 0]
    # The first save of the run only: later settings' rep 0 follow earlier saves.
    first = [r["stall_ms_max"] for r in (saves.get("zstd") or [])[:1]]
    w("| target | ours | peer | ratio | needed | verdict |")
    w("|---|---:|---:|---:|---:|---|")
    for c, rs in saves.items():
        g = med([r["GBps"] for r in rs])
        if g and engine and c == "zstd":
            r_ = g / engine
            w(f"| save ({c}, trainer call → commit) vs the storage engine alone (float32 zstd-1, "
              f"{HEADLINE_THREADS} threads) | {g:.3f} GB/s | {engine:.3f} GB/s | {r_:.2f}× | ≥ 0.9× | "
              f"{'met' if r_ >= 0.9 else '**not met**'} |")
        if g and t_save:
            r_ = g / t_save
            w(f"| save ({c}) vs torch.save + fsync | {g:.3f} GB/s | {t_save:.3f} GB/s | "
              f"{r_:.2f}× | ≥ 2.0× | {'met' if r_ >= 2.0 else '**not met**'} |")
    g = med([r["GBps"] for r in restores])
    for name, peer in (("cold", t_cold), ("warm", t_warm)):
        if g and peer:
            r_ = g / peer
            w(f"| restore vs torch.load {name} | {g:.3f} GB/s | {peer:.3f} GB/s | {r_:.2f}× | "
              f"≥ 2.0× | {'met' if r_ >= 2.0 else '**not met**'} |")
    if steady and four:
        s_ = med(steady)
        w(f"| trainer stall (steady) vs 4 workers' memcpy at once | {s_:.1f} ms | {four:.1f} ms | "
          f"{s_ / four:.2f}× | ≤ 1.5× | {'met' if s_ / four <= 1.5 else '**not met**'} |")
    if first and four:
        f_ = med(first)
        w(f"| trainer stall (first save) vs 4 workers' memcpy at once | {f_:.1f} ms | {four:.1f} ms | "
          f"{f_ / four:.2f}× | ≤ 1.5× | {'met' if f_ / four <= 1.5 else '**not met**'} |")
    if steady and one:
        s_ = med(steady)
        w(f"| trainer stall (steady) vs one worker's memcpy alone | {s_:.1f} ms | {one:.1f} ms | "
          f"{s_ / one:.2f}× | ≤ 1.5× | {'met' if s_ / one <= 1.5 else '**not met**'} |")
    solo = by("solo_stall")
    if solo and one:
        x = med([r["steady_ms"] for r in solo])
        w(f"| trainers one at a time: stall (steady) vs one worker's memcpy alone | {x:.1f} ms | "
          f"{one:.1f} ms | {x / one:.2f}× | ≤ 1.5× | {'met' if x / one <= 1.5 else '**not met**'} |")
    tiny = by("tiny_save")
    t32 = next((r for r in tiny if r["workers"] == 32 and r["kind"] == "processes"), None)
    if t32:
        w(f"| tiny save (4 KiB per worker), 32 worker processes, REST call → commit | "
          f"{t32['p50_ms']:.0f} ms | — | — | ≤ 100 ms | {'met' if t32['p50_ms'] <= 100 else '**not met**'} |")
    hb = (by("heartbeat") or [None])[0]
    if hb:
        w(f"| heartbeat p99 at {hb['workers']} workers × 1 Hz | {hb['p99_ms']:.2f} ms | — | — | "
          f"< 20 ms | {'met' if hb['p99_ms'] < 20 else '**not met**'} |")
    w("")
    w("Every run:")
    w("")
    w("| measure | run | GB/s | time s | stall max ms | snapshot max ms | stored bytes | ratio |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|")
    for c, rs in saves.items():
        for r in rs:
            w(f"| save {c} | {r['rep']} | {r['GBps']:.3f} | {r['time_s']:.2f} | "
              f"{r['stall_ms_max']:.1f} | {r['snapshot_ms_max']:.1f} | {r['stored_bytes']:,} | "
              f"{r['ratio']:.3f} |")
    for name, rs in (("restore", restores), ("reshard onto {x:2, y:2}", reshards)):
        for r in rs:
            extra = f" (read {r['stored_bytes_read']:,} B)" if "stored_bytes_read" in r else ""
            w(f"| {name}{extra} | {r['rep']} | {r['GBps']:.3f} | {r['time_s']:.2f} | | | | |")
    w("")
    if one and four:
        w(f"- memcpy of one worker's share ({memcpy['bytes_per_worker']:,} B), in the benchmark "
          f"process, from memory it has just written into memory already faulted in: {one:.1f} ms "
          f"alone, {four:.1f} ms when four copies run at once (what the 2 vCPUs allow four "
          "snapshots together). That is the bound, not what a worker can reach here: a worker "
          "snapshots pages the trainer wrote, and on this virtual machine a process's first touch "
          "of a page after a few idle seconds costs about a microsecond (256 MiB idle for 3 s: "
          "66–226 ms through the worker's mapping against 9–16 ms hot, whatever MAP_POPULATE or "
          "MADV_POPULATE did before). The worker therefore reads mapped shards with pread (the "
          "kernel copies from its own mapping): 20–40 ms for 256 MiB in any state. With one "
          "worker and a Python trainer (256 MiB), the first save now stalls like the later ones "
          f"(26–31 ms, where it was 110 ms). Here the first save ({med(first):.0f} ms) still "
          "costs several later ones: it comes right after the benchmark has written 1 GiB into "
          "fresh mappings, and what remains of its cost is not explained yet.")
    if saves.get("zstd") and engine:
        w("- Where a cluster save's time goes, against the engine alone: the write phase is "
          "nearly all of it, and ~70% of the write phase is the kernel copying into fresh "
          "page-cache pages (`copy_folio_from_iter_atomic` in a system profile). Pages the guest "
          "has handed back to the host cost a fault in the host on first write; the engine "
          "benchmark writes each run into a root it just deleted, so it writes into pages just "
          "freed. The cluster benchmark therefore deletes the previous checkpoint before each "
          "save; with 6 GiB of checkpoints kept, the same saves ran at 0.34–0.45 GB/s.")
    if hb:
        w(f"- Control plane: {hb['workers']} simulated workers heartbeating at 1 Hz for "
          f"{hb['requests']} requests: p50 {hb['p50_ms']:.2f} ms, p99 {hb['p99_ms']:.2f} ms, max "
          f"{hb['max_ms']:.1f} ms.")
    if tiny:
        w("")
        w("Control plane: save latency of a tiny state (4 KiB float32 per worker, `{data:N}`, no "
          "compression), REST call to commit, against the number of workers. Real worker "
          "processes up to 32; beyond, in-process agents (real registration, task delivery, "
          "reports, shard and fragment files with fsync, merge, commit; every agent's threads in "
          "one process). Phases are those of the last save.")
        w("")
        w("| workers | kind | saves | p50 ms | min ms | max ms | p50 per worker ms | phases of the last save (ms) |")
        w("|---:|---|---:|---:|---:|---:|---:|---|")
        for r in tiny:
            ph = ", ".join(f"{k} {v}" for k, v in r["phases_ms"].items())
            w(f"| {r['workers']} | {r['kind']} | {r['saves']} | {r['p50_ms']:.0f} | "
              f"{r['min_ms']:.0f} | {r['max_ms']:.0f} | {r['p50_ms'] / r['workers']:.2f} | {ph} |")
    s64 = (by("save64") or [None])[0]
    if s64:
        w(f"- One save across {s64['ranks']} ranks (in-process agents, real registration, task "
          f"delivery, shard writes, merge of {s64['ranks']} fragments and commit), "
          f"{s64['bytes']:,} B: {s64['time_s']:.2f} s ({s64['GBps']:.3f} GB/s).")
    w("")


# ------------------------------------------------------------------ collectives

def size_text(n):
    if n >= 1 << 20:
        return f"{n >> 20} MiB"
    if n >= 1 << 10:
        return f"{n >> 10} KiB"
    return f"{n} B"


def us_text(x):
    if x is None:
        return "—"
    return f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def us_runs(xs):
    return " / ".join(us_text(x) for x in xs) if xs else "—"


def bw_text(x):
    if x is None:
        return "—"
    return f"{x:.4f}" if x < 0.01 else f"{x:.3f}"


def bus_factor(op, n):
    """NCCL-tests' busbw / algbw (bench/peers/README.md)."""
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n}.get(op, 1.0)


def numbered(out_dir, prefix):
    """[(step name, rows)] of out_dir/<prefix><i>.jsonl, by i."""
    found = []
    for path in glob.glob(os.path.join(out_dir, f"{prefix}*.jsonl")):
        m = re.fullmatch(rf"{prefix}(\d+)\.jsonl", os.path.basename(path))
        if m:
            found.append((int(m.group(1)), f"{prefix}{m.group(1)}", load(path)))
    return [(name, rows) for _, name, rows in sorted(found)]


class Collectives:
    """The collectives part of a session: ours next to Gloo and Open MPI over TCP."""

    AR_SIZES = [4 << (2 * i) for i in range(13)]  # 4 B … 64 MiB, ×4 (the peers' sweep)
    BIG = (16 << 20, 64 << 20)
    MID = (1 << 20,)  # busbw vs Open MPI
    SMALL = tuple(x for x in AR_SIZES if x <= 4096) + (64 << 10,)

    def __init__(self, out_dir, steps, peers_dir=None):
        self.ours = numbered(out_dir, "ours")
        self.gloo = numbered(out_dir, "gloo")
        self.sparse_gloo = numbered(out_dir, "sparse_gloo")
        mpi = numbered(out_dir, "mpi")
        self.mpi_tcp = [(n, [r for r in rows if r.get("bench") == "mpi_tcp"]) for n, rows in mpi]
        self.mpi_vader = [(n, [r for r in rows if r.get("bench") == "mpi_vader"])
                          for n, rows in mpi]
        self.mpi_tcp = [(n, rows) for n, rows in self.mpi_tcp if rows]
        self.mpi_vader = [(n, rows) for n, rows in self.mpi_vader if rows]
        self.inproc = [("ours_inproc", load(os.path.join(out_dir, "ours_inproc.jsonl")))]
        self.inproc = [(n, rows) for n, rows in self.inproc if rows]
        rest = load(os.path.join(out_dir, "rest_barrier.jsonl"))
        self.rest = rest[0] if rest else None
        pattern = r"(gloo|sparse_gloo|ours|mpi)\d+|ours_inproc|rest_barrier"
        self.steps = [s for s in steps if re.fullmatch(pattern, s["step"])]
        self.n = next((r["ranks"] for _, rows in self.ours for r in rows if "ranks" in r), 4)
        self.torch_version = next((r["torch"] for _, rows in self.gloo for r in rows
                                   if r.get("torch")), None)
        # The peers' own runs on a quiet machine (bench/peers/results, bench/peers/README.md).
        res = os.path.join(peers_dir or "", "results")
        self.base_gloo = [(f"r{i}", load(os.path.join(res, f"torch_gloo_run{i}.jsonl")))
                          for i in (1, 2)]
        self.base_gloo = [(n, rows) for n, rows in self.base_gloo if rows]
        self.base_mpi = [(f"r{i}", [r for r in load(os.path.join(res, f"mpi_run{i}.jsonl"))
                                    if r.get("bench") == "mpi_tcp"]) for i in (1, 2)]
        self.base_mpi = [(n, rows) for n, rows in self.base_mpi if rows]
        skipped = [s for s in self.steps if s["step"].startswith("mpi") and "skipped" in s]
        if self.mpi_tcp:
            self.mpi_note = None
        elif skipped:
            self.mpi_note = f"not measured ({skipped[0]['skipped']})"
        elif any(s["step"].startswith("mpi") for s in self.steps):
            self.mpi_note = "not measured (allreduce_mpi.sh failed, see the steps table)"
        elif not sh("command -v mpirun"):
            self.mpi_note = "not measured (openmpi missing)"
        else:
            self.mpi_note = "not measured"

    # --- figures ---
    @staticmethod
    def values(runs, op, nbytes=None, field="time_us"):
        """One value per run that has the line (op, bytes)."""
        out = []
        for _, rows in runs:
            row = next((r for r in rows if r.get("op") == op
                        and (nbytes is None or r.get("bytes") == nbytes)), None)
            if row is not None and row.get(field) is not None:
                out.append(row[field])
        return out

    def time(self, runs, op, nbytes=None):
        """Median over runs of each run's median time, µs."""
        return med(self.values(runs, op, nbytes))

    def busbw(self, runs, op, nbytes):
        t = self.time(runs, op, nbytes)
        return None if not t else nbytes / (t * 1e-6) / 1e9 * bus_factor(op, self.n)

    def barrier_p50(self, runs):
        v = self.values(runs, "barrier", field="p50_us") or self.values(runs, "barrier")
        return med(v)

    # --- targets (rows of the top table and of the section's own) ---
    def target_rows(self):
        rows = []
        bw = ("busbw", self.busbw, bw_text, "GB/s", "≥", verdict)
        lat = ("time", self.time, us_text, "µs", "≤", verdict_below)
        # (measure, sizes, the peer's name and runs, its note when not measured, the ratio needed)
        specs = [("all_reduce", bw, self.BIG, "torch Gloo", self.gloo, None, AR_VS_GLOO),
                 ("all_reduce", bw, self.MID + self.BIG, "Open MPI TCP", self.mpi_tcp,
                  self.mpi_note, AR_VS_MPI),
                 ("all_reduce", lat, self.SMALL, "Open MPI TCP", self.mpi_tcp, self.mpi_note,
                  LAT_VS_MPI),
                 ("broadcast", bw, (16 << 20,), "torch Gloo", self.gloo, None, BCAST_VS_GLOO)]
        for op, (what, measure, text, unit, sign, judge), sizes, name, peer, note, needed in specs:
            for nbytes in sizes:
                o = measure(self.ours, op, nbytes)
                head = f"| {op} {size_text(nbytes)} {what} vs {name} | {text(o)} {unit} | "
                if note:
                    rows.append(f"{head}{note} | — | {sign} {needed}× | {note} |")
                    continue
                m = measure(peer, op, nbytes)
                r = ratio(o, m)
                rows.append(f"{head}{text(m)} {unit} | {ratio_text(r)} | {sign} {needed}× | "
                            f"{judge(r, needed)} |")
        o = self.barrier_p50(self.ours)
        ctx = [f"Gloo {us_text(self.time(self.gloo, 'barrier'))} µs"]
        if not self.mpi_note:
            ctx.insert(0, f"MPI TCP {us_text(self.time(self.mpi_tcp, 'barrier'))} µs")
        r = ratio(o, BARRIER_US)
        rows.append(f"| barrier p50, the engine over TCP ({self.n} processes) | {us_text(o)} µs | "
                    f"({', '.join(ctx)}) | {ratio_text(r)} of the limit | < {BARRIER_US:.0f} µs | "
                    f"{verdict_below(r, 1.0, strict=True)} |")
        if self.rest and self.rest.get("available"):
            o = self.rest.get("p50_us")
            r = ratio(o, REST_BARRIER_US)
            rows.append(f"| REST barrier p50, tesserad `POST /api/v1/barriers/{{name}}`, "
                        f"{self.rest.get('ranks', 4)} client threads | {us_text(o)} µs | — | "
                        f"{ratio_text(r)} of the limit | < {REST_BARRIER_US / 1000:.0f} ms | "
                        f"{verdict_below(r, 1.0, strict=True)} |")
        else:
            why = (self.rest or {}).get("reason") or "tessera_bench_rest_barrier did not run"
            rows.append("| REST barrier p50, tesserad `POST /api/v1/barriers/{name}`, 4 client "
                        f"threads | not measured yet ({why}) | — | — | < "
                        f"{REST_BARRIER_US / 1000:.0f} ms | not measured yet |")
        return rows

    # --- this session's peers next to their reference runs ---
    BASE_ROWS = (("all_reduce", 4, "time"), ("all_reduce", 4096, "time"),
                 ("all_reduce", 1 << 20, "busbw"), ("all_reduce", 16 << 20, "busbw"),
                 ("all_reduce", 64 << 20, "busbw"), ("barrier", None, "time"))

    def figure(self, runs, op, nbytes, kind):
        return self.time(runs, op, nbytes) if kind == "time" else self.busbw(runs, op, nbytes)

    def peer_cautions(self):
        """A target's peer figure far off its reference runs flatters or hurts our ratio."""
        notes = []
        peers = [("torch Gloo", self.gloo, self.base_gloo)]
        if not self.mpi_note:
            peers.append(("Open MPI TCP", self.mpi_tcp, self.base_mpi))
        for label, runs, base in peers:
            if not base:
                continue
            for op, nbytes, kind in self.BASE_ROWS:
                if op != "all_reduce" or nbytes not in self.BIG + self.SMALL:
                    continue
                if label == "torch Gloo" and nbytes in self.SMALL:
                    continue  # no Gloo target at small sizes
                now = self.figure(runs, op, nbytes, kind)
                then = [self.figure([b], op, nbytes, kind) for b in base]
                then = [x for x in then if x]
                if not now or not then:
                    continue
                # "worse" is a longer time or a lower busbw.
                worse = (now / max(then)) if kind == "time" else (min(then) / now)
                if worse < 1.5:
                    continue
                ours = self.figure(self.ours, op, nbytes, kind)
                vs = "–".join(f"{x:.2f}×" for x in sorted(ours / x for x in then))
                if kind == "time":
                    unit = lambda x: f"{us_text(x)} µs"
                else:
                    unit = lambda x: f"{bw_text(x)} GB/s"
                notes.append(
                    f"**Caution:** {label}'s all_reduce at {size_text(nbytes)} measured "
                    f"{unit(now)} in this session, {worse:.1f}× worse than its reference runs "
                    f"({' / '.join(unit(x) for x in then)}), so the ratio above flatters ours. "
                    f"Against those runs ours would be {vs}.")
        return notes

    def write_baseline(self, w):
        if not (self.base_gloo or self.base_mpi):
            return
        w("The peers in this session next to their own reference runs in bench/peers/results "
          "(2026-11-22, nothing else running; each figure a run's median, as here):")
        w("")
        w("| measure | Gloo, reference r1 / r2 | Gloo, this session | MPI TCP, reference r1 / r2 | "
          "MPI TCP, this session | ours, this session |")
        w("|---|---:|---:|---:|---:|---:|")
        for op, nbytes, kind in self.BASE_ROWS:
            fmt = (lambda x: f"{us_text(x)} µs") if kind == "time" else (
                lambda x: f"{bw_text(x)} GB/s")
            cell = lambda runs: fmt(self.figure(runs, op, nbytes, kind)) if runs and self.figure(
                runs, op, nbytes, kind) else "—"
            base = lambda b: " / ".join(
                fmt(self.figure([r], op, nbytes, kind)) for r in b
                if self.figure([r], op, nbytes, kind)) or "—"
            mpi_now = self.mpi_note or cell(self.mpi_tcp)
            ours = (self.barrier_p50(self.ours) if op == "barrier"
                    else self.figure(self.ours, op, nbytes, kind))
            label = (f"all_reduce {size_text(nbytes)} {'time' if kind == 'time' else 'busbw'}"
                     if op == "all_reduce" else "barrier p50")
            w(f"| {label} | {base(self.base_gloo)} | {cell(self.gloo)} | {base(self.base_mpi)} | "
              f"{mpi_now} | {fmt(ours) if ours else '—'} |")
        w("")

    # --- the section ---
    @staticmethod
    def sparse_values(runs, case, field="time_us"):
        return [r[field] for _, rows in runs for r in rows
                if r.get("op") == "sparse_all_reduce" and r.get("case") == case and field in r]

    def write_sparse(self, w):
        w("### sparse_all_reduce (indexed slices)")
        w("")
        w("An embedding gradient: rows of a [65536, 64] float32 tensor at uniform random indices "
          "(ones, so the sum is checked exactly), 20 ops after 2 warmups, each iteration's time "
          "the slowest rank's, the median reported. Ours: `SparseAllReduce` in "
          "tessera_bench_collectives (auto path: all-gather of values and indices when the row "
          "counts are equal, else densify and all-reduce, as TF's cross_device_utils). Peer: "
          "torch Gloo's all_reduce of the same rows as a sparse COO tensor "
          "(`bench/sparse_torch_gloo.py`; Gloo all-gathers indices and values). Ratio = ours / "
          "Gloo time (< 1: ours is faster).")
        w("")
        w("| case | rows per rank | ours path | ours µs (runs) | Gloo µs (runs) | ours / Gloo |")
        w("|---|---|---|---|---|---:|")
        cases = []
        for _, rows in self.ours + self.sparse_gloo:
            for r in rows:
                if r.get("op") == "sparse_all_reduce" and r["case"] not in cases:
                    cases.append(r["case"])
        if not cases:
            w("| — | not measured (no sparse_all_reduce lines) | — | — | — | — |")
        for case in cases:
            ours = self.sparse_values(self.ours, case)
            gloo = self.sparse_values(self.sparse_gloo, case)
            rows = next((r.get("rows") for _, rs in self.ours + self.sparse_gloo for r in rs
                         if r.get("op") == "sparse_all_reduce" and r.get("case") == case), [])
            paths = sorted(set(self.sparse_values(self.ours, case, "path")))
            w(f"| {case} | {', '.join(str(x) for x in rows)} | {', '.join(paths) or '—'} | "
              f"{us_runs(ours) if ours else '—'} | {us_runs(gloo) if gloo else '—'} | "
              f"{ratio_text(ratio(med(ours), med(gloo)))} |")
        w("")

    def write(self, w):
        n = self.n
        w(f"## Collectives ({n} ranks, loopback TCP)")
        w("")
        order = ", ".join(s["step"] for s in self.steps)
        w(f"{n} ranks on 127.0.0.1, float32, the peers' sweep and method (bench/peers/README.md): "
          "2 warmup ops, a barrier, then clamp(64 MiB / bytes, 5, 200) ops back to back; each "
          "iteration's time is the slowest rank's, and a run reports the median. "
          f"**Ours:** `tessera_bench_collectives --ranks {n} --transport tcp`, {n} forked "
          "processes joined by TcpTransport (a full TCP mesh). The all-reduce's in-place input is "
          "reset before every op (Open MPI copies its input inside the timed call); outputs are "
          "cleared before, and checked after, the warm-up ops and the last one, outside the timed "
          "region (the peers' loops neither clear nor check). **Peers:** torch.distributed Gloo (`allreduce_torch_gloo.py`) and Open "
          "MPI's `MPI_Allreduce` with the TCP BTL on `lo` (`allreduce_mpi.sh`; its vader "
          "shared-memory lines are shown as context only). The runs alternate "
          f"({order}), so drift shows in the every-run table. Each figure below is the median "
          "over the runs of each run's median time; algbw = bytes / time and busbw follow "
          f"NCCL-tests (all_reduce × 2(n−1)/n, all_gather × (n−1)/n with bytes = the total "
          "output, broadcast × 1), computed from that time. GB = 10^9 bytes.")
        w("")
        loads = [s for s in self.steps if "skipped" not in s]
        if loads:
            before = [s["loadavg_before"] for s in loads]
            after = [s["loadavg_after"] for s in loads]
            other = [s["other_cpu_s"] for s in loads if "other_cpu_s" in s]
            other_text = (f" Other processes used {sum(other):.1f} CPU s in all during these "
                          f"steps (at most {max(other):.1f} s in one): other work on this guest "
                          "hardly touched these figures." if other and sum(other) < 5
                          else f" Other processes used {sum(other):.1f} CPU s during these steps "
                          "(see the steps table): they shared the 2 vCPUs with the "
                          "measurements." if other else "")
            w(f"1-min load average around these steps: {min(before + after):.2f}–"
              f"{max(before + after):.2f} (before the first: {before[0]:.2f}; it lags by about a "
              f"minute, and the benchmarks' own {n} ranks on 2 vCPUs raise it).{other_text} Exit "
              "status of each step: in the steps table at the top.")
            w("")
        failed = [s["step"] for s in loads if s.get("status")]
        if failed:
            w(f"**Failed steps (their figures are missing):** {', '.join(failed)}.")
            w("")
        runs_line = (f"Runs: ours {len(self.ours)}, Gloo {len(self.gloo)}, Open MPI TCP "
                     f"{len(self.mpi_tcp) if not self.mpi_note else self.mpi_note}.")
        w(runs_line)
        w("")

        w("### Targets")
        w("")
        w("Ratios are ours / peer for bandwidth (≥ needed) and for time (≤ needed); the barrier "
          "rows compare with an absolute limit (ratio = ours / limit).")
        w("")
        w("| target | ours | peer | ratio | needed | verdict |")
        w("|---|---:|---:|---:|---:|---|")
        for row in self.target_rows():
            w(row)
        w("")
        for note in self.peer_cautions():
            w(note)
            w("")
        self.write_baseline(w)

        # all_reduce per size
        mpi = self.mpi_note
        w("### all_reduce (float32 sum), per size")
        w("")
        w("Medians over runs. \"× Gloo\" and \"× MPI TCP\" are busbw ratios (ours / peer; > 1 "
          "means ours is faster, the inverse of the time ratio). MPI vader is shared memory, not "
          "TCP: context only.")
        w("")
        w("| size | ours µs | ours algbw GB/s | ours busbw GB/s | Gloo µs | Gloo busbw | × Gloo | "
          "MPI TCP µs | MPI TCP busbw | × MPI TCP | MPI vader busbw |")
        w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for nbytes in self.AR_SIZES:
            o_t = self.time(self.ours, "all_reduce", nbytes)
            if o_t is None:
                continue
            o_alg = nbytes / (o_t * 1e-6) / 1e9
            o_bus = self.busbw(self.ours, "all_reduce", nbytes)
            g_t = self.time(self.gloo, "all_reduce", nbytes)
            g_bus = self.busbw(self.gloo, "all_reduce", nbytes)
            if mpi:
                m_cells = f"{mpi} | — | — |"
            else:
                m_t = self.time(self.mpi_tcp, "all_reduce", nbytes)
                m_bus = self.busbw(self.mpi_tcp, "all_reduce", nbytes)
                m_cells = f"{us_text(m_t)} | {bw_text(m_bus)} | {ratio_text(ratio(o_bus, m_bus))} |"
            v_bus = self.busbw(self.mpi_vader, "all_reduce", nbytes)
            w(f"| {size_text(nbytes)} | {us_text(o_t)} | {bw_text(o_alg)} | {bw_text(o_bus)} | "
              f"{us_text(g_t)} | {bw_text(g_bus)} | {ratio_text(ratio(o_bus, g_bus))} | {m_cells} "
              f"{bw_text(v_bus)} |")
        w("")

        # every run
        w("### all_reduce, every run (time µs, in run order)")
        w("")
        heads = [("ours", self.ours), ("Gloo", self.gloo)]
        if not mpi:
            heads.append(("MPI TCP", self.mpi_tcp))
        heads.append(("MPI vader", self.mpi_vader))
        heads.append(("ours in-process", self.inproc))
        w("| size | " + " | ".join(
            f"{h} ({' / '.join(nm for nm, _ in runs) or 'none'})" for h, runs in heads) + " |")
        w("|---:|" + "---:|" * len(heads))
        for nbytes in self.AR_SIZES:
            cells = [us_runs(self.values(runs, "all_reduce", nbytes)) for _, runs in heads]
            w(f"| {size_text(nbytes)} | " + " | ".join(cells) + " |")
        w("")
        spread = []
        for h, runs in heads[:-1]:
            parts = []
            for nbytes in (4, 4096, 16 << 20, 64 << 20):
                v = self.values(runs, "all_reduce", nbytes)
                if len(v) >= 2 and min(v) > 0:
                    parts.append(f"{size_text(nbytes)} {max(v) / min(v):.2f}×")
            if parts:
                spread.append(f"{h} " + ", ".join(parts))
        if spread:
            w("Spread between runs (max / min time): " + "; ".join(spread) + ".")
            w("")

        # all_gather, broadcast
        w("### all_gather and broadcast")
        w("")
        w("all_gather: `bytes` is the total output (per rank × n), tiled along axis 0. broadcast "
          "from rank 0. allreduce_mpi.sh measures all_reduce and barrier only, so there is no MPI "
          "column here.")
        w("")
        w("| op | bytes | ours µs (runs) | ours busbw GB/s | Gloo µs (runs) | Gloo busbw GB/s | "
          "× Gloo | ours in-process busbw |")
        w("|---|---:|---|---:|---|---:|---:|---:|")
        for op in ("all_gather", "broadcast"):
            sizes = []
            for _, rows in self.ours + self.gloo:
                for r in rows:
                    if r.get("op") == op and r["bytes"] not in sizes:
                        sizes.append(r["bytes"])
            for nbytes in sorted(sizes):
                o = self.busbw(self.ours, op, nbytes)
                g = self.busbw(self.gloo, op, nbytes)
                per = f" ({size_text(nbytes // n)} per rank)" if op == "all_gather" else ""
                w(f"| {op} | {size_text(nbytes)}{per} | "
                  f"{us_runs(self.values(self.ours, op, nbytes))} | {bw_text(o)} | "
                  f"{us_runs(self.values(self.gloo, op, nbytes))} | {bw_text(g)} | "
                  f"{ratio_text(ratio(o, g))} | {bw_text(self.busbw(self.inproc, op, nbytes))} |")
        w("")

        self.write_sparse(w)

        # barrier
        w("### Barrier latency")
        w("")
        w("500 barriers back to back after 20 (Gloo, ours) or 2 (MPI) warmups; p50 = the median "
          "of the per-iteration slowest rank; p99 where the benchmark reports it. Ours is an "
          "all-reduce of one int64 per rank (BarrierOptions defaults).")
        w("")
        w("| barrier | p50 µs, runs | p50 µs, median | p99 µs, runs |")
        w("|---|---|---:|---|")
        rows = [(f"ours, engine over TCP ({n} processes)", self.ours),
                ("ours, ranks as threads (in-process transport)", self.inproc),
                ("torch Gloo", self.gloo)]
        if not mpi:
            rows.append(("Open MPI TCP", self.mpi_tcp))
        rows.append(("Open MPI vader (shared memory, context)", self.mpi_vader))
        for label, runs in rows:
            p50 = self.values(runs, "barrier", field="p50_us") or self.values(runs, "barrier")
            p99 = self.values(runs, "barrier", field="p99_us")
            w(f"| {label} | {us_runs(p50)} | {us_text(med(p50))} | {us_runs(p99) if p99 else '—'} |")
        if mpi:
            w(f"| Open MPI TCP | {mpi} | — | — |")
        if self.rest and self.rest.get("available"):
            w(f"| tesserad REST `POST /api/v1/barriers/{{name}}`, {self.rest.get('ranks')} client "
              f"threads, {self.rest.get('iters')} rounds (max {us_text(self.rest.get('max_us'))}) | "
              f"{us_text(self.rest.get('p50_us'))} | {us_text(self.rest.get('p50_us'))} | "
              f"{us_text(self.rest.get('p99_us'))} |")
        else:
            why = (self.rest or {}).get("reason") or "tessera_bench_rest_barrier did not run"
            w(f"| tesserad REST `POST /api/v1/barriers/{{name}}` | not measured yet ({why}) | — | — |")
        w("")

        w("### Reading these figures")
        w("")
        w(f"- {n} ranks share 2 vCPUs. Open MPI busy-polls (its ranks spin); Gloo blocks on "
          "sockets and condition variables; in our TcpTransport the calling thread receives: "
          "it polls every peer's socket without blocking for up to 50 µs (yielding the CPU "
          "between polls), then blocks in poll(2), so a message that comes soon costs no "
          "wake-up; in calls whose data rides the opening exchange (up to 16 KiB) it stops "
          "polling at the first yield that ran another thread, since then the ranks it waits "
          "for need its CPU. "
          "Below ~16 KiB the times are mostly scheduler wake-ups (bench/peers/README.md); compare "
          "ours with the in-process column, which has the same engine without sockets.")
        w("- At 16–64 MiB every transport here is bound by 2 cores copying, reducing and moving "
          "bytes through the kernel (bench/peers/README.md: 0.5–1.3 GB/s busbw, while iperf3 on "
          "this loopback gave 2.4–3.9 GB/s).")
        w("- Only same-session ratios mean something on this VM; a verdict near its threshold "
          "needs another `TESSERA_BENCH_ONLY=collectives bash bench/run.sh` before it is "
          "trusted.")
        w("")


if __name__ == "__main__":
    sys.exit(main())
