#!/usr/bin/python3
"""The control plane, before and after a change, measured in one run.

Two builds of Tessera (each a checkout with its build/bin: tesserad, tessera-worker,
tessera_bench_cluster) take turns, --runs times each, on this machine:

  tiny saves   tessera_bench_cluster --only-control-plane: the save latency of a
               4 KiB-per-worker state, REST call to commit, against real worker
               processes (4, 16, 32) and in-process agents (64, 256, 1024), with
               tesserad's CPU time per save
  in-loop      bench/trainer_stall.py of each checkout: 4 trainers × 256 MiB
               (--stall-mb), their stall in save() and the time from save() to
               the commit as the trainer learns of it

    /usr/bin/python3 bench/control_plane.py --before /work/baseline --after .
    /usr/bin/python3 bench/control_plane.py --before OLD --after . --markdown bench/out/cp.md

Writes every measurement as JSON lines (--out) and a Markdown section (--markdown,
also printed): per configuration, each build's median over its runs, the spread
(min–max) and the ratio after/before.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def tiny_saves(root, scratch, workers, memory_env=False):
    """The tiny-save rows of one worker count; a failed run is a row saying why."""
    exe = os.path.join(root, "build", "bin", "tessera_bench_cluster")
    extra = ["--memory-env"] if memory_env else []
    out = subprocess.run([exe, "--only-control-plane", "--tiny", str(workers), "--dir", scratch]
                         + extra,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=3600)
    rows = [json.loads(line) for line in out.stdout.decode().splitlines()
            if line.startswith("{") and '"tiny_save"' in line]
    if out.returncode != 0 or not rows:
        return [{"bench": "tiny_save", "workers": workers, "failed": True,
                 "error": out.stderr.decode()[-500:].strip()}]
    return rows


def in_loop(root, scratch, size_mb, saves, trainers, late_ms=0, idle_saves=0, idle_s=65):
    """One trainer_stall.py run (this checkout's script) against the build at root."""
    path = os.path.join(scratch, "stall.jsonl")
    env = dict(os.environ, TESSERA_BIN=os.path.join(root, "build", "bin"),
               TESSERA_PYTHON=os.path.join(root, "python"))
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "trainer_stall.py"),
                    "--sizes-mb", str(size_mb), "--saves", str(saves), "--trainers",
                    str(trainers), "--late-ms", str(late_ms), "--idle-saves", str(idle_saves),
                    "--idle-s", str(idle_s), "--out", path], check=True, env=env,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   timeout=3600 + idle_s * idle_saves)
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if "save_ms" in r or r.get("bench") == "requests"]


def spread(xs, fmt="%.1f"):
    return (fmt + " (" + fmt + "–" + fmt + ")") % (statistics.median(xs), min(xs), max(xs))


