"""No answer key and no hidden-case seed can be read from what a student gets: the release notebooks
(lessons/), the installed coursekit package, the feedback of a graded class, and the course's web book
(`make book`: every HTML and text file of the built site). Feedback reports
hidden cases' outcomes, never the generator of their inputs.

The keys of the items that count, the hints that explain their wrong choices and the seeds live in the
instructor's folder (autograder/keys/NN.json, read through $COURSEKIT_KEYS); the package ships none of them
and cannot read them on its own, so a student's machine records those choice answers without scoring them
(no oracle to try letters against). Warm-ups are the exception by design: worth 0 points, they ship their
keys and an explanation of every option, and say at once whether an answer is right. Every key of every lesson (choice and ordering keys, and the int ``"seed"`` of the
hidden cases) is searched in the forms it would take if it leaked: the key table
(``"w1": "b"``, ``answer_w1 = "b"``, ``"seed": 1234``), the seed as a bare number, an ordering as a list
literal. The last tests plant keys in copies and check that the scan finds them, so a scan that
silently stops matching fails too."""

from __future__ import annotations

import html
import importlib.metadata
import inspect
import json
import re
import shutil
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

import coursekit
from coursekit import course
from coursekit.grading import Function, lesson_items
from coursekit.grading import keys as keymod
from graded_examples import feedback_files, graded_example_class

ROOT = Path(__file__).resolve().parents[1]
LESSONS = course.lesson_ids(ROOT)
KEY_FILES = {lid[:2]: keymod.load(lid[:2]) for lid in LESSONS}  # tests/conftest.py points $COURSEKIT_KEYS at autograder/keys


def _flat(data: dict) -> dict:
    """item → key (an ordering with several right orders: its main order) plus "seed"."""
    out = {i: (k["order"] if isinstance(k, dict) else k) for i, k in data["keys"].items()}
    return {**out, "seed": data["seed"]}


KEYS = {num: _flat(d) for num, d in KEY_FILES.items()}
FEEDBACK_LESSON = "02-lora-inside-one-matmul"  # a cheap lesson with three Function items with hidden cases

Pattern = tuple[str, re.Pattern]  # (what it finds, regex)


# --------------------------------------------------------------------------- what a leak looks like


def seed_pattern(num: str) -> Pattern:
    """The seed as a number of its own: not part of a longer number, a decimal or a base64 word."""
    seed = KEYS[num]["seed"]
    return f"lesson {num}'s hidden-case seed", re.compile(rf"(?<![\w.]){seed}(?!\w|\.\d)")


def _literal(value) -> str:
    """A regex for ``value`` written as Python/JSON source: "b", 'b', ["a", "c"], ('a','c'), {"a", "c"}."""
    if isinstance(value, str):
        return rf"[\"']{re.escape(value)}[\"']"
    items = r"\s*,\s*".join(rf"[\"']{re.escape(v)}[\"']" for v in value)
    return rf"[\[({{]\s*{items}\s*,?\s*[\])}}]"


def key_patterns(num: str) -> list[Pattern]:
    """Every choice/ordering key of lesson ``num`` next to its item id, as a table entry or an
    assignment (``"w1": "b"``, ``w1 = "b"``, ``answer_w1 = "b"``); an ordering of 3+ labels also as a
    bare list literal; plus the seed, bare and as ``"seed": N``."""
    out = [seed_pattern(num)]
    for item, value in KEYS[num].items():
        if item == "seed":
            continue
        lit = _literal(value)
        out.append((f"key of {num}.{item}", re.compile(rf"(?<![A-Za-z0-9]){re.escape(item)}[\"']?\s*[:=]\s*{lit}")))
        if isinstance(value, list) and len(value) >= 3:
            out.append((f"key of {num}.{item} (the list alone)", re.compile(lit)))
    return out


