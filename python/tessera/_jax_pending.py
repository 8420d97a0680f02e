"""What tessera.jax's save hands back, and the memory its worker borrows (docs/jax.md,
"Borrowed memory").

A jax.Array never changes, so a save need not copy it while the trainer waits: each
shard's bytes are pinned (a numpy view of its buffer, which also keeps a later jit
from donating that buffer) and its address goes to the worker, which reads it as it
writes the checkpoint. The pins go once the worker no longer reads: at the commit,
at the save's failure, or once a memory checkpoint has copied them.
"""

import os

import numpy as np

from .errors import TesseraError


def borrowed_shard(device, data, pins):
    """{"device", "address", "bytes"} of one shard's bytes, pinned in `pins`. On the CPU
    the view is the array's own buffer; elsewhere numpy copies it to the host once."""
    view = np.asarray(data)
    if not view.flags.c_contiguous:
        view = np.ascontiguousarray(view)
    pins.append(view)
    return lent_shard(device, view)


def lent_shard(device, view):
    """{"device", "address", "bytes"} of a contiguous numpy array of this process."""
    return {"device": int(device), "address": int(view.ctypes.data), "bytes": int(view.nbytes)}


def lent_tensor(name, dtype, shape, layout, shards):
    """One tensor of a borrow (a save) or into (a restore): its description and shards."""
    return {"name": name, "dtype": dtype, "shape": list(shape),
            "layout": layout or [None] * len(shape), "shards": shards}


# Buffers lent to a restore whose worker may still write them (its call failed on this
# side): never freed, so that a late write lands in memory nobody else uses.
_STRANDED = []


def aligned_empty(shape, dtype, align=64):
    """An uninitialized array whose data starts on an `align`-byte boundary: JAX's CPU
    client takes such a buffer as the array's own (device_put(may_alias=True)). (Huge
    pages were tried for the worker's first write into it: slower, 2 MiB zeroed at a
    time.)"""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + n].view(dtype).reshape(tuple(shape))


def strand(buffers):
    _STRANDED.append(buffers)


# Bytes only this process holds at their address: the worker reads them back to know
# that the process it would read or write is the caller (not one of the same number in
# another PID namespace).
_TOKEN = np.frombuffer(bytearray(os.urandom(16)), dtype=np.uint8)


def borrow_body(tensors):
    return {"pid": os.getpid(), "token": _TOKEN.tobytes().hex(),
            "token_address": int(_TOKEN.ctypes.data), "tensors": tensors}


def refused(error):
    """True when the worker cannot read this process's memory (another user, PID
    namespace or ptrace policy): the save copies instead."""
    return isinstance(error, TesseraError) and error.details.get("reason") == "borrow_refused"
