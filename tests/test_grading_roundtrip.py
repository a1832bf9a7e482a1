"""The grading round trip through real nbgrader: release, example class, autograde (with hidden
cases), feedback, grades.csv — and a second run that changes nothing and loses nothing.

Each lesson's example class is graded once per session (tests/graded_examples.py: lesson 02's is also read
by the key-leak scan and the browser test) and shared by the tests of its own class (``TestRoundTrip02`` …):
autograding executes every example notebook in a kernel, and one class per lesson lets pytest-xdist spread
the lessons over the workers. The second run grades a copy of that folder again in place: serially, except
lesson 02's, whose second run is the one tests/test_parallel_grading.py reads too (two workers, and three
broken files handed in besides: ``graded_examples.regraded_in_parallel``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coursekit import course
from graded_examples import (BROKEN_FILES, EXACT, EXACT_SCORE, EXAMPLES, HOSTILE, TOLD, WRONG, cell_scores, feedback_text,
                             graded_example_class, limits_for, parallel_run, regradable_copy, regraded_in_parallel,
                             score_table, submission_scores)

ROOT = Path(__file__).resolve().parents[1]
L00 = "00-setup-and-probes"
L02 = "02-lora-inside-one-matmul"
LESSONS = course.lesson_ids(ROOT)
REGRADED_IN_PARALLEL = {L02}  # the second run is graded_examples.regraded_in_parallel's (with broken files added)


def test_every_example_folder_says_what_it_expects():
    folders = sorted(p for p in EXAMPLES.glob("*/*") if p.is_dir())
    assert folders
    readme = (EXAMPLES / "README.md").read_text()
    for f in folders:
        assert f.parent.name in LESSONS, f"{f.relative_to(ROOT)}: no lesson {f.parent.name}"
        assert (f / "expected.json").is_file(), f"{f.relative_to(ROOT)} has no expected.json"
        assert f"ex-{f.name}" in readme, f"autograder/examples/README.md does not list ex-{f.name}"
        spec = json.loads((f / "expected.json").read_text())
        assert isinstance(spec.get("score"), (int, float)), (f"{f.relative_to(ROOT)}/expected.json gives no \"score\" (the "
                                                            "exact autograded score `coursekit grade --examples --check` "
                                                            "compares)")


def test_the_readme_marks_exactly_the_hostile_students_hostile():
    from graded_examples import readme_hostile

    assert HOSTILE == readme_hostile()


def test_the_guides_example_table_is_the_expected_scores():
    """docs/instructors.md's table of the example class is written by `coursekit grade --examples ... --check --readme`,
    which writes only when every student scored as expected: it must be the table of the expected scores."""
    import re

    from coursekit import example_class

    text = (ROOT / "docs" / "instructors.md").read_text()
    block = example_class.current(text)
    m = re.search(r"```text\n(.*?)\n```\n(\d+) submissions of (\d+) lessons?.*?`coursekit grade --examples ([\d ]+) --check`",
                  block, flags=re.S)
    assert m, f"the guide's example-class block is not what the command writes:\n{block}"
    lessons = course._known(ROOT, m.group(4).split())
    rows = example_class.rows(ROOT, lessons)
    assert m.group(1) == course.format_table([course.Row(*r) for r in rows])
    assert (int(m.group(2)), int(m.group(3))) == (len(rows), len(lessons))


def _function_items(aid: str) -> list[str]:
    """The items of ``aid`` whose answer is a function the student writes: the solution's answer cell defines
    (``def``) the name its test cell hands to ``grade``. Lesson cells after it may call that function."""
    import re

    nb = json.loads((ROOT / "solutions" / aid / f"{aid}.ipynb").read_text())
    by_id = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): "".join(c["source"]) for c in nb["cells"]}
    out = []
    for gid, src in by_id.items():
        if gid and gid.endswith("_test"):
            handed = re.search(r"grade\(\s*[\"'][^\"']+[\"']\s*,\s*([A-Za-z_]\w*)", src)
            answer = by_id.get(gid.replace("_test", "_answer"), "")
            if handed and re.search(rf"^def {handed.group(1)}\(", answer, re.M):
                out.append(gid.removesuffix("_test"))
    return out


@pytest.mark.parametrize("aid", LESSONS)
def test_every_function_item_has_an_ordinary_example_student_who_gets_it_wrong(aid):
    """The round trip runs every lesson with a typical wrong answer in each function the student writes (no cell
    may then end in a traceback: ``test_a_wrong_answer_never_turns_a_lesson_cell_into_a_traceback``), so every
    function item needs an example student, not a hostile one, who loses it."""
    ordinary = {(a, s) for a, s, *_ in WRONG} - HOSTILE
    covered = {cell.removesuffix("_test") for a, s, cell, _ in WRONG if a == aid and (a, s) in ordinary}
    items = _function_items(aid)
    assert items, f"{aid}: no function item found; does a test cell call grade(...) differently?"
    missing = [i for i in items if i not in covered]
    assert not missing, (f"{aid}: no ordinary example student gets {missing} wrong; add one under "
                         f"autograder/examples/{aid}/ (see its README)")


class _RoundTrip:
    """The round trip of one lesson (``AID``); subclasses below, one per lesson."""

    AID = ""

    @pytest.fixture(scope="class")
    def graded(self, tmp_path_factory):
        # Released into the temporary course too: tests never rewrite the repository's lessons/.
        work = graded_example_class(tmp_path_factory, self.AID)
        return work, score_table(work)

    def test_blank_scores_zero_on_every_test_cell(self, graded):
        work, _ = graded
        cells = cell_scores(work, self.AID, "ex-blank")
        assert cells, "no autograded cells recorded"
        assert all(score == 0 for score, _ in cells.values()), {k: v for k, v in cells.items() if v[0]}

    def test_perfect_scores_every_autograded_point(self, graded):
        work, _ = graded
        cells = cell_scores(work, self.AID, "ex-perfect")
        lost = {k: v for k, v in cells.items() if v[0] != v[1]}
        assert not lost, f"the solution loses points in the autograde run (hidden cases included): {lost}"
        code, max_code, _ = submission_scores(work, self.AID, "ex-perfect")
        assert code == max_code > 0

    def test_a_wrong_answer_never_turns_a_lesson_cell_into_a_traceback(self, graded):
        """Every example student who is not hostile ran the whole lesson with a typical wrong answer in the cells it
        replaces (the autograde run executes every cell). No cell but the student's own answer cells may end in an
        error: a self-check cell says what is wrong in a sentence (coursekit.selfcheck) or leaves it to the graded
        check, which explains the mistake."""
        work, _ = graded
        problems = []
        students = ["ex-perfect"] + sorted({w[1] for w in WRONG if w[0] == self.AID} - {s for a, s in HOSTILE if a == self.AID})
        for sid in students:
            nb = json.loads((work / "autograded" / sid / self.AID / f"{self.AID}.ipynb").read_text())
            for i, cell in enumerate(nb["cells"]):
                if cell["cell_type"] != "code" or cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
                    continue
                for out in cell.get("outputs", []):
                    if out.get("output_type") == "error":
                        problems.append(f"{sid}, cell {i}: {out.get('ename')}: {str(out.get('evalue'))[:200]}")
        assert not problems, "\n".join(problems)

    def test_each_example_student_makes_the_named_mistakes_it_declares(self, graded):
        """What the class report counts: the named mistakes the grading process stored for each item (the check
        cell's outcome in the autograded notebook) are exactly those the student's expected.json declares under
        ``"mistakes"``, on every item, and a student who declares none on an item it loses fails it another way.
        Every example student who is not hostile declares them (a hostile one may)."""
        from coursekit import report

        work, _ = graded
        problems = []
        for exp in sorted((EXAMPLES / self.AID).glob("*/expected.json")) if (EXAMPLES / self.AID).is_dir() else []:
            spec, sid = json.loads(exp.read_text()), f"ex-{exp.parent.name}"
            if "mistakes" not in spec:
                if (self.AID, sid) not in HOSTILE:
                    problems.append(f"{sid}: expected.json declares no \"mistakes\" (use {{}} for none)")
                continue
            outcomes = report.outcomes(work / "autograded" / sid / self.AID / f"{self.AID}.ipynb")
            for item, rec in outcomes.items():
                declared = spec["mistakes"].get(item, [])
                if list(rec.get("mistakes", [])) != declared:
                    problems.append(f"{sid} {item}: stored {rec.get('mistakes')} ({rec.get('status')}), declared {declared}")
            problems += [f"{sid}: declares mistakes on {item}, which has no outcome" for item in spec["mistakes"]
                         if item not in outcomes]
        for sid in ("ex-perfect", "ex-blank"):  # the implicit students: right everywhere, or blank everywhere
            outcomes = report.outcomes(work / "autograded" / sid / self.AID / f"{self.AID}.ipynb")
            problems += [f"{sid} {item}: stored {rec['mistakes']}" for item, rec in outcomes.items() if rec.get("mistakes")]
        assert not problems, "\n".join(problems)

    def test_table_and_grades_csv(self, graded):
        work, table = graded
        rows = course.read_grades_csv(work / "grades.csv")
        students = {(r["assignment"], r["student_id"]) for r in rows}
        for sid in ["ex-blank", "ex-perfect"] + [w[1] for w in WRONG if w[0] == self.AID]:
            assert (self.AID, sid) in students
            assert sid in table
        assert "Not graded" not in table
        # beside grades.csv: graded, or 0 for a reason (said), never a bare 0 that could mean "not handed in"
        import csv

        with open(work / "submissions.csv", newline="") as f:
            status = {(r["lesson"], r["student"]): r for r in csv.DictReader(f)}
        assert {k for k in status if k[0] == self.AID} == {k for k in students if k[0] == self.AID}
        assert status[(self.AID, "ex-perfect")]["status"] == "graded"
        for key, row in status.items():
            assert row["status"] in ("graded", "zero") and (row["status"] == "graded" or row["reason"]), row
            if row["status"] == "zero":
                assert key[1] in table and "Graded 0, with a feedback file saying why" in table


def _typical_mistakes_score_in_between_and_say_why(self, graded, sid, cell, text):
    work, _ = graded
    code, max_code, _ = submission_scores(work, self.AID, sid)
    if (self.AID, sid) in EXACT_SCORE:
        assert code == pytest.approx(EXACT_SCORE[(self.AID, sid)], abs=1e-6), f"{sid}: scored {code}"
    else:
        assert 0 < code < max_code
    score, max_score = cell_scores(work, self.AID, sid)[cell]
    assert score < max_score, f"{sid}: {cell} should lose points"
    fb = feedback_text(work, self.AID, sid)
    assert text in fb, f"{sid}: feedback lacks {text!r}"
    if (self.AID, sid) not in HOSTILE:  # a hostile notebook may stop every check before any hidden case runs
        assert "hidden case" in fb, "the autograde run adds hidden cases"


def _wrong_warm_ups_are_explained_and_cost_nothing(self, graded, sid, cell, text):
    """A warm-up is formative: its test cell is worth 0 points, and a wrong answer's feedback still explains it."""
    work, _ = graded
    assert cell_scores(work, self.AID, sid)[cell] == (0.0, 0.0), f"{sid}: {cell} should be worth 0 points"
    fb = feedback_text(work, self.AID, sid)
    assert text in fb, f"{sid}: feedback lacks {text!r}"


def _hostile_submissions_get_their_exact_score_and_say_what_happened(self, graded, sid, score, texts):
    """Every example student (expected.json's "score"; hostile and broken submissions among them): exactly that code
    score, a feedback file with the given plain-words texts ("feedback"), and, for one that could not be graded at
    all, a line in the table. `coursekit grade --examples --check` compares the same numbers."""
    work, table = graded
    code, _, _ = submission_scores(work, self.AID, sid)
    assert code == pytest.approx(score, abs=1e-6), f"{sid}: scored {code}, expected {score}"
    fb = feedback_text(work, self.AID, sid)
    for text in texts:
        assert text in fb, f"{sid}: feedback lacks {text!r}"
    if score == 0:
        assert f"{sid}/{self.AID}:" in table, "the score table names a submission that could not be graded"


def _regrading_gives_the_same_grades_and_loses_nothing(self, graded, tmp_path, tmp_path_factory):
    """The class's course folder graded again, in place (a copy: the first run's folder is shared, read-only). For a
    lesson of :data:`REGRADED_IN_PARALLEL`, the copy is graded with two workers and has lesson 00's broken files
    handed in besides: the students of the first run keep their grades, and the broken ones are added. For the other
    lessons the hostile and broken submissions are graded again (and the blank and perfect ones in lesson 00's run, whose
    hostile submissions are broken files that never execute: every other lesson's second run executes hostile
    notebooks), and the students who did not hand in again keep the grades the gradebook holds."""
    shared, table = graded
    before = course.read_grades_csv(shared / "grades.csv")
    if self.AID in REGRADED_IN_PARALLEL:
        work = regraded_in_parallel(tmp_path_factory, self.AID)
        run = parallel_run(work)
        again, after = run["table"], course.read_grades_csv(work / "grades.csv")
        assert run["csv"] == (work / "grades.csv").read_text(), "the shared re-graded folder was written to"
        added = {r["student_id"] for r in after} - {r["student_id"] for r in before}
        assert added == set(BROKEN_FILES), f"the re-run added or lost students: {sorted(added)}"
        after = [r for r in after if r["student_id"] not in added]
    else:
        # The hostile and broken submissions are handed in again; the ordinary mistakes are not (each would only
        # execute the lesson again), nor, but in lesson 00, the blank and perfect ones (a notebook that executes the
        # lesson again is graded again in every other lesson's second run: its hostile ones): the grades of those who
        # did not hand in again must stay as they were.
        work = regradable_copy(shared, tmp_path / "course")
        again_in = ({"ex-blank", "ex-perfect"} if self.AID == L00 else set()) | {sid for aid, sid in HOSTILE if aid == self.AID}
        for folder in (work / "submitted").iterdir():
            if folder.name not in again_in:
                shutil.rmtree(folder)
        with limits_for(self.AID):
            again = course.grade_class(lessons=[self.AID], root=ROOT, course_dir=work, release_dir=work / "release",
                                       workers=1, progress=False)
        after = course.read_grades_csv(work / "grades.csv")
    key = lambda r: (r["assignment"], r["student_id"])  # noqa: E731
    assert sorted(before, key=key) == sorted(after, key=key), "a re-run changed or lost grades"
    # Every line about the lesson (scores, and why a submission scored 0), except the broken files' the parallel
    # re-run added; split into words, as a new student's id may widen the table's columns.
    added = set(BROKEN_FILES) if self.AID in REGRADED_IN_PARALLEL else set()
    about_added = lambda words: words[0].split("/")[0] in added or (len(words) > 1 and words[1] in added)  # noqa: E731
    lines = lambda t, course_dir: [l.split() for l in t.replace(str(course_dir), "<course>").splitlines()  # noqa: E731
                                   if self.AID in l and not about_added(l.split())]
    assert lines(again, work) == lines(table, shared)
    for (aid, sid), score in EXACT_SCORE.items():  # the hostile examples too, on the second run
        if aid == self.AID:
            assert submission_scores(work, aid, sid)[0] == pytest.approx(score, abs=1e-6), \
                f"{sid}: second run scored differently"


def _no_numeric_key_is_printed_above_its_question(self, graded, item, value):
    """What the cells above a numeric item's question print (the perfect student's notebook as graded, run top to
    bottom) does not show the item's key: tests/test_item_lengths.py checks the lesson's text, this its outputs."""
    import nbformat
    from test_item_lengths import printed_keys

    work, _ = graded
    nb = nbformat.read(work / "autograded" / "ex-perfect" / self.AID / f"{self.AID}.ipynb", as_version=4)
    shown = printed_keys(nb, item, value)
    assert not shown, f"{self.AID[:2]}.{item}: its key {value:.6g} is printed above its question: {shown}"


def _printed_key_cases():
    from test_item_lengths import _numeric_keys, distinctive

    return [(lid, item, value) for lid, item, value in _numeric_keys() if distinctive(value)]


_PRINTED_KEYS = _printed_key_cases()


for _aid in LESSONS:
    _ns = {"AID": _aid}
    _rows = [(sid, cell, text) for aid, sid, cell, text in WRONG if aid == _aid]
    if _rows:
        def _test(self, graded, sid, cell, text):  # a fresh function per class: marks attach to the function
            _typical_mistakes_score_in_between_and_say_why(self, graded, sid, cell, text)

        _ns["test_typical_mistakes_score_in_between_and_say_why"] = pytest.mark.parametrize(
            "sid,cell,text", _rows, ids=[f"{sid}-{cell}" for sid, cell, _ in _rows])(_test)
    _told = [(sid, cell, text) for aid, sid, cell, text in TOLD if aid == _aid]
    if _told:
        def _test_told(self, graded, sid, cell, text):
            _wrong_warm_ups_are_explained_and_cost_nothing(self, graded, sid, cell, text)

        _ns["test_wrong_warm_ups_are_explained_and_cost_nothing"] = pytest.mark.parametrize(
            "sid,cell,text", _told, ids=[f"{sid}-{cell}" for sid, cell, _ in _told])(_test_told)
    _exact = [(sid, score, texts) for aid, sid, score, texts in EXACT if aid == _aid]
    if _exact:
        def _test_exact(self, graded, sid, score, texts):
            _hostile_submissions_get_their_exact_score_and_say_what_happened(self, graded, sid, score, texts)

        _ns["test_hostile_submissions_get_their_exact_score_and_say_what_happened"] = pytest.mark.parametrize(
            "sid,score,texts", _exact, ids=[sid for sid, _, _ in _exact])(_test_exact)
    if _aid == L02 or any(a == _aid for a, _ in HOSTILE):  # re-graded: the gradebook keeps every record, hostile
        # examples score the same twice
        def _test_regrade(self, graded, tmp_path, tmp_path_factory):
            _regrading_gives_the_same_grades_and_loses_nothing(self, graded, tmp_path, tmp_path_factory)

        _ns["test_regrading_gives_the_same_grades_and_loses_nothing"] = _test_regrade
    _printed = [(item, value) for lid, item, value in _PRINTED_KEYS if lid == _aid]
    if _printed:
        def _test_printed(self, graded, item, value):
            _no_numeric_key_is_printed_above_its_question(self, graded, item, value)

        _ns["test_no_numeric_key_is_printed_above_its_question"] = pytest.mark.parametrize(
            "item,value", _printed, ids=[item for item, _ in _printed])(_test_printed)
    _name = f"TestRoundTrip{_aid[:2]}"
    globals()[_name] = type(_name, (_RoundTrip,), _ns)


def _test_the_escape_left_no_trace(self, graded):
    """ex-escapes-the-sandbox (lesson 02) tried a .pth file in site-packages, a detached child that edits grades.csv
    5 s later, a 1 GiB file and killing its parent: none of it is left, and the run finished for everyone."""
    import site
    import time

    work, _ = graded
    # The child was started while that notebook ran, before the class's grading ended: wait until well past
    # the 5 s it sleeps (no wait at all when the class was graded long enough ago).
    ran = (work / ".graded").stat().st_mtime  # written once the whole class was graded: after that notebook ran
    time.sleep(max(0.0, ran + 15 - time.time()))
    assert not [d for d in site.getsitepackages() if (Path(d) / "zz-coursekit-evil.pth").exists()]
    assert not Path("/tmp/coursekit-evil-child-ran").exists()
    assert "99" not in (work / "grades.csv").read_text()
    assert not list(work.rglob("huge.bin"))
    assert submission_scores(work, L02, "ex-escapes-the-sandbox")[0] == submission_scores(work, L02, "ex-perfect")[0]


globals()["TestRoundTrip02"].test_the_escape_left_no_trace = _test_the_escape_left_no_trace


def _test_the_graded_notebooks_read_the_held_out_comparison(self, graded):
    """Lesson 15's held-out-loss comparison (about a minute of CPU) is computed once by the grader before grading
    (course._fill_quantloss_store) and read back by every graded notebook, not computed once per student."""
    work, _ = graded
    aid = self.AID
    read = 0
    for nb_path in (work / "autograded").glob(f"*/{aid}/{aid}.ipynb"):
        cells = [c for c in json.loads(nb_path.read_text())["cells"]
                 if c["cell_type"] == "code" and "stored_comparison(" in "".join(c["source"])]
        text = "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))
        if "weights in 30 blocks" in text:  # the cell ran (a student who broke an earlier cell may stop before it)
            assert "read back from disk now" in text, f"{nb_path.parent.parent.name} computed the comparison itself"
            read += 1
    assert read >= 1


globals()["TestRoundTrip15"].test_the_graded_notebooks_read_the_held_out_comparison = \
    _test_the_graded_notebooks_read_the_held_out_comparison
