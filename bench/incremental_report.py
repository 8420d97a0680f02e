"""The "Incremental saves" section of bench/RESULTS.md, from what bench/incremental.py
wrote (bench/out/incremental.json: one JSON object). Standard library only, so that
bench/report.py can use markdown() without numpy or the client."""

import statistics

# The goals, on the medians of saves 2..N (the first save of a series is full).
WRITTEN_GOAL = 0.10   # finetune: incremental writes ≤ 10 % of the bytes a full save writes
SPEEDUP_GOAL = 5.0    # finetune: save() → commit ≥ 5× faster
OVERHEAD_GOAL = 1.03  # pretrain: incremental save() → commit ≤ 1.03 × full

MIB = float(1 << 20)
HEAD = "## Incremental saves (bench/incremental.py)"


def _med(xs):
    return statistics.median(xs) if xs else None


def _num(x, digits):
    return "—" if x is None else "%.*f" % (digits, x)


def _cell(xs, digits=1):
    """median (min–max)."""
    if not xs:
        return "—"
    return "%s (%s–%s)" % (_num(_med(xs), digits), _num(min(xs), digits), _num(max(xs), digits))


class Side:
    """One mode (full or incremental) of one workload over every run, or one run."""

    def __init__(self, pairs, kind, mode, run=None):
        self.series = [s for p in pairs for s in p["series"] if s["kind"] == kind
                       and s["mode"] == mode and (run is None or s["run"] == run)]

    def values(self, key, later=True, scale=1.0, first=None):
        """`key` of every save: 2..N when later, else 1..N; first: only those that went
        first (True) or second (False) in their step."""
        return [r[key] / scale for s in self.series for r in s["saves"]
                if (r["save"] > 1 or not later) and (first is None or r["first"] == first)]

    def save1(self, key, scale=1.0):
        return [r[key] / scale for s in self.series for r in s["saves"] if r["save"] == 1]

    def totals(self, key, scale=1.0):
        """Per run, the sum of `key` over all its saves."""
        return [sum(r[key] for r in s["saves"]) / scale for s in self.series]


def _same_step(pairs, kind, key, run=None):
    """incremental / full of the two saves of every step 2..N (one pair of saves each)."""
    out = []
    for p in pairs:
        if p["kind"] != kind or (run is not None and p["run"] != run):
            continue
        by = {s["mode"]: {r["save"]: r[key] for r in s["saves"]} for s in p["series"]}
        full, incr = by.get("full", {}), by.get("incremental", {})
        out += [incr[k] / full[k] for k in sorted(full) if k > 1 and k in incr and full[k]]
    return out


# (workload, label, key, scale, digits, figure from (full, incr) medians, its text, goal
# text, met(figure), same-step figure from an incr/full ratio, whether a verdict counts)
GOALS = [
    ("finetune", "bytes written per save (stored − referenced), MiB", "written_bytes", MIB, 1,
     lambda f, i: i / f, lambda r: "%.1f %%" % (100 * r),
     "≤ %.0f %% of full" % (100 * WRITTEN_GOAL), lambda r: r <= WRITTEN_GOAL, lambda q: q, True),
    ("finetune", "growth of the checkpoint root on disk per save, MiB", "disk_growth_bytes", MIB,
     1, lambda f, i: i / f, lambda r: "%.1f %%" % (100 * r),
     "(≤ %.0f %%: the same goal, on disk)" % (100 * WRITTEN_GOAL), lambda r: r <= WRITTEN_GOAL,
     lambda q: q, False),
    ("finetune", "save() → commit, s", "commit_s", 1.0, 3, lambda f, i: f / i,
     lambda r: "%.2f× faster" % r, "≥ %.0f× faster" % SPEEDUP_GOAL,
     lambda r: r >= SPEEDUP_GOAL, lambda q: 1 / q, True),
    ("pretrain", "save() → commit (every byte changes), s", "commit_s", 1.0, 3,
     lambda f, i: i / f, lambda r: "%+.1f %%" % (100 * (r - 1)),
     "≤ +%.0f %%" % (100 * (OVERHEAD_GOAL - 1)), lambda r: r <= OVERHEAD_GOAL, lambda q: q, True),
]


