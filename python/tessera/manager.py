"""The trainer's side: a CheckpointManager on its worker's local API."""

import collections
import mmap
import os
import threading
import time

import numpy as np

from . import _dtypes
from ._http import Endpoint, local_credential, query, quote
from .errors import TesseraError, invalid_argument

# GET /v1/saves/{step} holds a wait at most this long (the worker caps timeout_ms).
_SAVE_POLL_MS = 60000
# The tensor name of the device probe, which creates nothing: the worker refuses
# device -1 before it looks at the name.
_PROBE_NAME = "tessera.device-probe"
# Seconds added to a server-side wait for the socket timeout.
_MARGIN_S = 10.0


def _layout_text(layout, ndim):
    """Query form of a layout: None = replicated; entries are axis names or None."""
    if layout is None:
        entries = ["unsharded"] * ndim
    elif isinstance(layout, str):
        entries = [layout]
    else:
        entries = ["unsharded" if a is None else str(a) for a in layout]
    return ",".join(entries)


def _shape_text(shape):
    return ",".join(str(int(s)) for s in shape)


def _parse_shape(text):
    return tuple(int(s) for s in text.split(",")) if text else ()


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


class _Mapping:
    """One shared-memory file of the worker, mapped into this process."""

    def __init__(self, path, nbytes):
        self.path = path
        self.nbytes = nbytes
        self.views = {}
        if nbytes == 0:
            self.mm = None  # mmap refuses empty files; an empty tensor shares nothing
            return
        fd = os.open(path, os.O_RDWR)
        try:
            self.mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    def view(self, like, dtype, local_shape):
        key = (like, dtype, local_shape)
        if key not in self.views:
            if like == "torch":
                torch = _dtypes.torch_module()
                tdt = _dtypes.torch_dtype(dtype)
                if self.mm is None:
                    t = torch.empty(local_shape, dtype=tdt)
                else:
                    t = torch.frombuffer(self.mm, dtype=tdt).reshape(local_shape)
                self.views[key] = t
            else:
                ndt = _dtypes.numpy_dtype(dtype)
                if self.mm is None:
                    self.views[key] = np.zeros(local_shape, dtype=ndt)
                else:
                    self.views[key] = np.frombuffer(self.mm, dtype=ndt).reshape(local_shape)
        return self.views[key]

    def close(self):
        self.views.clear()
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass  # arrays the caller still holds keep it mapped until they go
            self.mm = None


