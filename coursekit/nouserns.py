"""Start a command (a root grader's bubblewrap) in a user namespace in which no further user namespace can be made.

Run as a script, by path, with the grader's interpreter in isolated mode (``python -I -S nouserns.py -- argv…``);
it imports nothing but the standard library, so that nothing of the course runs with root's rights here.

Why: bubblewrap's ``--disable-userns`` needs bubblewrap to make the user namespace itself, which a root grader's
sandbox does not do (it changes to an unprivileged user of its own instead, :mod:`coursekit.sandbox`). A student's
code that could make a user namespace of its own would be root there, and could mount a ``tmpfs`` that passes the
private ``/tmp``'s size cap. So the launcher does what ``--disable-userns`` does, around bubblewrap:

1. it leaves the host's user namespace for a new one that maps every user and group to itself (an identity
   map, written by a helper process that stays in the host's namespace, as *user_namespaces(7)* requires), so
   files, owners and the sandbox's own user are what they were;
2. in that namespace it sets the ``user.max_user_namespaces`` limit to 0. The kernel counts a new user namespace
   against the limit of every namespace above it, so nothing started below can make one, and nothing there can
   raise the limit back (it is written with ``CAP_SYS_RESOURCE`` in this namespace, which the sandboxed user,
   after ``setpriv`` has dropped every capability, does not hold);
3. it replaces itself with the command (bubblewrap), keeping its process id.

Errors: exit status 125 with one line on stderr if the namespace cannot be made (a kernel without user namespaces,
a limit already 0 above this one, not root).

Sources: *user_namespaces(7)* (the rules for writing ``uid_map``), *namespaces(7)* (``/proc/sys/user``), and
bubblewrap's ``--disable-userns``, which uses the same limit.
"""

import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000
FULL = 4294967295  # every id, as the host's own map: "0 0 4294967295"


def _unshare_user() -> None:
    if hasattr(os, "unshare"):  # Python 3.12 and later
        os.unshare(CLONE_NEWUSER)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def main(argv: list) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: nouserns.py -- command [arguments…]", file=sys.stderr)
        return 125
    command = argv[1:]
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    me = os.getpid()
    helper = os.fork()
    if helper == 0:  # stays in the host's namespace: only a process there may write a map of more than one id
        os.close(ready_w)
        os.close(done_r)
        status = 1
        try:
            if os.read(ready_r, 1) == b"1":
                for name in ("uid_map", "gid_map"):
                    _write(f"/proc/{me}/{name}", f"0 0 {FULL}\n")
                status = 0
        except OSError as e:
            print(f"nouserns: cannot map the new user namespace: {e}", file=sys.stderr)
        os.write(done_w, b"0" if status == 0 else b"1")
        os._exit(status)
    os.close(ready_r)
    os.close(done_w)
    try:
        _unshare_user()
    except OSError as e:
        os.write(ready_w, b"0")
        os.waitpid(helper, 0)
        print(f"nouserns: cannot make a user namespace: {e}", file=sys.stderr)
        return 125
    os.write(ready_w, b"1")
    mapped = os.read(done_r, 1) == b"0"
    os.waitpid(helper, 0)
    if not mapped:
        return 125
    try:
        _write("/proc/sys/user/max_user_namespaces", "0\n")
    except OSError as e:
        print(f"nouserns: cannot forbid further user namespaces: {e}", file=sys.stderr)
        return 125
    os.close(ready_w)
    os.close(done_r)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"nouserns: cannot run {command[0]}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
