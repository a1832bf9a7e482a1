"""coursekit.submissions: what a submission folder may hold, what is set aside, what is refused, what is misplaced,
and what nbgrader's release_feedback needs beside every feedback page (no grading here: folders only)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest

from coursekit import course, submissions

ROOT = Path(__file__).resolve().parents[1]
AID = "02-lora-inside-one-matmul"
BLANK = (ROOT / "lessons" / AID / f"{AID}.ipynb").read_bytes()


def _folder(tmp_path: Path, *extra: str) -> Path:
    d = tmp_path / "ana" / AID
    d.mkdir(parents=True)
    (d / f"{AID}.ipynb").write_bytes(BLANK)
    for rel in extra:
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text("x")
    return d


def test_nbgraders_own_files_are_neither_refused_nor_set_aside(tmp_path):
    d = _folder(tmp_path, "timestamp.txt", "submission_secret.txt")
    (d / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
    assert submissions.check(d, AID, ROOT / "lessons") is None
    assert submissions.ignored(d, AID, ROOT / "lessons") == []


def test_other_files_are_set_aside_not_refused(tmp_path):
    d = _folder(tmp_path, "notes.txt", ".ipynb_checkpoints/x-checkpoint.ipynb", "__MACOSX/._x", "data/a.csv",
                "other.ipynb")
    assert submissions.check(d, AID, ROOT / "lessons") is None
    assert submissions.ignored(d, AID, ROOT / "lessons") == [".ipynb_checkpoints/", "__MACOSX/", "data/", "notes.txt",
                                                             "other.ipynb"]


def test_a_file_the_release_ships_is_the_lessons(tmp_path):
    release = tmp_path / "release"
    (release / AID / "data").mkdir(parents=True)
    (release / AID / f"{AID}.ipynb").write_bytes(BLANK)
    (release / AID / "data" / "table.csv").write_text("1,2")
    d = _folder(tmp_path, "data/table.csv", "data/mine.csv")
    assert submissions.lesson_files(release, AID) == {f"{AID}.ipynb", "data/table.csv"}
    assert submissions.ignored(d, AID, release) == ["data/mine.csv"]


@pytest.mark.parametrize("make,why", [
    (lambda d: (d / "k.json").symlink_to("/etc/passwd"), "symbolic link (k.json)"),
    (lambda d: os.link(d / f"{AID}.ipynb", d / "copy.ipynb"), "hard link"),
    (lambda d: os.mkfifo(d / "fifo"), "not a regular file"),
    (lambda d: (d / "big.bin").write_bytes(b"0" * (submissions.MAX_FILE_BYTES + 1)), "more than the 32 MB"),
    (lambda d: [(d / f"f{i}.bin").write_bytes(b"0" * (30 << 20)) for i in range(3)], "more than 64 MB together"),
    (lambda d: [(d / f"f{i}.txt").write_text("") for i in range(submissions.MAX_ENTRIES + 1)], "more than 256 files"),
])
def test_what_cannot_be_read_as_data_is_refused(tmp_path, make, why):
    d = _folder(tmp_path)
    make(d)
    got = submissions.check(d, AID, ROOT / "lessons")
    assert got is not None and why in got, got


def test_a_folder_doubled_by_unzipping_is_named_and_listed_with_its_move(tmp_path):
    sub = tmp_path / "submitted"
    inner = sub / "ana" / AID / AID
    inner.mkdir(parents=True)
    (inner / f"{AID}.ipynb").write_bytes(BLANK)
    why = submissions.check(sub / "ana" / AID, AID)
    assert why.startswith(f"your notebook is one folder too deep ({AID}/{AID}.ipynb"), why
    (m,) = submissions.misplaced(sub, course.lesson_ids(ROOT))
    assert (m.student, m.lesson, m.where) == ("ana", AID, f"ana/{AID}/{AID}/")
    assert m.text == (f"ana/{AID}/{AID}/ is a lesson folder inside the lesson's folder, so it was not graded: move what "
                      f"ana/{AID}/{AID}/ holds up one level, into ana/{AID}/, then grade again.")


def test_every_feedback_folder_becomes_releasable(tmp_path):
    sub = _folder(tmp_path, "timestamp.txt")
    (sub / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
    (sub / "submission_secret.txt").write_text("abc")
    fb = tmp_path / "feedback"
    submissions.releasable(fb, sub)
    assert (fb / "timestamp.txt").read_text() == "2026-12-01 10:00:00.000000 UTC"
    assert (fb / "submission_secret.txt").read_text() == "abc"
    handed_by_hand = tmp_path / "fb2"
    submissions.releasable(handed_by_hand, tmp_path / "nowhere")  # no exchange: a time and a fresh secret
    assert (handed_by_hand / "timestamp.txt").read_text().endswith("UTC")
    assert len((handed_by_hand / "submission_secret.txt").read_text()) == 128
    linked = _folder(tmp_path / "other")
    (linked / "submission_secret.txt").symlink_to(sub / "submission_secret.txt")  # a link is read as nothing
    submissions.releasable(tmp_path / "fb3", linked)
    assert (tmp_path / "fb3" / "submission_secret.txt").read_text() != "abc"


def test_a_timestamp_nbgrader_cannot_read_is_a_sentence_not_a_crash(tmp_path):
    """nbgrader stops with an AttributeError on a timestamp.txt it cannot parse (CourseDirectory.fail does not
    exist): the grader refuses the folder with a sentence, and reads no time from it anywhere."""
    for bad in ("garbage", "99999999999999999999999"):
        d = _folder(tmp_path / bad)
        (d / "timestamp.txt").write_text(bad)
        why = submissions.check(d, AID, ROOT / "lessons")
        assert why and why.startswith("its timestamp.txt (nbgrader's record of when it was handed in) is not a time"), why
        assert course._timestamp(d) is None
    d = _folder(tmp_path / "empty", "timestamp.txt")
    (d / "timestamp.txt").write_text("")  # nbgrader reads an empty one as no time at all
    assert submissions.check(d, AID, ROOT / "lessons") is None


def test_the_autograded_copy_keeps_the_lessons_files_and_nbgraders_only(tmp_path):
    """nbgrader copies every file of the submission into the autograded copy, and its feedback step copies them on
    into feedback/, whose .html files release_feedback hands out: the set-aside files are removed from the copy, and
    nbgrader's timestamp and secret are put in it, so that feedback generated from it later can be released."""
    from traitlets.config import Config

    sub = _folder(tmp_path / "submitted", "leak.html", "notes/a.txt", "submission_secret.txt")
    (sub / "submission_secret.txt").write_text("abc")
    dest = tmp_path / "autograded" / "ana" / AID
    shutil.copytree(sub, dest)  # what nbgrader's init_assignment did
    cfg = Config()
    cfg.CourseDirectory.root = str(tmp_path)
    pp = submissions.TidyAutograded(config=cfg, release_directory=str(ROOT / "lessons"))
    nb = nbformat.reads(BLANK.decode(), as_version=4)
    pp.preprocess(nb, {"metadata": {"path": str(sub)}, "nbgrader": {"assignment": AID, "student": "ana"}})
    assert sorted(p.name for p in dest.iterdir()) == [f"{AID}.ipynb", "submission_secret.txt", "timestamp.txt"]
    assert (dest / "submission_secret.txt").read_text() == "abc"
    assert sorted(p.name for p in sub.iterdir()) == sorted([f"{AID}.ipynb", "leak.html", "notes",
                                                            "submission_secret.txt"])  # the submission is untouched


