"""The course's notebooks as artifacts: release in sync, graded cells wired to coursekit (the key-leak
scan is tests/test_key_leaks.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from coursekit import course
from coursekit.grading import lesson_items

ROOT = Path(__file__).resolve().parents[1]
LESSONS = course.lesson_ids(ROOT)
GRADE_CALL = re.compile(r'grade\("(\d\d)\.([a-z0-9_]+)",')


def _nb(kind: str, lid: str):
    return nbformat.read(ROOT / kind / lid / f"{lid}.ipynb", as_version=4)


def test_lessons_00_to_02_exist():
    assert LESSONS[:3] == ["00-setup-and-probes", "01-when-to-adapt", "02-lora-inside-one-matmul"]


@pytest.fixture(scope="module")
def fresh_release(tmp_path_factory):
    """What nbgrader generates from solutions/ now, in a temporary release folder."""
    tmp = tmp_path_factory.mktemp("release")
    course.release(LESSONS, root=ROOT, course_dir=tmp / "course", release_dir=tmp / "release")
    return tmp / "release"


def _normalise(path: Path) -> dict:
    nb = json.loads(path.read_text())
    nb["metadata"].pop("widgets", None)
    for c in nb["cells"]:
        c.pop("execution_count", None)
        c.pop("outputs", None)
    return nb


@pytest.mark.parametrize("lid", LESSONS)
def test_lessons_equal_what_nbgrader_generates(lid, fresh_release):
    committed = ROOT / "lessons" / lid / f"{lid}.ipynb"
    assert committed.exists(), f"lessons/{lid} is missing: run `make release` and commit lessons/"
    assert _normalise(committed) == _normalise(fresh_release / lid / f"{lid}.ipynb"), (
        f"lessons/{lid} is out of date with solutions/{lid}: run `make release` and commit lessons/"
    )


@pytest.mark.parametrize("kind", ["solutions", "lessons"])
@pytest.mark.parametrize("lid", LESSONS)
def test_notebooks_carry_python3_kernelspec_and_no_outputs(kind, lid):
    nb = _nb(kind, lid)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.metadata["kernelspec"]["language"] == "python"
    # The kernel's own language_info (ipykernel on the course's Python): JupyterLab writes it in when the kernel
    # starts, so a shorter copy would mark every freshly opened lesson as modified.
    info = nb.metadata.get("language_info", {})
    assert {"codemirror_mode", "file_extension", "mimetype", "name", "nbconvert_exporter", "pygments_lexer",
            "version"} <= set(info) and info["version"][:5] in ("3.11.", "3.12.", "3.13."), f"{kind}/{lid}: language_info {info}"
    for c in nb.cells:
        if c.cell_type == "code":
            assert not c.outputs, f"{kind}/{lid}: commit notebooks without outputs ({c.source[:60]!r})"


@pytest.mark.parametrize("lid", LESSONS)
def test_graded_cells_match_coursekit_items(lid):
    """Every test cell calls one coursekit item with the same points; every item has a test cell;
    the lesson has at least 3 warm-up and 5 practice items autograded."""
    num = lid[:2]
    items = lesson_items(num)
    seen = {}
    for c in _nb("solutions", lid).cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            calls = GRADE_CALL.findall(c.source)
            assert len(calls) == 1, f"{lid} cell {meta['grade_id']}: a test cell makes exactly one grade(...) call"
            lesson, item = calls[0]
            assert lesson == num and item in items, f"{lid}: unknown item {lesson}.{item}"
            assert float(meta["points"]) == float(items[item].points), f"{lid}.{item}: cell points {meta['points']} != item points {items[item].points}"
            assert "BEGIN HIDDEN TESTS" not in c.source or c.source.count("\n") < 4, "hidden blocks stay one call long"
            seen[item] = c
    assert set(seen) == set(items), f"{lid}: items without a test cell: {sorted(set(items) - set(seen))}"
    assert sum(k.startswith("w") for k in items) >= 3
    assert sum(k.startswith("p") for k in items) >= 5


@pytest.mark.parametrize("lid", LESSONS)
def test_answer_cells_and_hand_graded_cells(lid):
    """One autograded answer cell per item, each with the solution delimiters; every hand-graded
    answer is a markdown cell worth points; grade ids are unique."""
    cells = [c for c in _nb("solutions", lid).cells if "nbgrader" in c.metadata]
    answers = [c for c in cells if c.cell_type == "code" and c.metadata["nbgrader"]["solution"]]
    assert len(answers) == len(lesson_items(lid[:2])), f"{lid}: one answer cell per autograded item"
    for c in answers:
        assert "### BEGIN SOLUTION" in c.source and "### END SOLUTION" in c.source, c.metadata["nbgrader"]["grade_id"]
        assert not c.metadata["nbgrader"]["grade"] and not c.metadata["nbgrader"]["locked"]
    for c in cells:
        m = c.metadata["nbgrader"]
        if c.cell_type == "markdown" and m.get("solution"):
            assert m["grade"] and not m["locked"] and m["points"] > 0, f"{lid}: {m['grade_id']}"
        if c.cell_type == "code" and m.get("grade"):
            assert m["locked"] and not m["solution"], f"{lid}: test cell {m['grade_id']} must be locked"
    ids = [c.metadata["nbgrader"]["grade_id"] for c in cells]
    assert len(ids) == len(set(ids)), f"{lid}: duplicate grade ids"


@pytest.mark.parametrize("lid", LESSONS)
def test_release_has_no_solutions(lid):
    text = (ROOT / "lessons" / lid / f"{lid}.ipynb").read_text()
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text


def test_example_submissions_name_real_cells():
    for folder in (ROOT / "autograder" / "examples").iterdir():
        if folder.is_dir():
            ids = {c.metadata.get("nbgrader", {}).get("grade_id") for c in _nb("solutions", folder.name).cells}
            for student in folder.iterdir():
                for f in student.iterdir():
                    if f.name in ("expected.json", "submission.py"):  # expectations; a whole-notebook transform
                        continue
                    assert f.suffix in (".py", ".md"), f"{f}: example folders hold <grade_id>.py/.md, submission.py and expected.json only"
                    assert f.stem in ids, f"{f}: no cell with grade_id {f.stem} in {folder.name}"


def test_ignore_pattern_strips_library_warnings_only():
    """nbgrader zeroes a test cell with stderr; the config's pattern removes pure warning output
    (with the indented source line Python prints under a warning) and nothing else."""
    cfg = course.load_config(ROOT)
    pat = re.compile(cfg.IgnorePattern.pattern)
    assert cfg.IgnorePattern.enabled
    harmless = [
        "/site-packages/torch/x.py:12: UserWarning: NNPACK is not supported\n  return f(x)\n",
        "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'\n",
        "/tmp/ipykernel_1/1.py:3: RuntimeWarning: divide by zero encountered in divide\n  y = 1 / x\n",
    ]
    kept = ["debug: shapes (2, 3)\n", "Traceback (most recent call last):\nValueError: boom\n",
            "UserWarning: x\nstudent text after a warning\n"]
    assert all(pat.search(t) for t in harmless)
    assert not any(pat.search(t) for t in kept)
    assert cfg.Execute.timeout >= 600


def test_the_model_lessons_are_the_ones_whose_notebooks_load_the_model():
    """coursekit grade converts the embedded model before grading these lessons (their sandboxed kernels see the
    model cache read-only): the set must name every lesson whose notebook loads the converted checkpoint."""
    root = Path(__file__).resolve().parents[1]
    def code(aid: str) -> str:  # the code cells only: prose may name prepare_model without running it (lesson 01)
        nb = json.loads((root / "lessons" / aid / f"{aid}.ipynb").read_text())
        return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")

    loads = {aid[:2] for aid in course.lesson_ids(root)
             if re.search(r"prepare_model|load_model\(|default_checkpoint|load_base|capstone\.", code(aid))}
    assert loads == course.MODEL_LESSONS


def test_a_submission_nbgrader_cannot_grade_keeps_nbgraders_reason(tmp_path, capsys):
    """An edited check cell (here: duplicate cell ids, as nbgrader reports them) fails nbgrader itself: the student
    scores 0 with nbgrader's reason in the feedback, and the instructor gets the reason and the whole log."""
    root = Path(__file__).resolve().parents[1]
    aid = "02-lora-inside-one-matmul"
    a = course.api(root, tmp_path / "c", tmp_path / "r")
    course._check(a.generate_assignment(aid, force=True, create=True), "release")
    sub = tmp_path / "c" / "submitted" / "ex-broken" / aid
    sub.mkdir(parents=True)
    shutil.copyfile(tmp_path / "r" / aid / f"{aid}.ipynb", sub / f"{aid}.ipynb")  # readable: nbgrader's turn
    log = "[AutogradeApp | ERROR] boom\nTraceback (most recent call last):\n  File ...\nValueError: Notebook cell ids must be unique: 'p1_test'\n"
    a.autograde = lambda *args, **kw: {"success": False, "log": log, "error": ""}
    problem = course.autograde_one(a, aid, "ex-broken")
    assert "ValueError: Notebook cell ids must be unique" in problem
    err = capsys.readouterr().err
    assert "could not grade ex-broken/" in err and "cell ids must be unique" in err
    assert (tmp_path / "c" / "grading-errors" / "ex-broken" / f"{aid}.log").read_text().startswith("[AutogradeApp")


