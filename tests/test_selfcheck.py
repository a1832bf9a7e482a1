"""coursekit.selfcheck: a self-check cell's verdicts are one sentence each, and the student's exception is named with
its line instead of a traceback."""

from __future__ import annotations

import linecache

import numpy as np

from coursekit import selfcheck


def test_close_names_the_worst_entry_or_the_shape(capsys):
    assert selfcheck.close("dA", np.ones((2, 2)), np.ones((2, 2)))
    assert not selfcheck.close("dA", np.array([[1.0, 2.0], [3.0, 9.0]]), np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert not selfcheck.close("dB", np.ones((2, 3)), np.ones((3, 2)))
    assert not selfcheck.close("dX", None, np.ones(2))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "✓ dA matches."
    assert out[1].startswith("✗ dA[1, 1]: expected 4, got 9 (1 of 4 entries differ).")
    assert out[2].startswith("✗ dB has shape (2, 3); expected (3, 2).") and "transpose" in out[2]
    assert out[3].startswith("✗ dX should be an array of numbers; got NoneType.")
    assert all(line.endswith("The graded check below names the likely mistake.") for line in out[1:])


def test_trying_turns_the_students_exception_into_a_sentence_with_its_line(capsys):
    src = "def lora_backward(D):\n    return D @ np.ones((5, 5))\n"
    name = "<student cell>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns = {"np": np}
    exec(compile(src, name, "exec"), ns)
    with selfcheck.trying("lora_backward"):
        ns["lora_backward"](np.ones((2, 3)))
        raise AssertionError("not reached")
    out = capsys.readouterr().out
    assert out.startswith("✗ Trying your lora_backward raised ValueError: matmul")
    assert "in your lora_backward, line 2: return D @ np.ones((5, 5))." in out and "Traceback" not in out
    with selfcheck.trying("f"):
        a, b = None  # noqa: F841 - the cell's own line, on what a function returned
    assert "in this cell, line" in capsys.readouterr().out
    assert selfcheck.passed(True, "central differences agree") and not selfcheck.passed(False, "central differences agree")
    assert capsys.readouterr().out.splitlines() == ["✓ central differences agree.",
                                                    "✗ central differences agree: no. The graded check below names the "
                                                    "likely mistake."]
