"""Run a student's code in an isolated process tree (bubblewrap) that is given nothing it does not need.

Everything a submission runs in while graded (its notebook's kernel, and the runner that calls its
functions, :mod:`coursekit.runner`) is started through :func:`command`, which wraps the command in
`bubblewrap <https://github.com/containers/bubblewrap>`_ (Debian package ``bubblewrap``). The sandbox is an
allow-list:

- **an empty file system** into which only what Python needs is bound read-only: the system's shared
  libraries, the interpreter and this environment's site-packages, the ``coursekit`` package (without the
  grader's item tables), the converted model cache, and the few files of ``/etc`` the dynamic loader reads.
  No home folder, no other user's files, no ``/etc/shadow``, no other copy of the course, no ``/sys``;
- a fresh ``/proc`` and a minimal ``/dev`` (``null``, ``zero``, ``urandom`` …); ``/tmp``, ``/dev/shm`` and the
  working folder are private ``tmpfs`` mounts of a fixed size each, gone with the process tree;
- **no privilege**: run by root, the sandboxed process changes to an unprivileged user of its own (a fresh id from
  ``SANDBOX_IDS``, shared with no other sandbox) with every capability and the bounding set dropped and
  ``no_new_privs`` set (``setpriv``), after bubblewrap has made its mounts; run by anyone else, it runs in a user
  namespace with every capability dropped. Either way it cannot unmount a cover, remount a folder writable, write
  a control group, load anything setuid, or make a user namespace of its own (where it would be root and could
  mount a ``tmpfs`` past the private ``/tmp``'s cap): bubblewrap's ``--disable-userns``, or for a root grader
  :mod:`coursekit.nouserns`, which sets the same limit around bubblewrap;
- **no network**: its own network namespace holds only a loopback of its own, so nothing it reads can be
  sent anywhere and no server on the grading machine (a Dask scheduler) can be reached. The kernel's
  channels to the grader are Unix sockets in a private folder (:func:`coursekit.guard.GuardedExecute`),
  the runner's are its stdin and stdout;
- **an explicit environment** (``--clearenv``; :func:`environment` lists what is passed), its own PID, IPC and
  UTS namespaces, a new session (no terminal to push keystrokes into), killed with its parent;
- address space and file size limited (``prlimit``), and the whole tree's memory and number of tasks capped
  by a control group (:mod:`coursekit.cgroups`) that the tree enters before it drops its privilege and
  cannot leave.

Where bubblewrap cannot run (macOS, a container without user namespaces) :func:`available` says why, and
``coursekit grade`` refuses to grade for credit unless told ``--unsandboxed``. Where control groups cannot be
made (no write access to /sys/fs/cgroup), the sandbox still isolates but the tree caps are off:
:func:`tree_caps_problem` says why, and ``coursekit grade`` prints it before it starts.

Sources: bubblewrap's manual (``bwrap(1)``), util-linux's ``setpriv(1)``, and the kernel's
*capabilities(7)* and *user_namespaces(7)* pages (a mount made in a more privileged namespace is locked).
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

#: A root grader runs each sandboxed process tree as a user and group of its own, drawn from this range (no account
#: on the machine uses it): two sandboxes never share a user, so nothing kept per user by the kernel (keyrings,
#: signal and ptrace rights, process counts) joins one student's code to another's.
SANDBOX_IDS = (1 << 20, 1 << 30)

#: Variables of the grader's environment a sandboxed process gets (by exact name or by prefix); nothing else.
PASSED_ENV = ("COURSEKIT_CACHE", "COURSEKIT_MATMUL_DTYPE", "LANG", "LC_ALL", "TZ", "PYTHONHASHSEED")
PASSED_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "KMP_", "LC_")

#: The files of /etc the dynamic loader and Python read (when they exist); nothing else of /etc is there.
ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/fonts")


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
    the resident memory of the whole tree (its tmpfs files included), ``tasks`` its processes and threads;
    ``tmp``, ``shm`` and ``workdir`` the sizes of the private /tmp, /dev/shm and working folder."""

    memory: int = 12 << 30
    tree_memory: int = field(default_factory=lambda: _tree_memory_default())
    tasks: int = 512
    tmp: int = 256 << 20
    shm: int = 64 << 20
    workdir: int = 256 << 20
    file_size: int = 256 << 20


