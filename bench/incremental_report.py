"""The "Incremental saves" section of bench/RESULTS.md, from what bench/incremental.py
wrote (bench/out/incremental.json: one JSON object). Standard library only, so that
bench/report.py can use markdown() without numpy or the client."""

import statistics

# The goals, on the medians of saves 2..N (the first save of a series is full).
WRITTEN_GOAL = 0.10   # finetune: incremental writes ≤ 10 % of the bytes a full save writes
SPEEDUP_GOAL = 5.0    # finetune: save() → commit ≥ 5× faster
OVERHEAD_GOAL = 1.03  # pretrain: incremental save() → commit ≤ 1.03 × full

MIB = float(1 << 20)


def _med(xs):
    return statistics.median(xs) if xs else None


def _num(x, digits):
    return "—" if x is None else "%.*f" % (digits, x)


def _cell(xs, digits=1):
    """median (min–max)."""
    if not xs:
        return "—"
    return "%s (%s–%s)" % (_num(_med(xs), digits), _num(min(xs), digits), _num(max(xs), digits))


def _verdict(ok):
    return "—" if ok is None else ("met" if ok else "**not met**")


class Runs:
    """The series of one workload and mode, and their saves' figures."""

    def __init__(self, series, kind, mode):
        self.series = [s for s in series if s["kind"] == kind and s["mode"] == mode]

    def values(self, key, later=True, scale=1.0, run=None):
        """`key` of every save (saves 2..N when later, else 1..N) of every run (or one)."""
        return [r[key] / scale for s in self.series if run is None or s["run"] == run
                for r in s["saves"] if r["save"] > 1 or not later]

    def first(self, key, scale=1.0):
        return [r[key] / scale for s in self.series for r in s["saves"] if r["save"] == 1]

    def totals(self, key, scale=1.0):
        """Per run, the sum of `key` over all its saves."""
        return [sum(r[key] for r in s["saves"]) / scale for s in self.series]

    def runs(self):
        return sorted({s["run"] for s in self.series})


def _goals(series, n):
    """(rows of the goals table, verdicts)."""
    rows = []
    ft_full, ft_incr = Runs(series, "finetune", "full"), Runs(series, "finetune", "incremental")
    pt_full, pt_incr = Runs(series, "pretrain", "full"), Runs(series, "pretrain", "incremental")
    # (label, full, incr, key, scale, digits, ratio(full, incr), ratio text, goal text, ok)
    specs = []
    if ft_full.series and ft_incr.series:
        specs.append(("finetune: bytes written per save (stored − referenced), MiB", ft_full,
                      ft_incr, "written_bytes", MIB, 1, lambda f, i: i / f,
                      lambda r: "%.1f %%" % (100 * r), "≤ %.0f %% of full" % (100 * WRITTEN_GOAL),
                      lambda r: r <= WRITTEN_GOAL))
        specs.append(("finetune: growth of the checkpoint root on disk per save, MiB", ft_full,
                      ft_incr, "disk_growth_bytes", MIB, 1, lambda f, i: i / f,
                      lambda r: "%.1f %%" % (100 * r), "(≤ %.0f %%)" % (100 * WRITTEN_GOAL),
                      lambda r: r <= WRITTEN_GOAL))
        specs.append(("finetune: save() → commit, s", ft_full, ft_incr, "commit_s", 1.0, 3,
                      lambda f, i: f / i, lambda r: "%.2f× faster" % r,
                      "≥ %.0f× faster" % SPEEDUP_GOAL, lambda r: r >= SPEEDUP_GOAL))
    if pt_full.series and pt_incr.series:
        specs.append(("pretrain (every byte changes): save() → commit, s", pt_full, pt_incr,
                      "commit_s", 1.0, 3, lambda f, i: i / f, lambda r: "%+.1f %%" % (100 * (r - 1)),
                      "≤ +%.0f %%" % (100 * (OVERHEAD_GOAL - 1)), lambda r: r <= OVERHEAD_GOAL))
    verdicts = []
    for label, full, incr, key, scale, digits, ratio, text, goal, ok in specs:
        fv, iv = full.values(key, scale=scale), incr.values(key, scale=scale)
        r = ratio(_med(fv), _med(iv)) if fv and iv and _med(fv) and _med(iv) else None
        per_run = []
        for run in full.runs():
            f, i = _med(full.values(key, scale=scale, run=run)), _med(
                incr.values(key, scale=scale, run=run))
            if f and i:
                per_run.append((run, ratio(f, i)))
        verdict = None if r is None else ok(r)
        split = [run for run, x in per_run if ok(x) != verdict] if verdict is not None else []
        note = (" (run %s alone: %s)" % (", ".join(str(x) for x in split),
                                         "met" if not verdict else "not met")) if split else ""
        rows.append("| %s, saves 2..%d | %s | %s | %s | %s | %s | %s%s |" % (
            label, n, _cell(fv, digits), _cell(iv, digits), "—" if r is None else text(r),
            " / ".join(text(x) for _, x in per_run) or "—", goal, _verdict(verdict), note))
        if not goal.startswith("("):
            verdicts.append(verdict)
    return rows, verdicts


