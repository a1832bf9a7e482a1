"""The trust boundary of grading: nothing a student writes runs where a score is decided.

In the autograde run a check cell's ``grade()`` only hands the answer over (a typed record: a value as data,
a function pickled for the sandboxed runner); coursekit.guard.ScoreAnswers, in the grading process, scores
it and replaces the cell's output. These tests drive each half on its own, with attacks from a hostile-
submission review; tests/test_grading_roundtrip.py runs the example class's hostile students through
nbgrader end to end."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from coursekit import protocol, sandbox
from coursekit.grading import answer_record, check, keys, score_record
from coursekit.guard import ScoreAnswers

KEYS02 = keys.load("02")  # tests/conftest.py points $COURSEKIT_KEYS at autograder/keys
RIGHT = KEYS02["keys"]["p6"]
WRONG = next(o for o in "abcd" if o != RIGHT)

# Skipped where bubblewrap cannot run, except in CI (CI=true), where a missing sandbox is a failure.
needs_sandbox = pytest.mark.skipif(sandbox.problem() is not None and os.environ.get("CI") != "true",
                                   reason=f"no sandbox here: {sandbox.problem()}")


def _notebook_function(src: str, name: str, **glob):
    """A function defined the way a notebook cell defines it (its code file is not coursekit's)."""
    ns = {"__name__": "__main__", **glob}
    exec(compile(src, "/tmp/ipykernel_0/cell.py", "exec"), ns)
    fn = ns[name]
    fn.__module__ = "__main__"
    return fn


def _test_cell(item: str, outputs: list, points: float = 1) -> nbformat.NotebookNode:
    cell = new_code_cell(f'from coursekit.grading import grade\ngrade("{item}", answer)')
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "points": points, "grade_id": "t",
                                 "schema_version": 3}
    cell.outputs = outputs
    return cell


def _record(rec: dict):
    return new_output("display_data", data={protocol.MIME: rec, "text/plain": "handed over"})


def _score(cell) -> tuple[float | None, str]:
    nb = new_notebook(cells=[cell])
    ScoreAnswers().preprocess(nb, {})
    out = nb.cells[0].outputs
    result = [o for o in out if o.output_type == "execute_result"]
    text = "".join(o.get("text", "") for o in out if o.output_type == "stream")
    return (float(result[-1].data["text/plain"]) if result else None), text


# --------------------------------------------------------------------------- values


def test_values_travel_as_data_and_come_back_equal():
    import torch

    for v in [1, 2.5, float("nan"), "b", ["a", "c"], ("x", 1), {"k": [1, 2]}, {"a", "b"}, None, True, 10**30,
              np.arange(6, dtype=np.float32).reshape(2, 3), np.float64(0.25), torch.tensor([1.5, 2.0], dtype=torch.bfloat16)]:
        back = protocol.decode(json.loads(json.dumps(protocol.encode(v))))
        if isinstance(v, np.ndarray):
            assert back.dtype == v.dtype and np.array_equal(back, v)
        elif isinstance(v, torch.Tensor):
            assert back.dtype == v.dtype and torch.equal(back, v)
        elif isinstance(v, float) and v != v:
            assert back != back
        else:
            assert back == v and type(back) is type(v), (v, back)


def test_an_object_arrives_as_its_type_name_and_runs_nothing():
    """An answer whose __array__ or __float__ would run code (walk the checker's frames for the expected value) is
    never rebuilt in the grading process: it arrives as an inert stand-in named after its type."""
    class Sneaky:
        def __array__(self, *a, **k):
            raise AssertionError("ran in the grader")

        def __float__(self):
            raise AssertionError("ran in the grader")

    back = protocol.decode(protocol.encode(Sneaky()))
    assert type(back).__name__ == "Sneaky" and isinstance(back, protocol.Opaque)
    fb = score_record("02.w2", {"item": "02.w2", "answer": protocol.encode(Sneaky())})
    assert fb.points == 0


def test_a_value_record_holds_the_answer_and_nothing_about_the_students_machine():
    """What crosses from the student's kernel is the item and the answer: no field the student's code could set
    that the grading process would believe (an earlier design sent the kernel's thread and CPU counts)."""
    import torch  # noqa: F401  (a kernel that has torch loaded sends the same)

    assert set(answer_record("02.p6", RIGHT)) == {"item", "answer"}


@pytest.mark.parametrize("extra", [{"seen": {"torch_threads": 1, "cpu_count": 1}}, {"points": 99}, {"key": WRONG},
                                   {"hints": {}}, {"hidden": False}])
def test_fields_a_student_adds_to_a_record_change_nothing(extra):
    for answer, points in ((RIGHT, 1.0), (WRONG, 0.0)):
        got, _ = _score(_test_cell("02.p6", [_record({**answer_record("02.p6", answer), **extra})]))
        assert got == points, (answer, extra)

@pytest.mark.parametrize("bad", [{"$ndarray": "object", "shape": [1], "data": ""}, {"$ndarray": "float64", "shape": [3], "data": "AAAA"},
                                 {"$tensor": "float64", "shape": [-1], "data": ""}, {"$float": "1e999"}, {"what": 1}])
def test_a_malformed_record_scores_zero_and_says_so(bad):
    fb = score_record("02.w2", {"item": "02.w2", "answer": bad})
    assert fb.points == 0 and "could not be read" in fb.lines[0]


@pytest.mark.parametrize("answer, points, says", [(RIGHT, 1.0, "is right"), (WRONG, 0.0, "is not right")])
def test_a_handed_over_choice_is_scored_with_the_instructors_key(answer, points, says):
    cell = _test_cell("02.p6", [_record(answer_record("02.p6", answer)),
                                new_output("execute_result", data={"text/plain": "1.0"}, execution_count=1)])
    got, text = _score(cell)
    assert got == points and says in text
    if answer == WRONG and KEYS02["hints"].get("p6", {}).get(WRONG):
        assert KEYS02["hints"]["p6"][WRONG][:30] in text  # the hint that teaches, from the instructor's file


