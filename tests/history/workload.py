"""The clients and the nemesis of a history test, against a real LocalCluster.

A job is one training job: 4 trainer threads, one per worker, on a mesh of its own,
saving together (disk, incremental or full, and memory), restoring the latest step
and named steps. A named restore of an older step is a rollback: the job deletes the
persisted steps after it and goes on writing new steps on a new timeline. The state
saved at a step is a function of (seed, job, timeline, step) alone (`state`), with a
tag tensor naming (job, timeline, step), so whatever a restore returns names the save
that wrote it. Step numbers of a job are never reused, so each one has one writer.

A REST client deletes random committed steps and changes retention; the nemesis
SIGKILLs tesserad or a worker and starts it again. Every choice is drawn from a
random.Random seeded from the seed and the client's name: the same seed makes the
same choices, while the interleaving with the real processes varies.
"""

import concurrent.futures
import random
import threading

import numpy as np

import tessera
from history import Hang

N = 4                   # workers, and trainers per job
BASE = (N * 64, 256)    # float32, sharded: changes every 5th step (incremental saves skip it)
HEAD = (N * 8, 64)      # float32, sharded: changes every step
TAG = 3                 # int64, replicated: [job, timeline, step]
SAVE_S = 60             # a save's wait
RESTORE_S = 20          # a restore's own timeout (a trainer that never comes holds the rest)
MEMORY_DEADLINE_MS = 20000
OP_S = 150              # any operation without an answer by then is a hang


