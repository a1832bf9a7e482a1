"""Every lesson reads like a lesson: an opening with the time, the outcomes and the links to the glossary and the
notation page; a summary before Going further; relative links that resolve; and student-facing text that stands on
its own (no source articles called "seeds", no paths outside the repository).

Each lesson, solution and release, is its own test case, so a failure names the notebook to fix."""

from __future__ import annotations

import io
import ast
import re
import tokenize
from pathlib import Path

import nbformat
import pytest

from coursekit import course

ROOT = Path(__file__).resolve().parents[1]
LESSONS = course.lesson_ids(ROOT)
KINDS = ("solutions", "lessons")
PAGES = ("glossary.md", "notation.md")
CASES = [pytest.param(kind, lid, id=f"{kind}-{lid}") for kind in KINDS for lid in LESSONS]


def _nb(kind: str, lid: str):
    return nbformat.read(ROOT / kind / lid / f"{lid}.ipynb", as_version=4)


def _markdown(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "markdown"]


def _bullets_after(lines: list[str], start: int) -> int:
    """Number of list items (`- ` or `* `) right after line `start`, continuation lines allowed, up to a blank line."""
    n = 0
    for line in lines[start + 1:]:
        if not line.strip():
            break
        if re.match(r"[-*] \S", line):
            n += 1
        elif not (n and line.startswith("  ")):
            break
    return n


# ----------------------------------------------------------------------------------------------- opening and summary


@pytest.mark.parametrize("kind, lid", CASES)
def test_opening_has_time_outcomes_and_links(kind, lid):
    first = _markdown(_nb(kind, lid))[0]
    lines = first.splitlines()
    problems = []
    if not any(re.match(r"\*\*Time:\*\* \d+–\d+ (minutes|hours)", l) for l in lines):
        problems.append("no line starting with a time range, `**Time:** 60–90 minutes`: one figure hides how much "
                        "first-time students differ")
    starts = [i for i, l in enumerate(lines) if l.strip().startswith("**You will be able to**")]
    if not starts:
        problems.append("no `**You will be able to**` block")
    elif _bullets_after(lines, starts[0]) < 3:
        problems.append(f"`**You will be able to**` has {_bullets_after(lines, starts[0])} bullets, needs at least 3")
    for page in PAGES:
        if f"(../{page})" not in first:
            problems.append(f"no link to ../{page}")
    assert not problems, f"{kind}/{lid}, first markdown cell: " + "; ".join(problems)


@pytest.mark.parametrize("kind, lid", CASES)
def test_summary_before_going_further(kind, lid):
    cells = _nb(kind, lid).cells
    at = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Summary")]
    assert len(at) == 1, f"{kind}/{lid}: needs exactly one markdown cell that starts with `## Summary` (found {len(at)})"
    summary = cells[at[0]].source.split("## Going further")[0]      # Going further may follow in the same cell
    n = sum(1 for l in summary.splitlines() if re.match(r"[-*] \S", l))
    assert n >= 3, f"{kind}/{lid}: `## Summary` has {n} bullets, needs at least 3"
    further = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## Going further" in c.source]
    if further and further[0] != at[0]:
        assert further[0] == at[0] + 1 and cells[further[0]].source.startswith("## Going further"), (
            f"{kind}/{lid}: `## Summary` must come right before `## Going further`")
    else:
        assert at[0] == len(cells) - 1 or all(c.cell_type != "markdown" for c in cells[at[0] + 1:]), (
            f"{kind}/{lid}: without Going further, `## Summary` closes the lesson")


# ----------------------------------------------------------------------------------------------------------- links

LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def _relative_links(text: str) -> list[str]:
    links = LINK.findall(CODE_SPAN.sub("", text))
    return [l for l in links if not re.match(r"[a-z][a-z0-9+.-]*:", l, re.I) and not l.startswith("#")]


def test_glossary_and_notation_pages_exist():
    for page in PAGES:
        p = ROOT / "lessons" / page
        assert p.is_file() and p.read_text().strip(), f"lessons/{page} is missing or empty"


@pytest.mark.parametrize("kind, lid", CASES)
def test_relative_links_resolve(kind, lid):
    """Links resolve from where the student opens the notebook: lessons/<lid>/ (a solution is released there)."""
    base = ROOT / "lessons" / lid
    broken = [l for md in _markdown(_nb(kind, lid)) for l in _relative_links(md)
              if not (base / l.split("#")[0]).resolve().exists()]
    assert not broken, f"{kind}/{lid}: relative links that resolve to no file: {broken}"