@pytest.mark.parametrize("outputs, why", [
    # the kernel's own number (a forged grade(), sys.displayhook(3.0)): dropped, nothing handed over
    ([new_output("stream", name="stdout", text="[02.p6] 1 / 1 points\n"), new_output("execute_result", data={"text/plain": "1.0"}, execution_count=1)],
     "no answer reached the grader"),
    ([new_output("execute_result", data={"text/plain": "1.0"}, execution_count=1), _record(answer_record("02.p6", RIGHT)),
      _record(answer_record("02.p6", WRONG))], "more than one answer"),
    ([_record(answer_record("02.w3", RIGHT))], "no answer reached the grader"),  # a record for another item
    ([new_output("error", ename="NameError", evalue="name 'answer_w1' is not defined", traceback=[])], "NameError: name 'answer_w1'"),
])
def test_only_the_one_handed_over_answer_counts(outputs, why):
    got, text = _score(_test_cell("02.p6", outputs))
    assert got == 0.0 and why in text.lower() or why in text, text


def test_the_same_answer_handed_over_twice_counts_once():
    rec = answer_record("02.p6", RIGHT)
    assert _score(_test_cell("02.p6", [_record(rec), _record(rec)]))[0] == 1.0


def test_a_check_cell_that_is_not_one_grade_call_scores_zero():
    cell = _test_cell("02.p6", [new_output("execute_result", data={"text/plain": "1.0"}, execution_count=1)])
    cell.source = "1.0"
    assert _score(cell)[0] == 0.0


def test_every_test_cell_is_one_grade_call_the_scorer_can_read():
    """ScoreAnswers finds a test cell's item by its one grade("NN.item", ...) call: every lesson's test cells
    must have exactly one, naming an item of that lesson."""
    from pathlib import Path

    from coursekit import course
    from coursekit.grading import lesson_items
    from coursekit.guard import _GRADE_CALL

    root = Path(__file__).resolve().parents[1]
    for aid in course.lesson_ids(root):
        nb = nbformat.read(root / "solutions" / aid / f"{aid}.ipynb", as_version=4)
        for c in nb.cells:
            md = c.get("metadata", {}).get("nbgrader", {})
            if c.cell_type == "code" and md.get("grade") and not md.get("solution"):
                calls = _GRADE_CALL.findall(c.source)
                assert len(calls) == 1 and calls[0].startswith(aid[:2] + "."), (aid, md.get("grade_id"), c.source)
                assert calls[0].split(".", 1)[1] in lesson_items(aid[:2]), (aid, calls[0])


# --------------------------------------------------------------------------- functions, in the sandboxed runner

RIGHT_P1 = "def adapted_forward(X, W, A, B, lora_alpha, r):\n    return X @ W + (lora_alpha / r) * (X @ A) @ B\n"


def _fn_record(item: str, src: str, name: str, **glob) -> dict:
    rec = answer_record(item, _notebook_function(src, name, **glob))
    assert "function" in rec, rec
    return json.loads(json.dumps(rec))  # what crosses: JSON


@needs_sandbox
def test_a_right_function_scores_full_in_the_runner_with_hidden_cases():
    fb = score_record("02.p1", _fn_record("02.p1", RIGHT_P1, "adapted_forward"))
    assert fb.full and "hidden case" in fb.text(), fb.text()


@needs_sandbox
def test_calling_coursekits_own_kernel_for_the_task_earns_nothing():
    """The review's lesson-05 attack: lora_backward written as a call of coursekit's reference. In the runner
    the functions an item asks for are stubs, so the borrowed call fails; the student's own code is untouched."""
    from coursekit import lora

    src = ("def lora_backward(D, X, W, A, B, s):\n"
           "    _, c = lora.lora_forward(X, W, A, B, s)\n"
           "    return lora.lora_backward(D, c)\n")
    fb = score_record("05.p1", _fn_record("05.p1", src, "lora_backward", lora=lora))
    assert fb.points == 0 and "withheld" in fb.text(), fb.text()


@needs_sandbox
@pytest.mark.parametrize("item, src, name", [
    ("05.p1", "def lora_backward(D, X, W, A, B, s):\n    _, c = lora.lora_forward(X, W, A, B, s)\n"
              "    return lora.lora_backward(D, c)\n", "lora_backward"),
])
def test_a_borrowed_function_scores_the_same_in_the_notebook_and_in_the_runner(item, src, name):
    """Handing in the lesson's own helper: the runner's stub raises, and the notebook's check (the real coursekit,
    watched: coursekit.grading.checkers.withheld_here) raises the same error, so the student learns it before grading."""
    from coursekit import lora, optim

    here = check(item, _notebook_function(src, name, lora=lora, optim=optim), hidden=True)
    graded = score_record(item, _fn_record(item, src, name, lora=lora, optim=optim))
    assert here.points == graded.points == 0, (here.text(), graded.text())
    assert "is withheld while this item is graded" in here.text() and "is withheld while this item is graded" in graded.text()


@needs_sandbox
def test_a_smuggled_reference_earns_nothing():
    """The reference's code object carried into the pickle (a function rebuilt from it in the notebook)."""
    import types

    from coursekit import lora

    fake = types.FunctionType(lora.lora_backward.__code__, {"np": np, **vars(lora)}, "lora_backward")
    fake.__module__ = "__main__"
    rec = json.loads(json.dumps(answer_record("05.p1", fake)))
    fb = score_record("05.p1", rec)
    assert fb.points == 0, fb.text()


@needs_sandbox
def test_a_function_that_outlives_its_time_limit_is_killed_from_outside(monkeypatch):
    monkeypatch.setenv("COURSEKIT_CASE_TIMEOUT", "2")
    src = ("import time\n"
           "def adapted_forward(X, W, A, B, lora_alpha, r):\n"
           "    while True:\n"
           "        try:\n"
           "            time.sleep(100)\n"
           "        except BaseException:\n"
           "            pass\n")
    import time

    t0 = time.monotonic()
    fb = score_record("02.p1", _fn_record("02.p1", src, "adapted_forward"))
    assert fb.points == 0 and "did not return within 2 s" in fb.text()
    assert time.monotonic() - t0 < 30


