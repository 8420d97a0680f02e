"""PyTorch Distributed Checkpoint through tessera.dcp against DCP's own FileSystemWriter,
FileSystemReader and async stagers, in the same run (issue 51's measures):

    .venv/bin/python bench/dcp.py [--mb 256] [--runs 2] [--dir DIR] [--out bench/out/dcp.jsonl]

4 ranks (gloo), each with mb MiB of float32 (16 DTensors, Shard(0)), each run a fresh
set of processes per mode (bench/dcp_rank.py); ours with a fresh tesserad and 4 workers
(shared memory in /dev/shm, the checkpoint root on DIR's disk). Modes alternate ours and
the peer's. Writes the "PyTorch DCP" section of bench/RESULTS.md.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from tessera.local import LocalCluster  # noqa: E402

MODES = ["memcpy", "async-tessera", "async-thread", "async-tessera", "async-process",
         "save-tessera", "save-fs", "load-tessera", "load-fs",
         "train-none", "train-tessera", "train-thread"]
WORLD = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kb(pid, field):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_mode(mode, mb, disk):
    work = tempfile.mkdtemp(prefix="dcp-", dir=disk)
    cluster = None
    try:
        # One intra-op thread per rank, as torchrun sets for several ranks per host.
        extra, env = [], dict(os.environ, OMP_NUM_THREADS="1")
        if mode.endswith("tessera"):
            root = os.path.join(work, "root")
            cluster = LocalCluster(workers=WORLD, dir=tempfile.mkdtemp(prefix="bench-dcp-",
                                                                      dir="/dev/shm"),
                                   checkpoint_root=root, heartbeat_ms=500, lease_ms=5000,
                                   copy_threads=2)
            cluster.client().register_mesh("bench", {"rank": WORLD}, workers=cluster.worker_ids)
            env["BENCH_DCP_ROOT"] = root
            worker_rss = [status_kb(p.pid, "VmRSS") for p in cluster.workers]
        port = free_port()
        procs = []
        for r in range(WORLD):
            if cluster is not None:
                extra = [cluster.worker_urls[r], "bench"]
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "dcp_rank.py"), str(r), str(WORLD), str(port),
                 mode, str(mb), work] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=env))
        ranks = []
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise RuntimeError("%s rank %d failed:\n%s" % (mode, r, err[-3000:]))
            ranks.append(json.loads(out.strip().splitlines()[-1]))
        row = {"mode": mode, "ranks": ranks}
        if cluster is not None:
            row["workers_added_kb"] = sum(
                max(0, status_kb(p.pid, "VmHWM") - rss) for p, rss in zip(cluster.workers, worker_rss))
        return row
    finally:
        if cluster is not None:
            shutil.rmtree(cluster.dir, ignore_errors=True)
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def per_round(row, key, agg=max):
    """The value of `key` per measured round, the slowest rank's (agg over ranks)."""
    lists = [r[key] for r in row["ranks"]]
    return [agg(vals) for vals in zip(*lists)]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def added_gb(row):
    kb = sum(max(0, r["hwm_kb"] - r["rss_before_kb"]) + r.get("children_hwm_kb", 0)
             for r in row["ranks"]) + row.get("workers_added_kb", 0)
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
        put("mem-tessera", med([added_gb(r) for r in by["async-tessera"]]))
        put("mem-thread", added_gb(by["async-thread"][0]))
        put("mem-process", added_gb(by["async-process"][0]))
        for t in ("none", "tessera", "thread"):
            put("train-" + t, min(r["steps_per_s"] for r in by["train-" + t][0]["ranks"]))
    return out


def spread(xs, fmt):
    return "%s (%s–%s)" % (fmt % med(xs), fmt % min(xs), fmt % max(xs))


