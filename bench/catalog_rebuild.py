#!/usr/bin/python3
"""tesserad's catalog rebuilt from the checkpoint root: how long a tesserad started
with an empty data dir takes to list N committed checkpoints it has never seen.

One real save (tesserad and one worker on this machine, tessera.local.LocalCluster;
mesh {data: 1} holding a 64 KiB tensor) makes step 1; its directory is then
hard-linked as steps 2..N. For each N of --counts, --runs times: a fresh data dir,
tesserad started on that root, and the time from its start until it answers the
list of the mesh's checkpoints with all N (it rebuilds before it listens). Goal:
10,000 checkpoints in at most 5 s on POSIX.

With --s3 the root is a bucket of a throwaway Ceph RGW (tools/s3/rgw.py; as root):
step 1's objects are copied server-side under each step's own staging prefix, and
each step gets its commit manifest.

    /usr/bin/python3 bench/catalog_rebuild.py
    /usr/bin/python3 bench/catalog_rebuild.py --counts 1000,10000 --runs 3 --out bench/out/rebuild.jsonl
    /usr/bin/python3 bench/catalog_rebuild.py --s3 --counts 1000

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


def make_root(root, server_args=()):
    """Step 1 of mesh "m", saved for real into `root`."""
    import numpy as np  # noqa: PLC0415
    import tessera  # noqa: PLC0415
    from tessera.local import LocalCluster  # noqa: PLC0415

    with LocalCluster(workers=1, checkpoint_root=root, server_args=list(server_args)) as cluster:
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


def grow_s3(s3, bucket, prefix, count):
    """Steps 2..count in the bucket: step 1's objects under each step's own staging
    prefix (server-side copies), then each step's manifest."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415
    mesh = prefix + "m/"
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=mesh + "step-1.commit")["Body"].read())
    first = mesh + manifest["dir"] + "/"
    names = [o["Key"][len(first):] for o in s3.list_objects_v2(Bucket=bucket, Prefix=first)["Contents"]]

    def one(step):
        key = mesh + "step-%d.commit" % step
        staging = ".staging-%d-bench" % step
        for n in names:
            s3.copy_object(Bucket=bucket, Key=mesh + staging + "/" + n,
                           CopySource={"Bucket": bucket, "Key": first + n})
        body = dict(manifest, step=step, dir=staging)
        s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(body).encode())

    have = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=mesh + "step-"):
        have |= {o["Key"] for o in page.get("Contents", [])}
    todo = [s for s in range(2, count + 1) if mesh + "step-%d.commit" % s not in have]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, todo))


def rebuild_once(bin_dir, root, count, token, server_args=()):
    data = tempfile.mkdtemp(prefix="tessera-rebuild-")
    env = dict(os.environ, TESSERA_TOKEN=token)
    t0 = time.monotonic()
    proc = subprocess.Popen([os.path.join(bin_dir, "tesserad"), "--listen", "127.0.0.1:0",
                             "--data-dir", data, "--checkpoint-root", root] + list(server_args),
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
    p.add_argument("--s3", action="store_true", help="the root in a throwaway Ceph RGW bucket")
    a = p.parse_args()
    bin_dir = os.path.abspath(os.environ.get("TESSERA_BIN", os.path.join(HERE, "..", "build", "bin")))
    work = tempfile.mkdtemp(prefix="tessera-rebuild-root-")
    root = os.path.join(work, "root")
    rgw, server_args, store = None, [], "posix"
    rows = []
    try:
        if a.s3:
            sys.path.insert(0, os.path.join(HERE, "..", "tools", "s3"))
            from rgw import Rgw  # noqa: PLC0415
            rgw = Rgw("tessera-rebuild")
            root, server_args, store = "s3://tessera-rebuild/r/", ["--s3-endpoint", rgw.endpoint], "s3"
        make_root(root, server_args)
        for count in [int(c) for c in a.counts.split(",")]:
            if rgw:
                grow_s3(rgw.s3, "tessera-rebuild", "r/", count)
            else:
                grow(root, count)
            for run in range(a.runs):
                row = rebuild_once(bin_dir, root, count, "rebuild-%d" % os.getpid(), server_args)
                row.update({"bench": "catalog_rebuild", "store": store, "run": run + 1})
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        if rgw:
            rgw.stop()
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
        verdict = ("met" if max(xs) <= GOAL_S else "**not met**") \
            if count == 10000 and store == "posix" else "—"
        print("| %d | %.2f (%.2f–%.2f) | %.2f (%.2f–%.2f) | %s |" % (
            count, statistics.median(ls), min(ls), max(ls), statistics.median(xs), min(xs), max(xs),
            verdict))


if __name__ == "__main__":
    main()
