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

import numpy as np
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
from .errors import TesseraError, invalid_argument
from .manager import CheckpointManager

__all__ = ["Reader", "Writer"]

_MANIFEST = "dcp"  # the key of the manifest in the checkpoint's metadata


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


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
        if self._manager is None:
            self._manager = CheckpointManager(self.mesh, worker=self.worker, timeout=self.timeout,
                                              credential_file=self.credential_file)
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
        """Every rank's `obj` (JSON), in rank order: over the process group when there
        is one, else over the mesh's collectives."""
        if dist.is_available() and dist.is_initialized():
            out = [None] * dist.get_world_size()
            dist.all_gather_object(out, obj)
            return out
        data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
        sizes = self.manager.all_gather(np.array([data.size], dtype=np.int64))
        longest = int(sizes.max())
        padded = np.zeros(longest, dtype=np.uint8)
        padded[:data.size] = data
        parts = self.manager.all_gather(padded)
        return [json.loads(bytes(parts[r][:int(sizes[r][0])])) for r in range(len(parts))]

    def _attach(self, manifest, name, rank):
        entry = manifest["tensors"][name]
        if name == layout.PACKED:
            shape = [manifest["packed_bytes"] * manifest["world"]]
        else:
            shape = entry["shape"]
        return self.manager.attach(name, shape, entry["dtype"], layout=entry["layout"],
                                   like="torch")


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
    timeout: seconds a call may take; finish() waits this long for the commit.
    """

    _synchronize_after_execute = False  # stage() returns once the bytes are staged

    def __init__(self, mesh, step, worker=None, tier="disk", timeout=600.0, credential_file=None,
                 axis="rank", **memory):
        _Endpoint.__init__(self, mesh, worker, timeout, credential_file, axis)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise invalid_argument("step must be a non-negative int, not %r" % (step,), field="step")
        unknown = sorted(set(memory) - set(CheckpointManager.MEMORY_OPTIONS))
        if unknown:
            raise TypeError("Writer() got unexpected keyword argument(s) %s" % ", ".join(unknown))
        self.step = step
        self.tier = tier
        self.memory = memory
        self._staged = None   # the manifest of what is in the worker's memory now
        self._local_items = None
        self._handle = None

    # -- the stager (dcp.async_save)

    def stage(self, state_dict):
        """Copies `state_dict` into the worker's shared memory once and returns an
        empty state dict: the background save only has the worker snapshot what is
        staged, so nothing of the state is pickled into DCP's checkpoint process."""
        planner = DefaultSavePlanner()
        planner.set_up_planner(state_dict, None, True)
        plan = planner.create_local_plan()
        self._stage_items(plan.items, planner)
        return {}

    def synchronize_staging(self):
        """stage() is synchronous: nothing to wait for."""

    def close(self):
        """Nothing to let go of beyond the manager's connection."""
        if self._manager is not None:
            self._manager.close()
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
        per_rank = self._gather(mine, rank)
        manifest = layout.plan(per_rank, len(per_rank), self.axis, _itemsize)
        for name in manifest["tensors"]:
            view = self._attach(manifest, name, rank)
            if name == layout.PACKED:
                for k, tensor in chunks.items():
                    where = manifest["items"][k]
                    if where.get("rank") == rank:
                        flat = tensor.contiguous().reshape(-1).view(torch.uint8)
                        view[where["offset"]:where["offset"] + where["nbytes"]].copy_(flat)
                continue
            entry = manifest["tensors"][name]
            offsets, _ = layout.local_box(entry, rank, manifest["world"])
            for k, tensor in chunks.items():
                where = manifest["items"].get(k)
                if where and where.get("tensor") == name and list(where["offsets"]) == offsets:
                    view.copy_(tensor.reshape(view.shape))
                    break
        self._staged = manifest

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
        self._handle = self.manager.save(self.step, tensors=sorted(manifest["tensors"]),
                                         metadata=metadata, tier=self.tier, **self.memory)
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
            self._handle.wait(self.timeout)

    def storage_meta(self):
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return False  # chosen by passing a Writer, never by a path


