"""nbgrader preprocessors: the one trust boundary of autograding.

``autograder/nbgrader_config.py`` puts them in nbgrader's autograde pipeline:

- :class:`GuardedExecute` (in place of nbgrader's ``Execute``) runs the submission's kernel in a
  sandbox (coursekit.sandbox: bubblewrap; read-only environment; no course folder, keys, lesson sources
  or item tables; private /tmp and working folder of capped size; own PID namespace that dies with the
  grader; memory capped), started without the keys. An answer cell gets ``answer_timeout`` seconds
  (default 60), other cells nbgrader's ``timeout``; a cell past its limit is interrupted, and if it
  ignores that its kernel is killed from outside. A notebook that stops its kernel keeps the scores of
  the cells before; the later cells say why they earn nothing.
- :class:`ScoreAnswers` (after execution) scores every check here, in the grading process: a check
  cell's ``grade()`` call in the kernel only hands the answer over as a typed record (a value as data,
  a function pickled for the sandboxed runner, see coursekit.grading.remote). Whatever else the cell
  printed or returned is dropped; the cell's output becomes the feedback and the points.

Nothing a student writes runs where a score is decided: the kernel holds no key and no expected value,
and a function's outputs come from a sandboxed runner that holds neither.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from traitlets import Dict, Integer, List, Unicode

from nbgrader.preprocessors import Execute, NbGraderPreprocessor


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _cell_name(cell, index: int) -> str:
    gid = _nbg(cell).get("grade_id")
    return f"cell {index + 1} ({gid})" if gid else f"cell {index + 1}"


def _error(ename: str, text: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=text, traceback=[f"{ename}: {text}"])


#: Longest single wait on a kernel channel, in seconds (see :func:`poll_in_slices`).
POLL_SLICE_S = 1.0


def poll_in_slices(get_msg, slice_s: float = POLL_SLICE_S):
    """``get_msg`` (a jupyter_client async channel's) that never waits longer than ``slice_s`` at a time.

    nbclient waits for a cell's execute_reply with one ``shell_channel.get_msg(timeout=T)`` call, T being the cell's
    whole time limit. After a cell that opens ipywidgets comms (lesson 17's slider, lesson 06's step-through), that
    single wait sometimes does not wake when the reply arrives: the kernel sits idle and the grader waits the full
    T (40 minutes here) before calling the cell timed out (nbclient issue #312, "when cell contains ipywidget,
    execute cell will sometimes block", open; seen here grading lesson 17 in the test suite). Waiting in short
    slices asks the socket again every ``slice_s`` seconds, which finds a reply that is already there.
    Same contract as ``get_msg``: returns the message, or raises ``queue.Empty`` once ``timeout`` has passed.
    """
    from queue import Empty

    async def sliced(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            step = slice_s if left is None else max(0.0, min(slice_s, left))
            try:
                return await get_msg(timeout=step)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return sliced


class GuardedExecute(Execute):
    """nbgrader's Execute, with a short limit for answer cells and a notebook that survives its kernel's death."""

    answer_timeout = Integer(60, help="Seconds an answer (solution) cell may run; 0 or less: nbgrader's timeout.").tag(config=True)
    notebook_timeouts = Dict(
        {}, help="Notebook name → seconds for every cell of it (e.g. a capstone that trains in an answer cell)."
    ).tag(config=True)

    hidden_paths = List(Unicode(), help="Folders the sandboxed kernel must not see (the course folder, the lesson "
                                         "sources); the keys' folder and the course repository's are always hidden.").tag(config=True)

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

        from coursekit import sandbox

        env = sandbox.environment(kwargs.pop("env", None) or os.environ)
        env.pop(keys.ENV, None)
        if not sandbox.off():
            why = sandbox.problem()
            if why:
                raise RuntimeError(f"refusing to run a submission outside a sandbox: {why}. To grade without one "
                                   f"(not for credit), set {sandbox.ENV_OFF}=1 (coursekit grade --unsandboxed).")
            if self.km is None:
                self.create_kernel_manager()
            cwd = kwargs.get("cwd") or self.resources.get("metadata", {}).get("path") or os.getcwd()
            spec = self._sandbox_spec(Path(cwd))
            plain = self.km.format_kernel_cmd
            # In its own PID namespace the kernel's parent is the namespace's init (pid 1), which ipykernel's parent
            # poller would take for a dead parent; --die-with-parent does that job.
            km = self.km

            def wrapped(extra_arguments=None):
                spec.readable = [os.path.realpath(km.connection_file)]  # may sit in /tmp, which the sandbox replaces
                return sandbox.command(plain([*(extra_arguments or []), "--IPKernelApp.parent_handle=1"]), spec)

            km.format_kernel_cmd = wrapped
        return await super().async_start_new_kernel(env=env, **kwargs)

    def _sandbox_spec(self, cwd: Path):
        """The kernel's sandbox: its working folder private (the submission's files readable in it), and the
        course folder (gradebook, other students), the instructor's keys and the lesson sources hidden."""
        from coursekit import sandbox
        from coursekit.grading import keys

        hide = [Path(p).resolve() for p in (*self.hidden_paths, keys.key_dir()) if p]
        cwd = cwd.resolve()
        keep = sorted(cwd.iterdir()) if cwd.is_dir() else []
        # The item tables (how every expected value is computed) stay with the grading process: the kernel's
        # grade() only hands answers over.
        hide.append(Path(sandbox.PKG) / "grading" / "lessons")
        return sandbox.Spec(workdir=cwd, keep=keep, hide=[h for h in hide if h != cwd])

    start_new_kernel = run_sync(async_start_new_kernel)  # nbclient binds the sync face to its own coroutine

    async def async_start_new_kernel_client(self):
        """nbclient's kernel client, its shell and iopub waits cut into short slices (:func:`poll_in_slices`)."""
        kc = await super().async_start_new_kernel_client()
        for channel in (kc.shell_channel, kc.iopub_channel):
            channel.get_msg = poll_in_slices(channel.get_msg)
        return kc

    start_new_kernel_client = run_sync(async_start_new_kernel_client)

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


# --------------------------------------------------------------------------- scoring


_GRADE_CALL = re.compile(r"""\bgrade\(\s*["'](\d\d\.\w+)["']""")


def _result(text: str, points: float, count) -> list:
    return [NotebookNode(output_type="stream", name="stdout", text=text if text.endswith("\n") else text + "\n"),
            NotebookNode(output_type="execute_result", execution_count=count, metadata={}, data={"text/plain": repr(float(points))})]


def _records(outputs, item_id: str) -> list[dict]:
    from coursekit.protocol import MIME

    out = []
    for o in outputs:
        rec = o.get("data", {}).get(MIME) if o.get("output_type") in ("display_data", "execute_result") else None
        if isinstance(rec, dict) and rec.get("item") == item_id:
            out.append(rec)
    return out


class ScoreAnswers(NbGraderPreprocessor):
    """Score every check in the grading process; nothing the notebook printed or returned counts.

    A check cell (locked: nbgrader restored its source) is one ``grade("NN.item", answer)`` call. In the
    autograde run that call only hands the answer over, as a typed record (coursekit.protocol). Here each
    check cell's record is scored against the instructor's keys and the item's public and hidden cases (a
    function runs in a sandboxed runner, see coursekit.grading.remote), and the cell's outputs are replaced
    by the feedback and the points: whatever else the cell showed (a forged number, a second result) is
    dropped. No record, or more than one different record, scores 0 with the reason."""

    def preprocess(self, nb, resources):
        import json as _json

        from coursekit.grading import lesson_items, score_record

        for cell in nb.cells:
            md = _nbg(cell)
            if cell.cell_type != "code" or not md.get("grade") or md.get("solution"):
                continue
            calls = _GRADE_CALL.findall(cell.source)
            count = cell.get("execution_count")
            if len(calls) != 1:
                cell.outputs = _result("0 points: a check cell must be one grade(...) call; this one is not, so it "
                                       "cannot be scored.", 0.0, count)
                continue
            item_id = calls[0]
            outs = list(cell.get("outputs", []))
            try:
                lesson, item = item_id.split(".", 1)
                it = lesson_items(lesson)[item]
                title = f"[{item_id}] {it.title}"
                recs = {_json.dumps(r, sort_keys=True): r for r in _records(outs, item_id)}
                if len(recs) == 1:
                    fb = score_record(item_id, next(iter(recs.values())))
                    cell.outputs = _result(fb.text(title), min(max(fb.points, 0.0), float(it.points)), count)
                    continue
                errors = [o for o in outs if o.get("output_type") == "error"]
                if len(recs) > 1:
                    why = "more than one answer reached the grader for this item, so none counts. Give one answer."
                elif errors:
                    e = errors[0]
                    why = (f"the check did not run: {e.get('ename', 'Error')}: {str(e.get('evalue', ''))[:500]}")
                else:
                    why = "no answer reached the grader (did the notebook change how the check cell runs?)"
                cell.outputs = _result(f"{title}: 0 points\n  {why[0].upper() + why[1:]}", 0.0, count)
            except Exception as e:  # a broken check must not stop the grading of this notebook or of anyone else
                self.log.warning("could not score %s: %s", item_id, e, exc_info=True)
                cell.outputs = _result(f"[{item_id}] 0 points\n  The grader could not score this check ({type(e).__name__}); "
                                       "the instructor has the log.", 0.0, count)
        return nb, resources


__all__ = ["DropEmptyMetadata", "GuardedExecute", "ScoreAnswers"]
