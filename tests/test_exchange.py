"""An instructor's lesson the nbgrader way, with real Unix accounts on one machine and nbgrader's own exchange: the
instructor guide's commands, as written, for lesson 00.

The instructor (root, the grading account: the sandbox's caps need it) releases the lesson; two students fetch it,
answer it and submit: ana a perfect notebook beside notes.txt and a JupyterLab checkpoint folder, ben one he renamed.
The instructor collects, grades with ``coursekit grade`` and releases feedback with nbgrader; each student fetches a
feedback file that says the score the gradebook holds, ben's why he scored 0. The guide's command blocks are read
from docs/instructors.md, so the test fails when the guide's commands stop working.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import accounts

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "instructors.md"
AID = "00-setup-and-probes"
GUIDE_AID = "02-lora-inside-one-matmul"  # the lesson the guide's commands name
STUDENTS = ("ck-ana", "ck-ben", "ck-cy")

pytestmark = pytest.mark.notebooks


def guide_commands(marker: str) -> list[str]:
    """The commands of the fenced block that follows ``<!-- marker -->`` in the instructor guide (comments and blank
    lines left out), for lesson 00 instead of the guide's lesson 02."""
    text = GUIDE.read_text()
    m = re.search(rf"<!-- {re.escape(marker)} -->\s*```bash\n(.*?)```", text, flags=re.S)
    assert m, f"docs/instructors.md lost its block <!-- {marker} -->"
    lines = [l.split(" #", 1)[0].strip() for l in m.group(1).splitlines()]
    return [l.replace(GUIDE_AID, AID).replace(" 02", " 00") for l in lines if l and not l.startswith("#")]


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    """The whole round trip, once: what each step printed, and the folders."""
    why = accounts.usable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the exchange round trip needs real accounts: {why}")
        pytest.skip(why)
    (ROOT / ".artifacts").mkdir(exist_ok=True)
    exchange = Path(tempfile.mkdtemp(prefix="ck-exchange-", dir="/tmp"))
    exchange.chmod(0o777)  # nbgrader's exchange: every user may write (students submit into it)
    # Inside the repository, as the course folder is by default (autograder/course/), so that the formgrader's server,
    # rooted at the repository, links it; in a folder git ignores, removed at the end.
    course_dir = Path(tempfile.mkdtemp(prefix="exchange-course-", dir=ROOT / ".artifacts")) / "course"
    # A copy of lessons/ as the release folder: `coursekit grade 00` generates lesson 00 into it again, and the
    # repository's lessons/00 is read meanwhile by other tests (the browser's JupyterLab test, nbval).
    release_copy = course_dir.parent / "release"
    shutil.copytree(ROOT / "lessons", release_copy)
    env = {**os.environ, "COURSEKIT_EXCHANGE": str(exchange), "COURSEKIT_COURSE": str(course_dir),
           "COURSEKIT_RELEASE": str(release_copy)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    student_env = {"COURSEKIT_EXCHANGE": str(exchange)}
    users = {s: accounts.add_user(s) for s in STUDENTS}
    for u in users.values():  # the guide: the students' configuration in each student's ~/.jupyter
        conf = Path(u.pw_dir) / ".jupyter" / "nbgrader_config.py"
        conf.parent.mkdir()
        shutil.copyfile(ROOT / "autograder" / "student_nbgrader_config.py", conf)
        for q in (conf.parent, conf):
            os.chown(q, u.pw_uid, u.pw_gid)
    log: list[str] = []

    def instructor(cmd: str) -> subprocess.CompletedProcess:
        if cmd.startswith("cd "):  # the guide's commands run in autograder/, as below
            return subprocess.CompletedProcess(cmd, 0, "", "")
        r = subprocess.run(cmd, shell=True, cwd=ROOT / "autograder", env=env, capture_output=True, text=True, timeout=1200)
        log.append(f"$ {cmd}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
        assert r.returncode == 0, f"instructor: {cmd} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        return r

    def student(name: str, cmd: str) -> subprocess.CompletedProcess:
        r = accounts.run_as(name, ["bash", "-c", cmd], env=student_env, needs=[exchange])
        log.append(f"{name}$ {cmd}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
        assert r.returncode == 0, f"{name}: {cmd} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        return r

    def hand_in(name: str, how) -> None:
        """What a student does between fetching and submitting, as that student (their files, their rights)."""
        home = Path(users[name].pw_dir) / AID
        how(home)
        for p in [home, *home.rglob("*")]:
            os.chown(p, users[name].pw_uid, users[name].pw_gid)

    def answer_perfectly(folder: Path) -> None:
        import nbformat

        from coursekit import course

        sol = nbformat.read(ROOT / "solutions" / AID / f"{AID}.ipynb", as_version=4)
        rel = nbformat.read(folder / f"{AID}.ipynb", as_version=4)
        nbformat.write(course.perfect_submission(sol, rel), folder / f"{AID}.ipynb")
        (folder / "notes.txt").write_text("to ask in class: why 64 per block?\n")
        (folder / ".ipynb_checkpoints").mkdir()
        shutil.copyfile(folder / f"{AID}.ipynb", folder / ".ipynb_checkpoints" / f"{AID}-checkpoint.ipynb")

    def rename(folder: Path) -> None:
        (folder / f"{AID}.ipynb").rename(folder / "my-lesson-00.ipynb")

    def answer_and_leave_a_page(folder: Path) -> None:
        """A perfect notebook, with a page of the student's own beside it that would be fetched back as feedback if
        nbgrader's feedback step copied it on (fetch_feedback fetches <name>.html for each <name>.ipynb handed in)."""
        answer_perfectly(folder)
        shutil.copyfile(folder / f"{AID}.ipynb", folder / "leak.ipynb")
        (folder / "leak.html").write_text("<p>not feedback</p>")

    try:
        inst = guide_commands("the exchange: the instructor's commands")
        stud = guide_commands("the exchange: a student's commands")
        release = [c for c in inst if "release_assignment" in c]
        after = [c for c in inst if "release_assignment" not in c and "release_feedback" not in c]
        feedback = [c for c in inst if "release_feedback" in c]
        fetch = [c for c in stud if "fetch_assignment" in c]
        submit = [c for c in stud if "submit" in c]
        fetch_feedback = [c for c in stud if "fetch_feedback" in c]
        assert release and after and feedback and fetch and submit and fetch_feedback, (inst, stud)
        for c in release:
            instructor(c)
        for name in STUDENTS:
            for c in fetch:
                student(name, c)
        hand_in("ck-ana", answer_and_leave_a_page)
        hand_in("ck-ben", rename)
        hand_in("ck-cy", answer_perfectly)
        for name in STUDENTS:
            for c in submit:
                student(name, c)
        # cy's own client (the inbound folder is his): after submitting, a link to the answer keys, which nbgrader's
        # collect would copy as the grading account, reading the keys
        keys = ROOT / "autograder" / "keys" / f"{AID[:2]}.json"
        (inbound,) = [p for p in (exchange / "qlora-backprop" / "inbound").iterdir() if p.name.startswith("ck-cy+")]
        student("ck-cy", f"ln -s {keys} '{inbound}/keys.json'")
        graded = [instructor(c) for c in after]
        for c in feedback:
            instructor(c)
        for name in STUDENTS:
            for c in fetch_feedback:
                student(name, c)
        # Later, the formgrader's "Generate Feedback" (nbgrader's own generate_feedback, which rebuilds every feedback
        # folder from the autograded copies) and a second release: it must not stop at any student's folder.
        instructor(f"nbgrader generate_feedback {AID} --force")
        released_again = [instructor(c) for c in feedback]
        yield {"course": course_dir, "exchange": exchange, "homes": {s: Path(u.pw_dir) for s, u in users.items()},
               "graded": "\n".join(r.stdout for r in graded), "log": "\n".join(log),
               "released_again": "\n".join(r.stdout + r.stderr for r in released_again)}
    finally:
        for name in STUDENTS:
            accounts.remove_user(name)
        shutil.rmtree(exchange, ignore_errors=True)
        shutil.rmtree(course_dir.parent, ignore_errors=True)


def _fetched(term, name: str) -> dict[str, str]:
    """Feedback file name → text, of what ``name`` fetched (``<lesson>/feedback/<timestamp>/<notebook>.html``)."""
    folder = term["homes"][name] / AID / "feedback"
    return {p.name: html.unescape(p.read_text()) for p in folder.glob("*/*.html")}


def _scores(course: Path) -> dict[str, float]:
    from coursekit.example_class import graded_scores

    return graded_scores(course, AID)


def test_collect_brings_nbgraders_files_and_grading_keeps_the_score(term):
    """nbgrader collect adds timestamp.txt and submission_secret.txt, and ana's notes and checkpoints came too: none of
    it costs a point. ana scores every autograded point of lesson 00; ben's renamed notebook scores 0 for a reason."""
    from coursekit.example_class import max_points

    sub = term["course"] / "submitted" / "ck-ana" / AID
    assert {"timestamp.txt", "submission_secret.txt", "notes.txt"} <= {p.name for p in sub.iterdir()}, term["log"]
    auto, _ = max_points(ROOT, AID)
    assert _scores(term["course"]) == {"ck-ana": auto, "ck-ben": 0.0, "ck-cy": 0.0}, term["log"]
    assert "ck-ben/00-setup-and-probes: no notebook named 00-setup-and-probes.ipynb" in term["graded"]


def test_every_student_fetches_feedback_with_the_score_the_gradebook_holds(term):
    ana = _fetched(term, "ck-ana")
    assert list(ana) == [f"{AID}.html"], term["log"]  # her leak.html was set aside: never released as feedback
    from coursekit.example_class import max_points

    auto, total = max_points(ROOT, AID)
    assert f"Score: {auto:.1f} / {total:.1f}" in ana[f"{AID}.html"]
    assert "Set aside by the grader" in ana[f"{AID}.html"] and "notes.txt" in ana[f"{AID}.html"]
    # nbgrader submit leaves JupyterLab's checkpoints out (its own ignore list): they never reach the course folder
    assert ".ipynb_checkpoints" not in ana[f"{AID}.html"]
    ben = _fetched(term, "ck-ben")
    assert list(ben) == ["my-lesson-00.html"], term["log"]  # under his name for the notebook he handed in
    assert "0 points" in ben["my-lesson-00.html"] and "found my-lesson-00.ipynb" in ben["my-lesson-00.html"]
    cy = _fetched(term, "ck-cy")  # refused: his feedback still reaches him (his own secret names it)
    assert list(cy) == [f"{AID}.html"], term["log"]
    assert "not a file (keys.json)" in cy[f"{AID}.html"] and '"keys"' not in cy[f"{AID}.html"]


def test_feedback_generated_anew_is_released_for_everyone(term):
    """nbgrader's release_feedback reads timestamp.txt and submission_secret.txt beside each page and stopped at the
    first folder without them (a 0 for a reason), for the whole class; the autograded copies keep them, so feedback
    generated anew from them (the formgrader's Generate Feedback) is released for every student."""
    for sid in STUDENTS:
        assert f"Releasing feedback for student '{sid}'" in term["released_again"], term["released_again"][-3000:]
        for name in ("timestamp.txt", "submission_secret.txt"):
            assert (term["course"] / "autograded" / sid / AID / name).is_file(), (sid, name)


def test_a_link_in_a_submission_is_not_collected_and_the_submission_refused(term):
    """nbgrader's collect follows links as the grading account; the course's collect leaves a link out and names it,
    so neither the keys nor a link to them reach the course folder (nbgrader's own autograde, the formgrader's
    button, would follow it), and coursekit grade refuses the submission."""
    sub = term["course"] / "submitted" / "ck-cy" / AID
    assert not (sub / "keys.json").exists() and not (sub / "keys.json").is_symlink()
    assert (sub / "links-not-collected.txt").read_text() == "keys.json\n"
    assert not [p for p in term["course"].rglob("*") if p.is_symlink()]
    assert "ck-cy/00-setup-and-probes: it held a symbolic link or another entry that is not a file (keys.json)" in term["graded"]
    keys = (ROOT / "autograder" / "keys" / f"{AID[:2]}.json").read_text()
    for p in term["course"].rglob("*"):
        if p.is_file() and not p.is_symlink() and p.suffix in (".json", ".html", ".txt", ".ipynb"):
            assert keys.strip()[:60] not in p.read_text(errors="replace"), p


def test_submissions_csv_says_what_was_set_aside_and_why_a_zero(term):
    import csv

    with open(term["course"] / "submissions.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert rows["ck-ana"]["status"] == "graded" and rows["ck-ana"]["ignored"] == "leak.html; leak.ipynb; notes.txt"
    assert not (term["course"] / "feedback" / "ck-ana" / AID / "leak.html").exists()
    assert not (term["course"] / "autograded" / "ck-ana" / AID / "notes.txt").exists()
    assert rows["ck-ben"]["status"] == "zero" and "my-lesson-00.ipynb" in rows["ck-ben"]["reason"]


def test_the_formgrader_shows_the_class_and_a_zeros_reason_in_chromium(term, tmp_path):
    """The instructor opens `coursekit formgrader` on the graded lesson in a real browser: Manage Submissions lists
    both students with their scores, ben's 0 as graded (not "needs autograding"), his submission opens with the
    reason, and the lesson's source and release links of Manage Assignments open inside the server."""
    import socket
    import signal
    import time
    import urllib.request

    from test_browser import CHROMIUM, NO_CHROMIUM, TIMEOUT_MS, _keep, local_page

    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail(NO_CHROMIUM + "; CI must install it")
        pytest.skip(NO_CHROMIUM)
    from playwright.sync_api import expect, sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "coursekit-formgrader-test"
    env = {**os.environ, "JUPYTER_TOKEN": token, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = open(tmp_path / "formgrader.log", "w")
    p = subprocess.Popen([str(Path(sys.executable).parent / "coursekit"), "formgrader", "--course", str(term["course"]),
                          "--port", str(port), "--no-browser"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/formgrader/api/assignments?token={token}", timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline and p.poll() is None, (tmp_path / "formgrader.log").read_text()[-3000:]
                time.sleep(0.5)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, timeout=TIMEOUT_MS, args=[
                "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
                "--disable-quic"])
            blocked: list[str] = []
            try:
                with local_page(browser, blocked) as (page, errors):
                    page.goto(f"{base}/formgrader?token={token}")  # the link the server prints; it logs in
                    page.goto(f"{base}/formgrader/manage_submissions/{AID}")
                    ana = page.locator("tr", has_text="ck-ana")
                    ben = page.locator("tr", has_text="ck-ben")
                    expect(ben).to_contain_text("graded")
                    expect(ben).not_to_contain_text("needs autograding")
                    expect(ben).to_contain_text("0 / 11")
                    expect(ana).to_contain_text("9 / 11")
                    shot = tmp_path / "formgrader-manage-submissions.png"
                    page.screenshot(path=str(shot), full_page=True)
                    _keep(shot, shot.name)
                    page.goto(f"{base}/formgrader/manage_students/ck-ben/{AID}")
                    page.locator('a[href*="/formgrader/submissions/"]').first.click()
                    expect(page.get_by_text("this submission could not be graded", exact=False).first).to_be_visible()
                    expect(page.get_by_text("found my-lesson-00.ipynb", exact=False).first).to_be_visible()
                    page.goto(f"{base}/formgrader/manage_assignments")
                    row = page.locator("tr", has_text=AID).first
                    expect(row).to_be_visible()
                    hrefs = [a.get_attribute("href") for a in row.locator('a[href^="/tree/"]').all()]
                    assert hrefs, "no link to the lesson's folders"
                    for href in hrefs:
                        page.goto(base + href)
                        assert page.url.startswith(base + "/tree/"), page.url
                        expect(page.get_by_text("404", exact=True)).to_have_count(0)
                    # nbgrader's submission page loads MathJax from a CDN, which this offline machine cannot reach:
                    # its math shows as TeX source (the guide says so); any other script error is a failure
                    assert not [e for e in errors if "MathJax" not in e], errors
            finally:
                browser.close()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
