"""The grader's defenses against hostile and broken submissions, piece by piece and fast.

The end-to-end checks (real nbgrader, the example class's hostile students of lessons 00, 02 and 03,
graded twice) are in tests/test_grading_roundtrip.py; these pin each defense without a full class:
the static scan of answer cells, the run-time tampering check, the per-case time limit, the reference
tripwire, captured print floods, broken submission files, and the guarded executor on a tiny notebook.
"""

from __future__ import annotations

import json
import sys

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from coursekit import course
from coursekit.grading import check, grade, tampering
from coursekit.grading.checkers import Case, check_function
from coursekit.guard import scan_source

# --------------------------------------------------------------------------- static scan of answer cells


@pytest.mark.parametrize("src", [
    "import coursekit.grading\ncoursekit.grading.grade = lambda i, a: 3.0",
    "from coursekit.grading import checkers\ncheckers.check_function = lambda *a, **k: None",
    "from coursekit import grading as g\nsetattr(g, 'check', print)",
    "from coursekit.grading.lessons import lesson02\nlesson02.ITEMS['p1'].points = 0",
    "from coursekit.grading.lessons import lesson02\nlesson02.ITEMS.update({})",
    "import sys\nsys.modules['coursekit.lora'] = object()",
    "import builtins\nbuiltins.isinstance = lambda *a: True",
    "import sys\nsys.setprofile(None)",
    "def f():\n    pass\nf.__code__ = (lambda: 1).__code__",
    "g = __import__('coursekit.grading', fromlist=['x'])\ng.grade = print",
    "exec('import coursekit; coursekit.grading.grade = print')",
    # reading the grader's item tables: their expected() values are the answers
    "from coursekit.grading import lesson_items\nanswer_w2 = lesson_items('02')['w2'].expected()",
    "import coursekit.grading\nanswer_w2 = coursekit.grading.lesson_items('02')['w2'].expected()",
    "from coursekit.grading.lessons.lesson02 import ITEMS\nanswer_w2 = ITEMS['w2'].expected()",
    "import coursekit.grading.lessons.lesson02 as L\nx = L.ITEMS",
    "from coursekit import grading\nx = grading.lessons.lesson02.ITEMS",
    "from coursekit.grading import keys\nprint(keys.load('02'))",
    # reaching for the instructor's files (the grading kernel never holds the keys; the disk might)
    "import os, json\nanswer_w1 = json.load(open(os.environ['COURSEKIT_KEYS'] + '/02.json'))['keys']['w1']",
    "answer_w1 = open('../../../keys/02.json').read()",
    "import json\nnb = json.load(open('/work/solutions/02-lora-inside-one-matmul/02-lora-inside-one-matmul.ipynb'))",
    "import coursekit.grading as g\nanswer_w3 = g._keys.load('02')['keys']['w3']",
    "import coursekit.grading as g\nk = g._Context('02', 'w1', False).key()",
    "%pwd\nimport coursekit.grading as g\ng.grade = lambda *a: 3.0",  # a magic first: still read as Python
    "import coursekit.grading as g\nvars(g)['grade'] = lambda *a: 3.0",
])
def test_the_scan_names_changes_to_the_grader(src):
    found = scan_source(src)
    assert found and found[0].startswith("line "), found


@pytest.mark.parametrize("src", [
    "def adapted_forward(X, W, A, B, lora_alpha, r):\n    return X @ W + (lora_alpha / r) * (X @ A) @ B",
    "from coursekit.grading import grade\ngrade('02.p1', adapted_forward)",  # checking oneself is fine
    "import numpy as np\nx = np.zeros(3)\nx[0] = 1\nd = {}\nd.update(a=1)",
    "answer = 'b'\nimport sys\nprint('note', file=sys.stderr)",
    "%timeit 1 + 1",  # not Python: the cell fails by itself, the scan has nothing to say
    "from coursekit import lora\nanswer_w2 = lora.param_count(4096, 4096, 16)",  # the course's kernels are fair game
    "d = {'a': 1}\nprint(d.keys(), list(d.items()))",
])
def test_the_scan_leaves_honest_cells_alone(src):
    assert scan_source(src) == []


def test_every_solution_cell_a_student_could_write_passes_the_scan():
    """The scan reads answer cells and every unlocked code cell (a student may edit or add those); none of
    the solutions' own cells may trip it, or a perfect submission would lose points."""
    from pathlib import Path

    from coursekit.guard import student_writable

    root = Path(__file__).resolve().parents[1]
    scanned = 0
    for aid in course.lesson_ids(root):
        nb = nbformat.read(root / "solutions" / aid / f"{aid}.ipynb", as_version=4)
        bound: set = set()
        for i, c in enumerate(nb.cells):
            if student_writable(c):
                scanned += 1
                assert scan_source(course._strip_solution(c.source), bound) == [], (aid, i, c.source[:200])
    assert scanned > 100


# --------------------------------------------------------------------------- run-time defenses


