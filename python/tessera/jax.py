"""Pytrees of sharded jax.Arrays saved and restored through Tessera (docs/jax.md).

    import tessera.jax as tjax
    ckpt = tjax.Checkpointer("train")                # this process's worker: TESSERA_WORKER
    ckpt.save(step, state)                           # returns once the worker has the bytes
    state = ckpt.restore(step, target)               # target: arrays or ShapeDtypeStructs
    state = tjax.Checkpointer("eval").restore(step, target, from_mesh="train")  # any mesh

Every process of the job calls save() with the same step; their workers' saves make
one Tessera checkpoint, like any other: listed, verified, exported to safetensors,
restored by the other clients. How leaves become tensors: _jax_tree.py.
"""

import atexit
import sys
import weakref

import numpy as np

import jax

from . import _jax_tree as tree_
from ._box_reads import read_boxes
from ._dtypes import dtype_name, numpy_dtype
from ._http import query
from ._jax_pending import (aligned_empty, borrow_body, borrowed_shard, lent_shard,
                           lent_tensor, refused, strand)
from ._save_handle import PendingSave
from .errors import TesseraError, invalid_argument
from .manager import CheckpointManager
from ._jax_multihost import (assert_equal, broadcast_one_to_all, process_allgather,  # noqa: F401
                             remember, sync_global_devices)

__all__ = ["Checkpointer", "PendingSave", "TesseraError", "mesh_devices", "sync_global_devices", "broadcast_one_to_all",
           "process_allgather", "assert_equal"]


