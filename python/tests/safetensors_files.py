"""A safetensors reader and writer of the tests' own (numpy on the bytes, following the
format: an 8-byte little-endian header size, a JSON header, the tensors' bytes), so
that what Tessera writes is read, and what it reads is written, by code it does not
share."""

import json
import struct

import numpy as np

NUMPY = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "BF16": "<u2", "I8": "i1", "I16": "<i2",
         "I32": "<i4", "I64": "<i8", "U8": "u1", "BOOL": "?"}
NAME = {np.dtype(v).str: k for k, v in NUMPY.items() if k != "BF16"}


def read_safetensors(path):
    """{name: (dtype, array)} and the metadata of one file, checking its layout."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data) and n % 8 == 0, (path, n)
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in meta.values()), meta
    out, end = {}, 0
    for name, h in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = h["data_offsets"]
        assert b == end and e <= len(body), (name, h)  # contiguous, inside the file
        end = e
        arr = np.frombuffer(body[b:e], dtype=NUMPY[h["dtype"]]).reshape(h["shape"])
        out[name] = (h["dtype"], arr)
    assert end == len(body), "bytes after the last tensor"
    return out, meta


def write_safetensors(path, tensors, metadata=None, header_size=None):
    """Writes {name: array} (or {name: (dtype name, array)}, for BF16 as uint16 bits)
    as one file; header_size overrides the size written in front (to make bad files)."""
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        dtype, arr = value if isinstance(value, tuple) else (NAME[np.dtype(value.dtype).str], value)
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    n = len(text) if header_size is None else header_size
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + text + b"".join(blobs))


def write_model_folder(folder, shards, metadata=None):
    """A Hugging Face sharded model folder: shards [{name: array}, ...] as
    model-0000k-of-0000N.safetensors with model.safetensors.index.json."""
    folder.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    for k, tensors in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
        write_safetensors(folder / name, tensors, metadata)
        for t, arr in tensors.items():
            weight_map[t] = name
            total += (arr[1] if isinstance(arr, tuple) else arr).nbytes
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