@pytest.mark.parametrize("page", PAGES)
def test_page_links_resolve(page):
    p = ROOT / "lessons" / page
    broken = [l for l in _relative_links(p.read_text()) if not (p.parent / l.split("#")[0]).resolve().exists()]
    assert not broken, f"lessons/{page}: relative links that resolve to no file: {broken}"


# --------------------------------------------------------------------------------------- no "seed" as a source article

SEED = re.compile(r"\bseeds?\b(?:'s|')?", re.I)
ALLOWED_BEFORE = re.compile(r"(?:random|random-number|hidden-case)[ -]$", re.I)
ALLOWED_AFTER = re.compile(r"\s*=|\(")


def article_seeds(text: str) -> list[str]:
    """Uses of "seed" that are not a random-number seed: "the seed", "seed 002", "the seeds'", "seed's" are found;
    "random seed", "seed=0", "seed(1)", "hidden-case seed" and identifiers such as `manual_seed` are not."""
    found = []
    for m in SEED.finditer(text):
        before, after = text[max(0, m.start() - 20):m.start()], text[m.end():]
        if ALLOWED_BEFORE.search(before) or ALLOWED_AFTER.match(after):
            continue
        found.append(text[max(0, m.start() - 30):m.end() + 30].replace("\n", " "))
    return found


def student_text_of_code(source: str) -> list[str]:
    """The comments and string literals of a code cell (what a student reads there)."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return [l.split("#", 1)[1] for l in source.splitlines() if "#" in l]
    return [t.string for t in toks if t.type in (tokenize.COMMENT, tokenize.STRING)]


def test_the_seed_rule():
    caught = ["the seed says so", "as in seed 002, section 3", "the seeds' authors", "the seed's claim",
              "- Seed: an article", "Seeds: two articles"]
    allowed = ["a random seed of 0", "default_rng(seed=0)", "make_case(n, seed = 3)", "torch.manual_seed(0)",
               "the hidden-case seed", "random-number seed 7", "np.random.seed(1)", "seeded"]
    assert all(article_seeds(t) for t in caught), [t for t in caught if not article_seeds(t)]
    assert not any(article_seeds(t) for t in allowed), [t for t in allowed if article_seeds(t)]


@pytest.mark.parametrize("kind, lid", CASES)
def test_no_seed_in_the_article_sense(kind, lid):
    found = []
    for i, c in enumerate(_nb(kind, lid).cells):
        texts = [CODE_SPAN.sub("", c.source)] if c.cell_type == "markdown" else student_text_of_code(c.source)
        found += [f"cell {i}: …{hit}…" for t in texts for hit in article_seeds(t)]
    assert not found, f"{kind}/{lid} calls a source article a seed; cite the published work instead:\n" + "\n".join(found)


@pytest.mark.parametrize("path", [f"lessons/{p}" for p in PAGES] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")))
def test_no_seed_in_pages_and_docs(path):
    found = article_seeds(CODE_SPAN.sub("", (ROOT / path).read_text()))
    assert not found, f"{path} calls a source article a seed:\n" + "\n".join(found)


# ------------------------------------------------------------------------------- no paths outside the repository

OUTSIDE = re.compile(r"\.\./shared|/work/|DESIGN\.md|seeds/", re.I)


def _text_files(top: Path):
    files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
    for p in files:
        if "__pycache__" in p.parts or ".ipynb_checkpoints" in p.parts:
            continue
        try:
            yield p, p.read_text(encoding="utf-8")
        except UnicodeDecodeError:                     # binary data: no prose to read
            continue


@pytest.mark.parametrize("top", ["lessons", "docs", "coursekit", "README.md"])
def test_no_reference_outside_the_repository(top):
    found = [f"{p.relative_to(ROOT)}: …{text[max(0, m.start() - 40):m.end() + 20]!r}…"
             for p, text in _text_files(ROOT / top) for m in OUTSIDE.finditer(text)]
    assert not found, "references to material outside the repository:\n" + "\n".join(found)


# ------------------------------------------------------------------------------------ a check the student can see

#: Words of a sentence that says a comparison came out right. Printed as a constant, such a sentence is a claim: the
#: comparison it names sits in a cell the release drops (``assert-numbers``) or nowhere.
_AGREEMENT = re.compile(r"\b(agrees?|agreement|matches|equals|identical|checked above|checks both)\b", re.I)


def _constant_prints(source: str) -> list[str]:
    """The string constants a code cell prints as they are (a plain literal, not an f-string that shows a value)."""
    out = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return out
    for i, tok in enumerate(tokens[:-3]):
        if tok.string == "print" and tokens[i + 1].string == "(" and tokens[i + 2].type == tokenize.STRING:
            literal, after = tokens[i + 2].string, tokens[i + 3].string
            if not re.match(r"[rRbBuU]*[fF]", literal) and after == ")":
                out.append(literal)
    return out


@pytest.mark.parametrize("lid", LESSONS)
def test_an_announced_comparison_prints_its_evidence(lid):
    """In the student's notebook a cell never prints a constant sentence saying that two things agree, and the prose
    never says a check was made above or in the cell: the comparison itself prints (its largest difference, or its
    result), since the cells holding the course's own assertions are not in the release."""
    nb = _nb("lessons", lid)
    claims = [f"cell {i + 1}: print({lit})" for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for lit in _constant_prints(c.source) if _AGREEMENT.search(lit)]
    claims += [f"cell {i + 1}: {m.group(0)!r}" for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
               for m in re.finditer(r"\((?:checked|verified) above\)|the cell checks both", c.source, re.I)]
    assert not claims, "\n".join(claims)


