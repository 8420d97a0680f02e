#!/usr/bin/python3
"""The memory tier (docs/memory-tier.md), measured in one run against what it replaces.

Hosts are network namespaces on this machine (tests/multihost/hosts.py: each its own
address on a bridge, its own /tmp and /dev/shm): tesserad on host 0, one worker on
each of hosts 1-4 (--copy-threads 1), one trainer process per worker
(bench/memory_tier_trainer.py: tessera.CheckpointManager, MIB MiB of attach()ed
float32 state in 4 tensors sharded over the mesh {data: 4}). Needs root.

  stall     per mode (memory replica, memory parity g=4, disk for reference): fresh
            workers, the trainers' memcpy of their state (np.copyto, warmed, all four
            at once as they save), then --steps saves (after one warm-up), each
            stamped into the state, save() timed, handle.wait() to the commit
  memory    each worker's VmHWM, RssAnon and RssShmem (/proc/<pid>/status) after
            those saves, as a multiple of its state
  restart   the four trainers SIGKILLed and started again on live workers, attach,
            restore(): from the workers' RAM (memory modes) or the POSIX root (disk)
  host loss a worker and its trainer SIGKILLed, its host's /dev/shm emptied, a worker
            started under the same name, its trainer attaches, every trainer
            restore()s: from peers (replica, parity), the POSIX root (disk), and, on a
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
(`markdown(rows)` here).
"""

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, ".."))
PYTHON = os.path.join(REPO, "python")
sys.path.insert(0, PYTHON)
sys.path.insert(0, os.path.join(REPO, "tests", "multihost"))
sys.path.insert(0, os.path.join(REPO, "tools", "s3"))
# The client is imported when something is measured (main()), so that bench/report.py
# can use markdown() without numpy.
tessera = LocalCluster = _REGISTERED = None

TRAINER = os.path.join(HERE, "memory_tier_trainer.py")
PY = "/usr/bin/python3"
WORKERS = 4
HEARTBEAT_MS, LEASE_MS = 200, 2000
LOCAL = "http://127.0.0.1:7071"
SEED = 7
MODES = {  # mode -> (tier, save options)
    "replica": ("memory", {"redundancy": "replica", "replicas": 1}),
    "parity": ("memory", {"redundancy": "parity", "group": 4}),
    "disk": ("disk", {}),
    # keep=1: one committed checkpoint held (the default keeps 2); stall and memory only.
    "replica_keep1": ("memory", {"redundancy": "replica", "replicas": 1, "keep": 1}),
}
STALL_ONLY = ("replica_keep1",)

# Goals (the issue's).
STALL_VS_MEMCPY = 1.5      # memory save() stall ≤ 1.5× a memcpy of the same bytes
RAM_VS_S3 = 5.0            # host loss: from RAM ≥ 5× faster than from S3
RAM_VS_POSIX = 2.0         # ... and ≥ 2× faster than from the POSIX root
REBUILD_VS_TCP = 0.8       # replica rebuild rate ≥ 0.8× the hosts' TCP bandwidth
RESTART_VS_POSIX = 5.0     # trainer restart on a live host: RAM ≥ 5× faster than the root
TRAIN_RATIO = 0.97         # steps/s with a memory checkpoint every step ≥ 97 % of none
MEM_GOAL = {"parity": 1.35, "replica": 2.05}  # worker VmHWM / state


def log(*a):
    print("memory_tier:", *a, file=sys.stderr, flush=True)


def bin_path(name):
    d = os.environ.get("TESSERA_BIN") or os.path.join(REPO, "build", "bin")
    return os.path.join(os.path.abspath(d), name)


def proc_status(pid):
    """{field: kB} of /proc/<pid>/status's memory lines."""
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssShmem", "RssFile"):
                out[k] = int(v.split()[0])
    return out


def cpu_s(pid):
    """utime + stime of a process, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drop_caches():
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        log("cannot drop the page cache: %s" % e)


class Trainer:
    """One memory_tier_trainer.py on host i, driven over its stdin/stdout."""

    def __init__(self, hosts, i, mesh, rank, mib, logdir):
        env = dict(os.environ, PYTHONPATH=PYTHON, TESSERA_WORKER=LOCAL)
        self.err = open(os.path.join(logdir, "trainer-%d.log" % i), "ab")
        self.p = subprocess.Popen(
            hosts.command(i, [PY, TRAINER, "state", mesh, str(rank), str(WORKERS), str(mib),
                              str(SEED)]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, env=env, text=True,
            bufsize=1)
        self.rank = rank
        self.ready = None

    def wait_ready(self):
        self.ready = self.read()
        return self.ready

    def send(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("trainer of rank %d exited (%s); see its log %s" % (
                self.rank, self.p.poll(), self.err.name))
        r = json.loads(line)
        if r.get("ok") is False:
            raise RuntimeError("trainer of rank %d: %s" % (self.rank, r))
        return r

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()

    def close(self):
        if self.p.poll() is None:
            try:
                self.send(op="exit")
                self.p.wait(30)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.kill()
        self.err.close()


def all_do(trainers, **cmd):
    """Sends cmd to every trainer at once; their answers in rank order."""
    for t in trainers:
        t.send(**cmd)
    return [t.read() for t in trainers]


class Rank(threading.Thread):
    """One worker's trainer as a thread: its manager, a tiny tensor, memory saves."""

    def __init__(self, url, world):
        super().__init__(daemon=True)
        self.url, self.world = url, world
        self.inbox, self.outbox = queue.Queue(), queue.Queue()
        self.start()

    def run(self):
        m = None
        while True:
            step = self.inbox.get()
            try:
                if step is None:
                    break
                if step == "open":
                    m = tessera.CheckpointManager("cp", worker=self.url, timeout=300)
                    m.attach("w", (self.world * 256,), "float32", ("data",))
                else:
                    m.save(step, tier="memory", force=True).wait(timeout=300)
                self.outbox.put(None)
            except Exception as e:  # noqa: BLE001 - handed to the caller
                self.outbox.put(e)
        if m is not None:
            m.close()

    def send(self, step):
        self.inbox.put(step)

    def result(self):
        e = self.outbox.get(timeout=600)
        if e is not None:
            raise e

    def call(self, step):
        self.send(step)
        self.result()


