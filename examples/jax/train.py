"""A JAX training loop that checkpoints with Orbax's CheckpointManager through Tessera
(tessera.orbax) and resumes from the latest checkpoint; one process per host, each
with its worker (docs/jax.md).

    python train.py --proc P --nproc N --port PORT --mesh MESH --worker URL --dir DIR
                    [--steps 12] [--save-every 5] [--stop-at K]

Process 0 prints "step S loss L" for every step it trains.
"""

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "python"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import tessera.jax as tjax  # noqa: E402
from tessera.orbax import Handler, TesseraRestore, TesseraSave  # noqa: E402


def batch(step):
    rng = np.random.default_rng(step)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    return x, (x @ np.arange(128, dtype=np.float32).reshape(16, 8) / 100.0)


@jax.jit
def train_step(params, x, y):
    def loss_fn(p):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


def main():
    ap = argparse.ArgumentParser()
    for name in ("proc", "nproc", "port", "steps", "save-every", "stop-at"):
        ap.add_argument("--" + name, type=int, default={"steps": 12, "save-every": 5}.get(name))
    ap.add_argument("--mesh", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize("127.0.0.1:%d" % a.port, num_processes=a.nproc,
                               process_id=a.proc)
    mesh = jax.sharding.Mesh(tjax.mesh_devices((a.nproc, 2)), ("data", "model"))
    shardings = {"w": NamedSharding(mesh, P(None, "model")), "b": NamedSharding(mesh, P())}
    params = {"w": jax.device_put(jnp.zeros((16, 8), jnp.float32), shardings["w"]),
              "b": jax.device_put(jnp.zeros((8,), jnp.float32), shardings["b"])}
    mngr = ocp.CheckpointManager(a.dir, item_handlers=Handler(a.mesh, worker=a.worker))
    start = 0
    latest = mngr.latest_step()
    if latest is not None:  # resume: the params and the step as saved
        abstract = {"params": jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params),
            "step": 0}
        restored = mngr.restore(latest, args=TesseraRestore(abstract))
        params, start = restored["params"], restored["step"] + 1
    for step in range(start, a.steps):
        x, y = batch(step)
        params, loss = train_step(params, jnp.asarray(x), jnp.asarray(y))
        if a.proc == 0:
            print("step %d loss %r" % (step, float(loss)), flush=True)
        if step % a.save_every == a.save_every - 1:
            mngr.save(step, args=TesseraSave({"params": params, "step": step}))
        if a.stop_at is not None and step == a.stop_at:
            break
    mngr.wait_until_finished()
    mngr.close()
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