class SaveHandle:
    """A save started by CheckpointManager.save(); the trainer holds it while the
    worker writes in the background.

    step:           the checkpoint's step.
    snapshot_ms:    how long the worker took to snapshot this worker's tensors.
    snapshot_bytes: how many bytes it copied.
    job:            the save job's id (asks the worker, waiting until the job
                    exists, the first time it is read).
    """

    def __init__(self, manager, step, answer):
        self._manager = manager
        self.step = step
        self.checkpoint = answer.get("checkpoint") or {"mesh": manager.mesh, "step": step}
        self.snapshot_ms = answer.get("snapshot_ms")
        self.snapshot_bytes = answer.get("snapshot_bytes")
        self._job = answer.get("job")
        self._state = answer.get("state", "snapshotted")
        self._error = None

    @property
    def job(self):
        if self._job is None:
            self._update(self._manager._save_status(self.step, "started",
                                                    self._manager.timeout))
        return self._job

    @property
    def state(self):
        """What the worker last said: snapshotted, running or committed."""
        return self._state

    def _update(self, answer):
        self._job = answer.get("job") or self._job
        self._state = answer.get("state") or self._state
        return answer

    def _check(self, fn):
        if self._error is not None:
            raise self._error
        try:
            return fn()
        except TesseraError as e:
            if e.code not in ("unavailable",) and e.status != 0:
                self._error = e  # the save failed: it stays failed
            raise

    def done(self):
        """True once the checkpoint is committed, False while it is being
        written; raises TesseraError if the save failed."""
        if self._state == "committed":
            return True
        answer = self._check(lambda: self._manager._save_status(self.step, None, None))
        return self._update(answer).get("state") == "committed"

    def wait(self, timeout=None):
        """Blocks until the checkpoint is committed, returning the worker's answer
        {"checkpoint", "job", "state": "committed"}. Raises TesseraError with the
        save's error if it failed (its code, and details naming the culprit), or
        deadline_exceeded (status 0) after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._state == "committed":
                return {"checkpoint": self.checkpoint, "job": self._job, "state": "committed"}
            wait_ms = _SAVE_POLL_MS
            if deadline is not None:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    raise TesseraError(
                        "deadline_exceeded", "the save of step %d of mesh %s is still %s after "
                        "%g s" % (self.step, self._manager.mesh, self._state, timeout), 0,
                        {"mesh": self._manager.mesh, "step": self.step, "job": self._job})
                wait_ms = max(1, min(wait_ms, left_ms))
            try:
                answer = self._check(lambda: self._manager._save_status(
                    self.step, "committed", wait_ms / 1000.0))
            except TesseraError as e:
                if e.code != "deadline_exceeded" or e.status != 504:
                    raise
                # The wait timed out, or the save failed with a timeout: ask without waiting.
                self._error = None
                self.done()
                continue
            self._update(answer)

    def __repr__(self):
        return "SaveHandle(step=%r, job=%r, state=%r)" % (self.step, self._job, self._state)


class CheckpointManager:
    """The trainer's handle on its worker for one mesh.

    mesh:    the mesh's name (registered with tesserad, this worker part of it).
    worker:  the worker's local API URL (default: env TESSERA_WORKER).
    credential_file: the worker's local credential (default: env
             TESSERA_LOCAL_CREDENTIAL, else /tmp/tessera-<uid>/local-<port>.key,
             where the worker writes it, readable by its user only).
    timeout: seconds for each call; calls that wait on the cluster (collectives,
             restore, save waits) add their own wait.
    axes:    optional ordered {axis: size} of the mesh; only attach_state_dict of
             sharded tensors needs it.

    Construction asks the worker which devices of the mesh it owns, so an
    unreachable worker, an unknown mesh or a worker outside the mesh raises
    TesseraError right away.
    """

    def __init__(self, mesh, worker=None, timeout=60.0, axes=None, credential_file=None):
        url = worker or os.environ.get("TESSERA_WORKER")
        if not url:
            raise invalid_argument(
                "no worker to talk to: pass worker= (its local API, e.g. http://127.0.0.1:PORT, "
                "from tesserad's GET /api/v1/workers/{id} local_api) or set TESSERA_WORKER",
                field="worker")
        self.mesh = mesh
        self.timeout = float(timeout)
        self.axes = dict(axes) if axes is not None else None
        self._http = Endpoint(url, "worker", token=local_credential(url, credential_file),
                              timeout=timeout)
        self.worker = self._http.url
        self._lock = threading.Lock()
        self._maps = {}
        self._saves = []
        health = self._get("/healthz")
        self.worker_id = (health or {}).get("worker")
        self.devices = self._probe_devices()

    # -- plumbing

    def _get(self, path, timeout=None):
        return self._http.json("GET", path, None, timeout)

    def _post(self, path, body=None, timeout=None):
        return self._http.json("POST", path, body if body is not None else {}, timeout)

    def _probe_devices(self):
        """The devices of the mesh this worker owns: a mapping for device -1 is
        refused with them in details.devices (and an unknown mesh with 404)."""
        try:
            self._post("/v1/tensors/%s/mapping%s" % (_PROBE_NAME, query(
                {"mesh": self.mesh, "device": -1, "dtype": "uint8", "shape": 1,
                 "layout": "unsharded"})))
        except TesseraError as e:
            if e.code == "invalid_argument" and isinstance(e.details.get("devices"), list):
                return [int(d) for d in e.details["devices"]]
            if e.status == 0:
                raise
            details = dict(e.details)
            details.setdefault("mesh", self.mesh)
            raise TesseraError(e.code, "worker %s cannot serve mesh '%s': %s" % (
                self.worker, self.mesh, e.message.split(" (POST ")[0]), e.status,
                details) from None
        raise TesseraError("internal", "worker %s accepted a mapping for device -1" % self.worker,
                           0, {"endpoint": self.worker})

    def _device(self, device, tensor):
        if device is None:
            if len(self.devices) != 1:
                raise invalid_argument(
                    "worker %s owns devices %s of mesh %s: pass device= for tensor '%s'"
                    % (self.worker, self.devices, self.mesh, tensor),
                    field="device", tensor=tensor, devices=self.devices)
            return self.devices[0]
        return int(device)

    def _q(self, **params):
        return query(dict(mesh=self.mesh, **params))

    def _save_status(self, step, wait, wait_s):
        params = {"wait": wait}
        timeout = None
        if wait is not None and wait_s is not None:
            params["timeout_ms"] = max(1, int(wait_s * 1000))
            timeout = wait_s + _MARGIN_S
        return self._get("/v1/saves/%d%s" % (step, self._q(**params)), timeout)

    # -- tensors

    def attach(self, name, shape, dtype, layout=None, device=None, like="numpy"):
        """This device's local shard of tensor `name` (global `shape`), as an
        array over the worker's shared memory: writes to it are what a save
        snapshots, and a restore writes into it.

        dtype:  numpy or torch dtype, or a name (float32, bfloat16, int64, ...).
        layout: per dimension a mesh axis name or None/"unsharded"; None =
                replicated. device: this worker's device of the mesh (default:
                its only one). like: "numpy" (numpy.ndarray) or "torch"
                (torch.Tensor; the only choice for bfloat16, which numpy lacks).
        Attaching again with the same description returns the same array; with
        another one raises TesseraError (409 conflict) naming the tensor.
        """
        dtype = _dtypes.dtype_name(dtype)
        try:
            shape = tuple(int(s) for s in shape)
        except TypeError:
            raise invalid_argument("shape of tensor '%s' must be a sequence of ints, not %r"
                                   % (name, shape), field="shape", tensor=name) from None
        if like not in ("numpy", "torch"):
            raise invalid_argument("like must be \"numpy\" or \"torch\", not %r" % (like,),
                                   field="like", tensor=name)
        if like == "numpy" and dtype == "bfloat16":
            raise invalid_argument(
                "tensor '%s' is bfloat16, which numpy has no dtype for: attach it with "
                "like=\"torch\"" % name, field="dtype", tensor=name)
        if like == "torch":
            _dtypes.torch_module()
        device = self._device(device, name)
        try:
            answer = self._post("/v1/tensors/%s/mapping%s" % (quote(name), self._q(
                device=device, dtype=dtype, shape=_shape_text(shape),
                layout=_layout_text(layout, len(shape)))))
        except TesseraError as e:
            if e.status == 0 or "tensor" in e.details:
                raise
            # The worker's shape and layout errors name the field; add the tensor.
            details = dict(e.details, tensor=name)
            raise TesseraError(e.code, "cannot attach tensor '%s' %s with layout %s: %s" % (
                name, list(shape), list(layout) if layout is not None else "replicated",
                e.message), e.status, details) from None
        local_shape = tuple(answer.get("local_shape", shape))
        with self._lock:
            m = self._maps.get((name, device))
            if m is None or m.path != answer["path"]:
                if m is not None:
                    m.close()
                m = _Mapping(answer["path"], int(answer["bytes"]))
                self._maps[(name, device)] = m
            return m.view(like, dtype, local_shape)

    def attach_state_dict(self, state, layouts=None, device=None):
        """Moves every tensor of `state` into mapped memory and re-points its owner
        at it, so training updates what a save snapshots. Returns {name: tensor}.

        state: a dict whose values are torch.nn.Module, torch.optim.Optimizer,
        torch.Tensor, or nested dicts of those, e.g. {"model": m, "optim": opt}.
        Names are the keys joined with "/": "model/fc.weight",
        "optim/state/0/exp_avg". An optimizer's state is attached as it is now,
        so one whose state is created on its first step (Adam, SGD with momentum)
        must have stepped once, or have had init_optimizer_state() called.
        layouts: {name: layout}; default replicated. A sharded entry means the
        tensor given is this device's local shard (needs axes= on the manager).
        """
        from . import _torch_state  # noqa: PLC0415 - torch only when asked for
        return _torch_state.attach_state_dict(self, state, layouts or {}, device)

    def read(self, name, device=None):
        """A copy of a tensor's local shard as the worker holds it (GET /v1/tensors),
        as a numpy array (bfloat16 as its uint16 bits)."""
        device = self._device(device, name)
        _, headers, data = self._http.call(
            "GET", "/v1/tensors/%s%s" % (quote(name), self._q(device=device)))
        dtype = headers.get("X-Tessera-Dtype", "uint8")
        np_dtype = np.dtype("uint16") if dtype == "bfloat16" else np.dtype(dtype)
        return np.frombuffer(data, dtype=np_dtype).reshape(
            _parse_shape(headers.get("X-Tessera-Local-Shape", "")))

    def tensors(self):
        """The tensors of this mesh the worker holds: [{name, dtype, shape, layout, ...}]."""
        return [t for t in self._get("/v1/tensors") if t.get("mesh") == self.mesh]

    def detach(self, name):
        """Drops a tensor from the worker (all its devices) and unmaps it here."""
        self._http.call("DELETE", "/v1/tensors/%s%s" % (quote(name), self._q()))
        with self._lock:
            for key in [k for k in self._maps if k[0] == name]:
                self._maps.pop(key).close()

    # -- checkpoints

    def save(self, step, tensors=None, metadata=None):
        """Snapshots this worker's tensors of the mesh for checkpoint `step` and
        returns a SaveHandle as soon as they are copied: the trainer may then
        overwrite them. The trainers of the mesh calling save(step) together
        make one save job. tensors: names to save (default all); metadata: JSON."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise invalid_argument("step must be a non-negative int, not %r" % (step,),
                                   field="step")
        body = {}
        if tensors is not None:
            body["tensors"] = list(tensors)
        if metadata is not None:
            body["metadata"] = metadata
        answer = self._post("/v1/save%s" % self._q(step=step), body)
        handle = SaveHandle(self, step, answer)
        with self._lock:
            self._saves = [h for h in self._saves if h.state != "committed"]
            self._saves.append(handle)
        return handle

    def wait_until_finished(self, timeout=None):
        """Waits for every save this manager started; raises the first failure
        (after waiting for the others)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            pending = list(self._saves)
        first = None
        for handle in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                handle.wait(left)
            except TesseraError as e:
                if e.code == "deadline_exceeded" and e.status == 0:
                    raise
                first = first or e
            with self._lock:
                if handle in self._saves:
                    self._saves.remove(handle)
        if first is not None:
            raise first

    def restore(self, step=None, tensors=None, timeout=600.0):
        """Restores this worker's devices from checkpoint `step` (default: the
        latest committed one) into the tensors, mapped ones in place, and returns
        the step restored. tensors: names to restore (default all). timeout:
        seconds the worker may take (at most 3600)."""
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise invalid_argument("step must be a non-negative int or None, not %r" % (step,),
                                   field="step")
        body = {"tensors": list(tensors)} if tensors is not None else {}
        answer = self._post("/v1/restore%s" % self._q(
            step="latest" if step is None else step, timeout_ms=int(timeout * 1000)), body,
            timeout=timeout + _MARGIN_S)
        return int(answer["checkpoint"]["step"])

    def latest_step(self):
        """The newest committed step of the mesh, or None if there is none."""
        try:
            answer = self._get("/v1/checkpoints/latest%s" % self._q())
        except TesseraError as e:
            if e.status == 404 and "step" not in e.details:
                return None
            raise
        return int(answer["step"])

    def all_steps(self):
        """The committed steps of the mesh, oldest first."""
        answer = self._get("/v1/checkpoints%s" % self._q())
        listed = answer.get("checkpoints", []) if isinstance(answer, dict) else answer
        return sorted(int(c["step"]) for c in listed if c.get("state") == "committed")

    # -- collectives

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
        params = dict(params, dtype=dtype, shape=_shape_text(shape), timeout_ms=timeout_ms)
        wait_s = (timeout_ms if timeout_ms is not None else 30000) / 1000.0
        _, headers, out = self._http.call(
            "POST", "/v1/collectives/%s%s" % (op, self._q(**params)), data,
            timeout=wait_s + _MARGIN_S)
        out_shape = _parse_shape(headers.get("X-Tessera-Shape", ""))
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
        params = {"dtype": dtype, "dense_shape": _shape_text(dense_shape),
                  "rows": ",".join(str(r) for r in rows), "index_dtype": index_dtype,
                  "axes": _axes_text(axes), "path": path, "timeout_ms": timeout_ms}
        wait_s = (timeout_ms if timeout_ms is not None else 30000) / 1000.0
        _, headers, out = self._http.call(
            "POST", "/v1/collectives/sparse_all_reduce%s" % self._q(**params), b"".join(parts),
            timeout=wait_s + _MARGIN_S)
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
                          {}, timeout=wait_s + _MARGIN_S)

    def reached_preemption_sync_point(self, step, timeout_ms=None):
        """False until a preemption notice; then True exactly at the agreed step."""
        wait_s = (timeout_ms if timeout_ms is not None else 60000) / 1000.0
        answer = self._get("/v1/preemption%s" % self._q(step=step, timeout_ms=timeout_ms),
                           timeout=wait_s + _MARGIN_S)
        return bool(answer.get("sync"))

    # -- lifetime

    def close(self):
        """Unmaps every attached tensor (arrays still referenced stay valid until
        they go) and closes this thread's connection. The worker keeps the tensors."""
        with self._lock:
            for m in self._maps.values():
                m.close()
            self._maps.clear()
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "CheckpointManager(mesh=%r, worker=%r, devices=%r)" % (
            self.mesh, self.worker, self.devices)


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
