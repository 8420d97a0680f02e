#!/usr/bin/python3
"""Incremental disk saves against full ones: a trainer's 1 GiB through ten saves.

tesserad and one worker on this machine (tessera.local.LocalCluster, --copy-threads 1);
the trainer is this process: a tessera.CheckpointManager on mesh {data: 1} holding
--tensors float32 tensors (16 × 64 MiB by default, N(0, 0.02) from numpy), attach()ed
into the worker's mappings. The mappings, tesserad's catalog and logs live in /dev/shm;
the checkpoint root is a directory on the disk (--dir). Two workloads, each --saves
saves, one per step, the state changed in place between them:

  finetune  a frozen base: only the last --changed (5 %) of the state's bytes, one
            contiguous region (the trained layers), gets fresh values every step
  pretrain  every byte gets fresh values every step

Each workload runs as two series of saves at once, on a fresh mesh each: "full"
(save(step, full=True): every chunk written) and "incremental" (save(step,
full_every=100): the first save is full, as there is nothing to refer to, the next ones
write only the chunks whose xxh64 differs from the last committed save's). Both meshes
hold the same state and get the same updates; their saves alternate step by step (full
first at odd steps of odd runs, incremental first at even ones, the other way round in
even runs, which also make the incremental mesh first), so that both meet the same
disk: this VM's disk moves between ~1 GB/s and ~0.35 GB/s within a series of 1 GiB
saves, which one series after the other cannot tell from a 3 % difference. Compression
is the default, zstd (the float codec on float32). Per save: the time from save() to
the commit (handle.wait()), save() alone, the worker's snapshot_ms and its CPU time
(user + system, /proc) from save() to the commit, the checkpoint's
stored_bytes and referenced_bytes from tesserad (written = stored − referenced), and
how much the checkpoint root grew on disk (st_size of every file, os.walk) from before
save() to after the commit. After the saves, each mesh's last step is restored into
zeroed tensors and compared with what was saved, then its checkpoints are deleted and
its directory in the root checked to be empty again. --runs repetitions.

"Fresh values": the state is a window of one pool of N(0, 0.02) float32 made once; the
changed region of step s is the pool shifted by (s − 1) × (1 MiB + 4 bytes), so every
chunk there differs from the step before at the same statistics (drawing 1 GiB of
normals per step would cost ~5 s of this VM's CPU each time).

    TESSERA_BIN=build-bench/bin /usr/bin/python3 bench/incremental.py \\
        [--out bench/out/incremental.json] [--dir DIR] [--quick]
    /usr/bin/python3 bench/incremental.py --report    # the RESULTS.md section, from --out

--out is one JSON object on a single line (load() of bench/report_common.py reads it
as one row); `bench/report.py --section incremental` turns it into the "Incremental saves"
section of bench/RESULTS.md (markdown() of bench/incremental_report.py).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from memory_tier_cluster import HERE, REPO, cpu_s
from report import machine_facts
from incremental_report import markdown

SHIFT = (1 << 18) + 1  # elements the changed region moves along the pool per step
FULL_EVERY = 100       # every save after the first incremental in a series of --saves
MODES = ("full", "incremental")


def log(*a):
    print("incremental:", *a, file=sys.stderr, flush=True)


def chunk_size():
    """kDefaultChunkSize of storage/shard_format.h (the worker's chunk size)."""
    with open(os.path.join(REPO, "storage", "shard_format.h")) as f:
        m = re.search(r"kDefaultChunkSize\s*=\s*(\d+)\s*(?:<<\s*(\d+))?", f.read())
    return int(m.group(1)) << int(m.group(2) or 0) if m else None


def tree_bytes(root):
    """(files, sum of st_size, sum of allocated blocks × 512) under root."""
    n = size = alloc = 0
    for d, _, files in os.walk(root):
        for name in files:
            try:
                st = os.stat(os.path.join(d, name))
            except FileNotFoundError:
                continue
            n += 1
            size += st.st_size
            alloc += st.st_blocks * 512
    return n, size, alloc


def chunks_touched(lo, total, per, chunk):
    """Chunks (of `chunk` elements, each tensor of `per` cut on its own) that hold some of
    the flat positions [lo, total)."""
    n = 0
    for t in range(0, total, per):
        x, y = max(lo, t), min(total, t + per)
        if x < y:
            n += (y - 1 - t) // chunk - (x - t) // chunk + 1
    return n


def machine_ticks():
    """user + nice + system of the whole machine, in clock ticks (/proc/stat)."""
    with open("/proc/stat") as f:
        return sum(int(x) for x in f.readline().split()[1:4])


class State:
    """The trainer's tensors as one flat run of `total` float32 elements: step s holds
    pool[0:lo] and, in the changed region [lo, total), pool shifted by (s − 1) × SHIFT."""

    def __init__(self, pool, arrays, lo):
        self.pool, self.arrays, self.lo = pool, arrays, lo
        self.per = arrays[0].size
        self.total = self.per * len(arrays)

    def _walk(self, a, b, src, fn):
        """fn(tensor piece, pool piece) over the flat positions [a, b) ← pool[src:]."""
        results = []
        for i, arr in enumerate(self.arrays):
            t0 = i * self.per
            x, y = max(a, t0), min(b, t0 + self.per)
            if x < y:
                results.append(fn(arr[x - t0:y - t0], self.pool[src + x - a:src + y - a]))
        return results

    def set(self, step):
        import numpy as np  # noqa: PLC0415 - numpy only to measure (report without it)
        if step == 1:
            self._walk(0, self.total, 0, np.copyto)
        else:
            self._walk(self.lo, self.total, self.lo + (step - 1) * SHIFT, np.copyto)

    def holds(self, step):
        """True when the tensors hold exactly step's state."""
        import numpy as np  # noqa: PLC0415
        return all(self._walk(0, self.lo, 0, np.array_equal) + self._walk(
            self.lo, self.total, self.lo + (step - 1) * SHIFT, np.array_equal))


class Bench:
    def __init__(self, a, cluster, root, pool):
        self.a, self.cluster, self.root, self.pool = a, cluster, root, pool
        self.client = cluster.client(timeout=600)
        self.pids = [cluster.server_process.pid, cluster.workers[0].pid]

    def cpu(self):
        own = os.times()
        return {"machine_s": machine_ticks() / os.sysconf("SC_CLK_TCK"),
                "bench_s": own.user + own.system,
                "tesserad_s": cpu_s(self.pids[0]), "worker_s": cpu_s(self.pids[1])}

    def pair(self, kind, run):
        """The full and the incremental series of one workload at once: a fresh mesh each,
        the same state and updates, their saves interleaved step by step (which one goes
        first alternates), so both meet the same disk. Returns the pair's record."""
        import tessera  # noqa: PLC0415
        a = self.a
        per = a.tensor_elems
        total = per * a.tensors
        lo = total - int(round(total * a.changed)) if kind == "finetune" else 0
        rec = {"kind": kind, "run": run, "changed_bytes": (total - lo) * 4,
               "state_bytes": total * 4,
               "changed_chunks": chunks_touched(lo, total, per, chunk_size() // 4),
               "loadavg_before": os.getloadavg()[0], "series": []}
        names = ["layer%02d" % i for i in range(a.tensors)]
        sides = {}
        for mode in MODES if run % 2 else MODES[::-1]:  # which mesh is made first alternates
            mesh = "%s-%s-%d" % (kind, mode, run)
            self.client.register_mesh(mesh, {"data": 1}, workers=self.cluster.worker_ids[:1])
            ck = tessera.CheckpointManager(mesh, worker=self.cluster.worker_urls[0], timeout=600)
            state = State(self.pool, [ck.attach(n, (per,), "float32") for n in names], lo)
            sides[mode] = (mesh, ck, state, {"kind": kind, "mode": mode, "run": run,
                                              "mesh": mesh, "saves": []})
        cpu0 = self.cpu()
        t_start = time.monotonic()
        for step in range(1, a.saves + 1):
            for _, _, state, _ in sides.values():
                state.set(step)  # the training step: outside the timed saves
            # Run 1: full first at odd steps, second at even ones; run 2 the other way.
            order = MODES if (step + run) % 2 == 0 else MODES[::-1]
            for mode in order:
                mesh, ck, _, series = sides[mode]
                row = self.save(ck, mesh, mode, step)
                row["first"] = mode == order[0]
                series["saves"].append(row)
                log("%s %s run %d save %d: %.3f s, wrote %.1f MiB (disk +%.1f MiB)" % (
                    kind, mode, run, step, row["commit_s"], row["written_bytes"] / 2**20,
                    row["disk_growth_bytes"] / 2**20))
        rec["wall_s"] = time.monotonic() - t_start
        cpu1 = self.cpu()
        rec["loadavg_after"] = os.getloadavg()[0]
        rec["cpu_s"] = {k: cpu1[k] - cpu0[k] for k in cpu0}
        rec["cpu_s"]["other_s"] = max(0.0, rec["cpu_s"]["machine_s"] - sum(
            v for k, v in rec["cpu_s"].items() if k != "machine_s"))
        for mode in MODES:
            mesh, ck, state, series = sides[mode]
            # The last step, restored into zeroed tensors, must be what was saved: for an
            # incremental series most of its chunks lie in the first save's file.
            for arr in state.arrays:
                arr.fill(0)
            t0 = time.perf_counter()
            ck.restore(a.saves)
            series["restore_s"] = time.perf_counter() - t0
            series["restore_equal"] = state.holds(a.saves)
            for n in names:
                ck.detach(n)
            ck.close()
            series["reclaim"] = self.clear(mesh)
            log("%s %s run %d: restore %s, %.1f MiB left in the root after deleting" % (
                kind, mode, run, "equal" if series["restore_equal"] else "DIFFERENT",
                series["reclaim"]["left_bytes"] / 2**20))
            rec["series"].append(series)
        return rec

    def save(self, ck, mesh, mode, step):
        """One timed save, from save() to its commit, with what it wrote."""
        files0, size0, alloc0 = tree_bytes(self.root)
        cpu0 = cpu_s(self.pids[1])
        t0 = time.perf_counter()
        h = ck.save(step, full=True) if mode == "full" else ck.save(step, full_every=FULL_EVERY)
        t1 = time.perf_counter()
        h.wait(timeout=600)
        t2 = time.perf_counter()
        cpu1 = cpu_s(self.pids[1])
        files1, size1, alloc1 = tree_bytes(self.root)
        c = self.client.checkpoint(mesh, step)
        return {"save": step, "commit_s": t2 - t0, "save_call_s": t1 - t0,
                "worker_cpu_s": cpu1 - cpu0,
                "snapshot_ms": h.snapshot_ms, "logical_bytes": c.get("logical_bytes"),
                "stored_bytes": c["stored_bytes"], "referenced_bytes": c["referenced_bytes"],
                "written_bytes": c["stored_bytes"] - c["referenced_bytes"],
                "disk_growth_bytes": size1 - size0, "disk_growth_alloc_bytes": alloc1 - alloc0,
                "new_files": files1 - files0}

    def clear(self, mesh):
        """Deletes the mesh's checkpoints (newest first), waits until its directory in the
        root has given their space back (at most 120 s), then the mesh."""
        where = os.path.join(self.root, mesh)
        before = tree_bytes(where)[1]
        t0 = time.monotonic()
        for c in sorted(self.client.checkpoints(mesh), key=lambda c: -c["step"]):
            self.client.delete_checkpoint(mesh, c["step"])
        self.client.collect_garbage()
        left = tree_bytes(where)[1]
        while left > (1 << 20) and time.monotonic() - t0 < 120:
            time.sleep(0.5)
            self.client.collect_garbage()
            left = tree_bytes(where)[1]
        out = {"before_bytes": before, "left_bytes": left, "s": time.monotonic() - t0}
        try:
            self.client.delete_mesh(mesh)
        except Exception as e:  # noqa: BLE001 - a mesh left registered costs nothing here
            out["delete_mesh_error"] = str(e)[:300]
        subprocess.run(["sync"])  # the deletes' writeback, before the next series times
        return out


def product_commit():
    r = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h", "--", "service", "worker",
                        "python", "api", "storage"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "service",
                            "worker", "python", "api", "storage"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    return (r.stdout.strip() or "?") + (" + uncommitted changes" if dirty.stdout.strip() else "")


def measure(a):
    import numpy as np  # noqa: PLC0415
    from tessera.local import LocalCluster  # noqa: PLC0415
    per = a.tensor_elems
    total = per * a.tensors
    log("making the pool: %.2f GiB of N(0, 0.02) float32" % (
        (total + a.saves * SHIFT) * 4 / 2**30))
    pool = np.empty(total + a.saves * SHIFT, dtype=np.float32)
    np.random.default_rng(7).standard_normal(out=pool, dtype=np.float32)
    pool *= np.float32(0.02)
    cs = chunk_size()
    doc = {"bench": "incremental", "meta": {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "product_commit": product_commit(), "cpus": os.cpu_count(),
        "loadavg": os.getloadavg()[0], "machine": machine_facts(a.dir),
        "state_bytes": total * 4, "tensors": a.tensors, "tensor_bytes": per * 4,
        "chunk_size": cs, "changed_fraction": a.changed, "saves": a.saves, "runs": a.runs,
        "full_every": FULL_EVERY, "compression": "zstd (the default; the float codec on float32)",
        "copy_threads": 1, "quick": a.quick,
        "command": " ".join(["/usr/bin/python3", "bench/incremental.py"] + sys.argv[1:])},
        "pairs": []}
    scratch = tempfile.mkdtemp(prefix="tessera-incr-", dir="/dev/shm")
    root = os.path.join(a.dir, "tessera-incr-root-%d" % os.getpid())
    os.makedirs(root)
    cluster = None
    try:
        cluster = LocalCluster(workers=1, dir=scratch, checkpoint_root=root, heartbeat_ms=1000,
                               lease_ms=10000)
        b = Bench(a, cluster, root, pool)
        for run in range(1, a.runs + 1):
            for kind in a.kinds.split(","):
                doc["pairs"].append(b.pair(kind, run))
                write(a.out, doc)  # what is measured so far survives a later failure
    except BaseException:
        if cluster is not None:
            for name in ("tesserad.log", "worker-0.log"):
                path = os.path.join(scratch, name)
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        log("the end of %s:\n%s" % (name, f.read()[-3000:]))
        raise
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    doc["meta"]["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write(a.out, doc)
    return doc


def write(path, doc):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(doc) + "\n")
    os.replace(path + ".tmp", path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "out", "incremental.json"))
    p.add_argument("--dir", default=os.path.join(HERE, "out"),
                   help="where the checkpoint root goes (a directory on the disk measured)")
    p.add_argument("--tensors", type=int, default=16)
    p.add_argument("--tensor-mib", type=float, default=64)
    p.add_argument("--changed", type=float, default=0.05,
                   help="fraction of the state the finetune workload changes per step")
    p.add_argument("--saves", type=int, default=10, help="saves per series")
    p.add_argument("--runs", type=int, default=2, help="series of each kind and mode")
    p.add_argument("--kinds", default="finetune,pretrain")
    p.add_argument("--quick", action="store_true", help="16 × 4 MiB, 4 saves")
    p.add_argument("--report", action="store_true", help="measure nothing: print the section")
    a = p.parse_args()
    if a.report:
        with open(a.out) as f:
            print("\n".join(markdown([json.loads(f.read())])))
        return
    if a.quick:
        a.tensor_mib, a.saves = 4, 4
    a.tensor_elems = int(a.tensor_mib * (1 << 20)) // 4
    if not 0 < a.changed <= 1 or a.saves < 2 or a.runs < 1:
        p.error("--changed must be in (0, 1], --saves at least 2, --runs at least 1")
    doc = measure(a)
    print("\n".join(markdown([doc])))


if __name__ == "__main__":
    main()