def _detail(series, n):
    L = ["| workload | measure | full: median (min–max) | incremental: median (min–max) | "
         "incremental / full |", "|---|---|---:|---:|---:|"]
    for kind in ("finetune", "pretrain"):
        full, incr = Runs(series, kind, "full"), Runs(series, kind, "incremental")
        if not (full.series and incr.series):
            continue
        lines = [
            ("save 1 (full in both): save() → commit, s", full.first("commit_s"),
             incr.first("commit_s"), 3),
            ("save 1: bytes written, MiB", full.first("written_bytes", MIB),
             incr.first("written_bytes", MIB), 1),
            ("saves 2..%d: save() → commit, s" % n, full.values("commit_s"),
             incr.values("commit_s"), 3),
            ("saves 2..%d: save() returns (the trainer's stall), ms" % n,
             full.values("save_call_s", scale=1e-3), incr.values("save_call_s", scale=1e-3), 1),
            ("saves 2..%d: the worker's snapshot_ms" % n, full.values("snapshot_ms"),
             incr.values("snapshot_ms"), 1),
            ("saves 2..%d: bytes written (stored − referenced), MiB" % n,
             full.values("written_bytes", scale=MIB), incr.values("written_bytes", scale=MIB), 1),
            ("saves 2..%d: referenced_bytes, MiB" % n, full.values("referenced_bytes", scale=MIB),
             incr.values("referenced_bytes", scale=MIB), 1),
            ("saves 2..%d: root growth on disk (st_size), MiB" % n,
             full.values("disk_growth_bytes", scale=MIB),
             incr.values("disk_growth_bytes", scale=MIB), 1),
            ("saves 1..%d: save() → commit, s" % n, full.values("commit_s", later=False),
             incr.values("commit_s", later=False), 3),
            ("all %d saves: total save() → commit per run, s" % n, full.totals("commit_s"),
             incr.totals("commit_s"), 2),
            ("all %d saves: total bytes written per run, MiB" % n,
             full.totals("written_bytes", MIB), incr.totals("written_bytes", MIB), 0),
            ("all %d saves: total root growth per run, MiB" % n,
             full.totals("disk_growth_bytes", MIB), incr.totals("disk_growth_bytes", MIB), 0),
        ]
        for label, fv, iv, digits in lines:
            f, i = _med(fv), _med(iv)
            r = "%.3f" % (i / f) if f and i is not None else "—"
            L.append("| %s | %s | %s | %s | %s |" % (kind, label, _cell(fv, digits),
                                                      _cell(iv, digits), r))
    return L


def _series_table(series, n):
    L = ["| # | workload | mode | run | save() → commit, saves 2..%d, median s | written per save, "
         "saves 2..%d, median MiB | all saves: s / written MiB / root growth MiB | "
         "last step restored bit for bit | root after deleting, MiB | 1-min load before → after | "
         "CPU s: worker / tesserad / this process / other processes |" % (n, n),
         "|---:|---|---|---:|---:|---:|---|---|---:|---|---|"]
    for i, s in enumerate(series, 1):
        saves = [r for r in s["saves"] if r["save"] > 1]
        c = s.get("cpu_s", {})
        L.append("| %d | %s | %s | %d | %.3f | %.1f | %.2f / %.0f / %.0f | %s | %.1f | %.2f → %.2f | "
                 "%.1f / %.1f / %.1f / %.1f |" % (
                     i, s["kind"], s["mode"], s["run"], _med([r["commit_s"] for r in saves]),
                     _med([r["written_bytes"] for r in saves]) / MIB,
                     sum(r["commit_s"] for r in s["saves"]),
                     sum(r["written_bytes"] for r in s["saves"]) / MIB,
                     sum(r["disk_growth_bytes"] for r in s["saves"]) / MIB,
                     "yes" if s.get("restore_equal") else "**no**",
                     s["reclaim"]["left_bytes"] / MIB, s["loadavg_before"], s["loadavg_after"],
                     c.get("worker_s", 0), c.get("tesserad_s", 0), c.get("bench_s", 0),
                     c.get("other_s", 0)))
    return L


