"""tessera.dcp.Reader: DCP's storage reader (docs/dcp.md)."""

import base64
import io
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import Metadata, StorageReader
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType

from . import _dcp_layout as layout
from ._box_reads import BATCH_BYTES, read_boxes
from ._dcp_endpoint import MANIFEST, RankEndpoint, devices_in, itemsize
from ._http import Endpoint, local_credential, query, quote
from .errors import TesseraError, invalid_argument


class Reader(RankEndpoint, StorageReader):
    """DCP's storage reader of a Tessera checkpoint of `mesh`.

    step: the step to load, or None: the newest committed step of the mesh.
    Loaded as saved (the same world size, rank r on the worker of device r of the
    mesh), each rank restores its shards through its worker, from the workers' RAM
    when the memory tier holds the step. Anything else (another world size or
    sharding, a rank outside the mesh) reads, through this rank's worker, only the
    boxes its state dict needs from the persisted checkpoint.
    """

    # One read call asks the worker for at most this many bytes.
    BATCH_BYTES = BATCH_BYTES

    def __init__(self, mesh, step=None, worker=None, timeout=600.0, credential_file=None,
                 axis="rank"):
        RankEndpoint.__init__(self, mesh, worker, timeout, credential_file, axis)
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise invalid_argument("step must be a non-negative int or None, not %r" % (step,),
                                   field="step")
        self.step = step
        self.restored = None  # what CheckpointManager.restore said, when it was used
        self.reset()

    def __getstate__(self):
        state = RankEndpoint.__getstate__(self)
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
            devices, size = answer["devices"], devices_in(answer)
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
        manifest = (record.get("metadata") or {}).get(MANIFEST)
        if manifest is None:
            raise TesseraError("failed_precondition", "checkpoint %s of mesh %s was not saved "
                               "through tessera.dcp (no '%s' manifest in its metadata)"
                               % (record.get("step"), self.mesh, MANIFEST), 409,
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
        boxes = []
        for req, box in wanted:
            nbytes = itemsize(box[3]) if box[0] != layout.PACKED else 1
            for n in box[2]:
                nbytes *= n
            boxes.append(((req, box), box[0], box[1], box[2], nbytes))
        for (r, b), raw in read_boxes(self.raw, self.mesh, int(self._record["step"]), boxes,
                                      self.timeout, self.BATCH_BYTES):
            t = torch.frombuffer(raw, dtype=torch.uint8) if len(raw) else \
                torch.empty(0, dtype=torch.uint8)
            if t.data_ptr() % 8:  # a view as a wider dtype needs its alignment
                t = t.clone()
            t = t.view(getattr(torch, b[3])).reshape(b[4])
            if b[5] is not None:  # a packed chunk: narrow to what the request needs
                for d, (o, ln) in enumerate(zip(r.storage_offsets, r.lengths)):
                    t = t.narrow(d, o, ln)
            yield r, t

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
