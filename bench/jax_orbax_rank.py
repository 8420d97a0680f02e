"""One JAX process of bench/jax_orbax.py: 2 CPU devices, jax.distributed over localhost.

    jax_orbax_rank.py PROC NPROC PORT MODE DIR [WORKER MESH]

MODE: multihost-tessera (the multihost utils, ours and JAX's), save-tessera, save-orbax (async saves: blocked and durable times), restore-tessera,
restore-orbax (cold page cache), reshard-save-tessera / reshard-save-orbax (one save by 4
processes), reshard-tessera / reshard-orbax (a restore of it by 2 processes onto a 2 x 2
mesh with other shardings). Prints one JSON line.
"""

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils as mu  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import tessera.jax as tjax  # noqa: E402
from dcp_rank import drop_cache  # noqa: E402 - bench/, beside this script
from proc_status import reset_peak, status_kb  # noqa: E402

ROUNDS = 4
# 1 GiB in all: 6 float32 and 2 bfloat16 arrays of 128 MiB.
LEAVES = [("f%d" % i, (8192, 4096), np.float32) for i in range(6)] + \
         [("h%d" % i, (8192, 8192), ml_dtypes.bfloat16) for i in range(2)]


BLOCK = 1024  # rows generated together: values depend on the position, not the sharding


def make_state(mesh, spec, seed):
    state = {}
    for k, (name, shape, dtype) in enumerate(LEAVES):
        def shard(idx, shape=shape, dtype=dtype, k=k):
            r0, r1, _ = idx[0].indices(shape[0])
            c0, c1, _ = idx[1].indices(shape[1])
            rows = []
            for b in range(r0 // BLOCK, (r1 - 1) // BLOCK + 1):
                block = np.random.default_rng([seed, k, b]).random((BLOCK, shape[1]),
                                                                   dtype=np.float32)
                lo, hi = max(r0, b * BLOCK) - b * BLOCK, min(r1, (b + 1) * BLOCK) - b * BLOCK
                rows.append(block[lo:hi, c0:c1])
            return np.concatenate(rows).astype(dtype)
        state[name] = jax.make_array_from_callback(shape, NamedSharding(mesh, spec), shard)
    return state


def abstract(mesh, spec):
    return {name: jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
            for name, shape, dtype in LEAVES}


def timed(fn):
    mu.sync_global_devices("bench")
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def main():
    proc, nproc, port, mode, out_dir = sys.argv[1:6]
    worker, mesh_name = (sys.argv[6], sys.argv[7]) if len(sys.argv) > 7 else (None, None)
    proc, nproc = int(proc), int(nproc)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize("127.0.0.1:%s" % port, num_processes=nproc, process_id=proc)
    shape = (nproc, 2) if nproc == 4 else (2, 2)
    mesh = jax.sharding.Mesh(tjax.mesh_devices(shape), ("data", "model"))
    spec = P("data", "model") if nproc == 4 else P("model", "data")
    ours = "tessera" in mode
    ckpt = tjax.Checkpointer(mesh_name, worker=worker, timeout=600) if ours else None
    mngr = None
    if not ours:
        import orbax.checkpoint as ocp  # noqa: PLC0415
        mngr = ocp.CheckpointManager(os.path.join(out_dir, "orbax"), options=ocp.CheckpointManagerOptions(
            enable_async_checkpointing=True))
    result = {"proc": proc, "mode": mode}
    root = os.environ.get("BENCH_ROOT") if ours else os.path.join(out_dir, "orbax")

    def save(step, state):
        if ours:
            return ckpt.save(step, state)
        import orbax.checkpoint as ocp  # noqa: PLC0415
        mngr.save(step, args=ocp.args.StandardSave(state))
        return mngr

    def wait(handle):
        if ours:
            handle.wait(600)
        else:
            handle.wait_until_finished()

    def restore(step, target, from_mesh=None):
        if ours:
            got = ckpt.restore(step, target, from_mesh=from_mesh)
        else:
            import orbax.checkpoint as ocp  # noqa: PLC0415
            got = mngr.restore(step, args=ocp.args.StandardRestore(target))
        jax.block_until_ready(got)
        return got

    if mode.startswith("save"):
        state = make_state(mesh, spec, 1)
        reset_peak(os.getpid())  # make_state's own peak is not the saves'
        result["rss_before_kb"] = status_kb(os.getpid(), "VmRSS")
        blocked, durable = [], []
        for step in range(1, ROUNDS + 1):
            b, handle = timed(lambda: save(step, state))  # noqa: B023
            t0 = time.perf_counter()
            wait(handle)
            blocked.append(b)
            durable.append(b + time.perf_counter() - t0)
        result.update(blocked_s=blocked[1:], durable_s=durable[1:],
                      hwm_kb=status_kb(os.getpid(), "VmHWM"))
    elif mode.startswith("restore"):
        wait(save(1, make_state(mesh, spec, 1)))
        took = []
        for _ in range(ROUNDS):
            mu.sync_global_devices("drop")
            if proc == 0:
                drop_cache(root)
            s, _ = timed(lambda: restore(1, abstract(mesh, spec)))
            took.append(s)
        result.update(restore_s=took[1:])
    elif mode.startswith("multihost"):
        # Latency of the multihost utils: ours over Tessera, JAX's over gloo, alternating.
        small = np.arange(256, dtype=np.float32) + proc        # 1 KiB
        big = np.full(1 << 18, proc, dtype=np.float32)          # 1 MiB
        calls = {"sync": (lambda i: tjax.sync_global_devices("b%d" % i),
                          lambda i: mu.sync_global_devices("b%d" % i)),
                 "gather_1k": (lambda i: tjax.process_allgather(small),
                               lambda i: mu.process_allgather(small)),
                 "gather_1m": (lambda i: tjax.process_allgather(big),
                               lambda i: mu.process_allgather(big))}
        for what, (ours_fn, jax_fn) in calls.items():
            took = {"ours": [], "jax": []}
            for i in range(ROUNDS * 8):
                for who, fn in (("ours", ours_fn), ("jax", jax_fn)):
                    t0 = time.perf_counter()
                    fn(i)
                    took[who].append(time.perf_counter() - t0)
            result[what + "_ours_s"] = took["ours"][1:]
            result[what + "_jax_s"] = took["jax"][1:]
    elif mode.startswith("reshard-save"):
        wait(save(1, make_state(mesh, spec, 1)))
    elif mode.startswith("reshard"):
        if proc == 0:
            drop_cache(root)
        s, got = timed(lambda: restore(1, abstract(mesh, spec),
                                       from_mesh=os.environ.get("BENCH_FROM_MESH")))
        want = make_state(mesh, spec, 1)
        result["same"] = all(np.array_equal(np.asarray(a.addressable_shards[0].data),
                                            np.asarray(b.addressable_shards[0].data))
                             for a, b in zip(jax.tree_util.tree_leaves(got),
                                             jax.tree_util.tree_leaves(want)))
        result["restore_s"] = [s]
    if mngr is not None:
        mngr.close()
    print(json.dumps(result), flush=True)
    jax.distributed.shutdown()  # together: a process that left first would fail the others


if __name__ == "__main__":
    main()
