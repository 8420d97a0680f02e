"""How a pytree of jax.Arrays becomes Tessera tensors (tessera.jax), without I/O.

Each array leaf is one Tessera tensor named by its path in the tree ("params/dense/
kernel"), its layout taken from its NamedSharding's PartitionSpec: a dimension sharded
over one mesh axis is sharded over the Tessera mesh's axis of that name; an
unsharded one, or an array replicated on every device, is unsharded. Device k of
the Tessera mesh is the JAX mesh's device at flat position k (mesh.devices.flat),
so the two meshes have the same axes in the same order. Any other leaf (a Python
int, float, string, None) is JSON in the checkpoint's metadata.
"""

import numpy as np

from ._dcp_layout import tensor_name
from .errors import invalid_argument

MANIFEST = "jax"  # the key of the manifest in the checkpoint's metadata


def path_text(path):
    """A key path as jax.tree_util.keystr would show it, and a Tessera name for it."""
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(tensor_name(p) for p in parts) or "-"


def is_array(leaf):
    return hasattr(leaf, "shape") and hasattr(leaf, "dtype") and not isinstance(leaf, (bool, int,
                                                                                       float))


def layout_of(sharding, ndim, where):
    """Tessera's layout (None: replicated) of an array with `sharding`, and its mesh
    (None when replicated without a NamedSharding)."""
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    if spec is None or mesh is None:
        if getattr(sharding, "is_fully_replicated", False):
            return None, None
        raise invalid_argument("'%s' has a %s, which tessera.jax cannot lay out: shard it "
                               "with a NamedSharding (or replicate it)" % (
                                   where, type(sharding).__name__), field="sharding", tensor=where)
    entries = list(spec) + [None] * (ndim - len(spec))
    out = []
    for d, e in enumerate(entries[:ndim]):
        if isinstance(e, (tuple, list)):
            e = [a for a in e if a is not None]
            if len(e) > 1:
                raise invalid_argument(
                    "'%s' shards dimension %d over the axes %s: a Tessera layout shards a "
                    "dimension over one axis" % (where, d, e), field="sharding", tensor=where)
            e = e[0] if e else None
        out.append(e)
    return (None if all(e is None for e in out) else out), mesh


def check_mesh(jax_mesh, axes, where):
    """A JAX mesh must have the Tessera mesh's axes, names and sizes in order."""
    have = [(str(n), int(s)) for n, s in zip(jax_mesh.axis_names, jax_mesh.devices.shape)]
    want = [(a["name"], int(a["size"])) for a in axes]
    if have != want:
        raise invalid_argument(
            "'%s' lives on a JAX mesh %s; the Tessera mesh has %s: give both the same axes "
            "in the same order" % (where, have, want), field="sharding", tensor=where)


def device_positions(jax_mesh):
    """{jax device id: its flat position in the mesh}: Tessera's device number."""
    return {d.id: k for k, d in enumerate(np.asarray(jax_mesh.devices).flat)}


def box_of(index, shape):
    """(offsets, lengths) of a shard's index (a tuple of slices) in an array of `shape`."""
    offsets, lengths = [], []
    for d, n in enumerate(shape):
        s = index[d] if d < len(index) else slice(None)
        start, stop, step = s.indices(n)
        if step != 1:
            raise invalid_argument("a shard with a strided index %s" % (index,), field="sharding")
        offsets.append(start)
        lengths.append(stop - start)
    return offsets, lengths


def jsonable(leaf, where):
    """A non-array leaf as JSON, or a clear refusal naming it."""
    if leaf is None or isinstance(leaf, (bool, int, float, str)):
        return leaf
    if isinstance(leaf, np.generic):
        return leaf.item()
    raise invalid_argument("'%s' is a %s: tessera.jax saves arrays and JSON values (int, float, "
                           "str, bool, None)" % (where, type(leaf).__name__), field="tree",
                           tensor=where)
