#!/usr/bin/python3
"""tesserad's catalog rebuilt from the checkpoint root: how long a tesserad started
with an empty data dir takes to list N committed checkpoints it has never seen.

One real save (tesserad and one worker on this machine, tessera.local.LocalCluster;
mesh {data: 1} holding a 64 KiB tensor) makes step 1; its directory is then
hard-linked as steps 2..N. For each N of --counts, --runs times: a fresh data dir,
tesserad started on that root, and the time from its start until it answers the
list of the mesh's checkpoints with all N (it rebuilds before it listens). Goal:
10,000 checkpoints in at most 5 s on POSIX.

    /usr/bin/python3 bench/catalog_rebuild.py
    /usr/bin/python3 bench/catalog_rebuild.py --counts 1000,10000 --runs 3 --out bench/out/rebuild.jsonl

TESSERA_BIN (default build/bin) names the directory of tesserad and tessera-worker.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
GOAL_S = 5.0


def make_root(root):
    """Step 1 of mesh "m", saved for real into `root`."""
    import numpy as np  # noqa: PLC0415
    import tessera  # noqa: PLC0415
    from tessera.local import LocalCluster  # noqa: PLC0415

    with LocalCluster(workers=1, checkpoint_root=root) as cluster:
        client = cluster.client(timeout=120)
        client.register_mesh("m", {"data": 1}, workers=cluster.worker_ids[:1])
        with tessera.CheckpointManager("m", worker=cluster.worker_urls[0]) as ck:
            ck.attach("w", (16384,), "float32")[:] = np.arange(16384, dtype=np.float32)
            final = client.save("m", 1).wait(timeout=120)
            if final["state"] != "succeeded":
                raise SystemExit("the first save failed: " + json.dumps(final))


def grow(root, count):
    """Steps 2..count as hard links of step 1's files."""
    mesh = os.path.join(root, "m")
    first = os.path.join(mesh, "step-1")
    for step in range(2, count + 1):
        d = os.path.join(mesh, "step-%d" % step)
        if os.path.isdir(d):
            continue
        os.mkdir(d)
        for name in os.listdir(first):
            os.link(os.path.join(first, name), os.path.join(d, name))


def rebuild_once(bin_dir, root, count, token):
    data = tempfile.mkdtemp(prefix="tessera-rebuild-")
    env = dict(os.environ, TESSERA_TOKEN=token)
    t0 = time.monotonic()
    proc = subprocess.Popen([os.path.join(bin_dir, "tesserad"), "--listen", "127.0.0.1:0",
                             "--data-dir", data, "--checkpoint-root", root],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        url = None
        for line in proc.stdout:
            if line.startswith("listening on "):
                url = line.split()[2]
                break
        if url is None:
            raise SystemExit("tesserad did not start")
        listening_s = time.monotonic() - t0
        req = urllib.request.Request(url + "/api/v1/meshes/m/checkpoints",
                                     headers={"Authorization": "Bearer " + token})
        with urllib.request.urlopen(req, timeout=600) as r:
            listed = json.load(r)
        total_s = time.monotonic() - t0
        if len(listed) != count:
            raise SystemExit("listed %d checkpoints, not %d" % (len(listed), count))
        return {"count": count, "listening_s": round(listening_s, 3), "listed_s": round(total_s, 3)}
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", default="1000,10000")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default=os.path.join(HERE, "out", "catalog_rebuild.jsonl"))
    a = p.parse_args()
    bin_dir = os.path.abspath(os.environ.get("TESSERA_BIN", os.path.join(HERE, "..", "build", "bin")))
    work = tempfile.mkdtemp(prefix="tessera-rebuild-root-")
    root = os.path.join(work, "root")
    rows = []
    try:
        make_root(root)
        for count in [int(c) for c in a.counts.split(",")]:
            grow(root, count)
            for run in range(a.runs):
                row = rebuild_once(bin_dir, root, count, "rebuild-%d" % os.getpid())
                row.update({"bench": "catalog_rebuild", "store": "posix", "run": run + 1})
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print("\n| checkpoints | until listening (s) | until listed (s) | goal |")
    print("|---|---|---|---|")
    for count in sorted({r["count"] for r in rows}):
        xs = [r["listed_s"] for r in rows if r["count"] == count]
        ls = [r["listening_s"] for r in rows if r["count"] == count]
        verdict = ("met" if max(xs) <= GOAL_S else "**not met**") if count == 10000 else "—"
        print("| %d | %.2f (%.2f–%.2f) | %.2f (%.2f–%.2f) | %s |" % (
            count, statistics.median(ls), min(ls), max(ls), statistics.median(xs), min(xs), max(xs),
            verdict))


if __name__ == "__main__":
    main()
