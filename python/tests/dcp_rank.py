"""One rank of tests/test_dcp.py: a gloo process group, a DTensor state dict, saved
through tessera.dcp with dcp.save or dcp.async_save, then loaded back.

    dcp_rank.py RANK WORLD PORT MESH WORKER_URL MODE STEP [load|save|both]

MODE: sync, nocoll (use_collectives=False), thread, process or fsdp. Prints one JSON line: what this rank saw.
"""

import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard, distribute_tensor  # noqa: E402

from tessera.dcp import Reader, Writer  # noqa: E402


def state(mesh, seed):
    """The same global values on every rank for a seed; each rank holds its shards."""
    g = torch.Generator().manual_seed(seed)
    even = torch.randn(16, 8, generator=g)
    uneven = torch.randn(10, 3, generator=g)        # 10 rows over 4 ranks: not even
    cols = torch.randn(4, 12, generator=g)          # sharded on dim 1
    bias = torch.randn(8, generator=g)              # a plain tensor every rank holds
    half = torch.randn(8, 4, generator=g).to(torch.bfloat16)
    counts = torch.arange(6, dtype=torch.int64) * seed
    return {
        "model": {"w": distribute_tensor(even, mesh, [Shard(0)]),
                  "u": distribute_tensor(uneven, mesh, [Shard(0)]),
                  "c": distribute_tensor(cols, mesh, [Shard(1)]),
                  "r": distribute_tensor(bias.clone(), mesh, [Replicate()]),
                  "bias": bias, "half": half},
        "optim": {"count": counts, "lr": 0.5 * seed},
        "extra": {"step": seed, "loader": {"position": 1000 + seed, "files": ["a", "b"]}},
        # A non-tensor only this rank holds (a dataloader's position per rank).
        "ranks": {"r%d" % dist.get_rank(): {"position": 100 * seed + dist.get_rank()}},
    }


def fsdp(mesh, seed, steps):
    """An FSDP2 model (fully_shard per layer and at the root) and its AdamW, trained
    `steps` steps on data of `seed`; its DTensor state dict as DCP's users take it."""
    from torch import nn  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: PLC0415
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        model(torch.randn(4, 16, generator=g)).sum().backward()
        optim.step()
        optim.zero_grad()
    model_sd, optim_sd = get_state_dict(model, optim)
    return model, optim, {"model": model_sd, "optim": optim_sd}


def zeros_like(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out[k] = zeros_like(v)
        elif isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v)
        else:
            out[k] = None
    return out


def same(a, b):
    if isinstance(a, dict):
        return all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        la = a.to_local() if hasattr(a, "to_local") else a
        lb = b.to_local() if hasattr(b, "to_local") else b
        return la.dtype == lb.dtype and torch.equal(la.view(torch.uint8) if la.dim() else la,
                                                     lb.view(torch.uint8) if lb.dim() else lb)
    return a == b


