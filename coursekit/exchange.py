"""nbgrader's ``collect``, made safe for a grading account that can read more than the exchange.

nbgrader's exchange is a folder every user writes to, and a student controls what their submission folder holds,
also while it is being collected. nbgrader 0.9's ``collect`` copies each submission into ``submitted/`` with
``shutil.copytree``, which follows symbolic links, as the user who collects: a student who submits a link to a file
only the grading account can read (the answer keys, another student's notebook, a solution) receives its contents
back as a plain file of their own submission (copied on into ``autograded/`` and ``feedback/``), or is graded on it.
Checking for links first is not enough: a file can be swapped for a link between the check and the copy.

:class:`LinkSafeCollect` is nbgrader's collect with its copy replaced: only regular files and folders reach
``submitted/``, each opened without following a link and without blocking, checked on the opened descriptor and
copied from it (a hard link to a file that is not the student's is left out too), in an iterative walk of bounded
depth and length. Every other entry (a symbolic link, a
pipe, a socket, a device) is left out and named in ``links-not-collected.txt``; a submission folder that is itself a
link is not collected. The copy is built in a temporary folder beside its destination and renamed into place only
when it is complete; a submission that cannot be copied is logged and skipped, and the next student is collected.
Every grading route then refuses a folder with that file, with the reason in the student's feedback:
``coursekit grade`` and nbgrader's own autograde (the formgrader's button, through the course's RefuseUnsafe;
coursekit.submissions.refusal); nbgrader's autograde copies a submission's files following links before any
preprocessor looks, so a link must not be there to follow. ``autograder/nbgrader_config.py`` selects it
(``ExchangeFactory.collect``); the exchange is pluggable since nbgrader 0.7
(https://nbgrader.readthedocs.io/en/stable/exchange/index.html).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import tempfile

from nbgrader.exchange.default.collect import ExchangeCollect

from .submissions import LINKS_NOT_COLLECTED, nbgrader_file

_CHUNK = 1 << 20
#: Folders deeper than this in a submission are left out (a lesson needs none; a tree thousands deep would exhaust
#: any recursive walk and any recursive removal).
MAX_DEPTH = 32
#: After this many entries the rest of a submission is left out (grading refuses more than
#: coursekit.submissions.MAX_ENTRIES anyway; this bounds the collect's time and the inodes it makes).
MAX_ENTRIES = 4 * 256
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


class CopyRefused(Exception):
    """A submission folder that is not collected (its reason is the message)."""


def _shown(rel: str) -> str:
    """``rel`` as one line of the list of what was left out (a name may hold a line break or another control)."""
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in rel)


def copy_plain(src: str, dest: str, exclude=(), include=(), max_file_bytes: float | None = None,
               max_total_bytes: float | None = None, log=None) -> list[str]:
    """Copy the folder ``src`` to ``dest`` (which must not exist): regular files and folders only, never through a
    link, and only files that belong to ``src``'s owner and have no other name (a hard link to someone else's file
    is not theirs to hand in). Every folder and file is opened without following a link and without blocking
    (``O_NOFOLLOW``, ``O_NONBLOCK``, ``O_DIRECTORY`` for folders), checked on the opened descriptor and read from it,
    so swapping an entry for a link, a pipe or a device between the listing and the copy gains nothing. The walk is
    iterative, at most :data:`MAX_DEPTH` deep and :data:`MAX_ENTRIES` entries long.

    ``exclude``: name globs left out anywhere; ``include``: if given, a file must match one; ``max_file_bytes``: a
    larger file is left out with a warning (nbgrader's rules). Returns the paths (relative, sorted, control
    characters escaped) of the entries left out for what they are. Raises :class:`CopyRefused` when ``src`` is a
    link or not a folder, or holds more than ``max_total_bytes``; ``dest`` is then removed."""
    try:
        root = os.open(src, _DIR_FLAGS)
    except OSError as e:
        raise CopyRefused(f"the submission folder is a symbolic link or not a folder ({e.strerror})") from None
    owner = os.fstat(root).st_uid
    left_out: list[str] = []
    total = entries = 0
    stack: list[tuple[int, str]] = [(root, "")]
    os.makedirs(dest)
    try:
        while stack and entries <= MAX_ENTRIES:  # past the cap, the folders still listed are closed below
            dirfd, rel_dir = stack.pop()
            try:
                with os.scandir(dirfd) as listing:
                    for entry in listing:
                        name = entry.name
                        rel = f"{rel_dir}/{name}" if rel_dir else name
                        if any(fnmatch.fnmatch(name, g) for g in exclude):
                            continue
                        entries += 1
                        if entries > MAX_ENTRIES:
                            left_out.append(f"(everything after the first {MAX_ENTRIES} entries)")
                            break
                        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            if rel.count("/") + 1 > MAX_DEPTH:
                                left_out.append(f"{rel}/ (deeper than {MAX_DEPTH} folders)")
                                continue
                            try:
                                fd = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
                            except OSError:  # swapped for a link, a pipe or a device since it was listed
                                left_out.append(rel)
                                continue
                            seen = os.fstat(fd)
                            if (seen.st_dev, seen.st_ino) != (st.st_dev, st.st_ino):
                                os.close(fd)
                                left_out.append(rel)
                                continue
                            os.mkdir(os.path.join(dest, rel))
                            stack.append((fd, rel))
                            continue
                        if not stat.S_ISREG(st.st_mode):
                            left_out.append(rel)
                            continue
                        if include and not any(fnmatch.fnmatch(name, g) for g in include):
                            continue
                        try:
                            fd = os.open(name, _FILE_FLAGS, dir_fd=dirfd)
                        except OSError:  # swapped for a link (ELOOP) or removed since it was listed
                            left_out.append(rel)
                            continue
                        with os.fdopen(fd, "rb") as f:
                            seen = os.fstat(f.fileno())
                            if not stat.S_ISREG(seen.st_mode) or seen.st_nlink != 1 or seen.st_uid != owner:
                                left_out.append(rel)
                                continue
                            if max_file_bytes is not None and seen.st_size > max_file_bytes:
                                if log:
                                    log.warning("Ignoring file too large '%s' (see config option "
                                                "CourseDirectory.max_file_size)", os.path.join(src, rel))
                                continue
                            with open(os.path.join(dest, rel), "xb") as out:
                                while chunk := f.read(_CHUNK):
                                    total += len(chunk)
                                    if max_total_bytes is not None and total > max_total_bytes:
                                        raise CopyRefused(f"the submission holds more than {max_total_bytes:,.0f} bytes")
                                    out.write(chunk)
                            os.utime(os.path.join(dest, rel), ns=(seen.st_atime_ns, seen.st_mtime_ns))
            finally:
                os.close(dirfd)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    finally:
        for fd, _ in stack:
            os.close(fd)
    return sorted(_shown(r) for r in left_out)


class LinkSafeCollect(ExchangeCollect):
    """``nbgrader collect`` that copies only regular files and folders of a student's submission (see the module)."""

    def do_copy(self, src, dest, log=None):
        """nbgrader's copy (its ignore and include patterns, file and folder size limits) by :func:`copy_plain`, built
        beside ``dest`` and renamed into place when complete. What is left out is named in
        ``links-not-collected.txt`` (coursekit.submissions.LINKS_NOT_COLLECTED). A submission that cannot be copied
        is logged and skipped (nbgrader would stop the collect for every student after it)."""
        cd = self.coursedir
        parent = os.path.dirname(os.path.abspath(dest))
        os.makedirs(parent, exist_ok=True)
        work = tempfile.mkdtemp(prefix=".collecting-", dir=parent)
        build = os.path.join(work, "copy")
        try:
            left_out = copy_plain(src, build, exclude=list(cd.ignore), include=list(cd.include or []),
                                  max_file_bytes=1000 * cd.max_file_size if cd.max_file_size else None,
                                  max_total_bytes=1000 * cd.max_dir_size if cd.max_dir_size else None, log=self.log)
            marker = os.path.join(build, LINKS_NOT_COLLECTED)
            if os.path.lexists(marker):  # the student's own entry of that name: the name is the collect's
                shutil.rmtree(marker) if os.path.isdir(marker) and not os.path.islink(marker) else os.unlink(marker)
            if left_out:
                self.log.error("Not collecting what is not a regular file or folder in %s: %s", src, ", ".join(left_out))
                with open(marker, "w", encoding="utf-8", errors="backslashreplace") as f:
                    f.write("".join(f"{n}\n" for n in left_out))
            stamp = os.path.join(build, "timestamp.txt")
            if os.path.lexists(stamp) and nbgrader_file(build, "timestamp.txt") is None:
                # nbgrader reads timestamp.txt whole (collect --update, autograde): only a small regular file is
                # kept; the time of the submission is in the exchange folder's name, which collect already used.
                self.log.error("Not keeping %s: not a small regular file", stamp)
                shutil.rmtree(stamp) if os.path.isdir(stamp) else os.unlink(stamp)
            if cd.groupshared:  # as nbgrader does (all of it is ours: no link was copied)
                for dirname, _, filenames in os.walk(build):
                    for p, bits in [(dirname, 0o2770), *((os.path.join(dirname, f), 0o660) for f in filenames)]:
                        mode = os.lstat(p).st_mode
                        if mode & bits != bits:
                            try:
                                os.chmod(p, (mode | bits) & (0o2777 if bits == 0o2770 else 0o777))
                            except PermissionError:
                                self.log.warning("Could not update permissions of %s to make it groupshared", p)
            if os.path.lexists(dest):  # nbgrader removed an older copy before calling us; something else is there
                raise CopyRefused(f"{dest} appeared while the submission was copied")
            os.rename(build, dest)
        except Exception as e:  # noqa: BLE001 - whatever one submission does, the next student is collected
            self.log.error("Not collecting %s: %s", src, e)
        finally:
            shutil.rmtree(work, ignore_errors=True)
