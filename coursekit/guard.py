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
import subprocess
import time
from pathlib import Path

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from traitlets import Dict, Integer, List, Unicode, default

from nbgrader.preprocessors import Execute, NbGraderPreprocessor


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _cell_name(cell, index: int) -> str:
    gid = _nbg(cell).get("grade_id")
    return f"cell {index + 1} ({gid})" if gid else f"cell {index + 1}"


def _error(ename: str, text: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=text, traceback=[f"{ename}: {text}"])


#: Notebook metadata key under which GuardedExecute records how long the execution took (for ScoreAnswers' budget).
BUDGET_KEY = "coursekit_budget"
#: Cell metadata key of a scored check's outcome (:func:`outcome`), read by the instructor's class report
#: (coursekit.report) from the autograded notebook: data written where the score is decided, never read back
#: out of the feedback text.
OUTCOME_KEY = "coursekit_outcome"

#: How a check ended: all its points; some of them; a known mistake (the item named it); wrong in another way;
#: not answered (the release's blank); not scored at all (``reason`` says why: no answer reached the grader, the
#: submission's time was spent, the check did not run, the grader failed).
OUTCOMES = ("right", "partial", "mistake", "wrong", "blank", "not_scored")


def source_hash(source: str) -> str:
    import hashlib

    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def release_sources(release_dir: Path) -> dict[str, list[str]]:
    """Lesson id → :func:`source_hash` of every code cell of its release notebook (``release_dir/<id>/<id>.ipynb``),
    for :attr:`GuardedExecute.release_sources`."""
    folders = sorted(p.name for p in Path(release_dir).iterdir() if p.is_dir()) if Path(release_dir).is_dir() else []
    return release_sources_of(Path(release_dir), folders)


def release_sources_of(release_dir: Path, lessons: list[str]) -> dict[str, list[str]]:
    """:func:`release_sources` of the named lessons only (those whose release notebook exists)."""
    import nbformat

    out = {}
    for aid in lessons:
        nb_path = Path(release_dir) / aid / f"{aid}.ipynb"
        if nb_path.is_file():
            nb = nbformat.read(nb_path, as_version=4)
            out[aid] = sorted({source_hash(c.source) for c in nb.cells if c.cell_type == "code"})
    return out


def _output_size(content: dict) -> int:
    """Bytes of one kernel message's whole content as JSON (text, data, metadata, error value, traceback, state)."""
    import json

    try:
        return len(json.dumps(content, default=str, ensure_ascii=False).encode("utf-8", "replace"))
    except (TypeError, ValueError, RecursionError):
        return len(str(content))


#: Longest single wait on a kernel channel, in seconds (see :func:`poll_in_slices`).
POLL_SLICE_S = 1.0

#: Most values (list and dict entries, containers) one frame of a kernel message may hold: JSON's own text costs
#: two bytes a value (``[],``...), Python's objects about 60, so a frame that ZeroMQ's size limit lets through would
#: otherwise become gigabytes in the grading process. An honest message holds a few hundred (an array travels as
#: one base64 string, coursekit.protocol).
MESSAGE_VALUES = 1_000_000

#: A JSON string once its escape pairs are gone (:func:`bounded_unpack`), its closing quote optional.
_JSON_STRING = re.compile(rb'"[^"]*+"?')


class MessageRefused(ValueError):
    """A kernel message that :func:`bounded_unpack` would not build (it is dropped; see :func:`poll_in_slices`)."""


