#!/usr/bin/python3
"""The memory tier (docs/memory-tier.md), measured in one run against what it replaces.

Hosts are network namespaces on this machine (tests/multihost/hosts.py: each its own
address on a bridge, its own /tmp and /dev/shm): tesserad on host 0, one worker on
each of hosts 1-4 (--copy-threads 1), one trainer process per worker
(bench/memory_tier_trainer.py: tessera.CheckpointManager, MIB MiB of attach()ed
float32 state in 4 tensors sharded over the mesh {data: 4}). Needs root.

  stall     per mode (memory replica, memory parity g=4 (XOR) and parity2 (g=4,
            surviving 2 losses: Reed–Solomon), disk for reference): fresh
            workers, the trainers' memcpy of their state (np.copyto, warmed, all four
            at once as they save), then --steps saves (after one warm-up), each
            stamped into the state, save() timed, handle.wait() to the commit
            The trainers' and workers' CPU time over those saves (/proc), per GiB.
  memory    each worker's VmHWM, RssAnon and RssShmem (/proc/<pid>/status) after
            those saves, as a multiple of its state; replica_frozen: the same with a
            frozen base (20 tensors, 19 never written: 5 % of the state changes per step)
  loop      (replica, parity) rounds of --loop-steps steps of a loop whose step is 20×
            the state's memcpy of device time (a sleep: the host's CPUs free, as while
            an accelerator computes) then a write into every page of the state:
            without checkpoints, with a memory checkpoint after every step, and the
            same with save(background=True) (the snapshot taken during the next
            step's device time, the write waiting for it), alternating
  restart   the four trainers SIGKILLed and started again on live workers, attach,
            restore(): from the workers' RAM (memory modes) or the POSIX root (disk)
  host loss a worker and its trainer SIGKILLed, its host's /dev/shm emptied, a worker
            started under the same name, its trainer attaches, every trainer
            restore()s: from peers (replica, parity, parity2), the POSIX root (disk), and, on a
            cluster whose root is an S3 bucket of a Ceph RGW (tools/s3/rgw.sh), from S3.
            The page cache is dropped before each kill. Every restore is checked:
            its tier and source, and the bytes against the state saved.
  iperf3    TCP between two worker hosts, against the replica's rebuild rate
  training  examples/python/train.py's model and loop on the 4 hosts, rounds without
            checkpoints and with a memory checkpoint after every step, alternating
  tesserad  --control-workers (4,32,256) worker processes on 127.0.0.1 (LocalCluster,
            heartbeat 1 s), a tiny tensor each, memory checkpoints with force=True from
            one process's threads: requests to tesserad per checkpoint (its /metrics,
            heartbeats left out) and its CPU per checkpoint (/proc), less its idle CPU

    /usr/bin/python3 bench/memory_tier.py [--out bench/out/memory_tier.jsonl]
    /usr/bin/python3 bench/memory_tier.py --quick      # 16 MiB per trainer, fewer steps

TESSERA_BIN (default build/bin) names the directory of tesserad and tessera-worker.
Every measurement is a JSON line of --out (appended as it comes, "run" numbering the
invocation); bench/report.py's "The memory tier" section reads them
(`markdown(rows)` here, from bench/memory_tier_report.py).
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

import memory_tier_cluster
from memory_tier_cluster import HERE, REPO, WORKERS, Cluster, copy_logs, log
from memory_tier_measure import Bench
from memory_tier_report import markdown  # also bench/report.py's memory_tier.markdown


def measure(b):
    """The parts of the run (--parts), in order, on the namespace hosts and 127.0.0.1."""
    from hosts import Hosts, can_run  # noqa: PLC0415 - tests/multihost
    rev = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h", "--", "service",
                          "worker", "python", "api", "storage", "collectives", "http"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    b.emit(bench="meta", started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              product_commit=rev.stdout.strip() or None, cpus=os.cpu_count(),
              loadavg=os.getloadavg()[0])
    why = can_run()
    parts = set(b.a.parts.split(","))
    if why and parts & {"posix", "s3", "training"}:
        raise SystemExit("memory_tier.py: the namespace hosts cannot be made: %s" % why)
    logdir = tempfile.mkdtemp(prefix="tessera-membench-logs-", dir="/var/tmp")
    log("logs in", logdir)
    if parts & {"posix", "s3", "training", "iperf"}:
        with Hosts(WORKERS + 1) as hosts:
            root = os.path.join(hosts.shared, "checkpoints")
            if "iperf" in parts:
                b.iperf(hosts)
            if parts & {"posix", "training"}:
                cluster = Cluster(hosts, root, [], "posix", 7070)
                try:
                    if "posix" in parts:
                        for mode in b.a.modes.split(","):
                            log("POSIX root, mode", mode)
                            b.mode(cluster, mode, logdir, "posix")
                    if "training" in parts:
                        log("training loop")
                        b.training(cluster, logdir)
                finally:
                    cluster.stop()
                    copy_logs(hosts.dir, logdir)
            if "s3" in parts:
                log("S3 root")
                from rgw import Rgw  # noqa: PLC0415 - tools/s3
                os.environ.setdefault("TESSERA_RGW_STORE_BYTES",
                                      str(max(2 << 30, int(b.a.mib * (1 << 20)) * 16)))
                rgw = Rgw("tessera-membench", addr=hosts.net + ".1")
                try:
                    cluster = Cluster(hosts, "s3://tessera-membench/ckpt",
                                      ["--s3-endpoint", rgw.endpoint], "s3", 7080)
                    try:
                        b.mode(cluster, "disk", logdir, "s3")
                    finally:
                        cluster.stop()
                        copy_logs(hosts.dir, logdir)
                finally:
                    rgw.stop()
    if "control" in parts:
        for n in (int(x) for x in b.a.control_workers.split(",")):
            log("tesserad with %d workers" % n)
            try:
                b.control(n)
            except Exception as e:  # noqa: BLE001 - a size that does not fit is a result
                b.emit(bench="control", workers=n, failed=True, error=str(e)[-600:])
                log("%d workers failed: %s" % (n, e))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "out", "memory_tier.jsonl"))
    p.add_argument("--quick", action="store_true", help="16 MiB per trainer, fewer steps")
    p.add_argument("--mib", type=float, default=None, help="state per trainer (256; quick 16)")
    p.add_argument("--steps", type=int, default=None, help="timed memory saves per mode (12)")
    p.add_argument("--disk-steps", type=int, default=None, help="timed disk saves (3)")
    p.add_argument("--memcpy-reps", type=int, default=10)
    p.add_argument("--losses", type=int, default=None, help="host losses per case (2)")
    p.add_argument("--restarts", type=int, default=None, help="trainer restarts per mode (2)")
    p.add_argument("--iperf-s", type=int, default=5)
    p.add_argument("--train-steps", type=int, default=None, help="steps per round (300)")
    p.add_argument("--train-rounds", type=int, default=4, help="alternating none / memory")
    p.add_argument("--loop-steps", type=int, default=None, help="steps per loop round (20)")
    p.add_argument("--loop-rounds", type=int, default=2, help="rounds of each kind of loop")
    p.add_argument("--control-workers", default=None, help="worker counts (4,32,256)")
    p.add_argument("--control-saves", type=int, default=None,
                   help="checkpoints timed, at least (20)")
    p.add_argument("--control-s", type=float, default=None,
                   help="seconds of checkpoints timed, at least (10)")
    p.add_argument("--modes", default="replica,parity,parity2,disk,replica_keep1,replica_frozen")
    p.add_argument("--parts", default="iperf,posix,s3,training,control")
    p.add_argument("--run", type=int, default=None,
                   help="the run's number in --out (default: one more than the last there)")
    p.add_argument("--fresh", action="store_true", help="empty --out first")
    p.add_argument("--report", action="store_true", help="measure nothing: print the section")
    a = p.parse_args()
    memory_tier_cluster.load_client()
    q = a.quick
    for k, full, small in (("mib", 256, 16), ("steps", 12, 4), ("disk_steps", 3, 2),
                           ("losses", 2, 1), ("restarts", 2, 1), ("train_steps", 300, 50), ("loop_steps", 20, 5),
                           ("control_workers", "4,32,256", "4,32"), ("control_saves", 20, 5),
                           ("control_s", 10, 2)):
        if getattr(a, k) is None:
            setattr(a, k, small if q else full)
    if a.report:
        with open(a.out) as f:
            print("\n".join(markdown([json.loads(x) for x in f if x.strip()])))
        return
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    if a.fresh:
        open(a.out, "w").close()
    if a.run is None:
        last = 0
        if os.path.exists(a.out):
            with open(a.out) as f:
                last = max([json.loads(x).get("run", 0) for x in f if x.strip()] or [0])
        a.run = last + 1
    measure(Bench(a))


if __name__ == "__main__":
    main()
