"""Starts tesserad, 4 workers and 4 trainers (train.py) on this machine.

    .venv/bin/python examples/python/run.py --steps 30 --save-every 5 --log-dir /tmp/train-logs

tesserad and tessera-worker come from TESSERA_BIN, else build/bin. Run it again
with --dir DIR to keep the cluster's state between runs: the trainers then
resume from the latest checkpoint.
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tessera.local import LocalCluster  # noqa: E402

TRAIN = os.path.join(HERE, "train.py")


def start_trainers(cluster, mesh, log_dir, world=4, extra=None, env=None):
    """One train.py per worker; extra: {rank: [more args]}. Returns the Popen list."""
    procs = []
    for rank in range(world):
        argv = [sys.executable, TRAIN, "--rank", str(rank), "--world", str(world),
                "--mesh", mesh, "--log-dir", log_dir] + list((extra or {}).get(rank, []))
        e = dict(os.environ, **(env or {}), TESSERA_WORKER=cluster.worker_urls[rank],
                 RANK=str(rank), WORLD_SIZE=str(world), PYTHONHASHSEED="0")
        out = open(os.path.join(log_dir, "rank-%d.out" % rank), "ab")
        procs.append(subprocess.Popen(argv, env=e, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL))
        out.close()
    return procs


def wait_all(procs, timeout):
    """Exit codes, killing whatever is still running after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


def register(cluster, mesh, world=4):
    cluster.client().register_mesh(mesh, {"data": world}, workers=cluster.worker_ids[:world])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mesh", default="train")
    p.add_argument("--log-dir", default="train-logs")
    p.add_argument("--dir", default=None, help="cluster state (default: a temporary dir)")
    p.add_argument("--timeout", type=float, default=300, help="seconds for the whole run")
    args, train_args = p.parse_known_args()
    os.makedirs(args.log_dir, exist_ok=True)
    with LocalCluster(workers=4, dir=args.dir) as cluster:
        print("tesserad at %s, token %s" % (cluster.server, cluster.token))
        register(cluster, args.mesh)
        procs = start_trainers(cluster, args.mesh, args.log_dir,
                               extra={r: train_args for r in range(4)})
        codes = wait_all(procs, args.timeout)
        client = cluster.client()
        for c in client.checkpoints(args.mesh):
            print("checkpoint step %d: %s, %d bytes" % (c["step"], c["state"],
                                                       c.get("logical_bytes", 0)))
        print("trainers exited with %s; losses in %s/rank-*.log" % (codes, args.log_dir))
        return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
