#!/usr/bin/python3
"""tesserad over a long run: many tiny saves, with clients listing jobs meanwhile.

tesserad (its default heartbeat and lease) and one worker on this machine
(tessera.local.LocalCluster); mesh {data: 1} holding one 64-byte tensor, with
retention keep_last=2 so checkpoints do not pile up. The script runs --saves
saves one after another through the REST API (POST, then a long-poll of the job),
while --pollers clients (dashboards, scripts) each list up to 1,000 jobs
(GET /api/v1/jobs?limit=1000) every --poll-interval-s. It
reports the save latency of the first and the last 1,000, tesserad's RSS and
catalog size along the way, the jobs it still lists, and whether a worker was
ever suspected (tessera_worker_state_changes_total).

    /usr/bin/python3 bench/job_history.py                      # 100,000 saves
    /usr/bin/python3 bench/job_history.py --saves 20000 --check

--check exits 1 unless the goals that are not times hold: RSS under 200 MB at the
end, the jobs listed within the history policy, no worker ever suspected.
TESSERA_BIN (default build/bin) names the directory of tesserad and tessera-worker.
"""

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

RSS_LIMIT_MB = 200


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def metric(text, name, labels):
    m = re.search(re.escape(name + "{" + labels + "}") + r" ([0-9.e+]+)", text)
    return float(m.group(1)) if m else 0.0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


RATIO_GOAL = 1.2  # the last 1,000 saves' p50 over the first 1,000's


