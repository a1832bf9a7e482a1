"""What the instructor's pages show of a student's notebook is inert (coursekit/inert.py).

A hostile notebook carries a script in every kind of rich output nbconvert renders and in its markdown (a free-text
answer, an edited prose cell, an added raw cell). After the autograde pipeline's InertOutputs, nbgrader's own
formgrade template renders it with no active content left; tests/test_browser.py loads that page in Chromium and
finds no handler run (and, as a control, that the same page without InertOutputs does run one)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell

from coursekit.inert import INERT_MIME, InertOutputs, clean_markdown, inert_output

ROOT = Path(__file__).resolve().parents[1]
LESSON = "00-setup-and-probes"

#: One tiny PNG (a 1x1 pixel), valid base64.
PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                                     "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")).decode()


#: Active content of the student's in a page: an event handler, a script or a link that runs the marker, or an SVG or
#: raw HTML element (the template's own handlers never mention the marker).
ACTIVE = re.compile(r"<[^>]*\son\w+\s*=[^>]*PWNED|<script[^>]*>[^<]*PWNED|href\s*=\s*[\"']?\s*(?:javascript|jav&)"
                    r"|<svg|<img[^>]*src=\"x\"\s+on|id=\"p8_explain\"></span>click me|src=\"/logout", re.I)


def _hit(tag: str) -> str:
    """JavaScript that records that a handler ran."""
    return f"(window.PWNED=(window.PWNED||[])).push('{tag}')"


def hostile_notebook(release: Path) -> nbformat.NotebookNode:
    """The release notebook of lesson 00 with a script in every place a student can put one."""
    nb = nbformat.read(release / LESSON / f"{LESSON}.ipynb", as_version=4)
    outs = [
        new_output("display_data", data={"text/html": f"<img src=x onerror=\"{_hit('html')}\">", "text/plain": "ok"}),
        new_output("display_data", data={"application/javascript": _hit("js")}),
        new_output("display_data", data={"text/markdown": f"<img src=x onerror=\"{_hit('md-output')}\">"}),
        new_output("display_data", data={"image/svg+xml": f"<svg xmlns='http://www.w3.org/2000/svg' "
                                                          f"onload=\"{_hit('svg')}\"></svg>"}),
        new_output("display_data", data={"image/png": f"x\" onerror=\"{_hit('png-attr')}"}),
        new_output("display_data", data={"image/png": PNG}, metadata={"image/png": {"width": f"1 onload={_hit('w')}"}}),
        new_output("execute_result", data={"text/html": f"<script>{_hit('script')}</script>",
                                           "text/latex": r"$\href{javascript:alert(1)}{x}$"}, execution_count=1),
        new_output("stream", name="stdout", text=f"<img src=x onerror=\"{_hit('stream')}\">"),
        new_output("error", ename="E", evalue=f"<img src=x onerror=\"{_hit('evalue')}\">",
                   traceback=[f"<img src=x onerror=\"{_hit('tb')}\">"]),
    ]
    nb.cells.insert(1, new_code_cell("1", outputs=outs))
    answer = (f"My answer <img src=x onerror=\"{_hit('md')}\"> is **bold**, $a<b$.\n\n"
              f"<script>{_hit('md-script')}</script>\n\n[click me](javascript:{_hit('md-link')})\n"
              f"[entity](jav&#x61;script:{_hit('md-entity')})\n[files](files/javascript:{_hit('md-files')})\n"
              f"![logout](/logout)\n\n"
              f"```\n[x](javascript:{_hit('md-code')})\n\nmore\n```\n")
    md_answers = [c for c in nb.cells if c.cell_type == "markdown" and (c.metadata.get("nbgrader") or {}).get("solution")]
    assert md_answers, "lesson 00 has a written answer cell"
    md_answers[0].source = answer
    prose = next(c for c in nb.cells if c.cell_type == "markdown" and not c.metadata.get("nbgrader"))
    prose.source += f"\n\n<svg><animate onbegin=\"{_hit('prose')}\" attributeName=x dur=1s></svg>"
    nb.cells.insert(2, new_raw_cell(f"<script>{_hit('raw')}</script>", metadata={"raw_mimetype": "text/html"}))
    # a raw cell with no mimetype is pasted into the page too; an element with a grade widget's id takes its clicks
    nb.cells.insert(3, new_raw_cell('<div class="nbgrader_cell"><span id="p8_explain"></span>click me</div>'))
    outs.append(new_output("stream", name="stdout", text=("\x1b[m" + "&" * 7) * 1000 + "\x1b[31mred\x1b[0m"))
    return nb


def inert(nb: nbformat.NotebookNode, release: Path | None = ROOT / "lessons") -> nbformat.NotebookNode:
    pp = InertOutputs(release_directory=str(release) if release else "")
    out, _ = pp.preprocess(nbformat.from_dict(nb), {"nbgrader": {"assignment": LESSON}})
    return out


def formgrade_html(nb: nbformat.NotebookNode, sanitize: bool = False) -> str:
    """``nb`` as nbgrader's formgrader renders a submission (its own exporter settings and template)."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config

    cfg = Config()
    cfg.HTMLExporter.template_name = "formgrade"
    cfg.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    cfg.HTMLExporter.sanitize_html = sanitize
    resources = {"assignment_id": LESSON, "notebook_id": LESSON, "submission_id": "x", "index": 0, "total": 1,
                 "base_url": "", "student": "mallory", "last_name": None, "first_name": None,
                 "notebook_path": f"autograded/mallory/{LESSON}/{LESSON}.ipynb"}
    html, _ = HTMLExporter(config=cfg).from_notebook_node(nb, resources=resources)
    return html


