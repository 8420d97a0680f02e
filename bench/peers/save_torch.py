#!/usr/bin/python3
"""Checkpoint peers: torch.save/torch.load of a ~1 GiB float32 state dict, and
distributed checkpoint (DCP) save/load of the same dict sharded over N Gloo ranks.

State dict: 64 float32 tensors of 912*k x 1024 (k = 1..8, cycling) = 1.00 GiB.
Saves include fsync (torch.save: fsync of the file; DCP: FileSystemWriter(sync_files=True)).
"cold" loads first drop the files from the page cache (posix_fadvise DONTNEED),
"warm" loads read them again from cache. Files go to a temp dir under --dir
(default: the current directory; use the disk the project writes to) and are removed at the end.
torch 2.x has torch.distributed.checkpoint; torch 1.13 ships its prototype as
torch.distributed._shard.checkpoint (ShardedTensor only), which needs a small
shim to import on Python 3.11 (see _py311_shim). One JSON line per result.

  /usr/bin/python3 bench/peers/save_torch.py [--dir DIR] [--ranks 4] [--repeat 2]
"""
import argparse, copy, dataclasses, json, os, shutil, tempfile, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _py311_shim():
    """torch 1.13's _shard metadata uses a dataclass instance as a field default,
    which Python 3.11 rejects ("mutable default ... use default_factory").
    Turn such defaults into default_factory (a deep copy) before importing it."""
    orig = dataclasses._get_field

    def get_field(cls, name, tp, kw_only):
        f = cls.__dict__.get(name)
        if (isinstance(f, dataclasses.Field) and dataclasses.is_dataclass(f.default)
                and type(f.default).__hash__ is None):
            f.default_factory = lambda d=f.default: copy.deepcopy(d)
            f.default = dataclasses.MISSING
        return orig(cls, name, tp, kw_only)

    dataclasses._get_field = get_field


DCP_NOTE = None
try:
    import torch.distributed.checkpoint as dcp  # torch >= 2.0
except ImportError:
    try:
        _py311_shim()
        import torch.distributed._shard.checkpoint as dcp  # torch 1.13 prototype
        DCP_NOTE = "torch 1.13 prototype torch.distributed._shard.checkpoint, py3.11 dataclass shim"
    except Exception as e:  # noqa: BLE001 - report, don't crash
        dcp, DCP_NOTE = None, f"unavailable: {type(e).__name__}: {e}"

SHAPES = [(912 * (i % 8 + 1), 1024) for i in range(64)]
TOTAL = sum(r * c * 4 for r, c in SHAPES)


def out(**kw):
    print(json.dumps({"bench": "checkpoint", "bytes": TOTAL, **kw}), flush=True)


def drop_cache(path):
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def bench_torch_save(tmp, repeat):
    sd = {f"layer{i}.weight": torch.randn(s) for i, s in enumerate(SHAPES)}
    path = os.path.join(tmp, "model.pt")

    def save():
        with open(path, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())

    for r in range(repeat):
        t, _ = timed(save)
        out(op="torch.save+fsync", run=r, time_s=round(t, 3), GBps=round(TOTAL / t / 1e9, 3))
        for mode in ("cold", "warm"):
            if mode == "cold":
                drop_cache(tmp)
            t, got = timed(lambda: torch.load(path))
            out(op=f"torch.load_{mode}", run=r, time_s=round(t, 3), GBps=round(TOTAL / t / 1e9, 3))
            assert all(torch.equal(got[k], v) for k, v in sd.items())
            del got  # each load allocates fresh tensors: page faults are part of its cost


def sharded_state_dict(n, fill):
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(n)])
    make = sharded_tensor.rand if fill else sharded_tensor.zeros
    return {f"layer{i}.weight": make(spec, *s) for i, s in enumerate(SHAPES)}


def dcp_worker(rank, n, port, tmp, repeat):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=n)
    torch.manual_seed(rank)
    sd = sharded_state_dict(n, fill=True)
    for r in range(repeat):
        path = os.path.join(tmp, f"dcp{r}")
        dist.barrier()
        t, _ = timed(lambda: (dcp.save_state_dict(sd, dcp.FileSystemWriter(
            path, single_file_per_rank=True, sync_files=True)), dist.barrier()))
        if rank == 0:
            out(op="dcp.save", ranks=n, run=r, time_s=round(t, 3), GBps=round(TOTAL / t / 1e9, 3))
        for mode in ("cold", "warm"):
            sd2 = sharded_state_dict(n, fill=False)
            if mode == "cold" and rank == 0:
                drop_cache(path)
            dist.barrier()
            t, _ = timed(lambda: (dcp.load_state_dict(sd2, dcp.FileSystemReader(path)),
                                  dist.barrier()))
            if rank == 0:
                out(op=f"dcp.load_{mode}", ranks=n, run=r, time_s=round(t, 3),
                    GBps=round(TOTAL / t / 1e9, 3))
            for k, v in sd.items():
                assert torch.equal(v.local_shards()[0].tensor, sd2[k].local_shards()[0].tensor)
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--port", type=int, default=29512)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="peers-ckpt-", dir=a.dir)
    try:
        bench_torch_save(tmp, a.repeat)
        out(op="dcp", available=dcp is not None, torch=torch.__version__, note=DCP_NOTE)
        if dcp is not None:
            mp.spawn(dcp_worker, args=(a.ranks, a.port, tmp, a.repeat), nprocs=a.ranks)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
