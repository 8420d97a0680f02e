"""tessera.jax against Orbax's CheckpointManager (async, its default format) on the same
state and disk, in the same run (issue 52's measures):

    .venv/bin/python bench/jax_orbax.py [--runs 2] [--dir DIR] [--out-dir bench/out]

4 JAX processes x 2 CPU devices (an 8-device mesh, data x model), 1 GiB of float32 and
bfloat16 in all; each mode a fresh set of processes (ours: a fresh tesserad and 4
workers of 2 devices, shared memory in /dev/shm, the root on DIR's disk). Then a restore
onto 2 processes and a 2 x 2 mesh with other shardings, ours and Orbax's. Writes the
"JAX and Orbax" section of bench/RESULTS.md.
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

MODES = ["save-tessera", "save-orbax", "restore-tessera", "restore-orbax", "reshard-tessera",
         "reshard-orbax", "multihost-tessera"]



def run_procs(mode, nproc, work, cluster, mesh, env):
    port = free_port()
    procs = []
    for p in range(nproc):
        extra = [cluster.worker_urls[p], mesh] if cluster is not None else []
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "jax_orbax_rank.py"), str(p), str(nproc),
             str(port), mode, work] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env))
    return collect(procs, mode + " process")


def run_mode(mode, disk):
    work = tempfile.mkdtemp(prefix="jax-", dir=disk)
    cluster, worker_rss = None, None
    env = dict(os.environ, OMP_NUM_THREADS="1", JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2")
    try:
        if "tessera" in mode:
            cluster, root = start_cluster(work, "bench-jax-", devices_per_worker=2)
            client = cluster.client()
            client.register_mesh("bench", {"data": 4, "model": 2}, devices_per_worker=2,
                                 workers=cluster.worker_ids)
            client.register_mesh("bench2", {"data": 2, "model": 2}, devices_per_worker=2,
                                 workers=cluster.worker_ids[:2])
            env.update(BENCH_ROOT=root, BENCH_FROM_MESH="bench")
            worker_rss = workers_rss(cluster)
        if mode.startswith("reshard"):
            run_procs(mode.replace("reshard", "reshard-save"), 4, work, cluster, "bench", env)
            procs = run_procs(mode, 2, work, cluster, "bench2", env)
        else:
            procs = run_procs(mode, 4, work, cluster, "bench", env)
        return mode_row(mode, "procs", procs, cluster, worker_rss)
    finally:
        clean_up(cluster, work)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--dir", default=os.path.join(HERE, "out"))
    ap.add_argument("--out-dir", default=os.path.join(HERE, "out"))
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    import jax  # noqa: PLC0415
    import orbax.checkpoint as ocp  # noqa: PLC0415
    versions = {"jax": jax.__version__, "orbax": getattr(ocp, "__version__", "?")}
    with open(os.path.join(args.out_dir, "jax_orbax.jsonl"), "w") as out:
        for run in range(args.runs):
            for mode in args.modes.split(","):
                print("bench/jax_orbax.py: run %d %s" % (run + 1, mode), flush=True)
                row = run_mode(mode, args.dir)
                row.update(run=run, **versions)
                out.write(json.dumps(row) + "\n")
                out.flush()
    if args.results:
        import report  # noqa: PLC0415 - bench/, beside this script
        report.rewrite_section(args.results, "jax", args.out_dir)
        print("bench/jax_orbax.py: wrote the \"JAX and Orbax\" section of %s" % args.results)


if __name__ == "__main__":
    main()