def scan(texts: Iterator[tuple[str, str]], patterns: list[Pattern]) -> list[str]:
    """'<where>: <what>' for every pattern found in every (where, text)."""
    found = (f"{where}: {what}" for where, text in texts for what, pat in patterns if pat.search(text))
    return list(dict.fromkeys(found))  # (the labels name a key, never its value: CI logs are read widely)


# --------------------------------------------------------------------------- what a student gets


def _strings(obj, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(obj, str):
        yield where, obj
    elif isinstance(obj, dict):
        yield where, json.dumps(obj)  # the structure too: {"w1": "b"} in metadata
        for k, v in obj.items():
            yield from _strings(k, where)
            yield from _strings(v, where)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v, where)


def notebook_texts(path: Path, label: str | None = None) -> Iterator[tuple[str, str]]:
    """Every cell's source, every output (text, data, tracebacks), every metadata dict of a notebook,
    unescaped from the JSON: the whole notebook as a student's tools would show it."""
    nb = json.loads(path.read_text())
    label = label or str(path.relative_to(ROOT))
    yield from _strings(nb.get("metadata", {}), f"{label} (notebook metadata)")
    for i, cell in enumerate(nb["cells"]):
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        yield f"{label} cell {i} source", src
        yield from _strings(cell.get("metadata", {}), f"{label} cell {i} metadata")
        for j, out in enumerate(cell.get("outputs", [])):
            flat = {k: "".join(v) if isinstance(v, list) and all(isinstance(s, str) for s in v) else v for k, v in out.items()}
            yield from _strings(flat, f"{label} cell {i} output {j}")
            yield f"{label} cell {i} output {j}", json.dumps(out.get("data", {}))


def lessons_texts() -> Iterator[tuple[str, str]]:
    """Every file under lessons/: notebooks cell by cell, anything else as text."""
    for p in sorted((ROOT / "lessons").rglob("*")):
        if p.is_file() and ".ipynb_checkpoints" not in p.parts:
            if p.suffix == ".ipynb":
                yield from notebook_texts(p)
            else:
                yield str(p.relative_to(ROOT)), p.read_bytes().decode("utf-8", "replace")


def installed_package_files() -> list[Path]:
    """Every file of the coursekit that Python imports (the package folder, key files included) and
    of its installed distribution (dist-info, an editable install's finder and .pth), bytecode aside."""
    pkg = Path(coursekit.__file__).resolve().parent
    files = {p for p in pkg.rglob("*") if p.is_file() and p.suffix != ".pyc"}
    for f in importlib.metadata.files("coursekit") or []:
        p = Path(f.locate()).resolve()
        installed = (p.is_relative_to(pkg) or any(part.endswith((".dist-info", ".egg-info")) for part in p.parts)
                     or p.suffix == ".pth" or p.name.startswith("__editable__"))  # not an sdist's SOURCES
        if installed and p.is_file() and p.suffix != ".pyc":
            files.add(p)
    return sorted(files)


def package_texts() -> Iterator[tuple[str, str]]:
    for p in installed_package_files():
        yield str(p), p.read_bytes().decode("utf-8", "replace")


def feedback_texts(path: Path, label: str) -> Iterator[tuple[str, str]]:
    """A feedback page as the student reads it: the HTML with its entities decoded, and its text
    without tags (nbconvert splits highlighted source into one <span> per token)."""
    raw = html.unescape(path.read_text())
    yield label, raw
    yield label, html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def hidden_generator_sources(num: str) -> dict[str, str]:
    """name → source of every hidden-case generator of lesson ``num``'s Function items, and of the
    functions of the same module they call (the random case builders)."""
    out: dict[str, str] = {}

    def add(fn) -> None:
        if not inspect.isfunction(fn) or fn.__name__ in out or fn.__name__ == "<lambda>":
            return
        out[fn.__name__] = inspect.getsource(fn)
        mod = inspect.getmodule(fn)
        for name in names(fn.__code__):
            g = getattr(mod, name, None)
            if inspect.isfunction(g) and g.__module__ == fn.__module__:
                add(g)

    def names(code) -> set[str]:  # globals used, comprehensions' and lambdas' code included
        return set(code.co_names).union(*(names(c) for c in code.co_consts if inspect.iscode(c)))

    for item in lesson_items(num).values():
        if isinstance(item, Function):
            add(item.hidden)
    return out


