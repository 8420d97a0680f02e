"""Tessera from Python: the control plane (Client) and the trainer's side
(CheckpointManager) of sharded checkpoints, over Tessera's HTTP APIs.

    import tessera
    ckpt = tessera.CheckpointManager("train")          # env TESSERA_WORKER
    state = ckpt.attach_state_dict({"model": model, "optim": optimizer})
    ...
    ckpt.save(step)                                    # returns once snapshotted

Depends on the standard library and numpy; torch is imported only when asked for.
"""

from .client import Client, Job
from .errors import TesseraError
from .manager import CheckpointManager, IndexedSlices, PendingSave, Restored, SaveHandle

__version__ = "0.1.0"

__all__ = ["CheckpointManager", "Client", "IndexedSlices", "Job", "PendingSave", "Restored", "SaveHandle", "TesseraError",
           "init_optimizer_state", "__version__"]


def init_optimizer_state(optimizer):
    """Creates a torch optimizer's lazily made state (Adam, AdamW, SGD momentum)
    as its first step would, so that attach_state_dict can map it."""
    from ._torch_state import init_optimizer_state as init  # noqa: PLC0415 - lazy torch
    return init(optimizer)