@needs_sandbox
def test_a_function_that_ends_its_process_loses_that_case_only():
    src = ("import os\n"
           "def adapted_forward(X, W, A, B, lora_alpha, r):\n"
           "    if X.shape[0] == 1:\n"
           "        os._exit(3)\n"
           "    return X @ W + (lora_alpha / r) * (X @ A) @ B\n")
    fb = score_record("02.p1", _fn_record("02.p1", src, "adapted_forward"))
    assert 0 < fb.points < fb.max_points and "ended" in fb.text(), fb.text()


@needs_sandbox
def test_the_runner_sees_no_keys_no_grader_and_cannot_write(tmp_path):
    """What the student's function finds around it in the runner, reported through its own result."""
    key_file = keys.key_dir() / "02.json"
    src = ("import os, importlib.util, sys\n"
           "def adapted_forward(X, W, A, B, lora_alpha, r):\n"
           f"    seen = [os.path.exists({str(key_file)!r}), importlib.util.find_spec('coursekit.grading.lessons') is not None,\n"
           "            os.access(sys.prefix + '/lib', os.W_OK), os.getpid() < 10,\n"
           "            any(k.startswith('COURSEKIT_KEYS') or k == 'COURSEKIT_SEED' for k in os.environ)]\n"
           "    raise RuntimeError(repr(seen))\n")
    fb = score_record("02.p1", _fn_record("02.p1", src, "adapted_forward"))
    assert "[False, False, False, True, False]" in fb.text(), fb.text()


def test_an_unpicklable_function_is_refused_with_the_reason():
    import threading

    lock = threading.Lock()
    fn = _notebook_function("def adapted_forward(X, W, A, B, lora_alpha, r):\n    return lock\n", "adapted_forward", lock=lock)
    rec = answer_record("02.p1", fn)
    assert "unsendable" in rec
    fb = score_record("02.p1", rec)
    assert fb.points == 0 and "could not be sent to the grader" in fb.text()


# --------------------------------------------------------------------------- caps on the whole process tree

# Like needs_sandbox: skipped where control groups cannot be made, except in CI, where that is a failure.
needs_tree_caps = pytest.mark.skipif(sandbox.tree_caps_problem() is not None and os.environ.get("CI") != "true",
                                     reason=f"no process-tree caps here: {sandbox.tree_caps_problem()}")


def _in_sandbox(src: str, limits) -> "subprocess.CompletedProcess":
    import subprocess

    return subprocess.run(sandbox.command([sys.executable, "-c", src], sandbox.Spec(limits=limits)),
                          capture_output=True, text=True, timeout=120)


# A fork bomb that stops by itself after 300 children (each sleeps 20 s), so that a broken cap cannot harm the
# machine that runs this test: with the cap it stops much earlier, on the fork the kernel refuses.
_FORK_BOMB = ("import os, time\n"
              "n = 0\n"
              "try:\n"
              "    while n < 300:\n"
              "        if os.fork() == 0:\n"
              "            time.sleep(20)\n"
              "            os._exit(0)\n"
              "        n += 1\n"
              "except OSError as e:\n"
              "    print('refused after', n, type(e).__name__)\n"
              "else:\n"
              "    print('not capped', n)\n")

# Three children of 200 MB each: every one stays far below the per-process address-space cap.
_MANY_HOGS = ("import os, time\n"
              "kids = []\n"
              "for i in range(3):\n"
              "    pid = os.fork()\n"
              "    if pid == 0:\n"
              "        b = bytearray(200 << 20)\n"
              "        for j in range(0, len(b), 4096):\n"
              "            b[j] = 1\n"
              "        time.sleep(2)\n"
              "        os._exit(0)\n"
              "    kids.append(pid)\n"
              "print('killed', sum(os.WIFSIGNALED(os.waitpid(k, 0)[1]) for k in kids))\n")


@needs_sandbox
@needs_tree_caps
def test_a_fork_bomb_is_stopped_by_the_trees_task_cap():
    import time

    t0 = time.monotonic()
    r = _in_sandbox(_FORK_BOMB, sandbox.Limits(tasks=40))
    assert "refused after" in r.stdout, (r.stdout, r.stderr)
    assert int(r.stdout.split()[2]) < 40
    assert time.monotonic() - t0 < 15  # its sleeping children died with the sandbox, they were not waited for


@needs_sandbox
@needs_tree_caps
def test_many_processes_under_the_per_process_cap_are_capped_as_a_tree():
    """600 MB in three processes: under a 300 MB tree cap the out-of-memory killer ends some of them (and nothing
    outside the tree); under the default cap all three finish, so the cap, not the machine, did it."""
    capped = _in_sandbox(_MANY_HOGS, sandbox.Limits(tree_memory=300 << 20))
    assert capped.returncode == 0 and capped.stdout.split()[:1] == ["killed"], (capped.stdout, capped.stderr)
    assert int(capped.stdout.split()[1]) >= 1
    free = _in_sandbox(_MANY_HOGS, sandbox.Limits())
    assert free.stdout.strip() == "killed 0", (free.stdout, free.stderr)


def test_without_control_groups_the_sandbox_runs_without_tree_caps(monkeypatch):
    from coursekit import cgroups

    monkeypatch.setattr(cgroups, "problem", lambda: "no cgroup file system here")
    argv = sandbox.command(["true"], sandbox.Spec())
    assert argv[0] == "prlimit" and "coursekit-sandbox" not in argv
    assert sandbox.tree_caps_problem() == "no cgroup file system here"