def source_line_patterns(sources: dict[str, str]) -> list[Pattern]:
    """Each distinctive line of the generators' source (20+ characters: the signature, a return, a
    draw from ``rng``), whitespace-tolerant: a traceback or a repr quoting one line of a generator
    gives away how hidden inputs are drawn. (Lines like ``lora_alpha=lora_alpha,`` are left out: a
    student's own code may hold them.)"""
    pats = []
    for name, src in sources.items():
        for line in textwrap.dedent(src).splitlines():
            line = line.split("  #")[0].strip()
            if len(line) >= 20 and (line.startswith(("def ", "return ")) or "rng" in line):
                rx = r"\s*".join(re.escape(tok) for tok in line.split())
                pats.append((f"source of {name}: {line!r}", re.compile(rx)))
    return pats


# --------------------------------------------------------------------------- the scans


def test_every_lesson_has_keys_with_a_seed():
    for num, key in KEYS.items():
        assert isinstance(key.get("seed"), int) and key["seed"] > 0, f"lesson {num}: the key file needs an int 'seed'"
        assert len(key) > 1, f"lesson {num}: a key file with a seed only"
    assert sorted(KEYS) == sorted(p.stem for p in (ROOT / "autograder" / "keys").glob("*.json"))


@pytest.mark.parametrize("lid", LESSONS)
def test_release_notebook_holds_no_key(lid):
    """The lesson's own keys, and every lesson's seed, in no cell source, output or metadata."""
    num = lid[:2]
    pats = key_patterns(num) + [seed_pattern(n) for n in KEYS if n != num]
    found = scan(notebook_texts(ROOT / "lessons" / lid / f"{lid}.ipynb"), pats)
    assert not found, "answer keys readable from the release:\n" + "\n".join(found)


def test_lessons_folder_holds_no_key():
    """Anything else under lessons/ (data files, copies, checkpoints left in place) holds no key either."""
    pats = [p for num in KEYS for p in key_patterns(num)]
    found = scan(((w, t) for w, t in lessons_texts() if not w.endswith(".ipynb") and ".ipynb " not in w), pats)
    assert not found, "\n".join(found)


def book_texts(html_dir: Path) -> Iterator[tuple[str, str]]:
    """Every page and text file of the built web book as a reader gets it: HTML unescaped, and its text without tags
    (as feedback pages are read); the search index and the other text files as they are. MathJax's own files (a
    third-party copy, shipped as is by sphinx-mathjax-offline) are left out."""
    for p in sorted(html_dir.rglob("*")):
        rel = p.relative_to(html_dir)
        if not p.is_file() or rel.parts[:2] == ("_static", "mathjax"):
            continue
        if p.suffix == ".html":
            yield from feedback_texts(p, f"book {rel}")
        elif p.suffix in (".js", ".txt", ".css", ".json", ".md", ".inv", ".ipynb", ".py"):
            yield f"book {rel}", p.read_bytes().decode("utf-8", "replace")


