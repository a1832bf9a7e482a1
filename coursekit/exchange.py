"""nbgrader's ``collect``, made safe for a grading account that can read more than the exchange.

nbgrader's exchange is a folder every user writes to, and a student controls what their submission folder holds.
nbgrader 0.9's ``collect`` copies each submission into ``submitted/`` with ``shutil.copytree``, which follows
symbolic links, as the user who collects: a student who submits a link to a file only the grading account can read
(the answer keys, another student's notebook, a solution) receives its contents back as a plain file of their own
submission (copied on into ``autograded/`` and ``feedback/``), or is graded on it. :class:`LinkSafeCollect` is
nbgrader's collect with one change: a link is copied as a link, and a submission folder that is itself a link is not
collected. ``coursekit grade`` then refuses a folder that holds a link (coursekit.submissions.refusal), with the
reason in the student's feedback. ``autograder/nbgrader_config.py`` selects it (``ExchangeFactory.collect``); the
exchange is pluggable since nbgrader 0.7 (https://nbgrader.readthedocs.io/en/stable/exchange/index.html).
"""

from __future__ import annotations

import os
import shutil

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.exchange import ignore_patterns

from .submissions import nbgrader_file


class LinkSafeCollect(ExchangeCollect):
    """``nbgrader collect`` that never follows a symbolic link in a student's submission (see the module)."""

    def do_copy(self, src, dest, log=None):
        """nbgrader's copy (its size limit, ignore and include patterns), with links copied as links; a submission
        folder that is a link itself is skipped with an error in the log."""
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