def main():
    rank, world, port, mesh_name, worker, mode, step = sys.argv[1:8]
    what = sys.argv[8] if len(sys.argv) > 8 else "both"
    rank, world, step = int(rank), int(world), int(step)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    writer_args = json.loads(os.environ.get("DCP_WRITER_ARGS", "{}"))
    if int(os.environ.get("DCP_DIE_RANK", "-1")) == rank:
        def die(*args, **kwargs):
            os._exit(9)  # killed mid-save: after planning, before its worker saves
        Writer.write_data = die
    mesh = init_device_mesh("cpu", (world,))
    seen = {"rank": rank}
    if mode == "fsdp":  # save an FSDP2 model and optimizer; load into another, bit for bit
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: PLC0415
        _, _, saved = fsdp(mesh, step, steps=2)
        dcp.save(saved, storage_writer=Writer(mesh=mesh_name, step=step, worker=worker))
        model, optim, target = fsdp(mesh, step + 100, steps=1)
        dcp.load(target, storage_reader=Reader(mesh=mesh_name, worker=worker))
        set_state_dict(model, optim, model_state_dict=target["model"],
                       optim_state_dict=target["optim"])
        model_sd, optim_sd = get_state_dict(model, optim)
        seen["same"] = same(saved, {"model": model_sd, "optim": optim_sd})
        seen["params"] = len(saved["model"])
        finish(seen)
    if mode == "twice":  # two async saves from one process: the second's placement changed
        first = state(mesh, step)
        dcp.async_save(first, storage_writer=Writer(mesh=mesh_name, step=step, worker=worker)).result()
        second = state(mesh, step + 1)
        second["model"]["grown"] = torch.arange(7, dtype=torch.float32)  # a new tensor: packed
        dcp.async_save(second, storage_writer=Writer(mesh=mesh_name, step=step + 1,
                                                     worker=worker)).result()
        third = state(mesh, step + 2)  # the first's placement again, other values
        dcp.async_save(third, storage_writer=Writer(mesh=mesh_name, step=step + 2,
                                                    worker=worker)).result()
        ok = []
        for s_, expected in ((step, first), (step + 1, second), (step + 2, third)):
            target = zeros_like(expected)
            target["model"] = {k: (distribute_tensor(torch.zeros(v.shape, dtype=v.dtype), mesh,
                                                     v.placements) if hasattr(v, "placements")
                                   else torch.zeros_like(v)) for k, v in expected["model"].items()}
            dcp.load(target, storage_reader=Reader(mesh=mesh_name, step=s_, worker=worker))
            ok.append(same(expected, target))
        seen["same"] = all(ok)
        seen["each"] = ok
        finish(seen)
    sd = state(mesh, step)
    if what in ("save", "both"):
        writer = Writer(mesh=mesh_name, step=step, worker=worker, timeout=120, **writer_args)
        if mode in ("sync", "nocoll"):
            try:
                dcp.save(sd, storage_writer=writer, use_collectives=(mode == "sync"))
            except BaseException as e:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
                print(json.dumps({"rank": rank, "error": "%s: %s" % (type(e).__name__, e)}),
                      flush=True)
                os._exit(0)
        else:
            kind = AsyncCheckpointerType.PROCESS if mode == "process" else AsyncCheckpointerType.THREAD
            future = dcp.async_save(sd, storage_writer=writer, async_checkpointer_type=kind)
            # The state may change as soon as async_save returns: the staged copy is saved.
            kept = sd["model"]["bias"].clone()
            sd["model"]["bias"].add_(1000)
            future.result()
            sd["model"]["bias"].copy_(kept)
        seen["saved"] = step
    if what in ("load", "both", "load_extra"):
        target = zeros_like(sd)
        target["model"] = {k: (distribute_tensor(torch.zeros(v.shape, dtype=v.dtype), mesh,
                                                 v.placements) if hasattr(v, "placements")
                               else torch.zeros_like(v)) for k, v in sd["model"].items()}
        if what == "load_extra":  # a key the checkpoint lacks
            target["model"]["not_saved"] = torch.zeros(3)
        reader = Reader(mesh=mesh_name, worker=worker, timeout=120)
        try:
            dcp.load(target, storage_reader=reader)
        except BaseException as e:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
            print(json.dumps({"rank": rank, "error": "%s: %s" % (type(e).__name__, e)}), flush=True)
            os._exit(0)
        seen["restored_step"] = None if reader.restored is None else int(reader.restored)
        seen["tier"] = None if reader.restored is None else reader.restored.tier
        seen["same"] = same(sd, target)
        if not seen["same"]:
            seen["diff"] = {k: str(target["extra"].get(k)) for k in sd["extra"]}
    finish(seen)


def finish(seen):
    """Prints what this rank saw once every rank is done, and exits: the process group
    is not torn down, since a peer that exits first can fail gloo's teardown here."""
    dist.barrier()
    print(json.dumps(seen), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
