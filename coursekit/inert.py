"""What a student made, made inert before an instructor's page shows it.

The autograded copy of a submission is what the instructor opens: nbgrader's formgrader renders it to HTML at the
notebook server's origin (where a script could use the Jupyter API as the grading account, which holds the keys and
the gradebook), and nbgrader's feedback step renders the same copy for the student. nbconvert passes a cell's rich
outputs (``text/html``, ``application/javascript``, ``image/svg+xml``, ``text/markdown``, ``text/latex``) and the raw
HTML of a markdown cell through to that page unchanged, and its markdown renderer keeps ``javascript:`` links (it is
built with ``allow_harmful_protocols=True``). So :class:`InertOutputs`, in the autograde pipeline of every route
(``coursekit grade``, ``nbgrader autograde``, the formgrader's button), keeps of the notebook only inert forms:

- **outputs**: ``stream`` and ``error`` outputs are text (nbconvert escapes them); of a ``display_data`` or
  ``execute_result`` only :data:`INERT_MIME` stays (``text/plain``; PNG and JPEG images whose data is base64, so
  that it cannot leave the ``src`` attribute nbconvert writes it into), without output metadata (nbconvert writes
  ``width``/``height`` into attributes). An output with nothing inert left says what was removed;
- **markdown written by the student** (any markdown cell whose source is not one of the release notebook's: free-text
  answers, edited prose, added cells) is rendered to HTML with nbconvert's own renderer and cleaned by nh3, an
  allow-list sanitizer (the Rust ``ammonia`` library: no script, no event handler, no ``style``, no ``id``); the
  cell then holds that clean HTML on one line, which markdown passes through as it is. Its attachments are dropped;
- **raw cells** that are not the release's become markdown cells showing their text as code: nbconvert pastes a raw
  cell into the page (its default ``raw_mimetypes`` include the empty one), where an element with a grade widget's
  id takes the instructor's clicks;
- **text** of outputs loses its ANSI escape sequences (nbconvert's ansi2html costs the server time quadratic in their
  number) and is kept to :data:`TEXT_CHARS` characters; links and images of the student's markdown keep only
  absolute ``http``, ``https`` and ``mailto`` URLs, and images none (their ``alt`` text stays).

The check cells' outputs are the grader's own (coursekit.guard.ScoreAnswers replaced them), plain text, and pass
unchanged. Reference: OWASP Cross Site Scripting Prevention Cheat Sheet,
https://cheatsheetseries.owasp.org/cheatsheets/Cross_Site_Scripting_Prevention_Cheat_Sheet.html .
"""

from __future__ import annotations

import re
from pathlib import Path

from nbformat.notebooknode import NotebookNode
from traitlets import Unicode

from nbgrader.preprocessors import NbGraderPreprocessor

#: The MIME types of a rich output that the autograded copy keeps.
INERT_MIME = ("text/plain", "image/png", "image/jpeg")
#: Link and image schemes a student's markdown may keep (nh3's ``url_schemes``).
URL_SCHEMES = {"http", "https", "mailto"}

_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def inert_output(out: dict) -> dict:
    """One cell output in a form no page runs: see the module's docstring. ``out`` is an nbformat output dict; a new
    one is returned (``out`` is not changed)."""
    kind = out.get("output_type")
    if kind == "stream":
        return NotebookNode(output_type="stream", name="stderr" if out.get("name") == "stderr" else "stdout",
                            text=_text(out.get("text")))
    if kind == "error":
        tb = out.get("traceback")
        return NotebookNode(output_type="error", ename=_text(out.get("ename")), evalue=_text(out.get("evalue")),
                            traceback=[_text(t) for t in tb] if isinstance(tb, list) else [])
    data = out.get("data") if isinstance(out.get("data"), dict) else {}
    kept = {}
    for mime in INERT_MIME:
        v = data.get(mime)
        if isinstance(v, list):  # nbformat allows a list of lines
            v = "".join(x for x in v if isinstance(x, str))
        if not isinstance(v, str):
            continue
        if mime.startswith("image/") and not _BASE64.fullmatch(v):
            continue
        kept[mime] = _text(v) if mime == "text/plain" else v
    dropped = sorted(k for k in data if k not in kept)
    if "text/plain" not in kept and dropped:
        kept["text/plain"] = f"[an output the grader does not show: {', '.join(d[:60] for d in dropped[:5])}]"
    node = NotebookNode(output_type="execute_result" if kind == "execute_result" else "display_data",
                        data=kept, metadata={})
    if kind == "execute_result":
        node["execution_count"] = out.get("execution_count") if isinstance(out.get("execution_count"), int) else None
    return node