@pytest.mark.parametrize("lid", LESSONS)
def test_release_shows_the_computation_not_its_checks(lid):
    """The asserts that pin a lesson's numbers run in CI on solutions/ (cells tagged assert-numbers) and are not
    in the student's notebook: no such cell in the release, and check lines are a small share of its code."""
    from coursekit.checkcells import TAG, is_check_cell

    sol, rel = _nb("solutions", lid), _nb("lessons", lid)
    tagged = [c for c in sol.cells if TAG in c.metadata.get("tags", [])]
    assert all(is_check_cell(c) for c in tagged), f"{lid}: a cell tagged {TAG} must be a plain code cell"
    assert not [c for c in rel.cells if TAG in c.metadata.get("tags", [])], f"lessons/{lid} still has check cells"
    code = [l for c in rel.cells if c.cell_type == "code" and not c.metadata.get("nbgrader") for l in c.source.splitlines()]
    checks = [l for l in code if re.match(r"\s*(assert |np\.testing\.|torch\.testing\.)", l)]
    assert len(checks) <= 0.1 * len(code), (f"lessons/{lid}: {len(checks)} of {len(code)} code lines are checks; move "
                                            f"them to a cell tagged {TAG} after the computation: {checks[:3]}")


def test_a_submission_in_the_wrong_place_is_listed_with_what_to_do(tmp_path):
    lessons = course.lesson_ids(ROOT)
    sub = tmp_path / "submitted"
    (sub / "ana" / "00").mkdir(parents=True)
    (sub / "ana" / "00" / "00-setup-and-probes.ipynb").write_text("{}")
    (sub / "ben" / "02-lora-inside-one-matmul").mkdir(parents=True)  # a right one: not listed
    (sub / "ben" / "lesson-05.ipynb").write_text("{}")
    (sub / "cy" / "homework" / "03-what-low-rank-restricts").mkdir(parents=True)
    (sub / "di" / "stuff").mkdir(parents=True)
    lost = [m.text for m in course.misplaced(sub, lessons)]
    assert lost == [
        "ana/00/ is not a lesson folder, so nothing in it was graded: rename it to ana/00-setup-and-probes, then grade again.",
        "ben/lesson-05.ipynb sits outside any lesson folder, so it was not graded: move it to "
        "ben/05-backward-through-one-projection/05-backward-through-one-projection.ipynb, then grade again.",
        "cy/homework/ is not a lesson folder, so nothing in it was graded: move cy/homework/03-what-low-rank-restricts up "
        "one level, to cy/03-what-low-rank-restricts, then grade again.",
        "di/stuff/ is not a lesson folder, so nothing in it was graded: it names no lesson: put each notebook at "
        "di/<lesson>/<lesson>.ipynb, then grade again."]


