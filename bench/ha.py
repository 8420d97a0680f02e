#!/usr/bin/python3
"""A standby tesserad (docs/ha.md): how long a takeover takes, and what HA costs when
nothing fails. Real processes on this machine: an etcd (tools/etcd), tesserads on
one checkpoint root, two workers, and two trainers (threads, each on its own worker's
local API) that save a 1 MiB state in the loop, step after step.

Takeover (--takeovers runs): after 5 committed saves the leader is SIGKILLed.
  elected_s   kill → the standby's /healthz says it leads
  commit_s    kill → the first save committed by the new leader (a trainer's save
              that ended committed after the kill)
  failing_s   the trainers' view: from the start of the first save that failed to
              the end of the first one committed after it
  failed      saves that failed meanwhile
Goal: commit_s ≤ 2 leases (--ha-lease-s, 2 s here).

Steady state (--rounds): --saves in-loop saves, each waited for, with the leader of an
HA pair and with a single tesserad without --ha, the two interleaved; the median and
the spread of a save's latency.

    /usr/bin/python3 bench/ha.py [--takeovers 3] [--rounds 2] [--saves 30] [--out FILE]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "etcd"))
import tessera  # noqa: E402
from tessera.local import Process, _REGISTERED, find_bin_dir  # noqa: E402
from etcd import Etcd  # noqa: E402

LEASE_S = 2


class Pair:
    """tesserads (an HA pair, or one alone) and two workers on one root."""

    def __init__(self, bin_dir, etcd=None):
        self.bin = bin_dir
        self.dir = tempfile.mkdtemp(prefix="tessera-ha-bench-")
        self.root = os.path.join(self.dir, "root")
        self.token = "ha-bench-%d" % os.getpid()
        self.env = dict(os.environ, TESSERA_TOKEN=self.token)
        self.etcd = etcd
        self.servers = [self.tesserad("a")]
        if etcd:
            self.wait_leader(self.servers[0].url)
            self.servers.append(self.tesserad("b"))
        urls = ",".join(s.url for s in self.servers)
        self.workers, self.ids, self.local = [], [], []
        for i in range(2):
            w = Process([os.path.join(self.bin, "tessera-worker"), "--server", urls, "--name", "h%d" % i,
                         "--local-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
                         "--copy-threads", "1"], os.path.join(self.dir, "w%d.log" % i), env=self.env)
            self.ids.append(w.wait_for(_REGISTERED, 20))
            self.local.append(w.url)
            self.workers.append(w)
        self.client = tessera.Client(urls, self.token, failover_timeout=60)
        self.client.register_mesh("m", {"data": 2}, workers=self.ids)

    def tesserad(self, name):
        ha = ["--ha", self.etcd.url, "--ha-lease-s", str(LEASE_S)] if self.etcd else []
        return Process([os.path.join(self.bin, "tesserad"), "--listen", "127.0.0.1:0",
                        "--data-dir", os.path.join(self.dir, name), "--checkpoint-root", self.root,
                        "--heartbeat-ms", "200", "--lease-ms", "2000"] + ha,
                       os.path.join(self.dir, name + ".log"), env=self.env)

    def role(self, url):
        try:
            with tessera.Client(url, self.token, timeout=2) as c:
                return c.health().get("role")
        except tessera.TesseraError:
            return None

    def wait_leader(self, url, timeout=60):
        deadline = time.monotonic() + timeout
        while self.role(url) != "leader":
            if time.monotonic() > deadline:
                raise SystemExit("%s never led" % url)
            time.sleep(0.01)
        return time.monotonic()

    def close(self):
        self.client.close()
        for p in self.workers + self.servers:
            p.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Trainers:
    """Two trainer threads saving steps 1, 2, ... in the loop until stop(); each
    save's (rank, step, start, end, ok)."""

    def __init__(self, pair):
        self.saves, self.lock, self.stopping = [], threading.Lock(), False
        self.errors = []
        self.step_done = threading.Barrier(2)
        self.threads = [threading.Thread(target=self.run, args=(pair, r)) for r in range(2)]
        for t in self.threads:
            t.start()

    def run(self, pair, rank):
        with tessera.CheckpointManager("m", worker=pair.local[rank]) as m:
            m.attach("w", (131072 * 2,), "float32", ("data",))[:] = rank  # 1 MiB per rank
            step = 0
            while True:
                step += 1
                t0 = time.monotonic()
                try:
                    m.save(step).wait(timeout=120)
                    ok = True
                except tessera.TesseraError as e:
                    ok = False
                    self.errors.append(str(e))
                with self.lock:
                    self.saves.append((rank, step, t0, time.monotonic(), ok))
                try:
                    self.step_done.wait(timeout=180)  # both ranks on the same step
                except threading.BrokenBarrierError:
                    return
                if self.stopping:
                    return

    def committed(self):
        with self.lock:
            return sum(1 for s in self.saves if s[4] and s[0] == 0)

    def stop(self):
        self.stopping = True
        for t in self.threads:
            t.join(300)