def test_the_set_aside_note_renders_file_names_as_text(tmp_path):
    """A file name is the student's: in the note the formgrader renders it must stay text (no HTML, no link)."""
    d = _folder(tmp_path, "<img src=x onerror=alert(1)>.txt", "[a](javascript:alert(1)).txt")
    nb = nbformat.reads(BLANK.decode(), as_version=4)
    pp = submissions.TidyAutograded(release_directory=str(ROOT / "lessons"))
    nb, _ = pp.preprocess(nb, {"metadata": {"path": str(d)}, "nbgrader": {"assignment": AID}})
    note = nb.cells[0]
    assert note.id == submissions.NOTE_CELL_ID and note.cell_type == "markdown"
    from nbconvert.filters import markdown2html

    page = markdown2html(note.source)
    assert "<img" not in page and "href" not in page, page
    assert "&lt;img src=x onerror=alert\\(1\\)&gt;" not in page  # rendered, the backslashes are gone
    assert "alert(1)" in page.replace("\\", "")
    nb, _ = pp.preprocess(nb, {"metadata": {"path": str(d)}, "nbgrader": {"assignment": AID}})
    assert sum(c.get("id") == submissions.NOTE_CELL_ID for c in nb.cells) == 1  # a re-run replaces it


# --------------------------------------------------------------------------- student names are data

