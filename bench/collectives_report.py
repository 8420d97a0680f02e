"""The "Collectives" section of bench/RESULTS.md, and its rows of the Targets table: ours
(tessera_bench_collectives: ours<i>.jsonl, ours_inproc.jsonl; tessera_bench_rest_barrier:
rest_barrier.jsonl) next to torch Gloo (gloo<i>.jsonl, sparse_gloo<i>.jsonl) and Open MPI
over TCP (mpi<i>.jsonl), all in --out, and the peers' reference runs in bench/peers/results.
Standard library only (bench/report.py runs it with Debian's /usr/bin/python3)."""
import glob
import os
import re

from report_common import (bw_text, load, med, ratio, ratio_text, sh, size_text, us_runs,
                           us_text, verdict, verdict_below)

# Targets of the collectives work, 4 ranks on loopback TCP.
AR_VS_GLOO = 1.2         # all_reduce busbw ≥ 1.2x torch Gloo at ≥ 16 MiB
AR_VS_MPI = 1.0          # all_reduce busbw ≥ 1.0x Open MPI (TCP BTL) at 1 MiB and ≥ 16 MiB
LAT_VS_MPI = 1.0         # all_reduce time ≤ 1.0x Open MPI (TCP BTL) at ≤ 4 KiB and 64 KiB
BCAST_VS_GLOO = 1.2      # broadcast 16 MiB busbw ≥ 1.2x torch Gloo
BARRIER_US = 100.0       # engine barrier p50 < 100 µs
REST_BARRIER_US = 2000.0  # tesserad REST barrier p50 < 2 ms


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
    def write_targets_intro(self, w):
        """What the top Targets table says of the collectives rows."""
        w("Collectives rows: 4 ranks on loopback TCP, medians of this session's runs "
          "(ours: tessera_bench_collectives; peers: allreduce_torch_gloo.py and "
          "allreduce_mpi.sh, alternated with ours); details in the Collectives section.")
        w("")

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
