"""The "JAX and Orbax" section of bench/RESULTS.md, from what bench/jax_orbax.py measured
(bench/out/jax_orbax.jsonl): tessera.jax against Orbax's CheckpointManager. Standard
library only (bench/report.py runs it with Debian's python3)."""

from dcp_report import med, per_round, spread

GIB = 1.0  # the state: 1 GiB of float32 and bfloat16


def _rounds(row, key):
    return per_round({"ranks": row["procs"]}, key)


def _added_gib(row):
    kb = sum(max(0, p["hwm_kb"] - p["rss_before_kb"]) for p in row["procs"])
    return (kb + row.get("workers_added_kb", 0)) / (1 << 20)


def summarize(rows):
    out = {}
    for run in sorted({r["run"] for r in rows}):
        by = {r["mode"]: r for r in rows if r["run"] == run}
        for who in ("tessera", "orbax"):
            for key, mode, field in (("blocked", "save", "blocked_s"),
                                     ("durable", "save", "durable_s"),
                                     ("restore", "restore", "restore_s"),
                                     ("reshard", "reshard", "restore_s")):
                row = by.get("%s-%s" % (mode, who))
                if row is not None:
                    out.setdefault("%s-%s" % (key, who), []).append(med(_rounds(row, field)))
            row = by.get("save-" + who)
            if row is not None:
                out.setdefault("mem-" + who, []).append(_added_gib(row) / GIB)
            row = by.get("reshard-" + who)
            if row is not None:
                out.setdefault("same-" + who, []).append(all(p.get("same") for p in row["procs"]))
        row = by.get("multihost-tessera")
        if row is not None:
            for what in ("sync", "gather_1k", "gather_1m"):
                for who in ("ours", "jax"):
                    key = "%s_%s_s" % (what, who)
                    out.setdefault(key, []).append(med(_rounds(row, key)))
    return out


def markdown(rows):
    s = summarize(rows)
    runs = len({r["run"] for r in rows})
    lines = [
        "## JAX and Orbax: tessera.jax against Orbax's CheckpointManager",
        "",
        "`bench/jax_orbax.py` (`bash bench/run.sh`, or `.venv/bin/python bench/jax_orbax.py`): "
        "4 JAX processes × 2 CPU devices (an 8-device mesh, data × model), 1 GiB of float32 "
        "and bfloat16 in 8 arrays sharded over both axes, jax %s and orbax-checkpoint %s, on "
        "this 2-vCPU VM; each mode a fresh set of processes (ours: a fresh tesserad and 4 "
        "workers, the root on the same disk as Orbax's directory); Orbax async, its default "
        "format (OCDBT, zarr3). %d runs; times are the slowest process's, median over the "
        "rounds after the first; medians over runs, the runs' values in brackets."
        % (rows[0].get("jax", "?"), rows[0].get("orbax", "?"), runs),
        "",
        "| measure | ours | Orbax | ratio | goal | verdict |",
        "|---|---:|---:|---:|---|---|",
    ]

    def ms(key):
        return spread([x * 1e3 for x in s[key]], "%.0f ms")

    def ratio(a, b):
        return [x / y for x, y in zip(s[a], s[b])]

    def verdict(xs, goal, higher):
        ok = all(x >= goal for x in xs) if higher else all(x <= goal for x in xs)
        return "met" if ok else "not met"

    r = ratio("blocked-tessera", "blocked-orbax")
    lines.append("| blocked time of an async save | %s | %s | %s of Orbax's | ≤ 0.5× | %s |" % (
        ms("blocked-tessera"), ms("blocked-orbax"), spread(r, "%.2f×"), verdict(r, 0.5, False)))
    r = ratio("durable-orbax", "durable-tessera")
    lines.append("| save to durable (ours committed; Orbax finished and finalized) | %s | %s | "
                 "%s faster | ≥ 1.5× | %s |" % (ms("durable-tessera"), ms("durable-orbax"),
                                                spread(r, "%.2f×"), verdict(r, 1.5, True)))
    r = ratio("restore-orbax", "restore-tessera")
    lines.append("| restore, the files dropped from the page cache | %s | %s | %s faster | "
                 "≥ 1.5× | %s |" % (ms("restore-tessera"), ms("restore-orbax"),
                                    spread(r, "%.2f×"), verdict(r, 1.5, True)))
    r = ratio("mem-tessera", "mem-orbax")
    lines.append("| host memory added by the saves (processes' and workers' VmHWM over their "
                 "RSS before, summed) over the state | %s | %s | %s of Orbax's | ≤ 0.5× | %s |"
                 % (spread(s["mem-tessera"], "%.2f×"), spread(s["mem-orbax"], "%.2f×"),
                    spread(r, "%.2f×"), verdict(r, 0.5, False)))
    if "reshard-tessera" in s and "reshard-orbax" in s:
        r = ratio("reshard-orbax", "reshard-tessera")
        lines.append("| restore onto 2 processes and a 2 × 2 mesh, other shardings (cold) | %s "
                     "| %s | %s faster | report | bit for bit: ours %s, Orbax %s |" % (
                         ms("reshard-tessera"), ms("reshard-orbax"), spread(r, "%.2f×"),
                         all(s["same-tessera"]), all(s["same-orbax"])))
    for what, name in (("sync", "`sync_global_devices`"),
                       ("gather_1k", "`process_allgather` of 1 KiB per process"),
                       ("gather_1m", "`process_allgather` of 1 MiB per process")):
        if what + "_ours_s" in s:
            r = ratio(what + "_jax_s", what + "_ours_s")
            lines.append("| %s latency, ours (Tessera) against JAX's own (gloo) | %s | JAX %s "
                         "| %s faster | report | — |" % (
                             name, spread([x * 1e3 for x in s[what + "_ours_s"]], "%.2f ms"),
                             spread([x * 1e3 for x in s[what + "_jax_s"]], "%.2f ms"),
                             spread(r, "%.2f×")))
    lines += [
        "",
        "- Durable: ours once the checkpoint committed (every shard file fsync'd, the index "
        "merged); Orbax's once `wait_until_finished()` returned (its arrays written by "
        "TensorStore and the step directory finalized).",
        "- Blocked: ours pins each shard and hands its address to a thread; the worker reads "
        "the arrays in place while it writes (docs/jax.md, \"Borrowed memory\"). Orbax copies "
        "each shard to the host before its call returns.",
        "- Memory: every process's and worker's peak is reset (clear_refs) once the state is "
        "built, so the figure is what the saves add, not the set-up's own peak. Ours is the "
        "workers' write buffers; Orbax's is its host copy of the state and TensorStore's buffers.",
        "- Restore: ours writes each device's shard straight into a fresh buffer of the trainer's "
        "that JAX then keeps; Orbax reads its OCDBT files through TensorStore.",
        "- Onto another process count Orbax restores bit for bit too (its arrays are read by "
        "global box); ours reads boxes through HTTP bodies, slower here.",
        "",
    ]
    return lines