@dataclass
class Spec:
    """What a sandbox sees besides the system's libraries and the interpreter: a private working folder
    (``workdir``, a tmpfs in which the ``keep`` files of the same folder outside stay readable), folders
    inside those to ``hide``, files to replace (``replace``: path → path of the replacement, e.g. a withheld
    reference), extra read-only paths (``readable``) and read-write folders (``writable``: the kernel's
    socket folder). ``env``: the environment :func:`environment` picks the sandbox's from."""

    workdir: Path | None = None
    keep: Sequence[Path] = ()
    hide: Sequence[Path] = ()
    replace: dict = field(default_factory=dict)
    readable: Sequence[Path] = ()
    writable: Sequence[Path] = ()
    limits: Limits = field(default_factory=Limits)
    env: dict | None = None  # the environment :func:`environment` picks from (default: this process's)
    uid: int = field(default_factory=lambda: fresh_id())  # the user (and group) a root grader's sandbox runs as


def fresh_id() -> int:
    """A user and group id for one sandboxed process tree, drawn at random from :data:`SANDBOX_IDS`."""
    import secrets

    lo, hi = SANDBOX_IDS
    return lo + secrets.randbelow(hi - lo)


def off() -> bool:
    """Whether the instructor switched the sandbox off ($COURSEKIT_UNSANDBOXED=1)."""
    return os.environ.get(ENV_OFF, "") == "1"


def privileged() -> bool:
    """Whether this process is root, so that the sandbox must change to an unprivileged user itself (:data:`SANDBOX_IDS`)."""
    return os.geteuid() == 0


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why bubblewrap cannot isolate a process here (None when it can): it is run once with the sandbox's own
    flags (no network, no privilege)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux; this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt install bubblewrap)"
    if privileged() and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed: a root grader needs it to drop its privilege in the sandbox"
    try:
        r = subprocess.run(_bwrap([sys.executable, "-c", "pass"], Spec()), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap could not start: {e}"
    if r.returncode != 0 and r.stderr.startswith("nouserns:"):
        return ("a root grader's sandbox starts in a user namespace that forbids the student's code to make its own, "
                f"and none can be made here: {r.stderr.strip()[:300]}")
    if r.returncode != 0:
        return f"bubblewrap cannot create a sandbox here: {r.stderr.strip()[:300]}"
    return None


def available() -> bool:
    return problem() is None


def tree_caps_problem() -> str | None:
    """Why the whole-tree caps (memory, tasks) are off here (None when they hold): see :mod:`coursekit.cgroups`."""
    from . import cgroups

    return cgroups.problem()


def _system() -> list[tuple[str, ...]]:
    """Mounts of the system's shared libraries and the interpreter, read-only (symbolic links such as a
    merged-/usr system's /lib → usr/lib are recreated as links)."""
    out: list[tuple[str, ...]] = []
    roots = ["/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", *ETC]
    exe = Path(sys.executable)
    interp = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), exe.resolve().parent, exe.parent.resolve()}
    if privileged():
        roots.append(shutil.which("setpriv") or "/usr/bin/setpriv")
    if not PKG.is_relative_to(Path(sys.prefix).resolve()):  # an editable install reads coursekit from the repository
        interp.add(PKG)
    seen: set[str] = set()
    for p in [*roots, *sorted(map(str, interp))]:
        if p in seen or not os.path.lexists(p) or any(p.startswith(q + "/") for q in seen if not q.startswith("/etc")):
            continue
        seen.add(p)
        if os.path.islink(p) and os.path.dirname(p) == "/":
            out.append(("--symlink", os.readlink(p), p))
        else:
            out.append(("--ro-bind", p, p))
    return out


def _model_cache() -> list[Path]:
    """The converted model and the capstone store (read-only), made readable by the sandbox's user first: a cache
    folder made by ``mktemp -d`` (0700), or a file written through ``mkstemp`` (0600), would keep it out. Nothing
    in the cache is secret: it is what every student's own run computes."""
    from . import model

    root = model.cache_root()
    if not root.exists():
        return []
    root = root.resolve()
    readable_by_sandbox(root)
    return [root]


