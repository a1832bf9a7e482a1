"""The grading process's side of a function check: the student's function runs in a sandboxed runner.

:class:`Remote` is a callable that stands for the student's function inside a check: each call is sent to
a :mod:`coursekit.runner` process (sandboxed, no keys, no expected values, no grader code, the item's
withheld functions stubbed), and what comes back is data (:mod:`coursekit.protocol`): the result, or the
exception, what was printed or warned, and the inputs changed in place. The item's own check (the same
code that gives feedback while the student works) compares it with the reference, here.

Time limits are enforced from outside: a call that has not answered within its limit is ended by
killing the runner (a ``try``/``except`` inside cannot outlive that), and raises :class:`CaseTimeout` here.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import protocol, sandbox
from ..runner import write_frame
from .budget import BudgetSpent, Deadline
from .checkers import CaseTimeout, _case_timeout, withheld_message

GRADING = Path(__file__).resolve().parent


#: The most one reply of the runner may hold (a result and what the function printed): more ends the runner.
REPLY_BYTES = 96 << 20
#: The most of a reply's printed text the grader keeps (stdout, stderr, each).
TEXT_CHARS = 1 << 20


class RunnerFailed(Exception):
    """The runner could not be started or answered with something that is not a reply."""


def _frame(f) -> tuple:
    """(filename, line number, function, source line) of one frame the runner reported, each bounded."""
    try:
        line = int(f[1])
    except (TypeError, ValueError):
        line = 0
    return str(f[0])[:300], line, str(f[2])[:100], str(f[3] or "")[:500]


def _restore_exception(err: dict) -> Exception:
    """An exception like the one the student's code raised (same type name and message), with its frames."""
    if not isinstance(err, dict):
        err = {"message": str(err)[:200]}
    name, message = str(err.get("type", "Exception"))[:100], str(err.get("message", ""))[:10_000]
    cls = getattr(__builtins__ if isinstance(__builtins__, dict) else __builtins__, name, None) if err.get("builtin") else None
    module = str(err.get("module", ""))
    if cls is None and module.startswith("coursekit.") and not module.startswith("coursekit.grading"):
        # an exception class of coursekit's own (EmptyBatchError): the same class, so checks can tell. Only from a
        # module already loaded here: a reply never makes the grader import anything (coursekit.recipe: 14 s)
        cls = getattr(sys.modules.get(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = type(name if name.isidentifier() else "Exception", (Exception,), {})
    try:
        e = cls(message)
    except Exception:
        e = Exception(message)
    frames = err.get("frames") if isinstance(err.get("frames"), list) else []
    e.coursekit_frames = [_frame(f) for f in frames[-20:] if isinstance(f, (list, tuple)) and len(f) == 4]  # type: ignore[attr-defined]
    return e


class ProcessEnded(Exception):
    """The student's function ended the process that ran it (os._exit, a crash, running out of memory)."""


class Runner:
    """One sandboxed :mod:`coursekit.runner` process with the student's function loaded (restarted after a kill)."""

    def __init__(self, payload: dict, withheld: Sequence[str] = (), deadline: Deadline | None = None):
        self.payload, self.withheld, self.deadline = payload, list(withheld), deadline
        self._stubs: tempfile.TemporaryDirectory | None = None  # the stubbed module copies, removed on close
        self._replace: dict | None = None
        self.share: str | None = None  # a folder of the grader's the runner may read (inputs written to files)
        self.proc: subprocess.Popen | None = None
        self._n = 0
        self._buf = bytearray()

    def _spec(self) -> sandbox.Spec:
        replace: dict = {}
        hide = [GRADING]
        if self._replace is None:  # written once, reused when the runner restarts after a kill
            self._stubs = tempfile.TemporaryDirectory(prefix="coursekit-stubs-")
            self._replace = stub_files(self.withheld, Path(self._stubs.name))
        for target, source in self._replace.items():
            replace[target] = source
            cache = Path(target).parent / "__pycache__"
            hide += sorted(cache.glob(Path(target).stem + ".*.pyc"))
        return sandbox.Spec(hide=hide, replace=replace)

    def start(self) -> None:
        argv = [sys.executable, "-m", "coursekit.runner"]
        env = sandbox.environment()
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
        spec = self._spec() if not sandbox.off() else None
        if spec is not None:
            if self.share is not None:
                spec.readable = [self.share]
            spec.env = env
            argv = sandbox.command(argv, spec)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, cwd="/tmp" if not sandbox.off() else tempfile.gettempdir())
        self._buf = bytearray()
        reply = self.request({"op": "load", **self.payload}, timeout=120)
        if "error" in reply:
            raise _restore_exception(reply["error"])

    def request(self, msg: dict, timeout: float | None) -> dict:
        if msg.get("op") != "load" and (self.proc is None or self.proc.poll() is not None):
            self.start()  # the first call, or the first after a kill: a fresh runner
        self._n += 1
        msg = {**msg, "id": self._n}
        if self.share is not None and not sandbox.off():  # inputs a check wrote there, for the runner's user to read
            sandbox.readable_by_sandbox(Path(self.share))
        try:
            write_frame(self.proc.stdin, _dumps(msg))
        except (BrokenPipeError, OSError):
            raise ProcessEnded("the runner had already stopped")
        by_budget = False
        if self.deadline is not None:  # the submission's whole budget caps every wait
            left = self.deadline.left()
            if left <= 0:
                self.kill()
                raise self.deadline.spent()
            if not timeout or left < timeout:
                timeout, by_budget = left, True
        deadline = None if not timeout else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while True:
                end = self._buf.find(b"\n")
                if end < 0:
                    break
                line = bytes(self._buf[:end])
                del self._buf[:end + 1]
                if line.count(b"[") + line.count(b"{") + line.count(b",") > 2 * protocol.MAX_NODES:
                    # parsing it would cost the grader gigabytes (each "[]" a list): no reply is this large
                    self.kill()
                    raise ProcessEnded(f"it sent back a line of more than {2 * protocol.MAX_NODES:,} values")
                try:
                    reply = json.loads(line)
                except (ValueError, RecursionError):
                    continue  # not a reply (garbage the student's code wrote): skip it
                if isinstance(reply, dict) and reply.get("id") == self._n:
                    return reply
                if isinstance(reply, dict) and reply.get("unreadable"):
                    raise RunnerFailed(f"the runner could not read the grader's request: {reply.get('error')}")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.kill()
                if by_budget:
                    raise self.deadline.spent()
                raise CaseTimeout(timeout)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                code = self.proc.wait()
                self.proc = None
                raise ProcessEnded(f"the process running it ended (exit status {code})")
            self._buf += chunk  # a bytearray: appending does not copy what is there
            if len(self._buf) > REPLY_BYTES:
                self.kill()
                raise ProcessEnded(f"it sent back more than {REPLY_BYTES >> 20} MB in one reply")

    def kill(self) -> None:
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except Exception:
                pass
            self.proc = None

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except Exception:
                self.kill()
            self.proc = None
        if self._stubs is not None:
            self._stubs.cleanup()
            self._stubs, self._replace = None, None


def _dumps(msg: dict) -> bytes:
    """The grader's request, pickled so that the runner can rebuild it without coursekit.grading (which its sandbox
    lacks): functions and classes of the grading package (a toy model class, a loss given as an input) by value."""
    import cloudpickle

    from .. import grading

    cloudpickle.register_pickle_by_value(grading)
    try:
        return cloudpickle.dumps(msg)
    finally:
        cloudpickle.unregister_pickle_by_value(grading)


def _signature(params: Any) -> inspect.Signature | None:
    if not isinstance(params, list):
        return None
    out = []
    for p in params[:50]:
        try:
            name, kind, has_default = str(p[0]), int(p[1]), bool(p[2])
            kw = {"default": None} if has_default else {}
            out.append(inspect.Parameter(name, inspect._ParameterKind(kind), **kw))
        except Exception:
            return None
    try:
        return inspect.Signature(out)
    except ValueError:
        return None


class Remote:
    """Stands for the student's function in a check; every call runs in the :class:`Runner`."""

    def __init__(self, runner: Runner, name: str, params: Any):
        self._runner, self.__name__ = runner, name
        sig = _signature(params)
        if sig is not None:
            self.__signature__ = sig

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run_probe(None, *args, **kwargs)

    def run_probe(self, probe: Callable | None, *args: Any, **kwargs: Any) -> Any:
        """``probe(student_fn, *args, **kwargs)`` in the runner (see :func:`coursekit.grading.checkers.probe`)."""
        limit = _case_timeout()
        try:
            reply = self._runner.request({"op": "call", "args": list(args), "kwargs": kwargs, "probe": probe}, timeout=limit)
        except CaseTimeout:
            raise
        except BaseException:  # interrupted here (e.g. the check's own time limit): the runner must not go on
            self._runner.kill()
            raise
        named = {**{str(i): a for i, a in enumerate(args)}, **kwargs}
        changed = reply.get("changed")
        for k, v in (changed if isinstance(changed, dict) else {}).items():
            _write_back(named.get(k), v)
        if reply.get("stdout"):
            out = str(reply["stdout"])[:TEXT_CHARS]
            sys.stdout.write(out)
            try:  # the lines the runner counted (a check may count printed lines); never more than a text's worth
                lines = int(reply.get("stdout_lines", 0))
            except (TypeError, ValueError):
                lines = 0
            sys.stdout.write("\n" * min(TEXT_CHARS, max(0, lines - out.count("\n"))))
        if reply.get("stderr"):
            sys.stderr.write(str(reply["stderr"])[:TEXT_CHARS])
        got = reply.get("warnings")
        for w in (got if isinstance(got, list) else [])[:20]:
            cat, msg = (w if isinstance(w, (list, tuple)) and len(w) == 2 else ("UserWarning", w))
            c = getattr(__builtins__ if isinstance(__builtins__, dict) else __builtins__, str(cat)[:60], None)
            warnings.warn(str(msg)[:2000], c if isinstance(c, type) and issubclass(c, Warning) else UserWarning, stacklevel=2)
        if "error" in reply:
            raise _restore_exception(reply["error"])
        try:
            value = protocol.decode(reply.get("result"))  # within protocol.measure's limits: seconds at most
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"its result could not be read ({e})") from None
        deadline = self._runner.deadline
        if deadline is not None and deadline.left() <= 0:  # reading the reply is the submission's time too
            raise deadline.spent()
        return value


