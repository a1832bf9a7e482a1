"""Values as plain data: how an answer crosses from a student's process to the grading process.

The grading process never unpickles anything a student's code produced: unpickling runs code. An answer
(a number, a choice, an array, the outputs of the student's function) travels as JSON built by
:func:`encode` and is rebuilt by :func:`decode`, which only ever creates numbers, strings, lists, tuples,
dicts, NumPy arrays and torch tensors. Anything else arrives as an :class:`Opaque` that names its type.

The answer record of a check cell is a ``display_data`` output with the MIME type :data:`MIME`.
"""

from __future__ import annotations

import base64
import math
import re
from typing import Any

import numpy as np

MIME = "application/vnd.coursekit.answer+json"

_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"}
_TORCH_DTYPES = _DTYPES | {"bfloat16"}
MAX_BYTES = 64 << 20  # one array; an answer is never this large


class Opaque:
    """A value that is not plain data (a module, a generator, an object of the student's own class)."""

    def __init__(self, type_name: str, text: str = "") -> None:
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text or f"<{self.type_name}>"


def _opaque_class(name: str) -> type:
    """A class named like the student's value's type, so messages read "got a Generator"."""
    clean = re.sub(r"\W", "_", str(name))[:60] or "object"
    if not clean[0].isalpha():
        clean = "T" + clean
    return type(clean, (Opaque,), {})


def encode(x: Any, depth: int = 0) -> Any:
    """JSON-able form of ``x`` (arrays and tensors by value, with their dtype and shape)."""
    if depth > 20:
        return {"$opaque": "object", "text": "(nested too deep)"}
    if isinstance(x, np.generic):  # before Python's scalars: np.float64 is a float
        return {"$npscalar": x.dtype.name, "v": encode(x.item(), depth + 1)} if x.dtype.name in _DTYPES else {"$opaque": type(x).__name__}
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        return x if abs(x) < 2**63 else {"$bigint": str(x)}
    if isinstance(x, float):
        return x if math.isfinite(x) else {"$float": repr(x)}
    if isinstance(x, complex):
        return {"$complex": [encode(x.real), encode(x.imag)]}
    if isinstance(x, bytes):
        return {"$bytes": base64.b64encode(x[:MAX_BYTES]).decode()}
    if isinstance(x, np.ndarray):
        if x.dtype.name not in _DTYPES:
            return {"$opaque": f"ndarray of {x.dtype}", "text": f"an array of dtype {x.dtype}"}
        data = np.ascontiguousarray(x).tobytes()
        return {"$ndarray": x.dtype.name, "shape": list(x.shape), "data": base64.b64encode(data[:MAX_BYTES]).decode()}
    torch = _torch_if_loaded()
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _TORCH_DTYPES:
            return {"$opaque": f"Tensor of {name}"}
        raw = t.contiguous().view(torch.int16).numpy() if name == "bfloat16" else t.contiguous().numpy()
        return {"$tensor": name, "shape": list(t.shape), "requires_grad": bool(x.requires_grad),
                "data": base64.b64encode(raw.tobytes()[:MAX_BYTES]).decode()}
    if isinstance(x, (list, tuple)):
        items = [encode(v, depth + 1) for v in list(x)[:100_000]]
        return items if type(x) is list else {"$tuple": items}
    if isinstance(x, (set, frozenset)):
        return {"$set": [encode(v, depth + 1) for v in list(x)[:100_000]], "frozen": isinstance(x, frozenset)}
    if isinstance(x, dict):
        return {"$dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in list(x.items())[:10_000]]}
    try:
        text = repr(x)[:200]
    except Exception:
        text = ""
    return {"$opaque": type(x).__name__, "text": text}


def _torch_if_loaded():
    import sys

    return sys.modules.get("torch")


def decode(x: Any) -> Any:
    """The value :func:`encode` described; never runs code of the sender's. Malformed input raises ValueError."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [decode(v) for v in x]
    if not isinstance(x, dict) or len(x) == 0:
        raise ValueError(f"not an encoded value: {type(x).__name__}")
    if "$tuple" in x:
        return tuple(decode(v) for v in x["$tuple"])
    if "$set" in x:
        items = [decode(v) for v in x["$set"]]
        try:
            return frozenset(items) if x.get("frozen") else set(items)
        except TypeError:  # unhashable members
            return items
    if "$dict" in x:
        out = {}
        for pair in x["$dict"]:
            k, v = decode(pair[0]), decode(pair[1])
            try:
                out[k] = v
            except TypeError:  # an unhashable key
                out[repr(k)] = v
        return out
    if "$float" in x:
        if x["$float"] not in ("nan", "inf", "-inf"):
            raise ValueError("bad float")
        return float(x["$float"])
    if "$bigint" in x:
        return int(str(x["$bigint"])[:5000])
    if "$complex" in x:
        return complex(decode(x["$complex"][0]), decode(x["$complex"][1]))
    if "$bytes" in x:
        return base64.b64decode(x["$bytes"])
    if "$npscalar" in x:
        if x["$npscalar"] not in _DTYPES:
            raise ValueError("bad dtype")
        return np.array(decode(x["v"]), dtype=x["$npscalar"])[()]
    if "$ndarray" in x:
        dtype = x["$ndarray"]
        if dtype not in _DTYPES:
            raise ValueError("bad dtype")
        return _array(x, dtype).copy()
    if "$tensor" in x:
        import torch

        name = x["$tensor"]
        if name not in _TORCH_DTYPES:
            raise ValueError("bad dtype")
        if name == "bfloat16":
            t = torch.from_numpy(_array(x, "int16").copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(_array(x, name).copy())
        return t.requires_grad_(True) if x.get("requires_grad") and t.is_floating_point() else t
    if "$opaque" in x:
        return _opaque_class(x["$opaque"])(str(x["$opaque"]), str(x.get("text", ""))[:200])
    raise ValueError(f"not an encoded value: keys {sorted(x)[:5]}")


def _array(x: dict, dtype: str) -> np.ndarray:
    shape = [int(s) for s in x["shape"]]
    if any(s < 0 for s in shape) or len(shape) > 32:
        raise ValueError("bad shape")
    raw = base64.b64decode(x["data"])
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if n * np.dtype(dtype).itemsize != len(raw):
        raise ValueError("array data does not fit its shape")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)
