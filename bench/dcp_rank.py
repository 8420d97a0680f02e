"""One rank of bench/dcp.py: a gloo process group over 4 ranks, each holding its shards
of a state of DTensors (Shard(0) on a 1-D mesh), checkpointed by one system:

    dcp_rank.py RANK WORLD PORT MODE MB OUT_DIR [WORKER_URL MESH]

MODE:
  memcpy          copy the rank's state into buffers allocated once (the floor), and into
                  fresh ones (what a stager that allocates pays)
  async-tessera   dcp.async_save with tessera.dcp.Writer (it is its own stager)
  async-thread    dcp.async_save with FileSystemWriter, AsyncCheckpointerType.THREAD
  async-process   the same, PROCESS
  save-tessera    dcp.save with tessera.dcp.Writer: until committed
  save-fs         dcp.save with FileSystemWriter (sync_files: fsync'd): until it returns
  load-tessera    dcp.load with tessera.dcp.Reader, the page cache of the files dropped
  load-tessera-raw  the same, saved with compression="none"
  load-fs         dcp.load with FileSystemReader, likewise
  train-none / train-tessera / train-thread
                  a loop of matmuls, with an async save every 5 steps (or none): steps/s
Prints one JSON line: the rank's timings, its VmHWM and (async) its children's.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Shard, distribute_tensor  # noqa: E402
from proc_status import descendants, reset_peak, status_kb  # noqa: E402 - bench/, beside this script

TENSORS = 16
ROUNDS = 4  # saves per run: the first warms up, the others are measured


def drop_cache(path):
    """The files under `path` leave the page cache (as bench/peers/save_torch.py does)."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def state(mesh, world, mb, seed):
    """mb MiB of float32 per rank, in TENSORS DTensors sharded on dim 0."""
    rows = mb * (1 << 20) // 4 // TENSORS // 256 * world
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w%d" % i: distribute_tensor(torch.randn(rows, 256, generator=g), mesh,
                                                   [Shard(0)]) for i in range(TENSORS)},
            "step": seed}