def test_a_group_that_cannot_be_made_leaves_the_sandbox_without_tree_caps_and_says_so(monkeypatch, capsys):
    from coursekit import cgroups

    def enter(memory, tasks):
        raise PermissionError(13, "Permission denied", "/sys/fs/cgroup/pids/coursekit/1-0")

    monkeypatch.setattr(cgroups, "problem", lambda: None)
    monkeypatch.setattr(cgroups, "enter", enter)
    argv = sandbox.command(["true"], sandbox.Spec())
    assert argv[0] == "prlimit" and "bwrap" in argv
    assert "without caps" in capsys.readouterr().err


@pytest.mark.parametrize("memory, tasks", [(0, 10), (1 << 20, -1), (1.5e9, 10), (1 << 20, None), (True, 10)])
def test_tree_caps_refuse_what_is_not_a_positive_int(memory, tasks):
    from coursekit import cgroups

    with pytest.raises(ValueError, match="positive int"):
        cgroups.enter(memory, tasks)


# --------------------------------------------------------------------------- the sandboxed kernel


def _kernel_cell(src: str):
    c = new_code_cell(src)
    c.metadata["nbgrader"] = {"schema_version": 3, "locked": False, "solution": True, "grade": False, "grade_id": "a"}
    return c


@needs_sandbox
def test_the_grading_kernel_cannot_reach_the_grader(tmp_path):
    """One notebook tries what the review found: read the keys and solutions, write a .pth into site-packages,
    leave a detached child behind, signal the grading process. None of it works; the grader goes on."""
    import os
    import site
    import time

    from coursekit.guard import GuardedExecute

    marker = tmp_path / "child-was-here"
    key_file = keys.key_dir() / "02.json"
    child = f"import time; time.sleep(4); open({str(marker)!r}, 'w')"
    probe = ("import os, sys, site, subprocess, signal\n"
             f"print('keys', os.path.exists({str(key_file)!r}))\n"
             f"print('solutions', os.path.isdir({str(sandbox.REPO / 'solutions')!r}) and bool(os.listdir({str(sandbox.REPO / 'solutions')!r})))\n"
             "try:\n"
             "    open(site.getsitepackages()[0] + '/evil.pth', 'w').write('import os')\n"
             "    print('pth written')\n"
             "except OSError:\n"
             "    print('pth refused')\n"
             f"subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True)\n"
             f"print('grader visible', os.path.exists('/proc/{os.getpid()}'))\n"
             "try:\n"
             f"    os.kill({os.getpid()}, signal.SIGTERM)\n"
             "    print('signalled')\n"
             "except OSError:\n"
             "    print('cannot signal')\n"
             "print('env', 'COURSEKIT_KEYS' in os.environ)\n")
    nb = new_notebook(cells=[_kernel_cell(probe)])
    (tmp_path / "work").mkdir()
    ex = GuardedExecute(timeout=120, kernel_name="python3")
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": str(tmp_path / "work")}})
    out = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert out, nb.cells[0].outputs
    for line in ("keys False", "solutions False", "pth refused", "cannot signal", "env False"):
        assert line in out, out
    assert not any(p.endswith("evil.pth") for d in site.getsitepackages() for p in os.listdir(d))
    time.sleep(6)  # the detached child would have written by now: it died with the kernel's namespace
    assert not marker.exists()


@needs_sandbox
def test_files_a_notebook_writes_stay_in_the_sandbox(tmp_path):
    from coursekit.guard import GuardedExecute

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "given.txt").write_text("data")  # a file the lesson's release ships (release_files)
    (tmp_path / "work" / "notes.txt").write_text("the student's own notes")  # handed in besides: set aside
    (tmp_path / "work" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "work" / ".ipynb_checkpoints" / "tiny-checkpoint.ipynb").write_text("{}")
    (tmp_path / "work" / "submission_secret.txt").write_text("s3cret")  # nbgrader's: the grader's, not the kernel's
    nb = new_notebook(cells=[_kernel_cell(
        "import os\n"
        "print('sees', sorted(os.listdir('.')))\n"
        "print(open('given.txt').read())\n"
        "open('big.bin', 'wb').write(b'0' * (1 << 20))\n"
        "try:\n"
        "    open('huge.bin', 'wb').write(b'0' * (300 << 20))\n"
        "except OSError as e:\n"
        "    print('capped', type(e).__name__)\n")])
    ex = GuardedExecute(timeout=120, kernel_name="python3", release_files={"tiny": ["tiny.ipynb", "given.txt"]})
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": str(tmp_path / "work")}})
    out = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "data" in out and "capped" in out, nb.cells[0].outputs
    assert "sees ['given.txt']" in out, out  # the notes, the checkpoints and nbgrader's secret stayed outside
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [".ipynb_checkpoints", "given.txt", "notes.txt",
                                                                       "submission_secret.txt"]


@needs_sandbox
def test_a_notebook_graded_by_nbgraders_own_autograde_sees_only_itself(tmp_path):
    """The plain route (a formgrader button, `nbgrader autograde`): GuardedExecute reads what the lesson's release
    folder holds from release_directory, and the kernel sees the lesson's notebook of the submission folder only."""
    from coursekit.guard import GuardedExecute

    aid = "02-lora-inside-one-matmul"
    work = tmp_path / "submitted" / "ana" / aid
    work.mkdir(parents=True)
    (work / f"{aid}.ipynb").write_text("{}")
    (work / "notes.txt").write_text("notes")
    nb = new_notebook(cells=[_kernel_cell("import os\nprint('sees', sorted(os.listdir('.')))\n")])
    ex = GuardedExecute(timeout=120, kernel_name="python3", release_directory=str(sandbox.REPO / "lessons"))
    nb, _ = ex.preprocess(nb, {"unique_key": aid, "nbgrader": {"assignment": aid}, "metadata": {"path": str(work)}})
    out = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert f"sees ['{aid}.ipynb']" in out, out
    assert ex.release_sources.get(aid), "the release notebook's cells were not read"


