"""tessera.dcp.Writer: DCP's storage writer and async stager (docs/dcp.md)."""

import base64
import dataclasses
import io
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import StorageWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import WriteResult

from . import _dcp_layout as layout
from ._dcp_endpoint import (BYTES_KEY, DIGEST, MANIFEST, RankEndpoint, digest, dtype_name,
                            itemsize, placement)
from .errors import TesseraError, invalid_argument
from .manager import CheckpointManager


_YIELD_S = 0.002


class Writer(RankEndpoint, StorageWriter, AsyncStager):
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
        RankEndpoint.__init__(self, mesh, worker, timeout, credential_file, axis)
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
        self._bytes = {}      # this rank's non-tensor items, key -> base64
        self._collectives = True
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
        """Agrees with the other ranks where every chunk goes and copies this rank's
        chunks there. A rank that saved before copies where the last save put them
        first; one small all-gather then says whether every rank's items are the ones
        of the last save (the placement stands), else the ranks gather their items'
        descriptions and place them anew, and a chunk placed elsewhere is copied
        again. Non-tensor items' bytes stay here until write_data (_fill_bytes)."""
        rank = self._rank_and_world()
        chunks, mine, payloads = {}, [], {}
        for item in items:
            fqn, offsets = item.index.fqn, list(item.index.offset or [])
            if item.type == WriteItemType.BYTE_IO:
                data = planner.resolve_data(item)
                data = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                mine.append(layout.describe(fqn, offsets, None, None, None, b""))
                payloads[layout.key(fqn, offsets)] = base64.b64encode(data).decode()
                continue
            tensor = planner.resolve_data(item).detach()
            td = item.tensor_data
            mine.append(layout.describe(fqn, list(td.chunk.offsets), list(td.chunk.sizes),
                                        list(td.size), dtype_name(tensor.dtype)))
            chunks[layout.key(fqn, td.chunk.offsets)] = tensor
        times = getattr(self, "stage_seconds", None) or {}
        t0 = time.perf_counter()
        cache = self.manager.__dict__
        last = cache.get("_dcp_manifest")
        structure = digest(mine)
        same = last is not None and cache.get("_dcp_structure") == structure
        # Posted before the copy and answered by the process group's own thread: the
        # votes are in by the time the copy ends unless a rank came late.
        votes = self._post_votes(same, digest(placement(last)) if same else b"", rank)
        if last is not None:
            self._copy_in(last, chunks, rank)
        t1 = time.perf_counter()
        votes = votes()
        if all(v == votes[0] for v in votes) and votes[0][0]:
            manifest = last
        else:
            manifest = self._agree(mine, rank)
        if last is None or placement(manifest) != placement(last):
            self._copy_in(manifest, chunks, rank)
        cache["_dcp_manifest"], cache["_dcp_structure"] = manifest, structure
        times.update(copy=t1 - t0, total=time.perf_counter() - t0)
        self.stage_seconds = times  # where the last staging's time went
        self._staged, self._bytes = manifest, payloads

    def _post_votes(self, same, last_placement, rank):
        """Starts the all-gather of every rank's (items as last time?, digest of the
        last placement), a few bytes each; returns the call that waits for them, in
        rank order."""
        if not (dist.is_available() and dist.is_initialized()):
            votes = [tuple(v) for v in self._gather([same, last_placement.hex()], rank)]
            return lambda: votes
        mine = torch.zeros(1 + DIGEST, dtype=torch.uint8)
        if same:
            mine[0] = 1
            mine[1:] = torch.frombuffer(bytearray(last_placement), dtype=torch.uint8)
        out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        work = dist.all_gather(out, mine, async_op=True)

        def wait():
            work.wait()
            return [(bool(v[0]), bytes(v[1:].tolist())) for v in out]
        return wait

    def _agree(self, mine, rank):
        per_rank = self._gather(mine, rank)
        return layout.plan(per_rank, len(per_rank), self.axis, itemsize)

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
        self._collectives = kwargs.get("use_collectives", True)
        if self._staged is not None and threading.current_thread() is not threading.main_thread():
            # dcp.async_save's background save of what stage() staged, on a thread of the
            # trainer's process: give the GIL back once, so that the trainer's thread
            # returns from async_save now instead of after a switch interval (5 ms).
            time.sleep(_YIELD_S)

    def prepare_local_plan(self, plan):
        self._local_items = list(plan.items)  # before the coordinator's dedup
        if self._staged is not None:  # staged bytes ride on DCP's own plan exchange
            plan = dataclasses.replace(plan, storage_data={BYTES_KEY: self._bytes})
        return plan

    def prepare_global_plan(self, plans):
        """Every rank's plan carries every rank's non-tensor bytes, the lowest
        rank's where several hold one item."""
        parts = [p.storage_data.get(BYTES_KEY) if isinstance(p.storage_data, dict) else None
                 for p in plans]
        if any(part is None for part in parts):  # dcp.save: staged in write_data
            return plans
        merged = {}
        for part in parts:
            for k, v in part.items():
                merged.setdefault(k, v)
        return [dataclasses.replace(p, storage_data={BYTES_KEY: merged, "complete": True})
                for p in plans]

    def _fill_bytes(self, manifest, plan):
        """The manifest with every non-tensor item's bytes: from DCP's plan exchange,
        or (dcp.save, or no collectives) gathered here."""
        data = plan.storage_data if isinstance(plan.storage_data, dict) else {}
        if data.get("complete") and self._collectives:
            merged = data[BYTES_KEY]
        else:
            merged = {}
            for part in self._gather(self._bytes, self._rank_and_world()):
                for k, v in part.items():
                    merged.setdefault(k, v)
        items = dict(manifest["items"])
        for k, where in items.items():
            if "bytes" in where:
                if k not in merged:
                    raise TesseraError("internal", "no rank sent the bytes of '%s'" % k, 500,
                                       {"tensor": k})
                items[k] = {"bytes": merged[k]}
        return dict(manifest, items=items)

    def write_data(self, plan, planner):
        if self._staged is None:  # dcp.save: staged here, from every item this rank holds
            self._stage_items(self._local_items or plan.items, planner)
        manifest, self._staged = self._fill_bytes(self._staged, plan), None
        metadata = {MANIFEST: manifest}
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
