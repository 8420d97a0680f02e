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


def tiny_saves(root, scratch, workers):
    """The tiny-save rows of one worker count; a failed run is a row saying why."""
    exe = os.path.join(root, "build", "bin", "tessera_bench_cluster")
    out = subprocess.run([exe, "--only-control-plane", "--tiny", str(workers), "--dir", scratch],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=3600)
    rows = [json.loads(line) for line in out.stdout.decode().splitlines()
            if line.startswith("{") and '"tiny_save"' in line]
    if out.returncode != 0 or not rows:
        return [{"bench": "tiny_save", "workers": workers, "failed": True,
                 "error": out.stderr.decode()[-500:].strip()}]
    return rows


def in_loop(root, scratch, size_mb, saves, trainers):
    path = os.path.join(scratch, "stall.jsonl")
    env = dict(os.environ, TESSERA_BIN=os.path.join(root, "build", "bin"))
    subprocess.run(["/usr/bin/python3", os.path.join(root, "bench", "trainer_stall.py"),
                    "--sizes-mb", str(size_mb), "--saves", str(saves), "--trainers",
                    str(trainers), "--out", path], check=True, env=env,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=3600)
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if "save_ms" in r]


def spread(xs, fmt="%.1f"):
    return (fmt + " (" + fmt + "–" + fmt + ")") % (statistics.median(xs), min(xs), max(xs))


def ratio(after, before):
    return "%.2f×" % (statistics.median(after) / statistics.median(before))


def markdown(rows, args):
    w = []
    w.append("Builds: before `%s`, after `%s`; %d run(s) each, alternating. Medians over runs, "
             "with the range of the runs' values in brackets; ratio = after / before." % (
                 args.before_rev, args.after_rev, args.runs))
    w.append("")
    w.append("| workers | kind | before p50 ms | after p50 ms | after/before | "
             "before tesserad CPU ms/save | after tesserad CPU ms/save | goal | verdict |")
    w.append("|---:|---|---:|---:|---:|---:|---:|---|---|")
    tiny = [r for r in rows if r["bench"] == "tiny_save" and not r.get("failed")]
    failures = [r for r in rows if r["bench"] == "tiny_save" and r.get("failed")]
    goals = {32: 50.0, 256: 250.0}
    for n in sorted({r["workers"] for r in tiny}):
        b = [r for r in tiny if r["workers"] == n and r["build"] == "before"]
        a = [r for r in tiny if r["workers"] == n and r["build"] == "after"]
        if not a or not b:
            continue
        kind = (a or b)[0]["kind"]
        bp = [r["p50_ms"] for r in b]
        ap = [r["p50_ms"] for r in a]
        goal, verdict = "", ""
        if n in goals:
            goal = "≤ %g ms" % goals[n]
            verdict = "met" if statistics.median(ap) <= goals[n] else "**not met**"
        w.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            n, kind, spread(bp), spread(ap), ratio(ap, bp),
            spread([r["server_cpu_ms_per_save"] for r in b]),
            spread([r["server_cpu_ms_per_save"] for r in a]), goal, verdict))
    for f in failures:
        w.append("")
        w.append("- %s build, run %d, %d workers: the run failed: %s" % (
            f["build"], f["run"], f["workers"], f["error"].splitlines()[-1] if f["error"] else "?"))
    a1024 = [r["p50_ms"] for r in tiny if r["workers"] == 1024 and r["build"] == "after"]
    a256 = [r["p50_ms"] for r in tiny if r["workers"] == 256 and r["build"] == "after"]
    if a1024 and a256:
        growth = statistics.median(a1024) / statistics.median(a256)
        w.append("")
        w.append("From 256 to 1024 workers (4×) the after build's p50 grows %.2f×: %s "
                 "(goal: no faster than linearly)." % (
                     growth, "met" if growth <= 4.0 else "**not met**"))
    loop = [r for r in rows if r["bench"] == "in_loop"]
    if loop:
        w.append("")
        w.append("In-loop saves, %d trainers × %g MiB, %d saves per run after a warm-up "
                 "(every trainer's saves pooled):" % (args.trainers, args.stall_mb, args.saves))
        w.append("")
        w.append("| measure | before p50 ms | after p50 ms | after/before | before p90 | after p90 |")
        w.append("|---|---:|---:|---:|---:|---:|")
        for key, label in (("save_ms", "stall: save() returns"),
                           ("snapshot_ms", "worker's snapshot"),
                           ("commit_ms", "save() → commit seen by the trainer")):
            b = [r[key] for r in loop if r["build"] == "before"]
            a = [r[key] for r in loop if r["build"] == "after"]
            if not a or not b:
                continue
            q = lambda xs: sorted(xs)[int(0.9 * (len(xs) - 1))]  # noqa: E731
            w.append("| %s | %.1f | %.1f | %s | %.1f | %.1f |" % (
                label, statistics.median(b), statistics.median(a), ratio(a, b), q(b), q(a)))
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
                        for r in tiny_saves(root, scratch, n):
                            keep(dict(r, build=build, run=run))
                            print(json.dumps(rows[-1])[:200], file=sys.stderr)
                if not args.skip_in_loop:
                    for r in in_loop(root, scratch, args.stall_mb, args.saves, args.trainers):
                        keep(dict(r, bench="in_loop", build=build, run=run))
                    print("in-loop %s run %d done" % (build, run), file=sys.stderr)
    text = markdown(rows, args)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