def _right(X, W, A, B, lora_alpha, r):
    return X @ W + (lora_alpha / r) * (X @ A) @ B


def test_replacing_a_checker_or_numpy_zeroes_every_item(monkeypatch, capsys):
    import coursekit.grading as g

    assert tampering() == []
    monkeypatch.setattr(g.Function, "check", lambda self, answer, ctx: g.Feedback(self.points, self.points, ["ok"]))
    assert grade("02.p1", _right) == 0
    out = capsys.readouterr().out
    assert "changed the grader" in out and "coursekit.grading.Function.check was replaced" in out
    monkeypatch.undo()
    monkeypatch.setattr(np, "allclose", lambda *a, **k: True)
    assert grade("02.w1", "b") == 0
    assert "numpy.allclose was replaced" in capsys.readouterr().out
    monkeypatch.undo()
    assert tampering() == [] and grade("02.p1", _right) == 3


def test_asking_the_grader_for_an_expected_value_zeroes_the_checks(monkeypatch, capsys):
    """Notebook code (here: code compiled under a notebook-like file name) that calls an item's expected()
    is reading the answer: every check after it earns 0, and the feedback says why."""
    import coursekit.grading as g

    monkeypatch.setattr(g, "_READS", [])
    items = g.lesson_items("02")
    assert items["w2"].expected() > 0 and g.tampering() == []  # the test suite itself may ask
    code = compile("answer = items['w2'].expected()", "/tmp/ipykernel_1/123.py", "exec")
    ns = {"items": items}
    exec(code, ns)
    assert g.grade("02.w2", ns["answer"]) == 0
    out = capsys.readouterr().out
    assert "changed the grader" in out and "expected value of" in out, out


def test_editing_the_loaded_keys_changes_nothing():
    from coursekit.grading import keys

    loaded = keys.load("02")
    wrong = next(x for x in "abcd" if x != loaded["keys"]["w1"])
    loaded["keys"]["w1"] = wrong  # a plain dict a notebook could edit: the next check reads the file again
    assert check("02.w1", wrong).points == 0


def test_a_function_that_loops_forever_loses_its_cases_and_grading_goes_on():
    cases = [Case({"x": np.ones(2)}, "a"), Case({"x": np.zeros(2)}, "b")]

    def endless(x):
        while True:
            try:
                pass
            except Exception:  # cannot swallow the time limit
                pass

    fb = check_function(endless, cases, lambda x: x, 2, "f", timeout=0.2)
    text = "\n".join(fb.lines)
    assert fb.points == 0 and "did not return within 0.2 s" in text and "not run (an earlier case did not return)" in text
    assert check_function(lambda x: x, cases, lambda x: x, 2, "f", timeout=0.2).full  # the alarm is off again


def test_calling_the_reference_earns_nothing():
    from coursekit import lora
    from coursekit.grading.lessons import lesson02

    # Defined as a notebook cell defines them (functions written in tests/ are trusted: see checkers._trusted).
    cell = ("def via_kernel(X, W, A, B, lora_alpha, r):\n"
            "    return lora.lora_forward(X, W, A, B, lora_alpha / r)[0]\n"
            "def via_reference(X, W, A, B, lora_alpha, r):\n"
            "    return lesson02.adapted_forward(X, W, A, B, lora_alpha, r)\n")
    ns = {"lora": lora, "lesson02": lesson02}
    exec(compile(cell, "/tmp/ipykernel_0/cell.py", "exec"), ns)
    via_kernel, via_reference = ns["via_kernel"], ns["via_reference"]

    fb = check("02.p1", via_reference)
    assert fb.points == 0 and "calls coursekit's own answer code" in "\n".join(fb.lines)
    assert "lesson02.adapted_forward" in "\n".join(fb.lines)
    # coursekit's teaching kernels stay allowed: later lessons build on earlier ones.
    assert check("02.p1", via_kernel).full


def test_calling_the_reference_from_a_thread_earns_nothing():
    """The call watch follows threads the student's function starts (a pool that runs the reference)."""
    from coursekit.grading.lessons import lesson02

    cell = ("from concurrent.futures import ThreadPoolExecutor\n"
            "def via_thread(X, W, A, B, lora_alpha, r):\n"
            "    with ThreadPoolExecutor(1) as pool:\n"
            "        return pool.submit(lesson02.adapted_forward, X, W, A, B, lora_alpha, r).result()\n")
    ns = {"lesson02": lesson02}
    exec(compile(cell, "/tmp/ipykernel_0/cell.py", "exec"), ns)
    fb = check("02.p1", ns["via_thread"])
    assert fb.points == 0 and "lesson02.adapted_forward" in "\n".join(fb.lines)


def test_a_print_flood_is_counted_not_shown(capfd):
    def chatty(X, W, A, B, lora_alpha, r):
        for i in range(5000):
            print("line", i)
        return _right(X, W, A, B, lora_alpha, r)

    fb = check("02.p1", chatty)
    out, err = capfd.readouterr()
    assert out == err == "" and fb.full
    text = "\n".join(fb.lines)
    assert "printed 5000 lines while being checked" in text and len(text) < 2000


