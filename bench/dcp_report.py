"""The "PyTorch DCP" section of bench/RESULTS.md, from what bench/dcp.py measured
(bench/out/dcp.jsonl): tessera.dcp against DCP's FileSystemWriter, FileSystemReader and
its stagers. Standard library only (bench/report.py runs it with Debian's python3)."""

import statistics

WORLD = 4


def per_round(row, key, agg=max):
    """The value of `key` per measured round, the slowest rank's (agg over ranks)."""
    lists = [r[key] for r in row["ranks"]]
    return [agg(vals) for vals in zip(*lists)]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def added_gb(row):
    """Memory a save added: the ranks' VmHWM over their RSS before (less the in-run
    memcpy's buffers, probe_kb), their daemons', and the workers'."""
    kb = sum(max(0, r["hwm_kb"] - r["rss_before_kb"] - r.get("probe_kb", 0)) +
             r.get("children_hwm_kb", 0) for r in row["ranks"]) + row.get("workers_added_kb", 0)
    return kb / (1 << 20)


def summarize(rows):
    """{measure: [value per run]} from every run's rows."""
    runs = sorted({r["run"] for r in rows})
    out = {}

    def put(name, value):
        out.setdefault(name, []).append(value)

    for run in runs:
        by = {}
        for r in rows:
            if r["run"] == run:
                by.setdefault(r["mode"], []).append(r)
        put("memcpy", med(per_round(by["memcpy"][0], "copy_s")))
        inrun = [v for r in by["async-tessera"] if "inrun_copy_s" in r["ranks"][0]
                 for v in per_round(r, "inrun_copy_s")]
        if inrun:
            put("memcpy-inrun", med(inrun))
        put("fresh", med(per_round(by["memcpy"][0], "fresh_s")))
        put("blocked-tessera", med([v for r in by["async-tessera"]
                                    for v in per_round(r, "blocked_s")]))
        put("blocked-thread", med(per_round(by["async-thread"][0], "blocked_s")))
        put("blocked-process", med(per_round(by["async-process"][0], "blocked_s")))
        put("durable-async-tessera", med([v for r in by["async-tessera"]
                                          for v in per_round(r, "durable_s")]))
        put("durable-async-thread", med(per_round(by["async-thread"][0], "durable_s")))
        put("save-tessera", med(per_round(by["save-tessera"][0], "save_s")))
        put("save-fs", med(per_round(by["save-fs"][0], "save_s")))
        put("load-tessera", med(per_round(by["load-tessera"][0], "load_s")))
        put("load-fs", med(per_round(by["load-fs"][0], "load_s")))
        if "load-tessera-raw" in by:
            put("load-tessera-raw", med(per_round(by["load-tessera-raw"][0], "load_s")))
        put("mem-tessera", med([added_gb(r) for r in by["async-tessera"]]))
        put("mem-thread", added_gb(by["async-thread"][0]))
        put("mem-process", added_gb(by["async-process"][0]))
        for t in ("none", "tessera", "thread"):
            put("train-" + t, min(r["steps_per_s"] for r in by["train-" + t][0]["ranks"]))
    return out


def spread(xs, fmt):
    return "%s (%s–%s)" % (fmt % med(xs), fmt % min(xs), fmt % max(xs))