def _goals(pairs, n):
    """(rows of the goals table, verdicts that count)."""
    rows, verdicts = [], []
    runs = sorted({p["run"] for p in pairs})
    for kind, label, key, scale, digits, figure, text, goal, ok, same, counts in GOALS:
        full, incr = Side(pairs, kind, "full"), Side(pairs, kind, "incremental")
        fv, iv = full.values(key, scale=scale), incr.values(key, scale=scale)
        if not (fv and iv and _med(fv) and _med(iv)):
            continue
        r = figure(_med(fv), _med(iv))
        per_run = []
        for run in runs:
            f = _med(Side(pairs, kind, "full", run).values(key, scale=scale))
            i = _med(Side(pairs, kind, "incremental", run).values(key, scale=scale))
            if f and i:
                per_run.append((run, figure(f, i)))
        steps = [same(q) for q in _same_step(pairs, kind, key) if q]
        verdict = ok(r)
        split = [run for run, x in per_run if ok(x) != verdict]
        note = " (run %s alone: %s)" % (", ".join(str(x) for x in split),
                                        "not met" if verdict else "met") if split else ""
        rows.append("| %s: %s, saves 2..%d | %s | %s | **%s** | %s | %s (%s – %s) | %s | %s%s |"
                    % (kind, label, n, _cell(fv, digits), _cell(iv, digits), text(r),
                       " / ".join(text(x) for _, x in per_run), text(_med(steps)),
                       text(min(steps)), text(max(steps)), goal,
                       "met" if verdict else "**not met**", note))
        if counts:
            verdicts.append(verdict)
    return rows, verdicts