def test_every_output_keeps_only_inert_forms():
    nb = inert(hostile_notebook(ROOT / "lessons"))
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.output_type in ("display_data", "execute_result"):
                assert set(o.data) <= set(INERT_MIME), o
                assert o.metadata == {}
                for mime in ("image/png", "image/jpeg"):
                    if mime in o.data:
                        assert re.fullmatch(r"[A-Za-z0-9+/=\s]*", o.data[mime])
    outs = nb.cells[1].outputs
    assert outs[0].data == {"text/plain": "ok"}  # the plain form of an HTML output stays
    assert "application/javascript" in outs[1].data["text/plain"]  # says what it removed
    assert "image/png" not in outs[4].data  # data that is not base64 would leave the src attribute
    assert outs[5].data["image/png"] == PNG  # a real image stays an image
    assert outs[7].text.startswith("<img")  # stream text stays text (nbconvert escapes it)


def test_the_students_markdown_is_cleaned_and_the_lessons_kept():
    before = hostile_notebook(ROOT / "lessons")
    release = nbformat.read(ROOT / "lessons" / LESSON / f"{LESSON}.ipynb", as_version=4)
    ours = {c.source for c in release.cells if c.cell_type == "markdown"}
    after = inert(before)
    for b, a in zip(before.cells, after.cells):
        if b.cell_type == "markdown" and b.source in ours:
            assert a.source == b.source  # the lesson's own prose, unchanged
        elif b.cell_type == "markdown":
            assert "\n" not in a.source and a.source.startswith("<div>")
            assert not ACTIVE.search(a.source), ACTIVE.search(a.source).group(0)
    answer = next(a.source for a in after.cells if "My answer" in a.source)
    assert "<strong>bold</strong>" in answer and "$a&lt;b$" in answer  # formatting and math survive
    assert not [c for c in after.cells if c.cell_type == "raw"]  # raw cells of the student's became their text
    shown = next(a.source for a in after.cells if "click me" in a.source)
    assert "<pre>" in shown and "&lt;div" in shown and not re.search(r"<[^>]*\sid=", shown)  # text, no element
    ansi = next(o.text for o in after.cells[1].outputs if o.output_type == "stream" and "red" in o.text)
    assert "\x1b" not in ansi and ansi.endswith("red")


def test_a_missing_attachment_does_not_stop_the_notebook():
    """nbconvert raises for an image of a missing attachment; the answer is shown, the image is its alt text."""
    assert clean_markdown("![x](attachment:nope.png) and <b>text</b>") == '<div><p><img alt="x"> and <b>text</b></p></div>'


def test_without_a_release_every_markdown_cell_is_cleaned():
    after = inert(hostile_notebook(ROOT / "lessons"), release=None)
    assert all(c.source.startswith("<div>") for c in after.cells if c.cell_type == "markdown")


@pytest.mark.parametrize("src", ["", "plain", "# Title\n\nText with `code <b>` and\n\n    indented\n\n    code"])
def test_clean_markdown_is_one_html_block(src):
    out = clean_markdown(src)
    assert "\n" not in out and out.startswith("<div>") and out.endswith("</div>")


def test_the_formgrade_page_holds_no_active_content():
    """Without a browser: no event handler attribute, script of the student's, javascript: URL or raw HTML cell
    in nbgrader's formgrade page of the inert notebook; the same page of the notebook as handed in has them."""
    html = formgrade_html(inert(hostile_notebook(ROOT / "lessons")))
    assert not ACTIVE.search(html), ACTIVE.search(html).group(0)
    raw = formgrade_html(hostile_notebook(ROOT / "lessons"))
    assert ACTIVE.search(raw)  # the control: the page as nbconvert makes it from the untouched notebook


def test_the_autograde_pipeline_runs_it_after_scoring():
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT / "autograder")).load_config()
    pps = list(cfg.Autograde.autograde_preprocessors)
    assert pps.index("coursekit.inert.InertOutputs") == pps.index("coursekit.guard.ScoreAnswers") + 1
    assert cfg.InertOutputs.release_directory == str(ROOT / "lessons")
