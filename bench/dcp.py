"""PyTorch Distributed Checkpoint through tessera.dcp against DCP's own FileSystemWriter,
FileSystemReader and async stagers, in the same run (issue 51's measures):

    .venv/bin/python bench/dcp.py [--mb 256] [--runs 2] [--dir DIR] [--out-dir bench/out]

4 ranks (gloo), each with mb MiB of float32 (16 DTensors, Shard(0)), each run a fresh
set of processes per mode (bench/dcp_rank.py); ours with a fresh tesserad and 4 workers
(shared memory in /dev/shm, the checkpoint root on DIR's disk). Modes alternate ours and
the peer's. Writes the "PyTorch DCP" section of bench/RESULTS.md.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

from fresh_cluster import (clean_up, collect, free_port, start_cluster,  # noqa: E402
                           mode_row, workers_rss)

MODES = ["memcpy", "async-tessera", "async-thread", "async-tessera", "async-process",
         "save-tessera", "save-fs", "load-tessera", "load-fs", "load-tessera-raw",
         "train-none", "train-tessera", "train-thread"]
WORLD = 4



def run_mode(mode, mb, disk):
    work = tempfile.mkdtemp(prefix="dcp-", dir=disk)
    cluster, worker_rss = None, None
    try:
        # One intra-op thread per rank, as torchrun sets for several ranks per host.
        extra, env = [], dict(os.environ, OMP_NUM_THREADS="1")
        if "tessera" in mode:
            cluster, root = start_cluster(work, "bench-dcp-")
            cluster.client().register_mesh("bench", {"rank": WORLD}, workers=cluster.worker_ids)
            env["BENCH_DCP_ROOT"] = root
            worker_rss = workers_rss(cluster)
        port = free_port()
        procs = []
        for r in range(WORLD):
            if cluster is not None:
                extra = [cluster.worker_urls[r], "bench"]
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "dcp_rank.py"), str(r), str(WORLD), str(port),
                 mode, str(mb), work] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=env))
        ranks = collect(procs, mode + " rank")
        return mode_row(mode, "ranks", ranks, cluster, worker_rss)
    finally:
        clean_up(cluster, work)


def _torch_version():
    import torch  # noqa: PLC0415
    return torch.__version__.split("+")[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--dir", default=os.path.join(HERE, "out"))
    ap.add_argument("--out-dir", default=os.path.join(HERE, "out"),
                    help="where dcp.jsonl goes (bench/report.py reads it from there)")
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated subset of the modes, for a quick look at one measure")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    version = _torch_version()
    with open(os.path.join(args.out_dir, "dcp.jsonl"), "w") as out:
        for run in range(args.runs):
            for mode in args.modes.split(","):
                print("bench/dcp.py: run %d %s" % (run + 1, mode), flush=True)
                row = run_mode(mode, args.mb, args.dir)
                row.update(run=run, mb=args.mb, torch=version)
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
    if args.results:  # bench/run.sh passes "": its bench/report.py writes the whole file
        import report  # noqa: PLC0415 - bench/, beside this script
        report.rewrite_section(args.results, "dcp", args.out_dir)
        print("bench/dcp.py: wrote the \"PyTorch DCP\" section of %s" % args.results)


if __name__ == "__main__":
    main()
