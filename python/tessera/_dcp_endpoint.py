"""What tessera.dcp's Writer and Reader share: the per-process managers, the
manifest's helpers and the endpoint of a rank's worker."""

import hashlib
import json
import os
import threading

import torch
import torch.distributed as dist

from . import _dcp_layout as layout
from .errors import TesseraError, invalid_argument
from .manager import CheckpointManager


MANIFEST = "dcp"  # the key of the manifest in the checkpoint's metadata
_MANAGERS = {}      # (pid, mesh, worker, credential file, timeout) -> CheckpointManager
_MANAGERS_LOCK = threading.Lock()


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def placement(manifest):
    """What decides where chunks go: the tensors and every tensor chunk's place."""
    items = {k: v for k, v in manifest["items"].items() if "bytes" not in v}
    return manifest["world"], manifest["tensors"], items


DIGEST = 16
BYTES_KEY = "tessera_bytes"  # a plan's storage_data key: non-tensor items' bytes


def digest(obj):
    """A short digest of JSON `obj`, the same on every rank for the same value."""
    return hashlib.blake2b(json.dumps(obj, sort_keys=True).encode(), digest_size=DIGEST).digest()


def devices_in(answer):
    """The mesh's device count from a worker's GET /v1/meshes/{m}/devices answer."""
    size = 1
    for axis in answer.get("axes") or []:
        size *= int(axis["size"])
    return size


def itemsize(name):
    return torch.empty((), dtype=getattr(torch, name)).element_size()


class RankEndpoint:
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
        return devices_in(self.manager.placement)

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