def _env_args(env: dict) -> list[str]:
    args = ["--clearenv"]
    for k, v in sorted(env.items()):
        args += ["--setenv", k, v]
    return args


def _parents(mounts: list[tuple[str, ...]]) -> list[str]:
    """``--dir`` arguments (mode 0755) for the folders that lead to each mount point: bubblewrap would otherwise
    copy their modes from the host, and a 0700 parent (/root, pytest's tmp folder) would keep the unprivileged
    user out. A folder that is itself mounted, or lies inside a mount, is left alone."""
    points = [m[-1] for m in mounts]
    need: set[str] = set()
    for p in points:
        for a in Path(p).parents:
            a = str(a)
            if a == "/" or any(a == q or a.startswith(q.rstrip("/") + "/") for q in points):
                continue
            need.add(a)
    out: list[str] = []
    for a in sorted(need):
        out += ["--perms", "0755", "--dir", a]
    return out


@functools.lru_cache(maxsize=1)
def _bwrap_disables_userns() -> bool:
    """Whether this bubblewrap has ``--disable-userns`` (0.8.0 and later)."""
    try:
        r = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--disable-userns" in (r.stdout + r.stderr)


def _bwrap(argv: Sequence[str], spec: Spec) -> list[str]:
    lim = spec.limits
    # A root grader's bubblewrap starts in a user namespace that allows no further one (coursekit/nouserns.py):
    # its sandbox changes user itself, so bubblewrap's --disable-userns (below) is not available to it.
    launcher = [sys.executable, "-I", "-S", str(PKG / "nouserns.py"), "--"] if privileged() else []
    args = [*launcher, "bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if not privileged():  # bubblewrap makes a user namespace; nothing may be kept of its capabilities, and the
        # student's code may not make one of its own (a tmpfs mounted there would pass the private /tmp's cap;
        # a root grader's launcher does the same)
        args += ["--unshare-user", "--cap-drop", "ALL"] + (["--disable-userns"] if _bwrap_disables_userns() else [])
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(lim.tmp), "--perms", "1777", "--tmpfs", "/tmp",
             "--size", str(lim.shm), "--perms", "1777", "--tmpfs", "/dev/shm"]
    # The working folder first: what Python needs stays mounted over it should it lie inside (an interpreter or
    # model cache under the folder graded in).
    mounts: list[tuple[str, ...]] = []
    if spec.workdir is not None:
        mounts.append(("--size", str(lim.workdir), "--perms", "1777", "--tmpfs", str(spec.workdir)))
    mounts += _system()
    mounts += [("--ro-bind", str(p), str(p)) for p in _model_cache()]
    mounts += [("--ro-bind", str(p), str(p)) for p in spec.readable if os.path.exists(p)]
    mounts += [("--bind", str(p), str(p)) for p in spec.writable]
    args += _parents(mounts)
    for m in mounts:
        args += list(m)
    for target, source in spec.replace.items():
        args += ["--ro-bind", str(source), str(target)]
    points = [Path(m[-1]) for m in mounts]
    for p in map(Path, spec.hide):  # things inside a bound folder that stay out (the grader's item tables)
        if not any(p.is_relative_to(q) for q in points):
            continue  # not in the sandbox at all
        if p.is_dir():
            args += ["--size", "4096", "--perms", "0555", "--tmpfs", str(p)]
        elif p.exists():
            args += ["--ro-bind", "/dev/null", str(p)]
    if spec.workdir is not None:
        w = Path(spec.workdir)
        for f in spec.keep:  # at its place in the folder (a file of the folder), else by its name
            f = Path(f)
            inside = f.is_absolute() and f.is_relative_to(w)
            args += ["--ro-bind", str(f), str(w / (f.relative_to(w) if inside else f.name))]
        args += ["--chdir", str(w)]
    else:
        args += ["--chdir", "/tmp"]
    args += _env_args(environment(spec.env))
    args += ["--"]
    if privileged():  # after bubblewrap's mounts: an unprivileged user, no capability left, none to gain
        args += [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}",
                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return args + list(argv)