def test_without_a_sandbox_grading_refuses_unless_told(monkeypatch, tmp_path):
    from coursekit import course

    monkeypatch.setattr(sandbox, "problem", lambda: "bubblewrap is not installed (test)")
    monkeypatch.delenv(sandbox.ENV_OFF, raising=False)
    with pytest.raises(course.CourseError, match="cannot grade for credit: bubblewrap is not installed"):
        course.grade_class(lessons=["02"], examples=True, course_dir=tmp_path / "c", release_dir=tmp_path / "r", workers=1,
                           progress=False)


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("the sandbox is Linux only")


# --------------------------------------------------------------------------- no privilege, no network, no machine
# What a hostile class tried against a root grader (the CI runs as root, so these run with the attacker's skills):
# each attempt below worked before the sandbox became an allow-list without privilege or network.

_ATTACKS = r'''
import ctypes, ctypes.util, json, os, socket
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
seen = {}
def attempt(name, fn):
    try:
        r = fn()
        seen[name] = "done" if r is None or r is True or (type(r) is int and r == 0) else f"failed {r}"
    except Exception as e:
        seen[name] = f"failed {type(e).__name__}"
def _errno(rc):
    return 0 if rc == 0 else f"errno {ctypes.get_errno()}"
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
seen["uid"], seen["CapEff"], seen["CapBnd"] = os.getuid(), status["CapEff"].strip(), status["CapBnd"].strip()
attempt("umount a cover", lambda: _errno(libc.umount2(COVER.encode(), 2)))
attempt("remount / writable", lambda: _errno(libc.mount(b"none", b"/", None, 32 | 4096, None)))  # MS_REMOUNT|MS_BIND
attempt("mount a cgroup", lambda: _errno(libc.mount(b"cgroup", b"/tmp", b"cgroup2", 0, None)))
def leave_cgroup():
    for line in open("/proc/self/cgroup"):
        path = line.strip().split(":", 2)[2]
        for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory"):
            open(root + "/cgroup.procs", "w").write(str(os.getpid()))
            return True
attempt("leave its cgroup", leave_cgroup)
attempt("read /etc/shadow", lambda: len(open("/etc/shadow").read()) > 0)
attempt("read the other course", lambda: len(open(OTHER).read()) > 0)
attempt("read the grader's home", lambda: len(open(HOME_FILE).read()) > 0)
attempt("connect to the listener", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=3).close())
attempt("connect to the scheduler", lambda: socket.create_connection(("127.0.0.1", SCHEDULER_PORT), timeout=3).close())
attempt("see a grader variable", lambda: "GRADER_SECRET" in os.environ)
print("SEEN" + json.dumps(seen))
'''


@pytest.fixture()
def machine(tmp_path):
    """What a sandboxed process must not reach: a second copy of the course outside this clone (its key file), a file
    in the grader's home folder, a TCP listener on loopback, a Dask scheduler's port on loopback, and a variable of
    the grader's environment."""
    import socket
    from pathlib import Path

    other = tmp_path / "another-copy-of-the-course" / "autograder" / "keys"
    other.mkdir(parents=True)
    (other / "02.json").write_text((keys.key_dir() / "02.json").read_text())
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    sched = socket.socket()  # where a local Dask scheduler listens (its port is all the attack needs)
    sched.bind(("127.0.0.1", 0))
    sched.listen(5)
    os.environ["GRADER_SECRET"] = "1"
    home_file = Path.home() / f".coursekit-test-secret-{os.getpid()}"
    home_file.write_text("the grader's own file")
    try:
        yield {"OTHER": str(other / "02.json"), "HOME_FILE": str(home_file), "PORT": listener.getsockname()[1], "SCHEDULER_PORT": sched.getsockname()[1],
               "COVER": str(sandbox.PKG / "grading" / "lessons")}
    finally:
        os.environ.pop("GRADER_SECRET", None)
        home_file.unlink()
        listener.close()
        sched.close()


def _attacks(machine: dict) -> str:
    return "".join(f"{k} = {v!r}\n" for k, v in machine.items()) + _ATTACKS


def _seen(text: str) -> dict:
    line = next((l for l in text.splitlines() if l.startswith("SEEN")), None)
    assert line is not None, text[-3000:]
    return json.loads(line[4:])


def _nothing_worked(seen: dict) -> None:
    done = [k for k, v in seen.items() if v == "done"]
    assert not done, f"the sandboxed code managed to: {done} ({seen})"
    assert seen["uid"] != 0 and int(seen["CapEff"], 16) == 0 and int(seen["CapBnd"], 16) == 0, seen


@needs_sandbox
def test_a_grading_kernel_has_no_privilege_no_network_and_none_of_the_machine(tmp_path, machine):
    from coursekit.guard import GuardedExecute

    (tmp_path / "work").mkdir()
    nb = new_notebook(cells=[_kernel_cell(_attacks(machine))])
    ex = GuardedExecute(timeout=120, kernel_name="python3")
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": str(tmp_path / "work")}})
    _nothing_worked(_seen("".join(o.get("text", "") for o in nb.cells[0].outputs)))


@needs_sandbox
def test_a_graded_function_has_no_privilege_no_network_and_none_of_the_machine(machine):
    src = ("def adapted_forward(X, W, A, B, lora_alpha, r):\n"
           + "".join("    " + l + "\n" for l in _attacks(machine).replace("print(", "raise RuntimeError(").splitlines()))
    fb = score_record("02.p1", _fn_record("02.p1", src, "adapted_forward"))
    text = fb.text()
    start = text.index("SEEN")
    seen = json.loads(text[start + 4:text.index("}", start) + 1])
    _nothing_worked(seen)


@needs_sandbox
def test_a_grader_that_is_not_root_sandboxes_without_privilege_or_network_too(monkeypatch, machine):
    """The same sandbox as an ordinary user builds it (a user namespace, every capability dropped)."""
    import subprocess

    monkeypatch.setattr(sandbox, "privileged", lambda: False)
    argv = sandbox.command([sys.executable, "-c", _attacks(machine)], sandbox.Spec())
    assert "--unshare-user" in argv and "--unshare-net" in argv and argv[argv.index("--cap-drop") + 1] == "ALL"
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    seen = _seen(r.stdout + r.stderr)
    done = [k for k, v in seen.items() if v == "done"]
    assert not done and int(seen["CapEff"], 16) == 0, seen