def mesh_devices(shape):
    """jax.devices() as an array of `shape` in Tessera's order: process by process, so
    that a Tessera mesh of those axes, one worker per process in process order with
    jax.local_device_count() devices each, places every device where JAX does.
    Use it as jax.sharding.Mesh(tjax.mesh_devices((4, 2)), ("data", "model"))."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return np.array(devices, dtype=object).reshape(tuple(shape))


class Checkpointer:
    """Saves and restores pytrees of jax.Arrays on Tessera mesh `mesh` through this
    process's worker (`worker`, default env TESSERA_WORKER)."""

    def __init__(self, mesh, worker=None, timeout=600.0, credential_file=None):
        self.mesh = mesh
        self.timeout = float(timeout)
        self.manager = CheckpointManager(mesh, worker=worker, timeout=timeout,
                                         credential_file=credential_file)
        answer = self.manager.placement
        self._axes = answer.get("axes") or []
        self._workers = list(answer.get("workers") or [])
        self._local = set(self.manager.devices)
        self.restored = None  # the last restore from this mesh: a Restored (tier, source)
        self._saves = []      # saves whose arrays the worker may still read, the last one last
        self._views = {}      # (name, device) -> ((shape, dtype, layout), mapped array)
        self._borrow = True   # until the worker says it cannot read this process
        remember(self)
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref()._drain())

    def workers(self):
        """The mesh's worker ids by rank: process p talks to worker p."""
        return list(self._workers)

    def _drain(self):
        """Waits until no worker reads this process's arrays any more (a process that
        exits sooner fails its last save)."""
        for pending in self._saves:
            pending.released()
        self._saves = []

    def _last_taken(self):
        """Waits until the worker took (or refused) the last save still listed (one no
        longer listed was taken long ago)."""
        if self._saves:
            self._saves[-1].snapshot_done()

    def close(self):
        self._drain()
        self.manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- save

    def save(self, step, tree, metadata=None, tier="disk", wait=False, **options):
        """Starts checkpoint `step` of `tree` (every process of the job calls it with
        the same step) and returns a PendingSave at once: jax.Arrays never change, so
        the worker reads their bytes where they are while it writes (the arrays are
        kept alive until then), or, where it cannot read this process, a thread
        copies them into its shared memory first; numpy leaves are copied here.
        .wait() waits for the commit (wait=True does it here). metadata: JSON saved
        beside. tier, options: as CheckpointManager.save (tier="memory" and its
        options, compression, ...)."""
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        # The worker snapshots the mappings the last save staged: not overwritten before
        # it has (its error, if any, is that save's).
        self._last_taken()
        self._saves = [p for p in self._saves if not p.released(0)]
        entries, values, names, arrays = [], {}, [], []
        for path, leaf in leaves:
            name = tree_.path_text(path)
            where = jax.tree_util.keystr(path)
            if not tree_.is_array(leaf):
                values[name] = tree_.jsonable(leaf, where)
                entries.append({"name": name, "path": where, "value": True})
                continue
            entry, placed = self._place(name, where, leaf)
            entries.append(entry)
            names.append(name)
            if isinstance(leaf, jax.Array):
                arrays.append((entry, placed))
            else:  # a host array may change once save returns: copied now
                self._copy(name, entry["shape"], entry["dtype"], entry["layout"], placed)
        seen = {}
        for e in entries:
            if e["name"] in seen:
                raise invalid_argument("'%s' and '%s' make the same tensor name '%s'" % (
                    seen[e["name"]], e["path"], e["name"]), field="tree", tensor=e["path"])
            seen[e["name"]] = e["path"]
        meta = dict(metadata or {})
        meta[tree_.MANIFEST] = {"version": 1, "leaves": entries, "values": values}
        pins, borrowed = [], []
        if self._borrow:
            for entry, placed in arrays:
                borrowed.append(lent_tensor(entry["name"], entry["dtype"], entry["shape"],
                                            entry["layout"],
                                            [borrowed_shard(k, data, pins) for k, data in placed]))
        else:
            pins = [data for _, placed in arrays for _, data in placed]

        def start():
            kwargs = dict(tensors=names, metadata=meta, tier=tier, **options)
            if borrowed:
                try:
                    handle = self.manager.save(step, _borrow=borrow_body(borrowed), **kwargs)
                    return handle, handle.borrowing
                except TesseraError as e:
                    if not refused(e):
                        raise
                    self._borrow = False
                    print("tessera.jax: the worker copies this process's arrays from now on: %s"
                          % e.message, file=sys.stderr)
            for entry, placed in arrays:
                self._copy(entry["name"], entry["shape"], entry["dtype"], entry["layout"], placed)
            return self.manager.save(step, **kwargs), False

        pending = PendingSave(start, step, pins)
        self._saves.append(pending)
        if wait:
            pending.wait(self.timeout)
        return pending

    def _place(self, name, where, leaf):
        """The manifest entry of array `leaf` and [(Tessera device, its shard's data)]
        of this process's devices."""
        shape = tuple(int(s) for s in leaf.shape)
        dtype = dtype_name(np.dtype(leaf.dtype), field="dtype")
        sharding = getattr(leaf, "sharding", None)
        entry = {"name": name, "path": where, "dtype": dtype, "shape": list(shape),
                 "layout": None}
        if sharding is not None:
            layout, jmesh = tree_.layout_of(sharding, len(shape), where)
            if jmesh is not None:
                tree_.check_mesh(jmesh, self._axes, where)
                positions = tree_.device_positions(jmesh)
                placed = []
                for s in leaf.addressable_shards:
                    k = positions[s.device.id]
                    if k not in self._local:
                        raise invalid_argument(
                            "'%s': JAX device %d is at position %d of its mesh, which Tessera "
                            "places on another worker (this one has %s): build the mesh with "
                            "tessera.jax.mesh_devices" % (where, s.device.id, k,
                                                          sorted(self._local)),
                            field="sharding", tensor=where, device=k)
                    placed.append((k, s.data))
                entry["layout"] = layout
                return entry, placed
            data = leaf.addressable_shards[0].data
        else:
            data = leaf  # a host array: every device holds it
        # Replicated with no mesh of its own: each device of this worker holds a copy.
        return entry, [(k, data) for k in sorted(self._local)]

    def _attach(self, name, shape, dtype, layout, device):
        """The device's mapping of `name`, kept from one save to the next (no request
        when it is attached as before); a tensor the worker holds with another dtype,
        shape or layout (an earlier tree, or a restore into another sharding) is
        dropped first: this process owns its tensors."""
        dtype = dtype_name(dtype)
        want = (tuple(shape), dtype, tuple(layout or ()))
        held = self._views.get((name, device))
        if held is not None and held[0] == want:
            return held[1]
        try:
            view = self.manager.attach(name, shape, dtype, layout=layout, device=device)
        except TesseraError as e:
            if e.code != "conflict":
                raise
            self.manager.detach(name)
            for key in [k for k in self._views if k[0] == name]:
                del self._views[key]
            view = self.manager.attach(name, shape, dtype, layout=layout, device=device)
        self._views[(name, device)] = (want, view)
        return view

    def _copy(self, name, shape, dtype, layout, placed):
        for k, data in placed:
            view = self._attach(name, shape, dtype, layout, k)
            np.copyto(view, np.asarray(data).reshape(view.shape), casting="no")

    # -- restore

    def restore(self, step=None, target=None, from_mesh=None, strict=True):
        """The tree of checkpoint `step` (None: the newest every worker saw) laid out
        as `target`: a pytree of the same structure whose array leaves are jax.Arrays
        or jax.ShapeDtypeStructs with a sharding (any sharding of this process's
        devices); dtypes and shapes must match the checkpoint's, named otherwise.
        From this mesh, each worker restores its devices (from RAM when the memory
        tier holds the step); from another mesh (`from_mesh`, saved on any number of
        processes), each process reads only the boxes its devices need."""
        if target is None:
            raise invalid_argument("restore needs a target tree (arrays or "
                                   "jax.ShapeDtypeStruct with shardings)", field="target")
        self._last_taken()  # the last save's thread may still write the mappings
        source = from_mesh or self.mesh
        record = self._record(from_mesh, step)
        manifest = (record.get("metadata") or {}).get(tree_.MANIFEST)
        if manifest is None:
            raise TesseraError("failed_precondition", "checkpoint %s of mesh %s was not saved by "
                               "tessera.jax (no '%s' manifest in its metadata)" % (
                                   record.get("step"), source, tree_.MANIFEST), 409,
                               {"mesh": source, "step": record.get("step")})
        saved = {e["name"]: e for e in manifest["leaves"]}
        leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
        wanted = []
        for path, leaf in leaves:
            name, where = tree_.path_text(path), jax.tree_util.keystr(path)
            entry = saved.get(name)
            if entry is None:
                raise TesseraError("not_found", "checkpoint %s of mesh %s has no '%s'" % (
                    record["step"], source, where), 404, {"tensor": where,
                                                          "step": record["step"]})
            if entry.get("value"):
                wanted.append((name, where, None, None))
                continue
            if not (tree_.is_array(leaf) and getattr(leaf, "sharding", None) is not None):
                raise invalid_argument(
                    "'%s' is an array in checkpoint %s of mesh %s: its target must be a jax.Array "
                    "or a jax.ShapeDtypeStruct with a sharding, not %s" % (
                        where, record["step"], source, type(leaf).__name__),
                    field="target", tensor=where)
            shape = tuple(int(s) for s in leaf.shape)
            dtype = dtype_name(np.dtype(leaf.dtype), field="dtype")
            if list(shape) != entry["shape"] or dtype != entry["dtype"]:
                raise TesseraError("invalid_argument", "'%s' is %s%s in checkpoint %s of mesh "
                                   "%s, the target %s%s" % (where, entry["dtype"],
                                                          entry["shape"], record["step"],
                                                          source, dtype, list(shape)), 400,
                                   {"tensor": where, "saved": [entry["dtype"], entry["shape"]],
                                    "target": [dtype, list(shape)]})
            wanted.append((name, where, leaf, entry))
        if strict and from_mesh is None:
            extra = sorted(set(saved) - {w[0] for w in wanted})
            if extra:
                raise TesseraError("failed_precondition", "checkpoint %s of mesh %s has leaves the "
                                   "target lacks: %s (strict=False ignores them)" % (
                                       record["step"], source, extra), 409, {"unexpected": extra})
        arrays = self._read(record, source, wanted, from_mesh is None)
        out = []
        for name, where, leaf, entry in wanted:
            out.append(manifest["values"][name] if entry is None else arrays[name])
        return jax.tree_util.tree_unflatten(treedef, out)

    def _restore_into(self, step, names, plans, views):
        """Restores `names` into fresh buffers of this process that the worker writes
        in place (docs/jax.md, "Borrowed memory"), filling views; False when the
        worker cannot write this process's memory (the mappings serve then)."""
        into, buffers = [], {}
        for name in names:
            leaf, layout, _, targets = plans[name]
            shape = tuple(int(s) for s in leaf.shape)
            shards = []
            for k, _, index in targets:
                buf = aligned_empty(tree_.box_of(index, shape)[1], np.dtype(leaf.dtype))
                buffers[(name, k)] = buf
                shards.append(lent_shard(k, buf))
            into.append(lent_tensor(name, dtype_name(np.dtype(leaf.dtype)), shape, layout, shards))
        try:
            self.restored = self.manager.restore(step, tensors=names, timeout=self.timeout,
                                                 strict=False, _into=borrow_body(into))
        except TesseraError as e:
            if refused(e):
                self._borrow = False
                return False
            if e.status == 0:
                strand(buffers)  # no answer: the worker may still write them
            raise
        missing = sorted(set(names) - set(self.restored.tensors))
        if missing:
            raise TesseraError("not_found", "checkpoint %s of mesh %s restored no %s" % (
                step, self.mesh, missing), 404, {"missing": missing, "step": step})
        views.update(buffers)
        return True

    def _record(self, from_mesh, step):
        """The checkpoint's step and metadata. On this mesh the workers agree on the step
        (the memory tier's too) and restore nothing yet; another mesh's is asked of
        tesserad through this process's worker."""
        source = from_mesh or self.mesh
        if from_mesh is None:
            probe = self.manager.restore(step, tensors=[], strict=False, timeout=self.timeout)
            if probe is None:
                raise TesseraError("not_found", "mesh %s has no committed checkpoint" % source,
                                   404, {"mesh": source})
            return {"step": int(probe), "metadata": probe.metadata}
        return self.manager._http.json("GET", "/v1/checkpoints/%s%s" % (
            "latest" if step is None else step, query({"mesh": source})))

    def _targets(self, leaf, where):
        """[(tessera device or None, jax device, index)] of the target's local shards."""
        sharding = leaf.sharding
        shape = tuple(int(s) for s in leaf.shape)
        layout, jmesh = tree_.layout_of(sharding, len(shape), where)
        positions = tree_.device_positions(jmesh) if jmesh is not None else {}
        out = []
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            out.append((positions.get(device.id), device, index))
        return layout, jmesh, out

    def _read(self, record, source, wanted, as_saved):
        """{name: jax.Array} of every array leaf of `wanted`."""
        step = int(record["step"])
        plans, boxes = {}, []
        for name, where, leaf, entry in wanted:
            if entry is None:
                continue
            layout, jmesh, targets = self._targets(leaf, where)
            if as_saved and jmesh is not None:
                tree_.check_mesh(jmesh, self._axes, where)
            plans[name] = (leaf, layout, jmesh, targets)
            if not (as_saved and jmesh is not None):
                shape = tuple(entry["shape"])
                size = np.dtype(numpy_dtype(entry["dtype"])).itemsize
                for i, (_, _, index) in enumerate(targets):
                    offsets, lengths = tree_.box_of(index, shape)
                    boxes.append(((name, i), name, offsets, lengths,
                                  size * int(np.prod(lengths, dtype=np.int64))))
        views = {}
        mapped = [n for n, p in plans.items() if as_saved and p[2] is not None]
        owned = bool(mapped) and self._borrow and self._restore_into(step, mapped, plans, views)
        if mapped and not owned:
            for name in mapped:
                leaf, layout, _, targets = plans[name]
                for k, _, _ in targets:
                    views[(name, k)] = self._attach(name, leaf.shape, np.dtype(leaf.dtype),
                                                    layout, k)
            self.restored = self.manager.restore(step, tensors=mapped, timeout=self.timeout,
                                                 strict=False)
        read = {}
        for (name, i), raw in read_boxes(self.manager._http, source, step, boxes, self.timeout,
                                         writable=False):  # device_put copies them once
            read[(name, i)] = raw
        out = {}
        for name, (leaf, layout, jmesh, targets) in plans.items():
            dt = np.dtype(leaf.dtype)
            parts = []
            for i, (k, device, index) in enumerate(targets):
                if (name, k) in views:
                    # The worker wrote a buffer of this process's own, which the array
                    # keeps; or a private copy of a mapping (rewritten by later
                    # restores) that it may keep: no second copy into the device.
                    view = views[(name, k)]
                    parts.append(jax.device_put(view if owned else np.array(view), device,
                                                may_alias=True))
                    continue
                _, lengths = tree_.box_of(index, tuple(leaf.shape))
                host = np.frombuffer(read[(name, i)], dtype=dt).reshape(lengths)
                parts.append(jax.device_put(host, device))
            out[name] = jax.make_array_from_single_device_arrays(tuple(leaf.shape),
                                                                  leaf.sharding, parts)
        return out
