#!/usr/bin/python3
"""The trainer's stall in an in-loop save, as a PyTorch trainer meets it.

tesserad and 4 workers on this machine (tessera.local.LocalCluster), and 4 trainer
processes on mesh {data: 4}, each with a model of STATE bytes (float32, in 8
tensors) attached with attach_state_dict (--trainers changes the 4). For every size, each trainer runs
--saves saves; before each one the trainers meet at a barrier and the previous
save has committed, so every save() starts from the same quiet state. Per save it
records the wall time of save() in the trainer and the worker's snapshot_ms (the
difference is what the HTTP round trip and the client add), and the time from the
save() call until handle.wait() returns, the commit as the trainer learns of it. As context, rank 0
also times torch.save of the same state_dict to a file in the same directory
(no fsync), the way a hand-rolled checkpoint stalls a loop.

    /usr/bin/python3 bench/trainer_stall.py --out bench/out/trainer_stall.jsonl
    /usr/bin/python3 bench/trainer_stall.py --sizes-mb 1,40 --saves 20

Options that bench/control_plane.py uses to compare two builds:
  --late-ms N   the last rank calls save() N ms after the others: its rows say how long
                the commit came after its own snapshot ("after_snapshot_ms")
  --idle-s S    after the timed saves, --idle-saves more, each S seconds after the one
                before (rows with "idle_s"): the stall of a save a minute after the last
Per size, one more line counts the workers' requests to tesserad over all its saves
({"bench": "requests", "per_worker_save", "by_route"}, from tesserad's /metrics; the
heartbeats, the trainers' barriers and the mesh's registration left out).

TESSERA_BIN (default build/bin) names the directory of tesserad and tessera-worker, and
TESSERA_PYTHON (default python/ beside this script) the client the trainers import.
Each line of --out is one trainer's save: {"size_mb", "rank", "save", "save_ms",
"snapshot_ms", "overhead_ms", "commit_ms", "after_snapshot_ms", "trainers"}, or
{"size_mb", "torch_save_ms"} for the peer.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from request_counts import request_counts

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("TESSERA_PYTHON", os.path.join(HERE, "..", "python"))
sys.path.insert(0, PYTHON)

TRAINER = r"""
import json, os, sys, time
import torch
import tessera

mesh, size_mb, saves, out_dir = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
late_ms, idle_s, idle_saves = float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD"])
torch.set_num_threads(1)
n = int(size_mb * (1 << 20) / 4 / 8)
model = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(n)) for _ in range(8))
rows = []
with tessera.CheckpointManager(mesh, timeout=120) as ck:
    ck.attach_state_dict({"model": model})
    for i in range(saves + 1 + idle_saves):  # save 0 warms up
        idle = i > saves
        if idle:
            time.sleep(idle_s)
        ck.barrier("s%d" % i, timeout_ms=int(120000 + idle_s * 1000))
        if rank == world - 1 and late_ms > 0 and not idle:
            time.sleep(late_ms / 1000)
        t0 = time.perf_counter()
        h = ck.save(i + 1)
        save_ms = (time.perf_counter() - t0) * 1000
        h.wait(timeout=120)
        commit_ms = (time.perf_counter() - t0) * 1000
        if i:
            row = {"size_mb": size_mb, "rank": rank, "save": i, "save_ms": save_ms,
                   "snapshot_ms": h.snapshot_ms, "overhead_ms": save_ms - h.snapshot_ms,
                   "commit_ms": commit_ms, "after_snapshot_ms": commit_ms - save_ms,
                   "late": rank == world - 1 and late_ms > 0 and not idle}
            if idle:
                row["idle_s"] = idle_s
            rows.append(row)
    if rank == 0:
        path = os.path.join(out_dir, "torch-%d.pt" % os.getpid())
        for i in range(saves):
            t0 = time.perf_counter()
            torch.save(model.state_dict(), path)
            rows.append({"size_mb": size_mb, "torch_save_ms": (time.perf_counter() - t0) * 1000})
        os.unlink(path)