def bounded_unpack(unpack, limit: int = MESSAGE_VALUES):
    """``unpack`` (a jupyter_client Session's: bytes of one JSON frame → object) that first counts the values the
    frame would build, outside its strings, without building any: more than ``limit`` raises
    :class:`MessageRefused`, and so does a frame ``unpack`` cannot read.

    The count: escape pairs (``\\\\``, then ``\\"``) are removed first, read left to right as JSON reads them,
    so that every remaining quote opens or closes a string; a frame of more than ``2 * limit`` quotes holds more
    than ``limit`` strings (each a value or a key) and is refused at once. Then commas and brackets are counted in
    the whole frame, and only when that exceeds ``limit`` are the strings' own subtracted, one string at a time
    (``finditer``: nothing is built per string but the string's bytes, one at a time). Linear in the frame, with
    memory of about twice the frame, whatever it holds (a possessive pattern; a backtracking one was quadratic on
    an unclosed string, and a substitution over millions of small strings took gigabytes)."""

    def bounded(data):
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
        quotes = plain.count(b'"')
        if quotes > 2 * limit:
            raise MessageRefused(f"a kernel message of about {quotes // 2:,} strings (at most {limit:,} values) was dropped")
        n = plain.count(b",") + plain.count(b"[") + plain.count(b"{")
        if n > limit:
            for m in _JSON_STRING.finditer(plain):
                text = m.group()
                n -= text.count(b",") + text.count(b"[") + text.count(b"{")
        del plain
        if n > limit:
            raise MessageRefused(f"a kernel message of about {n:,} values (at most {limit:,}) was dropped")
        try:
            return unpack(data)
        except (ValueError, RecursionError, UnicodeError, TypeError) as e:  # malformed: dropped like an oversized one
            raise MessageRefused(f"a kernel message that is not valid JSON was dropped ({type(e).__name__})") from None

    bounded.bounded = True
    return bounded