@pytest.mark.parametrize("name,why", [
    ("*", "pattern"), ("[a]lice", "pattern"), ("al?ce", "pattern"), ("a\\b", "pattern"),
    ("bob\n", "control"), ("eve\u202egnp.exe", "control"), ("tab\there", "control"), (" ana", "space"), ("", "empty"),
    (".ipynb_checkpoints", "starts with"), ("-rf", "starts with"), ("e\u0301", "NFC"), ("a\xa0b", "invisible"),
    ("\u2800", "invisible"), ("\u3164", "invisible"), ("___", "no letter"),
])
def test_a_name_nbgrader_would_read_as_a_pattern_or_a_table_would_misshow_is_refused(name, why):
    problem = submissions.name_problem(name)
    assert problem is not None and why in problem, (name, problem)
    assert submissions.name_problem(submissions.safe_name(name)) is None
    assert "\n" not in submissions.shown_name(name) and "\u202e" not in submissions.shown_name(name)


@pytest.mark.parametrize("name", ["ana", "Ana-María O'Neil", "=1+2", "@SUM(A1)", "student_01", "李雷"])
def test_an_ordinary_or_formula_like_name_is_a_student(name):
    assert submissions.name_problem(name) is None


def test_the_plain_nbgrader_route_refuses_a_pattern_for_a_student(tmp_path):
    d = _folder(tmp_path)
    pp = submissions.RefuseUnsafe()
    with pytest.raises(submissions.SubmissionRefused, match="pattern"):
        pp.preprocess(nbformat.reads(BLANK.decode(), as_version=4), {"metadata": {"path": str(d)},
                                                                       "nbgrader": {"student": "*"}})
    pp.preprocess(nbformat.reads(BLANK.decode(), as_version=4), {"metadata": {"path": str(d)},
                                                               "nbgrader": {"student": "ana"}})


def test_names_are_data_whole_class(tmp_path):
    """A class with folders named like patterns, with a line break and like a spreadsheet formula: only the plain
    names are graded (each once), the others are listed with the rename to make, and no CSV cell starts like a
    formula. (Empty notebooks: each scores 0 without a kernel.)"""
    c = tmp_path / "c"
    names = ["alice", "*", "[a]lice", "bob\nsmith", "=1+2"]
    for sid in names:
        (c / "submitted" / sid / AID).mkdir(parents=True)
        (c / "submitted" / sid / AID / f"{AID}.ipynb").write_text("")
    table = course.grade_class(lessons=[AID], root=ROOT, course_dir=c, release_dir=tmp_path / "release", workers=1,
                               progress=False)
    graded = {r["student_id"] for r in course.read_grades_csv(c / "grades.csv")}
    assert graded == {"alice", "'" + names[-1]}, graded  # the formula-like id, as text
    assert table.count(f"alice/{AID}:") == 1
    for shown in ("'*'", "'[a]lice'", "'bob\\\\nsmith'"):
        assert f"rename the folder {shown}" in table.replace("Rename", "rename"), table
    rows = course.read_grades_csv(c / "submissions.csv")
    refused = {r["student"] for r in rows if r["status"] == "misplaced"}
    assert refused == {"*", "[a]lice", "bob\\nsmith"}, rows
    for path in (c / "grades.csv", c / "submissions.csv"):
        for line in path.read_text().splitlines()[1:]:
            for cell in line.split(","):
                assert not cell.startswith(("=", "+", "@")), (path.name, line)


def test_a_notebook_of_far_more_cells_than_the_lessons_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    """200,000 empty cells: refused by a count in the bytes (nbformat never reads it), on coursekit grade's route and
    on nbgrader's own (RefuseUnsafe); a notebook with a few added cells is graded."""
    import json

    d = _folder(tmp_path)
    nb = json.loads(BLANK)
    release = len(nb["cells"])
    ok = dict(nb, cells=nb["cells"] + [{"cell_type": "code", "metadata": {}, "source": "", "outputs": [],
                                        "execution_count": None, "id": f"x{i}"} for i in range(20)])
    (d / f"{AID}.ipynb").write_text(json.dumps(ok))
    assert submissions.check(d, AID, ROOT / "lessons") is None
    cell = '{"cell_type": "markdown", "metadata": {}, "source": ""}'
    (d / f"{AID}.ipynb").write_text(json.dumps(nb)[:-1].rsplit('"cells": [', 1)[0]
                                    + '"cells": [' + ", ".join([cell] * 200_000) + "]}")

    def never(*a, **k):
        raise AssertionError("nbformat read a notebook the count refuses")

    monkeypatch.setattr(nbformat, "reads", never)
    why = submissions.check(d, AID, ROOT / "lessons")
    assert why is not None and f"the lesson's has {release}" in why, why
    escaped = '{"cell\\u005ftype": "raw", "metadata": {}, "source": ""}'  # the same key, spelled with an escape
    (d / f"{AID}.ipynb").write_text('{"cells": [' + ", ".join([escaped] * 50_000) + '], "metadata": {}, "nbformat": 4, '
                                    '"nbformat_minor": 5}')
    why = submissions.check(d, AID, ROOT / "lessons")
    assert why is not None and "more than" in why, why
    monkeypatch.undo()
    big = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("") for _ in range(5000)])
    with pytest.raises(submissions.SubmissionRefused, match="more than"):
        submissions.RefuseUnsafe(release_directory=str(ROOT / "lessons")).preprocess(
            big, {"metadata": {"path": str(d.parent / "nowhere")}, "nbgrader": {"student": "ana", "assignment": AID}})


