"""Orbax's CheckpointManager saving and restoring through Tessera (docs/jax.md).

    import orbax.checkpoint as ocp
    from tessera.orbax import Handler, TesseraSave, TesseraRestore

    mngr = ocp.CheckpointManager("/ckpt/run1", item_handlers=Handler("train"))
    mngr.save(step, args=TesseraSave(state))          # async: returns once staged
    state = mngr.restore(step, args=TesseraRestore(abstract_state))

Orbax keeps its step directories (and their atomic finalization); each holds one
small file naming the Tessera checkpoint (mesh and step) that holds the arrays,
saved by tessera.jax: every process hands its shards to its host's worker.
"""

import asyncio
import dataclasses
import json
import os
import re
from typing import Any, Optional

from orbax.checkpoint import args as ocp_args
from orbax.checkpoint import future as ocp_future
from orbax.checkpoint import utils as ocp_utils
from orbax.checkpoint.handlers import AsyncCheckpointHandler

from . import jax as tjax
from .errors import invalid_argument

__all__ = ["Handler", "TesseraSave", "TesseraRestore"]

_FILE = "tessera.json"


def _step_of(directory):
    """The step of an Orbax step directory's item ("<root>/12/state", or its
    temporary "<root>/12.orbax-checkpoint-tmp-.../state"): the first number of the
    nearest component that starts with one."""
    for part in reversed(os.fspath(directory).split(os.sep)):
        m = re.match(r"(\d+)", part)
        if m:
            return int(m.group(1))
    raise invalid_argument("cannot tell the step from Orbax's directory %s: pass "
                           "TesseraSave(item, step=...)" % directory, field="step")


class Handler(AsyncCheckpointHandler):
    """An Orbax AsyncCheckpointHandler for pytrees of jax.Arrays on Tessera mesh
    `mesh` (default env TESSERA_MESH); worker, timeout and save options (tier,
    compression, the memory tier's) as tessera.jax.Checkpointer takes them."""

    def __init__(self, mesh=None, worker=None, timeout=600.0, **save_options):
        mesh = mesh or os.environ.get("TESSERA_MESH")
        if not mesh:
            raise invalid_argument("Handler needs a Tessera mesh: pass mesh= or set "
                                   "TESSERA_MESH", field="mesh")
        self._ckpt = tjax.Checkpointer(mesh, worker=worker, timeout=timeout)
        self._options = save_options

    async def async_save(self, directory, args=None, item=None):
        args = args if args is not None else TesseraSave(item)
        step = args.step if args.step is not None else _step_of(directory)
        handle = self._ckpt.save(step, args.item, **self._options)  # the worker has the bytes
        record = {"mesh": self._ckpt.mesh, "step": step}

        async def commit():
            await asyncio.to_thread(handle.wait, self._ckpt.timeout)
            if ocp_utils.is_primary_host(0):
                (directory / _FILE).write_text(json.dumps(record))

        return [ocp_future.CommitFutureAwaitingContractedSignals(commit(), name="tessera_save")]

    def save(self, directory, args=None, item=None):
        async def run():
            for f in await self.async_save(directory, args=args, item=item):
                f.result()
        asyncio.run(run())

    def restore(self, directory, args=None, item=None):
        args = args if args is not None else TesseraRestore(item)
        record = json.loads((directory / _FILE).read_text())
        from_mesh = None if record["mesh"] == self._ckpt.mesh else record["mesh"]
        return self._ckpt.restore(int(record["step"]), args.item, from_mesh=from_mesh,
                                  strict=args.strict)

    def metadata(self, directory):
        path = directory / _FILE
        return json.loads(path.read_text()) if path.exists() else None

    def finalize(self, directory):
        """Nothing to do: the Tessera checkpoint committed before the file was written."""

    def close(self):
        self._ckpt.close()


@ocp_args.register_with_handler(Handler, for_save=True)
@dataclasses.dataclass
class TesseraSave(ocp_args.CheckpointArgs):
    """A pytree of jax.Arrays (and JSON leaves) to save; step defaults to Orbax's."""

    item: Any
    step: Optional[int] = None


@ocp_args.register_with_handler(Handler, for_restore=True)
@dataclasses.dataclass
class TesseraRestore(ocp_args.CheckpointArgs):
    """The target: the saved structure with jax.Arrays or ShapeDtypeStructs (with
    shardings) as array leaves."""

    item: Any
    strict: bool = True
