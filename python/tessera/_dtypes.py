"""Dtype names of docs/openapi.json, and their numpy and torch counterparts."""

import sys

import numpy as np

from .errors import invalid_argument

# The worker's names (api/dtype.cc) and their element sizes.
SIZES = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1,
    "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "bool": 1,
}

_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64",
            "int": "int32", "bf16": "bfloat16"}


def torch_module():
    """The torch module, imported on first use only."""
    try:
        import torch  # noqa: PLC0415 - optional dependency, imported lazily
    except ImportError as e:
        raise invalid_argument("torch is not installed (%s); use like=\"numpy\"" % e,
                               field="like") from None
    return torch


def _is_torch_dtype(dtype):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(dtype, torch.dtype)


def dtype_name(dtype, field="dtype"):
    """docs/openapi.json's name of a numpy dtype, a torch dtype, or a name ("float32", "bfloat16")."""
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype, dtype)
        if name.startswith("torch."):
            name = name[len("torch."):]
        if name in SIZES:
            return name
        raise invalid_argument("unknown dtype %r (expected one of: %s)" % (dtype, " ".join(SIZES)),
                               field=field)
    if _is_torch_dtype(dtype):
        return dtype_name(str(dtype), field)
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise invalid_argument("unknown dtype %r (expected a numpy or torch dtype, or one of: %s)"
                               % (dtype, " ".join(SIZES)), field=field) from None
    if np_dtype.byteorder == ">":
        raise invalid_argument("dtype %r is big-endian; tensors are little-endian" % (dtype,),
                               field=field)
    return dtype_name(np_dtype.name, field)


def numpy_dtype(name):
    """The numpy dtype of a name. bfloat16, which numpy lacks, is ml_dtypes' (which
    jax installs) when that is there, else None."""
    if name != "bfloat16":
        return np.dtype(name)
    try:
        import ml_dtypes  # noqa: PLC0415 - optional, with jax
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def torch_dtype(name):
    return getattr(torch_module(), name)


def name_of_array(x):
    """docs/openapi.json's dtype name of a numpy array or a torch tensor."""
    return dtype_name(x.dtype)


def shape_text(shape):
    """The query form of a shape: "8,4"."""
    return ",".join(str(int(s)) for s in shape)


def parse_shape(text):
    """A shape from its query form ("" is a scalar)."""
    return tuple(int(s) for s in text.split(",")) if text else ()
