"""Tessera as a storage backend of PyTorch Distributed Checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    from tessera.dcp import Reader, Writer

    dcp.save(state_dict, storage_writer=Writer(mesh="train", step=step))
    dcp.async_save(state_dict, storage_writer=Writer(mesh="train", step=step))  # stages once
    dcp.load(state_dict, storage_reader=Reader(mesh="train"))                 # the latest step

Each rank's items go to its host's worker through the worker's shared memory (no
pickling of tensor bytes) and the ranks' saves commit one Tessera checkpoint: listed
by REST, verifiable, restorable by CheckpointManager, exported to safetensors. How a
state dict becomes Tessera tensors: _dcp_layout.py; the whole story: docs/dcp.md.
"""

from ._dcp_reader import Reader
from ._dcp_writer import Writer

__all__ = ["Reader", "Writer"]

# Their home for pickling (DCP's PROCESS mode) and for reprs: the public module.
Writer.__module__ = Reader.__module__ = __name__
