"""What tessera.jax's save hands back, and the memory its worker borrows (docs/jax.md,
"Borrowed memory").

A jax.Array never changes, so a save need not copy it while the trainer waits: each
shard's bytes are pinned (a numpy view of its buffer, which also keeps a later jit
from donating that buffer) and its address goes to the worker, which reads it as it
writes the checkpoint. The pins go once the worker no longer reads: at the commit,
at the save's failure, or once a memory checkpoint has copied them.
"""

import os
import threading

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


class PendingSave:
    """What Checkpointer.save returns at once. A thread asks the worker to take the
    save (it borrows the arrays' memory, or, where it cannot, the thread copies them
    into the worker's shared memory first) and holds the arrays until the worker no
    longer reads them. wait() waits for the commit and raises the save's error."""

    def __init__(self, start, step, pins=()):
        self.step = step
        self._handle, self._error = None, None
        self._pins = list(pins)
        self._started = threading.Event()
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start,), daemon=True,
                                        name="tessera-jax-save-%d" % step)
        self._thread.start()

    def _run(self, start):
        borrowing = False
        try:
            self._handle, borrowing = start()
        except BaseException as e:  # noqa: BLE001 - raised again by wait()
            self._error = e
        finally:
            self._started.set()
        try:
            if borrowing:
                self._hold()
        finally:
            self._pins = []
            self._released.set()

    def _hold(self):
        """Until the save ends: committed, failed, or its worker gone."""
        while True:
            try:
                self._handle.wait(None)
                return
            except TesseraError as e:
                if e.code != "unavailable" or e.status == 0:
                    return  # failed for good, or the worker is unreachable: it reads no more
                self._released.wait(0.2)  # the worker is stopping; it may still write

    def snapshot_done(self):
        """Waits until the worker has taken (or refused) this save."""
        self._started.wait()

    def released(self, timeout=None):
        """Waits until the worker reads nothing more of this save's arrays; True if so."""
        return self._released.wait(timeout)

    def handle(self):
        """The SaveHandle once the worker took the save; raises the save's error."""
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self._handle

    def done(self):
        return self.handle().done()

    def wait(self, timeout=None):
        """Blocks until the checkpoint is committed; raises TesseraError if it failed."""
        return self.handle().wait(timeout)

    def __repr__(self):
        return "PendingSave(step=%r, %s)" % (self.step, self._handle or "starting")