def main():
    rank, world, port, mode, mb, out_dir = sys.argv[1:7]
    worker, mesh_name = (sys.argv[7], sys.argv[8]) if len(sys.argv) > 8 else (None, None)
    rank, world, mb = int(rank), int(world), int(mb)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    side = dist.new_group(backend="gloo")  # the benchmark's own barriers beside DCP's
    sd = state(mesh, world, mb, 1)
    locals_ = [t.to_local() for t in sd["model"].values()]
    reset_peak(os.getpid())  # building the state's own peak is not the saves'
    result = {"rank": rank, "mode": mode, "rss_before_kb": status_kb(os.getpid(), "VmRSS")}
    children = set()

    def writer(step):
        if mode.endswith("tessera"):
            from tessera.dcp import Writer  # noqa: PLC0415
            return Writer(mesh=mesh_name, step=step, worker=worker, timeout=600)
        return dcp.FileSystemWriter(os.path.join(out_dir, "step-%d" % step))

    def barrier_time(fn):
        dist.barrier()
        t0 = time.perf_counter()
        value = fn()
        return time.perf_counter() - t0, value

    if mode == "memcpy":
        into = [torch.empty_like(t) for t in locals_]
        for t, o in zip(locals_, into):
            o.copy_(t)  # faults the pages in once
        copies, fresh = [], []
        for _ in range(ROUNDS):
            dist.barrier()  # every rank copies at once, as at a checkpoint
            t0 = time.perf_counter()
            for t, o in zip(locals_, into):
                o.copy_(t)
            copies.append(time.perf_counter() - t0)
            dist.barrier()
            t0 = time.perf_counter()
            made = [t.clone() for t in locals_]
            fresh.append(time.perf_counter() - t0)
            del made
        result.update(copy_s=copies[1:], fresh_s=fresh[1:])
    elif mode.startswith("async"):
        kind = AsyncCheckpointerType.PROCESS if mode == "async-process" else \
            AsyncCheckpointerType.THREAD
        blocked, durable = [], []
        # The goal's reference: a memcpy of this rank's state into buffers allocated once,
        # every rank at once, right before each save, in the same processes (so under the
        # same conditions). Its buffers are one copy of the state: the memory figures
        # subtract them (probe_kb).
        probe = [torch.empty_like(t) for t in locals_] if mode == "async-tessera" else []
        for t, o in zip(locals_, probe):
            o.copy_(t)
        result["probe_kb"] = sum(o.numel() * o.element_size() for o in probe) // 1024
        for step in range(ROUNDS):
            if probe:
                dist.barrier()
                c0 = time.perf_counter()
                for t, o in zip(locals_, probe):
                    o.copy_(t)
                result.setdefault("inrun_copy_s", []).append(time.perf_counter() - c0)
            dist.barrier()
            t0 = time.perf_counter()
            w = writer(step)
            future = dcp.async_save(sd, storage_writer=w, async_checkpointer_type=kind)
            t1 = time.perf_counter()
            if hasattr(w, "stage_seconds"):
                result.setdefault("stage", []).append(w.stage_seconds)
            # Training goes on (the staged copy is what is written) once every rank's call
            # returned: on 2 vCPUs one rank's training would take the cores from another
            # rank's staging, which a rank with cores of its own does not see.
            dist.barrier(group=side)  # not the default group: DCP's thread uses that one
            for t in locals_:
                t.add_(1.0)
            future.result()
            t2 = time.perf_counter()
            children.update(descendants(os.getpid()))
            blocked.append(t1 - t0)
            durable.append(t2 - t0)
        result.update(blocked_s=blocked[1:], durable_s=durable[1:])
        if "inrun_copy_s" in result:
            result["inrun_copy_s"] = result["inrun_copy_s"][1:]
    elif mode.startswith("save"):
        took = []
        for step in range(ROUNDS):
            s, _ = barrier_time(lambda: dcp.save(sd, storage_writer=writer(step)))  # noqa: B023
            took.append(s)
        result.update(save_s=took[1:])
    elif mode.startswith("load"):
        ours = mode.startswith("load-tessera")
        if ours:
            from tessera.dcp import Reader, Writer  # noqa: PLC0415
            raw = {"compression": "none"} if mode.endswith("-raw") else {}
            dcp.save(sd, storage_writer=Writer(mesh=mesh_name, step=0, worker=worker, timeout=600,
                                               **raw))
        else:
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(os.path.join(out_dir, "load")))
        took = []
        for _ in range(ROUNDS):
            target = state(mesh, world, mb, 2)
            dist.barrier()
            if rank == 0:
                drop_cache(os.environ["BENCH_DCP_ROOT"] if ours else os.path.join(out_dir, "load"))
            reader = Reader(mesh=mesh_name, step=0, worker=worker, timeout=600) if ours \
                else dcp.FileSystemReader(os.path.join(out_dir, "load"))
            s, _ = barrier_time(lambda: dcp.load(target, storage_reader=reader))  # noqa: B023
            assert all(torch.equal(a.to_local(), b.to_local())
                       for a, b in zip(sd["model"].values(), target["model"].values()))
            took.append(s)
        result.update(load_s=took[1:])
    elif mode.startswith("train"):
        x = torch.randn(512, 512)
        w = torch.randn(512, 512)
        steps, every, future = 40, 5, None
        dist.barrier()
        t0 = time.perf_counter()
        for step in range(steps):
            for _ in range(8):
                x = torch.tanh(x @ w)
            for t in locals_:
                t.add_(1e-3)
            if mode != "train-none" and step % every == every - 1:
                if future is not None:
                    future.result()
                future = dcp.async_save(sd, storage_writer=writer(step))
        if future is not None:
            future.result()
        dist.barrier()
        result.update(steps_per_s=steps / (time.perf_counter() - t0))
    result["hwm_kb"] = status_kb(os.getpid(), "VmHWM")
    result["children_hwm_kb"] = sum(status_kb(p, "VmHWM") for p in children)
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # DCP's checkpoint daemon (PROCESS) goes with its parent


if __name__ == "__main__":
    main()