def _cell_text(cell) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def solution_patterns() -> list[Pattern]:
    """The model answers of solutions/ that the release does not hold: each line (25+ characters) of a code cell's
    ``### BEGIN SOLUTION`` part and of a free-text answer cell, and every line of a hidden-test part, absent from
    the lesson's release notebook (whitespace-tolerant; the release's ``# YOUR CODE HERE`` stands where they were)."""
    pats = []
    for lid in LESSONS:
        sol = json.loads((ROOT / "solutions" / lid / f"{lid}.ipynb").read_text())
        release = "\n".join(_cell_text(c) for c in json.loads((ROOT / "lessons" / lid / f"{lid}.ipynb").read_text())["cells"])
        for i, cell in enumerate(sol["cells"]):
            src, nbg = _cell_text(cell), cell.get("metadata", {}).get("nbgrader", {})
            parts = re.findall(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1", src, re.S)
            if cell["cell_type"] == "markdown" and nbg.get("solution"):
                parts.append(("SOLUTION", src))
            for kind, part in parts:
                for line in part.splitlines():
                    line = line.strip()
                    if (len(line) >= 25 or kind == "HIDDEN TESTS" and line) and line not in release:
                        rx = r"\s*".join(re.escape(tok) for tok in line.split())
                        pats.append((f"{lid} cell {i}: a line of its {kind.lower()}", re.compile(rx)))
    return pats


def _literal_piece(rx: re.Pattern) -> str | None:
    """The longest literal run of a pattern made of escaped text joined by whitespace (a solution or generator line):
    every match contains it. None for a pattern with any other regex syntax (a key's character classes)."""
    pieces = re.split(r"\\s[*+]", rx.pattern)
    if not all(re.fullmatch(r"(?:\\.|[^\\.^$*+?()[\]{}|])*", p) for p in pieces):
        return None
    return max((re.sub(r"\\(.)", r"\1", p) for p in pieces), key=len)


def _searcher(rx: re.Pattern):
    """``rx.search`` as a function that finds the same matches, faster for a pattern that opens with a negative
    lookbehind (a key or a seed: ``(?<![\\w.])1234``), which keeps Python's engine from jumping to the literal that
    follows: the rest is searched for, and each place it is found is tried with the whole pattern (a lookbehind sees
    the characters before ``pos``)."""
    m = re.match(r"\(\?<!(?:\\.|\[[^\]]*\]|[^()\\])*\)", rx.pattern)
    if not m:
        return rx.search
    rest = re.compile(rx.pattern[m.end():], rx.flags)

    def search(text: str):
        pos = 0
        while (c := rest.search(text, pos)) is not None:
            if (hit := rx.match(text, c.start())) is not None:
                return hit
            pos = c.start() + 1
        return None
    return search


def scan_with_prefilter(texts: list[tuple[str, str]], patterns: list[Pattern]) -> list[str]:
    """:func:`scan`'s result, faster (the site is megabytes of HTML, and the solution lines are hundreds of
    patterns): a pattern whose literal part is in none of a text's characters is not tried on it, and one that opens
    with a lookbehind is searched by :func:`_searcher`."""
    found = []
    for what, rx in patterns:
        lit, search = _literal_piece(rx), _searcher(rx)
        found += [f"{where}: {what}" for where, text in texts if (lit is None or lit in text) and search(text)]
    return list(dict.fromkeys(found))


def test_the_web_book_holds_no_key_hint_seed_solution_or_hidden_case(book):
    """The site `make book` builds (the release notebooks rendered, the guides, the search index): no counted key,
    choice hint or hidden-case seed of any lesson, no line of a solution or hidden test, and no line of a hidden-case
    generator. Warm-up keys ship with coursekit by design and are not in the notebooks either."""
    texts = list(book_texts(book["html"]))
    assert any(w.startswith("book lessons/05-") for w, _ in texts), f"the scan does not see the book's lessons: {book['html']}"
    code = solution_patterns() + [p for num in KEYS for p in source_line_patterns(hidden_generator_sources(num))]
    # A line the release notebooks hold themselves (a function's signature the student fills in, a common
    # `x = rng.standard_normal((T, d))` of a lesson's own demo) gives nothing away on the site either.
    release = "\n".join(text for lid in LESSONS for _, text in notebook_texts(ROOT / "lessons" / lid / f"{lid}.ipynb"))
    pats = [p for num in KEYS for p in key_patterns(num)] + hint_patterns() + [p for p in code if not p[1].search(release)]
    found = scan_with_prefilter(texts, pats)
    assert not found, "the web book gives away:\n" + "\n".join(found[:40])


def test_the_book_scan_finds_a_planted_solution_and_key(tmp_path):
    """The scan above, on a copy of one page with a solution line and a key planted in it: both are found."""
    sol_pats = solution_patterns()
    assert len(sol_pats) > 100, "the solution lines are not read"
    what, rx = sol_pats[0]
    planted = rx.pattern.replace("\\s*", " ").replace("\\", "")
    num, (item, value) = "02", next((i, v) for i, v in KEYS["02"].items() if i != "seed")
    page = tmp_path / "lessons" / "page.html"
    page.parent.mkdir()
    page.write_text(f"<p>{html.escape(planted)}</p><pre>answer_{item} = {json.dumps(value)}</pre>")
    found = scan_with_prefilter(list(book_texts(tmp_path)), sol_pats + key_patterns(num))
    assert _literal_piece(rx) and _literal_piece(key_patterns(num)[1][1]) is None
    assert any(what in f for f in found), (what, found)
    assert any(f"key of {num}.{item}" in f for f in found), found


def test_installed_package_holds_no_key():
    """No key file ships in the package, and no key, seed or choice hint is in any of its files."""
    files = installed_package_files()
    pkg = Path(coursekit.__file__).resolve().parent
    assert any(p.name == "keys.py" for p in files), f"the scan does not see the package's files: {pkg}"
    assert not [p for p in files if p.suffix in (".key", ".json") and "grading" in p.parts], "key files in the package"
    pats = [p for num in KEYS for p in key_patterns(num)] + hint_patterns()
    found = scan(package_texts(), pats)
    assert not found, "answer keys readable in the installed package:\n" + "\n".join(found)


def hint_patterns() -> list[Pattern]:
    """Every hint of a wrong choice, whole (whitespace-tolerant): which options have one would name the key."""
    return [(f"the hint of {num}.{item} ({opt})", re.compile(r"\s+".join(re.escape(w) for w in text.split())))
            for num, d in KEY_FILES.items() for item, hs in d["hints"].items() for opt, text in hs.items() if len(text) >= 40]


def test_release_notebooks_hold_no_choice_hint():
    found = scan((t for lid in LESSONS for t in notebook_texts(ROOT / "lessons" / lid / f"{lid}.ipynb")), hint_patterns())
    assert not found, "\n".join(found)


def test_the_package_alone_cannot_read_a_key(monkeypatch, tmp_path):
    """Without $COURSEKIT_KEYS and outside the course repository (a student's kernel, or the grading kernel) no key
    can be loaded, and no hidden case can be drawn unless the grader handed the kernel the lesson's seed."""
    monkeypatch.delenv(keymod.ENV, raising=False)
    monkeypatch.setattr(keymod, "REPOSITORY", tmp_path)  # an installed package: no repository around it
    monkeypatch.delenv(keymod.SEED_ENV, raising=False)
    with pytest.raises(keymod.KeysUnavailable, match="COURSEKIT_KEYS"):
        keymod.load("02")
    from coursekit.grading import check

    with pytest.raises(keymod.KeysUnavailable):
        check("02.p1", lambda **kw: 0, hidden=True)


@pytest.mark.parametrize("num", sorted(KEYS))
def test_a_student_machine_records_choices_without_an_oracle(num, monkeypatch, capsys, tmp_path):
    """While a student works, every option of every keyed item gets the same answer (recorded, 0 points),
    so trying the letters one by one reveals nothing; a malformed answer is still told what form to use."""
    from coursekit.grading import Choice, Ordering, grade

    monkeypatch.delenv(keymod.ENV, raising=False)
    monkeypatch.setattr(keymod, "REPOSITORY", tmp_path)  # a student's machine: the lessons, no course repository
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    for item_id, item in lesson_items(num).items():
        if isinstance(item, Choice) and item.formative:
            continue  # a warm-up: its key ships on purpose (test_warm_ups_are_formative_and_explain_every_option)
        if isinstance(item, Choice):
            tries = [[o] if item.multi else o for o in item.options]
        elif isinstance(item, Ordering):
            tries = [sorted(item.labels), sorted(item.labels, reverse=True)]
        else:
            continue
        outs = []
        for t in tries:
            assert grade(f"{num}.{item_id}", t) is None  # nothing to score here, and no 0.0 that reads like a grade
            outs.append(capsys.readouterr().out.replace(repr(t), "<answer>"))
        assert len(set(outs)) == 1 and "Recorded" in outs[0], f"{num}.{item_id}: answers differ without a key:\n" + "\n".join(outs)
        grade(f"{num}.{item_id}", 42)
        assert "Recorded" not in capsys.readouterr().out, f"{num}.{item_id}: a malformed answer was recorded"


@pytest.mark.parametrize("num", sorted(KEYS))
def test_warm_ups_are_formative_and_explain_every_option(num, monkeypatch, capsys):
    """Every warm-up is worth 0 points, and only warm-ups ship a key. On a student's machine (no keys) a warm-up
    choice says right or not right at once, with the explanation of the option chosen; an item that counts
    never ships its key."""
    from coursekit.grading import Choice, grade

    monkeypatch.delenv(keymod.ENV, raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    items = lesson_items(num)
    assert any(i.startswith("w") for i in items), f"lesson {num} has no warm-up"
    for item_id, item in items.items():
        warm_up = item_id.startswith("w")
        assert (item.points == 0) == warm_up, f"{num}.{item_id}: warm-ups are worth 0 points, other items more"
        if not isinstance(item, Choice):
            continue
        assert item.formative == warm_up, f"{num}.{item_id}: {'a warm-up must ship' if warm_up else 'a counted item must not ship'} its key"
        if not warm_up:
            continue
        for option in item.options:
            grade(f"{num}.{item_id}", option)
            out = capsys.readouterr().out
            verdict = f"({option}) is right." if option == item.key else f"({option}) is not right."
            assert verdict in out and item.explain[option][:60] in out, f"{num}.{item_id} ({option}):\n{out}"
            assert "feedback only, 0 points" in out and "Recorded" not in out, out
        assert len({item.explain[o] for o in item.options}) == len(item.options), f"{num}.{item_id}: two options share an explanation"


def test_a_formative_choice_cannot_carry_points_or_leave_an_option_unexplained():
    from coursekit.grading import Choice

    every = {o: f"why {o}" for o in "abcd"}
    with pytest.raises(ValueError, match="0 points"):
        Choice("q", 1, key="b", explain=every)
    with pytest.raises(ValueError, match=r"missing \['d'\]"):
        Choice("q", 0, key="b", explain={o: every[o] for o in "abc"})
    with pytest.raises(ValueError, match="key file"):
        Choice("q", 1, explain=every)
    assert Choice("q", 0, key="b", explain=every).formative and not Choice("q", 1).formative


def test_orderings_list_their_labels_alphabetically():
    """The item table's label order is no hint to the answer's order."""
    from coursekit.grading import Ordering

    for num in KEYS:
        for item_id, item in lesson_items(num).items():
            if isinstance(item, Ordering):
                assert list(item.labels) == sorted(item.labels), f"{num}.{item_id}: labels not in alphabetical order"


def test_every_keyed_item_has_a_key():
    from coursekit.grading import key_problems

    assert key_problems() == []


def test_key_problems_names_a_missing_key(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "autograder" / "keys", tmp_path / "keys")
    data = json.loads((tmp_path / "keys" / "02.json").read_text())
    del data["keys"]["p6"]
    data["keys"]["zz"] = "a"
    data["keys"]["w1"] = "b"  # a warm-up ships its key: one in the instructor's file is a mistake too
    (tmp_path / "keys" / "02.json").write_text(json.dumps(data))
    monkeypatch.setenv(keymod.ENV, str(tmp_path / "keys"))
    from coursekit.grading import key_problems

    assert set(key_problems()) == {"02.p6: no key", "02.zz: a key for an item that needs none or does not exist",
                                   "02.w1: a key for an item that needs none or does not exist"}
    assert set(key_problems(["02"])) == set(key_problems()) and key_problems(["03"]) == []
    # grading refuses the lesson whose keys have problems, and only that one
    from coursekit import course

    with pytest.raises(course.CourseError, match="02.p6: no key"):
        course._require_keys(["02-lora-inside-one-matmul"])
    course._require_keys(["03-what-low-rank-restricts"])


def _hostile_students(lesson: str) -> set[str]:
    """Hostile or broken example students (expected.json's ``"hostile"``), which may stop every check (and so every
    hidden case) before it runs."""
    from graded_examples import HOSTILE

    return {sid for aid, sid in HOSTILE if aid == lesson}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return graded_example_class(tmp_path_factory, FEEDBACK_LESSON)


def test_feedback_shows_hidden_outcomes_not_their_generator(graded):
    """Every student's feedback reports hidden cases (the autograde run adds them) but holds neither
    the seed nor a line of the code that draws the hidden inputs; the blank student's holds no
    choice key (everything it shows comes from the grader, not from the student)."""
    num = FEEDBACK_LESSON[:2]
    sources = hidden_generator_sources(num)
    assert sources, f"lesson {num} has no Function item with hidden cases"
    files = feedback_files(graded, FEEDBACK_LESSON)
    assert {"ex-blank", "ex-perfect"} <= set(files)
    pats = [seed_pattern(num)] + source_line_patterns(sources)
    found = []
    for sid, path in sorted(files.items()):
        texts = list(feedback_texts(path, f"feedback of {sid}"))
        if sid != "ex-blank" and sid not in _hostile_students(FEEDBACK_LESSON):
            assert "hidden case" in texts[0][1], f"{sid}: the feedback does not report hidden cases"
        found += scan(iter(texts), pats)
        for name, src in sources.items():  # the whole function, as inspect.getsource gives it
            if any(src.strip() in t for _, t in texts):
                found.append(f"feedback of {sid}: the whole of {name}")
    found += scan(feedback_texts(files["ex-blank"], "feedback of ex-blank"), key_patterns(num))
    assert not found, "hidden inputs' generator or keys in the feedback:\n" + "\n".join(found)


# --------------------------------------------------------------------------- the scan finds a planted key


def test_scan_finds_keys_planted_in_a_release_notebook(tmp_path):
    """Plant keys in a copy of a release notebook (a source, an output, the metadata): each is found."""
    lid = FEEDBACK_LESSON
    num = lid[:2]
    item, value = next((k, v) for k, v in KEYS[num].items() if k != "seed")
    nb = json.loads((ROOT / "lessons" / lid / f"{lid}.ipynb").read_text())
    code = next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code")
    plants = {
        "source": lambda nb: nb["cells"][code].update(source=f"answer_{item} = {json.dumps(value)}\n"),
        "output": lambda nb: nb["cells"][code].update(outputs=[{"output_type": "stream", "name": "stdout",
                                                                "text": [json.dumps(KEYS[num]) + "\n"]}]),
        "metadata": lambda nb: nb["metadata"].update(answers={item: value}),
        "seed in a markdown cell": lambda nb: nb["cells"][0].update(source=f"hidden cases use seed {KEYS[num]['seed']}."),
    }
    assert not scan(notebook_texts(ROOT / "lessons" / lid / f"{lid}.ipynb"), key_patterns(num))
    for where, plant in plants.items():
        copy = json.loads(json.dumps(nb))
        plant(copy)
        path = tmp_path / f"{where}.ipynb"
        path.write_text(json.dumps(copy, indent=1))
        assert scan(notebook_texts(path, where), key_patterns(num)), f"a key planted in the {where} was not found"


def test_scan_finds_a_planted_key_in_the_package(tmp_path):
    """A plain key table copied into the package's folder, as a stray keys/02.json would be, is found."""
    num = FEEDBACK_LESSON[:2]
    path = tmp_path / f"{num}.json"
    path.write_text(json.dumps(KEYS[num], indent=2))
    found = scan(iter([(str(path), path.read_text())]), key_patterns(num))
    assert len(found) >= len(KEYS[num]), found  # the seed and every choice key
    path.write_text(json.dumps(KEY_FILES[num]["hints"], indent=4))
    assert scan(iter([(str(path), path.read_text())]), hint_patterns()), "a planted hint table was not found"


def test_scan_finds_a_generator_or_seed_planted_in_feedback(graded, tmp_path):
    """Plant the seed, a traceback line of a hidden generator, and a whole generator (HTML-escaped as
    nbconvert writes it) in copies of a real feedback page: each is found."""
    num = FEEDBACK_LESSON[:2]
    sources = hidden_generator_sources(num)
    page = feedback_files(graded, FEEDBACK_LESSON)["ex-blank"].read_text()
    name, src = next(iter(sources.items()))
    line = next(l.strip() for l in src.splitlines()[1:] if len(l.strip()) >= 20)
    plants = {
        "seed": f"<pre>rng = np.random.default_rng({KEYS[num]['seed']})</pre>",
        "traceback line": f'<pre>  File "lesson{num}.py", line 7, in {name}\n    {html.escape(line)}\n</pre>',
        "whole generator": "<pre>" + html.escape(src) + "</pre>",
        "key table": "<pre>" + html.escape(json.dumps({k: v for k, v in KEYS[num].items() if k != "seed"})) + "</pre>",
    }
    pats = [seed_pattern(num)] + source_line_patterns(sources) + key_patterns(num)
    assert not scan(feedback_texts(feedback_files(graded, FEEDBACK_LESSON)["ex-blank"], "clean"), pats)
    for what, snippet in plants.items():
        path = tmp_path / f"{what}.html"
        path.write_text(page.replace("</body>", snippet + "</body>", 1))
        assert scan(feedback_texts(path, what), pats), f"the {what} planted in feedback was not found"


def test_keys_command(capsys, monkeypatch):
    """`coursekit keys check|show` for instructors; a clear one-line error where no keys are."""
    from coursekit import cli

    assert cli.main(["keys", "check", "--root", str(ROOT)]) == 0
    assert "every keyed item has a key" in capsys.readouterr().out
    monkeypatch.delenv(keymod.ENV, raising=False)
    monkeypatch.chdir(ROOT / "lessons")  # a folder with no autograder/keys: what a student has
    assert cli.main(["keys", "show", "02"]) == 2
    err = capsys.readouterr().err
    assert "is not the course repository" in err and "--root" in err and "Traceback" not in err
    monkeypatch.setenv(keymod.ENV, str(ROOT / "lessons"))  # a folder without key files
    assert cli.main(["keys", "show", "2"]) == 2
    assert "no answer keys for lesson '02'" in capsys.readouterr().err


def test_a_grading_run_uses_the_keys_read_at_its_start(tmp_path, monkeypatch):
    """A submission's code that rewrites a key file mid-run changes neither its score nor a later student's,
    and the run reports the change (coursekit grade prints a warning)."""
    shutil.copytree(ROOT / "autograder" / "keys", tmp_path / "keys")
    monkeypatch.setenv(keymod.ENV, str(tmp_path / "keys"))
    right = keymod.load("02")["keys"]["p6"]
    keymod.freeze(["02"])
    try:
        forged = json.loads((tmp_path / "keys" / "02.json").read_text())
        forged["keys"]["p6"] = next(o for o in "abcd" if o != right)
        (tmp_path / "keys" / "02.json").write_text(json.dumps(forged))
        assert keymod.load("02")["keys"]["p6"] == right
    finally:
        changed = keymod.thaw()
    assert changed == [str(tmp_path / "keys" / "02.json")]
    assert keymod.load("02")["keys"]["p6"] != right  # after the run, the disk again
