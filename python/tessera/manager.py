"""The trainer's side: a CheckpointManager on its worker's local API."""

import os
import threading
import time

import numpy as np

from . import _dtypes
from ._collectives import MARGIN_S, Collectives, IndexedSlices
from ._dtypes import parse_shape, shape_text
from ._http import Endpoint, local_credential, query, quote
from ._mapping import Mapping
from ._save_handle import PendingSave, SaveHandle
from .errors import TesseraError, invalid_argument


__all__ = ["CheckpointManager", "IndexedSlices", "Restored", "SaveHandle"]


def _layout_text(layout, ndim):
    """Query form of a layout: None = replicated; entries are axis names or None."""
    if layout is None:
        entries = ["unsharded"] * ndim
    elif isinstance(layout, str):
        entries = [layout]
    else:
        entries = ["unsharded" if a is None else str(a) for a in layout]
    return ",".join(entries)


def _check_step(step, optional=False):
    if optional and step is None:
        return
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise invalid_argument("step must be a non-negative int%s, not %r" % (
            " or None" if optional else "", step), field="step")


class Restored(int):
    """What restore() returns: the step restored, as an int (so `restore() + 1` is
    the next step), with what the worker reported:

    step:       the same step.
    missing:    names attached here that the checkpoint lacks (strict=False only).
    unexpected: names in the checkpoint that nobody attached (strict=False only).
    tensors:    the names restored.
    metadata:   the JSON saved with the checkpoint.
    tier:       "memory" (from the workers' RAM) or "persisted" (from the root).
    source:     "local" (this worker's RAM), "replica" or "parity" (rebuilt from
                its peers), or "root".
    fallback:   why a newer memory checkpoint was not restored, or None.
    """

    def __new__(cls, answer):
        self = super().__new__(cls, int(answer["checkpoint"]["step"]))
        self.step = int(self)
        self.missing = list(answer.get("missing") or [])
        self.unexpected = list(answer.get("unexpected") or [])
        self.tensors = list(answer.get("tensors") or [])
        self.metadata = answer.get("metadata") or {}
        self.job = answer.get("job")
        self.tier = answer.get("tier", "persisted")
        self.source = answer.get("source", "root")
        self.fallback = answer.get("fallback")
        return self

    def __repr__(self):
        return "Restored(step=%d, tier=%s, source=%s, missing=%d, unexpected=%d)" % (
            self.step, self.tier, self.source, len(self.missing), len(self.unexpected))


