"""Values as plain data: how an answer crosses from a student's process to the grading process.

The grading process never unpickles anything a student's code produced: unpickling runs code. An answer
(a number, a choice, an array, the outputs of the student's function) travels as JSON built by
:func:`encode` and is rebuilt by :func:`decode`, which only ever creates numbers, strings, lists, tuples,
dicts, NumPy arrays and torch tensors. Anything else arrives as an :class:`Opaque` that names its type.

The answer record of a check cell is a ``display_data`` output with the MIME type :data:`MIME`.
"""

from __future__ import annotations

import base64
import functools
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


@functools.lru_cache(maxsize=256)
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


#: What one encoded value may hold before anything of it is built (:func:`measure`): JSON nodes, nesting, characters
#: of its strings (an array's base64 text included) and keys of one dict or set. An answer needs a small fraction of
#: each; what is over them costs the grading process time and memory that are the class's, not the student's.
MAX_NODES = 1_000_000
MAX_DEPTH = 40
MAX_CHARS = 64 << 20
MAX_KEYS = 4096
#: Python's hash of an int is the int modulo this prime: two ints below it never share a hash.
_HASH_MODULUS = (1 << 61) - 1


def measure(x: Any) -> int:
    """Raise ValueError, saying which limit, when the encoded value ``x`` (parsed JSON) holds more than
    :data:`MAX_NODES` nodes, is nested deeper than :data:`MAX_DEPTH`, holds more than :data:`MAX_CHARS` characters of
    strings, or has a ``$dict`` or ``$set`` of more than :data:`MAX_KEYS` members; else return its characters of
    strings. Iterative: a value nested 100,000 deep costs no recursion. O(nodes), before :func:`decode` builds
    anything."""
    nodes = chars = 0
    stack: list[tuple[Any, int]] = [(x, 0)]
    while stack:
        v, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ValueError(f"the answer holds more than {MAX_NODES:,} values")
        if depth > MAX_DEPTH:
            raise ValueError(f"the answer is nested more than {MAX_DEPTH} levels deep")
        if isinstance(v, str):
            chars += len(v)
            if chars > MAX_CHARS:
                raise ValueError(f"the answer holds more than {MAX_CHARS >> 20} MB of text and data")
        elif isinstance(v, list):
            stack.extend((c, depth + 1) for c in v)
        elif isinstance(v, dict):
            for key in ("$dict", "$set"):
                members = v.get(key)
                if isinstance(members, list) and len(members) > MAX_KEYS:
                    raise ValueError(f"the answer has a {key[1:]} of {len(members):,} members; an answer needs at most "
                                     f"{MAX_KEYS:,}")
            for k, c in v.items():
                chars += len(k) if isinstance(k, str) else 0
                stack.append((c, depth + 1))
            if chars > MAX_CHARS:
                raise ValueError(f"the answer holds more than {MAX_CHARS >> 20} MB of text and data")
    return chars


def _key(k: Any) -> Any:
    """``k`` as a dict key or set member. Kept as it is when no student can choose thousands of such keys with one
    hash (each insertion would then compare with all the others, quadratic in the count): a string (its hash is
    salted per process), a bool, None, a float (its hash is its value modulo a 61-bit prime), an int below that
    prime. Anything else (a tuple, whose hash a student can steer element by element, a larger int) arrives as its
    ``repr``, at most 200 characters."""
    if k is None or isinstance(k, (str, bool, float)):
        return k
    if isinstance(k, int) and abs(k) < _HASH_MODULUS:
        return k
    return repr(k)[:200]


def decode(x: Any) -> Any:
    """The value :func:`encode` described; never runs code of the sender's. Malformed input, or input over the limits
    of :func:`measure` (checked first, before anything is built), raises ValueError. A dict key or set member that a
    student could make collide with thousands of others (a tuple, an int of 61 bits or more) arrives as its
    ``repr`` (:func:`_key`)."""
    measure(x)
    try:
        return _decode(x)
    except (IndexError, ArithmeticError, RecursionError, AttributeError) as e:  # a malformed value, said one way
        raise ValueError(f"not an encoded value ({type(e).__name__}: {str(e)[:100]})") from None


def _decode(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if not isinstance(x, dict) or len(x) == 0:
        raise ValueError(f"not an encoded value: {type(x).__name__}")
    if "$tuple" in x:
        return tuple(_decode(v) for v in x["$tuple"])
    if "$set" in x:
        items = [_key(_decode(v)) for v in x["$set"]]
        return frozenset(items) if x.get("frozen") else set(items)
    if "$dict" in x:
        out = {}
        for pair in x["$dict"]:
            out[_key(_decode(pair[0]))] = _decode(pair[1])
        return out
    if "$float" in x:
        if x["$float"] not in ("nan", "inf", "-inf"):
            raise ValueError("bad float")
        return float(x["$float"])
    if "$bigint" in x:
        return int(str(x["$bigint"])[:5000])
    if "$complex" in x:
        return complex(_decode(x["$complex"][0]), _decode(x["$complex"][1]))
    if "$bytes" in x:
        return base64.b64decode(x["$bytes"])
    if "$npscalar" in x:
        if x["$npscalar"] not in _DTYPES:
            raise ValueError("bad dtype")
        v = _decode(x["v"])
        if not isinstance(v, (bool, int, float, complex)):  # a scalar, never an array made 16 times larger
            raise ValueError("bad scalar")
        return np.array(v, dtype=x["$npscalar"])[()]
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
        return _opaque_class(str(x["$opaque"])[:100])(str(x["$opaque"])[:100], str(x.get("text", ""))[:200])
    raise ValueError(f"not an encoded value: keys {sorted(x)[:5]}")


def _array(x: dict, dtype: str) -> np.ndarray:
    if not isinstance(x.get("shape"), list) or not all(type(s) is int for s in x["shape"]):
        raise ValueError("bad shape")
    shape = list(x["shape"])
    if any(s < 0 for s in shape) or len(shape) > 32:
        raise ValueError("bad shape")
    raw = base64.b64decode(x["data"])
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if n * np.dtype(dtype).itemsize != len(raw):
        raise ValueError("array data does not fit its shape")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)