def test_an_empty_notebook_or_another_lessons_gets_one_sentence(tmp_path):
    import nbformat

    aid, other = "02-lora-inside-one-matmul", "03-what-low-rank-restricts"
    folder = tmp_path / aid
    folder.mkdir()
    nbformat.write(nbformat.v4.new_notebook(), folder / f"{aid}.ipynb")
    assert "a notebook with no cells in it" in course.check_submission(folder, aid)
    shutil.copyfile(ROOT / "lessons" / other / f"{other}.ipynb", folder / f"{aid}.ipynb")
    assert course.check_submission(folder, aid).startswith(
        f"{aid}.ipynb holds lesson 03's notebook, not lesson 02's (its checks are lesson 03's).")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(nb, folder / f"{aid}.ipynb")
    assert "none of the lesson's answer and check cells" in course.check_submission(folder, aid)
    shutil.copyfile(ROOT / "lessons" / aid / f"{aid}.ipynb", folder / f"{aid}.ipynb")
    assert course.check_submission(folder, aid) is None


def test_with_no_lesson_named_grading_takes_the_lessons_handed_in_and_leaves_the_capstone_alone(tmp_path, monkeypatch):
    """`coursekit grade` with no lesson list grades the lessons someone handed in, not every lesson of the course, and
    fills lesson 19's capstone store only when lesson 19 is among them (it takes minutes the first time)."""
    def no_capstone(progress):
        raise AssertionError("the capstone store was filled though nobody handed in lesson 19")

    monkeypatch.setattr(course, "_fill_capstone_store", no_capstone)
    c = tmp_path / "c"
    for sid, aid in (("ana", "02-lora-inside-one-matmul"), ("ben", "05-backward-through-one-projection")):
        (c / "submitted" / sid / aid).mkdir(parents=True)
        (c / "submitted" / sid / aid / f"{aid}.ipynb").write_text("")  # an empty file: scored 0 without a kernel
    table = course.grade_class(root=ROOT, course_dir=c, release_dir=tmp_path / "release", workers=1, progress=False)
    assert sorted(p.name for p in (tmp_path / "release").iterdir()) == ["02-lora-inside-one-matmul",
                                                                         "05-backward-through-one-projection"]
    assert "ana/02-lora-inside-one-matmul: 02-lora-inside-one-matmul.ipynb is an empty file" in table
    assert "ben/05-backward-through-one-projection:" in table
    assert {r["assignment"] for r in course.read_grades_csv(c / "grades.csv")} == {
        "02-lora-inside-one-matmul", "05-backward-through-one-projection"}


