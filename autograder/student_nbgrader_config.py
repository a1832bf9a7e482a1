"""nbgrader configuration for the students of the course, on a shared server (JupyterHub) with nbgrader's exchange.

Copy it to each student's ``~/.jupyter/nbgrader_config.py``, or once to ``/etc/jupyter/nbgrader_config.py`` in the
students' image. It names the course and the exchange folder, which must be the instructor's
(``autograder/nbgrader_config.py``: the same ``Exchange.root``, or the same ``$COURSEKIT_EXCHANGE``). With it a
student runs ``nbgrader fetch_assignment 02-lora-inside-one-matmul``, ``nbgrader submit 02-lora-inside-one-matmul``
and, once the instructor has released feedback, ``nbgrader fetch_feedback 02-lora-inside-one-matmul`` in a
terminal (or uses JupyterLab's Assignments panel).
"""

import os

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

c.CourseDirectory.course_id = "qlora-backprop"
c.Exchange.root = os.environ.get("COURSEKIT_EXCHANGE", "/usr/local/share/nbgrader/exchange")