@pytest.mark.parametrize("answer,points", [
    (float("nan"), 0),
    (np.float32(16 / 8 * 32), 1),
    ("torch", 1),
    ([64.0], 1),
])
def test_odd_number_types_get_the_right_score(answer, points):
    if answer == "torch":
        import torch

        answer = torch.tensor(64.0, requires_grad=True)
    fb = check("03.p4", answer)
    assert fb.points == points, fb.lines
    if points == 0:
        assert "finite" in fb.lines[0]


# --------------------------------------------------------------------------- broken submission files


def test_broken_files_are_named_in_plain_words(tmp_path):
    aid = "02-lora-inside-one-matmul"
    d = tmp_path / "s" / aid
    d.mkdir(parents=True)
    assert "no notebook named" in course.check_submission(d, aid)
    (d / "mine.ipynb").write_text("{}")
    assert "(found mine.ipynb)" in course.check_submission(d, aid)
    (d / f"{aid}.ipynb").write_text("")
    assert "is an empty file" in course.check_submission(d, aid)
    (d / f"{aid}.ipynb").write_text('{"cells": [')
    assert "is not JSON" in course.check_submission(d, aid)
    (d / f"{aid}.ipynb").write_text(json.dumps({"hello": 1}))
    assert "is not a notebook" in course.check_submission(d, aid)
    (d / f"{aid}.ipynb").write_bytes(b"\xff\xfe\x00garbage")
    assert "not UTF-8" in course.check_submission(d, aid)
    nbformat.write(new_notebook(cells=[new_code_cell("1")]), d / f"{aid}.ipynb")
    assert course.check_submission(d, aid) is None
    page = course.write_problem_feedback(tmp_path / "fb", aid, "it is <empty>").read_text()
    assert "0 points" in page and "it is &lt;empty&gt;" in page


# --------------------------------------------------------------------------- the guarded executor


def test_the_guarded_executor_stops_a_loop_and_survives_a_dead_kernel():
    """One tiny notebook: an answer cell that loops, a test cell after it, then a cell that kills the kernel:
    the loop is stopped with a plain message, the cell after it still runs, everything after the kernel's
    death is marked as not run (an error output, so a test cell there scores 0 rather than full marks)."""
    from nbgrader.utils import determine_grade

    from coursekit.guard import GuardedExecute

    def cell(src, **nbg):
        c = new_code_cell(src)
        if nbg:
            c.metadata["nbgrader"] = {"schema_version": 3, "locked": False, "solution": False, "grade": False, **nbg}
        return c

    nb = new_notebook(cells=[
        cell("while True:\n    pass", grade_id="a_answer", solution=True),
        cell("print('after the loop')\n1", grade_id="a_test", grade=True, locked=True, points=1),
        cell("import os\nos._exit(0)", grade_id="b_answer", solution=True),
        cell("1", grade_id="b_test", grade=True, locked=True, points=1),
    ])
    ex = GuardedExecute(timeout=60, answer_timeout=3, kernel_name="python3")
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": "."}})
    loop, after, killer, later = nb.cells
    assert "was still running after 3 s" in loop.outputs[-1]["evalue"]
    assert any("after the loop" in o.get("text", "") for o in after.outputs)
    assert determine_grade(after)[0] == 1
    assert "stopped the Python kernel in this cell (cell 3 (b_answer))" in killer.outputs[-1]["evalue"]
    assert "not run" in later.outputs[0]["evalue"] and determine_grade(later)[0] == 0


def test_a_loop_that_ignores_the_interrupt_stops_the_kernel_not_the_grader():
    from coursekit.guard import GuardedExecute

    def cell(src, **nbg):
        c = new_code_cell(src)
        c.metadata["nbgrader"] = {"schema_version": 3, "locked": False, "solution": False, "grade": False, **nbg}
        return c

    nb = new_notebook(cells=[
        cell("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", grade_id="a_answer", solution=True),
        cell("1", grade_id="a_test", grade=True, locked=True, points=1),
    ])
    ex = GuardedExecute(timeout=60, answer_timeout=2, interrupt_grace=2, kernel_name="python3")
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": "."}})
    assert "kept running after its time limit and an interrupt" in nb.cells[0].outputs[-1]["evalue"]
    assert "not run" in nb.cells[1].outputs[0]["evalue"]


def test_config_puts_the_guards_in_nbgraders_pipeline():
    from pathlib import Path

    cfg = course.load_config(Path(__file__).resolve().parents[1])
    steps = list(cfg.Autograde.autograde_preprocessors)
    assert steps[0] == "coursekit.guard.GuardedExecute"
    assert steps.index("coursekit.guard.TamperScan") < steps.index("nbgrader.preprocessors.SaveAutoGrades")


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip("SIGALRM time limits are POSIX only")