class Cluster:
    """tesserad on host 0 and a worker on each of hosts 1..WORKERS."""

    def __init__(self, hosts, root, server_args, tag, port):
        self.hosts = hosts
        self.root = root
        self.tag = tag
        self.token = "membench-%d" % os.getpid()
        self.url = "http://%s:%d" % (hosts.addr(0), port)
        self.server = hosts.start(0, [
            bin_path("tesserad"), "--listen", "%s:%d" % (hosts.addr(0), port),
            "--data-dir", "/tmp/tesserad-" + tag, "--checkpoint-root", root,
            "--heartbeat-ms", str(HEARTBEAT_MS), "--lease-ms", str(LEASE_MS)] + server_args,
            "tesserad-%s.log" % tag, env=self.env())
        self.client = tessera.Client(self.url, self.token, timeout=120)
        self.workers = {}
        self.ids = {}

    def env(self):
        return dict(os.environ, TESSERA_TOKEN=self.token)

    def start_worker(self, i):
        p = self.hosts.start(i, [
            bin_path("tessera-worker"), "--server", self.url, "--name", "h%d" % i,
            "--local-listen", "127.0.0.1:7071", "--data-listen", "%s:7072" % self.hosts.addr(i),
            "--copy-threads", "1", "--io-threads", "1"],
            "worker-%s-%d.log" % (self.tag, i), env=self.env())
        self.ids[i] = p.wait_for(_REGISTERED, 30.0)
        self.workers[i] = p
        return p

    def start_workers(self):
        for i in range(1, WORKERS + 1):
            self.start_worker(i)

    def stop_workers(self):
        for p in self.workers.values():
            p.stop(grace=10)
        for i in self.workers:
            self.wipe(i)
        self.workers = {}

    def wipe(self, i):
        """Host i loses its RAM: what a worker left in its /dev/shm goes."""
        self.hosts.run(i, ["sh", "-c", "rm -rf /dev/shm/* /dev/shm/.[!.]* 2>/dev/null; true"])

    def wait_alive(self, i, timeout=30):
        deadline = time.monotonic() + timeout
        while self.client.worker(self.ids[i])["state"] != "alive":
            if time.monotonic() > deadline:
                raise RuntimeError("worker %s is not alive" % self.ids[i])
            time.sleep(0.05)

    def register(self, mesh):
        self.client.register_mesh(mesh, {"data": WORKERS},
                                  workers=[self.ids[i] for i in range(1, WORKERS + 1)])

    def trainers(self, mesh, mib, logdir):
        ts = [Trainer(self.hosts, i, mesh, i - 1, mib, logdir) for i in range(1, WORKERS + 1)]
        for t in ts:
            t.wait_ready()
        return ts

    def stop(self):
        self.stop_workers()
        self.server.stop(grace=10)