def ratio(after, before):
    return "%.2f×" % (statistics.median(after) / statistics.median(before))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def tiny_markdown(rows, w):
    w.append("| workers | kind | agents' files | before p50 ms | after p50 ms | after/before | "
             "before tesserad CPU ms/save | after tesserad CPU ms/save | after CPU ms per "
             "worker·save | less idle, before: CPU ms per worker·save | less idle, after | "
             "after requests per worker·save | goals | verdict |")
    w.append("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    tiny = [r for r in rows if r["bench"] == "tiny_save" and not r.get("failed")]
    latency_goal = {32: 50.0, 256: 250.0, 1024: 1000.0}
    cpu_goal_workers = {32, 256, 1024}
    for n, env in sorted({(r["workers"], r.get("env", "disk")) for r in tiny}):
        pick = lambda build: [r for r in tiny if r["workers"] == n  # noqa: E731
                              and r.get("env", "disk") == env and r["build"] == build]
        b, a = pick("before"), pick("after")
        if not a:
            continue
        ap = [r["p50_ms"] for r in a]
        bp = [r["p50_ms"] for r in b]
        acpu = [r["server_cpu_ms_per_save"] for r in a]
        per_worker = [x / n for x in acpu]
        net = [r["server_net_cpu_ms_per_worker_save"] for r in a
               if "server_net_cpu_ms_per_worker_save" in r]
        bnet = [r["server_net_cpu_ms_per_worker_save"] for r in b
                if "server_net_cpu_ms_per_worker_save" in r]
        reqs = [r["requests_per_worker_save"] for r in a if "requests_per_worker_save" in r]
        goals, verdicts = [], []
        if n in latency_goal:
            goals.append("≤ %g ms" % latency_goal[n])
            verdicts.append("latency " + ("met" if med(ap) <= latency_goal[n] else "**not met**"))
        if n in cpu_goal_workers:
            goals.append("CPU ≤ 0.5 ms/worker")
            verdicts.append("CPU " + ("met" if med(per_worker) <= 0.5 else "**not met**"))
            if net:
                verdicts.append("CPU less idle " + ("met" if med(net) <= 0.5 else "**not met**"))
        w.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            n, a[0]["kind"], env, spread(bp) if bp else "—", spread(ap),
            ratio(ap, bp) if bp else "—",
            spread([r["server_cpu_ms_per_save"] for r in b]) if b else "—", spread(acpu),
            spread(per_worker, "%.2f"), spread(bnet, "%.2f") if bnet else "—",
            spread(net, "%.2f") if net else "—",
            spread(reqs, "%.2f") if reqs else "—",
            "; ".join(goals), "; ".join(verdicts)))
    for f in [r for r in rows if r["bench"] == "tiny_save" and r.get("failed")]:
        w.append("")
        w.append("- %s build, run %d, %d workers: the run failed: %s" % (
            f["build"], f["run"], f["workers"], f["error"].splitlines()[-1] if f["error"] else "?"))
    a1024 = [r["p50_ms"] for r in tiny if r["workers"] == 1024 and r["build"] == "after"
             and r.get("env", "disk") == "disk"]
    a256 = [r["p50_ms"] for r in tiny if r["workers"] == 256 and r["build"] == "after"
            and r.get("env", "disk") == "disk"]
    if a1024 and a256:
        growth = med(a1024) / med(a256)
        w.append("")
        w.append("From 256 to 1024 workers (4×) the after build's p50 grows %.2f× (files on disk)."
                 % growth)


def loop_markdown(rows, args, w):
    loop = [r for r in rows if r["bench"] == "in_loop"]
    if not loop:
        return
    q = lambda xs: sorted(xs)[int(0.9 * (len(xs) - 1))] if xs else float("nan")  # noqa: E731
    pick = lambda build, case, key, f=lambda r: True: [  # noqa: E731
        r[key] for r in loop if r["build"] == build and r.get("case", "punctual") == case and f(r)]
    w.append("")
    w.append("In-loop saves, %d trainers × %g MiB, %d saves per run after a warm-up "
             "(every trainer's saves pooled):" % (args.trainers, args.stall_mb, args.saves))
    w.append("")
    w.append("| measure | before p50 ms | after p50 ms | after/before | before p90 | after p90 | "
             "goal | verdict |")
    w.append("|---|---:|---:|---:|---:|---:|---|---|")
    for key, label, goal in (("save_ms", "stall: save() returns", None),
                             ("snapshot_ms", "worker's snapshot", None),
                             ("commit_ms", "save() → commit seen by the trainer", 0.8)):
        b, a = pick("before", "punctual", key), pick("after", "punctual", key)
        if not a or not b:
            continue
        verdict = ""
        if goal:
            verdict = "met" if med(a) / med(b) <= goal else "**not met**"
        w.append("| %s | %.1f | %.1f | %s | %.1f | %.1f | %s | %s |" % (
            label, med(b), med(a), ratio(a, b), q(b), q(a),
            "≤ %g×" % goal if goal else "", verdict))
    late = lambda r: r.get("late")  # noqa: E731
    for build in ("before", "after"):
        lat = pick(build, "late", "after_snapshot_ms", late)
        write = pick(build, "punctual", "after_snapshot_ms")
        if lat and write:
            w.append("| %s: late trainer (%g ms), its snapshot → commit; the punctual saves' "
                     "snapshot → commit (one write time) | %s | %s |  |  |  | ≤ one write time "
                     "(after) | %s |" % (
                         build, args.late_ms, "%.1f" % med(lat) if build == "before" else "",
                         "%.1f; %.1f" % (med(lat), med(write)) if build == "after" else "",
                         ("met" if med(lat) <= med(write) * 1.1 else "**not met**")
                         if build == "after" else "(%.1f; %.1f)" % (med(lat), med(write))))
    for build in ("before", "after"):
        idle = pick(build, "idle", "save_ms", lambda r: "idle_s" in r)
        busy = pick(build, "punctual", "save_ms")
        if idle and busy:
            w.append("| %s: stall of a save %g s after the last; back to back | %.1f; %.1f | | "
                     "%.2f× | | | equal | %s |" % (
                         build, args.idle_s, med(idle), med(busy), med(idle) / med(busy),
                         ("met" if med(idle) <= med(busy) * 1.25 else "**not met**")
                         if build == "after" else ""))
    reqs = [r for r in rows if r["bench"] == "requests" and r.get("case", "punctual") == "punctual"]
    if reqs:
        b = [r["per_worker_save"] for r in reqs if r["build"] == "before"]
        a = [r["per_worker_save"] for r in reqs if r["build"] == "after"]
        if a and b:
            w.append("| requests to tesserad per worker and save (not ms) | %.2f | %.2f | %s | | "
                     "| ≤ 2 | %s |" % (med(b), med(a), ratio(a, b),
                                       "met" if med(a) <= 2 else "**not met**"))
        for build in ("before", "after"):
            last = [r for r in reqs if r["build"] == build]
            if last:
                routes = ", ".join("%s %.2f" % (k, v / (last[-1]["trainers"] * last[-1]["saves"]))
                                   for k, v in sorted(last[-1]["by_route"].items()))
                w.append("")
                w.append("- %s, per worker and save, by route (last run): %s" % (build, routes))


