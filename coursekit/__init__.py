"""coursekit: the companion package of the QLoRA backprop course.

Modules (one idea each):

- reference kernels: ``lora`` (one adapted projection), ``lowrank`` (SVD, best rank-k), ``objective``
  (labels, shifts, averaging), ``walk`` (the rank-one walk, softmax/cross-entropy, AdamW and SGD by
  hand), ``attention``, ``mlp``, ``block`` (a tiny pre-norm decoder block with adapters), ``optim``
  (ownership, factor updates), ``artifacts`` (adapter exports, resumable checkpoints), ``merging``;
- checks: ``gradcheck`` (finite differences that name the failing entry), ``probes`` (what is installed
  and which bitsandbytes implementation runs), ``memory`` (the memory ledger);
- the real run: ``model`` (the embedded SmolLM2 checkpoint), ``data`` (the ticket data set and
  batching), ``train`` (adapter, preflight, training loop, export), ``capstone``, ``quantloss`` (a 4-bit data
  type judged by the model's held-out loss with its base in that type);
- grading: ``grading`` (the answer checkers nbgrader calls), ``course`` (the nbgrader pipeline),
  ``cli`` (``coursekit doctor``, ``release``, ``grade``, ``capstone``, ``keys``).

See ../README.md.
"""

__version__ = "0.1.0"
