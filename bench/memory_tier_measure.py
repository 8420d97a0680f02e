"""bench/memory_tier.py's measurements: the stall, memory, restart and host loss of one
mode on one cluster, iperf3 between two hosts, the example's training loop, and tesserad's
cost per memory checkpoint. Each is a JSON line of --out (Bench.emit)."""

import json
import os
import subprocess
import tempfile
import time

from request_counts import request_counts

import memory_tier_cluster as mtc
from memory_tier_cluster import (LOCAL, PY, PYTHON, TRAINER, WORKERS, Rank, Trainer, all_do,
                                 cpu_s, drop_caches, proc_status)

MODES = {  # mode -> (tier, save options)
    "replica": ("memory", {"redundancy": "replica", "replicas": 1}),
    "parity": ("memory", {"redundancy": "parity", "group": 4}),
    # Reed–Solomon: groups of 4 that survive 2 losses.
    "parity2": ("memory", {"redundancy": "parity", "group": 4, "parity": 2}),
    "disk": ("disk", {}),
    # keep=1: one committed checkpoint held (the default keeps 2); stall and memory only.
    "replica_keep1": ("memory", {"redundancy": "replica", "replicas": 1, "keep": 1}),
    # A frozen base: 20 tensors, 19 never written after the fill, so 5 % of the state
    # changes per step (each checkpoint shares the rest with the one before).
    "replica_frozen": ("memory", {"redundancy": "replica", "replicas": 1}),
}
SHAPES = {"replica_frozen": (20, 19)}  # mode -> (tensors, frozen)
STALL_ONLY = ("replica_keep1", "replica_frozen")
LOOP_MODES = ("replica", "parity")  # the training loop of a step 20× the state's memcpy
LOOP_STEP_MEMCPYS = 20


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
        trainers = cluster.trainers(mesh, self.a.mib, logdir, SHAPES.get(mode, ()))
        try:
            step = self.next_step()
            all_do(trainers, op="fill", step=step)
            if root_kind == "posix":
                self.stall(cluster, trainers, mode, tier, opts)
                self.memory(cluster, mode)
                if mode in LOOP_MODES:
                    self.loop(trainers, mode, opts)
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

    def stall(self, cluster, trainers, mode, tier, opts):
        solo = trainers[0]
        solo.send(op="memcpy", reps=self.a.memcpy_reps)
        alone = solo.read()["memcpy_ms"]
        together = [r["memcpy_ms"] for r in all_do(trainers, op="memcpy",
                                                   reps=self.a.memcpy_reps)]
        together = [x for xs in together for x in xs]
        self.memcpy_ms = sorted(together)[len(together) // 2]
        self.emit(bench="memcpy", mode=mode, alone_ms=alone, together_ms=together)
        self.save(trainers, tier, opts)  # warm-up
        steps = self.a.steps if tier == "memory" else self.a.disk_steps
        # The CPU the checkpoints cost: the trainers' and the workers', to each commit.
        pids = [t.ready["pid"] for t in trainers], [p.pid for _, p in sorted(cluster.workers.items())]
        cpu0 = [[cpu_s(pid) for pid in group] for group in pids]
        for _ in range(steps):
            step, rows = self.save(trainers, tier, opts)
            for rank, r in enumerate(rows):
                self.emit(bench="stall", mode=mode, tier=tier, step=step, rank=rank,
                          save_ms=r["save_ms"], snapshot_ms=r["snapshot_ms"],
                          commit_ms=r["commit_ms"], snapshot_bytes=r["snapshot_bytes"],
                          committed=r["committed"])
        cpu1 = [[cpu_s(pid) for pid in group] for group in pids]
        self.emit(bench="cpu", mode=mode, checkpoints=steps, state_bytes=int(self.a.mib * (1 << 20)) * WORKERS,
                  trainer_cpu_s=sum(cpu1[0]) - sum(cpu0[0]), worker_cpu_s=sum(cpu1[1]) - sum(cpu0[1]))

    def loop(self, trainers, mode, opts):
        """Rounds of a loop whose step is LOOP_STEP_MEMCPYS× the state's memcpy (every
        trainer at once), alternating no checkpoint, a memory checkpoint after every step,
        and the same with the snapshot taken during the next step."""
        step_ms = LOOP_STEP_MEMCPYS * self.memcpy_ms
        for r in range(3 * self.a.loop_rounds):
            kind = ("none", "memory", "background")[r % 3]
            first = self.step + 1
            self.step += self.a.loop_steps
            rows = all_do(trainers, op="loop", first_step=first, steps=self.a.loop_steps, step_ms=step_ms,
                          checkpoint="none" if kind == "none" else "memory",
                          background=kind == "background", opts=opts)
            self.emit(bench="loop", mode=mode, checkpoint=kind, step_ms=step_ms, memcpy_ms=self.memcpy_ms,
                      steps=self.a.loop_steps, steps_per_s=min(x["steps_per_s"] for x in rows))

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
                mtc.LocalCluster(workers=n, dir=d, heartbeat_ms=1000, lease_ms=10000) as cluster:
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


def requests(cluster, heartbeats=False):
    """'METHOD route' → requests tesserad answered, less /metrics and (unless
    `heartbeats`, then only they) the heartbeats."""
    return request_counts(cluster, lambda method, route: ("heartbeat" in route) != heartbeats)
