"""jax.experimental.multihost_utils over Tessera's barrier and process-level
collectives (docs/collectives.md), with timeouts: a process that does not come is
named (details.missing_processes) instead of a hang.

Each takes `ckpt` (a tessera.jax.Checkpointer; default: the last one this process
made) and `timeout` in seconds (default 30). Results are numpy arrays, as JAX's are;
broadcast_one_to_all and process_allgather give JAX's results bit for bit.
"""

import threading

import numpy as np

import jax

from ._collectives import MARGIN_S
from ._dtypes import dtype_name, numpy_dtype, parse_shape, shape_text
from .errors import TesseraError, invalid_argument

_DEFAULT = []  # the last Checkpointer made in this process
_LOCK = threading.Lock()


def remember(ckpt):
    with _LOCK:
        _DEFAULT[:] = [ckpt]


def _ckpt(ckpt):
    if ckpt is not None:
        return ckpt
    with _LOCK:
        if not _DEFAULT:
            raise invalid_argument("no tessera.jax.Checkpointer in this process: make one, or "
                                   "pass ckpt=", field="ckpt")
        return _DEFAULT[0]


def _timeout_ms(timeout):
    return int(1000 * (30.0 if timeout is None else float(timeout)))


def _named(ckpt, e):
    """Tessera's error with the processes (workers' ranks in the mesh) it names."""
    workers = e.details.get("missing_workers") or []
    if not workers:
        return e
    order = ckpt.workers()
    processes = sorted(order.index(w) for w in workers if w in order)
    details = dict(e.details, missing_processes=processes)
    return TesseraError(e.code, "%s (processes %s did not come)" % (e.message, processes),
                        e.status, details)


def sync_global_devices(name, timeout=None, ckpt=None):
    """Waits until every process of the mesh reaches the barrier `name`; on a timeout
    raises TesseraError (deadline_exceeded) naming the processes that did not."""
    ckpt = _ckpt(ckpt)
    try:
        ckpt.manager.barrier(name, timeout_ms=_timeout_ms(timeout))
    except TesseraError as e:
        raise _named(ckpt, e) from None


def _call(ckpt, op, x, timeout, **params):
    arr = np.asarray(x)
    if not arr.flags.c_contiguous:
        arr = arr.copy()  # not ascontiguousarray: it makes a scalar one-dimensional
    dtype = dtype_name(arr.dtype, field="x")
    ms = _timeout_ms(timeout)
    q = ckpt.manager._q(dtype=dtype, shape=shape_text(arr.shape), timeout_ms=ms, **params)
    try:
        _, headers, out = ckpt.manager._http.call(
            "POST", "/v1/collectives/%s%s" % (op, q), memoryview(arr.reshape(-1).view(np.uint8)),
            timeout=ms / 1000.0 + MARGIN_S)
    except TesseraError as e:
        raise _named(ckpt, e) from None
    shape = parse_shape(headers.get("X-Tessera-Shape", ""))
    result = np.frombuffer(bytearray(out), dtype=numpy_dtype(headers.get("X-Tessera-Dtype", dtype)))
    if op == "process_allgather" and arr.ndim == 0:
        return result.reshape(-1)  # scalars stack to [processes], tiled or not, as JAX's
    return result.reshape(shape)


def broadcast_one_to_all(in_tree, is_source=None, timeout=None, ckpt=None):
    """Every process gets the source's values (process 0's unless is_source says)."""
    ckpt = _ckpt(ckpt)
    leaves, treedef = jax.tree_util.tree_flatten(in_tree)
    src = None if is_source is None else ("true" if is_source else "false")
    out = [_call(ckpt, "broadcast_one_to_all", x, timeout, is_source=src) for x in leaves]
    return jax.tree_util.tree_unflatten(treedef, out)


def process_allgather(in_tree, tiled=False, timeout=None, ckpt=None):
    """Every process's values stacked on a new first axis (tiled: concatenated)."""
    ckpt = _ckpt(ckpt)
    leaves, treedef = jax.tree_util.tree_flatten(in_tree)
    out = [_call(ckpt, "process_allgather", x, timeout, tiled="true" if tiled else None)
           for x in leaves]
    return jax.tree_util.tree_unflatten(treedef, out)


def assert_equal(in_tree, fail_message="", timeout=None, ckpt=None):
    """Raises AssertionError (with Tessera's error, naming the processes that differ)
    unless every process holds the same values."""
    ckpt = _ckpt(ckpt)
    gathered = process_allgather(in_tree, timeout=timeout, ckpt=ckpt)
    differing = set()
    for leaf in jax.tree_util.tree_leaves(gathered):
        rows = np.ascontiguousarray(leaf).reshape(leaf.shape[0], -1).view(np.uint8)
        for p in range(1, rows.shape[0]):
            if not np.array_equal(rows[p], rows[0]):
                differing.add(p)
    if differing:
        raise AssertionError("%s: processes %s differ from process 0" % (
            fail_message or "assert_equal", sorted(differing)))
