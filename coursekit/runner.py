"""The student's side of a function check: call the student's function and send back what it did, as data.

The grading process starts this module in a sandbox (:mod:`coursekit.sandbox`) that holds no answer key,
no expected value and none of the grader's code (``coursekit/grading`` is not there), with the coursekit
functions the item asks the student to write replaced by stubs. It then sends requests on stdin
(length-prefixed pickles: the grader trusts what it sends) and reads one JSON line per request on stdout:

- ``{"op": "load", "fn": <cloudpickle bytes from the student's kernel>, "lines": {file: source},
  "preload": [module, ...]}``
  → ``{"ok": true}`` or ``{"error": ...}``;
- ``{"op": "call", "args": [...], "kwargs": {...}, "probe": <the item's measure or None>}``
  → ``{"result": <encoded>, "printed": ..., "changed": ...}``
  or ``{"error": {"type", "message", "frames"}, ...}``.

Nothing here decides a score: the grading process compares the data it gets with the reference it alone
computes, and kills this process when a call runs past its time limit.
"""

from __future__ import annotations

import contextlib
import io
import json
import linecache
import os
import pickle
import struct
import sys
import traceback
import warnings
from typing import Any

from .protocol import encode

PKG = os.path.dirname(os.path.abspath(__file__))
KEEP = 50_000  # characters of printed output kept per call


def read_frame(stream) -> bytes | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return stream.read(n)


def write_frame(stream, payload: bytes) -> None:
    stream.write(struct.pack("<Q", len(payload)) + payload)
    stream.flush()


class _Sink(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.lines = 0

    def write(self, s: str) -> int:
        s = str(s)
        self.lines += s.count("\n")
        if self.tell() < KEEP:
            super().write(s[:KEEP])
        return len(s)


def _frames(e: BaseException) -> list[list]:
    out = []
    for f in traceback.extract_tb(e.__traceback__):
        if os.path.abspath(f.filename).startswith(PKG + os.sep):
            continue
        out.append([f.filename, f.lineno or 0, f.name, (f.line or "")[:300]])
    return out[-20:]


def _error(e: BaseException) -> dict:
    try:
        message = str(e)[:2000]
    except Exception:
        message = "(its message could not be read)"
    return {"type": type(e).__name__[:100], "module": str(type(e).__module__)[:100],
            "builtin": type(e).__module__ == "builtins", "message": message,
            "frames": _frames(e)}


def _copy(v: Any) -> Any:
    torch = sys.modules.get("torch")
    try:
        import numpy as np

        if isinstance(v, np.ndarray):
            return v.copy()
    except ImportError:
        pass
    if torch is not None and isinstance(v, torch.Tensor):
        return v.detach().clone()
    return None


def _same(a: Any, b: Any) -> bool:
    import numpy as np

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        a, b = a.detach().float().numpy(), b.detach().float().numpy()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b)))) if a.dtype.kind in "fc" else bool(np.array_equal(a, b))


def call(fn: Any, args: list, kwargs: dict, probe: Any = None) -> dict:
    """Call ``fn`` (or ``probe(fn, *args, **kwargs)``: the item's own code that calls the student's function and
    measures what it returned, for results that are objects rather than data) and describe what happened: the
    result or exception, what was printed or warned, which array or tensor inputs changed in place."""
    named = {**{str(i): a for i, a in enumerate(args)}, **kwargs}
    before = {k: c for k, v in named.items() if (c := _copy(v)) is not None}
    out, err = _Sink(), _Sink()
    reply: dict = {}
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            result = fn(*args, **kwargs) if probe is None else probe(fn, *args, **kwargs)
        reply["result"] = encode(result)
    except BaseException as e:  # the student's exception, reported as data (KeyboardInterrupt and SystemExit too)
        reply["error"] = _error(e)
    changed = {}
    for k, c in before.items():
        try:
            if not _same(named[k], c):
                changed[k] = encode(named[k])
        except Exception:
            pass
    reply.update(changed=changed, stdout=out.getvalue(), stdout_lines=out.lines, stderr=err.getvalue(),
                 stderr_lines=err.lines,
                 warnings=[[w.category.__name__, str(w.message)[:300]] for w in (caught or [])][:50])
    return reply


def main() -> None:
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # what C code writes to stdout cannot garble the replies
    fn = None
    while (frame := read_frame(requests)) is not None:
        try:
            msg = pickle.loads(frame)
        except BaseException as e:  # the grader sent something this sandbox cannot rebuild
            replies.write(json.dumps({"id": None, "error": _error(e), "unreadable": True}) + "\n")
            continue
        op = msg.get("op")
        if op == "load":
            for name, text in (msg.get("lines") or {}).items():
                linecache.cache[name] = (len(text), None, text.splitlines(keepends=True), name)
            try:
                for module in msg.get("preload") or ():  # the libraries the item's measures use, imported before any limit
                    __import__(module)
                fn = pickle.loads(msg["fn"])
                reply = {"ok": True, "callable": callable(fn)}
            except BaseException as e:
                reply = {"error": _error(e)}
        elif op == "call":
            reply = call(fn, msg["args"], msg["kwargs"], msg.get("probe")) if fn is not None else {"error": {"type": "RuntimeError", "message": "no function loaded", "frames": []}}
        else:
            reply = {"error": {"type": "ValueError", "message": f"unknown request {op!r}", "frames": []}}
        reply["id"] = msg.get("id")
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