def poll_in_slices(get_msg, slice_s: float = POLL_SLICE_S):
    """``get_msg`` (a jupyter_client async channel's) that never waits longer than ``slice_s`` at a time.

    nbclient waits for a cell's execute_reply with one ``shell_channel.get_msg(timeout=T)`` call, T being the cell's
    whole time limit. After a cell that opens ipywidgets comms (lesson 17's slider, lesson 06's step-through), that
    single wait sometimes does not wake when the reply arrives: the kernel sits idle and the grader waits the full
    T (40 minutes here) before calling the cell timed out (nbclient issue #312, "when cell contains ipywidget,
    execute cell will sometimes block", open; seen here grading lesson 17 in the test suite). Waiting in short
    slices asks the socket again every ``slice_s`` seconds, which finds a reply that is already there.
    Same contract as ``get_msg``: returns the message, or raises ``queue.Empty`` once ``timeout`` has passed. A
    message :func:`bounded_unpack` refused is passed over (a reply among them leaves the cell to its time limit).
    """
    from queue import Empty

    async def sliced(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            step = slice_s if left is None else max(0.0, min(slice_s, left))
            try:
                return await get_msg(timeout=step)
            except MessageRefused:  # read off the socket and dropped (bounded_unpack): wait on, as for nothing
                if deadline is not None and time.monotonic() >= deadline:
                    raise Empty from None
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

    release_files = Dict(
        {}, help="Lesson id → the files of a submission folder the kernel may read (relative paths: the notebook and "
                 "the files the lesson's release ships; coursekit.submissions.lesson_files). Unknown lesson: its "
                 "notebook only. Nothing else the student handed in reaches the sandbox."
    ).tag(config=True)

    release_sources = Dict(
        {}, help="Lesson id → sha256 of the source of each code cell of its release notebook (release_sources()): a "
                 "code cell whose source is not among them (added or edited by the student) gets answer_timeout."
    ).tag(config=True)

    release_directory = Unicode(
        "", help="The course's release folder (lessons/): where release_sources and release_files of a lesson that "
                 "neither names are read from (the plain nbgrader autograde route: the formgrader's button)."
    ).tag(config=True)

    cell_output_bytes = Integer(1 << 20, help="Bytes of output one cell may keep (what reaches autograded/ and "
                                               "feedback/); the rest is cut with a note.").tag(config=True)
    notebook_output_bytes = Integer(16 << 20, help="Bytes of output a whole notebook may keep.").tag(config=True)
    notebook_answer_chars = Integer(
        128 << 20, help="Characters of answer records (coursekit.protocol) a whole notebook may hand over; each one is "
                        "also within coursekit.protocol.measure's limits.").tag(config=True)
    message_bytes = Integer(
        64 << 20, help="Bytes of one message from the kernel: a larger one disconnects the kernel's socket instead of "
                       "filling the grading process's memory (ZeroMQ's MAXMSGSIZE; the cell then runs into its time "
                       "limit and the kernel is stopped). A message within it is parsed by jupyter_client before the "
                       "output caps cut it (one print of 50 MB is cut with a note).").tag(config=True)

    message_values = Integer(
        MESSAGE_VALUES, help="Values (list and dict entries) one frame of a kernel message may hold; a larger one is "
                             "dropped before it is built (bounded_unpack).").tag(config=True)

    interrupt_grace = Integer(
        10, help="Seconds a timed-out cell's kernel gets to answer after the interrupt; if it does not, it is stopped."
    ).tag(config=True)

    _dead: tuple[str, str] | None = None
    _timed_out = False

    @default("shutdown_kernel")
    def _kill_when_done(self):
        # Once the last cell has answered, nothing the kernel does counts: stop it at once instead of nbclient's
        # graceful shutdown, which waits for the kernel to tidy up and exit (about 0.8 s of each notebook's grading
        # here). The sandbox and the kernel's control group go with it.
        return "immediate"

    _private: Path | None = None
    _deadline: float | None = None

    def preprocess(self, nb, resources=None, km=None):
        from coursekit.grading import budget

        self._dead = None
        self._notebook = (resources or {}).get("unique_key", "")
        aid = ((resources or {}).get("nbgrader", {}) or {}).get("assignment") or self._notebook
        self._aid = str(aid)
        self._from_release(self._aid)
        lesson = str(aid)[:2]
        self._budget = budget.seconds(lesson) if lesson.isdigit() else None
        t0 = time.monotonic()
        self._deadline = None if self._budget is None else t0 + self._budget
        self._known = set(self.release_sources.get(aid, ()))
        self._cell_bytes: dict[int, int] = {}
        self._cut: set[int] = set()
        self._notebook_bytes = 0
        self._answer_chars = 0
        nb.metadata.pop(BUDGET_KEY, None)  # only this run's own measurement counts
        try:
            nb, resources = super().preprocess(nb, resources, km)
            # What ScoreAnswers may still spend of the budget (it reads this, also from a grading worker's notebook).
            nb.metadata[BUDGET_KEY] = {"executed_seconds": round(time.monotonic() - t0, 3)}
            return nb, resources
        finally:
            if self._private is not None:  # the kernel's sockets and connection file
                import shutil

                shutil.rmtree(self._private, ignore_errors=True)
                self._private = None

    def _from_release(self, aid: str) -> None:
        """Fill in release_sources and release_files of ``aid`` from ``release_directory`` where neither names it
        (coursekit grade sets both for every lesson it grades; nbgrader's own autograde does not)."""
        folder = Path(self.release_directory) / aid if self.release_directory else None
        if folder is None or not (folder / f"{aid}.ipynb").is_file():
            return
        if aid not in self.release_sources:
            self.release_sources = {**self.release_sources, **release_sources_of(folder.parent, [aid])}
        if aid not in self.release_files:
            from coursekit.submissions import lesson_files

            self.release_files = {**self.release_files, aid: sorted(lesson_files(folder.parent, aid))}

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
            km = self.km
            # No network in the sandbox: the kernel's channels are Unix sockets in a folder only it and the grader
            # may enter, and an interrupt travels as a message on the control channel (the kernel runs in a session
            # of its own, out of reach of a signal to the launcher's process group).
            self._private = sandbox.make_private_folder("ck-", spec)
            km.transport = "ipc"
            km.connection_file = str(self._private / "kernel.json")
            km.ip = str(self._private / "k")
            km.kernel_spec.interrupt_mode = "message"
            if not getattr(km.session.unpack, "bounded", False):  # the client shares the manager's session
                km.session.unpack = bounded_unpack(km.session.unpack, self.message_values)
            spec.writable, spec.env = [self._private], env
            plain = km.format_kernel_cmd

            # In its own PID namespace the kernel's parent is the namespace's init (pid 1), which ipykernel's parent
            # poller would take for a dead parent; --die-with-parent does that job.
            def wrapped(extra_arguments=None):
                sandbox.give(Path(km.connection_file), spec)
                return sandbox.command(plain([*(extra_arguments or []), "--IPKernelApp.parent_handle=1"]), spec)

            km.format_kernel_cmd = wrapped
            # What the kernel writes to its own stdout and stderr (os.write(1, ...), terminal escapes) never reaches
            # the grader's terminal or log.
            kwargs.setdefault("stdout", subprocess.DEVNULL)
            kwargs.setdefault("stderr", subprocess.DEVNULL)
        return await super().async_start_new_kernel(env=env, **kwargs)

    def _sandbox_spec(self, cwd: Path):
        """The kernel's sandbox: its working folder private (the lesson's files of the submission readable in it, and
        nothing else the student handed in), and the course folder (gradebook, other students), the instructor's keys
        and the lesson sources hidden."""
        from coursekit import sandbox
        from coursekit.grading import keys

        repo_keys = keys.REPOSITORY / "autograder" / "keys"  # (found by a kernel in the repository outside an autograde run)
        hide = list(dict.fromkeys(Path(p).resolve() for p in (*self.hidden_paths, keys.env_dir(), repo_keys if repo_keys.is_dir() else None) if p))
        cwd = cwd.resolve()
        aid = getattr(self, "_aid", "") or self._notebook
        allowed = set(self.release_files.get(aid, ())) or {f"{self._notebook or aid}.ipynb"}
        keep = [cwd / rel for rel in sorted(allowed) if (cwd / rel).is_file() and not (cwd / rel).is_symlink()]
        # The item tables (how every expected value is computed) stay with the grading process: the kernel's
        # grade() only hands answers over.
        hide.append(Path(sandbox.PKG) / "grading" / "lessons")
        return sandbox.Spec(workdir=cwd, keep=keep, hide=[h for h in hide if h != cwd])

    start_new_kernel = run_sync(async_start_new_kernel)  # nbclient binds the sync face to its own coroutine

    async def async_start_new_kernel_client(self):
        """nbclient's kernel client (nbclient 0.11's own steps), with three changes: every socket refuses a message
        over ``message_bytes`` (ZeroMQ disconnects the sender; the cell then runs into its time limit), there is no
        stdin channel (nbclient never reads it, so whatever the kernel sent there would queue in this process), and
        the shell and iopub waits are cut into short slices (:func:`poll_in_slices`). Once the kernel answers (its
        sockets exist), its private folder is taken back from it (coursekit.sandbox.close_folder: a root grader
        takes its ownership back; any other grader, whose kernel runs as itself, removes it once every channel is
        connected, and a connection outlives its socket's file)."""
        import zmq
        from nbclient.util import ensure_async, run_hook

        self.kc = self.km.client()
        self.kc.context.setsockopt(zmq.MAXMSGSIZE, int(self.message_bytes))  # for every socket it makes from now
        try:
            await ensure_async(self.kc.start_channels(stdin=False, hb=False))  # is_alive asks the kernel manager
            await ensure_async(self.kc.wait_for_ready(timeout=self.startup_timeout))
            if self._private is not None:
                from coursekit import sandbox

                if not sandbox.privileged():  # the folder is about to go: every channel must be connected first
                    await self._channels_connected()
                sandbox.close_folder(self._private)
        except Exception as e:
            self.log.error("Error occurred while starting new kernel client for kernel %s: %s",
                           getattr(self.km, "kernel_id", None), e)
            await self._async_cleanup_kernel()
            raise
        self.kc.allow_stdin = False
        await run_hook(self.on_notebook_start, notebook=self.nb)
        kc = self.kc
        for channel in (kc.shell_channel, kc.iopub_channel):
            channel.get_msg = poll_in_slices(channel.get_msg)
        return kc

    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    async def _channels_connected(self, timeout: float = 30.0) -> None:
        """Return once the kernel manager's control socket and the client's iopub socket are connected to the
        kernel (the shell socket is: the kernel answered on it): a kernel_info request on the control socket,
        its reply there, and the kernel's status for it on iopub. A socket that connects later would find no
        folder. Raises RuntimeError if that takes over ``timeout`` seconds."""
        from queue import Empty

        from nbclient.util import ensure_async

        km, kc = self.km, self.kc
        km._connect_control_socket()  # jupyter_client's own (it sends interrupts there)
        sock = km._control_socket
        msg = km.session.msg("kernel_info_request")
        km.session.send(sock, msg)
        deadline = time.monotonic() + timeout
        if not await sock.poll(int(timeout * 1000)):
            raise RuntimeError("the kernel did not answer on its control channel")
        await sock.recv_multipart()
        while True:
            left = deadline - time.monotonic()
            try:
                seen = await ensure_async(kc.iopub_channel.get_msg(timeout=max(left, 0.0)))
            except Empty:
                raise RuntimeError("the kernel's iopub channel did not connect") from None
            if (seen.get("parent_header") or {}).get("msg_id") == msg["header"]["msg_id"]:
                return

    def _students(self, cell) -> bool:
        """Whether ``cell`` holds the student's code: an answer cell, or a code cell added or edited (its source is
        not one of the release notebook's)."""
        if _nbg(cell).get("solution"):
            return True
        return bool(self._known) and cell.cell_type == "code" and source_hash(cell.source) not in self._known

    def _get_timeout(self, cell):
        t = self.notebook_timeouts.get(self._notebook) if getattr(self, "_notebook", "") else None
        if t is None and cell is not None and self._students(cell) and self.answer_timeout > 0:
            t = min(self.answer_timeout, self.timeout or self.answer_timeout)
        if t is None:
            t = super()._get_timeout(cell)
        t = t if t and t > 0 else None
        if self._deadline is not None:  # never past the submission's budget
            left = max(1.0, self._deadline - time.monotonic())
            t = left if t is None else min(t, left)
        return t

    def _over_budget(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline - 0.5

    #: Kernel messages whose content the grader keeps (in outputs, display updates or widget state): they count
    #: toward the output caps.
    KEPT_MESSAGES = frozenset({"stream", "display_data", "execute_result", "error", "update_display_data", "comm_open",
                               "comm_msg"})

    def process_message(self, msg, cell, cell_index):
        """nbclient's message handler, keeping at most ``cell_output_bytes`` of a cell's messages and
        ``notebook_output_bytes`` of the notebook's, whatever their kind (text, display data and its metadata,
        display updates, errors, widget state): one 50 MB line must not reach autograded/ and feedback/, nor fill
        the grader's memory. A check cell's answer record passes whole: ScoreAnswers replaces it with the feedback."""
        if msg.get("msg_type") in self.KEPT_MESSAGES:
            if self._answer_record(msg, cell):
                msg = self._admit_answer(msg)
            elif not self._admit(msg, cell, cell_index):
                return None
        return super().process_message(msg, cell, cell_index)

    def _admit_answer(self, msg):
        """A check cell's answer record, whole when it is within coursekit.protocol.measure's limits and the
        notebook's ``notebook_answer_chars``; else a small record saying why it could not be sent (ScoreAnswers then
        tells the student), so that no answer record is exempt from a cap."""
        from coursekit import protocol

        content = msg.get("content") or {}
        rec = content.get("data", {}).get(protocol.MIME)
        try:
            chars = protocol.measure(rec)
            self._answer_chars += chars
            if self._answer_chars > self.notebook_answer_chars:
                raise ValueError(f"the notebook's answers hold more than {self.notebook_answer_chars >> 20} MB together")
            return msg
        except ValueError as e:
            item = rec.get("item") if isinstance(rec, dict) and isinstance(rec.get("item"), str) else ""
            small = {"item": item[:40], "unsendable": str(e)}
            return {**msg, "content": {**content, "data": {protocol.MIME: small}, "metadata": {}}}

    @staticmethod
    def _answer_record(msg, cell) -> bool:
        from coursekit.protocol import MIME

        md = _nbg(cell)
        return MIME in ((msg.get("content") or {}).get("data") or {}) and bool(md.get("grade")) and not md.get("solution")

    def _admit(self, msg, cell, cell_index) -> bool:
        """Whether ``msg`` fits the caps (counting it); a stream message that crosses the line keeps its start, and the
        cell gets one note saying what was cut."""
        if cell_index in self._cut:
            return False
        content = msg.get("content") or {}
        size = _output_size(content)
        used = self._cell_bytes.get(cell_index, 0)
        cell_room, notebook_room = self.cell_output_bytes - used, self.notebook_output_bytes - self._notebook_bytes
        room = min(cell_room, notebook_room)
        if size <= room:
            self._cell_bytes[cell_index] = used + size
            self._notebook_bytes += size
            return True
        self._cut.add(cell_index)
        limit, whose = (self.cell_output_bytes, "this cell") if cell_room <= notebook_room else \
            (self.notebook_output_bytes, "this notebook")
        note = NotebookNode(output_type="stream", name="stdout",
                            text=f"\n[output cut: the grader keeps at most {limit:,} bytes of {whose}'s output]\n")
        if room > 1000 and msg.get("msg_type") == "stream":  # keep the start of the text that crosses the line
            text = str(content.get("text", "")).encode("utf-8", "replace")[:room - 1000].decode("utf-8", "ignore")
            msg = {**msg, "content": {**content, "text": text}}
            self._notebook_bytes += room
            super().process_message(msg, cell, cell_index)
        cell.setdefault("outputs", []).append(note)
        return False

    async def _async_handle_timeout(self, timeout, cell=None):
        self._timed_out = True
        if self._over_budget():
            text = (f"this cell was still running when your submission's grading time budget ({self._budget:g} s) ran "
                    "out, so it was stopped, and the cells after it are not run.")
            self.error_on_timeout = {"ename": "BudgetSpent", "evalue": text, "traceback": [f"BudgetSpent: {text}"]}
            return await super()._async_handle_timeout(timeout, cell)
        self.error_on_timeout = {
            "ename": "CellTimeoutError",
            "evalue": f"this cell was still running after {timeout} s and was stopped (an endless loop?). "
                      "The notebook went on without what the rest of this cell would have defined.",
            "traceback": [f"CellTimeoutError: this cell was still running after {timeout} s and was stopped (an endless loop?)."],
        }
        return await super()._async_handle_timeout(timeout, cell)

    def preprocess_cell(self, cell, resources, index):
        if self._dead is None and cell.cell_type == "code" and self._over_budget():
            self._dead = (_cell_name(cell, index), f"used up its grading time budget ({self._budget:g} s)")
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
            if not stuck and self._timed_out and self._over_budget():
                self._dead = (_cell_name(cell, index), f"used up its grading time budget ({self._budget:g} s)")
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


class IdRestoredCells(NbGraderPreprocessor):
    """After nbgrader's OverwriteCells: give each cell it restored from the gradebook (a check cell the student deleted,
    with ``add_missing_cells``) an id, ``restored-<grade_id>``. nbgrader 0.9.6 builds those cells without one, and
    nbformat then warns "Cell is missing an id field" on the grader's terminal for every such notebook."""

    def preprocess(self, nb, resources):
        if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) < (4, 5):  # no cell ids before nbformat 4.5
            return nb, resources
        taken = {c.get("id") for c in nb.cells}
        for i, cell in enumerate(nb.cells):
            if not cell.get("id"):
                base = f"restored-{_nbg(cell).get('grade_id') or i}"
                cid, k = base, 1
                while cid in taken:
                    cid, k = f"{base}-{k}", k + 1
                cell["id"] = cid
                taken.add(cid)
        return nb, resources


# --------------------------------------------------------------------------- scoring


_GRADE_CALL = re.compile(r"""\bgrade\(\s*["'](\d\d\.\w+)["']""")


def outcome(item_id: str, points: float, max_points: float, status: str, mistakes: list[str] | None = None,
            reason: str = "") -> dict:
    """The record of one scored check, stored in its cell's metadata under :data:`OUTCOME_KEY`: ``{"item",
    "points", "max_points", "status" (one of :data:`OUTCOMES`), "mistakes" (labels of the known mistakes the
    answer made), "reason" (why a check was not scored)}``. Raises ValueError for an unknown status."""
    if status not in OUTCOMES:
        raise ValueError(f"unknown outcome {status!r}; one of {OUTCOMES}")
    return {"item": item_id, "points": float(points), "max_points": float(max_points), "status": status,
            "mistakes": list(mistakes or []), "reason": reason}


def _status(fb, blank: bool) -> str:
    if blank:
        return "blank"
    if fb.full:
        return "right"
    if fb.mistakes:
        return "mistake"
    return "partial" if fb.points > 0 else "wrong"


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

        from coursekit.grading import budget, lesson_items, score_record

        t0 = time.monotonic()
        executed = float((nb.metadata.get(BUDGET_KEY) or {}).get("executed_seconds", 0) or 0)
        deadline: budget.Deadline | None = None
        spent: budget.BudgetSpent | None = None
        for cell in nb.cells:
            md = _nbg(cell)
            if cell.cell_type != "code" or not md.get("grade") or md.get("solution"):
                continue
            calls = _GRADE_CALL.findall(cell.source)
            count = cell.get("execution_count")
            if len(calls) != 1:
                cell.outputs = _result("0 points: a check cell must be one grade(...) call; this one is not, so it "
                                       "cannot be scored.", 0.0, count)
                cell.metadata[OUTCOME_KEY] = outcome(md.get("grade_id", "?"), 0.0, float(md.get("points", 0) or 0),
                                                     "not_scored", reason="the check cell was changed")
                continue
            item_id = calls[0]
            outs = list(cell.get("outputs", []))
            try:
                lesson, item = item_id.split(".", 1)
                it = lesson_items(lesson)[item]
                title = f"[{item_id}] {it.title}"
                recs = {_json.dumps(r, sort_keys=True): r for r in _records(outs, item_id)}
                if deadline is None:  # what the execution left of the submission's budget
                    total = budget.seconds(lesson)
                    deadline = budget.Deadline(total, total - executed)
                runs_code = len(recs) == 1 and "function" in next(iter(recs.values()))
                if runs_code and (spent is not None or deadline.left() <= 0):  # (a value costs no time to score)
                    spent = spent or deadline.spent()
                    cell.outputs = _result(f"{title}: 0 points\n  {spent.reason()[0].upper() + spent.reason()[1:]}", 0.0, count)
                    cell.metadata[OUTCOME_KEY] = outcome(item_id, 0.0, it.points, "not_scored", reason="time spent")
                    continue
                if len(recs) == 1:
                    try:
                        fb = score_record(item_id, next(iter(recs.values())), deadline)
                    except budget.BudgetSpent as e:
                        spent = e
                        cell.outputs = _result(f"{title}: 0 points\n  {e.reason()[0].upper() + e.reason()[1:]}", 0.0, count)
                        cell.metadata[OUTCOME_KEY] = outcome(item_id, 0.0, it.points, "not_scored", reason="time spent")
                        continue
                    points = min(max(fb.points, 0.0), float(it.points))
                    cell.outputs = _result(fb.text(title), points, count)
                    blank = bool(next(iter(recs.values())).get("unanswered"))
                    cell.metadata[OUTCOME_KEY] = outcome(item_id, points, it.points, _status(fb, blank), fb.mistakes)
                    continue
                errors = [o for o in outs if o.get("output_type") == "error"]
                if len(recs) > 1:
                    why, reason = "more than one answer reached the grader for this item, so none counts. Give one answer.", "several answers"
                elif errors:
                    e = errors[0]
                    why = (f"the check did not run: {e.get('ename', 'Error')}: {str(e.get('evalue', ''))[:500]}")
                    reason = f"the check did not run ({e.get('ename', 'Error')})"
                else:
                    why, reason = "no answer reached the grader (did the notebook change how the check cell runs?)", "no answer reached the grader"
                cell.outputs = _result(f"{title}: 0 points\n  {why[0].upper() + why[1:]}", 0.0, count)
                cell.metadata[OUTCOME_KEY] = outcome(item_id, 0.0, it.points, "not_scored", reason=reason)
            except Exception as e:  # a broken check must not stop the grading of this notebook or of anyone else
                self.log.warning("could not score %s: %s", item_id, e, exc_info=True)
                cell.outputs = _result(f"[{item_id}] 0 points\n  The grader could not score this check ({type(e).__name__}); "
                                       "the instructor has the log.", 0.0, count)
                cell.metadata[OUTCOME_KEY] = outcome(item_id, 0.0, float(md.get("points", 0) or 0), "not_scored",
                                                     reason=f"the grader failed ({type(e).__name__})")
        nb.metadata[BUDGET_KEY] = {**(nb.metadata.get(BUDGET_KEY) or {}), "scored_seconds": round(time.monotonic() - t0, 3)}
        return nb, resources


__all__ = ["DropEmptyMetadata", "GuardedExecute", "IdRestoredCells", "ScoreAnswers", "OUTCOME_KEY", "OUTCOMES", "outcome"]