def markdown(rows):
    """The "Incremental saves" section of bench/RESULTS.md from `rows` (bench/report.py's
    load() of incremental.json: one row, the run's whole document)."""
    doc = next((r for r in reversed(rows) if r.get("bench") == "incremental"), None)
    if doc is None or not doc.get("series"):
        return ["## Incremental saves (bench/incremental.py)", "", "Not measured."]
    m, series = doc["meta"], doc["series"]
    mach = m.get("machine", {})
    n = m["saves"]
    state, cs = m["state_bytes"], m.get("chunk_size") or 0
    ft = next((s for s in series if s["kind"] == "finetune"), {})
    changed, chunks = ft.get("changed_bytes"), ft.get("changed_chunks", "?")
    goal_rows, verdicts = _goals(series, n)
    L = ["## Incremental saves (bench/incremental.py)", ""]
    if m.get("quick") or state < (1 << 30):
        L += ["> **Not the issue's configuration** (%.0f MiB of state%s): the figures below do "
              "not judge the goals. Run `bench/incremental.py` without --quick." % (
                  state / MIB, ", --quick" if m.get("quick") else ""), ""]
    L += ["tesserad and one worker on this machine (`tessera.local.LocalCluster`, "
          "`--copy-threads 1`); the trainer is the benchmark's own process: a "
          "`tessera.CheckpointManager` on mesh `{data: 1}` holding %d float32 tensors of %.0f MiB "
          "(%.2f GiB, N(0, 0.02) from numpy) in the worker's mappings (/dev/shm). The checkpoint "
          "root is a directory on this VM's disk. Chunks of %.0f MiB (`kDefaultChunkSize`); "
          "compression: %s. %d saves per series, one per step, the state changed in place "
          "between saves (outside the timing):" % (
              m["tensors"], m["tensor_bytes"] / MIB, state / 2**30, cs / MIB, m["compression"], n),
          "",
          "- **finetune**: a frozen base; the last %.1f %% of the state (%.1f MiB, one contiguous "
          "region at the end, the trained layers, in %s chunks) gets fresh values every "
          "step." % (100 * m["changed_fraction"], (changed or 0) / MIB, chunks),
          "- **pretrain**: every chunk gets fresh values every step.",
          "",
          "Each workload as two series on a fresh mesh each: **full** = `save(step, full=True)` "
          "every time; **incremental** = `save(step, full_every=%d)`, whose first save is full "
          "(nothing to refer to yet) and the rest write only the chunks whose xxh64 differs from "
          "the last committed save's. Per save: the time from `save()` to the commit "
          "(`handle.wait()`); bytes written = tesserad's `stored_bytes − referenced_bytes` of the "
          "checkpoint; root growth = the checkpoint root's files (`os.walk`, `st_size`) after the "
          "commit less before `save()` (the new shard plus its index and summary). %d run(s) of "
          "each series, ordered full, incremental, incremental, full (ABBA) so that the disk's "
          "drift hits both; medians over the saves of every run, spread min–max; MiB = 2^20 bytes. "
          "After each series its last step is restored into zeroed tensors and compared, and its "
          "checkpoints are deleted." % (m["full_every"], m["runs"]),
          "",
          "Run: %s to %s (UTC) on `nproc` = %s (%s); memory %s; disk %s; kernel %s; %s; "
          "%s; /usr/bin/python3 %s; the product code at `%s`; 1-min load average %.2f at the "
          "start. Command: `%s`." % (
              m["started_utc"], m.get("finished_utc", "?"), mach.get("nproc", m.get("cpus")),
              mach.get("cpu", "?"), mach.get("memory", "?"), mach.get("disk", "?"),
              mach.get("kernel", "?"), mach.get("os", "?"), mach.get("gcc", "?"),
              mach.get("python", "?"), m.get("product_commit", "?"), m.get("loadavg", 0),
              m.get("command", "bench/incremental.py")),
          "",
          "### Goals",
          "",
          "| measure | full | incremental | incremental against full | per run (run 1 / 2 …) | "
          "goal | verdict |",
          "|---|---:|---:|---:|---|---|---|"]
    L += goal_rows
    met = sum(1 for v in verdicts if v)
    L += ["", "%d of %d goals met (the root-growth row, in parentheses, is the same goal measured "
          "on the disk rather than from the catalog)." % (met, len(verdicts)), "",
          "### Full and incremental side by side", ""]
    L += _detail(series, n)
    L += ["", "### Every series, in the order run", ""]
    L += _series_table(series, n)
    bad = [s for s in series if not s.get("restore_equal")]
    left = [s for s in series if s["reclaim"]["left_bytes"] > (1 << 20)]
    L += ["", ("Every series' last step read back bit for bit" if not bad else
               "**%d series did not read back their last step bit for bit**" % len(bad)) +
          (", and deleting its checkpoints gave the root's space back." if not left else
           "; **deleting the checkpoints left %d series' files in the root** (see the table)."
           % len(left)),
          "CPU s: user + system over the series (saves and state updates, not the restore): the "
          "worker's and tesserad's from /proc, this process's (the trainer copying the state), and "
          "everything else on the machine (/proc/stat less those)."]
    return L