class CheckpointManager(Collectives):
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
        self._repointed = []  # (weakref, data_ptr) of what attach_state_dict re-pointed
        self._saves = []
        self._snapshotting = None  # a background save's PendingSave until its snapshot
        health = self._get("/healthz")
        self.worker_id = (health or {}).get("worker")
        self.devices = self._probe_devices()

    # -- plumbing

    def _get(self, path, timeout=None):
        return self._http.json("GET", path, None, timeout)

    def _post(self, path, body=None, timeout=None):
        return self._http.json("POST", path, body if body is not None else {}, timeout)

    def _probe_devices(self):
        """The devices of the mesh this worker owns (GET /v1/meshes/{mesh}/devices;
        an unknown mesh is a 404 naming it)."""
        try:
            answer = self._get("/v1/meshes/%s/devices" % quote(self.mesh))
        except TesseraError as e:
            if e.status == 0:
                raise
            details = dict(e.details)
            details.setdefault("mesh", self.mesh)
            raise TesseraError(e.code, "worker %s cannot serve mesh '%s': %s" % (
                self.worker, self.mesh, e.message.split(" (GET ")[0]), e.status,
                details) from None
        self.placement = answer  # {mesh, axes, devices_per_worker, rank, devices, workers}
        return [int(d) for d in answer["devices"]]

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
            timeout = wait_s + MARGIN_S
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
        if like == "numpy" and _dtypes.numpy_dtype(dtype) is None:
            raise invalid_argument(
                "tensor '%s' is bfloat16, which numpy has no dtype for without ml_dtypes: "
                "install ml_dtypes or attach it with like=\"torch\"" % name, field="dtype",
                tensor=name)
        if like == "torch":
            _dtypes.torch_module()
        device = self._device(device, name)
        try:
            answer = self._post("/v1/tensors/%s/mapping%s" % (quote(name), self._q(
                device=device, dtype=dtype, shape=shape_text(shape),
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
                m = Mapping(answer["path"], int(answer["bytes"]))
                self._maps[(name, device)] = m
            return m.view(like, dtype, local_shape)

    def attach_state_dict(self, state, layouts=None, device=None):
        """Moves every tensor of `state` into mapped memory and re-points its owner
        at it, so training updates what a save snapshots. Returns {name: tensor}.

        state: a dict whose values are torch.nn.Module, torch.optim.Optimizer,
        torch.Tensor, or nested dicts of those, e.g. {"model": m, "optim": opt}.
        Names are the keys joined with "/": "model/fc.weight",
        "optim/state/0/exp_avg". A DistributedDataParallel or DataParallel
        wrapper is looked through: its names are those of the module inside (no
        "module." prefix), so a wrapped model and the bare one restore into each
        other. The lazily made state of Adam, AdamW and SGD with momentum is
        created here if a parameter lacks it (init_optimizer_state); another
        optimizer with no state at all is refused (take one step first).
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
            parse_shape(headers.get("X-Tessera-Local-Shape", "")))

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

    MEMORY_OPTIONS = ("redundancy", "replicas", "group", "parity", "keep", "persist_every_steps",
                      "persist_every_s", "force", "deadline_ms")

    def save(self, step, tensors=None, metadata=None, tier="disk", full=None, full_every=None,
             compression=None, level=None, background=False, _borrow=None, **memory):
        """Snapshots this worker's tensors of the mesh for checkpoint `step` and
        returns a SaveHandle as soon as they are copied: the trainer may then
        overwrite them. The trainers of the mesh calling save(step) together
        make one save job. tensors: names to save (default all); metadata: JSON.

        background=True returns a PendingSave at once and the worker copies the
        tensors while the trainer goes on: they must not change until
        handle.snapshotted() returns. Call it before the optimizer writes them, so
        that the copy runs during the next step's forward and backward passes,
        which only read them. The next save(), restore() and close() wait for it.

        A disk save is incremental: a worker writes only the chunks that changed
        since its last committed save, and every chunk each full_every-th save
        (default 10), or when full=True (docs/semantics.md, "Incremental checkpoints").
        compression: "zstd" (the default, floats split into byte planes first) or
        "none"; level: zstd's level.

        tier="memory" keeps the checkpoint in the workers' RAM, with its
        redundancy on other hosts (docs/memory-tier.md); its options, the same on
        every trainer: redundancy ("replica" or "parity"), replicas, group, parity, keep,
        persist_every_steps, persist_every_s, force; deadline_ms bounds its
        replication (default 60 s): a worker that takes no part fails it, named."""
        _check_step(step)
        unknown = sorted(set(memory) - set(self.MEMORY_OPTIONS))
        if unknown:
            raise TypeError("save() got unexpected keyword argument(s) %s" % ", ".join(unknown))
        if memory and tier != "memory":
            raise TypeError("%s apply only to tier=\"memory\"" % ", ".join(sorted(memory)))
        body = dict(memory)
        if tier != "disk":
            body["tier"] = tier
        if full is not None:
            body["full"] = bool(full)
        if full_every is not None:
            body["full_every"] = full_every
        if compression is not None:
            body["compression"] = compression
        if level is not None:
            body["level"] = level
        if tensors is not None:
            body["tensors"] = list(tensors)
        if metadata is not None:
            body["metadata"] = metadata
        if _borrow is not None:  # tessera.jax: memory the worker reads in place
            body["borrow"] = _borrow
        self._await_snapshot()
        if not background:
            return self._start_save(step, body)
        pending = PendingSave(lambda: (self._start_save(step, body), False), step)
        with self._lock:
            self._snapshotting = pending
        return pending

    def _start_save(self, step, body):
        answer = self._post("/v1/save%s" % self._q(step=step), body)
        handle = SaveHandle(self, step, answer)
        with self._lock:
            self._saves = [h for h in self._saves if h.state != "committed"]
            self._saves.append(handle)
        return handle

    def _await_snapshot(self):
        """Waits for a background save's snapshot (its error is its own handle's)."""
        with self._lock:
            pending, self._snapshotting = self._snapshotting, None
        if pending is not None:
            pending.snapshot_done()

    def wait_until_finished(self, timeout=None):
        """Waits for every save this manager started; raises the first failure
        (after waiting for the others)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._await_snapshot()
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

    def restore(self, step=None, tensors=None, timeout=600.0, strict=True, _into=None):
        """Restores this worker's devices from checkpoint `step` into the tensors,
        mapped ones in place, and returns a Restored: the step restored (an int),
        with .missing, .unexpected and .metadata. With step=None every trainer of
        the mesh makes the call: their workers agree on the newest step that all of
        them saw committed, and it returns None when the mesh has none.

        strict: a tensor attached here that the checkpoint lacks (missing), or a
        checkpoint tensor nobody attached (unexpected), raises conflict with both
        lists in .details before anything is written; strict=False restores the
        tensors both have and reports the rest. A dtype or shape that differs
        always raises (details.mismatched). tensors: only these names (then each
        must be in the checkpoint). timeout: seconds the worker may take (at most
        3600), the agreement on the step included."""
        _check_step(step, optional=True)
        self._await_snapshot()
        body = {"strict": bool(strict)}
        if tensors is not None:
            body["tensors"] = list(tensors)
        if _into is not None:  # tessera.jax: fresh buffers the worker writes in place
            body["into"] = _into
        try:
            answer = self._post("/v1/restore%s" % self._q(
                step="latest" if step is None else step, timeout_ms=int(timeout * 1000)), body,
                timeout=timeout + MARGIN_S)
        except TesseraError as e:
            if step is None and e.code == "not_found" and e.details.get("step") == "latest":
                return None  # no committed checkpoint that every worker saw: a fresh start
            raise
        return Restored(answer)

    def metadata(self, step=None):
        """The metadata saved with checkpoint `step` (default: the latest committed),
        read through the worker with its local credential."""
        return self.checkpoint(step).get("metadata") or {}

    def checkpoint(self, step=None):
        """tesserad's record of checkpoint `step` (default: the latest committed):
        {mesh, step, state, tensors: [{name, dtype, shape, layout, ...}], metadata,
        ...}; not_found when there is none."""
        _check_step(step, optional=True)
        return self._get("/v1/checkpoints/%s%s" % ("latest" if step is None else step, self._q()))

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

    # -- lifetime

    def close(self):
        """Lets go of the worker's memory and closes this thread's connection; the
        worker keeps the tensors. The tensors that attach_state_dict re-pointed
        move to private memory (a copy of their current values), so the model and
        the optimizer keep working. An array or tensor that attach() returned keeps
        its mapping alive, and valid, for as long as it is referenced."""
        self._await_snapshot()
        with self._lock:
            repointed, self._repointed = self._repointed, []
            for m in self._maps.values():
                m.close()
            self._maps.clear()
        if repointed:
            from . import _torch_state  # noqa: PLC0415 - torch is loaded already
            _torch_state.release_repointed(repointed)
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "CheckpointManager(mesh=%r, worker=%r, devices=%r)" % (
            self.mesh, self.worker, self.devices)


