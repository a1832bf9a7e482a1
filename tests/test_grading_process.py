"""The grading process's time and memory are the class's, not a student's (issue: the grader's edges, round three).

What a student's kernel or function sends back is measured before anything is built from it
(coursekit.protocol.measure), every answer record is capped like an output, no count from a sandboxed process
becomes data of that size, the kernel's stdin channel is never opened, and a message over the client's limit
disconnects its sender instead of landing in the grader's memory. The kernel tests run a real sandboxed kernel
in a child process and compare its peak memory with an honest notebook's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from coursekit import protocol, sandbox
from coursekit.grading import remote

needs_sandbox = pytest.mark.skipif(sandbox.problem() is not None and os.environ.get("CI") != "true",
                                   reason=f"no sandbox here: {sandbox.problem()}")

M61 = (1 << 61) - 1


# --------------------------------------------------------------------------- decoding


def test_keys_chosen_to_collide_do_not_collide_after_decoding():
    """Ints that are equal modulo 2^61 - 1 share Python's hash; tuples can be steered to one hash element by
    element. Decoded, each arrives as its repr (a string, whose hash is salted), so the dict builds in linear time;
    small ints, floats and strings stay what they were."""
    big = [M61 * k for k in range(1, 4001)]
    enc = {"$dict": [[{"$bigint": str(b)}, 0] for b in big]}
    out = protocol.decode(enc)
    assert len(out) == 4000 and all(isinstance(k, str) for k in out)
    assert {hash(k) for k in out} != {hash(big[0])}
    tup = protocol.decode(protocol.encode({(1, 2): "a", 3: "b", 0.5: "c", "s": "d", None: "e"}))
    assert tup == {"(1, 2)": "a", 3: "b", 0.5: "c", "s": "d", None: "e"}
    assert protocol.decode(protocol.encode({1, 2, (3, 4)})) == {1, 2, "(3, 4)"}


@pytest.mark.parametrize("value,limit", [
    ({"$dict": [[i, i] for i in range(protocol.MAX_KEYS + 1)]}, "members"),
    ({"$set": list(range(protocol.MAX_KEYS + 1))}, "members"),
    (list(range(protocol.MAX_NODES + 1)), "values"),
    ("x" * (protocol.MAX_CHARS + 1), "MB"),
])
def test_an_answer_over_a_limit_is_refused_before_it_is_built(value, limit):
    with pytest.raises(ValueError, match=limit):
        protocol.decode(value)


def test_nesting_a_hundred_thousand_deep_is_a_sentence_not_a_recursion_error():
    deep: list = []
    cur = deep
    for _ in range(100_000):
        cur.append([])
        cur = cur[0]
    with pytest.raises(ValueError, match="nested"):
        protocol.decode(deep)


def test_an_honest_answer_decodes_as_before():
    import numpy as np
    import torch

    value = {"w": torch.ones(3, 2, dtype=torch.bfloat16), "names": ["a", "b"], "n": 7, "xs": np.arange(5.0),
             "opts": {"A", "C"}}
    back = protocol.decode(json.loads(json.dumps(protocol.encode(value))))
    assert torch.equal(back["w"], value["w"]) and back["names"] == ["a", "b"] and back["n"] == 7
    assert np.array_equal(back["xs"], value["xs"]) and back["opts"] == {"A", "C"}


# --------------------------------------------------------------------------- a runner's reply


class _Runner:
    """A runner that replies what it is given (a student's process can send any reply)."""

    deadline = None

    def __init__(self, reply):
        self.reply = reply

    def request(self, msg, timeout):
        return self.reply

    def kill(self):
        pass


def test_a_count_from_the_runner_never_becomes_data_of_that_size(capsys):
    fn = remote.Remote(_Runner({"id": 1, "result": 1, "stdout": "hi\n", "stdout_lines": 10 ** 12,
                                "warnings": [["UserWarning", "w" * 10_000]] * 1000}), "f", None)
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert fn() == 1
    out = capsys.readouterr().out
    assert len(out) <= remote.TEXT_CHARS + 10 and out.startswith("hi\n")
    assert len(seen) <= 20 and all(len(str(w.message)) <= 2000 for w in seen)


@pytest.mark.parametrize("err", ["not a dict", {"type": "X" * 10_000, "message": "m" * (1 << 20),
                                                 "frames": [["f", "x", "g"], [1, 2, 3, 4], "bad"] * 10_000}])
def test_a_malformed_error_reply_is_bounded(err):
    fn = remote.Remote(_Runner({"id": 1, "error": err}), "f", None)
    with pytest.raises(Exception) as info:
        fn()
    assert len(str(info.value)) <= 10_000
    frames = getattr(info.value, "coursekit_frames", [])
    assert len(frames) <= 20 and all(len(f) == 4 for f in frames)


def test_a_reply_read_after_the_deadline_is_the_submissions_time():
    from coursekit.grading import budget

    r = _Runner({"id": 1, "result": 1})
    r.deadline = budget.Deadline(1.0, 0.0)
    with pytest.raises(budget.BudgetSpent):
        remote.Remote(r, "f", None)()


# --------------------------------------------------------------------------- a real kernel: memory


_CHILD = textwrap.dedent("""
    import json, sys
    from nbformat.v4 import new_code_cell, new_notebook
    from coursekit.guard import GuardedExecute
    from coursekit.protocol import MIME

    src, kind, work, kwargs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    cell = new_code_cell(src)
    grade = kind == "check"
    cell.metadata["nbgrader"] = {"schema_version": 3, "locked": grade, "solution": not grade, "grade": grade,
                                 "grade_id": "c", "points": 1}
    after = new_code_cell("print('the next cell ran')")
    after.metadata["nbgrader"] = {"schema_version": 3, "locked": False, "solution": True, "grade": False,
                                  "grade_id": "d"}
    nb = new_notebook(cells=[cell, after])
    ex = GuardedExecute(timeout=120, kernel_name="python3", **kwargs)
    with open("/proc/self/clear_refs", "w") as f:  # the peak from here on: VmHWM is reset to the current RSS
        f.write("5")
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": work}})
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    outs = [o for c in nb.cells for o in c.get("outputs", [])]
    recs = [o["data"][MIME] for o in outs if MIME in o.get("data", {})]
    text = "".join(o.get("text", "") for o in outs)
    print(json.dumps({"peak_mb": hwm / 1024, "records": recs,
                      "next": "the next cell ran" in text}))
""")


def _graded_in_a_child(tmp_path, src: str, kind: str = "answer", **kwargs) -> dict:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-c", _CHILD, src, kind, str(work), json.dumps(kwargs)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_sandbox
def test_the_kernels_stdin_channel_is_never_read_nor_kept(tmp_path):
    """A kernel that sends 300 MB on its stdin socket: nothing of it reaches the grading process (nbclient would
    never read it; with the channel open it queued there)."""
    honest = _graded_in_a_child(tmp_path, "x = 1")
    flood = _graded_in_a_child(tmp_path, textwrap.dedent("""
        k = get_ipython().kernel
        blob = 'x' * (1 << 20)
        for _ in range(300):  # as input() asks, to the client that sent the running request
            k.session.send(k.stdin_socket, 'input_request', {'prompt': blob, 'password': False},
                           parent=k.get_parent('shell'), ident=k._parent_ident.get('shell'))
        """))
    assert flood["next"] and flood["peak_mb"] < honest["peak_mb"] + 100, (honest, flood)


@needs_sandbox
def test_an_answer_record_over_its_limit_is_replaced_by_a_sentence(tmp_path):
    """A check cell's answer records over the notebook's cap (here 1 MB; 128 MB by default), which the output caps do
    not count: the grading process keeps a small record saying why, and ScoreAnswers then says so to the student."""
    src = ("from IPython.display import display\n"
           "display({'" + protocol.MIME + "': {'item': '00.p1', 'answer': 'x' * (2 << 20)}}, raw=True)")
    got = _graded_in_a_child(tmp_path, src, kind="check", notebook_answer_chars=1 << 20)
    assert got["records"] and all(set(r) == {"item", "unsendable"} for r in got["records"]), got["records"]
    assert "MB" in got["records"][0]["unsendable"]


@needs_sandbox
def test_a_message_over_the_clients_limit_never_lands_in_the_grader(tmp_path):
    """One 80 MB output with an 8 MB message limit: the kernel's socket is disconnected instead (the cell then runs
    into its time limit and the kernel is stopped), and the grader's peak memory is an honest notebook's. The
    control: with a limit of 256 MB the same output costs the grader over 150 MB more (cut to 1 MB after)."""
    honest = _graded_in_a_child(tmp_path, "x = 1", message_bytes=8 << 20, answer_timeout=5)
    big = _graded_in_a_child(tmp_path, "print('y' * (80 << 20))", message_bytes=8 << 20, answer_timeout=5)
    assert big["peak_mb"] < honest["peak_mb"] + 30, (honest, big)
    control = _graded_in_a_child(tmp_path, "print('y' * (80 << 20))", message_bytes=256 << 20, answer_timeout=5)
    assert control["next"] and control["peak_mb"] > honest["peak_mb"] + 150, (honest, control)


_MANY_VALUES = textwrap.dedent("""
    k = get_ipython().kernel
    k.session.send(k.iopub_socket, 'display_data', {'data': {'application/json': [[]] * (12 << 20)}, 'metadata': {}},
                   parent=k.get_parent('shell'), ident=k._topic('display_data'))
    print('sent')
    """)


@needs_sandbox
def test_a_message_of_many_small_values_is_dropped_before_it_is_built(tmp_path):
    """36 MB of empty lists in one message (within the 64 MB message limit) would be about 1 GB of Python objects in
    the grading process: it is dropped unbuilt, and the rest of the notebook is graded. The control: with the value
    limit raised, the same message costs the grader over 400 MB."""
    honest = _graded_in_a_child(tmp_path, "x = 1")
    many = _graded_in_a_child(tmp_path, _MANY_VALUES)
    assert many["next"] and many["peak_mb"] < honest["peak_mb"] + 150, (honest, many)
    control = _graded_in_a_child(tmp_path, _MANY_VALUES, message_values=1 << 30)
    assert control["peak_mb"] > honest["peak_mb"] + 400, (honest, control)


def test_the_value_count_ignores_what_strings_hold():
    import json

    from coursekit.guard import MessageRefused, bounded_unpack

    unpack = bounded_unpack(json.loads, limit=10)
    text = json.dumps({"text": '[[[, {{{ " \\ ' * 1000, "n": [1, 2, 3]})
    assert unpack(text.encode())["n"] == [1, 2, 3]
    with pytest.raises(MessageRefused, match="about 40 values"):
        unpack(json.dumps([[]] * 20).encode())


def test_an_unclosed_string_costs_one_pass_not_one_per_quote():
    """A frame of escaped quotes that never closes: the count must not backtrack from every quote to the end (about an
    hour at 1 MB with a backtracking pattern), and the frame, which is not JSON, is dropped, not raised."""
    import json

    from coursekit.guard import MessageRefused, bounded_unpack

    unpack = bounded_unpack(json.loads)
    many_strings = (b'"":' * (3 << 20), b'"a",' * (1 << 21))  # a substitution over them took gigabytes
    # 50,000 nested lists are deeper than json's decoder goes on every supported Python (5,000 raise RecursionError on
    # 3.11 but parse on 3.13; 20,000 raise on both): refused, not a crash
    for frame in (b'"' + b'\\"' * (1 << 19), b'"' * (1 << 20), b'[' * 50_000 + b']' * 50_000, b'{"a": \xff}', *many_strings):
        t0 = time.monotonic()
        with pytest.raises(MessageRefused):
            unpack(frame)
        assert time.monotonic() - t0 < 5, len(frame)


_UNCLOSED = textwrap.dedent("""
    k = get_ipython().kernel
    s = k.session
    m = s.msg('stream', {'name': 'stdout', 'text': 'x'}, parent=k.get_parent('shell'))
    s.send_raw(k.iopub_socket, [s.pack(m['header']), s.pack(m['parent_header']), s.pack({}), b'"' + b'\\\\"' * 400_000],
               ident=k._topic('stream'))
    print('sent')
    """)


@needs_sandbox
def test_a_frame_built_to_stall_the_count_is_dropped_and_grading_goes_on(tmp_path):
    """The same frame from a kernel: the grading process drops it at once, the cell ends within its limit and the next
    cell runs (with a backtracking count the grader stalled for hours, every limit with it)."""
    t0 = time.monotonic()
    got = _graded_in_a_child(tmp_path, _UNCLOSED, answer_timeout=20)
    assert got["next"] and time.monotonic() - t0 < 120, got
