"""nbgrader preprocessors that keep one hostile notebook from forging a score or stopping the grader.

``autograder/nbgrader_config.py`` puts them in nbgrader's autograde pipeline:

- :class:`GuardedExecute` (in place of nbgrader's ``Execute``): an answer cell gets ``answer_timeout``
  seconds (default 60), other cells nbgrader's ``timeout``; a cell that runs past its limit is
  interrupted, marked with a plain-words error and the notebook goes on. A notebook that stops its
  kernel (``sys.exit`` in IPython is harmless, but ``os._exit``, ``quit()``, killing the process)
  keeps the scores of the cells that ran before; the cell that stopped the kernel and every later
  cell get an error output saying so, so their tests score 0 (nbgrader would otherwise fail the whole
  submission, or, for a cell left without output, give full marks).
- :class:`TamperScan` (after execution, before nbgrader saves the scores): reads the answer cells'
  code (Python's ``ast``) for changes to coursekit or to the machinery under it (assigning to a
  coursekit attribute, ``setattr`` on it, writing ``sys.modules``, ``builtins``, ``importlib.reload``,
  profile/trace hooks, swapping a function's ``__code__``). Every autograded test cell after the
  first such answer cell scores 0, with an error output naming the cell, the line and what it does.

- :class:`ScoreKeyed` (after execution): the kernel that runs a student's code never holds the answer
  keys (:class:`GuardedExecute` starts it without ``$COURSEKIT_KEYS``, with only the lesson's
  hidden-case seed in ``$COURSEKIT_SEED``), so a choice, ordering or keyed-number check there only
  records the answer in a marked line. This preprocessor, in the grading process, scores each
  recorded answer against the instructor's key and writes the feedback and points into the test
  cell's output. A notebook cannot read a key it was never given, nor score itself by printing a
  marker: the marker only carries an answer, and only the one printed by the locked test cell counts.

At run time, :func:`coursekit.grading.grade` refuses to score when a coursekit function (or numpy's,
torch's, builtins') was replaced by notebook code, and ``check_function`` fails a case whose function
calls coursekit's reference code. The static scan covers the one thing the kernel cannot see from
inside: ``grade`` itself replaced by a forgery.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import time
from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from traitlets import Dict, Integer

from nbgrader.preprocessors import Execute, NbGraderPreprocessor


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _cell_name(cell, index: int) -> str:
    gid = _nbg(cell).get("grade_id")
    return f"cell {index + 1} ({gid})" if gid else f"cell {index + 1}"


def _error(ename: str, text: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=text, traceback=[f"{ename}: {text}"])


class GuardedExecute(Execute):
    """nbgrader's Execute, with a short limit for answer cells and a notebook that survives its kernel's death."""

    answer_timeout = Integer(60, help="Seconds an answer (solution) cell may run; 0 or less: nbgrader's timeout.").tag(config=True)
    notebook_timeouts = Dict(
        {}, help="Notebook name → seconds for every cell of it (e.g. a capstone that trains in an answer cell)."
    ).tag(config=True)

    interrupt_grace = Integer(
        10, help="Seconds a timed-out cell's kernel gets to answer after the interrupt; if it does not, it is stopped."
    ).tag(config=True)

    _dead: tuple[str, str] | None = None
    _timed_out = False

    def preprocess(self, nb, resources=None, km=None):
        self._dead = None
        self._notebook = (resources or {}).get("unique_key", "")
        return super().preprocess(nb, resources, km)

    async def async_start_new_kernel(self, **kwargs):
        """Start the kernel without the answer keys: no ``$COURSEKIT_KEYS``, only this lesson's hidden-case
        seed (``$COURSEKIT_SEED``), which the function items need and which gives away no answer."""
        from coursekit.grading import keys

        env = dict(kwargs.pop("env", None) or os.environ)
        env.pop(keys.ENV, None)
        env.pop(keys.SEED_ENV, None)
        lesson = (self._notebook or "")[:2]
        if lesson.isdigit() and keys.available(lesson):
            env[keys.SEED_ENV] = str(keys.load(lesson)["seed"])
        return await super().async_start_new_kernel(env=env, **kwargs)

    start_new_kernel = run_sync(async_start_new_kernel)  # nbclient binds the sync face to its own coroutine

    def _get_timeout(self, cell):
        t = self.notebook_timeouts.get(self._notebook) if getattr(self, "_notebook", "") else None
        if t is None and cell is not None and _nbg(cell).get("solution") and self.answer_timeout > 0:
            t = min(self.answer_timeout, self.timeout or self.answer_timeout)
        if t is None:
            return super()._get_timeout(cell)
        return t if t > 0 else None

    async def _async_handle_timeout(self, timeout, cell=None):
        self._timed_out = True
        self.error_on_timeout = {
            "ename": "CellTimeoutError",
            "evalue": f"this cell was still running after {timeout} s and was stopped (an endless loop?). "
                      "The notebook went on without what the rest of this cell would have defined.",
            "traceback": [f"CellTimeoutError: this cell was still running after {timeout} s and was stopped (an endless loop?)."],
        }
        return await super()._async_handle_timeout(timeout, cell)

    def preprocess_cell(self, cell, resources, index):
        if self._dead is not None:
            if cell.cell_type == "code":
                where, how = self._dead
                cell.outputs = [_error("KernelStopped", f"not run: your notebook {how} at {where}, "
                                                        "so nothing after it ran (and its checks earn nothing).")]
            return cell, resources
        try:
            self._timed_out = False
            try:
                cell, resources = super().preprocess_cell(cell, resources, index)
                stuck = self._timed_out and not self._responsive()
            except CellTimeoutError:  # after the interrupt the kernel never went idle: nbgrader would fail the notebook
                stuck = True
            if stuck:
                where = _cell_name(cell, index)
                self._dead = (where, "kept running after it was interrupted (the kernel was stopped)")
                self.log.warning("%s of %s ignored the interrupt; stopping its kernel", where, self._notebook)
                cell.outputs = list(cell.get("outputs", [])) + [_error(
                    "KernelStopped", f"this cell ({where}) kept running after its time limit and an interrupt, so the grader "
                                     "stopped the Python kernel. Cells before it were graded; the cells after it earn nothing.")]
                try:
                    run_sync(self.km.shutdown_kernel)(now=True)
                except Exception:  # already gone
                    pass
            return cell, resources
        except DeadKernelError:
            where = _cell_name(cell, index)
            self._dead = (where, "stopped the Python kernel")
            self.log.warning("the kernel died in %s of %s; the later cells are marked as not run", where, self._notebook)
            cell.outputs = list(cell.get("outputs", [])) + [_error(
                "KernelStopped", f"your notebook stopped the Python kernel in this cell ({where}): os._exit, quit(), "
                                 "exit() or killing the process ends the notebook. Cells before it were graded; "
                                 "the cells after it could not run and earn nothing.")]
            return cell, resources


    def _responsive(self) -> bool:
        """Whether the kernel answers a kernel_info request within ``interrupt_grace`` seconds (a busy kernel cannot)."""
        kc, wait = self.kc, float(self.interrupt_grace)

        async def probe() -> bool:
            msg_id = kc.kernel_info()
            deadline = time.monotonic() + wait
            while (left := deadline - time.monotonic()) > 0:
                try:
                    msg = await kc.shell_channel.get_msg(timeout=left)
                except Exception:  # queue.Empty: no answer in time
                    return False
                if msg.get("parent_header", {}).get("msg_id") == msg_id:
                    return True
            return False

        try:
            return run_sync(probe)()
        except Exception:
            return False


class DropEmptyMetadata(NbGraderPreprocessor):
    """After nbgrader's DeduplicateIds: remove the empty ``nbgrader`` metadata it leaves on a duplicated cell.

    nbgrader 0.9.6's OverwriteCells (with ``add_missing_cells``) reads ``metadata.nbgrader.grade_id`` of
    every cell that has ``nbgrader`` metadata, and a duplicate's is ``{}``: KeyError, and the whole
    submission fails to grade. Without the empty dict the duplicate is an ordinary cell, as intended."""

    def preprocess_cell(self, cell, resources, index):
        md = cell.get("metadata", {})
        if "nbgrader" in md and not md["nbgrader"]:
            del md["nbgrader"]
        return cell, resources


# --------------------------------------------------------------------------- static scan


# The item tables hold how each expected value is computed; an answer cell has no business reading them.
_TABLES = ("coursekit.grading.lessons", "coursekit.grading.keys")
_TABLE_NAMES = {"lesson_items", "ITEMS", "key_problems", "keys", "lessons"}
# Strings that name where the instructor's answers live: the keys' folder and variable, the solutions.
_INSTRUCTOR_FILES = re.compile(r"COURSEKIT_KEYS|COURSEKIT_SEED|autograder[/\\]keys|(?:^|[/\\])keys[/\\]\d\d\.json|solutions[/\\]\d\d-", re.I)
_LOADERS = {"__import__", "import_module", "getattr", "vars", "reload", "get"}
_MUTATORS = {"update", "__setitem__", "setdefault", "pop", "popitem", "clear", "__delitem__", "__setattr__"}
_HOOKS = {("sys", "setprofile"), ("sys", "settrace"), ("threading", "setprofile"), ("threading", "settrace"),
          ("importlib", "reload"), ("gc", "get_referrers")}


def _root(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover
        return "?"


def scan_source(source: str, bound: set[str] | None = None) -> list[str]:
    """Findings (one plain sentence each, with the line number) for code that changes coursekit's grader
    or the machinery it runs on. ``bound``: names that earlier cells bound to coursekit objects (updated)."""
    bound = set() if bound is None else bound
    try:
        tree = ast.parse(source)
    except SyntaxError:
        try:  # IPython syntax (%magics, !shell) around Python: read the Python IPython would run
            from IPython.core.inputtransformer2 import TransformerManager

            tree = ast.parse(TransformerManager().transform_cell(source))
        except Exception:
            return []  # a syntax error: the cell fails on its own
    found: list[str] = []

    # A name a function assigns or takes as a parameter is that function's own (a local D shadows a D
    # an earlier cell bound to something of coursekit's).
    parent: dict = {}
    local: dict = {}
    for n in ast.walk(tree):
        for child in ast.iter_child_nodes(n):
            parent[child] = n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = n.args
            names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
            names |= {m.id for m in ast.walk(n) if isinstance(m, ast.Name) and isinstance(m.ctx, ast.Store)}
            local[n] = names

    def shadowed(node, name) -> bool:
        p = parent.get(node)
        while p is not None:
            if name in local.get(p, ()):
                return True
            p = parent.get(p)
        return False

    def ck(node) -> bool:  # an expression that reaches coursekit (or sys.modules / builtins)
        r = _root(node)
        text = _dotted(node)
        return ((r in bound and not shadowed(node, r)) or r in ("coursekit", "builtins", "__builtins__")
                or text.startswith("sys.modules"))

    def note(node, what: str) -> None:
        found.append(f"line {node.lineno}: `{_dotted(node)[:80]}` {what}")

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names = [] if isinstance(node, ast.Import) else [a.name for a in node.names]
            if any(m.startswith(_TABLES) for m in mods) or (mods[0].startswith("coursekit.grading") and set(names) & _TABLE_NAMES):
                note(node, "reads the grader's item tables (their expected values are the answers)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _INSTRUCTOR_FILES.search(node.value):
            found.append(f"line {node.lineno}: the string {node.value[:60]!r} reaches for the instructor's answer keys or solutions")
        elif isinstance(node, ast.Attribute) and node.attr in ("_keys", "_Context", "score_recorded", "_READS") and ck(node):
            note(node, "reaches into the grader's key handling")
        elif isinstance(node, ast.Attribute) and ck(node) and (
                node.attr in ("lesson_items", "ITEMS", "key_problems")
                or (node.attr in ("lessons", "keys") and "grading" in _dotted(node))):
            note(node, "reads the grader's item tables (their expected values are the answers)")
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("coursekit", "builtins"):
                    bound.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in ("coursekit", "builtins"):
                bound.update(a.asname or a.name for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if (isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Call) and _dotted(sub.value.func) in ("vars", "globals")
                            and sub.value.args and ck(sub.value.args[0])):
                        note(node, "replaces part of coursekit's grader through vars()")
                        break
                    if isinstance(sub, (ast.Attribute, ast.Subscript)) and ck(sub):
                        note(node, f"replaces {_dotted(sub)[:60]}, part of coursekit's grader or what it runs on")
                        break
                    if isinstance(sub, ast.Attribute) and sub.attr in ("__code__", "__globals__", "__defaults__", "__kwdefaults__"):
                        note(node, "swaps a function's code")
                        break
            value = getattr(node, "value", None)
            if value is not None and isinstance(node, ast.Assign):
                alias = isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)) and ck(value)  # g = coursekit.grading
                loader = (isinstance(value, ast.Call) and _dotted(value.func).split(".")[-1] in _LOADERS
                          and ("coursekit" in _dotted(value) or any(ck(a) for a in value.args)))  # g = __import__("coursekit…")
                if alias or loader:  # (what a coursekit function returns is data, not part of the grader)
                    bound.update(n.id for t in node.targets if isinstance(t, (ast.Name, ast.Tuple, ast.List))
                                 for n in ast.walk(t) if isinstance(n, ast.Name))  # x[i] = coursekit.y binds no name
        elif isinstance(node, ast.Call):
            f = node.func
            name = _dotted(f)
            if name in ("setattr", "delattr", "object.__setattr__", "vars") and node.args and ck(node.args[0]) and name != "vars":
                note(node, "changes part of coursekit's grader or what it runs on")
            elif isinstance(f, ast.Attribute) and f.attr in _MUTATORS and ck(f.value):
                note(node, "changes part of coursekit's grader or what it runs on")
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in _HOOKS:
                note(node, "hooks into the interpreter the grader runs in")
            elif name in ("exec", "eval", "compile") and any("coursekit" in _dotted(a) for a in node.args):
                note(node, "runs generated code that touches coursekit")
    return found


def student_writable(cell) -> bool:
    """A code cell whose source the student wrote or could have: answer cells, and cells added or left
    unlocked. Locked cells and test cells hold the instructor's source (nbgrader's OverwriteCells restores it)."""
    md = _nbg(cell)
    return cell.cell_type == "code" and (bool(md.get("solution")) or not (md.get("locked") or md.get("grade")))


class TamperScan(NbGraderPreprocessor):
    """Zero every autograded test cell after an answer cell that changes the grader (see module docstring)."""

    def preprocess(self, nb, resources):
        bound: set[str] = set()
        first = None
        for i, cell in enumerate(nb.cells):
            md = _nbg(cell)
            if student_writable(cell):
                found = scan_source(cell.source, bound)
                if found and first is None:
                    first = (_cell_name(cell, i), found)
                    cell.outputs = [_error("GraderTampering", f"this cell changes coursekit's grader: {found[0]}. "
                                                              "Every autograded check after it earns 0.")] + list(cell.get("outputs", []))
            elif first is not None and cell.cell_type == "code" and md.get("grade") and not md.get("solution"):
                where, found = first
                cell.outputs = [_error("GraderTampering", f"0 points: {where} changes coursekit's grader: {'; '.join(found[:3])}. "
                                                          "The checks after it cannot be trusted. Remove that code to be graded.")] \
                    + list(cell.get("outputs", []))
        if first is not None:
            self.log.warning("%s changes the grader: %s", first[0], "; ".join(first[1]))
        return nb, resources


_GRADE_CALL = re.compile(r"""\bgrade\(\s*["'](\d\d\.\w+)["']""")


def _result(text: str, points: float, count) -> list:
    return [NotebookNode(output_type="stream", name="stdout", text=text if text.endswith("\n") else text + "\n"),
            NotebookNode(output_type="execute_result", execution_count=count, metadata={}, data={"text/plain": repr(float(points))})]


def _number(outs) -> float | None:
    res = [o for o in outs if o.get("output_type") == "execute_result"]
    try:
        return float(res[-1].get("data", {}).get("text/plain", "")) if res else None
    except ValueError:
        return None


class ScoreKeyed(NbGraderPreprocessor):
    """Score the answers that keyed checks recorded in the kernel, and fail closed (see module docstring).

    For each test cell that is one ``grade("NN.item", ...)`` call and did not fail: a keyed item (choice,
    ordering, keyed number) needs exactly one recorded answer for itself, scored here against the key;
    any other item needs a finite number in [0, points] as the cell's result (nbgrader would give full
    marks for a cell without one) and must have run its hidden cases. Otherwise the cell scores 0 and
    its output says why."""

    def preprocess(self, nb, resources):
        from coursekit.grading import PUBLIC_ONLY_NOTE, RECORD_MARK, RECORDED_TAG, keyed, lesson_items, score_recorded

        for cell in nb.cells:
            md = _nbg(cell)
            if cell.cell_type != "code" or not md.get("grade") or md.get("solution"):
                continue
            calls = _GRADE_CALL.findall(cell.source)
            outs = list(cell.get("outputs", []))
            if len(calls) != 1 or any(o.get("output_type") == "error" for o in outs):
                continue  # not one check, or it failed (or TamperScan zeroed it): nbgrader scores it 0 anyway
            item_id = calls[0]
            lesson, item = item_id.split(".", 1)
            try:
                it = lesson_items(lesson)[item]
                title = f"[{item_id}] {it.title}"
                stdout = "".join(o.get("text", "") for o in outs if o.get("output_type") == "stream" and o.get("name") == "stdout")
                marks = [line[len(RECORD_MARK):] for line in stdout.splitlines() if line.startswith(RECORD_MARK)]
                shown = "".join(line for line in stdout.splitlines(keepends=True) if not line.startswith(RECORD_MARK))
                if keyed(it):
                    try:
                        rec = [json.loads(m) for m in marks]
                    except ValueError:
                        rec = [None]
                    if len(rec) == 1 and isinstance(rec[0], dict) and rec[0].get("item") == item_id and "answer" in rec[0]:
                        fb = score_recorded(item_id, rec[0]["answer"])
                        cell.outputs = _result(fb.text(title), fb.points, cell.get("execution_count"))
                        continue
                    if not rec and RECORDED_TAG not in shown and shown.strip():
                        cell.outputs = _result(shown, 0.0, cell.get("execution_count"))  # the check said why (e.g. the answer's form)
                        continue
                    why = ("no answer was recorded: the check did not run the way the autograder runs it "
                           "(did the notebook change its environment, its output or the grader?)" if not rec else
                           "more than one answer was recorded for this item (or a recorded answer was altered), so none counts")
                    keep = "".join(line for line in shown.splitlines(keepends=True) if "Recorded: " not in line and RECORDED_TAG not in line)
                    cell.outputs = _result(keep + f"{title}: 0 points\n  {why[0].upper() + why[1:]}. Leave the check cell as it is and give one answer.",
                                           0.0, cell.get("execution_count"))
                    continue
                got, points = _number(outs), float(md.get("points", 0) or 0)
                why = None
                if marks:
                    why = "a recorded answer appeared in a check that records none (printed by the notebook's own code)"
                elif got is None or not math.isfinite(got) or not 0 <= got <= points:
                    why = (f"the check's result is {'missing' if got is None else repr(got)}, not the points it earned "
                           "(did the notebook change how IPython shows results?)")
                elif PUBLIC_ONLY_NOTE in stdout:
                    why = "the hidden cases did not run: the notebook changed the environment the autograder runs it in"
                if why:
                    cell.outputs = _result(shown + f"{title}: 0 points\n  {why[0].upper() + why[1:]}.", 0.0, cell.get("execution_count"))
            except Exception as e:  # a broken check must not stop the grading of this notebook or of anyone else
                self.log.warning("could not score %s: %s", item_id, e)
                cell.outputs = _result(f"[{item_id}] 0 points\n  The grader could not score this check ({type(e).__name__}); "
                                       "the instructor has the log.", 0.0, cell.get("execution_count"))
        return nb, resources


__all__ = ["DropEmptyMetadata", "GuardedExecute", "ScoreKeyed", "TamperScan", "scan_source", "student_writable"]