def _write_back(target: Any, encoded: Any) -> None:
    """Change ``target`` (an input array or tensor) in place the way the student's function changed its copy."""
    import numpy as np

    try:
        value = protocol.decode(encoded)
        if isinstance(target, np.ndarray):
            target[...] = np.asarray(value).reshape(target.shape)
        elif hasattr(target, "data") and hasattr(target, "copy_"):
            import torch

            with torch.no_grad():
                target.data.copy_(torch.as_tensor(np.asarray(value.detach() if hasattr(value, "detach") else value)).reshape(target.shape))
    except Exception:
        pass


# --------------------------------------------------------------------------- withheld functions


def _teaching(code: types.CodeType) -> bool:
    f = os.path.abspath(code.co_filename)
    pkg = str(GRADING.parent) + os.sep
    return f.startswith(pkg) and not f.startswith(str(GRADING) + os.sep)


def default_withheld(reference: Callable, example: dict) -> list[str]:
    """The coursekit functions a student's function may not use: ``reference`` itself when it is one of
    coursekit's teaching kernels, else the teaching kernels the reference calls directly (run once on
    ``example``, a public case's inputs). Returned as ``module:qualname``."""
    fn = getattr(reference, "__func__", reference)
    code = getattr(fn, "__code__", None)
    if code is not None and _teaching(code):
        return [f"{fn.__module__}:{fn.__qualname__}"]
    seen: dict[str, None] = {}

    def hook(frame, event, arg):
        if event == "call" and _teaching(frame.f_code) and frame.f_back is not None \
                and os.path.abspath(frame.f_back.f_code.co_filename).startswith(str(GRADING) + os.sep):
            qual = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            if "<" not in qual:
                seen.setdefault(f"{frame.f_globals.get('__name__', '?')}:{qual}")

    from .checkers import _copy_input, quiet

    old = sys.getprofile()
    sys.setprofile(hook)
    try:
        with quiet([]):
            reference(**{k: _copy_input(v) for k, v in example.items()})
    except Exception:
        pass
    finally:
        sys.setprofile(old)
    return list(seen)


