"""Real Unix accounts for the tests that play an instructor's term with several people (tests/test_exchange.py).

The course's Python (this virtual environment and the interpreter it was made from) may sit under a folder other
users cannot enter (``/root`` is 0700 on the course's test machine, and a clone may live there). :func:`run_as` runs a
command as another account with exactly that fixed: in a mount namespace of its own (bubblewrap, as root), every
such folder is covered by an empty one that others may enter, and the few paths the command needs are bound back
into it read-only. Nothing else of those folders is visible, and nothing on the machine changes.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path


def usable() -> str | None:
    """Why accounts cannot be made and used here (None when they can): root, useradd, bubblewrap and setpriv."""
    if os.geteuid() != 0:
        return "only root can add accounts (CI runs as root)"
    for tool in ("useradd", "userdel", "bwrap", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def add_user(name: str) -> pwd.struct_passwd:
    """A fresh account ``name`` with a home folder (an older one of that name is removed first, home included)."""
    remove_user(name)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True, capture_output=True)
    return pwd.getpwnam(name)


def remove_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    subprocess.run(["userdel", "--remove", name], capture_output=True)


def _closed_ancestor(path: Path) -> Path | None:
    """The outermost folder on the way to ``path`` that other users cannot enter (no x bit for others)."""
    for parent in [*reversed(path.parents), path]:
        if parent == Path("/"):
            continue
        try:
            if not os.stat(parent).st_mode & 0o001:
                return parent
        except OSError:
            return None
    return None


def python_paths() -> list[Path]:
    """What running this environment's Python and its console scripts needs: the environment and its interpreter."""
    out = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent}
    return sorted(out)


def run_as(user: str, argv: list[str], env: dict | None = None, cwd: Path | None = None, needs: list[Path] = (),
           timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` (its uid, gid and groups; HOME, USER and LOGNAME its own; ``cwd`` default its home),
    with this environment's Python reachable (:func:`python_paths`) and ``needs`` too, and an environment of its own:
    ``env`` over a PATH that starts with this environment's scripts (nothing of the caller's, so no key folder or
    token reaches it). Returns the completed process (text output); does not raise on a failing command."""
    pw = pwd.getpwnam(user)
    wanted = [*python_paths(), *map(Path, needs)]
    cover: dict[Path, list[Path]] = {}
    for p in wanted:
        closed = _closed_ancestor(p)
        if closed is not None:
            cover.setdefault(closed, []).append(p)
    args = ["bwrap", "--dev-bind", "/", "/"]
    for closed, paths in sorted(cover.items()):
        args += ["--perms", "0755", "--tmpfs", str(closed)]
        made: set[Path] = set()
        for p in sorted(set(paths)):
            # the folders on the way, enterable (bubblewrap would make them 0700)
            for d in [q for q in reversed(p.parents) if q.is_relative_to(closed) and q != closed and q not in made]:
                args += ["--perms", "0755", "--dir", str(d)]
                made.add(d)
            args += ["--ro-bind", str(p), str(p)]
            made.add(p)
    home = pw.pw_dir
    environ = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]), "LANG": "C.UTF-8",
               **(env or {}), "HOME": home, "USER": user, "LOGNAME": user}
    args += ["--chdir", str(cwd or home), "--",
             shutil.which("setpriv") or "setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--",
             *argv]
    return subprocess.run(args, env=environ, capture_output=True, text=True, timeout=timeout)
