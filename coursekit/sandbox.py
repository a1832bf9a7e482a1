"""Run a student's code in an isolated process tree (bubblewrap), so that it cannot reach the grader.

Everything a submission runs in while graded (its notebook's kernel, and the runner that calls its
functions, :mod:`coursekit.runner`) is started through :func:`command`, which wraps the command in
`bubblewrap <https://github.com/containers/bubblewrap>`_ (Debian package ``bubblewrap``):

- the whole file system is **read-only** (no ``.pth`` file in site-packages, no edited coursekit);
- the course repository is **hidden** except the ``coursekit`` package, the environment and
  the lessons (no ``solutions/``, ``autograder/`` with its keys, gradebook and other students,
  ``tests/`` or ``.git``); so are the course folder, the key folder and anything else ``hide`` lists;
- ``/tmp`` and the working folder are private ``tmpfs`` mounts of a fixed size (the disk cap);
  nothing written there outlives the process tree;
- own PID namespace, killed with its parent (``--die-with-parent``): the code cannot see or signal
  the grader, and no child it starts (detached or not) outlives the run;
- address space and file size limited (``prlimit``) so one process cannot take the machine's memory;
- the whole tree's memory and number of tasks capped by a control group (:mod:`coursekit.cgroups`), so
  neither a fork bomb nor many processes that each stay under the per-process cap can take the machine:
  the next ``fork`` fails, or the out-of-memory killer ends a process of that tree and of no other.

Where bubblewrap cannot run (macOS, a container without user namespaces) :func:`available` says why, and
``coursekit grade`` refuses to grade for credit unless told ``--unsandboxed``. Where control groups cannot be
made (no write access to /sys/fs/cgroup), the sandbox still isolates but the tree caps are off:
:func:`tree_caps_problem` says why, and ``coursekit grade`` prints it before it starts.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

ENV_OFF = "COURSEKIT_UNSANDBOXED"  # "1": run student code without the sandbox (the instructor's explicit choice)

PKG = Path(__file__).resolve().parent
REPO = PKG.parent


def _tree_memory_default() -> int:
    """12 GiB, or a third of the machine's memory where that is less: two trees graded at once (one per core
    of a 2-core grader) then leave a third for the grader and the system."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 12 << 30
    return min(12 << 30, phys // 3)


@dataclass
class Limits:
    """Caps for one sandboxed process tree. Bytes; ``memory`` is each process's address space, ``tree_memory``
    the resident memory of the whole tree (its tmpfs files included), ``tasks`` its processes and threads."""

    memory: int = 12 << 30
    tree_memory: int = field(default_factory=lambda: _tree_memory_default())
    tasks: int = 512
    tmp: int = 256 << 20
    workdir: int = 256 << 20
    file_size: int = 256 << 20


@dataclass
class Spec:
    """What a sandbox sees besides the read-only system: a private working folder (``workdir``, a tmpfs in
    which ``keep`` files of the same folder outside stay readable), folders to ``hide``, files to replace
    (``replace``: path → path of the replacement, e.g. a withheld reference), and extra read-only folders."""

    workdir: Path | None = None
    keep: Sequence[Path] = ()
    hide: Sequence[Path] = ()
    replace: dict = field(default_factory=dict)
    readable: Sequence[Path] = ()
    limits: Limits = field(default_factory=Limits)


def off() -> bool:
    """Whether the instructor switched the sandbox off ($COURSEKIT_UNSANDBOXED=1)."""
    return os.environ.get(ENV_OFF, "") == "1"


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why bubblewrap cannot isolate a process here (None when it can)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux; this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt install bubblewrap)"
    try:
        r = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
                            "--die-with-parent", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap could not start: {e}"
    if r.returncode != 0:
        return f"bubblewrap cannot create a sandbox here: {r.stderr.strip()[:300]}"
    return None


def available() -> bool:
    return problem() is None


def tree_caps_problem() -> str | None:
    """Why the whole-tree caps (memory, tasks) are off here (None when they hold): see :mod:`coursekit.cgroups`."""
    from . import cgroups

    return cgroups.problem()


def _course_hidden() -> list[Path]:
    """The repository's folders no student code may read (everything but coursekit, lessons and the environment)."""
    keep = {PKG, REPO / "lessons", Path(sys.prefix).resolve()}
    out = []
    if (REPO / "autograder").is_dir() or (REPO / "solutions").is_dir():  # an editable install of the course repository
        for p in REPO.iterdir():
            rp = p.resolve()
            if rp in keep or any(k.is_relative_to(rp) for k in keep) or p.name in ("pyproject.toml", "coursekit.egg-info"):
                continue
            out.append(p)
    return out


def command(argv: Sequence[str], spec: Spec) -> list[str]:
    """``argv`` wrapped so that it runs in the sandbox described by ``spec`` (see the module docstring)."""
    lim = spec.limits
    # SIGINT (a kernel interrupt: jupyter_client signals the process group) must reach the kernel, not end
    # bubblewrap: bubblewrap runs with it ignored; ipykernel installs its own handler while a cell runs.
    from . import cgroups

    try:
        caps = cgroups.enter(lim.tree_memory, lim.tasks) if cgroups.problem() is None else []
    except OSError as e:  # the groups' folder went away or became unwritable since the check: isolate all the same
        print(f"WARNING: this submission's process tree runs without caps: {e}", file=sys.stderr)
        caps = []
    args = [*caps, "env", "--ignore-signal=INT", "prlimit", f"--as={lim.memory}", f"--fsize={lim.file_size}", "--core=0", "--",
            "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
            "--size", str(lim.tmp), "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--tmpfs", "/run"]
    # What the code needs that may sit under /tmp (a CI clone, its environment, a fresh model cache): read-only again.
    from . import model

    for p in dict.fromkeys([REPO, Path(sys.prefix).resolve(), model.cache_root().resolve()]):
        if p.exists() and p.is_relative_to("/tmp"):
            args += ["--ro-bind", str(p), str(p)]
    hidden = [Path(p) for p in [*_course_hidden(), *spec.hide]]
    for p in hidden:
        if p.is_dir():
            args += ["--tmpfs", str(p)]
        elif p.exists():
            args += ["--ro-bind", "/dev/null", str(p)]
    for p in spec.readable:  # e.g. the lesson release inside a hidden folder
        if Path(p).exists():
            args += ["--ro-bind", str(p), str(p)]
    for target, source in spec.replace.items():
        args += ["--ro-bind", str(source), str(target)]
    if spec.workdir is not None:
        w = Path(spec.workdir)
        args += ["--size", str(lim.workdir), "--tmpfs", str(w)]
        for f in spec.keep:
            args += ["--ro-bind", str(f), str(w / Path(f).name)]
        args += ["--chdir", str(w)]
    return args + ["--", *argv]


def environment(base: dict | None = None) -> dict:
    """The environment of sandboxed student code: ``base`` without the grader's secrets, with writable
    caches pointed into the private /tmp (matplotlib, IPython) and the coursekit cache spelled out."""
    from . import model

    env = dict(os.environ if base is None else base)
    for k in list(env):
        if k.startswith("COURSEKIT_KEYS") or k == "COURSEKIT_SEED":
            env.pop(k)
    env["COURSEKIT_CACHE"] = str(model.cache_root())
    env.setdefault("MPLCONFIGDIR", "/tmp/matplotlib")
    env["IPYTHONDIR"] = "/tmp/ipython"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
