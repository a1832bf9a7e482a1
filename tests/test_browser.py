"""What students see, in a real headless Chromium (the system's, driven by playwright; playwright's own
browser download is never used).

1. The HTML feedback of the example class (lesson 02) renders: title, the score summary, and the
   diagnostic text each typical mistake must produce (autograder/examples/02-*/*/expected.json).
2. JupyterLab started as `make lab` starts it (the Makefile's own recipe, the course's lab settings
   installed in the venv) opens lesson 00 with its title visible and no dialog or pop-up in the way.

Screenshots go to the test's temporary folder and to .artifacts/ (ignored by git). Only the loopback
address is contacted: the browser aborts every other request (nbconvert's feedback page asks a CDN for
MathJax), and each test stops itself within its time bounds."""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest
from playwright.sync_api import expect, sync_playwright

from coursekit import course
from graded_examples import HOSTILE, feedback_files, graded_example_class

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / ".artifacts"
FEEDBACK_LESSON = "02-lora-inside-one-matmul"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
TIMEOUT_MS = 30_000  # any single browser wait
LAB_BUDGET_S = 120  # the whole JupyterLab test, server start to shutdown

NO_CHROMIUM = "no Chromium on PATH (Debian: apt-get install chromium): the browser tests need a system browser"


def _local(url: str) -> bool:
    u = urlparse(url)
    return u.scheme in ("file", "data", "blob", "about") or u.hostname in ("127.0.0.1", "localhost", "::1")


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":  # a skip would hide that CI's machine lacks the browser
            pytest.fail(NO_CHROMIUM + "; CI must install it")
        pytest.skip(NO_CHROMIUM)
    with sync_playwright() as p:
        # no background traffic: this machine's network is closed, and a test talks to localhost only
        b = p.chromium.launch(executable_path=CHROMIUM, timeout=TIMEOUT_MS, args=[
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--disable-quic"])
        yield b
        b.close()


@contextmanager
def local_page(browser, blocked: list[str]):
    """A page in a fresh context that aborts (and records) every request off this machine."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)

    def route(r):
        if _local(r.request.url):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    ctx.route("**/*", route)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield page, errors
    finally:
        ctx.close()


def _keep(src: Path, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(src, ARTIFACTS / name)


# --------------------------------------------------------------------------- the feedback page


def _expected_mistakes() -> dict[str, dict[str, str]]:
    """student id → {test cell: text its feedback must contain}, for lesson 02's typical mistakes."""
    out = {}
    for exp in sorted((ROOT / "autograder" / "examples" / FEEDBACK_LESSON).glob("*/expected.json")):
        spec = json.loads(exp.read_text())
        if (FEEDBACK_LESSON, f"ex-{exp.parent.name}") not in HOSTILE:  # typical mistakes; hostile submissions'
            out[f"ex-{exp.parent.name}"] = spec["loses"]  # texts may sit in error outputs
    assert out, "lesson 02 has no example mistakes"
    return out


def test_feedback_renders_with_scores_and_diagnostics(browser, tmp_path_factory, tmp_path):
    work = graded_example_class(tmp_path_factory, FEEDBACK_LESSON)
    files = feedback_files(work, FEEDBACK_LESSON)
    grades = {r["student_id"]: r for r in course.read_grades_csv(work / "grades.csv") if r["assignment"] == FEEDBACK_LESSON}
    blocked: list[str] = []
    with local_page(browser, blocked) as (page, errors):
        for sid, loses in _expected_mistakes().items():
            page.goto(files[sid].as_uri(), wait_until="load")
            expect(page).to_have_title(FEEDBACK_LESSON)
            # the summary: total score in the heading, one line per graded cell with its score
            head = page.locator(".panel-heading h4").first
            expect(head).to_be_visible()
            m = re.search(r"Score: ([\d.]+) / ([\d.]+)", head.inner_text())
            assert m, head.inner_text()
            assert float(m.group(1)) == round(float(grades[sid]["score"]), 2), (sid, m.group(0), grades[sid]["score"])
            toc = page.locator("#toc li")
            assert toc.count() >= 8, "the score summary lists every graded cell"
            for i in range(toc.count()):
                assert re.search(r"\(Score: [\d.]+ / [\d.]+\)", toc.nth(i).inner_text()), toc.nth(i).inner_text()
            for cell, text in loses.items():
                # the cell's summary line shows the lost points, and its output says why, visibly
                line = page.locator("#toc li", has=page.locator(f'a[href="#{cell}"]'))
                got, out_of = map(float, re.search(r"Score: ([\d.]+) / ([\d.]+)", line.inner_text()).groups())
                assert got < out_of, f"{sid}: {cell} should lose points ({line.inner_text()})"
                diag = page.locator(".output_stdout pre", has_text=text).first
                expect(diag).to_be_visible()
                diag.scroll_into_view_if_needed()
                assert "Likely mistake" in diag.inner_text() or "✗" in diag.inner_text(), diag.inner_text()[:300]
            if sid == "ex-missing-s":
                shot = tmp_path / "feedback-02-ex-missing-s.png"
                page.locator(".output_stdout pre", has_text=loses["p1_test"]).first.screenshot(path=str(shot))
                _keep(shot, shot.name)
        assert not errors, f"script errors on the feedback page: {errors}"
    assert all("mathjax" in u.lower() for u in blocked), f"unexpected off-machine requests: {blocked}"


def test_a_students_scripts_do_not_run_in_the_formgraders_page(browser, tmp_path):
    """nbgrader's formgrade page of a notebook with a script in every output kind, in its written answer, in an
    edited prose cell and in an added raw cell (tests/test_inert.py): after the autograde pipeline's InertOutputs no
    handler runs, even with every javascript: link clicked; the same page made from the notebook as handed in runs them."""
    from test_inert import formgrade_html, hostile_notebook, inert

    nb = hostile_notebook(ROOT / "lessons")
    ran = {}
    waited = 1500  # ms: at least this long for an SVG animation's onbegin or an image's onerror to fire
    # The control page first: how long its handlers take to run on this (perhaps busy) machine (until none has run for a
    # second) sets how long the inert page is watched, so that a slow browser cannot make the inert page look clean.
    for name, page_nb in (("as-handed-in", nb), ("inert", inert(nb))):
        path = tmp_path / f"formgrade-{name}.html"
        path.write_text(formgrade_html(page_nb))
        blocked: list[str] = []
        with local_page(browser, blocked) as (page, errors):
            started = time.monotonic()
            page.goto(path.as_uri(), wait_until="load")
            if name == "as-handed-in":  # until no handler has run for a second (an inline script runs before load)
                seen, quiet_since = -1, time.monotonic()
                while time.monotonic() - quiet_since < 1.0 and time.monotonic() - started < TIMEOUT_MS / 1000:
                    now = len(page.evaluate("window.PWNED || []"))
                    if now != seen:
                        seen, quiet_since = now, time.monotonic()
                    page.wait_for_timeout(100)
                waited = min(TIMEOUT_MS, max(waited, 2 * int(1000 * (time.monotonic() - started))))
            else:
                page.wait_for_timeout(waited)
            # every link the browser itself reads as javascript: is clicked (the others would leave the page)
            page.evaluate("() => { for (const a of document.querySelectorAll('a[href]')) "
                          "if (a.protocol === 'javascript:') a.click(); }")
            page.wait_for_timeout(300)
            ran[name] = page.evaluate("window.PWNED || []")
            if name == "inert":
                expect(page.locator("#notebook", has_text="My answer").first).to_be_visible()  # the answer is shown
                shot = tmp_path / "formgrade-inert.png"
                page.screenshot(path=str(shot), full_page=False)
                _keep(shot, shot.name)
    assert ran["inert"] == [], f"a student's script ran in the instructor's page: {ran['inert']}"
    assert ran["as-handed-in"], "the control page ran no handler: the test would not see one"


def test_the_class_report_shows_its_plots_and_table(browser, tmp_path_factory, tmp_path):
    """coursekit report's page, opened as an instructor opens it: both plots decode and have a size, the item table
    lists every item, and the page asks for nothing off this machine."""
    from coursekit import report

    work = graded_example_class(tmp_path_factory, FEEDBACK_LESSON)
    page_file = [p for p in report.write(report.collect(work, [FEEDBACK_LESSON]), tmp_path) if p.name == "report.html"][0]
    blocked: list[str] = []
    with local_page(browser, blocked) as (page, errors):
        page.goto(page_file.as_uri(), wait_until="load")
        expect(page).to_have_title("What the class got wrong")
        images = page.locator("img")
        assert images.count() == 2
        for i in range(images.count()):
            w, h = images.nth(i).evaluate("img => [img.naturalWidth, img.naturalHeight]")
            assert w > 300 and h > 100, (i, w, h)
            expect(images.nth(i)).to_be_visible()
        rows = page.locator("table").first.locator("tr")
        assert rows.count() == 1 + len(report.collect(work, [FEEDBACK_LESSON])["lessons"][0]["items"])
        shot = tmp_path / "class-report-02.png"
        page.screenshot(path=str(shot), full_page=True)
        _keep(shot, shot.name)
        assert not errors, errors
    assert not blocked, blocked


# --------------------------------------------------------------------------- JupyterLab as `make lab` starts it


def _make_lab_command(extra_args: list[str]) -> tuple[Path, list[str]]:
    """The Makefile's `lab` recipe with its variables filled in as make would: (cwd, argv)."""
    text = (ROOT / "Makefile").read_text()
    lesson0 = re.search(r"^LESSON0\s*:?=\s*(\S+)", text, re.M).group(1)
    recipe = re.search(r"^lab:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe, "Makefile has no `lab` recipe"
    lines = [l.strip() for l in recipe.group(1).splitlines()]
    assert len(lines) == 1, f"update _make_lab_command for the new `lab` recipe: {lines}"
    bindir = Path(sys.executable).parent  # the venv the tests run in: the Makefile's $(BIN)
    subst = {"$(BIN)": str(bindir), "$(CURDIR)": str(ROOT), "$(LESSON0)": lesson0,
             "$(ALLOW_ROOT)": "--allow-root" if os.getuid() == 0 else "", "$(LAB_ARGS)": shlex.join(extra_args)}
    line = lines[0]
    for k, v in subst.items():
        line = line.replace(k, v)
    assert "$(" not in line, f"update _make_lab_command: unknown make variable in {line!r}"
    cd, _, cmd = line.partition("&&")
    assert cd.split()[0] == "cd" and cmd, f"update _make_lab_command for the new `lab` recipe: {line!r}"
    return ROOT / cd.split()[1], shlex.split(cmd)


def _lab_settings_installed() -> None:
    """`make setup` copies the course's lab settings into the venv; the server reads them from there."""
    prefix = Path(sys.prefix)
    for src, dst in [("lab/overrides.json", "share/jupyter/lab/settings/overrides.json"),
                     ("lab/page_config.json", "etc/jupyter/labconfig/page_config.json")]:
        installed = prefix / dst
        assert installed.is_file() and _within(json.loads((ROOT / src).read_text()), json.loads(installed.read_text())), (
            f"{installed} is missing or lacks {src}'s settings: run `make setup`")


def _within(want, have) -> bool:
    """``want``'s settings all hold in ``have`` (which may hold more, e.g. `jupyter labextension lock`'s)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _within(v, have[k]) for k, v in want.items())
    return want == have


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, token: str, path: str, method: str = "GET"):
    req = urllib.request.Request(base + path, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        body = r.read()
    return json.loads(body) if body else None


def _wait(what: str, cond, timeout: float, log: Path):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; server log:\n{log.read_text()[-3000:]}")


@contextmanager
def _screenshot_on_failure(page, tmp_path: Path):
    """On a failed wait or assertion: a screenshot (kept in .artifacts/) and any dialog's text."""
    try:
        yield
    except BaseException as e:
        shot = tmp_path / "jupyterlab-lesson00-failure.png"
        try:
            page.screenshot(path=str(shot))
            _keep(shot, shot.name)
            dialogs = page.locator(".jp-Dialog").all_inner_texts()
        except Exception as inner:  # the page itself is gone
            dialogs = [f"(no screenshot: {inner})"]
        raise AssertionError(f"{e}\n\ndialogs on screen: {dialogs}; screenshot: {shot}") from e


def _first_heading(nb_path: Path) -> str:
    nb = json.loads(nb_path.read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            for line in "".join(c["source"]).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    raise AssertionError(f"{nb_path} has no markdown heading")


def _lab_env(tmp_path: Path) -> dict:
    """The environment `make lab` gives the server (the venv first, its Jupyter data), with the tester's own
    ~/.jupyter (user settings, workspaces, config) kept out of the picture: those live under ``tmp_path``."""
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                JUPYTER_PATH=str(Path(sys.prefix) / "share" / "jupyter"), PYTHONNOUSERSITE="1",
                JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
                JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "user-settings"),
                JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))


def test_jupyterlab_opens_lesson_00_with_no_dialog(browser, tmp_path):
    _lab_settings_installed()
    token, port = secrets.token_hex(16), _free_port()
    cwd, argv = _make_lab_command(["--no-browser", f"--ServerApp.token={token}", "--ServerApp.ip=127.0.0.1",
                                   f"--ServerApp.port={port}", "--ServerApp.port_retries=0"])
    lesson0 = argv[-1]
    title = _first_heading(cwd / lesson0)
    env = _lab_env(tmp_path)
    log = tmp_path / "jupyterlab.log"
    base = f"http://127.0.0.1:{port}"
    before = set(cwd.rglob("*"))
    nb_bytes = (cwd / lesson0).read_bytes()
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    # a watchdog: whatever happens below, the server's process group is gone after the budget
    watchdog = threading.Timer(LAB_BUDGET_S, lambda: _kill_group(server))
    watchdog.start()
    blocked: list[str] = []
    try:
        # What `make lab` hands the browser for its file argument: the server's redirect page to
        # /lab/tree/<file>?token=..., written to the runtime folder even with --no-browser.
        opener = _wait("the server's browser-open page", lambda: server.poll() is None and f"127.0.0.1:{port}/lab" in log.read_text()
                       and next((tmp_path / "runtime").glob("jpserver-file-to-run-*-open.html"), None), 60, log)
        assert _api(base, token, "/api/contents/" + lesson0)["type"] == "notebook", "the server is not rooted at lessons/"
        assert f"/lab/tree/{lesson0}?token={token}" in opener.read_text(), opener.read_text()
        with local_page(browser, blocked) as (page, errors), _screenshot_on_failure(page, tmp_path):
            page.goto(opener.as_uri(), wait_until="domcontentloaded")
            page.wait_for_url(f"{base}/lab/tree/**")
            heading = page.locator(".jp-NotebookPanel .jp-RenderedMarkdown h1", has_text=title).first
            expect(heading).to_be_visible(timeout=60_000)
            expect(page.locator(".lm-TabBar-tab.jp-mod-current", has_text=Path(lesson0).name).first).to_be_visible()
            # The notebook chose its own kernelspec by itself: the toolbar names it (a kernel-selection
            # dialog and "No Kernel" would stand there otherwise). Its start is not awaited: on a
            # loaded 2-core machine the kernel has taken over a minute to come up.
            spec = json.loads((cwd / lesson0).read_text())["metadata"]["kernelspec"]
            expect(page.locator(".jp-NotebookPanel-toolbar .jp-Toolbar-kernelName").first).to_have_text(spec["display_name"])
            page.wait_for_timeout(1500)  # a late pop-up (news, update check) would be up by now
            shot = tmp_path / "jupyterlab-lesson00.png"
            page.screenshot(path=str(shot))
            _keep(shot, shot.name)
            dialogs = page.locator(".jp-Dialog")
            assert dialogs.count() == 0, f"a dialog is in the way: {dialogs.first.inner_text()!r} (see {shot})"
            toasts = page.locator(".Toastify__toast")
            assert toasts.count() == 0, f"a notification pops up: {toasts.first.inner_text()!r} (see {shot})"
            expect(heading).to_be_in_viewport()
            # the course's page_config hides nbgrader's instructor menu from students
            assert "Nbgrader" not in page.locator("#jp-MainMenu").inner_text()
            assert not errors, f"script errors in JupyterLab: {errors}"
        # a clean stop: the server shuts its kernels down and exits
        _api(base, token, "/api/shutdown", method="POST")
        server.wait(timeout=30)
        assert not list((tmp_path / "runtime").glob("kernel-*.json")), "a kernel outlived the server"
    finally:
        watchdog.cancel()
        _kill_group(server)
        # Opening a notebook makes a checkpoint next to it (as it will for a student, git ignores it):
        # remove the ones this test made, and check that nothing else under lessons/ changed.
        for p in sorted(set(cwd.rglob(".ipynb_checkpoints")) - before):
            shutil.rmtree(p)
    assert not set(cwd.rglob("*")) - before, f"the test left files in lessons/: {sorted(set(cwd.rglob('*')) - before)}"
    assert (cwd / lesson0).read_bytes() == nb_bytes, "opening lesson 00 changed it on disk"
    assert not blocked, f"JupyterLab asked for off-machine resources (news, update check?): {blocked}"


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop the server this test started (and its process group) by its id, while it still runs:
    SIGTERM (jupyter_server then shuts its kernels down), SIGKILL after 10 s. An exited server is left
    alone: its id may belong to someone else by then. Kernels run in sessions of their own and exit
    with their parent (ipykernel's parent poller)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


# --------------------------------------------------------------------------- Run All on a fresh lesson

RUN_ALL_LESSON = "06-the-rank-one-walk"  # every kind of item, plots, and the step-through widget
RUN_ALL_BUDGET_S = 420  # server start, Run All of a whole lesson on a loaded 2-core machine, save, shutdown


def _step_through_pages(page, tmp_path: Path) -> None:
    """The step-through widget rendered by Run All: Next moves to the next page, its matrices replace the last
    page's, and the matrix area keeps its height."""
    widget = page.locator(".coursekit-step-through").first
    expect(widget).to_be_visible(timeout=60_000)
    widget.scroll_into_view_if_needed()
    area = widget.locator(".widget-html").last
    label = widget.locator(".widget-label").first
    expect(label).to_have_text(re.compile(r"^1/16 · training step 1"), timeout=30_000)
    assert area.locator("table").count() >= 3, "the first page shows no matrices"
    first = area.inner_text()
    heights = [area.bounding_box()["height"]]
    nxt = widget.get_by_role("button", name=re.compile("Next"))
    for k in range(2, 8):
        nxt.click()
        expect(label).to_have_text(re.compile(rf"^{k}/16 · "), timeout=10_000)
        heights.append(area.bounding_box()["height"])
    assert area.inner_text() != first
    # Page 7 is the update: A and B before and after, the entries the optimizer changed shaded.
    assert area.locator("td[style*='background']").count() == 2, "the update page shades no changed entry"
    shot = tmp_path / "step-through.png"
    widget.screenshot(path=str(shot))
    _keep(shot, shot.name)
    assert max(heights) - min(heights) < 1, f"the widget changes height between pages: {heights}"


def test_run_all_on_a_fresh_lesson_reaches_the_end(browser, tmp_path):
    """A student opens a fresh lesson, sees it unmodified (no ● on its tab: the stored language_info is the
    kernel's own; on another Python than the one the lessons were released with, JupyterLab writes the kernel's
    version in and the tab shows modified, which docs/students.md tells the student), clicks Run → Run All Cells with nothing answered, and every cell runs: no error anywhere, and
    the checks say "Not answered yet". The lesson is a copy, so saving it here leaves lessons/ alone."""
    root = tmp_path / "lessons"
    shutil.copytree(ROOT / "lessons" / RUN_ALL_LESSON, root / RUN_ALL_LESSON)
    name = f"{RUN_ALL_LESSON}/{RUN_ALL_LESSON}.ipynb"
    stored_python = json.loads((root / name).read_text())["metadata"]["language_info"]["version"]
    settings = tmp_path / "user-settings"
    # Every cell in the page (no windowing), so that the last cell's output can be awaited in the DOM.
    (settings / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"}))
    token, port = secrets.token_hex(16), _free_port()
    argv = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", f"--ServerApp.root_dir={root}", f"--ServerApp.token={token}",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if os.getuid() == 0:
        argv.append("--allow-root")
    env = _lab_env(tmp_path)
    env["COURSEKIT_KEYS"] = ""  # a student's machine has no answer keys (set and empty: not the repository's either)
    log = tmp_path / "jupyterlab.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    watchdog = threading.Timer(RUN_ALL_BUDGET_S, lambda: _kill_group(server))
    watchdog.start()
    blocked: list[str] = []
    try:
        _wait("the server", lambda: server.poll() is None and f"127.0.0.1:{port}/lab" in log.read_text(), 60, log)
        with local_page(browser, blocked) as (page, errors), _screenshot_on_failure(page, tmp_path):
            page.goto(f"{base}/lab/tree/{name}?token={token}", wait_until="domcontentloaded")
            tab = page.locator(".lm-TabBar-tab.jp-mod-current", has_text=Path(name).name).first
            expect(tab).to_be_visible(timeout=60_000)
            # The status bar says "| Idle" once the kernel is connected (and has told the page its language_info).
            expect(page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\| Idle")).first).to_be_visible(timeout=180_000)
            page.wait_for_timeout(2000)
            dirty = "jp-mod-dirty" in (tab.get_attribute("class") or "")
            if platform.python_version() == stored_python:
                assert not dirty, "a freshly opened lesson shows as modified"
            else:  # JupyterLab writes the kernel's own Python version into language_info: modified, as docs/students.md says
                assert dirty, (f"the lessons store Python {stored_python}'s language_info and the kernel runs "
                               f"{platform.python_version()}: JupyterLab should mark the lesson modified (docs/students.md)")
            page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
            last = page.locator(".jp-Notebook .jp-CodeCell").last
            expect(last.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]"), timeout=300_000)
            shot = tmp_path / "jupyterlab-run-all.png"
            page.screenshot(path=str(shot))
            _keep(shot, shot.name)
            prompts = page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").all_inner_texts()
            assert all(re.fullmatch(r"\[\d+\]:?", p.strip()) for p in prompts), f"cells that did not run: {prompts}"
            tracebacks = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            assert tracebacks.count() == 0, f"Run All stopped or warned: {tracebacks.first.inner_text()[:800]}"
            assert page.get_by_text("Not answered yet").count() >= 3, "the unanswered checks do not say so"
            _step_through_pages(page, tmp_path)
            assert not errors, f"script errors in JupyterLab: {errors}"
        _api(base, token, "/api/shutdown", method="POST")
        server.wait(timeout=30)
    finally:
        watchdog.cancel()
        _kill_group(server)
    assert not blocked, f"JupyterLab asked for off-machine resources: {blocked}"