def _only_assertions(stmt: ast.stmt) -> bool:
    """Whether a statement only asserts: ``assert``, a call of an ``assert…`` function (np.testing.assert_allclose), or
    a loop or ``with`` block made of those. An assignment, a print or a plot computes something the student never sees."""
    if isinstance(stmt, ast.Assert):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return ast.unparse(stmt.value.func).split(".")[-1].startswith("assert")
    if isinstance(stmt, (ast.For, ast.With)):
        return all(_only_assertions(s) for s in stmt.body) and not getattr(stmt, "orelse", [])
    return False


@pytest.mark.parametrize("lid", LESSONS)
def test_a_dropped_cell_holds_only_assertions(lid):
    """The release drops ``assert-numbers`` cells, so such a cell may only pin numbers that a cell before it computed and
    printed: no assignment, print, figure or computation of its own (the student's notebook would silently lack it)."""
    nb = _nb("solutions", lid)
    wrong = []
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code" and "assert-numbers" in c.metadata.get("tags", []):
            wrong += [f"cell {i + 1}: {ast.unparse(s)[:100]}" for s in ast.parse(c.source).body if not _only_assertions(s)]
    assert not wrong, "an assert-numbers cell does more than assert:\n" + "\n".join(wrong)


# ----------------------------------------------------------------------------------------------- grading machinery

# How the course is graded is said once, in lesson 00. Elsewhere these words belong to the grading machinery, not to a
# lesson's subject (lesson 19's RECOMPUTE is the student's own switch; "recompute" in lessons 16-17 is checkpointing).
GRADING_WORDS = re.compile(r"nbgrader|autograd(?:e|er|ers|ing)\b|hidden (?:test )?cases?|the grader\b|answer keys?\b|"
                           r"COURSEKIT_KEYS|capstone store|fingerprint of the (?:notebook|run)|formgrader", re.I)


@pytest.mark.parametrize("kind, lid", [c for c in CASES if not c.values[1].startswith("00")])
def test_grading_machinery_is_explained_once_in_lesson_00(kind, lid):
    """The grading boilerplate used to open every lesson; now lesson 00 says it once and no other lesson's prose
    (markdown cells, the student's reading) mentions nbgrader, the autograder, hidden cases or the answer keys."""
    found = [(i, m.group(0)) for i, text in enumerate(_markdown(_nb(kind, lid))) for m in GRADING_WORDS.finditer(text)]
    assert not found, f"grading machinery in {lid}'s prose (markdown cell, word): {found}; lesson 00 explains it once"


def test_lesson_00_explains_the_grading_once():
    words = {m.group(0).lower() for text in _markdown(_nb("lessons", LESSONS[0])) for m in GRADING_WORDS.finditer(text)}
    assert words & {"autograder", "nbgrader"}, f"lesson 00 no longer explains how the course is graded: {words}"