def takeover(bin_dir):
    with Etcd() as etcd:
        pair = Pair(bin_dir, etcd)
        try:
            trainers = Trainers(pair)
            while trainers.committed() < 5:
                time.sleep(0.01)
            killed = time.monotonic()
            pair.servers[0].kill()
            elected = pair.wait_leader(pair.servers[1].url)
            while not any(s[4] and s[2] > killed for s in list(trainers.saves)):
                if time.monotonic() - killed > 120:
                    raise SystemExit("no save committed within 120 s of the kill")
                time.sleep(0.01)
            trainers.stop()
            saves = sorted(trainers.saves, key=lambda s: s[2])
            first_failed = min((s[2] for s in saves if not s[4]), default=killed)
            after = [s for s in saves if s[4] and s[2] > killed]
            first_ok = min(after, key=lambda s: s[3])
            return {"elected_s": elected - killed, "commit_s": first_ok[3] - killed,
                    "failing_s": first_ok[3] - min(first_failed, killed),
                    "failed": sum(1 for s in saves if not s[4])}
        finally:
            pair.close()


def steady(bin_dir, saves, ha):
    etcd = Etcd() if ha else None
    try:
        pair = Pair(bin_dir, etcd)
        try:
            trainers = Trainers(pair)
            while trainers.committed() < saves + 3:  # the first 3 warm up
                time.sleep(0.01)
            trainers.stop()
            lat = [s[3] - s[2] for s in trainers.saves if s[4] and s[0] == 0 and s[1] > 3][:saves]
            return lat
        finally:
            pair.close()
    finally:
        if etcd:
            etcd.stop()


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--takeovers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--saves", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    bin_dir = find_bin_dir(None)
    rows = []
    for i in range(args.takeovers):
        r = takeover(bin_dir)
        r.update(kind="takeover", run=i, lease_s=LEASE_S)
        rows.append(r)
        print(json.dumps(r), flush=True)
    lat = {True: [], False: []}
    for i in range(args.rounds):
        for ha in (False, True):
            xs = steady(bin_dir, args.saves, ha)
            lat[ha] += xs
            r = {"kind": "steady", "ha": ha, "round": i, **spread([x * 1000 for x in xs])}
            rows.append(r)
            print(json.dumps(r), flush=True)
    take = [r for r in rows if r["kind"] == "takeover"]
    summary = {"kind": "summary", "lease_s": LEASE_S}
    for k in ("elected_s", "commit_s", "failing_s"):
        if take:
            summary[k] = spread([r[k] for r in take])
    summary["goal_commit_s"] = 2 * LEASE_S
    summary["save_ms_single"] = spread([x * 1000 for x in lat[False]])
    summary["save_ms_ha"] = spread([x * 1000 for x in lat[True]])
    summary["ha_over_single"] = summary["save_ms_ha"]["median"] / summary["save_ms_single"]["median"]
    rows.append(summary)
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