#: An ANSI escape sequence (CSI, OSC and two-character ones): nbconvert's ansi2html re-slices the rest of the text at
#: every one, so a megabyte of them costs the formgrader's server (which renders synchronously) many seconds.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
#: The most characters one text of an output keeps (the grader's output caps keep far less: this bounds what
#: reaches a page even when an output was not cut).
TEXT_CHARS = 2 << 20


def _text(v) -> str:
    """Text of an output field, without ANSI escape sequences (IPython's colours included), at most
    :data:`TEXT_CHARS` characters."""
    if isinstance(v, list):
        v = "".join(x for x in v if isinstance(x, str))
    return _ANSI.sub("", v[:TEXT_CHARS]).replace("\x1b", "") if isinstance(v, str) else ""


def clean_markdown(source: str) -> str:
    """A student's markdown as clean HTML on one line: rendered by nbconvert's markdown renderer (math kept as
    ``$…$`` text for MathJax), cleaned by :func:`nh3.clean` with :data:`URL_SCHEMES`, wrapped in one ``<div>``. Every
    line break becomes ``&#10;``, so that markdown reads the whole as one HTML block and never parses the cleaned
    text as markdown again (a code block holding ``[x](javascript:…)`` would become a link)."""
    import html as _html

    import nh3
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    try:  # (an image of the cell's attachments is one nbconvert looks up, and raises for when it is missing)
        rendered = markdown2html_mistune(re.sub(r"attachment:", "removed-attachment:", source))
    except Exception:  # noqa: BLE001  (whatever else nbconvert cannot render: the text is still the answer)
        rendered = "<pre>" + _html.escape(source) + "</pre>"
    clean = nh3.clean(rendered, url_schemes=URL_SCHEMES, attribute_filter=_absolute_urls_only)
    return "<div>" + clean.strip().replace("\r", "").replace("\n", "&#10;") + "</div>"


def _absolute_urls_only(tag: str, attribute: str, value: str) -> str | None:
    """nh3's attribute filter: a link keeps only an absolute ``http``, ``https`` or ``mailto`` URL, and no image keeps
    a source (its ``alt`` text stays). A relative link goes: the formgrade template strips a leading ``files/`` from
    every link (``files/javascript:…`` would become ``javascript:…``); an image is fetched as the page opens, with
    the instructor's cookies (``/logout``) or as a beacon to the student's server."""
    if attribute in ("src", "srcset", "longdesc", "poster", "background", "action", "formaction"):
        return None
    if attribute in ("href", "cite"):
        v = value.strip().lower()
        return value if v.startswith(("http://", "https://", "mailto:")) else None
    return value


def release_markdown(release: Path | None, aid: str, kind: str = "markdown") -> set[str] | None:
    """The sources of the ``kind`` cells (markdown, or raw) of ``release/<aid>/<aid>.ipynb``, or None when there is no
    such notebook."""
    import nbformat

    path = None if release is None else Path(release) / aid / f"{aid}.ipynb"
    if path is None or not path.is_file():
        return None
    nb = nbformat.read(path, as_version=4)
    return {c.source for c in nb.cells if c.cell_type == kind}


class InertOutputs(NbGraderPreprocessor):
    """In the autograde pipeline after coursekit.guard.ScoreAnswers: every output, student markdown cell and raw cell
    of the notebook in an inert form (the module's docstring says which). The lesson's own markdown (a cell whose
    source is one of the release notebook's, :attr:`release_directory`) is kept as it is; without a release notebook
    every markdown cell is cleaned."""

    release_directory = Unicode("", help="The course's release folder (lessons/): markdown cells whose source is "
                                          "the release notebook's are the lesson's own, and kept.").tag(config=True)

    def preprocess(self, nb, resources):
        info = resources.get("nbgrader") or {}
        aid = str(info.get("assignment") or "")
        release = Path(self.release_directory) if self.release_directory else None
        ours = release_markdown(release, aid) if aid else None
        ours_raw = release_markdown(release, aid, kind="raw") if aid else None
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = [inert_output(o) for o in cell.get("outputs", []) if isinstance(o, dict)]
            elif cell.cell_type == "markdown":
                if ours is None or cell.source not in ours:
                    cell.source = clean_markdown(cell.source)
                    cell.pop("attachments", None)
            elif cell.cell_type == "raw" and (ours_raw is None or cell.source not in ours_raw):
                # nbconvert pastes a raw cell into the page (its default raw_mimetypes include ""), where an element
                # with a grade widget's id would take the instructor's clicks: it becomes its text, shown as code
                cell.cell_type = "markdown"
                cell.source = clean_markdown("```text\n" + cell.source.replace("```", "`\u200b``") + "\n```")
                for key in ("raw_mimetype", "format"):
                    cell.metadata.pop(key, None)
                cell.pop("attachments", None)
        return nb, resources


__all__ = ["INERT_MIME", "URL_SCHEMES", "InertOutputs", "clean_markdown", "inert_output", "release_markdown"]