def test_collect_keeps_no_timestamp_that_is_not_a_small_regular_file(tmp_path):
    """nbgrader reads timestamp.txt whole, following a link (collect --update, the formgrader's autograde): the course's
    collect keeps it only as a small regular file, so one linked to /dev/zero never reaches submitted/."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    from coursekit.exchange import LinkSafeCollect

    for kind in ("link", "regular", "huge"):
        src = tmp_path / kind / "src"
        src.mkdir(parents=True)
        (src / f"{AID}.ipynb").write_bytes(BLANK)
        if kind == "link":
            os.symlink("/dev/zero", src / "timestamp.txt")
        else:
            (src / "timestamp.txt").write_text("2026-12-05 10:00:00.000000 UTC" + (" " * 10_000 if kind == "huge" else ""))
        collect = LinkSafeCollect(coursedir=CourseDirectory(), authenticator=Authenticator())
        collect.do_copy(str(src), str(tmp_path / kind / "dest"))
        stamp = tmp_path / kind / "dest" / "timestamp.txt"
        assert stamp.is_file() == (kind == "regular") and not stamp.is_symlink(), kind
        assert (tmp_path / kind / "dest" / f"{AID}.ipynb").is_file()


def test_collect_copies_no_link_and_names_each_one_it_left_out(tmp_path):
    """nbgrader's own autograde (the formgrader's button) copies a submission's files following links before any
    check runs: the course's collect leaves every link out (a file's, a folder's, the notebook's own) and names them,
    and the folder is then refused with those names. A student's own file of the marker's name does not survive."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    from coursekit.exchange import LinkSafeCollect
    from coursekit.submissions import LINKS_NOT_COLLECTED, refusal

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    os.symlink("/etc/passwd", src / f"{AID}.ipynb")
    os.symlink("/etc", src / "sub" / "etc")
    (src / "notes.txt").write_text("mine")
    (src / LINKS_NOT_COLLECTED).write_text("forged\n")
    collect = LinkSafeCollect(coursedir=CourseDirectory(), authenticator=Authenticator())
    collect.do_copy(str(src), str(tmp_path / "dest"))
    dest = tmp_path / "dest"
    assert not [p for p in dest.rglob("*") if p.is_symlink()]
    assert (dest / LINKS_NOT_COLLECTED).read_text() == f"{AID}.ipynb\nsub/etc\n"
    assert (dest / "notes.txt").read_text() == "mine"
    why = refusal(dest)
    assert why.startswith(f"it held a symbolic link or another entry that is not a file ({AID}.ipynb, sub/etc), which"), why
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / f"{AID}.ipynb").write_bytes(BLANK)
    (clean / LINKS_NOT_COLLECTED).write_text("forged\n")
    LinkSafeCollect(coursedir=CourseDirectory(), authenticator=Authenticator()).do_copy(str(clean), str(tmp_path / "d2"))
    assert not (tmp_path / "d2" / LINKS_NOT_COLLECTED).exists() and refusal(tmp_path / "d2") is None


def test_collect_never_follows_a_file_swapped_for_a_link_after_it_was_listed(tmp_path, monkeypatch):
    """A student can swap a listed file for a link before the copy opens it (a race nbgrader's copytree loses): the
    course's collect opens every file without following a link, so the swap is left out and named, and the target's
    contents never reach submitted/."""
    import stat as stat_mod

    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    from coursekit import exchange
    from coursekit.submissions import LINKS_NOT_COLLECTED

    secret = tmp_path / "secret.txt"
    secret.write_text("the grader's own")
    src = tmp_path / "src"
    src.mkdir()
    (src / f"{AID}.ipynb").write_bytes(BLANK)
    (src / "notes.txt").write_text("mine")
    real_stat = os.stat

    def stat_then_swap(path, *args, **kwargs):  # the student's swap lands right after the collect looked
        st = real_stat(path, *args, **kwargs)
        if path == "notes.txt" and stat_mod.S_ISREG(st.st_mode):
            os.replace(src / "notes.txt", tmp_path / "old-notes.txt")
            os.symlink(secret, src / "notes.txt")
        return st

    monkeypatch.setattr(exchange.os, "stat", stat_then_swap)
    LinkSafeCollect = exchange.LinkSafeCollect
    LinkSafeCollect(coursedir=CourseDirectory(), authenticator=Authenticator()).do_copy(str(src), str(tmp_path / "dest"))
    monkeypatch.undo()
    dest = tmp_path / "dest"
    assert not (dest / "notes.txt").exists() and (dest / LINKS_NOT_COLLECTED).read_text() == "notes.txt\n"
    assert not any("the grader's own" in p.read_text(errors="replace") for p in dest.rglob("*") if p.is_file())


