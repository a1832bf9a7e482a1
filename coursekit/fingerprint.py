"""A fingerprint of a function's code, so that stored results are found again only by the code that made them.

The capstone's store (``coursekit.capstone.Store``) keys every result by what determines it: the base checkpoint,
the data, the configuration and the fingerprints of the functions that computed it. A student who changes a
function gets that function's results computed again; one whose code equals coursekit's gets coursekit's.

:func:`code_fingerprint` hashes the function's syntax tree (``ast``) with its name and every docstring removed,
so comments, blank lines, the docstring, the function's name and where it sits in its file do not count, and
every change to what it does (a statement, an argument's default, a constant) does. So does a change that does
nothing: a local variable or an argument renamed is a different syntax tree, and its results are computed again
(the safe direction: a fingerprint that missed a real change would hand back another code's results). The functions it calls by a
global name that are defined beside it (in the same notebook or module) are part of it: a student's train_steps
that calls the student's own helper changes when the helper does. Functions defined elsewhere (torch,
coursekit) count by their qualified name only: the installed versions are part of the store's other keys.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import textwrap
import types
from typing import Any, Callable

__all__ = ["code_fingerprint"]


def code_fingerprint(fn: Callable[..., Any]) -> str:
    """16 hex digits that change whenever what ``fn`` does as code changes, and also when a local variable or an
    argument is renamed; not for comments, docstrings, blank lines or the function's own name (module docstring).

    fn: a function, lambda, bound method, ``functools.partial`` or any other callable. A function whose source
    cannot be read (defined with ``exec`` and no file) is hashed by its compiled code instead; a callable without
    Python code (a builtin, a class) by its qualified name. Raises TypeError for something that is not callable.
    """
    if not callable(fn):
        raise TypeError(f"a fingerprint is taken of a function, got {type(fn).__name__}")
    h = hashlib.sha256()
    _feed(fn, h, set())
    return h.hexdigest()[:16]


def _feed(fn: Any, h: Any, seen: set[int]) -> None:
    if isinstance(fn, functools.partial):
        h.update(b"partial")
        _feed(fn.func, h, seen)
        h.update(repr((fn.args, sorted(fn.keywords.items()))).encode())
        return
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    if not isinstance(fn, types.FunctionType):
        h.update(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}".encode())
        return
    if id(fn.__code__) in seen:
        return
    seen.add(id(fn.__code__))
    h.update(_tree(fn) or _compiled(fn.__code__))
    for name in sorted(_global_names(fn.__code__)):
        helper = fn.__globals__.get(name)
        if isinstance(helper, types.FunctionType) and helper.__module__ == fn.__module__:
            h.update(name.encode())
            _feed(helper, h, seen)


def _tree(fn: types.FunctionType) -> bytes | None:
    """The function's syntax tree without its name and docstrings, or None when its source cannot be read (or is a
    lambda inside a longer line)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        node = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name != fn.__name__:
        return None
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if sub.body and isinstance(sub.body[0], ast.Expr) and isinstance(sub.body[0].value, ast.Constant) \
                    and isinstance(sub.body[0].value.value, str):
                sub.body = sub.body[1:] or [ast.Pass()]
    node.name = "_"
    return ast.dump(node, include_attributes=False).encode()


def _compiled(code: types.CodeType) -> bytes:
    """Bytecode, names and constants of ``code`` and the code nested in it, without file names or line numbers."""
    parts = [code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode(),
             repr((code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount)).encode()]
    for const in code.co_consts:
        parts.append(_compiled(const) if isinstance(const, types.CodeType) else repr(const).encode())
    return b"\0".join(parts)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
