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

import base64
import io
import json
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import Metadata, StorageReader, StorageWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import WriteResult

from . import _dcp_layout as layout
from ._http import Endpoint, local_credential, query, quote
from .errors import TesseraError, invalid_argument
from .manager import CheckpointManager

__all__ = ["Reader", "Writer"]

_MANIFEST = "dcp"  # the key of the manifest in the checkpoint's metadata
_MANAGERS = {}      # (pid, mesh, worker, credential file, timeout) -> CheckpointManager
_MANAGERS_LOCK = threading.Lock()


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _placement(manifest):
    """What decides where chunks go: the tensors and every tensor chunk's place."""
    items = {k: v for k, v in manifest["items"].items() if "bytes" not in v}
    return manifest["world"], manifest["tensors"], items


def _itemsize(name):
    return torch.empty((), dtype=getattr(torch, name)).element_size()


class _Endpoint:
    """What Writer and Reader share: the manager, made on first use (so a writer
    pickled into DCP's checkpoint process connects from there), and the rank."""

    def __init__(self, mesh, worker, timeout, credential_file, axis):
        self.mesh = mesh
        self.worker = worker
        self.timeout = float(timeout)
        self.credential_file = credential_file
        self.axis = axis
        self._manager = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_manager"] = None
        return state

    @property
    def manager(self):
        """This process's manager of the mesh on this worker, shared by every Writer and
        Reader of it: the mappings stay mapped from one checkpoint to the next, so a
        save faults no pages in (DCP users make a new writer for every step)."""
        if self._manager is None:
            url = self.worker or os.environ.get("TESSERA_WORKER")
            key = (os.getpid(), self.mesh, url, self.credential_file, self.timeout)
            with _MANAGERS_LOCK:
                m = _MANAGERS.get(key)
                if m is None:
                    m = CheckpointManager(self.mesh, worker=url, timeout=self.timeout,
                                          credential_file=self.credential_file)
                    _MANAGERS[key] = m
            self._manager = m
        return self._manager

    def _rank_and_world(self):
        devices = self.manager.devices
        if len(devices) != 1:
            raise invalid_argument(
                "tessera.dcp needs one device of mesh %s per rank; worker %s owns %s"
                % (self.mesh, self.manager.worker, devices), field="mesh", devices=devices)
        rank = devices[0]
        if dist.is_available() and dist.is_initialized() and dist.get_rank() != rank:
            raise invalid_argument(
                "rank %d of the process group talks to the worker of device %d of mesh %s: "
                "start each rank with the worker of its device" % (dist.get_rank(), rank, self.mesh),
                field="worker", rank=dist.get_rank(), device=rank)
        return rank

    def _gather(self, obj, rank):
        """Every rank's `obj` (JSON), in rank order, over the process group. One rank
        without a process group (DCP's no_dist) is the whole world; several ranks
        without one are refused."""
        if dist.is_available() and dist.is_initialized():
            out = [None] * dist.get_world_size()
            dist.all_gather_object(out, obj)
            return out
        if self._mesh_size() != 1:
            raise invalid_argument(
                "tessera.dcp on mesh %s of %d ranks needs torch.distributed's process group "
                "(dist.init_process_group) in every rank" % (self.mesh, self._mesh_size()),
                field="mesh")
        return [obj]

    def _mesh_size(self):
        answer = self.manager._get("/v1/meshes/%s/devices" % quote(self.mesh))
        size = 1
        for axis in answer.get("axes") or []:
            size *= int(axis["size"])
        return size

    def _attach(self, manifest, name, rank):
        """The tensor's view over the worker's shared memory. Kept on the shared
        manager: a tensor attached as before costs no request (a save that fails
        forgets them, so the next one attaches again)."""
        entry = manifest["tensors"][name]
        if name == layout.PACKED:
            shape = [manifest["packed_bytes"] * manifest["world"]]
        else:
            shape = entry["shape"]
        manager = self.manager
        views = manager.__dict__.setdefault("_dcp_views", {})
        desc = (tuple(shape), entry["dtype"], tuple(entry["layout"] or ()))
        held = views.get(name)
        if held is not None and held[0] == desc:
            return held[1]
        try:
            view = manager.attach(name, shape, entry["dtype"], layout=entry["layout"], like="torch")
        except TesseraError as e:
            if e.code != "conflict":
                raise
            # Held with another shape (the packed part grew, say): this process owns it.
            manager.detach(name)
            view = manager.attach(name, shape, entry["dtype"], layout=entry["layout"], like="torch")
        views[name] = (desc, view)
        return view


