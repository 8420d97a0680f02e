#!/usr/bin/python3
"""A worker lost in the middle of a save: how long until the save fails, naming it.
tesserad and 4 workers on this machine (heartbeat 200 ms, lease 2 s, as the multi-host
tests), a mesh {data: 4} holding a small float32 tensor. Each run freezes one worker
(SIGSTOP: it neither heartbeats nor takes tasks, as a host whose link went down), starts
a REST save and waits for it to fail; then the worker is resumed and, once alive again,
a save commits.
  fail_s   SIGSTOP → the save's job has failed naming the frozen worker
Goal: fail_s ≤ the lease + 8 s (the bound the multi-host test once asserted).

    /usr/bin/python3 bench/worker_loss.py [--runs 3] [--out FILE]
"""

import argparse
import json
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
import tessera  # noqa: E402
from eventually import eventually  # noqa: E402
from tessera.local import LocalCluster  # noqa: E402

HEARTBEAT_MS, LEASE_MS = 200, 2000
WORKERS = 4
GOAL_S = (LEASE_MS + 8000) / 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    with LocalCluster(workers=WORKERS, heartbeat_ms=HEARTBEAT_MS, lease_ms=LEASE_MS) as cluster:
        client = cluster.client(timeout=60)
        client.register_mesh("m", {"data": WORKERS}, workers=cluster.worker_ids)
        ms = [tessera.CheckpointManager("m", worker=u) for u in cluster.worker_urls]
        for m in ms:
            m.attach("w", (WORKERS * 1024,), "float32", ("data",))[:] = 1
        step = 1
        assert client.save("m", step).wait(timeout=60)["state"] == "succeeded"
        for run in range(args.runs):
            lost = (run + 1) % WORKERS
            worker, worker_id = cluster.workers[lost], cluster.worker_ids[lost]
            step += 1
            t0 = time.monotonic()
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                job = client.save("m", step)
                try:
                    job.wait(timeout=120)
                    raise AssertionError("save %s committed without worker %s" % (job, worker_id))
                except tessera.TesseraError as e:
                    fail_s = time.monotonic() - t0
                    error = e
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            assert error.status != 0 and worker_id in str(error) + json.dumps(error.details), error
            eventually(lambda: client.worker(worker_id)["state"] == "alive",
                       "worker %s did not come back alive" % worker_id)
            step += 1
            assert client.save("m", step).wait(timeout=60)["state"] == "succeeded"
            row = {"kind": "worker_loss", "run": run, "worker": worker_id, "fail_s": fail_s,
                   "lease_s": LEASE_MS / 1000.0, "error": error.code}
            rows.append(row)
            emit(row, args.out)
        for m in ms:
            m.close()
    fails = [r["fail_s"] for r in rows]
    summary = {"kind": "summary", "fail_s": statistics.median(fails), "fail_s_min": min(fails),
               "fail_s_max": max(fails), "lease_s": LEASE_MS / 1000.0, "goal_s": GOAL_S}
    emit(summary, args.out)


def emit(row, out):
    """Prints `row` and appends it to `out` at once: the runs done survive a failed one."""
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def markdown(rows):
    """The RESULTS.md section of worker_loss.jsonl's rows."""
    runs = [r for r in rows if r.get("kind") == "worker_loss"]
    summary = next((r for r in rows if r.get("kind") == "summary"), None)
    if not runs or summary is None:
        return []
    verdict = "met" if summary["fail_s_max"] <= summary["goal_s"] else "not met"
    L = ["", "## A worker lost mid-save (bench/worker_loss.py)", "",
         "tesserad and 4 workers (heartbeat %d ms, lease %.0f s), a mesh `{data: 4}`. Each run "
         "freezes one worker with SIGSTOP, starts a REST save and times it until the save has "
         "failed naming that worker; the worker is then resumed and a save commits. Rows are "
         "in `bench/out/worker_loss.jsonl`." % (HEARTBEAT_MS, summary["lease_s"]), "",
         "| run | worker | error | SIGSTOP → save failed |", "|---|---|---|---:|"]
    for r in runs:
        L.append("| %d | %s | %s | %.2f s |" % (r["run"] + 1, r["worker"], r["error"], r["fail_s"]))
    L.append("| median | | | **%.2f s (%.2f–%.2f; goal ≤ %.0f s): %s** |" % (
        summary["fail_s"], summary["fail_s_min"], summary["fail_s_max"], summary["goal_s"],
        verdict))
    return L


if __name__ == "__main__":
    main()