class Reader(_Endpoint, StorageReader):
    """DCP's storage reader of a Tessera checkpoint of `mesh`.

    step: the step to load, or None: the newest step every rank's worker saw
          committed (the ranks agree on it). A checkpoint the memory tier holds
          is read from the workers' RAM.
    Each rank reads through its worker what its state dict needs of its own shard
    of the checkpoint (mesh, world size and sharding as saved).
    """

    def __init__(self, mesh, step=None, worker=None, timeout=600.0, credential_file=None,
                 axis="rank"):
        _Endpoint.__init__(self, mesh, worker, timeout, credential_file, axis)
        self.step = step
        self._manifest = None
        self._restored = None

    def reset(self, checkpoint_id=None):
        self._manifest = None
        self._restored = None

    def _restore(self):
        """Restores the checkpoint's tensors into this rank's mappings (once) and
        returns the manifest."""
        if self._restored is not None:
            return self._manifest
        rank = self._rank_and_world()
        record = self.manager.checkpoint(self.step)
        manifest = (record.get("metadata") or {}).get(_MANIFEST)
        if manifest is None:
            raise TesseraError("failed_precondition", "checkpoint %s of mesh %s was not saved "
                               "through tessera.dcp (no '%s' manifest)" % (record.get("step"),
                                                                           self.mesh, _MANIFEST),
                               409, {"mesh": self.mesh, "step": record.get("step")})
        views = {name: self._attach(manifest, name, rank) for name in manifest["tensors"]}
        if views:
            restored = self.manager.restore(record["step"], tensors=sorted(views),
                                            timeout=self.timeout, strict=False)
            self.restored_step = int(restored)
        self._manifest, self._restored, self._rank = manifest, views, rank
        return manifest

    def read_metadata(self, *args, **kwargs):
        manifest = self._restore()
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
            index = MetadataIndex(fqn, offset)
            storage[index] = where
        return Metadata(state_dict_metadata=state, storage_data=storage)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def _chunk(self, fqn, where, entry_sizes):
        """The stored chunk `where` as a tensor of this rank's mappings."""
        manifest, rank = self._manifest, self._rank
        if "tensor" in where:
            name = where["tensor"]
            entry = manifest["tensors"][name]
            offsets, _ = layout.local_box(entry, rank, manifest["world"])
            if list(where["offsets"]) != offsets:
                raise TesseraError(
                    "unimplemented", "'%s': this rank (%d) needs the chunk at %s, another "
                    "rank's shard: loading onto another sharding or world size is not "
                    "supported yet" % (fqn, rank, where["offsets"]), 501,
                    {"tensor": fqn, "rank": rank})
            return self._restored[name]
        if where.get("rank") != rank:
            raise TesseraError(
                "unimplemented", "'%s': this rank (%d) needs the chunk rank %d saved: loading "
                "onto another sharding or world size is not supported yet"
                % (fqn, rank, where.get("rank")), 501, {"tensor": fqn, "rank": rank})
        meta = manifest["metadata"][fqn]
        flat = self._restored[layout.PACKED][where["offset"]:where["offset"] + where["nbytes"]]
        return flat.view(getattr(torch, meta["dtype"])).reshape(entry_sizes)

    def read_data(self, plan, planner):
        self._restore()
        for req in plan.items:
            where = self.storage_data.get(req.storage_index)
            fqn = req.storage_index.fqn
            if where is None:
                raise TesseraError("not_found", "the checkpoint has no '%s' at %s" % (
                    fqn, list(req.storage_index.offset or [])), 404, {"tensor": fqn})
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(base64.b64decode(where["bytes"])))
                continue
            chunk_sizes = self._chunk_sizes(fqn, req.storage_index.offset)
            source = self._chunk(fqn, where, chunk_sizes)
            for d, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                source = source.narrow(d, o, n)
            target = planner.resolve_tensor(req).detach()
            target.copy_(source)
            planner.commit_tensor(req, target)
        future = torch.futures.Future()
        future.set_result(None)
        return future

    def _chunk_sizes(self, fqn, offsets):
        for c in self._manifest["metadata"][fqn]["chunks"]:
            if list(c["offsets"]) == list(offsets or []):
                return c["sizes"]
        raise TesseraError("not_found", "the checkpoint has no chunk of '%s' at %s" % (
            fqn, list(offsets or [])), 404, {"tensor": fqn})

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return False

