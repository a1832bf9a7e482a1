"""coursekit.fingerprint: what counts as a change of code (a statement, a default, a constant, a helper defined beside
it) and what does not (the name, the docstring, comments, blank lines, where the function sits)."""

from __future__ import annotations

import functools
import linecache

import pytest

from coursekit.fingerprint import code_fingerprint


def _define(src: str, name: str, cell: list[int] = [0]) -> object:  # noqa: B006 - a counter for unique cell names
    """``name`` from ``src`` executed as a notebook cell is (its source readable through linecache, as IPython does)."""
    cell[0] += 1
    filename = f"<test cell {cell[0]}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns: dict = {"__name__": "__main__"}
    exec(compile(src, filename, "exec"), ns)
    return ns[name]


BASE = '''
def total(xs, scale=2):
    """Sum, scaled."""
    out = 0
    for x in xs:
        out += x
    return scale * out
'''


def test_name_docstring_comments_and_position_do_not_count():
    same = '''


def add_up(xs, scale=2):
    # a comment
    out = 0

    for x in xs:  # another
        out += x
    return scale * out
'''
    assert code_fingerprint(_define(BASE, "total")) == code_fingerprint(_define(same, "add_up"))


@pytest.mark.parametrize("change", [("scale=2", "scale=3"), ("out = 0", "out = 1"), ("out += x", "out += x * x"),
                                    ("return scale * out", "return out")])
def test_every_change_to_what_it_does_counts(change):
    assert code_fingerprint(_define(BASE, "total")) != code_fingerprint(_define(BASE.replace(*change), "total"))


@pytest.mark.parametrize("rename", [("out", "acc"), ("xs", "values")])
def test_a_renamed_local_or_argument_counts_as_a_change(rename):
    """What the docstrings say: a rename does nothing, and still recomputes (the syntax tree differs)."""
    renamed = _define(BASE.replace(*rename), "total")
    assert renamed([1, 2]) == _define(BASE, "total")([1, 2])
    assert code_fingerprint(renamed) != code_fingerprint(_define(BASE, "total"))


def test_a_helper_defined_beside_it_is_part_of_it():
    src = '''
def helper(x):
    return x + 1

def f(xs):
    return [helper(x) for x in xs]
'''
    a = code_fingerprint(_define(src, "f"))
    b = code_fingerprint(_define(src.replace("x + 1", "x + 2"), "f"))
    assert a != b
    rec = '''
def f(n):
    return 1 if n < 2 else n * f(n - 1)
'''
    assert len(code_fingerprint(_define(rec, "f"))) == 16  # recursion ends


def test_callables_without_readable_source():
    ns: dict = {}
    exec("g = lambda x: x + 1", ns)  # no file, no linecache entry: the compiled code is hashed
    h: dict = {}
    exec("g = lambda x: x + 2", h)
    assert code_fingerprint(ns["g"]) != code_fingerprint(h["g"])
    assert code_fingerprint(len) == code_fingerprint(len) != code_fingerprint(sum)
    f = _define(BASE, "total")
    assert code_fingerprint(functools.partial(f, scale=2)) != code_fingerprint(functools.partial(f, scale=3))
    with pytest.raises(TypeError, match="a fingerprint is taken of a function"):
        code_fingerprint(None)