def stub_files(withheld: Sequence[str], folder: Path) -> dict[str, Path]:
    """Module file → a copy in which each withheld function raises instead of computing (see :func:`default_withheld`)."""
    import importlib.util

    by_module: dict[str, list[str]] = {}
    for w in withheld:
        mod, _, qual = w.partition(":")
        by_module.setdefault(mod, []).append(qual)
    out = {}
    for mod, quals in by_module.items():
        spec = importlib.util.find_spec(mod)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        tree = ast.parse(Path(spec.origin).read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            for child in body if isinstance(body, list) else []:
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    qual = child.name if node is tree else f"{getattr(node, 'name', '')}.{child.name}"
                    if qual in quals:
                        msg = withheld_message(mod, qual)
                        child.body = [ast.parse(f"raise RuntimeError({msg!r})").body[0]]
        target = folder / f"{mod}.py"
        target.write_text(ast.unparse(ast.fix_missing_locations(tree)))
        out[spec.origin] = target
    return out


def withheld_of(item: Any) -> list[str]:
    """The coursekit functions ``item`` withholds from the student's function (its ``withheld`` attribute,
    else :func:`default_withheld` of its reference on its first public case)."""
    w = getattr(item, "withheld", None)
    if w is not None:
        return list(w)
    reference, public = getattr(item, "reference", None), getattr(item, "public", None)
    if reference is None or public is None:
        return []
    cases = list(public())
    return default_withheld(reference, cases[0].kwargs) if cases else []


#: Modules of model answers (``coursekit.recipe``: lesson 19's, written as a student would write them). Their
#: functions are withheld in the runner like any other (a call fails there), but never searched for in a pickled
#: answer: an honest answer written the natural way compiles to the same bytecode.
MODEL_ANSWERS = ("coursekit.recipe",)


def _carried(blob: bytes, withheld: Sequence[str]) -> list[str]:
    """The withheld functions whose bytecode travels inside the pickled answer (a function rebuilt in the notebook
    from the reference's ``__code__``, or the reference pickled by value): found in the bytes, never unpickled.
    Functions of :data:`MODEL_ANSWERS` are not searched for."""
    import importlib

    found = []
    for w in withheld:
        mod, _, qual = w.partition(":")
        if mod in MODEL_ANSWERS:
            continue
        try:
            obj: Any = importlib.import_module(mod)
            for part in qual.split("."):
                obj = getattr(obj, part)
            code = obj.__code__
        except Exception:
            continue
        if len(code.co_code) >= 16 and code.co_code in blob:
            found.append(f"{mod.split('.')[-1]}.{qual}")
    return found


def check_remotely(item: Any, ctx: Any, payload: dict, name: str, params: Any, deadline: Deadline | None = None):
    """Run ``item``'s own check on the student's function, each call of which runs in a sandboxed runner. Raises
    :class:`~coursekit.grading.budget.BudgetSpent` once ``deadline`` (the submission's budget) has passed."""
    from .checkers import Feedback

    withheld = withheld_of(item)
    carried = _carried(payload["fn"], withheld)
    if carried:
        return Feedback(0, item.points, [f"Your {name} carries the compiled code of coursekit's {', '.join(carried)}, which "
                                         "this item asks you to write yourself; nothing it computes counts."])
    runner = Runner({**payload, "preload": list(getattr(item, "preload", ()))}, withheld, deadline)
    with tempfile.TemporaryDirectory(prefix="coursekit-share-") as share:
        # Files a check writes as inputs (an adapter folder to reload) go to a folder the runner may read.
        runner.share, old_tmp = share, tempfile.tempdir
        tempfile.tempdir = share
        try:
            try:
                runner.start()
            except (BudgetSpent, KeyboardInterrupt):  # (Ctrl-C is the instructor's, not the student's code)
                runner.kill()
                raise
            except BaseException as e:  # noqa: BLE001  (unpickling is the student's code: any failure is theirs)
                runner.kill()
                return Feedback(0, item.points, [f"Your {name} could not be loaded in the grader's sandbox: "
                                                 f"{type(e).__name__}: {str(e)[:300]}. Does it use something only your "
                                                 "notebook has (a file, a variable defined after it)?"])
            return item.check(Remote(runner, name, params), ctx)
        finally:
            tempfile.tempdir = old_tmp
            runner.close()