class Bench:
    def __init__(self, args):
        self.a = args
        self.run = args.run
        self.step = 0

    def emit(self, **row):
        row = dict(row, run=self.run, mib=self.a.mib, quick=self.a.quick)
        print(json.dumps(row), flush=True)
        with open(self.a.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    def next_step(self):
        self.step += 1
        return self.step

    # --- the stall, memory, restart and host loss of one mode on one cluster

    def mode(self, cluster, mode, logdir, root_kind):
        tier, opts = MODES[mode]
        mesh = "mt-%s-%s" % (root_kind, mode.replace("_", "-"))
        cluster.start_workers()
        cluster.register(mesh)
        if tier == "disk":
            cluster.client.set_retention(mesh, keep_last=2)
        trainers = cluster.trainers(mesh, self.a.mib, logdir)
        try:
            step = self.next_step()
            all_do(trainers, op="fill", step=step)
            if root_kind == "posix":
                self.stall(trainers, mode, tier, opts)
                self.memory(cluster, mode)
                if tier == "memory":
                    self.tesserad_view(cluster, mesh, mode)
                if mode in STALL_ONLY:
                    return
                self.restart(cluster, trainers, mode, tier, opts, mesh, logdir)
            else:
                self.save(trainers, tier, opts)  # the state on S3
            for k in range(self.a.losses):
                self.host_loss(cluster, trainers, mode, tier, opts, mesh, logdir, root_kind,
                               lost=2 + k % (WORKERS - 1))
        finally:
            for t in trainers:
                t.close()
            cluster.stop_workers()

    def save(self, trainers, tier, opts):
        step = self.next_step()
        rows = all_do(trainers, op="step", step=step, tier=tier, opts=opts)
        assert all(r.get("committed") for r in rows), rows
        return step, rows

    def stall(self, trainers, mode, tier, opts):
        solo = trainers[0]
        solo.send(op="memcpy", reps=self.a.memcpy_reps)
        alone = solo.read()["memcpy_ms"]
        together = [r["memcpy_ms"] for r in all_do(trainers, op="memcpy",
                                                   reps=self.a.memcpy_reps)]
        self.emit(bench="memcpy", mode=mode, alone_ms=alone,
                  together_ms=[x for xs in together for x in xs])
        self.save(trainers, tier, opts)  # warm-up
        steps = self.a.steps if tier == "memory" else self.a.disk_steps
        for _ in range(steps):
            step, rows = self.save(trainers, tier, opts)
            for rank, r in enumerate(rows):
                self.emit(bench="stall", mode=mode, tier=tier, step=step, rank=rank,
                          save_ms=r["save_ms"], snapshot_ms=r["snapshot_ms"],
                          commit_ms=r["commit_ms"], snapshot_bytes=r["snapshot_bytes"],
                          committed=r["committed"])

    def memory(self, cluster, mode):
        time.sleep(1)  # the last checkpoint's older one freed
        for i, p in sorted(cluster.workers.items()):
            st = proc_status(p.pid)
            # The host's /dev/shm holds the worker's mappings of the trainer's tensors.
            shm = int(cluster.hosts.run(i, ["du", "-sb", "/dev/shm"]).split()[0])
            self.emit(bench="worker_memory", mode=mode, host=i, pid=p.pid, shm_bytes=shm,
                      state_bytes=int(self.a.mib * (1 << 20)),
                      vmhwm_kb=st.get("VmHWM"), vmrss_kb=st.get("VmRSS"),
                      rss_anon_kb=st.get("RssAnon"), rss_shmem_kb=st.get("RssShmem"),
                      rss_file_kb=st.get("RssFile"))

    def tesserad_view(self, cluster, mesh, mode):
        """What tesserad says of the mesh's memory checkpoints (docs/memory-tier.md, "What
        tesserad knows"): listed with tiers ["memory"], and the workers' memory_bytes."""
        try:
            listed = cluster.client.checkpoints(mesh)
            listed = listed.get("checkpoints", []) if isinstance(listed, dict) else listed
            memory = [c.get("step") for c in listed if "memory" in (c.get("tiers") or [])]
            workers = cluster.client.workers()
            workers = workers.get("workers", []) if isinstance(workers, dict) else workers
            self.emit(bench="tesserad_view", mode=mode, listed=len(listed),
                      memory_steps=memory,
                      memory_bytes=[w.get("memory_bytes") for w in workers])
        except Exception as e:  # noqa: BLE001 - a finding, not a reason to stop
            self.emit(bench="tesserad_view", mode=mode, error=str(e)[-300:])

    def check(self, trainers, step):
        for t in trainers:
            t.send(op="check", step=step)
        return all(t.read()["equal"] for t in trainers)

    def restart(self, cluster, trainers, mode, tier, opts, mesh, logdir):
        """Every trainer killed and started again; the workers stay."""
        for _ in range(self.a.restarts):
            step, _ = self.save(trainers, tier, opts)
            all_do(trainers, op="scramble")
            drop_caches()
            t0 = time.monotonic()
            for t in trainers:
                t.kill()
            new = [Trainer(cluster.hosts, i, mesh, i - 1, self.a.mib, logdir)
                   for i in range(1, WORKERS + 1)]
            for t in new:
                t.wait_ready()
            t_ready = time.monotonic()
            rows = all_do(new, op="restore")
            t_end = time.monotonic()
            trainers[:] = new
            self.emit(bench="restart", mode=mode, step=step, total_s=t_end - t0,
                      trainers_up_s=t_ready - t0, restore_s=t_end - t_ready,
                      restore_ms=[r["restore_ms"] for r in rows],
                      restored_step=[r["step"] for r in rows], tier=[r.get("tier") for r in rows],
                      source=[r.get("source") for r in rows],
                      fallback=[r.get("fallback") for r in rows],
                      equal=self.check(new, step))

    def host_loss(self, cluster, trainers, mode, tier, opts, mesh, logdir, root_kind, lost):
        """Host `lost` (1-based) loses its worker, its trainer and its /dev/shm."""
        step, _ = self.save(trainers, tier, opts)
        all_do([t for t in trainers if t.rank != lost - 1], op="scramble")
        drop_caches()
        t0 = time.monotonic()
        cluster.workers[lost].kill()
        trainers[lost - 1].kill()
        cluster.wipe(lost)
        t_killed = time.monotonic()
        cluster.start_worker(lost)
        t_worker = time.monotonic()
        trainers[lost - 1] = Trainer(cluster.hosts, lost, mesh, lost - 1, self.a.mib, logdir)
        trainers[lost - 1].wait_ready()
        t_ready = time.monotonic()
        rows = all_do(trainers, op="restore")
        t_end = time.monotonic()
        case = mode if root_kind == "posix" else "s3"
        self.emit(bench="host_loss", mode=case, root=root_kind, step=step, lost_rank=lost - 1,
                  total_s=t_end - t0, kill_s=t_killed - t0, worker_up_s=t_worker - t_killed,
                  trainer_up_s=t_ready - t_worker, restore_s=t_end - t_ready,
                  restore_ms=[r["restore_ms"] for r in rows],
                  restored_step=[r["step"] for r in rows], tier=[r.get("tier") for r in rows],
                  source=[r.get("source") for r in rows],
                  fallback=[r.get("fallback") for r in rows],
                  share_bytes=int(self.a.mib * (1 << 20)), equal=self.check(trainers, step))

    # --- iperf3 between two worker hosts

    def iperf(self, hosts):
        server = subprocess.Popen(hosts.command(1, ["iperf3", "-s", "-1", "-B", hosts.addr(1)]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            out = hosts.run(2, ["iperf3", "-c", hosts.addr(1), "-t", str(self.a.iperf_s), "-J"],
                            timeout=60)
            r = json.loads(out)
            self.emit(bench="iperf3", from_host=2, to_host=1, seconds=self.a.iperf_s,
                      bits_per_second=r["end"]["sum_received"]["bits_per_second"])
        finally:
            server.kill()
            server.wait()

    # --- the example's training loop

    def training(self, cluster, logdir):
        cluster.start_workers()
        mesh = "mt-train"
        cluster.register(mesh)
        env = dict(os.environ, PYTHONPATH=PYTHON, TESSERA_WORKER=LOCAL)
        procs = []
        for i in range(1, WORKERS + 1):
            procs.append(subprocess.Popen(
                cluster.hosts.command(i, [PY, TRAINER, "train", mesh, str(i - 1), str(WORKERS),
                                          str(self.a.train_steps), str(self.a.train_rounds),
                                          "replica"]),
                stdout=subprocess.PIPE, stderr=open(os.path.join(logdir, "train-%d.log" % i),
                                                    "ab"), env=env, text=True))
        try:
            for p in procs:
                out, _ = p.communicate(timeout=1800)
                if p.returncode != 0:
                    raise RuntimeError("a training process failed (%s); see %s" % (
                        p.returncode, logdir))
                r = json.loads(out.strip().splitlines()[-1])
                for rd in r["rounds"]:
                    self.emit(bench="training", rank=r["rank"], state_bytes=r["state_bytes"],
                              **rd)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            cluster.stop_workers()

    # --- tesserad's cost per memory checkpoint

    def control(self, n):
        """n workers on 127.0.0.1, a tiny tensor each, memory checkpoints (force=True).
        Each worker's manager lives on a thread of its own (one keep-alive connection per
        worker, as n trainers would have)."""
        with tempfile.TemporaryDirectory(prefix="tessera-membench-cp-") as d, \
                LocalCluster(workers=n, dir=d, heartbeat_ms=1000, lease_ms=10000) as cluster:
            pid = cluster.server_process.pid
            client = cluster.client(timeout=120)
            client.register_mesh("cp", {"data": n}, workers=cluster.worker_ids)
            ranks = [Rank(u, n) for u in cluster.worker_urls]
            for r in ranks:
                r.call("open")

            def checkpoint(step):
                for r in ranks:
                    r.send(step)
                for r in ranks:
                    r.result()

            t = time.monotonic()
            for step in (1, 2):  # warm-up: the memory channel's group is made
                checkpoint(step)
            warm_s = time.monotonic() - t
            t = time.monotonic()
            before = requests(cluster)
            beats0 = sum(requests(cluster, heartbeats=True).values())
            c0 = cpu_s(pid)
            step = 2
            # At least --control-saves, and --control-s seconds: /proc counts CPU in ticks.
            while step < 2 + self.a.control_saves or time.monotonic() - t < self.a.control_s:
                step += 1
                checkpoint(step)
            busy_s = time.monotonic() - t
            busy_cpu = cpu_s(pid) - c0
            after = requests(cluster)
            beats = sum(requests(cluster, heartbeats=True).values()) - beats0
            by_route = {k: v - before.get(k, 0) for k, v in after.items()
                        if v - before.get(k, 0) > 0}
            # Idle: tesserad's CPU with no checkpoint, over as long as the checkpoints took.
            c0 = cpu_s(pid)
            idle0 = requests(cluster)
            time.sleep(busy_s)
            idle_cpu = cpu_s(pid) - c0
            idle1 = requests(cluster)
            idle_beats = sum(requests(cluster, heartbeats=True).values()) - beats0 - beats
            idle_req = sum(idle1.values()) - sum(idle0.values())
            k = step - 2
            self.emit(bench="control", workers=n, checkpoints=k, seconds=busy_s,
                      warmup_s=warm_s, per_checkpoint_ms=busy_s * 1000 / k,
                      requests_per_checkpoint=sum(by_route.values()) / k,
                      idle_requests_per_checkpoint_time=idle_req / k,
                      heartbeats_per_checkpoint=beats / k,
                      idle_heartbeats_per_checkpoint_time=idle_beats / k,
                      by_route={r: v / k for r, v in by_route.items()},
                      cpu_ms_per_checkpoint=busy_cpu * 1000 / k,
                      idle_cpu_ms_per_checkpoint_time=idle_cpu * 1000 / k,
                      net_cpu_ms_per_checkpoint=(busy_cpu - idle_cpu) * 1000 / k)
            for r in ranks:
                r.send(None)

    # --- the whole run

    def main(self):
        from hosts import Hosts, can_run  # noqa: PLC0415 - tests/multihost
        rev = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h", "--", "service",
                              "worker", "python", "api", "storage", "collectives", "http"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.emit(bench="meta", started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  product_commit=rev.stdout.strip() or None, cpus=os.cpu_count(),
                  loadavg=os.getloadavg()[0])
        why = can_run()
        parts = set(self.a.parts.split(","))
        if why and parts & {"posix", "s3", "training"}:
            raise SystemExit("memory_tier.py: the namespace hosts cannot be made: %s" % why)
        logdir = tempfile.mkdtemp(prefix="tessera-membench-logs-", dir="/var/tmp")
        log("logs in", logdir)
        if parts & {"posix", "s3", "training", "iperf"}:
            with Hosts(WORKERS + 1) as hosts:
                root = os.path.join(hosts.shared, "checkpoints")
                if "iperf" in parts:
                    self.iperf(hosts)
                if parts & {"posix", "training"}:
                    cluster = Cluster(hosts, root, [], "posix", 7070)
                    try:
                        if "posix" in parts:
                            for mode in self.a.modes.split(","):
                                log("POSIX root, mode", mode)
                                self.mode(cluster, mode, logdir, "posix")
                        if "training" in parts:
                            log("training loop")
                            self.training(cluster, logdir)
                    finally:
                        cluster.stop()
                        copy_logs(hosts.dir, logdir)
                if "s3" in parts:
                    log("S3 root")
                    from rgw import Rgw  # noqa: PLC0415 - tools/s3
                    os.environ.setdefault("TESSERA_RGW_STORE_BYTES",
                                          str(max(2 << 30, int(self.a.mib * (1 << 20)) * 16)))
                    rgw = Rgw("tessera-membench", addr=hosts.net + ".1")
                    try:
                        cluster = Cluster(hosts, "s3://tessera-membench/ckpt",
                                          ["--s3-endpoint", rgw.endpoint], "s3", 7080)
                        try:
                            self.mode(cluster, "disk", logdir, "s3")
                        finally:
                            cluster.stop()
                            copy_logs(hosts.dir, logdir)
                    finally:
                        rgw.stop()
        if "control" in parts:
            for n in (int(x) for x in self.a.control_workers.split(",")):
                log("tesserad with %d workers" % n)
                try:
                    self.control(n)
                except Exception as e:  # noqa: BLE001 - a size that does not fit is a result
                    self.emit(bench="control", workers=n, failed=True, error=str(e)[-600:])
                    log("%d workers failed: %s" % (n, e))


def copy_logs(src, dst):
    for name in os.listdir(src):
        if name.endswith(".log"):
            try:
                with open(os.path.join(src, name), "rb") as f, \
                        open(os.path.join(dst, name), "ab") as g:
                    g.write(f.read())
            except OSError:
                pass


def requests(cluster, heartbeats=False):
    """'METHOD route' → requests tesserad answered, less /metrics and (unless
    `heartbeats`, then only they) the heartbeats."""
    req = urllib.request.Request(cluster.server + "/metrics",
                                 headers={"Authorization": "Bearer " + cluster.token})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    out = {}
    prefix = 'tessera_http_requests_total{route="'
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        route = line[len(prefix):line.index('"', len(prefix))]
        method = line.split('method="')[1].split('"')[0]
        if ("heartbeat" in route) != heartbeats or route == "/metrics" or (
                method == "PUT" and route == "/api/v1/meshes/{name}"):
            continue
        key = method + " " + route
        out[key] = out.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return out


# --- the report section -------------------------------------------------------------------

def _med(xs):
    return statistics.median(xs) if xs else None


def _spread(xs, fmt="%.1f"):
    if not xs:
        return "—"
    return (fmt + " (" + fmt + "–" + fmt + ")") % (_med(xs), min(xs), max(xs))


def _range(xs, fmt="%.1f"):
    return "—" if not xs else (fmt + "–" + fmt) % (min(xs), max(xs))


def _verdict(ok):
    return "—" if ok is None else ("met" if ok else "**not met**")


def host_memory(r):
    """A worker's share of its host's memory: its peak RSS, plus its /dev/shm mapping of
    the trainer's tensors where that is not already in its RSS."""
    return r["vmhwm_kb"] * 1024 + max(0, r.get("shm_bytes", 0) - r["rss_shmem_kb"] * 1024)


def markdown(rows):
    """The RESULTS.md section of memory_tier.jsonl's rows."""
    if not rows:
        return []
    runs = sorted({r["run"] for r in rows})
    mib = rows[0]["mib"]
    quick = any(r.get("quick") for r in rows)
    by = lambda bench, **kw: [r for r in rows if r["bench"] == bench and all(  # noqa: E731
        r.get(k) == v for k, v in kw.items())]
    L = ["", "## The memory tier (bench/memory_tier.py)", "",
         "Hosts are network namespaces on this machine (`tests/multihost/hosts.py`): tesserad on "
         "host 0, one worker on each of hosts 1–4 (`--copy-threads 1`), one trainer process per "
         "worker (`bench/memory_tier_trainer.py`: `tessera.CheckpointManager`, %g MiB of "
         "`attach()`ed float32 state per trainer in 4 tensors sharded over `{data: 4}`). "
         "Every figure and its comparison come from the same run; %d run(s)%s, rows in "
         "`bench/out/memory_tier.jsonl`. Medians, with the spread (min–max) over every "
         "sample of every run. The page cache is dropped before each kill, so the POSIX root "
         "(a directory on this VM's disk) is read cold; the S3 root is a Ceph RGW with a "
         "memory-backed OSD (`tools/s3/rgw.sh`) on the hosts' bridge." % (mib, len(runs), " (--quick)" if quick else "")]
    meta = by("meta")
    if meta:
        L[-1] += " Runs: %s, on %d CPUs, the product code at `%s`." % (
            ", ".join(m["started_utc"] + (" (load %.1f)" % m["loadavg"] if m.get("loadavg") is not None else "") for m in meta),
            meta[0]["cpus"], "`, `".join(sorted({str(m["product_commit"]) for m in meta})))
    L.append("")
    T = ["| measure | ours | comparison (same run) | ratio (times: comparison / ours) | "
         "spread of ours | goal | verdict |",
         "|---|---:|---:|---:|---|---|---|"]
    notes = []

    # 1. stall
    # The memcpy of every mode pooled: four copies at once on this machine's cores move
    # by 2x from one mode's ten to the next's.
    mc = [x for r in by("memcpy") for x in r["together_ms"]]
    for mode in ("replica", "parity", "replica_keep1"):
        st = by("stall", mode=mode)
        if not st or not mc:
            continue
        save = [r["save_ms"] for r in st]
        snap = [r["snapshot_ms"] for r in st]
        commit = [r["commit_ms"] for r in st]
        ok = all(r["committed"] for r in st)
        ratio = _med(save) / _med(mc)
        T.append("| stall: memory save() (%s), ms | %.1f | memcpy %.1f | %.2f× | %s | ≤ %.1f× "
                 "| %s |" % (mode, _med(save), _med(mc), ratio, _range(save), STALL_VS_MEMCPY,
                             _verdict(ratio <= STALL_VS_MEMCPY)))
        T.append("| worker's snapshot_ms (%s) | %.1f | memcpy %.1f | %.2f× | %s | | |" % (
            mode, _med(snap), _med(mc), _med(snap) / _med(mc), _range(snap)))
        # The first checkpoints of a mesh fill fresh buffers (page faults); later ones reuse.
        first = {}
        for r in st:
            first[r["run"]] = min(first.get(r["run"], r["step"]), r["step"])
        steady = [r["save_ms"] for r in st if r["step"] >= first[r["run"]] + 2]
        early = [r["save_ms"] for r in st if r["step"] < first[r["run"]] + 2]
        if steady and early:
            T.append("| ... stall from the 4th checkpoint of the mesh on (the 2nd and 3rd: %s "
                     "ms) | %.1f | memcpy %.1f | %.2f× | %s | (≤ %.1f×) | %s |" % (
                         _spread(early, "%.0f"), _med(steady), _med(mc),
                         _med(steady) / _med(mc), _range(steady), STALL_VS_MEMCPY,
                         _verdict(_med(steady) / _med(mc) <= STALL_VS_MEMCPY)))
        T.append("| save() → commit (%s), ms; %d of %d committed | %.1f | | | %s | every "
                 "checkpoint commits | %s |" % (mode, sum(r["committed"] for r in st), len(st),
                                                 _med(commit), _range(commit), _verdict(ok)))
    disk = by("stall", mode="disk")
    if disk:
        T.append("| disk save() for reference: stall; save() → commit, ms | %.1f; %.1f | | | "
                 "%s; %s | | |" % (_med([r["save_ms"] for r in disk]),
                                   _med([r["commit_ms"] for r in disk]),
                                   _range([r["save_ms"] for r in disk]),
                                   _range([r["commit_ms"] for r in disk])))

    # 2. host loss
    loss = {m: by("host_loss", mode=m) for m in ("replica", "parity", "disk", "s3")}
    tot = {m: [r["total_s"] for r in v] for m, v in loss.items()}
    for m in ("replica", "parity"):
        if not tot[m]:
            continue
        for other, goal, label in (("s3", RAM_VS_S3, "S3"), ("disk", RAM_VS_POSIX, "POSIX root")):
            if not tot[other]:
                continue
            r = _med(tot[other]) / _med(tot[m])
            T.append("| host loss → every trainer restored, from RAM (%s) vs from %s, s | %.2f "
                     "| %.2f | %.2f× | %s | ≥ %g× | %s |" % (
                         m, label, _med(tot[m]), _med(tot[other]), r, _range(tot[m], "%.2f"),
                         goal, _verdict(r >= goal)))
    for m in ("replica", "parity"):
        rs = [r["restore_s"] for r in loss[m]]
        for other, goal, label in (("s3", RAM_VS_S3, "S3"), ("disk", RAM_VS_POSIX, "POSIX root")):
            ors = [r["restore_s"] for r in loss[other]]
            if rs and ors:
                r = _med(ors) / _med(rs)
                T.append("| host loss, the restore() calls alone, RAM (%s) vs %s, s | %.2f | "
                         "%.2f | %.2f× | %s | (≥ %g×) | %s |" % (
                             m, label, _med(rs), _med(ors), r, _range(rs, "%.2f"), goal,
                             _verdict(r >= goal)))
    # replica rebuild rate against iperf3
    ip = [r["bits_per_second"] / 8 for r in by("iperf3")]
    rep = loss["replica"]
    local = [r["restore_ms"][i] for r in by("restart", mode="replica")
             for i in range(len(r["restore_ms"]))]
    if ip and rep:
        whole = [r["share_bytes"] / (r["restore_ms"][r["lost_rank"]] / 1000) for r in rep]
        rebuild = []
        if local:
            for r in rep:
                dt = (r["restore_ms"][r["lost_rank"]] - _med(local)) / 1000
                if dt > 0:
                    rebuild.append(r["share_bytes"] / dt)
        rate = rebuild or whole
        ratio = _med(rate) / _med(ip)
        T.append("| replica rebuild rate, MB/s (share bytes / (the replacement's restore() − "
                 "a local restore())) vs iperf3 TCP between two hosts | %.0f | %.0f | %.2f× | "
                 "%s | ≥ %.1f× | %s |" % (_med(rate) / 1e6, _med(ip) / 1e6, ratio,
                                          _range([x / 1e6 for x in rate], "%.0f"),
                                          REBUILD_VS_TCP, _verdict(ratio >= REBUILD_VS_TCP)))
        T.append("| ... the same over the replacement's whole restore() call, MB/s | %.0f | %.0f "
                 "| %.2f× | %s | | |" % (_med(whole) / 1e6, _med(ip) / 1e6,
                                         _med(whole) / _med(ip),
                                         _range([x / 1e6 for x in whole], "%.0f")))
    # 3. restart on a live host
    rst = {m: by("restart", mode=m) for m in ("replica", "parity", "disk")}
    for m in ("replica", "parity"):
        if not rst[m] or not rst["disk"]:
            continue
        a = [r["total_s"] for r in rst[m]]
        b = [r["total_s"] for r in rst["disk"]]
        T.append("| trainer restart on live hosts → restored, RAM (%s) vs POSIX root, s | %.2f | "
                 "%.2f | %.2f× | %s | ≥ %g× | %s |" % (
                     m, _med(a), _med(b), _med(b) / _med(a), _range(a, "%.2f"), RESTART_VS_POSIX,
                     _verdict(_med(b) / _med(a) >= RESTART_VS_POSIX)))
        a = [r["restore_s"] for r in rst[m]]
        b = [r["restore_s"] for r in rst["disk"]]
        T.append("| ... the restore() calls alone, s | %.3f | %.3f | %.2f× | %s | "
                 "(≥ %g×) | %s |" % (_med(a), _med(b), _med(b) / _med(a), _range(a, "%.3f"),
                                     RESTART_VS_POSIX,
                                     _verdict(_med(b) / _med(a) >= RESTART_VS_POSIX)))
    # 4. training loop
    tr = by("training")
    if tr:
        mem = [r["steps_per_s"] for r in tr if r["checkpoint"] == "memory"]
        none = [r["steps_per_s"] for r in tr if r["checkpoint"] == "none"]
        if mem and none:
            ratio = _med(mem) / _med(none)
            T.append("| training loop (examples/python model, 4 hosts), steps/s, memory "
                     "checkpoint every step vs none | %.1f | %.1f | %.1f %% | %s | ≥ %.0f %% | "
                     "%s |" % (_med(mem), _med(none), ratio * 100, _range(mem), TRAIN_RATIO * 100,
                               _verdict(ratio >= TRAIN_RATIO)))
    # 6. memory per worker
    for m in ("replica", "parity", "replica_keep1", "disk"):
        mem = by("worker_memory", mode=m)
        if not mem:
            continue
        x = [host_memory(r) / r["state_bytes"] for r in mem]
        hwm = [r["vmhwm_kb"] * 1024 / r["state_bytes"] for r in mem]
        goal = MEM_GOAL.get(m)
        T.append("| host memory per worker / state (%s): VmHWM + its /dev/shm mapping "
                 "(VmHWM alone) | %.2f× (%.2f×) | state %g MiB | | %s | %s | %s |" % (
                     m, _med(x), _med(hwm), mib, _range(x, "%.2f"),
                     "≤ %.2f×" % goal if goal else "(reference)",
                     _verdict(_med(x) <= goal) if goal else ""))
    # 5. tesserad
    for r in sorted(by("control"), key=lambda r: r["workers"]):
        if r.get("failed"):
            T.append("| tesserad per memory checkpoint, %d workers | failed | | | | | %s |" % (
                r["workers"], r["error"].splitlines()[-1][:200] if r["error"] else "?"))
    cp = [r for r in by("control") if not r.get("failed")]
    for n in sorted({r["workers"] for r in cp}):
        rs = [r for r in cp if r["workers"] == n]
        req = [r["requests_per_checkpoint"] for r in rs]
        put = [sum(v for k, v in r["by_route"].items() if k.startswith("PUT /api/v1/meshes/"))
               for r in rs]
        idle = [r["idle_requests_per_checkpoint_time"] for r in rs]
        beats = [r["heartbeats_per_checkpoint"] for r in rs if "heartbeats_per_checkpoint" in r]
        ibeats = [r["idle_heartbeats_per_checkpoint_time"] for r in rs
                  if "heartbeats_per_checkpoint" in r]
        cpu = [r["cpu_ms_per_checkpoint"] for r in rs]
        net = [r["net_cpu_ms_per_checkpoint"] for r in rs]
        lat = [r["per_checkpoint_ms"] for r in rs]
        T.append("| tesserad per memory checkpoint, %d workers: requests (the report PUT; "
                 "all but heartbeats, and the same at idle over as long); CPU ms (less idle) "
                 "| %.2f (%.2f; %.2f idle); %.2f (%.2f) | | | %s | | |" % (
                     n, _med(put), _med(req), _med(idle), _med(cpu), _med(net),
                     "a checkpoint every %.0f ms" % _med(lat)))
        if beats:
            T.append("| ... heartbeats to tesserad per memory checkpoint, %d workers (at idle "
                     "over as long) | %.2f (%.2f) | | | %s | | |" % (
                         n, _med(beats), _med(ibeats), _range(beats, "%.2f")))
    # Detail tables.
    D = []
    if any(by("host_loss")) or any(by("restart")):
        D += ["Recoveries, each run's (kill → every trainer restored; the parts: worker up, "
              "trainer up (process start + attach), the restore() calls; restore() per rank in "
              "ms; tier/source per rank; bytes equal to the saved state):", "",
              "| case | total s | worker up s | trainer(s) up s | restore() s | restore() ms by "
              "rank | tier / source | bytes equal |", "|---|---:|---:|---:|---:|---|---|---|"]
        for r in by("host_loss"):
            D.append("| host loss, %s (rank %d lost) | %.2f | %.2f | %.2f | %.2f | %s | %s | %s |"
                     % (r["mode"], r["lost_rank"], r["total_s"], r["worker_up_s"],
                        r["trainer_up_s"], r["restore_s"],
                        " / ".join("%.0f" % x for x in r["restore_ms"]),
                        ", ".join("%s/%s" % ts for ts in zip(r["tier"], r["source"])),
                        "yes" if r["equal"] else "**no**"))
        for r in by("restart"):
            D.append("| restart, %s | %.2f | — | %.2f | %.2f | %s | %s | %s |" % (
                r["mode"], r["total_s"], r["trainers_up_s"], r["restore_s"],
                " / ".join("%.0f" % x for x in r["restore_ms"]),
                ", ".join("%s/%s" % ts for ts in zip(r["tier"], r["source"])),
                "yes" if r["equal"] else "**no**"))
        bad = [r for r in by("host_loss") + by("restart") if not r["equal"]]
        if bad:
            notes.append("- Some restores did not give back the saved bytes (rows above).")
        D.append("")
    mem = by("worker_memory")
    if mem:
        D += ["Worker memory after the stall's saves (/proc/<pid>/status, every host, "
              "multiples of the state):", "",
              "| mode | VmHWM | VmRSS | RssAnon | RssShmem | RssFile | host's /dev/shm |",
              "|---|---|---|---|---|---|---|"]
        for m in ("replica", "parity", "replica_keep1", "disk"):
            rs = by("worker_memory", mode=m)
            if rs:
                f = lambda k: _spread([r[k] * 1024 / r["state_bytes"] for r in rs], "%.2f")  # noqa
                shm = _spread([r.get("shm_bytes", 0) / r["state_bytes"] for r in rs], "%.2f")
                D.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                    m, f("vmhwm_kb"), f("vmrss_kb"), f("rss_anon_kb"), f("rss_shmem_kb"),
                    f("rss_file_kb"), shm))
        D.append("")
    mc = by("memcpy")
    if mc:
        alone = [x for r in mc for x in r["alone_ms"]]
        together = [x for r in mc for x in r["together_ms"]]
        D.append("The memcpy: each trainer's `np.copyto` of its whole state into a private "
                 "buffer, warmed, all four trainers at once as they save: %s ms (pooled over "
                 "the modes of every run); rank 0 alone: %s ms. The stall is compared with the "
                 "first, the conditions of the saves (4 trainers and 4 workers on this "
                 "machine's cores)."
                 % (_spread(together), _spread(alone)))
        D.append("")
    cp = by("control")
    if cp:
        D.append("tesserad per memory checkpoint, by route (requests per checkpoint, heartbeats "
                 "left out):")
        D.append("")
        for r in sorted(cp, key=lambda r: (r["workers"], r["run"])):
            if r.get("failed"):
                D.append("- %d workers (run %d): failed: %s" % (r["workers"], r["run"],
                                                               r["error"][-300:]))
                continue
            beats = ""
            if "heartbeats_per_checkpoint" in r:
                beats = "; heartbeats %.2f per checkpoint (%.2f at idle)" % (
                    r["heartbeats_per_checkpoint"], r["idle_heartbeats_per_checkpoint_time"])
            D.append("- %d workers (run %d): %s%s; tesserad CPU %.2f ms per checkpoint, %.2f at "
                     "idle over the same time, a checkpoint every %.0f ms" % (
                         r["workers"], r["run"], ", ".join(
                             "%s %.2f" % kv for kv in sorted(r["by_route"].items())) or "none",
                         beats, r["cpu_ms_per_checkpoint"], r["idle_cpu_ms_per_checkpoint_time"],
                         r["per_checkpoint_ms"]))
        D.append("")
    L += T
    L.append("")
    for r in by("tesserad_view"):
        if r.get("error") or not r.get("memory_steps"):
            notes.append("- tesserad lists no memory checkpoint of the %s mesh after its saves "
                         "(%s; workers' `memory_bytes` %s): rank 0's report (`PUT "
                         "/api/v1/meshes/{m}/memory-checkpoints`) is not taken, so the "
                         "request counted for tesserad per checkpoint is that refused report." % (
                             r["mode"], r.get("error") or "%d checkpoints listed" % r["listed"],
                             r.get("memory_bytes")))
            break
    cps = [r for r in by("control") if "heartbeats_per_checkpoint" in r and not r.get("failed")]
    extra = [(r["workers"], (r["heartbeats_per_checkpoint"]
                             - r["idle_heartbeats_per_checkpoint_time"]) / r["workers"])
             for r in cps]
    if extra and max(x for _, x in extra) > 0.5:
        notes.append("- Heartbeats: during memory checkpoints each worker sends up to %.1f "
                     "heartbeats per checkpoint beyond its interval (%s extra per worker and "
                     "checkpoint). The heartbeat thread waits on the agent's shared condition "
                     "variable (`worker/agent.cc`, `HeartbeatLoop`), which the save paths notify, "
                     "and beats whenever it wakes. tesserad's CPU per checkpoint above includes "
                     "them; its request count leaves them out." % (
                         max(x for _, x in extra),
                         ", ".join("%d workers %.2f" % e for e in sorted(set(extra)))))
    tr = by("training")
    if tr:
        mem = [r["steps_per_s"] for r in tr if r["checkpoint"] == "memory"]
        none = [r["steps_per_s"] for r in tr if r["checkpoint"] == "none"]
        if mem and none:
            notes.append("- Training loop: the example's model holds %d bytes of state "
                         "(parameters and Adam's moments); a step without checkpoints takes "
                         "%.2f ms (its all_reduce through the workers included), and a memory "
                         "checkpoint after each step adds %.2f ms to it (rounds of %d steps, "
                         "alternating, every rank)." % (
                             tr[0]["state_bytes"], 1000 / _med(none),
                             1000 / _med(mem) - 1000 / _med(none), tr[0]["steps"]))
    if by("worker_memory"):
        notes.append("- Memory: a worker keeps `keep` committed memory checkpoints (2 by "
                     "default; `replica_keep1` is keep=1), each its own share plus what it "
                     "holds for its peers (a copy: 1×; parity of 4: 1/3×), and the one being "
                     "taken; the trainer's tensors are the host's /dev/shm mapping, which the "
                     "worker does not map (RssShmem 0), counted once in the host's figure.")
    L += notes
    if notes:
        L.append("")
    return L + D


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
    p.add_argument("--control-workers", default=None, help="worker counts (4,32,256)")
    p.add_argument("--control-saves", type=int, default=None,
                   help="checkpoints timed, at least (20)")
    p.add_argument("--control-s", type=float, default=None,
                   help="seconds of checkpoints timed, at least (10)")
    p.add_argument("--modes", default="replica,parity,disk,replica_keep1")
    p.add_argument("--parts", default="iperf,posix,s3,training,control")
    p.add_argument("--run", type=int, default=None,
                   help="the run's number in --out (default: one more than the last there)")
    p.add_argument("--fresh", action="store_true", help="empty --out first")
    p.add_argument("--report", action="store_true", help="measure nothing: print the section")
    a = p.parse_args()
    global tessera, LocalCluster, _REGISTERED
    import tessera  # noqa: PLC0415
    from tessera.local import LocalCluster, _REGISTERED  # noqa: PLC0415
    q = a.quick
    for k, full, small in (("mib", 256, 16), ("steps", 12, 4), ("disk_steps", 3, 2),
                           ("losses", 2, 1), ("restarts", 2, 1), ("train_steps", 300, 50),
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
    Bench(a).main()


if __name__ == "__main__":
    main()