def command(argv: Sequence[str], spec: Spec) -> list[str]:
    """``argv`` wrapped so that it runs in the sandbox described by ``spec`` (see the module docstring)."""
    lim = spec.limits
    from . import cgroups

    # The control group first, while this process may still write it: the tree is in it before the sandbox starts.
    try:
        caps = cgroups.enter(lim.tree_memory, lim.tasks) if cgroups.problem() is None else []
    except OSError as e:  # the groups' folder went away or became unwritable since the check: isolate all the same
        print(f"WARNING: this submission's process tree runs without caps: {e}", file=sys.stderr)
        caps = []
    return [*caps, "prlimit", f"--as={lim.memory}", f"--fsize={lim.file_size}", "--core=0", "--", *_bwrap(argv, spec)]


def make_private_folder(prefix: str, spec: Spec) -> Path:
    """A fresh folder under /tmp that only the grader and ``spec``'s sandboxed user may enter (for the kernel's
    sockets and connection file); the caller removes it. Its path is short: a Unix socket's path has at most 107
    bytes. Once the kernel has made its sockets, :func:`close_folder` takes the folder back."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    if privileged():
        os.chown(d, spec.uid, spec.uid)
    return d


def close_folder(folder: Path) -> None:
    """Take ``folder`` back from the sandbox once the kernel's sockets are connected: it can no longer add files
    (the folder is on the host's disk, outside every tmpfs cap) nor replace a socket with a link.

    A root grader gives it back to root, read-only for the sandbox's user. Any other grader's kernel runs as the
    grader's own user and would own the folder whatever its mode, so the folder is removed instead: a connected
    Unix socket outlives its file, and the kernel's view of the folder is then a removed folder, in which nothing
    can be made. Raises RuntimeError if the folder cannot be removed (something kept adding to it)."""
    if privileged():
        os.chown(folder, 0, 0)
        os.chmod(folder, 0o755)
        return
    for _ in range(3):
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.lexists(folder):
            return
    raise RuntimeError(f"the kernel's socket folder {folder} could not be removed: something kept writing into it")


def give(path: Path, spec: Spec) -> None:
    """Make ``path`` (a file the grader wrote for ``spec``'s sandboxed process) readable by it."""
    if privileged():
        os.chown(path, spec.uid, spec.uid)


def readable_by_sandbox(folder: Path) -> None:
    """Make every file and folder under ``folder`` (inputs a check wrote for the runner, the model cache) readable
    by the sandbox's user: a file written with ``mkstemp`` is the grader's alone (mode 0600)."""
    if not privileged():
        return
    for dirpath, dirnames, filenames in os.walk(folder):
        for p, bits in [(dirpath, 0o555), *((os.path.join(dirpath, f), 0o444) for f in filenames)]:
            try:
                st = os.lstat(p)
                if not os.path.islink(p) and st.st_mode & bits != bits:
                    os.chmod(p, st.st_mode | bits)
            except OSError:  # removed meanwhile (a store being written), or not ours to change
                pass


def environment(base: dict | None = None) -> dict:
    """The whole environment of sandboxed student code: the few variables of ``base`` (default: this process's)
    that the libraries need (:data:`PASSED_ENV`, :data:`PASSED_PREFIXES`: thread counts, the model cache, the
    locale), and fixed values for the rest (``PATH``, ``HOME`` in the private /tmp, caches there). Never the
    grader's keys, seed, tokens or paths."""
    from . import model

    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if k in PASSED_ENV or k.startswith(PASSED_PREFIXES)}
    env.update({
        "COURSEKIT_CACHE": str(model.cache_root()),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
        "HOME": "/tmp", "USER": "student", "LOGNAME": "student",
        "MPLCONFIGDIR": "/tmp/matplotlib", "IPYTHONDIR": "/tmp/ipython", "JUPYTER_RUNTIME_DIR": "/tmp/jupyter",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    })
    env.setdefault("LANG", "C.UTF-8")
    if base.get("NBGRADER_EXECUTION"):  # nbgrader tells the kernel it is an autograde run
        env["NBGRADER_EXECUTION"] = base["NBGRADER_EXECUTION"]
    return env
