"""Starts tesserad and 4 workers on this machine, then ddp_train.py as 4 ranks, the
way torchrun would: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, and when one
rank dies the others are stopped too (a DDP rank cannot go on without its peers).

    .venv/bin/python examples/python/ddp_run.py --log-dir /tmp/gpt-logs --steps 20
    .venv/bin/python examples/python/ddp_run.py --log-dir /tmp/gpt-logs --die 2:13   # rank 2 dies
                                                                            # after step 13
With --restarts N, a run that lost a rank is started again, up to N times; the
ranks resume from the step their workers agree on.
"""

import argparse
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tessera.local import LocalCluster  # noqa: E402

TRAIN = os.path.join(HERE, "ddp_train.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(cluster, mesh, log_dir, world=4, extra=None):
    """One ddp_train.py per worker; extra: {rank: [more args]}."""
    port = free_port()
    procs = []
    for rank in range(world):
        argv = [sys.executable, TRAIN, "--mesh", mesh, "--log-dir", log_dir]
        argv += list((extra or {}).get(rank, []))
        env = dict(os.environ, TESSERA_WORKER=cluster.worker_urls[rank], RANK=str(rank),
                   WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONHASHSEED="0")
        with open(os.path.join(log_dir, "rank-%d.out" % rank), "ab") as out:
            procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))
    return procs


def supervise(procs, timeout):
    """Waits for every rank; once one fails, stops the others (SIGTERM, then SIGKILL)
    as torchrun does. Returns the exit codes."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        failed = any(p.poll() not in (None, 0) for p in procs)
        if failed or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            break
        time.sleep(0.05)
    return [p.returncode for p in procs]


def register(cluster, mesh, world=4):
    cluster.client().register_mesh(mesh, {"data": world}, workers=cluster.worker_ids[:world])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mesh", default="gpt")
    p.add_argument("--log-dir", default="gpt-logs")
    p.add_argument("--dir", default=None, help="cluster state (default: a temporary dir)")
    p.add_argument("--timeout", type=float, default=300, help="seconds for each run")
    p.add_argument("--die", default=None, metavar="RANK:STEP",
                   help="SIGKILL rank RANK after its training step STEP (first run only)")
    p.add_argument("--restarts", type=int, default=1)
    args, train_args = p.parse_known_args()
    os.makedirs(args.log_dir, exist_ok=True)
    with LocalCluster(workers=4, dir=args.dir) as cluster:
        register(cluster, args.mesh)
        extra = {r: list(train_args) for r in range(4)}
        if args.die:
            rank, step = (int(v) for v in args.die.split(":"))
            extra[rank] += ["--die-at-step", str(step)]
        for attempt in range(args.restarts + 1):
            codes = supervise(start_ranks(cluster, args.mesh, args.log_dir, extra=extra),
                              args.timeout)
            print("run %d: ranks exited with %s" % (attempt, codes))
            if all(c == 0 for c in codes):
                break
            extra = {r: list(train_args) for r in range(4)}
        for c in cluster.client().checkpoints(args.mesh):
            print("checkpoint step %d: %s" % (c["step"], c["state"]))
        print("losses and state hashes in %s/rank-*.log" % args.log_dir)
        return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