print(json.dumps(rows))
"""


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def worker_requests(cluster):
    """'METHOD route' → requests tesserad answered, the workers' alone (see the doc)."""
    return request_counts(cluster, lambda method, route: "heartbeat" in route or "barrier" in route)


def measure(cluster, size_mb, saves, scratch, trainers, late_ms=0, idle_s=0, idle_saves=0):
    mesh = "stall-%g-%d" % (size_mb, trainers)
    cluster.client().register_mesh(mesh, {"data": trainers},
                                   workers=cluster.worker_ids[:trainers])
    env = dict(os.environ, PYTHONPATH=PYTHON)
    before = worker_requests(cluster)
    procs = [subprocess.Popen([sys.executable, "-c", TRAINER, mesh, str(size_mb), str(saves),
                               scratch, str(late_ms), str(idle_s), str(idle_saves)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(env, RANK=str(r), WORLD=str(trainers),
                                       TESSERA_WORKER=cluster.worker_urls[r]))
             for r in range(trainers)]
    rows = []
    for p in procs:
        out, err = p.communicate(timeout=600 + idle_s * idle_saves)
        if p.returncode != 0:
            raise SystemExit("a trainer failed (%s): %s" % (p.returncode, err.decode()[-2000:]))
        rows += json.loads(out.decode().strip().splitlines()[-1])
    after = worker_requests(cluster)
    by_route = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    all_saves = saves + 1 + idle_saves
    for r in rows:
        r["trainers"] = trainers
        r["late_ms"] = late_ms
    rows.append({"bench": "requests", "size_mb": size_mb, "trainers": trainers,
                 "saves": all_saves, "late_ms": late_ms,
                 "per_worker_save": sum(by_route.values()) / (trainers * all_saves),
                 "by_route": by_route})
    return rows


def summary(rows):
    lines = ["| state per trainer | save() p50 / p90 ms | snapshot_ms p50 / p90 | "
             "save() − snapshot_ms p50 / p90 / max | save() → commit p50 / p90 ms | "
             "torch.save on rank 0 p50 ms |",
             "|---|---|---|---|---|---|"]
    for size in sorted({r["size_mb"] for r in rows}):
        ours = [r for r in rows if r["size_mb"] == size and "save_ms" in r
                and "idle_s" not in r]
        peer = [r["torch_save_ms"] for r in rows if r["size_mb"] == size and "torch_save_ms" in r]
        s = [r["save_ms"] for r in ours]
        snap = [r["snapshot_ms"] for r in ours]
        over = [r["overhead_ms"] for r in ours]
        commit = [r["commit_ms"] for r in ours]
        lines.append("| %g MB | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f / %.2f | %.1f / %.1f | %.1f |" % (
            size, pct(s, .5), pct(s, .9), pct(snap, .5), pct(snap, .9), pct(over, .5),
            pct(over, .9), max(over), pct(commit, .5), pct(commit, .9), statistics.median(peer)))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes-mb", default="1,40")
    p.add_argument("--saves", type=int, default=20)
    p.add_argument("--trainers", type=int, default=4, help="trainer processes (and workers)")
    p.add_argument("--out", default=None, help="JSON lines of every save (default: none)")
    p.add_argument("--late-ms", type=float, default=0,
                   help="the last rank calls save() this much after the others")
    p.add_argument("--idle-s", type=float, default=65, help="the pause before each idle save")
    p.add_argument("--idle-saves", type=int, default=0,
                   help="saves after the timed ones, each --idle-s after the one before")
    a = p.parse_args()
    from tessera.local import LocalCluster  # noqa: PLC0415 - after sys.path
    rows = []
    with tempfile.TemporaryDirectory(prefix="tessera-stall-") as scratch, \
            LocalCluster(workers=a.trainers, dir=os.path.join(scratch, "cluster")) as cluster:
        for size in (float(s) for s in a.sizes_mb.split(",")):
            rows += measure(cluster, size, a.saves, scratch, a.trainers, a.late_ms, a.idle_s,
                            a.idle_saves)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(summary(rows))


if __name__ == "__main__":
    main()