class Writer(_Endpoint, StorageWriter, AsyncStager):
    """DCP's storage writer (and, for dcp.async_save, its stager) into checkpoint
    `step` of Tessera mesh `mesh`.

    mesh:   a mesh with one axis (`axis`, default "rank") of one device per rank:
            rank r of the process group talks to the worker of device r.
    step:   the checkpoint's step; the ranks' saves of it make one checkpoint.
    worker: this rank's worker's local API (default: env TESSERA_WORKER).
    tier:   "disk" (default) or "memory": the memory tier's options (replicas,
            parity, keep, persist_every_steps, ...) go as keywords, as
            CheckpointManager.save takes them.
    compression, level: "zstd" (default) or "none", and zstd's level, as
            CheckpointManager.save takes them.
    timeout: seconds a call may take; finish() waits this long for the commit.
    """

    _synchronize_after_execute = False  # stage() returns once the bytes are staged

    def __init__(self, mesh, step, worker=None, tier="disk", timeout=600.0, credential_file=None,
                 axis="rank", compression=None, level=None, **memory):
        _Endpoint.__init__(self, mesh, worker, timeout, credential_file, axis)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise invalid_argument("step must be a non-negative int, not %r" % (step,), field="step")
        unknown = sorted(set(memory) - set(CheckpointManager.MEMORY_OPTIONS))
        if unknown:
            raise TypeError("Writer() got unexpected keyword argument(s) %s" % ", ".join(unknown))
        self.step = step
        self.tier = tier
        self.memory = memory
        self.compression = {k: v for k, v in (("compression", compression), ("level", level))
                            if v is not None}
        self._staged = None   # the manifest of what is in the worker's memory now
        self._local_items = None
        self._handle = None

    # -- the stager (dcp.async_save)

    def stage(self, state_dict):
        """Copies `state_dict` into the worker's shared memory once and returns an
        empty state dict: the background save only has the worker snapshot what is
        staged, so nothing of the state is pickled into DCP's checkpoint process."""
        t0 = time.perf_counter()
        planner = DefaultSavePlanner()
        planner.set_up_planner(state_dict, None, True)
        plan = planner.create_local_plan()
        self.stage_seconds = {"plan": time.perf_counter() - t0}
        self._stage_items(plan.items, planner)
        return {}

    def synchronize_staging(self):
        """stage() is synchronous: nothing to wait for."""

    def close(self):
        """The manager stays, shared with this process's other writers and readers."""
        self._manager = None

    def _stage_items(self, items, planner):
        rank = self._rank_and_world()
        chunks, mine = {}, []
        for item in items:
            fqn, offsets = item.index.fqn, list(item.index.offset or [])
            if item.type == WriteItemType.BYTE_IO:
                data = planner.resolve_data(item)
                data = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                mine.append(layout.describe(fqn, offsets, None, None, None, data))
                continue
            tensor = planner.resolve_data(item).detach()
            td = item.tensor_data
            mine.append(layout.describe(fqn, list(td.chunk.offsets), list(td.chunk.sizes),
                                        list(td.size), _dtype_name(tensor.dtype)))
            chunks[layout.key(fqn, td.chunk.offsets)] = tensor
        times = getattr(self, "stage_seconds", None) or {}
        t0 = time.perf_counter()
        last = self.manager.__dict__.get("_dcp_manifest")
        if last is None:
            manifest = self._agree(mine, rank)
            t1 = time.perf_counter()
            self._copy_in(manifest, chunks, rank)
        else:
            # The placement is agreed while the chunks are copied where the last save's
            # placement put them; a placement that changed is copied again.
            agreed = []
            helper = threading.Thread(target=lambda: agreed.append(self._agree_or_error(mine, rank)))
            helper.start()
            self._copy_in(last, chunks, rank)
            t1 = time.perf_counter()
            helper.join()
            if isinstance(agreed[0], BaseException):
                raise agreed[0]
            manifest = agreed[0]
            if _placement(manifest) != _placement(last):
                self._copy_in(manifest, chunks, rank)
        self.manager.__dict__["_dcp_manifest"] = manifest
        times.update(agree_and_copy=t1 - t0, total=time.perf_counter() - t0)
        self.stage_seconds = times  # where the last staging's time went
        self._staged = manifest

    def _agree(self, mine, rank):
        per_rank = self._gather(mine, rank)
        return layout.plan(per_rank, len(per_rank), self.axis, _itemsize)

    def _agree_or_error(self, mine, rank):
        try:
            return self._agree(mine, rank)
        except BaseException as e:  # noqa: BLE001 - raised again on the staging thread
            return e

    def _copy_in(self, manifest, chunks, rank):
        """Copies this rank's chunks into the worker's shared memory, where `manifest`
        places them."""
        for name in manifest["tensors"]:
            view = self._attach(manifest, name, rank)
            if name == layout.PACKED:
                for k, tensor in chunks.items():
                    where = manifest["items"].get(k)
                    if where is not None and where.get("rank") == rank:
                        flat = tensor.contiguous().reshape(-1).view(torch.uint8)
                        view[where["offset"]:where["offset"] + where["nbytes"]].copy_(flat)
                continue
            offsets, _ = layout.local_box(manifest["tensors"][name], rank, manifest["world"])
            for k, tensor in chunks.items():
                where = manifest["items"].get(k)
                if where and where.get("tensor") == name and list(where["offsets"]) == offsets:
                    view.copy_(tensor.reshape(view.shape))
                    break

    # -- the writer

    def reset(self, checkpoint_id=None):
        self._handle = None

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan):
        self._local_items = list(plan.items)  # before the coordinator's dedup
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def write_data(self, plan, planner):
        if self._staged is None:  # dcp.save: staged here, from every item this rank holds
            self._stage_items(self._local_items or plan.items, planner)
        manifest, self._staged = self._staged, None
        metadata = {_MANIFEST: manifest}
        try:
            self._handle = self.manager.save(self.step, tensors=sorted(manifest["tensors"]),
                                             metadata=metadata, tier=self.tier,
                                             **self.compression, **self.memory)
        except TesseraError:
            self.manager.__dict__.pop("_dcp_views", None)
            raise
        results = []
        for item in plan.items:
            k = layout.key(item.index.fqn, item.index.offset or [])
            results.append(WriteResult(index=item.index, size_in_bytes=0,
                                       storage_data=manifest["items"].get(k)))
        future = torch.futures.Future()
        future.set_result(results)
        return future

    def finish(self, metadata, results):
        """Returns once the checkpoint is committed; raises the save's error."""
        if self._handle is not None:
            try:
                self._handle.wait(self.timeout)
            except TesseraError:
                self.manager.__dict__.pop("_dcp_views", None)
                raise

    def storage_meta(self):
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return False  # chosen by passing a Writer, never by a path


