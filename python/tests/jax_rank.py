"""One JAX process of tests/test_jax.py: 2 CPU devices, jax.distributed over localhost,
its own worker; saves or restores a pytree of sharded arrays through tessera.jax, or
runs the multihost utils beside JAX's own.

    jax_rank.py PROC NPROC PORT MESH WORKER MODE STEP [ARGS_JSON]

MODE: save, restore, orbax (Orbax's CheckpointManager with tessera.orbax), multihost. Prints one JSON line: what this process saw.
"""

import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import tessera.jax as tjax  # noqa: E402

SHAPES = {  # path: (shape, dtype)
    "params/w": ((16, 8), np.float32),
    "params/b": ((8,), ml_dtypes.bfloat16),
    "params/r": ((4, 4), np.float32),
    "opt/count": ((), np.int32),
    "opt/mu": ((6, 8), np.float32),
}
SAVE_SPECS = {"params/w": P("data", "model"), "params/b": P("data"), "params/r": P(),
              "opt/count": P(), "opt/mu": P(None, "model")}


def global_values(seed):
    rng = np.random.default_rng(seed)
    out = {}
    for path, (shape, dtype) in SHAPES.items():
        if np.dtype(dtype).kind == "i":
            out[path] = np.asarray(rng.integers(-1000, 1000, size=shape), dtype=dtype)
        else:
            out[path] = rng.standard_normal(shape).astype(dtype)
    return out


def nest(flat, extra):
    tree = {}
    for path, v in flat.items():
        group, leaf = path.split("/")
        tree.setdefault(group, {})[leaf] = v
    tree.update(extra)
    return tree


def make_state(mesh, specs, seed):
    values = global_values(seed)
    flat = {}
    for path, spec in specs.items():
        g = values[path]
        flat[path] = jax.make_array_from_callback(g.shape, NamedSharding(mesh, spec),
                                                  lambda idx, g=g: g[idx])
    return nest(flat, {"step": seed, "note": "seed %d" % seed})


def target(mesh, specs):
    flat = {path: jax.ShapeDtypeStruct(SHAPES[path][0], SHAPES[path][1],
                                       sharding=NamedSharding(mesh, spec))
            for path, spec in specs.items()}
    return nest(flat, {"step": 0, "note": ""})


def same_as(state, seed):
    """Every addressable shard of every array equals the seed's values, bit for bit."""
    values = global_values(seed)
    for path in SHAPES:
        group, leaf = path.split("/")
        arr = state[group][leaf]
        for shard in arr.addressable_shards:
            want = np.ascontiguousarray(values[path][shard.index])
            got = np.ascontiguousarray(np.asarray(shard.data))
            if got.dtype != want.dtype or got.tobytes() != want.tobytes():
                return "%s differs on device %d" % (path, shard.device.id)
    if state["step"] != seed or state["note"] != "seed %d" % seed:
        return "non-array leaves %r %r" % (state["step"], state["note"])
    return True


def main():
    proc, nproc, port, mesh_name, worker, mode, step = sys.argv[1:8]
    args = json.loads(sys.argv[8]) if len(sys.argv) > 8 else {}
    proc, nproc, step = int(proc), int(nproc), int(step)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize("127.0.0.1:%s" % port, num_processes=nproc, process_id=proc)
    shape = tuple(args.get("shape", (nproc, 2)))
    mesh = jax.sharding.Mesh(tjax.mesh_devices(shape), ("data", "model"))
    ckpt = tjax.Checkpointer(mesh_name, worker=worker, timeout=120)
    seen = {"proc": proc}
    if mode == "save":
        state = make_state(mesh, SAVE_SPECS, step)
        if args.get("die") == proc:
            # Killed mid-save: part of its shards copied to its worker, its save never started.
            entry, placed = ckpt._place("params/w", "['params']['w']", state["params"]["w"])
            ckpt._copy(entry["name"], entry["shape"], entry["dtype"], entry["layout"], placed)
            os._exit(3)
        if args.get("copy"):
            ckpt._borrow = False  # as where the worker cannot read this process
        try:
            handle = ckpt.save(step, state, **args.get("save", {}))
            seen["borrowed"] = handle.handle().borrowing
            # The arrays may change once save() returned: the checkpoint keeps the old values.
            state["params"]["w"] = state["params"]["w"] + 1
            handle.wait(120)
            seen["saved"] = step
        except tjax.TesseraError as e:
            seen["error"] = {"code": e.code, "message": str(e)}
    elif mode == "restore":
        specs = {k: P(*v) for k, v in args["specs"].items()} if "specs" in args else SAVE_SPECS
        got = ckpt.restore(None if args.get("latest") else step, target(mesh, specs),
                           from_mesh=args.get("from_mesh"))
        seen["same"] = same_as(got, step)
        if ckpt.restored is not None:
            seen["tier"], seen["source"] = ckpt.restored.tier, ckpt.restored.source
    elif mode == "orbax":
        import orbax.checkpoint as ocp  # noqa: PLC0415
        from tessera.orbax import Handler, TesseraRestore, TesseraSave  # noqa: PLC0415
        mngr = ocp.CheckpointManager(args["dir"], item_handlers=Handler(mesh_name, worker=worker,
                                                                         timeout=120))
        mngr.save(step, args=TesseraSave(make_state(mesh, SAVE_SPECS, step)))
        mngr.wait_until_finished()
        got = mngr.restore(step, args=TesseraRestore(target(mesh, SAVE_SPECS)))
        seen["same"] = same_as(got, step)
        seen["steps"] = [int(s) for s in mngr.all_steps()]
        mngr.close()
    elif mode == "multihost":
        from jax.experimental import multihost_utils as mu  # noqa: PLC0415
        tjax.sync_global_devices("start", timeout=60)
        x = np.arange(6, dtype=np.float32).reshape(2, 3) * (proc + 1) - 0.0
        tree = {"x": x, "n": np.int32(proc * 7), "h": np.asarray([proc, -proc], np.float32)}
        for ours, theirs in ((tjax.broadcast_one_to_all(tree), mu.broadcast_one_to_all(tree)),
                             (tjax.process_allgather(tree), mu.process_allgather(tree)),
                             (tjax.process_allgather(tree, tiled=True),
                              mu.process_allgather(tree, tiled=True))):
            for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
                b = np.asarray(b)
                if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
                    seen["differs"] = [a.tolist(), b.tolist()]
        tjax.assert_equal({"same": np.ones(3, np.float32)})
        try:
            tjax.assert_equal({"mine": np.float32(proc == 2)}, "step counters")
            seen["assert"] = "passed"
        except AssertionError as e:
            seen["assert"] = str(e)
        if proc != nproc - 1:  # the last process does not come
            try:
                tjax.sync_global_devices("late", timeout=2)
                seen["late"] = "passed"
            except Exception as e:  # noqa: BLE001
                seen["late"] = {"code": getattr(e, "code", None),
                                "missing": getattr(e, "details", {}).get("missing_processes")}
    print(json.dumps(seen), flush=True)
    if "die" in args:
        os._exit(0)  # a process was killed: jax.distributed's shutdown would wait for it
    jax.distributed.shutdown()  # together: a process that left first would fail the others


if __name__ == "__main__":
    main()