def state(seed, job, timeline, step, rank):
    """The tensors that (job, timeline, step) saves on `rank`."""
    epoch = step - step % 5
    base = np.random.default_rng([seed, job, timeline, epoch, rank, 1]).standard_normal(
        (BASE[0] // N, BASE[1]), dtype=np.float32)
    head = np.random.default_rng([seed, job, timeline, step, rank, 2]).standard_normal(
        (HEAD[0] // N, HEAD[1]), dtype=np.float32)
    return base, head, np.array([job, timeline, step], dtype=np.int64)


class Faults:
    """What the nemesis changed: generations of the workers (a job re-attaches to a
    restarted one) and a lock that a job takes to read a worker's URL."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.lock = threading.Lock()
        self.generation = [0] * N
        self.kills = 0
        self.restarts = 0


def each(pool, fn):
    """fn(rank) on every trainer at once; all of them end before the first error is
    raised, so no call of one operation outlives it into the next."""
    futures = [pool.submit(fn, rank) for rank in range(N)]
    concurrent.futures.wait(futures)
    return [f.result() for f in futures]


class Job:
    def __init__(self, index, seed, cluster, faults, runner, pool, memory=True):
        self.index = index
        self.name = "job%d" % index
        self.mesh = "history-%d" % index
        self.seed = seed
        self.rng = random.Random("%d/%s" % (seed, self.name))
        self.cluster = cluster
        self.faults = faults
        self.runner = runner
        self.history = runner.history
        self.pool = pool
        self.weights = [4, 1, 2 if memory else 0, 1.5, 1.5]
        self.next_step = 1
        self.timeline = 0
        self.timelines = 1
        # The job's lineage: [timeline, last step of it on the lineage (None: open)],
        # oldest first; a rollback to step s cuts the owner of s there.
        self.lineage = [[0, None]]
        self.ms = [None] * N
        self.arrays = [None] * N
        self.generation = [-1] * N
        cluster.client(timeout=30).register_mesh(self.mesh, {"data": N},
                                                 workers=cluster.worker_ids)

    # -- trainers

    def connect(self):
        """(Re)attaches the trainers whose worker was restarted since they last looked."""
        for i in range(N):
            with self.faults.lock:
                gen, url = self.faults.generation[i], self.cluster.worker_urls[i]
                alive = self.cluster.workers[i].alive()
            if gen == self.generation[i] and self.ms[i] is not None:
                continue
            if not alive:
                continue
            if self.ms[i] is not None:
                self.ms[i].close()
                self.ms[i] = None
            m = tessera.CheckpointManager(self.mesh, worker=url, timeout=30)
            self.arrays[i] = (m.attach("base", BASE, "float32", ["data", None]),
                              m.attach("head", HEAD, "float32", ["data", None]),
                              m.attach("tag", (TAG,), "int64"))
            self.ms[i] = m
            self.generation[i] = gen

    def ready(self):
        try:
            self.connect()
        except tessera.TesseraError:
            return False
        return all(m is not None for m in self.ms)

    def fill(self, timeline, step):
        for rank, (base, head, tag) in enumerate(self.arrays):
            b, h, t = state(self.seed, self.index, timeline, step, rank)
            base[:], head[:], tag[:] = b, h, t

    def observed(self, rank):
        """What rank's tensors hold: its tag, and whether the rest is that tag's state."""
        base, head, tag = self.arrays[rank]
        job, timeline, step = (int(x) for x in tag)
        b, h, _ = state(self.seed, job, timeline, step, rank)
        return {"tag": [job, timeline, step],
                "intact": bool(np.array_equal(base, b) and np.array_equal(head, h))}

    # -- operations

    def save(self, kind):
        step, self.next_step = self.next_step, self.next_step + 1
        timeline = self.timeline
        options = {"disk": {}, "full": {"full": True},
                   "memory": {"tier": "memory", "force": True,
                              "deadline_ms": MEMORY_DEADLINE_MS}}[kind]

        def run():
            self.fill(timeline, step)
            handles = each(self.pool, lambda r: self.ms[r].save(step, **options))
            answers = each(self.pool, lambda r: handles[r].wait(timeout=SAVE_S))
            assert all(a["state"] == "committed" for a in answers), answers
            return "ok", {"step": step, "timeline": timeline, "kind": kind}
        return self.runner.run(self.name, "save", {"mesh": self.mesh, "step": step,
                                                   "timeline": timeline, "kind": kind},
                               run, OP_S)

    def restore(self, step, f="restore"):
        lineage = [list(x) for x in self.lineage]

        def run():
            for base, head, tag in self.arrays:  # whatever it held is not taken for the answer
                base[:], head[:], tag[:] = 0, 0, -1
            answers = each(self.pool, lambda r: self.ms[r].restore(step, timeout=RESTORE_S))
            if any(a is None for a in answers):
                return "ok", {"step": None, "ranks": []}
            return "ok", {"step": int(answers[0]),
                          "ranks": [dict(self.observed(r), step=int(a), tier=a.tier,
                                         source=a.source) for r, a in enumerate(answers)]}
        return self.runner.run(self.name, f, {"mesh": self.mesh, "step": step,
                                              "timeline": self.timeline, "lineage": lineage},
                               run, OP_S)

    def listing(self, process, client):
        def run():
            return "ok", [{"step": c["step"], "state": c.get("state"),
                           "tiers": c.get("tiers", ["persisted"])}
                          for c in client.checkpoints(self.mesh)]
        return self.runner.run(process, "list", {"mesh": self.mesh}, run, OP_S)

    def rollback(self, client):
        """A named restore of a step older than the newest: the job goes back to it,
        deletes the persisted steps after it, and goes on on a new timeline."""
        pick = self.rng.random()  # drawn first, so the job's draws do not depend on the answer
        listed, _ = self.listing(self.name, client)
        committed = sorted(c["step"] for c in listed or [] if c["state"] == "committed")
        if not committed:
            return
        target = committed[int(pick * len(committed))]
        restored, err = self.restore(target, f="rollback")
        if err is not None or restored["step"] != target or not all(
                r["intact"] and r["tag"][2] == target for r in restored["ranks"]):
            return  # the checker judges the restore; the job stays on its timeline
        owner = restored["ranks"][0]["tag"][1]
        later = sorted({c["step"] for c in listed if c["step"] > target and
                        "persisted" in c["tiers"]})
        for step in later:
            _, err = delete(self.runner, self.name, client, self.mesh, step)
            if err is not None and err["code"] != "not_found":
                return  # not all gone: no new timeline
        # The new timeline: the lineage up to `target` (owner's), then the new one.
        cut = []
        for timeline, last in self.lineage:
            if timeline == owner:
                cut.append([timeline, target])
                break
            cut.append([timeline, last])
        self.timeline, self.timelines = self.timelines, self.timelines + 1
        self.lineage = cut + [[self.timeline, None]]
        self.history.note(self.name, "timeline", {"mesh": self.mesh, "timeline": self.timeline,
                                                  "from": [owner, target],
                                                  "lineage": self.lineage})

    def step(self, client):
        """One operation, drawn from the job's own random sequence."""
        kind = self.rng.choices(["disk", "full", "memory", "latest", "named"],
                                self.weights)[0]
        if not self.ready():
            # A worker is down: the draw is made all the same, so choices stay in step.
            self.history.note(self.name, "skip", {"mesh": self.mesh, "drawn": kind})
            return
        if kind in ("disk", "full", "memory"):
            self.save(kind)
        elif kind == "latest":
            self.restore(None)
        else:
            self.rollback(client)

    def close(self):
        for m in self.ms:
            if m is not None:
                m.close()


def delete(runner, process, client, mesh, step):
    return runner.run(process, "delete", {"mesh": mesh, "step": step},
                      lambda: ("ok", client.delete_checkpoint(mesh, step)), OP_S)


class RestClient:
    """Deletes random committed steps and changes retention over REST."""

    def __init__(self, seed, runner, client, jobs):
        self.name = "rest"
        self.rng = random.Random("%d/rest" % seed)
        self.runner = runner
        self.client = client
        self.jobs = jobs

    def step(self):
        job = self.rng.choice(self.jobs)
        kind = self.rng.choices(["delete", "retention", "list"], [3, 1, 1])[0]
        if kind == "retention":
            keep_last = self.rng.randint(1, 4)
            every = self.rng.choice([None, None, 2, 3, 5])
            value = {"mesh": job.mesh, "keep_last": keep_last, "keep_every_n_steps": every}
            self.runner.run(self.name, "retention", value, lambda: (
                "ok", self.client.set_retention(job.mesh, keep_last=keep_last,
                                                keep_every_n_steps=every)), OP_S)
            return
        pick = self.rng.random()
        listed, _ = job.listing(self.name, self.client)
        if kind == "list" or not listed:
            return
        persisted = sorted(c["step"] for c in listed
                           if c["state"] == "committed" and "persisted" in c["tiers"])
        if persisted:
            delete(self.runner, self.name, self.client, job.mesh,
                   persisted[int(pick * len(persisted))])


class Nemesis:
    """SIGKILLs tesserad or a worker after a random number of completed operations
    (geometric, mean 1/kill_p), and starts it again after 0-2 more.

    The processes it starts die with its thread (LocalCluster's children get
    PR_SET_PDEATHSIG, which follows the thread that forked them), so the thread lives
    until finish(), after the cluster stopped."""

    def __init__(self, seed, cluster, faults, history, kill_p, workers=True):
        self.rng = random.Random("%d/nemesis" % seed)
        self.cluster = cluster
        self.faults = faults
        self.history = history
        self.kill_p = kill_p
        self.workers = workers  # False: tesserad alone
        self.stopping = threading.Event()
        self.idle = threading.Event()
        self.released = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._main, name="nemesis", daemon=True)

    def start(self):
        if self.kill_p > 0:
            self.thread.start()

    def stop(self):
        """No more faults; returns once the last restart is done."""
        self.stopping.set()
        with self.history.changed:
            self.history.changed.notify_all()
        if self.thread.is_alive():
            self.idle.wait(120)

    def finish(self):
        self.stop()
        self.released.set()
        if self.thread.is_alive():
            self.thread.join(120)

    def _wait_ops(self, n, bound):
        target = self.history.completed() + n
        with self.history.changed:
            self.history.changed.wait_for(
                lambda: self.stopping.is_set() or self.history._completed >= target, bound)

    def _main(self):
        try:
            self._faults()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        self.idle.set()
        self.released.wait()

    def _faults(self):
        while not self.stopping.is_set():
            gap = 1
            while self.rng.random() >= self.kill_p:
                gap += 1
            self._wait_ops(gap, None)
            if self.stopping.is_set():
                return
            target = self.rng.randrange(N + 2)  # tesserad twice as often as one worker
            if not self.workers:
                target = N
            downtime = self.rng.randint(0, 2)
            self.kill(target)
            # Down for 0-2 more completed operations; a bound, since every client may
            # be waiting on the dead process.
            self._wait_ops(downtime, 5)
            self.restart(target)

    def kill(self, target):
        if target >= N:
            self.history.note("nemesis", "kill", {"process": "tesserad"})
            self.cluster.kill_server()
        else:
            self.history.note("nemesis", "kill", {"process": "worker", "worker": target})
            self.cluster.kill_worker(target)
        self.faults.kills += 1

    def restart(self, target):
        if target >= N:
            self.cluster.start_server()
            self.history.note("nemesis", "restart", {"process": "tesserad"})
        else:
            with self.faults.lock:
                self.cluster.start_worker(target)
                self.faults.generation[target] += 1
            self.history.note("nemesis", "restart", {"process": "worker", "worker": target})
        self.faults.restarts += 1


__all__ = ["Hang", "Job", "Nemesis", "RestClient", "Faults", "state", "N"]
