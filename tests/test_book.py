"""The course as a web book (`make book`, docs/conf.py; docs/maintainers.md, "The web book"): it builds without a
warning that matters (a broken link or reference fails the build), offline, with every lesson, the glossary, the
notation page and the guides, and no page asks the network for a script or a style sheet. In headless Chromium (the
system's, as tests/test_browser.py drives it), with every request off the local server refused: the index, a lesson
whose math MathJax renders, a lesson's glossary link followed, and the instructor guide. Screenshots go to
.artifacts/. The key scan of the site is in tests/test_key_leaks.py."""

from __future__ import annotations

import functools
import http.server
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from coursekit import course

ROOT = Path(__file__).resolve().parents[1]
LESSONS = course.lesson_ids(ROOT)
GUIDES = ["students", "instructors", "security", "capstone", "maintainers", "authoring"]
MATH_LESSON = "05-backward-through-one-projection"   # its prose holds $Z = XA, \qquad Y = XW + s\,ZB$


def test_the_book_builds_without_a_warning(book):
    assert book["returncode"] == 0 and not book["warnings"], "make book's build failed or warned:\n" + "\n".join(
        book["warnings"][-40:])
    print(f"the book built in {book['seconds']:.1f} s")


def test_the_book_holds_every_lesson_the_glossary_and_the_guides(book):
    html = book["html"]
    missing = [p for p in [*(f"lessons/{lid}/{lid}.html" for lid in LESSONS), "lessons/glossary.html",
                           "lessons/notation.html", "index.html", "docs/index.html", "search.html", "searchindex.js",
                           *(f"docs/{g}.html" for g in GUIDES)] if not (html / p).is_file()]
    assert not missing, f"pages missing from the book: {missing}"
    assert not (html / "solutions").exists() and not list(html.rglob("*solutions*")), "solutions/ reached the book"
    assert not list(html.rglob("*.ipynb")), "a notebook's source was copied into the book"


def test_no_page_loads_anything_from_the_network(book):
    """Offline means no script, style sheet, font or image from another host: MathJax is the copy in _static/."""
    remote = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.I)
    found = [f"{p.relative_to(book['html'])}: {m.group(0)}" for p in book["html"].rglob("*.html")
             for m in remote.finditer(p.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found[:20])
    lesson = (book["html"] / "lessons" / MATH_LESSON / f"{MATH_LESSON}.html").read_text()
    src = re.search(r'<script[^>]*src="([^"]*tex-chtml\.js)"', lesson)
    assert src, "the lesson page loads no MathJax"
    assert (book["html"] / "lessons" / MATH_LESSON / src.group(1)).resolve().is_file(), src.group(1)


def test_the_lessons_keep_their_links_to_the_glossary(book):
    """The release notebooks link ../glossary.md (JupyterLab's relative link); on the site it is the glossary page."""
    page = (book["html"] / "lessons" / MATH_LESSON / f"{MATH_LESSON}.html").read_text()
    assert 'href="../glossary.html' in page and 'href="../notation.html' in page


# --------------------------------------------------------------------------- in Chromium


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test's output is the assertions, not an access log
        pass


@contextmanager
def served(folder: Path):
    """The site over http://127.0.0.1:<port>/ from a thread; stopped on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(10)


def test_the_book_in_chromium(book, tmp_path):
    from test_browser import ARTIFACTS, CHROMIUM, NO_CHROMIUM, TIMEOUT_MS, local_page

    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail(NO_CHROMIUM + "; CI must install it")
        pytest.skip(NO_CHROMIUM)
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    blocked: list[str] = []
    with served(book["html"]) as base, sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, timeout=TIMEOUT_MS, args=[
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--disable-quic"])
        try:
            with local_page(b, blocked) as (page, errors):
                def shot(name):
                    page.screenshot(path=str(tmp_path / name), full_page=False)
                    (ARTIFACTS / name).write_bytes((tmp_path / name).read_bytes())

                # the index: the site's root sends the browser to the book's first page, which lists the lessons
                page.goto(base + "/")
                page.wait_for_url(re.compile(r"/docs/index\.html$"))
                expect(page.locator("h1").first).to_contain_text("Gradients through a frozen, quantized base")
                expect(page.locator(".sidebar-tree a", has_text="Glossary").first).to_be_visible()
                assert page.locator(".sidebar-tree a[href*='lessons/']").count() >= len(LESSONS) + 2
                shot("book-index.png")

                # a lesson with math: MathJax typesets it (an mjx-container, no TeX source left)
                page.goto(f"{base}/lessons/{MATH_LESSON}/{MATH_LESSON}.html")
                expect(page.locator("h1").first).to_be_visible()
                expect(page.locator("mjx-container").first).to_be_visible()
                body = page.locator("article").inner_text()
                assert "\\qquad" not in body, "TeX source left on the page: MathJax did not typeset it"
                page.locator("mjx-container").first.scroll_into_view_if_needed()
                shot("book-lesson-math.png")

                # the lesson's glossary link (../glossary.md in the notebook) opens the glossary page
                page.locator("article a[href^='../glossary.html']").first.click()
                page.wait_for_url(re.compile(r"/lessons/glossary\.html"))
                expect(page.locator("h1").first).to_contain_text("Glossary")
                expect(page.get_by_text("absmax.", exact=False).first).to_be_visible()
                shot("book-glossary.png")

                # the instructor guide, in the order an instructor needs it
                page.goto(f"{base}/docs/instructors.html")
                expect(page.locator("h1").first).to_contain_text("The instructor guide")
                heads = page.locator("article h2").all_inner_texts()
                first = [h for h in heads if re.match(r"\d\.", h.strip())]
                assert first and "Grade the example class first" in first[0], heads
                shot("book-instructors.png")

                # search runs in the browser on the site's own index
                page.goto(f"{base}/search.html?q=NF4")
                expect(page.locator("#search-results a").first).to_be_visible()
                assert not errors, f"script errors on the book's pages: {errors}"
        finally:
            b.close()
    assert not blocked, f"the book asked the network for: {sorted(set(blocked))[:10]}"