_USERNS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:  # in a child: a user namespace of its own (in which it could mount a tmpfs of any size)
    os._exit(0 if libc.unshare(0x10000000) == 0 else 3)
_, status = os.waitpid(pid, 0)
print('USERNS', 'made' if os.waitstatus_to_exitcode(status) == 0 else 'refused')
"""


@needs_sandbox
def test_a_grader_that_is_not_root_gives_the_student_no_user_namespace_of_its_own(monkeypatch):
    """As an ordinary user, bubblewrap's --disable-userns: the student's code cannot make a user namespace (and in it a
    tmpfs that no cap of the sandbox's bounds). The control: without the option it can."""
    import subprocess

    monkeypatch.setattr(sandbox, "privileged", lambda: False)
    argv = sandbox.command([sys.executable, "-c", _USERNS], sandbox.Spec())
    assert "--disable-userns" in argv
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert "USERNS refused" in r.stdout, r.stdout + r.stderr
    without = [a for a in argv if a != "--disable-userns"]
    r = subprocess.run(without, capture_output=True, text=True, timeout=120)
    assert "USERNS made" in r.stdout, r.stdout + r.stderr


@needs_sandbox
def test_a_root_grader_gives_the_student_no_user_namespace_of_its_own_either():
    """As root, bubblewrap starts in coursekit/nouserns.py's user namespace, whose limit of further user namespaces
    is 0: the sandboxed user cannot make one, nor raise the limit. The control: without the launcher it can."""
    import subprocess

    if not sandbox.privileged():
        pytest.skip("only a root grader starts bubblewrap through the launcher")
    probe = _USERNS + "\ntry:\n    open('/proc/sys/user/max_user_namespaces', 'w').write('9')\n    print('LIMIT raised')\n" \
        "except OSError:\n    print('LIMIT kept')\n"
    argv = sandbox.command([sys.executable, "-c", probe], sandbox.Spec())
    start = argv.index("bwrap")
    assert argv[start - 1] == "--" and argv[start - 2].endswith("nouserns.py")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert "USERNS refused" in r.stdout and "LIMIT kept" in r.stdout, r.stdout + r.stderr
    launcher = argv[start - 5:start]
    without = [a for i, a in enumerate(argv) if not start - 5 <= i < start]
    assert launcher[0] == sys.executable and "nouserns.py" not in " ".join(without)
    r = subprocess.run(without, capture_output=True, text=True, timeout=120)
    assert "USERNS made" in r.stdout, r.stdout + r.stderr


def test_the_userns_launcher_says_why_it_cannot_start():
    """Bad use of the launcher is one line and status 125, never a traceback."""
    import subprocess

    r = subprocess.run([sys.executable, "-I", "-S", str(sandbox.PKG / "nouserns.py"), "true"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 125 and r.stderr.startswith("usage:"), r.stderr


def test_the_sandbox_passes_an_explicit_environment_only():
    env = sandbox.environment({"PATH": "/x", "COURSEKIT_KEYS": "/k", "COURSEKIT_SEED": "7", "AWS_SECRET_ACCESS_KEY": "s",
                               "OMP_NUM_THREADS": "1", "HOME": "/root", "NBGRADER_EXECUTION": "autograde"})
    assert env["OMP_NUM_THREADS"] == "1" and env["NBGRADER_EXECUTION"] == "autograde" and env["HOME"] == "/tmp"
    assert not {"COURSEKIT_KEYS", "COURSEKIT_SEED", "AWS_SECRET_ACCESS_KEY"} & set(env)
    argv = sandbox.command(["python3"], sandbox.Spec(env={"AWS_SECRET_ACCESS_KEY": "s"}))
    assert "--clearenv" in argv and "AWS_SECRET_ACCESS_KEY" not in argv


# --------------------------------------------------------------------------- one budget per submission, output in bytes


def _fn_cell(item: str, src: str, name: str):
    return _test_cell(item, [_record(_fn_record(item, src, name))])


@needs_sandbox
def test_a_slow_but_correct_function_earns_nothing_once_the_budget_is_spent(monkeypatch):
    """Every call stays under its own limit (1.5 s of 3), but together they outlast the submission's budget: the item
    scores 0 and says why; a value answered after it is still scored."""
    monkeypatch.setenv("COURSEKIT_CASE_TIMEOUT", "3")
    monkeypatch.setenv("COURSEKIT_SUBMISSION_BUDGET", "6")
    slow = "import time\n" + RIGHT_P1.replace("    return", "    time.sleep(1.5)\n    return")
    nb = new_notebook(cells=[_fn_cell("02.p1", slow, "adapted_forward"),
                             _test_cell("02.p6", [_record(answer_record("02.p6", RIGHT))])])
    ScoreAnswers().preprocess(nb, {})
    texts = ["".join(o.get("text", "") for o in c.outputs if o.output_type == "stream") for c in nb.cells]
    points = [float(next(o for o in c.outputs if o.output_type == "execute_result").data["text/plain"]) for c in nb.cells]
    assert points == [0.0, 1.0], (points, texts)
    assert "grading time budget (6 s" in texts[0], texts[0]


@needs_sandbox
def test_the_same_function_at_full_speed_keeps_its_points_within_the_budget(monkeypatch):
    monkeypatch.setenv("COURSEKIT_SUBMISSION_BUDGET", "60")
    nb = new_notebook(cells=[_fn_cell("02.p1", RIGHT_P1, "adapted_forward")])
    ScoreAnswers().preprocess(nb, {})
    assert float(nb.cells[0].outputs[-1].data["text/plain"]) == 1.0 * lesson02_points("p1")


def lesson02_points(item: str) -> float:
    from coursekit.grading import lesson_items

    return float(lesson_items("02")[item].points)


def _plain_cell(src: str):
    return new_code_cell(src)


@needs_sandbox
def test_a_notebook_past_its_budget_stops_and_an_added_cell_gets_the_answer_limit(tmp_path, monkeypatch):
    from coursekit.guard import GuardedExecute, source_hash

    monkeypatch.setenv("COURSEKIT_SUBMISSION_BUDGET", "20")
    (tmp_path / "work").mkdir()
    release_cell = _plain_cell("import time\ntime.sleep(1)\nprint('release cell done')")
    added = _plain_cell("import time\ntime.sleep(30)\nprint('added cell done')")  # not in the release: answer limit (2 s)
    nb = new_notebook(cells=[release_cell, added, _plain_cell("time.sleep(1)\nprint('third')"),
                             _plain_cell("time.sleep(60)\nprint('fourth')"), _plain_cell("print('fifth')")])
    known = [source_hash(release_cell.source), source_hash(nb.cells[2].source), source_hash(nb.cells[3].source),
             source_hash(nb.cells[4].source)]
    ex = GuardedExecute(timeout=120, kernel_name="python3", answer_timeout=2, release_sources={"02-x": known})
    import time

    t0 = time.monotonic()
    nb, _ = ex.preprocess(nb, {"unique_key": "02-x", "metadata": {"path": str(tmp_path / "work")}})
    out = ["".join(o.get("text", "") + str(o.get("evalue", "")) for o in c.outputs) for c in nb.cells]
    assert "release cell done" in out[0]
    assert "added cell done" not in out[1] and "still running after 2 s" in out[1], out[1]
    assert "third" in out[2]
    assert "fourth" not in out[3] and "grading time budget (20 s)" in out[3], out  # a release cell: 120 s, but the budget
    assert "fifth" not in out[4] and "grading time budget (20 s)" in out[4], out
    assert time.monotonic() - t0 < 45


_BIG_OUTPUTS = [  # 5 MB each way a kernel can hand the grader something to keep
    "print('x' * (50 << 20))",
    "from IPython.display import publish_display_data\npublish_display_data({'text/plain': 'm'}, metadata={'k': 'A' * (5 << 20)})",
    "from IPython.display import display\nh = display({'text/plain': 'small'}, raw=True, display_id=True)\n"
    "h.update({'text/plain': 'C' * (5 << 20)}, raw=True)",
    "k = get_ipython().kernel\nk.session.send(k.iopub_socket, 'error', {'ename': 'E', 'evalue': 'B' * (5 << 20), "
    "'traceback': []}, parent=k.get_parent(), ident=k._topic('error'))",
]


@needs_sandbox
@pytest.mark.parametrize("src", _BIG_OUTPUTS, ids=["one-line", "display-metadata", "display-update", "error-value"])
def test_a_huge_output_is_cut_to_the_cells_byte_cap(tmp_path, src):
    from coursekit.guard import GuardedExecute

    (tmp_path / "work").mkdir()
    nb = new_notebook(cells=[_kernel_cell(src), _kernel_cell("print('after')")])
    ex = GuardedExecute(timeout=120, kernel_name="python3")
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": str(tmp_path / "work")}})
    kept = len(json.dumps(nb.cells[0].outputs))
    assert kept <= (1 << 20) + 2000, kept  # GuardedExecute.cell_output_bytes
    assert "output cut" in nb.cells[0].outputs[-1]["text"], [(o.get("output_type"), o.get("name"), str(o)[:300]) for o in nb.cells[0].outputs]
    assert "after" in nb.cells[1].outputs[0]["text"]
    assert len(nbformat.writes(nb)) < 2 << 20


@needs_sandbox
def test_the_kernel_cannot_write_to_the_graders_terminal_nor_into_its_socket_folder(tmp_path, capfd):
    """What the kernel writes to its own stdout and stderr goes nowhere; its socket folder (on the host's disk, outside
    every tmpfs cap) is the grader's again once the kernel runs, so it can neither fill the disk nor swap a socket."""
    from coursekit.guard import GuardedExecute

    (tmp_path / "work").mkdir()
    src = ("import os\n"
           "os.write(1, b'KERNEL-TO-GRADER-STDOUT\\n'); os.write(2, b'KERNEL-TO-GRADER-STDERR\\n')\n"
           "d = [l.split()[4] for l in open('/proc/self/mountinfo') if '/ck-' in l.split()[4]][0]\n"
           "try:\n"
           "    open(d + '/fill', 'wb').write(b'0' * (1 << 20)); print('wrote in the socket folder')\n"
           "except OSError as e:\n"
           "    print('socket folder refused', type(e).__name__)\n"
           "print('uid', os.getuid())\n")
    nb = new_notebook(cells=[_kernel_cell(src)])
    ex = GuardedExecute(timeout=120, kernel_name="python3")
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": str(tmp_path / "work")}})
    out = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "socket folder refused" in out, out
    seen = capfd.readouterr()
    assert "KERNEL-TO-GRADER" not in seen.out + seen.err


@needs_sandbox
def test_a_grader_that_is_not_root_leaves_its_kernel_no_socket_folder_to_fill(tmp_path, monkeypatch):
    """A grader that is not root runs the kernel as itself (the owner of its socket folder, whatever the folder's
    mode): once every channel is connected the folder is removed, so the kernel can make nothing there, and its
    output, a timed-out cell's interrupt and the cells after it work as before."""
    from coursekit.guard import GuardedExecute

    monkeypatch.setattr(sandbox, "privileged", lambda: False)
    (tmp_path / "work").mkdir()
    src = ("import os, sys\n"
           "d = os.path.dirname(sys.argv[sys.argv.index('-f') + 1])\n"
           "try:\n"
           "    open(d + '/fill', 'wb').write(b'0' * (1 << 20)); print('wrote in the socket folder')\n"
           "except OSError as e:\n"
           "    print('socket folder refused', type(e).__name__)\n"
           "print('uid', os.getuid())\n"
           "print('folder', d)\n")
    answer = _kernel_cell("import time\ntime.sleep(600)")
    answer.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "slow", "schema_version": 3}
    nb = new_notebook(cells=[_kernel_cell(src), answer, _kernel_cell("print('after the interrupt')")])
    ex = GuardedExecute(timeout=120, answer_timeout=3, interrupt_grace=60, kernel_name="python3")
    t0 = time.monotonic()
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": str(tmp_path / "work")}})
    out = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "socket folder refused" in out, out
    assert "after the interrupt" in "".join(o.get("text", "") for o in nb.cells[2].outputs), nb.cells[2].outputs
    assert time.monotonic() - t0 < 50  # the interrupt reached the kernel: it was not stopped after the grace
    # This kernel's own folder is gone (not "no new ck-* folder in /tmp": another grading may run beside this test).
    folder = Path(re.search(r"^folder (\S+)$", out, re.M).group(1))
    assert folder.name.startswith("ck-") and not folder.exists(), folder


@needs_sandbox
def test_no_two_sandboxes_share_a_user():
    """A root grader gives each sandboxed tree a user of its own, so that nothing the kernel keeps per user (a key in
    the user's keyring, a process count) can carry anything from one student's code to another's."""
    import subprocess

    if not sandbox.privileged():
        pytest.skip("a grader that is not root runs every sandbox as itself, in a user namespace")
    src = "import os\nprint(os.getuid())\n"
    uids = set()
    for _ in range(3):
        r = subprocess.run(sandbox.command([sys.executable, "-c", src], sandbox.Spec()), capture_output=True, text=True,
                           timeout=60)
        uids.add(int(r.stdout.split()[-1]))
    assert len(uids) == 3 and all(u >= sandbox.SANDBOX_IDS[0] for u in uids), uids


# --------------------------------------------------------------------------- submissions are data


def _student(course_dir, sid: str, aid: str):
    d = course_dir / "submitted" / sid / aid
    d.mkdir(parents=True)
    return d


def test_a_submission_with_a_symbolic_link_or_a_device_is_refused_before_nbgrader_reads_it(tmp_path):
    """A notebook that is a link to the solution, an extra file that is a link to the answer keys, a device, a file
    too large: 0 points and the reason, and nothing of what they point to is copied into the course. A stray file
    that is plain data (model.bin) is set aside instead: the blank notebook beside it is graded, 0 points of its own,
    and the feedback and submissions.csv name what was set aside."""
    import csv

    from coursekit import course

    root = sandbox.REPO
    aid = "02-lora-inside-one-matmul"
    solution = root / "solutions" / aid / f"{aid}.ipynb"
    blank = (root / "lessons" / aid / f"{aid}.ipynb").read_bytes()
    c = tmp_path / "course"
    (_student(c, "link-notebook", aid) / f"{aid}.ipynb").symlink_to(solution)
    d = _student(c, "link-extra", aid)
    (d / f"{aid}.ipynb").write_bytes(blank)
    (d / "notes.json").symlink_to(keys.key_dir() / "02.json")
    d = _student(c, "stray-file", aid)
    (d / f"{aid}.ipynb").write_bytes(blank)
    (d / "model.bin").write_bytes(b"0" * 100)
    d = _student(c, "big-file", aid)
    (d / f"{aid}.ipynb").write_bytes(blank)
    with open(d / "timestamp.txt", "wb") as f:  # nbgrader's own file: allowed, but not at this size
        f.truncate((32 << 20) + 1)  # submissions.MAX_FILE_BYTES + 1
    d = _student(c, "hard-link", aid)
    (d / f"{aid}.ipynb").write_bytes(blank)
    os.link(d / f"{aid}.ipynb", d / "timestamp.txt")
    d = _student(c, "pipe", aid)
    (d / f"{aid}.ipynb").write_bytes(blank)
    os.mkfifo(d / "fifo")
    (c / "submitted" / "link-folder").mkdir()
    (c / "submitted" / "link-folder" / aid).symlink_to(root / "solutions" / aid)
    table = course.grade_class(lessons=[aid], course_dir=c, release_dir=tmp_path / "release", workers=1, progress=False)
    rows = {r["student_id"]: float(r["raw_score"]) for r in course.read_grades_csv(c / "grades.csv")}
    assert rows == dict.fromkeys(["big-file", "hard-link", "link-extra", "link-folder", "link-notebook", "pipe",
                                  "stray-file"], 0.0), rows
    for sid, why in [("link-notebook", "symbolic link"), ("link-extra", "symbolic link (notes.json)"),
                     ("link-folder", "folder is a symbolic link"),
                     ("big-file", "more than the 32 MB"), ("pipe", "not a regular file"), ("hard-link", "hard link")]:
        assert f"{sid}/{aid}: " in table and why in table.split(f"{sid}/{aid}: ")[1].split("\n")[0], (sid, table)
        assert why in (c / "feedback" / sid / aid / f"{aid}.html").read_text()
    assert "stray-file/" not in table  # graded: the blank notebook's own 0
    assert "Set aside by the grader" in (c / "feedback" / "stray-file" / aid / f"{aid}.html").read_text()
    with open(c / "submissions.csv", newline="") as f:
        status = {r["student"]: r for r in csv.DictReader(f)}
    assert status["stray-file"]["status"] == "graded" and status["stray-file"]["ignored"] == "model.bin"
    # Nothing a link pointed to was copied anywhere: a refused folder's autograded copy is the release's notebook
    # with the reason in its first cell, and nbgrader's two small files, each read only when it is a plain file of
    # its own (big-file's 32 MB timestamp and hard-link's linked one are not: a time and a secret are made up).
    for sid in ("link-notebook", "link-extra", "link-folder", "big-file", "hard-link", "pipe"):
        copy = c / "autograded" / sid / aid
        assert sorted(p.name for p in copy.iterdir()) == [f"{aid}.ipynb", "submission_secret.txt", "timestamp.txt"], sid
        assert (copy / f"{aid}.ipynb").read_bytes().count(b"### BEGIN SOLUTION") == 0
        assert (copy / "timestamp.txt").stat().st_size < 100 and (copy / "submission_secret.txt").stat().st_size == 128