class Reader(_Endpoint, StorageReader):
    """DCP's storage reader of a Tessera checkpoint of `mesh`.

    step: the step to load, or None: the newest committed step of the mesh.
    Loaded as saved (the same world size, rank r on the worker of device r of the
    mesh), each rank restores its shards through its worker, from the workers' RAM
    when the memory tier holds the step. Anything else (another world size or
    sharding, a rank outside the mesh) reads, through this rank's worker, only the
    boxes its state dict needs from the persisted checkpoint.
    """

    # One read call asks the worker for at most this many bytes.
    BATCH_BYTES = 256 << 20

    def __init__(self, mesh, step=None, worker=None, timeout=600.0, credential_file=None,
                 axis="rank"):
        _Endpoint.__init__(self, mesh, worker, timeout, credential_file, axis)
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise invalid_argument("step must be a non-negative int or None, not %r" % (step,),
                                   field="step")
        self.step = step
        self.restored = None  # what CheckpointManager.restore said, when it was used
        self.reset()

    def __getstate__(self):
        state = _Endpoint.__getstate__(self)
        state["_raw"] = None
        return state

    def reset(self, checkpoint_id=None):
        self._manifest = None
        self._record = None
        self._views = None
        self._member = None
        self._raw = getattr(self, "_raw", None)

    @property
    def raw(self):
        """The worker's local API, for calls that need no part in the mesh."""
        if self._raw is None:
            url = self.worker or os.environ.get("TESSERA_WORKER")
            if not url:
                raise invalid_argument("no worker to talk to: pass worker= or set TESSERA_WORKER",
                                       field="worker")
            self._raw = Endpoint(url, "worker", token=local_credential(url, self.credential_file),
                                 timeout=self.timeout)
        return self._raw

    def _member_rank(self):
        """This rank's device in the mesh when its worker is the mesh's worker of it."""
        if self._member is None:
            try:
                answer = self.raw.json("GET", "/v1/meshes/%s/devices" % quote(self.mesh))
            except TesseraError as e:
                if e.status in (0, 401):
                    raise
                answer = {"devices": [], "axes": []}  # a worker outside the mesh
            devices = answer["devices"]
            size = 1
            for axis in answer.get("axes") or []:
                size *= int(axis["size"])
            ok = len(devices) == 1
            if ok and dist.is_available() and dist.is_initialized():
                ok = dist.get_rank() == devices[0] and dist.get_world_size() == size
            self._member = devices[0] if ok else -1
        return None if self._member < 0 else self._member

    def _find(self):
        """The checkpoint's step and metadata. A rank of the mesh asks its worker, which
        agrees with the others on the step (the memory tier's too) and restores
        nothing yet; anyone else asks tesserad through its worker."""
        if self._member_rank() is not None:
            probe = self.manager.restore(self.step, tensors=[], strict=False, timeout=self.timeout)
            if probe is None:
                raise TesseraError("not_found", "mesh %s has no committed checkpoint" % self.mesh,
                                   404, {"mesh": self.mesh})
            return {"step": int(probe), "metadata": probe.metadata}
        step = "latest" if self.step is None else self.step
        return self.raw.json("GET", "/v1/checkpoints/%s%s" % (step, query({"mesh": self.mesh})))

    def read_metadata(self, *args, **kwargs):
        record = self._find()
        manifest = (record.get("metadata") or {}).get(_MANIFEST)
        if manifest is None:
            raise TesseraError("failed_precondition", "checkpoint %s of mesh %s was not saved "
                               "through tessera.dcp (no '%s' manifest in its metadata)"
                               % (record.get("step"), self.mesh, _MANIFEST), 409,
                               {"mesh": self.mesh, "step": record.get("step")})
        self._record, self._manifest = record, manifest
        state, storage = {}, {}
        for fqn, m in manifest["metadata"].items():
            if m["kind"] == "bytes":
                state[fqn] = BytesStorageMetadata()
                continue
            chunks = [ChunkStorageMetadata(offsets=torch.Size(c["offsets"]),
                                           sizes=torch.Size(c["sizes"])) for c in m["chunks"]]
            state[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=getattr(torch, m["dtype"])),
                size=torch.Size(m["size"]), chunks=chunks)
        for k, where in manifest["items"].items():
            fqn, _, offsets = k.rpartition("|")
            offset = None if "bytes" in where else torch.Size(
                [int(o) for o in offsets.split(",") if o])
            storage[MetadataIndex(fqn, offset)] = where
        return Metadata(state_dict_metadata=state, storage_data=storage)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def _as_saved(self):
        """This rank's rank in the checkpoint's mesh when it loads as saved, else None."""
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
        if world is not None and world != self._manifest["world"]:
            return None
        return self._member_rank()

    def _restore(self, rank):
        """The checkpoint's tensors restored into this rank's mappings (once)."""
        if self._views is None:
            views = {name: self._attach(self._manifest, name, rank)
                     for name in self._manifest["tensors"]}
            if views:
                self.restored = self.manager.restore(int(self._record["step"]),
                                                     tensors=sorted(views),
                                                     timeout=self.timeout, strict=False)
            self._views = views
        return self._views

    def _local(self, fqn, where, rank):
        """The stored chunk `where` from this rank's restored mappings, or None when
        another rank holds it."""
        manifest = self._manifest
        if "tensor" in where:
            entry = manifest["tensors"][where["tensor"]]
            offsets, _ = layout.local_box(entry, rank, manifest["world"])
            if list(where["offsets"]) != offsets:
                return None
            return self._restore(rank)[where["tensor"]]
        if where.get("rank") != rank:
            return None
        meta = manifest["metadata"][fqn]
        flat = self._restore(rank)[layout.PACKED][where["offset"]:where["offset"] + where["nbytes"]]
        return flat.view(getattr(torch, meta["dtype"])).reshape(self._chunk_sizes(fqn, where))

    def _box(self, fqn, where, req):
        """(tensor, offsets, lengths, dtype, shape) of the box `req` needs, read remotely."""
        meta = self._manifest["metadata"][fqn]
        if "tensor" in where:
            offsets = [o + s for o, s in zip(where["offsets"], req.storage_offsets)]
            return (where["tensor"], offsets, list(req.lengths), meta["dtype"], list(req.lengths),
                    None)
        length = self._manifest["packed_bytes"]
        start = where["rank"] * length + where["offset"]
        return (layout.PACKED, [start], [where["nbytes"]], meta["dtype"],
                self._chunk_sizes(fqn, where), req)

    def _read_remote(self, wanted):
        """Reads [(req, box)] through the worker in batches; yields (req, tensor)."""
        step = int(self._record["step"])
        path = "/v1/checkpoints/%d/read%s" % (step, query({"mesh": self.mesh}))
        batch, size = [], 0
        for req, box in wanted + [(None, None)]:
            nbytes = 0
            if box is not None:
                nbytes = _itemsize(box[3]) if box[0] != layout.PACKED else 1
                for n in box[2]:
                    nbytes *= n
            if batch and (box is None or size + nbytes > self.BATCH_BYTES):
                body = {"reads": [{"tensor": b[0], "offsets": b[1], "lengths": b[2]}
                                  for _, b, _ in batch]}
                _, _, data = self.raw.call("POST", path, body, timeout=self.timeout)
                # One writable buffer for the whole answer, viewed per box: no copy
                # besides the one into the target.
                whole = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
                    torch.empty(0, dtype=torch.uint8)
                del data
                at = 0
                for r, b, n in batch:
                    raw = whole[at:at + n]
                    if at % 8:  # a view as a wider dtype needs its alignment
                        raw = raw.clone()
                    at += n
                    t = raw.view(getattr(torch, b[3])).reshape(b[4])
                    if b[5] is not None:  # a packed chunk: narrow to what the request needs
                        for d, (o, ln) in enumerate(zip(r.storage_offsets, r.lengths)):
                            t = t.narrow(d, o, ln)
                    yield r, t
                batch, size = [], 0
            if box is not None:
                batch.append((req, box, nbytes))
                size += nbytes

    def read_data(self, plan, planner):
        rank = self._as_saved()
        remote = []
        for req in plan.items:
            fqn = req.storage_index.fqn
            where = self.storage_data.get(req.storage_index)
            if where is None:
                raise TesseraError("not_found", "checkpoint %s of mesh %s has no '%s' at %s" % (
                    self._record["step"], self.mesh, fqn, list(req.storage_index.offset or [])),
                    404, {"tensor": fqn, "step": self._record["step"]})
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(base64.b64decode(where["bytes"])))
                continue
            source = self._local(fqn, where, rank) if rank is not None else None
            if source is None:
                remote.append((req, self._box(fqn, where, req)))
                continue
            for d, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                source = source.narrow(d, o, n)
            self._commit(planner, req, source)
        for req, source in self._read_remote(remote):
            self._commit(planner, req, source)
        future = torch.futures.Future()
        future.set_result(None)
        return future

    @staticmethod
    def _commit(planner, req, source):
        target = planner.resolve_tensor(req).detach()
        target.copy_(source)
        planner.commit_tensor(req, target)

    def _chunk_sizes(self, fqn, where):
        offsets = where.get("chunk")
        for c in self._manifest["metadata"][fqn]["chunks"]:
            if offsets is None or list(c["offsets"]) == list(offsets):
                return c["sizes"]
        raise TesseraError("data_loss", "the manifest has no chunk of '%s' at %s" % (
            fqn, offsets), 500, {"tensor": fqn})

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return False
