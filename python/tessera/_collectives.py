"""The collectives of CheckpointManager (a mixin): SPMD calls through the worker's
local API (POST /v1/collectives/{op}, /v1/barriers/{name}, GET /v1/preemption)."""

import collections

import numpy as np

from . import _dtypes
from ._dtypes import parse_shape, shape_text
from ._http import quote
from .errors import invalid_argument

# Seconds added to a server-side wait for the socket timeout.
MARGIN_S = 10.0


class IndexedSlices(collections.namedtuple("IndexedSlices", "values indices dense_shape path")):
    """The result of sparse_all_reduce: rows `indices` of a tensor of `dense_shape`
    hold `values` (repeated indices add up); `path` is "gather" or "dense"."""

    __slots__ = ()

    def dense(self):
        """The dense tensor: the rows of equal indices summed."""
        if hasattr(self.values, "index_add_"):
            torch = _dtypes.torch_module()
            out = torch.zeros(self.dense_shape, dtype=self.values.dtype)
            return out.index_add_(0, self.indices.long(), self.values)
        out = np.zeros(self.dense_shape, dtype=self.values.dtype)
        np.add.at(out, self.indices, self.values)
        return out


class Collectives:
    """all_reduce, all_gather, broadcast, sparse_all_reduce, barrier and the
    preemption sync point. Needs self._http, _q, _post, _get, devices, worker, mesh."""

    def _collective(self, op, x, timeout_ms, params):
        data, dtype, shape, kind = _to_bytes(x)
        ndev = len(self.devices)
        if ndev > 1:
            if not shape or shape[0] != ndev:
                raise invalid_argument(
                    "worker %s holds %d devices of mesh %s: stack their inputs on a first axis "
                    "of %d, not shape %s" % (self.worker, ndev, self.mesh, ndev, list(shape)),
                    field="shape")
            shape = shape[1:]
        params = dict(params, dtype=dtype, shape=shape_text(shape), timeout_ms=timeout_ms)
        wait_s = (timeout_ms if timeout_ms is not None else 30000) / 1000.0
        _, headers, out = self._http.call(
            "POST", "/v1/collectives/%s%s" % (op, self._q(**params)), data,
            timeout=wait_s + MARGIN_S)
        out_shape = parse_shape(headers.get("X-Tessera-Shape", ""))
        outputs = int(headers.get("X-Tessera-Outputs", "1"))
        if ndev > 1:
            out_shape = (outputs,) + out_shape
        return _from_bytes(out, headers.get("X-Tessera-Dtype", dtype), out_shape, kind)

    def all_reduce(self, x, reduce="mean", axes=None, timeout_ms=None, check_inf_nan=False,
                   out=None):
        """All-reduces `x` (numpy array or torch tensor) with the same call on every
        worker of the mesh (along `axes`, default all). Returns the result as the
        same kind of array, or writes it into `out` (which may be `x`) and returns
        `out`. With several devices per worker, x stacks their inputs on axis 0."""
        params = {"reduce": reduce, "axes": _axes_text(axes)}
        if check_inf_nan:
            params["check_inf_nan"] = "true"
        result = self._collective("all_reduce", x, timeout_ms, params)
        if out is None:
            return result
        if hasattr(out, "copy_"):
            out.copy_(result.reshape(out.shape))
        else:
            np.copyto(out, result.reshape(out.shape))
        return out

    def all_gather(self, x, axes=None, tiled=False, timeout_ms=None):
        """All-gathers `x` along `axes`: stacked on a new axis, or concatenated
        along axis 0 when tiled."""
        return self._collective("all_gather", x, timeout_ms,
                                {"axes": _axes_text(axes), "tiled": "true" if tiled else None})

    def broadcast(self, x, root=0, axes=None, timeout_ms=None):
        """Every device gets the input of group position `root`."""
        return self._collective("broadcast", x, timeout_ms, {"axes": _axes_text(axes),
                                                               "root": root})

    def sparse_all_reduce(self, values, indices, dense_shape, axes=None, path="auto",
                          timeout_ms=None):
        """Sums indexed slices (TF's IndexedSlices) with the same call on every worker
        of the mesh (along `axes`, default all): row i of `values` belongs at row
        indices[i] (int32 or int64) of a tensor of `dense_shape`. When every worker
        brings as many rows, values and indices are gathered (path "gather");
        otherwise each worker densifies and the dense tensors are all-reduced
        ("dense"); path="gather" or "dense" forces one. Both densify to the same
        sum. Returns IndexedSlices(values, indices, dense_shape, path), of the kind
        given (numpy or torch). With several devices per worker, values and indices
        are lists with one entry per device, and so is the result."""
        ndev = len(self.devices)
        many = ndev > 1
        vals, idxs = (list(values), list(indices)) if many else ([values], [indices])
        if len(vals) != ndev or len(idxs) != ndev:
            raise invalid_argument(
                "worker %s holds %d devices of mesh %s: pass a list of %d values and of %d "
                "indices" % (self.worker, ndev, self.mesh, ndev, ndev), field="values")
        dense_shape = tuple(int(d) for d in dense_shape)
        parts, rows, dtype, index_dtype, kind = [], [], None, None, None
        for v, i in zip(vals, idxs):
            vdata, vdtype, vshape, kind = _to_bytes(v)
            idata, idtype, ishape, _ = _to_bytes(i)
            if idtype not in ("int32", "int64") or len(ishape) != 1:
                raise invalid_argument("indices must be int32 or int64 with one dimension, not "
                                       "%s%s" % (idtype, list(ishape)), field="indices")
            if dtype not in (None, vdtype) or index_dtype not in (None, idtype):
                raise invalid_argument("every device's values and indices must have the same "
                                       "dtypes", field="values")
            if not vshape or vshape[0] != ishape[0]:
                raise invalid_argument("%d indices for values of shape %s" % (ishape[0],
                                                                             list(vshape)),
                                       field="indices")
            dtype, index_dtype = vdtype, idtype
            parts += [bytes(vdata), bytes(idata)]
            rows.append(vshape[0])
        params = {"dtype": dtype, "dense_shape": shape_text(dense_shape),
                  "rows": ",".join(str(r) for r in rows), "index_dtype": index_dtype,
                  "axes": _axes_text(axes), "path": path, "timeout_ms": timeout_ms}
        wait_s = (timeout_ms if timeout_ms is not None else 30000) / 1000.0
        _, headers, out = self._http.call(
            "POST", "/v1/collectives/sparse_all_reduce%s" % self._q(**params), b"".join(parts),
            timeout=wait_s + MARGIN_S)
        out_rows = [int(r) for r in headers.get("X-Tessera-Rows", "").split(",") if r]
        paths = headers.get("X-Tessera-Sparse-Path", "").split(",")
        row_bytes = int(np.prod(dense_shape[1:], dtype=np.int64)) * \
            np.dtype(_dtypes.numpy_dtype(dtype)).itemsize
        index_bytes = 4 if index_dtype == "int32" else 8
        results, offset = [], 0
        for k, taken in zip(out_rows, paths):
            vb = out[offset:offset + k * row_bytes]
            ib = out[offset + len(vb):offset + len(vb) + k * index_bytes]
            offset += len(vb) + len(ib)
            results.append(IndexedSlices(_from_bytes(vb, dtype, (k,) + dense_shape[1:], kind),
                                         _from_bytes(ib, index_dtype, (k,), kind),
                                         dense_shape, taken))
        return results if many else results[0]

    def barrier(self, name, timeout_ms=None):
        """Waits until every worker of the mesh reaches the barrier `name`."""
        wait_s = (timeout_ms if timeout_ms is not None else 30000) / 1000.0
        return self._post("/v1/barriers/%s%s" % (quote(name), self._q(timeout_ms=timeout_ms)),
                          {}, timeout=wait_s + MARGIN_S)

    def reached_preemption_sync_point(self, step, timeout_ms=None):
        """False until a preemption notice; then True exactly at the agreed step."""
        wait_s = (timeout_ms if timeout_ms is not None else 60000) / 1000.0
        answer = self._get("/v1/preemption%s" % self._q(step=step, timeout_ms=timeout_ms),
                           timeout=wait_s + MARGIN_S)
        return bool(answer.get("sync"))