def test_grading_regenerates_a_lesson_without_it_ever_missing_from_the_release_folder(tmp_path):
    """Grading generates each lesson again (its gradebook gets the current cells) into the release folder, which is
    lessons/ by default, while a JupyterLab server, another grading run or a test may be reading it. nbgrader's own
    ``force`` empties the lesson's folder first; coursekit's regenerate replaces each changed file whole, so a reader
    polling the notebook meanwhile always finds it, and always as valid JSON. An unchanged file is not touched, a file
    nbgrader no longer generates is removed, and nbgrader's ignored names (checkpoints) stay."""
    import threading

    aid = "00-setup-and-probes"
    release = tmp_path / "release"
    shutil.copytree(ROOT / "lessons" / aid, release / aid)
    a = course.api(ROOT, tmp_path / "course", release)
    nb = release / aid / f"{aid}.ipynb"
    right = nb.read_bytes()
    inode = nb.stat().st_ino

    assert course.regenerate(a, ROOT, aid) == [], "the release was already what nbgrader generates"
    assert nb.stat().st_ino == inode and nb.read_bytes() == right

    nb.write_bytes(right.replace(b"Setup", b"Set-up", 1))
    assert nb.read_bytes() != right
    (release / aid / "stale.txt").write_text("no longer shipped")
    (release / aid / ".ipynb_checkpoints").mkdir()
    (release / aid / ".ipynb_checkpoints" / f"{aid}-checkpoint.ipynb").write_bytes(right)
    seen: list[str] = []
    stop = threading.Event()

    def read_meanwhile():
        while not stop.is_set():
            try:
                json.loads(nb.read_bytes())
                seen.append("ok")
            except (FileNotFoundError, ValueError) as e:
                seen.append(type(e).__name__)

    reader = threading.Thread(target=read_meanwhile)
    reader.start()
    try:
        changed = course.regenerate(a, ROOT, aid)
    finally:
        stop.set()
        reader.join()
    assert sorted(changed) == [f"{aid}.ipynb", "stale.txt"], changed
    assert nb.read_bytes() == right
    assert not (release / aid / "stale.txt").exists()
    assert (release / aid / ".ipynb_checkpoints" / f"{aid}-checkpoint.ipynb").is_file()
    assert seen and set(seen) == {"ok"}, f"a reader found the notebook missing or half-written: {sorted(set(seen))}"
    assert not [p for p in (release / aid).iterdir() if p.name.startswith(f".{aid}.ipynb.")], "a temporary file stayed"