def markdown(rows, args):
    w = []
    w.append("Builds: before `%s`, after `%s`; %d run(s) each, alternating. Medians over runs, "
             "with the range of the runs' values in brackets; ratio = after / before." % (
                 args.before_rev, args.after_rev, args.runs))
    w.append("")
    tiny_markdown(rows, w)
    loop_markdown(rows, args, w)
    return "\n".join(w) + "\n"


def rev(root):
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], check=True,
                              stdout=subprocess.PIPE).stdout.decode().strip()
    except (OSError, subprocess.CalledProcessError):
        return os.path.abspath(root)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="checkout of the build before (with build/bin)")
    p.add_argument("--after", default=os.path.join(HERE, ".."), help="checkout after (default: this)")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--stall-mb", type=float, default=256)
    p.add_argument("--saves", type=int, default=5)
    p.add_argument("--trainers", type=int, default=4)
    p.add_argument("--late-ms", type=float, default=500,
                   help="in the late case, the last trainer saves this much after the others")
    p.add_argument("--idle-saves", type=int, default=1,
                   help="saves, per run and build, a while (--idle-s) after the one before")
    p.add_argument("--idle-s", type=float, default=65)
    p.add_argument("--memory-env", action="store_true",
                   help="also the in-process agents with their shard files never synced "
                        "(both builds' tessera_bench_cluster must have --memory-env: build "
                        "this checkout's bench/ in the other checkout if it has not)")
    p.add_argument("--skip-tiny", action="store_true")
    p.add_argument("--skip-in-loop", action="store_true")
    p.add_argument("--tiny", default="4,16,32,64,256,1024", help="worker counts of the tiny saves")
    p.add_argument("--out", default=os.path.join(HERE, "out", "control_plane.jsonl"),
                   help="JSON lines of every measurement, appended as they come")
    p.add_argument("--markdown", default=None, help="write the Markdown section here too")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing: the Markdown of the rows already in --out")
    args = p.parse_args()
    args.before_rev, args.after_rev = rev(args.before), rev(args.after)
    rows = []
    if args.report_only:
        with open(args.out) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        args.runs = len({r["run"] for r in rows})
    else:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        open(args.out, "w").close()

    def keep(row):
        rows.append(row)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    for run in range(0 if args.report_only else args.runs):
        for build, root in (("before", args.before), ("after", args.after)):
            with tempfile.TemporaryDirectory(prefix="tessera-cp-") as scratch:
                if not args.skip_tiny:
                    for n in (int(x) for x in args.tiny.split(",")):
                        memory = args.memory_env and n > 32
                        for r in tiny_saves(root, scratch, n, memory):
                            keep(dict(r, build=build, run=run))
                            print(json.dumps(rows[-1])[:200], file=sys.stderr)
                if not args.skip_in_loop:
                    for case, late, idle in (("punctual", 0, 0), ("late", args.late_ms, 0),
                                             ("idle", 0, args.idle_saves)):
                        if case == "idle" and not idle:
                            continue
                        for r in in_loop(root, scratch, args.stall_mb, args.saves,
                                         args.trainers, late, idle, args.idle_s):
                            keep(dict(r, bench=r.get("bench", "in_loop"), case=case,
                                      build=build, run=run))
                        print("in-loop %s %s run %d done" % (case, build, run),
                              file=sys.stderr)
    text = markdown(rows, args)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