def _detail(pairs, n):
    L = ["| workload | measure | full: median (min–max) | incremental: median (min–max) | "
         "incremental / full (medians) |", "|---|---|---:|---:|---:|"]
    for kind in ("finetune", "pretrain"):
        full, incr = Side(pairs, kind, "full"), Side(pairs, kind, "incremental")
        if not (full.series and incr.series):
            continue
        later = "saves 2..%d" % n
        lines = [
            ("save 1 (full in both): save() → commit, s", full.save1("commit_s"),
             incr.save1("commit_s"), 3),
            ("save 1: bytes written, MiB", full.save1("written_bytes", MIB),
             incr.save1("written_bytes", MIB), 1),
            ("%s: save() → commit, s" % later, full.values("commit_s"),
             incr.values("commit_s"), 3),
            ("%s going first in their step: save() → commit, s" % later,
             full.values("commit_s", first=True), incr.values("commit_s", first=True), 3),
            ("%s going second in their step: save() → commit, s" % later,
             full.values("commit_s", first=False), incr.values("commit_s", first=False), 3),
            ("%s: save() returns (the trainer's stall), ms" % later,
             full.values("save_call_s", scale=1e-3), incr.values("save_call_s", scale=1e-3), 1),
            ("%s: the worker's snapshot_ms" % later, full.values("snapshot_ms"),
             incr.values("snapshot_ms"), 1),
            ("%s: the worker's CPU from save() to the commit, s" % later,
             full.values("worker_cpu_s"), incr.values("worker_cpu_s"), 3),
            ("%s: bytes written (stored − referenced), MiB" % later,
             full.values("written_bytes", scale=MIB), incr.values("written_bytes", scale=MIB), 1),
            ("%s: referenced_bytes, MiB" % later, full.values("referenced_bytes", scale=MIB),
             incr.values("referenced_bytes", scale=MIB), 1),
            ("%s: root growth on disk (st_size), MiB" % later,
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


def _pairs_table(pairs, n):
    L = ["| # | workload | run | save() → commit, saves 2..%d, median s: full / incremental | "
         "save() returns, saves 2..%d, median ms: full / incremental | "
         "all %d saves, s: full / incremental | written, all saves, MiB: full / incremental | "
         "last step restored bit for bit | root after deleting, MiB | 1-min load before → after "
         "| CPU s: worker / tesserad / this process / other processes |" % (n, n, n),
         "|---:|---|---:|---|---|---|---|---|---|---|---|"]
    for i, p in enumerate(pairs, 1):
        by = {s["mode"]: s for s in p["series"]}
        f, inc = by.get("full"), by.get("incremental")
        if not (f and inc):
            continue

        def both(fn, digits):
            return " / ".join(_num(fn(s), digits) for s in (f, inc))
        c = p.get("cpu_s", {})
        L.append("| %d | %s | %d | %s | %s | %s | %s | %s | %s | %.2f → %.2f | "
                 "%.1f / %.1f / %.1f / %.1f |" % (
                    i, p["kind"], p["run"],
                    both(lambda s: _med([r["commit_s"] for r in s["saves"] if r["save"] > 1]), 3),
                    both(lambda s: _med([r["save_call_s"] * 1e3 for r in s["saves"]
                                         if r["save"] > 1]), 1),
                    both(lambda s: sum(r["commit_s"] for r in s["saves"]), 2),
                    both(lambda s: sum(r["written_bytes"] for r in s["saves"]) / MIB, 0),
                    " / ".join("yes" if s.get("restore_equal") else "**no**" for s in (f, inc)),
                    both(lambda s: s["reclaim"]["left_bytes"] / MIB, 1),
                    p["loadavg_before"], p["loadavg_after"], c.get("worker_s", 0),
                    c.get("tesserad_s", 0), c.get("bench_s", 0), c.get("other_s", 0)))
    return L


def markdown(rows):
    """The "Incremental saves" section of bench/RESULTS.md from `rows` (bench/report.py's
    load() of incremental.json: one row, the run's whole document)."""
    doc = next((r for r in reversed(rows) if r.get("bench") == "incremental"), None)
    if doc is None or not doc.get("pairs"):
        return [HEAD, "", "Not measured."]
    m, pairs = doc["meta"], doc["pairs"]
    mach = m.get("machine", {})
    n, state, cs = m["saves"], m["state_bytes"], m.get("chunk_size") or 0
    ft = next((p for p in pairs if p["kind"] == "finetune"), {})
    goal_rows, verdicts = _goals(pairs, n)
    full_s = [x for kind in ("finetune", "pretrain")
              for x in Side(pairs, kind, "full").values("commit_s", later=False)]
    L = [HEAD, ""]
    if m.get("quick") or state < (1 << 30) or m["runs"] < 2:
        L += ["> **Not the issue's configuration** (%.0f MiB of state, %d run(s)%s): the "
              "verdicts below do not judge the goals." % (
                  state / MIB, m["runs"], ", --quick" if m.get("quick") else ""), ""]
    L += ["tesserad and one worker on this machine (`tessera.local.LocalCluster`, "
          "`--copy-threads 1`); the trainer is the benchmark's own process: a "
          "`tessera.CheckpointManager` per mesh `{data: 1}`, holding %d float32 tensors of "
          "%.0f MiB (%.2f GiB, N(0, 0.02) from numpy) in the worker's mappings (/dev/shm). The "
          "checkpoint root is a directory on this VM's disk. Chunks of %.0f MiB "
          "(`kDefaultChunkSize`); compression: %s. %d saves per series, one per step, the state "
          "changed in place between steps (outside the timing):" % (
              m["tensors"], m["tensor_bytes"] / MIB, state / 2**30, cs / MIB, m["compression"], n),
          "",
          "- **finetune**: a frozen base; the last %.1f %% of the state (%.1f MiB, one contiguous "
          "region at its end: the trained layers, %s chunks) gets fresh values every step." % (
              100 * m["changed_fraction"], ft.get("changed_bytes", 0) / MIB,
              ft.get("changed_chunks", "?")),
          "- **pretrain**: every chunk gets fresh values every step.",
          "",
          "**full** = `save(step, full=True)` every step; **incremental** = `save(step, "
          "full_every=%d)`, whose first save is full (nothing to refer to yet) and the rest write "
          "only the chunks whose xxh64 differs from the last committed save's. Each workload runs "
          "both series at once on two fresh meshes of the one worker, with the same state and "
          "updates, their saves interleaved step by step: full first at odd steps of run 1 and "
          "second at even ones, the other way round in run 2 (whose incremental mesh is also "
          "made first), so that both meet the same disk: a full save of the same bytes took "
          "anywhere from %.2f to %.2f s in this run, moving within a series, which one series "
          "after the other could not tell from a 3 %% difference. Per save: the time from "
          "`save()` to the commit (`handle.wait()`); bytes written = tesserad's `stored_bytes − "
          "referenced_bytes` of the checkpoint; root growth = the checkpoint root's files "
          "(`os.walk`, `st_size`) after the commit less before `save()` (the new shard, its index "
          "and summary). %d run(s); medians over the saves of every run, spread min–max; "
          "\"same step\" = the median (min–max) of the ratio between the two saves of each step. "
          "MiB = 2^20 bytes. After the saves each mesh's last step is restored into zeroed "
          "tensors and compared, and its checkpoints are deleted." % (
              m["full_every"], min(full_s), max(full_s), m["runs"]),
          "",
          "Run: %s to %s (UTC) on `nproc` = %s (%s); memory %s; disk %s; kernel %s; %s; %s; "
          "/usr/bin/python3 %s; the product code at `%s`; 1-min load average %.2f at the start. "
          "Command: `%s`." % (
              m["started_utc"], m.get("finished_utc", "?"), mach.get("nproc", m.get("cpus")),
              mach.get("cpu", "?"), mach.get("memory", "?"), mach.get("disk", "?"),
              mach.get("kernel", "?"), mach.get("os", "?"), mach.get("gcc", "?"),
              mach.get("python", "?"), m.get("product_commit", "?"), m.get("loadavg", 0),
              m.get("command", "bench/incremental.py")),
          "",
          "### Goals",
          "",
          "| measure | full | incremental | incremental against full (medians) | per run "
          "(run 1 / 2 …) | same step | goal | verdict |",
          "|---|---:|---:|---:|---|---|---|---|"]
    L += goal_rows
    L += ["", "%d of %d goals met." % (sum(1 for v in verdicts if v), len(verdicts))]
    steps = _same_step(pairs, "pretrain", "commit_s")
    if steps and (max(steps) - 1 > 3 * (OVERHEAD_GOAL - 1) or 1 - min(steps) > 3 * (
            OVERHEAD_GOAL - 1)):
        L += ["", "The pretrain goal allows +%.0f %%, while the two saves of one step (the same "
              "bytes, back to back) differed by %+.0f %% to %+.0f %% in this run: its verdict "
              "lies within this VM's noise, and another run may well flip it (more saves or "
              "--runs narrow it)." % (
                  100 * (OVERHEAD_GOAL - 1), 100 * (min(steps) - 1), 100 * (max(steps) - 1))]
    L += ["", "### Full and incremental side by side", ""]
    L += _detail(pairs, n)
    L += ["", "### Every run, in the order run", ""]
    L += _pairs_table(pairs, n)
    series = [s for p in pairs for s in p["series"]]
    bad = [s for s in series if not s.get("restore_equal")]
    left = [s for s in series if s["reclaim"]["left_bytes"] > (1 << 20)]
    L += ["", ("Every series' last step read back bit for bit" if not bad else
               "**%d series did not read back their last step bit for bit**" % len(bad)) +
          (", and deleting its checkpoints gave the root's space back." if not left else
           "; **deleting the checkpoints left %d series' files in the root** (see the table)."
           % len(left)),
          "CPU s: user + system during the run's saves and state updates (not the restores): the "
          "worker's and tesserad's from /proc, this process's (the trainer updating the state), "
          "and everything else on the machine (/proc/stat less those)."]
    busy = [(i, p) for i, p in enumerate(pairs, 1) if p.get("cpu_s", {}).get("other_s", 0) >
            0.1 * max(1.0, p.get("wall_s", 0))]
    if busy:
        L += ["", "**Other processes shared the 2 vCPUs** during %s: %s CPU s in all, while the "
              "worker used %s; those figures are slower and noisier than a quiet machine's." % (
                  ", ".join("#%d (%s, run %d)" % (i, p["kind"], p["run"]) for i, p in busy),
                  " + ".join("%.1f" % p["cpu_s"]["other_s"] for _, p in busy),
                  " + ".join("%.1f" % p["cpu_s"]["worker_s"] for _, p in busy))]
    return L
