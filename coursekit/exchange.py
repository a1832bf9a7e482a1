"""nbgrader's ``collect``, made safe for a grading account that can read more than the exchange.

nbgrader's exchange is a folder every user writes to, and a student controls what their submission folder holds.
nbgrader 0.9's ``collect`` copies each submission into ``submitted/`` with ``shutil.copytree``, which follows
symbolic links, as the user who collects: a student who submits a link to a file only the grading account can read
(the answer keys, another student's notebook, a solution) receives its contents back as a plain file of their own
submission (copied on into ``autograded/`` and ``feedback/``), or is graded on it. :class:`LinkSafeCollect` is
nbgrader's collect with one change: no symbolic link reaches ``submitted/``. A link in a submission is not copied (its
path is written to ``links-not-collected.txt`` in its place), and a submission folder that is itself a link is not
collected. Every grading route then refuses that submission, with the reason in the student's feedback:
``coursekit grade`` and nbgrader's own autograde (the formgrader's button, through the course's RefuseUnsafe;
coursekit.submissions.refusal); nbgrader's autograde copies a submission's files following links before any
preprocessor looks, so a link must not be there to follow. ``autograder/nbgrader_config.py`` selects it (``ExchangeFactory.collect``); the
exchange is pluggable since nbgrader 0.7 (https://nbgrader.readthedocs.io/en/stable/exchange/index.html).
"""

from __future__ import annotations

import os
import shutil

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.exchange import ignore_patterns

from .submissions import LINKS_NOT_COLLECTED, nbgrader_file


class LinkSafeCollect(ExchangeCollect):
    """``nbgrader collect`` that never follows a symbolic link in a student's submission (see the module)."""

    def do_copy(self, src, dest, log=None):
        """nbgrader's copy (its size limit, ignore and include patterns), without the links: each is left out and
        named in ``links-not-collected.txt`` (coursekit.submissions.LINKS_NOT_COLLECTED); a submission folder that
        is a link itself is skipped with an error in the log."""
        if os.path.islink(src) or not os.path.isdir(src):
            self.log.error("Not collecting %s: the submission folder is a symbolic link (or not a folder)", src)
            return
        dir_size = self.get_size(src)
        if dir_size > 1000 * self.coursedir.max_dir_size:
            self.log.error("Directory size is too big")
            raise RuntimeError(f"Directory size is too big. Size is {dir_size}, maximum size is "
                               f"{1000 * self.coursedir.max_dir_size}")
        shutil.copytree(src, dest, symlinks=True,
                        ignore=ignore_patterns(exclude=self.coursedir.ignore, include=self.coursedir.include,
                                               max_file_size=self.coursedir.max_file_size, log=self.log))
        left_out = []
        for dirpath, dirnames, filenames in os.walk(dest, followlinks=False):
            for name in [*dirnames, *filenames]:
                p = os.path.join(dirpath, name)
                if os.path.islink(p):
                    os.unlink(p)
                    left_out.append(os.path.relpath(p, dest))
        marker = os.path.join(dest, LINKS_NOT_COLLECTED)
        if os.path.lexists(marker):  # the student's own file of that name: the name is the collect's
            shutil.rmtree(marker) if os.path.isdir(marker) and not os.path.islink(marker) else os.unlink(marker)
        if left_out:
            self.log.error("Not collecting the symbolic links of %s: %s", src, ", ".join(sorted(left_out)))
            with open(marker, "w", encoding="utf-8", errors="backslashreplace") as f:
                f.write("".join(f"{n}\n" for n in sorted(left_out)))
        stamp = os.path.join(dest, "timestamp.txt")
        if os.path.lexists(stamp) and nbgrader_file(dest, "timestamp.txt") is None:
            # nbgrader reads timestamp.txt whole, following a link (collect --update, autograde): one linked to
            # /dev/zero is read until memory runs out. Only a small regular file is kept; the time of the
            # submission is in the exchange folder's name, which collect already used.
            self.log.error("Not keeping %s: not a small regular file", stamp)
            if os.path.isdir(stamp) and not os.path.islink(stamp):
                shutil.rmtree(stamp)
            else:
                os.unlink(stamp)
        if self.coursedir.groupshared:  # as nbgrader does, but never through a link (chmod would change its target)
            for dirname, _, filenames in os.walk(dest):
                for p, bits in [(dirname, 0o2770), *((os.path.join(dirname, f), 0o660) for f in filenames)]:
                    if os.path.islink(p):
                        continue
                    mode = os.lstat(p).st_mode
                    if mode & bits != bits:
                        try:
                            os.chmod(p, (mode | bits) & (0o2777 if bits == 0o2770 else 0o777))
                        except PermissionError:
                            self.log.warning("Could not update permissions of %s to make it groupshared", p)
