"""One shared-memory file of the worker, mapped into the trainer's process."""

import mmap
import os

import numpy as np

from . import _dtypes


class Mapping:
    """One shared-memory file of the worker, mapped into this process. The mmap
    object lives as long as any view of it (see close)."""

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
        """Forgets the mapping here. It is not unmapped: every array and tensor made
        over it holds a reference to the mmap object (numpy through a buffer export,
        torch.frombuffer through the object itself), and so do the parameters that
        attach_state_dict re-pointed at it. The memory goes when the last of them
        does, so nothing can read or write it after it is unmapped, and a later
        mapping never lands under a live tensor."""
        self.views.clear()
        self.mm = None