def _axes_text(axes):
    if axes is None:
        return None
    return axes if isinstance(axes, str) else ",".join(axes)


def _to_bytes(x):
    """(bytes-like, dtype name, shape, kind) of a numpy array or torch tensor."""
    if isinstance(x, np.ndarray) or np.isscalar(x):
        arr = np.ascontiguousarray(x)
        return _raw(arr), _dtypes.dtype_name(arr.dtype), arr.shape, "numpy"
    torch = _dtypes.torch_module()
    if isinstance(x, torch.Tensor):
        t = x.detach().contiguous().cpu()
        name = _dtypes.dtype_name(t.dtype)
        arr = (t.view(torch.int16) if name == "bfloat16" else t).numpy()
        return _raw(arr), name, tuple(t.shape), "torch"
    raise invalid_argument("expected a numpy array or a torch tensor, not %s" % type(x).__name__,
                           field="x")


def _raw(arr):
    """The bytes of a contiguous array, without a copy."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def _from_bytes(data, dtype, shape, kind):
    if kind == "torch":
        torch = _dtypes.torch_module()
        if not data:
            return torch.empty(shape, dtype=_dtypes.torch_dtype(dtype))
        return torch.frombuffer(bytearray(data), dtype=_dtypes.torch_dtype(dtype)).reshape(shape)
    return np.frombuffer(bytearray(data), dtype=_dtypes.numpy_dtype(dtype)).reshape(shape)