def markdown(r):
    """The RESULTS.md section for one run's summary (what --out wrote)."""
    def verdict(ok):
        return "met" if ok else "**not met**"
    rows = [
        "## Long-running tesserad: %s tiny saves (bench/job_history.py)" % format(r["saves"], ","),
        "",
        "tesserad (default heartbeat 500 ms, lease 3 s, job history 1,000 per mesh / 60 s) and "
        "one worker; mesh {data: 1} with one 64-byte tensor and retention keep_last=2; saves one "
        "after another through the REST API, while %d clients list 1,000 jobs every %g s "
        "(%s lists in all). One run; the spread below is over the run's samples."
        % (r["pollers"], r["poll_interval_s"], format(r["job_lists"], ",")),
        "",
        "| goal | first 1,000 | last 1,000 | figure | verdict |",
        "|---|---|---|---|---|",
        "| tiny-save p50 within %.1f× of the first 1,000's | %.2f ms | %.2f ms (p90 %.2f) | "
        "%.2f× | %s |" % (RATIO_GOAL, r["first_1000_p50_ms"], r["last_1000_p50_ms"],
                          r["last_1000_p90_ms"], r["ratio"], verdict(r["ratio"] <= RATIO_GOAL)),
        "| tesserad RSS under %d MB | | | %.1f MB at the end, %.1f MB at most | %s |"
        % (RSS_LIMIT_MB, r["rss_mb_end"], r["rss_mb_max"], verdict(r["rss_mb_max"] < RSS_LIMIT_MB)),
        "| no worker ever suspected | | | %d suspect, %d dead | %s |"
        % (r["suspected"], r["dead"], verdict(not r["suspected"] and not r["dead"])),
        "",
        "Jobs kept at the end: %s; catalog %.2f MB. Per 1,000 saves (p50 ms of that 1,000 / "
        "RSS MB / catalog MB):" % (format(r["jobs_kept"], ","), r["catalog_mb_end"]),
        "",
    ]
    samples = r["samples"]
    step = max(1, len(samples) // 10)
    rows.append(", ".join("%dk: %.1f / %.0f / %.1f" % (s["saves"] // 1000, s["p50_ms"], s["rss_mb"],
                                                        s["catalog_mb"])
                          for s in samples[::step] + ([samples[-1]] if len(samples) % step != 1
                                                      else [])))
    p50s = [s["p50_ms"] for s in samples]
    rows += ["", "Spread of the per-1,000 p50 over the run: %.2f–%.2f ms (median %.2f)."
             % (min(p50s), max(p50s), statistics.median(p50s)), ""]
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--saves", type=int, default=100000)
    p.add_argument("--pollers", type=int, default=2)
    p.add_argument("--poll-interval-s", type=float, default=0.2)
    p.add_argument("--out", default=None, help="JSON summary (default: none)")
    p.add_argument("--check", action="store_true")
    p.add_argument("--markdown", default=None,
                   help="print the RESULTS.md section of a summary --out wrote, and exit")
    a = p.parse_args()
    if a.markdown:
        with open(a.markdown) as f:
            print("\n".join(markdown(json.load(f))))
        return
    import numpy as np  # noqa: PLC0415
    import tessera  # noqa: PLC0415
    from tessera.local import LocalCluster  # noqa: PLC0415

    with LocalCluster(workers=1, heartbeat_ms=500, lease_ms=3000) as cluster:
        client = cluster.client(timeout=120)
        client.register_mesh("hist", {"data": 1}, workers=cluster.worker_ids[:1])
        client.set_retention("hist", keep_last=2)
        pid = cluster.server_process.pid
        catalog = os.path.join(cluster.dir, "data", "catalog.sqlite")
        stop = threading.Event()
        listed = []

        def poll():
            c = cluster.client(timeout=120)
            while not stop.wait(a.poll_interval_s):
                listed.append(len(c.jobs(limit=1000)))

        with tessera.CheckpointManager("hist", worker=cluster.worker_urls[0]) as ck:
            ck.attach("w", (16,), "float32")[:] = np.arange(16, dtype=np.float32)
            pollers = [threading.Thread(target=poll, daemon=True) for _ in range(a.pollers)]
            for t in pollers:
                t.start()
            ms, samples = [], []
            t_start = time.monotonic()
            for step in range(1, a.saves + 1):
                t0 = time.perf_counter()
                job = client.save("hist", step)
                final = job.wait(timeout=120)
                ms.append((time.perf_counter() - t0) * 1000)
                if final["state"] != "succeeded":
                    raise SystemExit("save %d: %s" % (step, json.dumps(final)))
                if step % 1000 == 0 or step == a.saves:
                    samples.append({"saves": step, "rss_mb": round(rss_mb(pid), 1),
                                    "catalog_mb": round(os.path.getsize(catalog) / 2**20, 2),
                                    "p50_ms": round(statistics.median(ms[-1000:]), 2),
                                    "elapsed_s": round(time.monotonic() - t_start, 1)})
                    print(json.dumps(samples[-1]), flush=True)
            stop.set()
            for t in pollers:
                t.join()
        metrics = client._http.call("GET", "/metrics")[2].decode()
        cluster_json = client.cluster()
        kept = len(list(client.iter_jobs()))

    first = ms[:1000]
    last = ms[-1000:]
    result = {
        "saves": a.saves, "pollers": a.pollers, "poll_interval_s": a.poll_interval_s,
        "first_1000_p50_ms": round(statistics.median(first), 2),
        "last_1000_p50_ms": round(statistics.median(last), 2),
        "ratio": round(statistics.median(last) / statistics.median(first), 3),
        "last_1000_p90_ms": round(pct(last, .9), 2),
        "rss_mb_end": samples[-1]["rss_mb"], "rss_mb_max": max(s["rss_mb"] for s in samples),
        "catalog_mb_end": samples[-1]["catalog_mb"],
        "jobs_kept": kept, "jobs_by_state": cluster_json.get("jobs"),
        "suspected": metric(metrics, "tessera_worker_state_changes_total", 'state="suspect"'),
        "dead": metric(metrics, "tessera_worker_state_changes_total", 'state="dead"'),
        "job_lists": len(listed), "samples": samples,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(result, f)
    if a.check:
        problems = []
        if result["rss_mb_end"] >= RSS_LIMIT_MB:
            problems.append("tesserad RSS %.1f MB >= %d MB" % (result["rss_mb_end"], RSS_LIMIT_MB))
        if result["suspected"] or result["dead"]:
            problems.append("a worker was suspected %d times, dead %d times"
                            % (result["suspected"], result["dead"]))
        if not metrics:
            problems.append("no /metrics read")
        if problems:
            raise SystemExit("; ".join(problems))


if __name__ == "__main__":
    main()
