"""bench/memory_tier.py's cluster: the namespace hosts' tesserad and workers, the trainer
processes (bench/memory_tier_trainer.py) driven over their stdin/stdout, the in-process
ranks of the tesserad measurement, and what they share (paths, /proc, the page cache)."""

import json
import os
import queue
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, ".."))
PYTHON = os.path.join(REPO, "python")
sys.path.insert(0, PYTHON)
sys.path.insert(0, os.path.join(REPO, "tests", "multihost"))
sys.path.insert(0, os.path.join(REPO, "tools", "s3"))
# The client is imported when something is measured (load_client(), from main()), so that
# bench/report.py can use markdown() without numpy.
tessera = LocalCluster = _REGISTERED = None

TRAINER = os.path.join(HERE, "memory_tier_trainer.py")
PY = "/usr/bin/python3"
WORKERS = 4
HEARTBEAT_MS, LEASE_MS = 200, 2000
LOCAL = "http://127.0.0.1:7071"
SEED = 7


def load_client():
    """Imports the Python client (and numpy with it) for the measurements."""
    global tessera, LocalCluster, _REGISTERED
    import tessera  # noqa: PLC0415
    from tessera.local import LocalCluster, _REGISTERED  # noqa: PLC0415


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

    def __init__(self, hosts, i, mesh, rank, mib, logdir, shape=()):
        env = dict(os.environ, PYTHONPATH=PYTHON, TESSERA_WORKER=LOCAL)
        self.err = open(os.path.join(logdir, "trainer-%d.log" % i), "ab")
        self.p = subprocess.Popen(
            hosts.command(i, [PY, TRAINER, "state", mesh, str(rank), str(WORKERS), str(mib),
                              str(SEED)] + [str(x) for x in shape]),
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

    def trainers(self, mesh, mib, logdir, shape=()):
        """`shape`: (tensors, frozen) for memory_tier_trainer.py, or () for its default."""
        ts = [Trainer(self.hosts, i, mesh, i - 1, mib, logdir, shape) for i in range(1, WORKERS + 1)]
        for t in ts:
            t.wait_ready()
        return ts

    def stop(self):
        self.stop_workers()
        self.server.stop(grace=10)


def copy_logs(src, dst):
    for name in os.listdir(src):
        if name.endswith(".log"):
            try:
                with open(os.path.join(src, name), "rb") as f, \
                        open(os.path.join(dst, name), "ab") as g:
                    g.write(f.read())
            except OSError:
                pass

