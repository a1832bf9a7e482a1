"""Caps on a whole process tree: its memory and its number of tasks, through the kernel's control groups.

A per-process limit (``prlimit --as``) stops one process from taking the machine's memory, but not a tree of
them: three children of 10 GiB each, or a fork bomb (``while True: os.fork()``), each stay under any
per-process cap, and root's processes are exempt from ``RLIMIT_NPROC``. A control group caps the tree: every
process and thread a sandboxed command starts stays in the group it was started in, so the group's
``pids`` limit makes the next ``fork`` fail with ``EAGAIN`` and its ``memory`` limit makes the kernel's
out-of-memory killer end a process of that tree, never one outside it (the grader, another student).

:func:`enter` returns a command prefix that creates a fresh group with the given limits and moves the command
into it before it runs (``sh`` writes its own PID into ``cgroup.procs`` and then ``exec``\\ s the command, so
the process that jupyter_client or the runner starts is the command itself). Both layouts of the kernel's
interface are handled: cgroup v1 (one hierarchy per controller, as in many containers and VMs) and cgroup v2
(one unified hierarchy, as under systemd). Under v1 the groups are nested under this process's own, so limits
set above (a container's) still hold; under v2 they sit under the root's ``coursekit`` folder (a group with
processes of its own cannot have capped children), so a limit set on the grader's own group does not extend to
them. Swap counts toward the memory cap where the kernel accounts it. Each group is removed once it is empty
and older than a minute (the next :func:`enter` sweeps them; ``rmdir`` of a group with live tasks fails, so a
running tree is never touched), and this process's own empty groups when it exits.

Source: the kernel's documentation of control groups, *Control Group v2* and *cgroup v1: Memory Resource
Controller* / *Process Number Controller* (https://docs.kernel.org/admin-guide/cgroup-v2.html,
https://docs.kernel.org/admin-guide/cgroup-v1/memory.html, https://docs.kernel.org/admin-guide/cgroup-v1/pids.html).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "coursekit"  # the folder, under this process's own group, that holds one group per sandboxed tree
SWEEP_AGE = 60  # seconds: an empty group older than this is removed (a younger one may be about to be entered)

_counter = itertools.count()
_made: list[Path] = []  # this process's groups, removed at exit where empty


@atexit.register
def _remove_own() -> None:
    for g in _made:  # (the parent folder stays: another grading process may be making a group in it)
        try:
            g.rmdir()
        except OSError:
            pass


class Unavailable(RuntimeError):
    """Control groups cannot be created here (no cgroup file system, or not writable): says why."""


@dataclass(frozen=True)
class Layout:
    """Where the groups go. ``memory`` and ``pids`` are the two parent folders (the same folder under cgroup v2)
    and the files each limit is written to."""

    memory: Path
    pids: Path
    memory_file: str
    unified: bool


def _own_path(controller: str) -> str:
    """This process's group in ``controller``'s hierarchy ('' for cgroup v2's unified one), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    raise Unavailable(f"this process is in no {controller or 'unified'} control group (/proc/self/cgroup)")


def _v1_mount(controller: str) -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and controller in parts[3].split(","):
            return Path(parts[1])
    return None


@functools.lru_cache(maxsize=1)
def layout() -> Layout:
    """The parent folders of this machine's groups, created if missing. Raises :class:`Unavailable` with the
    reason where groups cannot be made (not Linux, no cgroup file system, read-only, controller missing)."""
    try:
        mem, pids = _v1_mount("memory"), _v1_mount("pids")
        if mem is not None and pids is not None:  # cgroup v1 (also a hybrid layout that mounts these two as v1)
            out = Layout(mem / _own_path("memory").lstrip("/") / GROUP, pids / _own_path("pids").lstrip("/") / GROUP,
                         "memory.limit_in_bytes", unified=False)
            out.memory.mkdir(exist_ok=True)
            out.pids.mkdir(exist_ok=True)
            _probe(out)
            return out
        if (ROOT / "cgroup.controllers").exists():  # cgroup v2: the root is exempt from "no internal processes"
            base = ROOT / GROUP
            have = (ROOT / "cgroup.subtree_control").read_text().split()
            missing = [c for c in ("memory", "pids") if c not in have]
            if missing:
                (ROOT / "cgroup.subtree_control").write_text(" ".join("+" + c for c in missing))
            base.mkdir(exist_ok=True)
            (base / "cgroup.subtree_control").write_text("+memory +pids")
            out = Layout(base, base, "memory.max", unified=True)
            _probe(out)
            return out
    except (OSError, ValueError) as e:
        raise Unavailable(f"cannot create control groups under {ROOT}: {e}") from e
    raise Unavailable(f"no memory and pids control groups are mounted under {ROOT}")


def _probe(lay: Layout) -> None:
    """Make and remove one group in each parent: a parent folder can exist (made by an earlier run as root) where
    this process may not write."""
    for parent in dict.fromkeys([lay.memory, lay.pids]):
        g = parent / f"probe-{os.getpid()}"
        g.mkdir(exist_ok=True)
        g.rmdir()


def problem() -> str | None:
    """Why a process tree cannot be capped here (None when it can)."""
    try:
        layout()
    except Unavailable as e:
        return str(e)
    return None


def _sweep(parent: Path) -> None:
    now = time.time()
    for g in parent.iterdir():
        try:
            if g.is_dir() and now - g.stat().st_mtime > SWEEP_AGE:
                g.rmdir()  # fails (EBUSY) while a task is in it
        except OSError:
            pass


def enter(memory: int, tasks: int) -> list[str]:
    """A command prefix that runs the command in a fresh group capped at ``memory`` bytes (resident memory and
    page cache of the whole tree, its tmpfs files included) and ``tasks`` processes and threads.

    ``memory`` and ``tasks`` must be positive integers (``ValueError`` otherwise). Raises :class:`Unavailable`
    where groups cannot be made. Usage: ``[*enter(8 << 30, 512), "python", ...]``."""
    for name, v in (("memory", memory), ("tasks", tasks)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    lay = layout()
    name = f"{os.getpid()}-{next(_counter)}"
    # Swap: memory.memsw (v1, at least the memory limit, so written after it) and memory.swap.max (v2) exist only
    # where the kernel accounts swap; there the tree's swap counts toward its cap (v1) or is refused (v2).
    groups = {lay.memory: {lay.memory_file: memory, "pids.max": tasks, "memory.swap.max": 0}} if lay.unified else \
        {lay.memory: {lay.memory_file: memory, "memory.memsw.limit_in_bytes": memory}, lay.pids: {"pids.max": tasks}}
    procs = []
    for parent, limits in groups.items():
        _sweep(parent)
        g = parent / name
        g.mkdir(exist_ok=True)
        _made.append(g)
        for f, v in limits.items():
            if f.startswith("memory.memsw") or f == "memory.swap.max":
                if (g / f).exists():
                    (g / f).write_text(str(v))
                continue
            (g / f).write_text(str(v))
        procs.append(str(g / "cgroup.procs"))
    script = 'for f in "$@"; do shift; [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; done; exec "$@"'
    return ["sh", "-c", script, "coursekit-sandbox", *procs, "--"]