def markdown(rows):
    """The "PyTorch DCP" section of bench/RESULTS.md (lines) from bench/out/dcp.jsonl."""
    s = summarize(rows)
    mb, runs, torch_version = rows[0]["mb"], len({r["run"] for r in rows}), rows[0]["torch"]
    gib = WORLD * mb / 1024

    def ratio(a, b):
        return [x / y for x, y in zip(s[a], s[b])]

    def verdict(xs, goal, higher):
        ok = all(x >= goal for x in xs) if higher else all(x <= goal for x in xs)
        near = any(abs(x - goal) / goal < 0.1 for x in xs)
        return ("met" if ok else "not met") + (" (near the threshold)" if near else "")

    lines = [
        "## PyTorch DCP: tessera.dcp against DCP's own writer, reader and stagers",
        "",
        "`bench/dcp.py` (`bash bench/run.sh`, or `.venv/bin/python bench/dcp.py`): %d ranks "
        "(gloo) × %d MiB of float32 (%.0f GiB in all, 16 `Shard(0)` DTensors per rank) on "
        "this 2-vCPU VM, torch %s; each mode a fresh set of processes (ours: a fresh tesserad "
        "and 4 workers, shared memory in /dev/shm, the root on the same disk as DCP's "
        "files); %d runs, modes alternating ours and the peer's. Times are the slowest "
        "rank's, median over the saves of a run after the first; medians over runs, the "
        "runs' values in brackets. After an `async_save` the ranks change their state (training "
        "goes on) once every rank's call returned, so that one rank's work does not take the 2 "
        "vCPUs from another's staging. The blocked-time goal's memcpy is taken in the same "
        "processes right before each save (every rank at once, into buffers allocated once, "
        "subtracted from the memory figures); the memcpy of processes of their own, run at "
        "another moment of this VM, is context." % (WORLD, mb, gib, torch_version, runs),
        "",
        "| measure | ours | peer | ratio | goal | verdict |",
        "|---|---:|---:|---:|---|---|",
    ]
    def times(key):
        return spread([x * 1e3 for x in s[key]], "%.0f ms")

    def add(measure, ours, peer, r, goal="—", verdict_="context"):
        lines.append("| %s | %s | %s | %s | %s | %s |" % (measure, ours, peer, r, goal, verdict_))

    if "memcpy-inrun" in s:
        r = ratio("blocked-tessera", "memcpy-inrun")
        add("`async_save` blocked time vs a memcpy of each rank's state, every rank at once, "
            "right before each save in the same processes", times("blocked-tessera"),
            "memcpy " + times("memcpy-inrun"), spread(r, "%.2f×"), "≤ 1.5× memcpy",
            verdict(r, 1.5, False))
    r = ratio("blocked-tessera", "memcpy")
    add("`async_save` blocked time vs a memcpy of each rank's state (every rank at once), "
        "in processes of their own", times("blocked-tessera"), "memcpy " + times("memcpy"),
        spread(r, "%.2f×"), "≤ 1.5× memcpy" if "memcpy-inrun" not in s else "—",
        verdict(r, 1.5, False) if "memcpy-inrun" not in s else "context")
    for peer, name in (("thread", "`THREAD`"), ("process", "`PROCESS`")):
        r = ratio("blocked-" + peer, "blocked-tessera")
        add("`async_save` blocked time vs DCP %s (its default stager)" % name,
            times("blocked-tessera"), times("blocked-" + peer), spread(r, "%.2f×") + " faster")
    r = ratio("save-fs", "save-tessera")
    add("save to durable (`dcp.save`: ours committed, `FileSystemWriter` fsync'd)",
        times("save-tessera"), times("save-fs"), spread(r, "%.2f×") + " faster", "≥ 1.5×",
        verdict(r, 1.5, True))
    r = ratio("load-fs", "load-tessera")
    add("load, the files dropped from the page cache (`dcp.load`)", times("load-tessera"),
        times("load-fs"), spread(r, "%.2f×") + " faster", "≥ 1.0×", verdict(r, 1.0, True))
    if "load-tessera-raw" in s:
        r = ratio("load-fs", "load-tessera-raw")
        add("load as above, saved with `compression=\"none\"`", times("load-tessera-raw"),
            times("load-fs"), spread(r, "%.2f×") + " faster", "≥ 1.0×", verdict(r, 1.0, True))
    r = ratio("mem-tessera", "mem-process")
    add("host memory added by an async save (the ranks' and the workers' or daemons' VmHWM "
        "over their RSS before, summed), GiB", spread(s["mem-tessera"], "%.2f"),
        "`PROCESS` " + spread(s["mem-process"], "%.2f"), spread(r, "%.2f×") + " of DCP's",
        "≤ 0.5×", verdict(r, 0.5, False))
    add("host memory added, DCP `THREAD`, GiB", "—", spread(s["mem-thread"], "%.2f"), "—")
    for t, name in (("tessera", "ours"), ("thread", "DCP `THREAD`")):
        r = ratio("train-" + t, "train-none")
        add("training loop, `async_save` every 5 steps (%s) against none, steps/s" % name,
            spread(s["train-" + t], "%.1f"), "none " + spread(s["train-none"], "%.1f"),
            spread(r, "%.2f×") + " of none", "report", "—")
    lines += [
        "",
        "- `durable` of an `async_save` (until its future is done): ours %s, DCP `THREAD` %s."
        % (times("durable-async-tessera"), times("durable-async-thread")),
        "- A memcpy into buffers allocated once: %s; into fresh ones (what a stager that "
        "allocates pays): %s." % (times("memcpy"), times("fresh")),
    ]
    stages = [st for r in rows if r["mode"] == "async-tessera" for rank in r["ranks"]
              for st in rank.get("stage", [])[1:]]
    if stages:
        first = [rank["stage"][0]["total"] * 1e3 for r in rows if r["mode"] == "async-tessera"
                 for rank in r["ranks"] if rank.get("stage")]
        lines.append(
            "- Where ours blocks (`Writer.stage_seconds`, medians over ranks and saves): "
            "planning %.1f ms; copying into the worker's shared memory where the last save "
            "placed the chunks, %.1f ms; with the agreement on the placement (one all-gather "
            "of a few bytes, which also waits for the slowest rank), %.1f ms. The first save of "
            "a process takes %.0f ms: it maps the worker's shared memory and faults it in."
            % (med([st["plan"] * 1e3 for st in stages]),
               med([st.get("copy", st.get("agree_and_copy", 0)) * 1e3 for st in stages]),
               med([st["total"] * 1e3 for st in stages]), med(first)))
    lines += [
        "- The training loop runs 4 ranks and, for ours, 4 workers and tesserad on 2 vCPUs: a "
        "save's write takes the cores from the loop, ours and DCP's alike.",
        "",
    ]
    return lines
