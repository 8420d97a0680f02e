"""How a DCP state dict becomes Tessera tensors (tessera.dcp), without torch's I/O.

Every rank describes the items its planner would write: (fqn, chunk offsets,
chunk sizes, global size, dtype) for a tensor chunk, the bytes for anything else.
With every rank's descriptions in hand (an all-gather), each rank decides the
same placement:

- a tensor every rank holds whole (same dtype and size): one Tessera tensor,
  replicated, written once by one of its holders;
- a tensor each of the W ranks holds one even chunk of along one dimension, rank r
  the r-th: one Tessera tensor sharded over the mesh's axis on that dimension;
- any other tensor chunk: bytes in this rank's part of "_dcp/packed", a uint8
  tensor sharded over the axis (W parts of the largest rank's size);
- a non-tensor item: its bytes (torch.save's) in the manifest, base64.

The manifest (JSON, the same on every rank) is the checkpoint's metadata: it says
where each (fqn, offsets) lives and rebuilds DCP's Metadata on load.
"""

import base64
import re

PACKED = "_dcp/packed"
ALIGN = 64
# Tessera's dtypes (docs/format.md); a tensor of any other dtype is packed as bytes.
NAMED_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32",
                "int64", "uint8", "bool")
_PLAIN = re.compile(r"[A-Za-z0-9._]")


def tensor_name(fqn):
    """A Tessera tensor name for `fqn`: letters, digits, '.' and '_' kept, every other
    character as -HH (its UTF-8 bytes); so no name of ours made this way has a '/'."""
    out = []
    for ch in fqn:
        if _PLAIN.fullmatch(ch):
            out.append(ch)
        else:
            out.extend("-%02X" % b for b in ch.encode("utf-8"))
    name = "".join(out) or "-"
    if name in (".", "..") or name.startswith("."):
        name = "-2E" + name[1:]
    return name


def describe(fqn, offsets, sizes, size, dtype, data=None):
    """One item a rank holds: a tensor chunk (data None) or bytes."""
    if data is not None:
        return {"fqn": fqn, "offsets": list(offsets), "bytes": base64.b64encode(data).decode()}
    return {"fqn": fqn, "offsets": list(offsets), "sizes": list(sizes), "size": list(size),
            "dtype": dtype}


def _even_dim(chunks, size, world):
    """The dimension along which `chunks` (rank r's at index r) are the W even parts
    of a tensor of `size`, or None."""
    if len(chunks) != world or world < 2 or not size:
        return None
    for dim, extent in enumerate(size):
        if extent % world:
            continue
        part = extent // world
        if all(c is not None
               and list(c["offsets"]) == [r * part if d == dim else 0 for d in range(len(size))]
               and list(c["sizes"]) == [part if d == dim else size[d] for d in range(len(size))]
               for r, c in enumerate(chunks)):
            return dim
    return None


def plan(per_rank, world, axis, itemsize):
    """The placement every rank agrees on, from every rank's descriptions.

    per_rank: [rank] -> [description]; itemsize(dtype) -> bytes per element.
    Returns the manifest: {"world", "axis", "tensors": {name: {dtype, shape, layout}},
    "items": {key: where}, "metadata": {fqn: ...}, "packed_bytes": L}; key is
    "fqn|o1,o2". where is {"tensor", "offsets"} for a named tensor,
    {"rank", "offset", "nbytes"} for packed bytes, {"bytes"} for a non-tensor item.
    """
    by_fqn = {}
    for rank, items in enumerate(per_rank):
        for item in items:
            by_fqn.setdefault(item["fqn"], []).append((rank, item))
    tensors, where, metadata = {}, {}, {}
    packed = [[] for _ in range(world)]
    for fqn in sorted(by_fqn):
        held = by_fqn[fqn]
        first = held[0][1]
        if "bytes" in first:
            metadata[fqn] = {"kind": "bytes"}
            where[key(fqn, first["offsets"])] = {"bytes": first["bytes"]}
            continue
        size, dtype = list(first["size"]), first["dtype"]
        if any("bytes" in i or list(i["size"]) != size or i["dtype"] != dtype for _, i in held):
            raise ValueError("ranks disagree on what '%s' is: %s" % (
                fqn, sorted({(r, i.get("dtype"), str(i.get("size"))) for r, i in held})))
        chunks = {}
        for rank, item in held:
            chunks.setdefault(tuple(item["offsets"]), item)
        metadata[fqn] = {"kind": "tensor", "dtype": dtype, "size": size,
                         "chunks": [{"offsets": list(o), "sizes": list(c["sizes"])}
                                    for o, c in sorted(chunks.items())]}
        name = tensor_name(fqn)
        whole = [i for _, i in held if list(i["sizes"]) == size and not any(i["offsets"])]
        ranks = {r for r, _ in held}
        if dtype in NAMED_DTYPES and len(whole) == len(held) and ranks == set(range(world)):
            tensors[name] = {"dtype": dtype, "shape": size, "layout": None}
            where[key(fqn, [0] * len(size))] = {"tensor": name, "offsets": [0] * len(size)}
            continue
        by_rank = [None] * world
        for rank, item in held:
            by_rank[rank] = item if by_rank[rank] is None else False
        dim = _even_dim(by_rank, size, world) if dtype in NAMED_DTYPES and False not in by_rank \
            else None
        if dim is not None:
            tensors[name] = {"dtype": dtype, "shape": size,
                             "layout": [axis if d == dim else None for d in range(len(size))]}
            for item in by_rank:
                where[key(fqn, item["offsets"])] = {"tensor": name, "offsets": item["offsets"]}
            continue
        # Packed: each chunk once, by the lowest rank holding it.
        for offsets, item in sorted(chunks.items()):
            owner = min(r for r, i in held if tuple(i["offsets"]) == offsets)
            nbytes = itemsize(dtype)
            for s in item["sizes"]:
                nbytes *= s
            packed[owner].append((key(fqn, offsets), nbytes, list(offsets)))
    length = 0
    for rank, entries in enumerate(packed):
        at = 0
        for k, nbytes, offsets in entries:
            where[k] = {"rank": rank, "offset": at, "nbytes": nbytes, "chunk": offsets}
            at += -(-nbytes // ALIGN) * ALIGN
        length = max(length, at)
    if length:
        tensors[PACKED] = {"dtype": "uint8", "shape": [world * length], "layout": [axis]}
    return {"version": 1, "world": world, "axis": axis, "tensors": tensors, "items": where,
            "metadata": metadata, "packed_bytes": length}


def key(fqn, offsets):
    return "%s|%s" % (fqn, ",".join(str(int(o)) for o in offsets))


def local_box(entry, layout_rank, world):
    """For a named tensor entry, the (offsets, sizes) of rank `layout_rank`'s shard."""
    shape, layout = entry["shape"], entry["layout"]
    offsets, sizes = [0] * len(shape), list(shape)
    for d, a in enumerate(layout or []):
        if a is not None:
            sizes[d] = shape[d] // world
            offsets[d] = layout_rank * sizes[d]
    return offsets, sizes
