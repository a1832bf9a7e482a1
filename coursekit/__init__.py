"""coursekit: the companion package of the QLoRA backprop course.

Modules (one idea each): ``lora`` (one adapted projection, forward/backward), ``gradcheck``
(finite differences that name the failing entry), ``grading`` (nbgrader answer checkers),
``probes`` (what is installed and which bitsandbytes backend runs), ``cli`` (``coursekit doctor``,
``coursekit release``, ``coursekit grade``). See ../README.md.
"""

__version__ = "0.1.0"