def markdown(s, mb, runs):
    gib = WORLD * mb / 1024

    def ratio(a, b):
        return [x / y for x, y in zip(s[a], s[b])]

    def verdict(xs, goal, higher):
        ok = all(x >= goal for x in xs) if higher else all(x <= goal for x in xs)
        near = any(abs(x - goal) / goal < 0.1 for x in xs)
        return ("met" if ok else "not met") + (" (near the threshold)" if near else "")

    ms = "%.0f ms"
    lines = [
        "## PyTorch DCP: tessera.dcp against DCP's own writer, reader and stagers",
        "",
        "`bench/dcp.py` (`bash bench/run.sh`, or `.venv/bin/python bench/dcp.py`): %d ranks "
        "(gloo) × %d MiB of float32 (%.0f GiB in all, 16 `Shard(0)` DTensors per rank) on "
        "this 2-vCPU VM, torch %s; each mode a fresh set of processes (ours: a fresh tesserad "
        "and 4 workers, shared memory in /dev/shm, the root on the same disk as DCP's "
        "files); %d runs, modes alternating ours and the peer's. Times are the slowest "
        "rank's, median over the saves of a run after the first; medians over runs, the "
        "runs' values in brackets." % (WORLD, mb, gib, _torch_version(), runs),
        "",
        "| measure | ours | peer | ratio | goal | verdict |",
        "|---|---:|---:|---:|---|---|",
    ]
    r1 = ratio("blocked-tessera", "memcpy")
    lines.append("| `async_save` blocked time vs a memcpy of each rank's state | %s | memcpy %s | "
                 "%s | ≤ 1.5× memcpy | %s |" % (
                     spread([x * 1e3 for x in s["blocked-tessera"]], ms),
                     spread([x * 1e3 for x in s["memcpy"]], ms), spread(r1, "%.2f×"),
                     verdict(r1, 1.5, False)))
    for peer, name in (("thread", "`THREAD`"), ("process", "`PROCESS`")):
        r = ratio("blocked-" + peer, "blocked-tessera")
        lines.append("| `async_save` blocked time vs DCP %s (default stager) | %s | %s | %s "
                     "faster | — | context |" % (
                         name, spread([x * 1e3 for x in s["blocked-tessera"]], ms),
                         spread([x * 1e3 for x in s["blocked-" + peer]], ms),
                         spread(r, "%.2f×")))
    r2 = ratio("save-fs", "save-tessera")
    lines.append("| save to durable (`dcp.save`: ours committed, `FileSystemWriter` fsync'd) | "
                 "%s | %s | %s faster | ≥ 1.5× | %s |" % (
                     spread([x * 1e3 for x in s["save-tessera"]], ms),
                     spread([x * 1e3 for x in s["save-fs"]], ms), spread(r2, "%.2f×"),
                     verdict(r2, 1.5, True)))
    r3 = ratio("load-fs", "load-tessera")
    lines.append("| load, files dropped from the page cache (`dcp.load`) | %s | %s | %s faster "
                 "| ≥ 1.0× | %s |" % (
                     spread([x * 1e3 for x in s["load-tessera"]], ms),
                     spread([x * 1e3 for x in s["load-fs"]], ms), spread(r3, "%.2f×"),
                     verdict(r3, 1.0, True)))
    r4 = ratio("mem-tessera", "mem-process")
    lines.append("| host memory added by an async save (ranks' and workers' or daemons' VmHWM "
                 "over their RSS before, summed), GiB | %s | `PROCESS` %s | %s of DCP's | ≤ 0.5× "
                 "| %s |" % (spread(s["mem-tessera"], "%.2f"), spread(s["mem-process"], "%.2f"),
                             spread(r4, "%.2f×"), verdict(r4, 0.5, False)))
    lines.append("| host memory added, DCP `THREAD`, GiB | — | %s | — | — | context |"
                 % spread(s["mem-thread"], "%.2f"))
    for t, name in (("tessera", "ours"), ("thread", "DCP `THREAD`")):
        r = ratio("train-" + t, "train-none")
        lines.append("| training loop, `async_save` every 5 steps (%s) against none, steps/s | "
                     "%s | none %s | %s of none | report | — |" % (
                         name, spread(s["train-" + t], "%.1f"), spread(s["train-none"], "%.1f"),
                         spread(r, "%.2f×")))
    lines += [
        "",
        "- `durable` of an `async_save` (until its future is done): ours %s, DCP `THREAD` %s."
        % (spread([x * 1e3 for x in s["durable-async-tessera"]], ms),
           spread([x * 1e3 for x in s["durable-async-thread"]], ms)),
        "- A memcpy into buffers allocated once: %s; into fresh ones (what a stager that "
        "allocates pays): %s." % (spread([x * 1e3 for x in s["memcpy"]], ms),
                                  spread([x * 1e3 for x in s["fresh"]], ms)),
        "",
    ]
    return "\n".join(lines)


def _torch_version():
    import torch  # noqa: PLC0415
    return torch.__version__.split("+")[0]


def write_section(path, text):
    title = text.splitlines()[0]
    old = open(path).read() if os.path.exists(path) else ""
    start = old.find(title.split(":")[0])
    if start >= 0:
        end = old.find("\n## ", start + 1)
        old = old[:start] + old[end + 1:] if end >= 0 else old[:start]
    with open(path, "w") as f:
        f.write(old.rstrip("\n") + "\n\n" + text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--dir", default=os.path.join(HERE, "out"))
    ap.add_argument("--out", default=os.path.join(HERE, "out", "dcp.jsonl"))
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rows = []
    with open(args.out, "w") as out:
        for run in range(args.runs):
            for mode in MODES:
                print("bench/dcp.py: run %d %s" % (run + 1, mode), flush=True)
                row = run_mode(mode, args.mb, args.dir)
                row["run"] = run
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
    text = markdown(summarize(rows), args.mb, args.runs)
    print(text)
    write_section(args.results, text)


if __name__ == "__main__":
    main()