def test_collect_skips_what_it_cannot_copy_and_goes_on(tmp_path):
    """A pipe made a copy of nbgrader's raise after the links were copied as links, and stopped the collect for every
    student after: the course's collect leaves the pipe out like a link, builds the copy beside its destination and
    renames it into place only when complete; a folder it refuses leaves nothing behind."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    from coursekit.exchange import LinkSafeCollect
    from coursekit.submissions import LINKS_NOT_COLLECTED, refusal

    src = tmp_path / "src"
    src.mkdir()
    (src / f"{AID}.ipynb").write_bytes(BLANK)
    os.mkfifo(src / "pipe")
    os.symlink("/etc/shadow", src / "notes.txt")
    collect = LinkSafeCollect(coursedir=CourseDirectory(), authenticator=Authenticator())
    collect.do_copy(str(src), str(tmp_path / "submitted" / "ana" / AID))
    dest = tmp_path / "submitted" / "ana" / AID
    assert (dest / LINKS_NOT_COLLECTED).read_text() == "notes.txt\npipe\n"
    assert sorted(p.name for p in dest.iterdir()) == sorted([f"{AID}.ipynb", LINKS_NOT_COLLECTED])
    assert "it held" in refusal(dest)
    os.symlink(src, tmp_path / "link-to-src")  # a submission folder that is itself a link: not collected, no trace
    collect.do_copy(str(tmp_path / "link-to-src"), str(tmp_path / "submitted" / "ben" / AID))
    assert not (tmp_path / "submitted" / "ben" / AID).exists()
    assert [p.name for p in (tmp_path / "submitted" / "ben").iterdir()] == []


def test_collect_is_bounded_by_what_a_student_can_build(tmp_path, monkeypatch):
    """A folder swapped for a pipe after it was listed is not opened to wait on (the collect hung there), a deep tree
    is cut at MAX_DEPTH (a thousand levels made a recursive walk raise and stop the collect), a file that is not
    the student's (a hard link to another user's file, where the kernel allows one) is left out, and a link whose
    name holds a line break is listed on one line."""
    import stat as stat_mod

    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    from coursekit import exchange
    from coursekit.submissions import LINKS_NOT_COLLECTED

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / f"{AID}.ipynb").write_bytes(BLANK)
    fd = os.open(src, os.O_RDONLY)
    for _ in range(100):  # a tree deeper than MAX_DEPTH (a thousand levels broke a recursive walk)
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    (src / "not-mine.txt").write_text("someone else's")
    os.chown(src / "not-mine.txt", 54321, 54321)
    os.symlink("/etc/passwd", src / "odd\nname.txt")
    real_stat = os.stat

    def stat_then_swap(path, *args, **kwargs):  # "sub" becomes a pipe right after the collect looked at it
        st = real_stat(path, *args, **kwargs)
        if path == "sub" and stat_mod.S_ISDIR(st.st_mode):
            os.rename(src / "sub", tmp_path / "sub-away")
            os.mkfifo(src / "sub")
        return st

    monkeypatch.setattr(exchange.os, "stat", stat_then_swap)
    collect = exchange.LinkSafeCollect(coursedir=CourseDirectory(), authenticator=Authenticator())
    collect.do_copy(str(src), str(tmp_path / "dest"))
    monkeypatch.undo()
    dest = tmp_path / "dest"
    left = (dest / LINKS_NOT_COLLECTED).read_text().splitlines()
    assert "sub" in left and "not-mine.txt" in left and "odd\\x0aname.txt" in left, left
    assert any(line.endswith(f"(deeper than {exchange.MAX_DEPTH} folders)") for line in left), left
    assert (dest / f"{AID}.ipynb").is_file() and not (dest / "not-mine.txt").exists()
    assert max(len(p.relative_to(dest).parts) for p in dest.rglob("*")) <= exchange.MAX_DEPTH + 1
