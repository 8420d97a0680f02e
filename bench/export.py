#!/usr/bin/python3
"""`tessera export` (safetensors) against the engine's own save of the same state: a
mesh {data: 2} on two workers of this machine holds --mib MiB of float32 (random,
uncompressed: compression "none"); each run saves it (REST save job, waited for) and
exports the committed step into a fresh directory. GB/s = the state's bytes over the
wall time of each; goal: export ≥ 0.9× the save.

    /usr/bin/python3 bench/export.py [--mib 512] [--runs 3] [--out FILE]
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import numpy as np  # noqa: E402
import tessera  # noqa: E402
from tessera.local import LocalCluster  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    elems = args.mib * (1 << 20) // 4
    with LocalCluster(workers=2) as cluster:
        client = cluster.client(timeout=600)
        client.register_mesh("m", {"data": 2}, workers=cluster.worker_ids[:2])
        ms = [tessera.CheckpointManager("m", worker=cluster.worker_urls[i]) for i in range(2)]
        rng = np.random.default_rng(1)
        for m in ms:
            m.attach("w", (elems,), "float32", ("data",))[:] = rng.standard_normal(elems // 2, dtype=np.float32)
        cli = os.path.join(cluster.bin_dir, "tessera")
        for run in range(args.runs):
            step = run + 1
            t0 = time.monotonic()
            final = client.save("m", step, compression="none").wait(timeout=600)
            save_s = time.monotonic() - t0
            assert final["state"] == "succeeded", final
            out = tempfile.mkdtemp(prefix="tessera-export-", dir=os.path.join(HERE, "out"))
            ckpt = os.path.join(cluster.dir, "data", "checkpoints", "m", "step-%d" % step)
            t0 = time.monotonic()
            # The export fsyncs what it writes, as the save does.
            subprocess.run([cli, "export", ckpt, out], check=True, stdout=subprocess.DEVNULL)
            export_s = time.monotonic() - t0
            shutil.rmtree(out)
            gb = elems * 4 / 1e9
            row = {"kind": "export", "run": run, "bytes": elems * 4, "save_gbps": gb / save_s,
                   "export_gbps": gb / export_s, "ratio": save_s / export_s}
            rows.append(row)
            print(json.dumps(row), flush=True)
        for m in ms:
            m.close()
    summary = {"kind": "summary", "save_gbps": statistics.median(r["save_gbps"] for r in rows),
               "export_gbps": statistics.median(r["export_gbps"] for r in rows),
               "ratio": statistics.median(r["ratio"] for r in rows),
               "ratio_min": min(r["ratio"] for r in rows), "ratio_max": max(r["ratio"] for r in rows),
               "goal": 0.9}
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for r in rows + [summary]:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
