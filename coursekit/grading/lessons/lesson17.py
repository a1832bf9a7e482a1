"""Graded items of lesson 17, "What QLoRA actually costs" (solutions/17-what-qlora-actually-costs).

Numeric items and the ``ledger_gb`` function are checked against :mod:`coursekit.memory`; choice keys
live encoded in ``keys/17.key``.
"""

from __future__ import annotations

import numpy as np

from ... import memory
from .. import Choice, Function, Numeric
from ..checkers import Case, Mistake

READ_LEDGER = "(Lesson 17, 'The ledger, bucket by bucket'.)"
READ_META = "(Lesson 17, 'The metadata the QLoRA column leaves out'.)"
READ_UNITS = "(Lesson 17, 'Vary it'.)"


# --------------------------------------------------------------------------- the reference


def ledger_gb(n_params, n_adapter, method, double_quant=True):
    """Reference for p5: lesson 01's ledger partial total in decimal GB, plus NF4 block scales under ``"qlora"``.

    Buckets from :func:`coursekit.memory.ledger` (bf16 weights and gradients, two fp32 Adam moments,
    4-bit codes); metadata from :func:`coursekit.memory.nf4_metadata_bytes` (blocksize 64, blocksize2 256).
    """
    b = memory.total(memory.ledger(n_params, n_adapter, method))
    if str(method).strip().lower() == "qlora":
        b += memory.nf4_metadata_bytes(n_params, double_quant=bool(double_quant))
    return memory.to_gb(b)


def _gb(n, a, method, double_quant=True, meta_scale=1.0, **kw) -> float:
    b = memory.total(memory.ledger(n, a, method, **kw))
    if method == "qlora":
        b += meta_scale * memory.nf4_metadata_bytes(n, double_quant=double_quant)
    return memory.to_gb(b)


METHODS = ("full", "lora", "qlora")
P1_RTOL = 5e-4    # P1's total (about 4.9 GB) given to three decimals passes; two decimals do not
P5_RTOL = 1e-6


def _fixed(label: str, value, message: str) -> Mistake:
    """A mistake whose message quotes only the ledger's fixed rates (bytes per parameter, 1e9 bytes per GB), never a
    case's sizes: the message is its own hint, shown on hidden cases too."""
    return Mistake(label, value, message, hint=message)


def _total_mistakes(n: float, a: float, method: str, double_quant: bool = True, rtol: float = P5_RTOL,
                    in_function: bool = True) -> list[Mistake]:
    """The classic wrong totals for one configuration, each with what went wrong."""
    right = _gb(n, a, method, double_quant)
    dq_word = "with" if double_quant else "without"
    out = [
        _fixed("one moment", _gb(n, a, method, double_quant, n_moments=1),
               "you forgot Adam's second moment: AdamW keeps two fp32 buffers (m and v) per trainable parameter, "
               f"8 bytes, not 4. {READ_LEDGER}"),
        _fixed("no moments", _gb(n, a, method, double_quant, n_moments=0),
               f"you left out the optimizer state: two fp32 Adam moments per trainable parameter (8 bytes). {READ_LEDGER}"),
        _fixed("GiB", right * 1e9 / 2**30,
               f"your total looks like it is in GiB (2**30 bytes); the ledger uses decimal GB, 1 GB = 1e9 bytes. {READ_UNITS}"),
        Mistake("bytes", right * 1e9, "your total looks like it is in bytes; the answer is in decimal GB (divide by 1e9).",
                hint=f"your total looks like it is in bytes; the answer is in decimal GB (divide by 1e9). {READ_UNITS}"),
    ]
    # a function that does not recognise the method string computes another column of the table
    for other in METHODS if in_function else ():
        if other != method:
            out.append(Mistake(f"{other} column", _gb(n, a, other, double_quant),
                               f"that is the {other!r} column, but this case has method={method!r}: check how your "
                               f"function tells the methods apart (the cases pass 'full', 'lora' or 'qlora', lowercase). "
                               f"{READ_LEDGER}"))
    if method in ("lora", "qlora"):
        out += [
            _fixed("base gradients", right + 2 * n / 1e9,
                   "you counted gradients for the frozen base (2 bytes per base parameter). Under LoRA and QLoRA "
                   f"the base is frozen: no gradient is stored for it, only for the adapter. {READ_LEDGER}"),
            _fixed("base trained", right + 10 * n / 1e9,
                   "you gave the frozen base gradients and Adam moments (10 bytes per base parameter): under LoRA and "
                   f"QLoRA only the adapter trains. {READ_LEDGER}"),
            _fixed("no adapter", right - 12 * a / 1e9,
                   f"you left out the adapter bucket: its bf16 weights and gradients and two fp32 moments, 12 bytes per "
                   f"adapter parameter. {READ_LEDGER}"),
        ]
    if method == "qlora":
        meta = memory.to_gb(memory.nf4_metadata_bytes(n, double_quant=double_quant))
        out += [
            _fixed("4 bytes", right + (4 - 0.5) * n / 1e9,
                   "you counted each 4-bit code as 4 bytes. Four *bits* are half a byte: two NF4 codes share one byte, "
                   f"so the base codes take n_params / 2 bytes. {READ_LEDGER}"),
            _fixed("bf16 base", right + 1.5 * n / 1e9,
                   f"you stored the QLoRA base in bf16 (2 bytes per weight); QLoRA stores 4-bit codes, half a byte. {READ_LEDGER}"),
            Mistake("no metadata", right - meta,
                    f"you left out the NF4 block scales ({dq_word} double quantization here); the task adds them to the "
                    f"QLoRA column. {READ_META}"),
            _fixed("metadata in bytes", right + 7 * meta,
                   "your metadata is 8 times too large: the overhead is 0.5 (or ≈0.127) *bits* per parameter; divide "
                   f"bits by 8 to get bytes. {READ_META}"),
            Mistake("other double_quant", _gb(n, a, method, not double_quant),
                    f"that total uses the metadata {'without' if double_quant else 'with'} double quantization; this case "
                    f"has double_quant={double_quant}. {READ_META}"),
        ]
    if method == "full":
        out.append(Mistake("adapter in full FT", right + 12 * a / 1e9,
                           "full fine-tuning trains the base itself and has no adapter: leave the adapter bucket out. "
                           f"{READ_LEDGER}"))
    for digits in (0, 1, 2, 3):
        if not np.isclose(round(right, digits), right, rtol=rtol):
            # digits is how far the student's value was rounded and rtol the item's tolerance: neither comes from
            # the case's inputs, so the message is its own hint
            out.append(_fixed("rounded", round(right, digits),
                              f"your total looks rounded to {digits} decimal{'s' if digits != 1 else ''}, which is coarser "
                              f"than the tolerance (relative {rtol:g}): " + ("return the unrounded value." if in_function
                                                                             else "give two decimals or more.")))
    return [m for m in out if not np.isclose(m.value, right, rtol=1e-9)]


# --------------------------------------------------------------------------- p5: cases


def _p5_public() -> list[Case]:
    return [
        Case({"n_params": 7_000_000_000, "n_adapter": 20_000_000, "method": "full", "double_quant": True}, "seed: 7B, full fine-tuning (84 GB)"),
        Case({"n_params": 7_000_000_000, "n_adapter": 20_000_000, "method": "lora", "double_quant": True}, "seed: 7B, LoRA (14.24 GB)"),
        Case({"n_params": 7_000_000_000, "n_adapter": 20_000_000, "method": "qlora", "double_quant": False},
             "seed: 7B, QLoRA, metadata without double quantization"),
        Case({"n_params": 7_000_000_000, "n_adapter": 20_000_000, "method": "qlora", "double_quant": True},
             "seed: 7B, QLoRA, metadata with double quantization"),
    ]


def _p5_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for method, dq in (("full", True), ("lora", False), ("qlora", True), ("qlora", False), ("qlora", True), ("lora", True)):
        n = int(rng.integers(10**8, 10**11))
        a = int(rng.integers(10**5, 10**8))
        cases.append(Case({"n_params": n, "n_adapter": a, "method": method, "double_quant": dq}))
    return cases


def _p5_mistakes(kwargs: dict, answers: dict) -> dict[str, list[Mistake]]:
    return {"total_gb": _total_mistakes(kwargs["n_params"], kwargs["n_adapter"], kwargs["method"], kwargs["double_quant"])}


# --------------------------------------------------------------------------- p1, p2, p4: numbers

# P1: the policy this lesson measured on SmolLM2, carried to a 7B-class model with an untied output head. The ledger
# prices every base parameter at half a byte and the adapter at 12 bytes; what load_model("nf4"),
# prepare_model_for_kbit_training and PEFT leave is different: the embedding and the output head are not quantized
# (transformers keeps the output embedding out of 4 bits) and are cast to fp32, and the adapter, its gradients and both
# AdamW moments are fp32, 16 bytes per adapter parameter. Norms, NF4 metadata and activations are left out (the prompt
# says so). tests/test_lesson17_items.py measures this policy on a real 4-bit load of an untied model.
P1 = dict(n=6.74e9, vocab=32_000, hidden=4_096, a=40e6)
READ_POLICY = "(Lesson 17, 'Measured: weights and metadata' and 'Measured: adapter, gradients and AdamW state'.)"


def policy_bytes(n, vocab, hidden, a, *, code_bytes=0.5, kept_bytes=4, adapter_bytes=16, heads=2) -> float:
    """Persistent bytes under the measured policy: ``heads`` vocab × hidden matrices (embedding and untied output head)
    kept out of 4 bits at ``kept_bytes`` each value, every other base parameter a 4-bit code, ``adapter_bytes`` per
    adapter parameter (fp32 weight, gradient and two AdamW moments)."""
    kept = heads * vocab * hidden
    return (n - kept) * code_bytes + kept * kept_bytes + a * adapter_bytes


def _p1_expected() -> float:
    return policy_bytes(**P1) / 1e9


def _p1_mistakes() -> list[Mistake]:
    right = _p1_expected()
    gb = lambda **kw: policy_bytes(**P1, **kw) / 1e9
    out = [
        _fixed("ledger policy", (P1["n"] * 0.5 + P1["a"] * 12) / 1e9,
               "that is the ledger's policy (every base parameter half a byte, 12 bytes per adapter parameter), the one "
               f"this question asks you to replace with the measured one. {READ_POLICY}"),
        _fixed("embedding in bf16", gb(kept_bytes=2),
               "you kept the embedding and the output head in bf16: prepare_model_for_kbit_training casts every bf16 "
               f"parameter that is not a Params4bit to fp32, 4 bytes per value. {READ_POLICY}"),
        _fixed("embedding quantized", gb(code_bytes=0.5, kept_bytes=0.5),
               "you quantized the embedding and the output head too: only the decoder's linear layers become 4-bit; the "
               f"embedding and the output head stay out of 4 bits, in fp32 after the preparation. {READ_POLICY}"),
        _fixed("tied head", gb(heads=1),
               "you counted one vocab × hidden matrix: this model's output head is not tied to its embedding, so two of "
               f"them stay out of 4 bits. {READ_POLICY}"),
        _fixed("adapter at 12 bytes", gb(adapter_bytes=12),
               "you counted 12 bytes per adapter parameter (the ledger's bf16 weights and gradients, or fp32 with one Adam "
               "moment forgotten): PEFT keeps the adapter and its gradient in fp32 and AdamW keeps two fp32 moments, "
               f"4 + 4 + 2 · 4 = 16 bytes. {READ_POLICY}"),
        _fixed("adapter weights only", gb(adapter_bytes=4),
               "you counted only the adapter's fp32 weights: each adapter parameter also has an fp32 gradient and two fp32 "
               f"AdamW moments, 16 bytes in all. {READ_POLICY}"),
        _fixed("4 bytes", gb(code_bytes=4),
               "you counted each 4-bit code as 4 bytes. Four *bits* are half a byte: two NF4 codes share one byte. "
               f"{READ_LEDGER}"),
        _fixed("GiB", right * 1e9 / 2**30,
               f"your total looks like it is in GiB (2**30 bytes); the answer is in decimal GB, 1 GB = 1e9 bytes. {READ_UNITS}"),
        _fixed("bytes", right * 1e9, f"your total looks like it is in bytes; the answer is in decimal GB (divide by 1e9). {READ_UNITS}"),
    ]
    for digits in (0, 1, 2):
        if not np.isclose(round(right, digits), right, rtol=P1_RTOL):
            out.append(_fixed("rounded", round(right, digits),
                              f"your total looks rounded to {digits} decimal{'s' if digits != 1 else ''}, which is coarser "
                              f"than the tolerance (relative {P1_RTOL:g}): give three decimals or more."))
    return [m for m in out if not np.isclose(m.value, right, rtol=1e-9)]


# P2: the loss scaler's order, predicted. A run clips gradients to a total norm of 1.0 under torch.amp.GradScaler at its
# default starting scale S = 2**16, but calls clip_grad_norm_ before unscale_ (scaler.step unscales afterwards). The
# true gradients have total norm 0.5. clip_grad_norm_ sees the scaled ones, norm 0.5 · S, scales them to norm 1.0
# (coefficient max_norm / (norm + 1e-6), torch's own), and scaler.step divides by S: the optimizer steps with norm
# 1/S, as if the threshold were S times smaller. tests/test_lesson17_items.py runs the loop and each mistaken reading.
P2 = dict(scale=2.0**16, max_norm=1.0, true_norm=0.5)
READ_MIXED = "(Lesson 17, 'The mixed-precision contract'.)"


def _clipped_norm(scale: float = P2["scale"], max_norm: float = P2["max_norm"], true_norm: float = P2["true_norm"],
                  unscale_after: bool = True) -> float:
    """The total norm the optimizer steps with when clip_grad_norm_ runs on gradients scaled by ``scale`` (torch's
    clip: multiply by min(1, max_norm / (norm + 1e-6))), then, if ``unscale_after``, scaler.step divides by ``scale``."""
    seen = true_norm * scale
    clipped = seen * min(1.0, max_norm / (seen + 1e-6))
    return clipped / scale if unscale_after else clipped


def _p2_mistakes() -> list[Mistake]:
    return [
        Mistake("as if unscaled first", _clipped_norm(scale=1.0),
                "0.5 is what the right order gives: unscale_ first, the norm 0.5 is under the threshold and nothing is "
                "clipped. Here clip_grad_norm_ runs on the scaled gradients, norm 0.5 · S = 32,768, and scales them down "
                f"to 1.0 before scaler.step divides them by S. {READ_MIXED}"),
        Mistake("clipped, not unscaled", _clipped_norm(unscale_after=False),
                "1.0 is the norm clip_grad_norm_ leaves on the scaled gradients; scaler.step still divides them by S "
                f"before the optimizer uses them, so the step sees 1.0 / S. {READ_MIXED}"),
        Mistake("the scaled norm", P2["true_norm"] * P2["scale"],
                "32,768 is the norm clip_grad_norm_ measures (and returns): the scaled gradients, 0.5 · S. Being above "
                f"1.0, they are scaled down to norm 1.0, and then scaler.step divides them by S. {READ_MIXED}"),
    ]


# P4: what a checkpointed forward keeps for backward, scaled to a bigger micro-batch. The lesson measured it as the loss's
# fp32 log-softmax (tokens × vocabulary) plus one fp32 hidden state (tokens × hidden size) per checkpointed decoder layer,
# and a little more. SmolLM2-135M's config: vocabulary 49,152, hidden size 576, 30 decoder layers.
P4 = dict(batch=4, seq=512, vocab=49152, hidden=576, layers=30)
READ_CKPT = "(Lesson 17, 'Measured: gradient checkpointing'.)"


def _p4_bytes(batch=P4["batch"], seq=P4["seq"], vocab=P4["vocab"], hidden=P4["hidden"], layers=P4["layers"],
              nbytes=4) -> float:
    """Bytes of the loss's log-softmax (batch · seq × vocab) plus ``layers`` layer inputs (batch · seq × hidden)."""
    return batch * seq * (vocab + layers * hidden) * nbytes


def _p4_expected() -> float:
    return _p4_bytes() / 1e6


def _p4_mistakes() -> list[Mistake]:
    return [
        Mistake("log-softmax only", _p4_bytes(layers=0) / 1e6, "you counted only the loss's log-softmax: with checkpointing "
                f"each decoder layer still keeps its input, one fp32 hidden state per token, for its recomputation. {READ_CKPT}"),
        Mistake("layer inputs only", _p4_bytes(vocab=0) / 1e6, "you counted only the layer inputs: the loss's log-softmax sits "
                f"after the last checkpointed layer, so its full-vocabulary fp32 tensor is kept as well. {READ_CKPT}"),
        Mistake("2 bytes", _p4_bytes(nbytes=2) / 1e6, "you counted 2 bytes per number: the log-softmax and the saved hidden "
                f"states are fp32 in this run, 4 bytes each. {READ_CKPT}"),
        Mistake("one sequence", _p4_bytes(batch=1) / 1e6, "you counted one sequence of 512 tokens: the micro-batch holds 4, "
                f"and every saved tensor has one row per token. {READ_CKPT}"),
        Mistake("MiB", _p4_bytes() / 2**20, f"that is in MiB (2²⁰ bytes); the question asks for decimal MB, 10⁶ bytes. {READ_UNITS}"),
        Mistake("bytes", _p4_bytes(), "that is in bytes; the question asks for MB (10⁶ bytes)."),
    ]


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 18

ITEMS = {
    # ------------------------------------------------------------------ warm-up
    "w1": Choice(
        "which bucket grows, and by how much, when the adapter goes from 20M to 200M parameters (7B base, QLoRA)",
        0,
        key="a",
        explain={
            "a": "Only the adapter's bucket depends on the adapter's size: 12 bytes per trainable parameter (2 weight + 2 gradient + 8 for two fp32 Adam moments), so 180M more parameters add 180e6 × 12 bytes = 2.16 GB, from 0.24 to 2.4 GB. The base's codes, gradients and moments do not change. (Lesson 17, 'The ledger, bucket by bucket'.)",
            "b": "0.36 GB is 180M × 2 bytes: the new weights alone. Each trainable parameter also gets a bf16 gradient and two fp32 Adam moments, 12 bytes in all, so the bucket grows by 2.16 GB. (Lesson 17, 'The ledger, bucket by bucket'.)",
            "c": "The adapter is not part of the quantized base: its parameters are trained, in 16 bits, with gradients and Adam moments. The base's codes stay 7e9 × 0.5 bytes = 3.5 GB whatever the adapter's size. (Lesson 17, 'The ledger, bucket by bucket'.)",
            "d": "1.44 GB is 180M × 8 bytes, the two fp32 moments only. The adapter's bucket holds its weights and gradients too (2 + 2 bytes), 12 bytes per parameter, so it grows by 2.16 GB. (Lesson 17, 'The ledger, bucket by bucket'.)",
        },
    ),
    "w2": Choice(
        "which memory term grows with the batch",
        0,
        key="c",
        explain={
            "a": "A gradient has its parameter's shape, whatever the batch: autograd sums every token's contribution into the one .grad tensor of each adapter parameter, so the adapter's gradients cost the same for one example or a thousand. (Lesson 17, 'Measured: adapter, gradients and AdamW state'.)",
            "b": "AdamW keeps two moments per trainable parameter, a fixed cost of the adapter's size, the same for one token or a million. (Lesson 17, 'The ledger, bucket by bucket'.)",
            "c": "Autograd saves, for every layer, the tensors its backward needs (inputs of the matmuls, attention probabilities, the loss's log-softmax), and each of them has one row per token: batch × sequence length. That is why the ledger's persistent buckets leave activations out and the lesson measures them separately. (Lesson 17, 'Measured: activations saved for backward'.)",
            "d": "bitsandbytes dequantizes a weight for its matmul and frees the copy afterwards (MatMul4Bit keeps only the packed codes for the backward pass, lesson 16): the copy has the weight's shape, out × in, whatever the batch. (Lesson 17, 'Measured: activations saved for backward'.)",
        },
    ),
    "w3": Choice(
        "what gradient checkpointing trades",
        0,
        key="b",
        explain={
            "a": "Checkpointing changes which activations are kept, not their precision. (Lesson 17, 'Measured: gradient checkpointing'.)",
            "b": "With checkpointing each decoder layer runs its forward saving only its input, and during backward it runs that forward again to rebuild the tensors its backward needs, one layer at a time. So you pay an extra forward of every checkpointed layer to keep less: in the lesson the forward kept about 5× less, not 30×, because the loss's full-vocabulary log-softmax sits after the last checkpointed layer. (Lesson 17, 'Measured: gradient checkpointing'.)",
            "c": "The optimizer state is untouched: AdamW still holds two moments per trainable parameter. (Lesson 17, 'Measured: gradient checkpointing'.)",
            "d": "The weights stay where they are: checkpointing only drops activations saved for backward. (Lesson 17, 'Measured: gradient checkpointing'.)",
        },
    ),
    # ------------------------------------------------------------------ practice
    "p1": Numeric(
        "the measured policy on a 7B-class model: fp32 embedding and untied head, fp32 adapter (16 bytes per parameter)",
        2,
        name="persistent_gb",
        expected=_p1_expected,
        rtol=P1_RTOL,
        mistakes=_p1_mistakes,
        unit="GB",
    ),
    "p2": Numeric(
        "the gradient norm the optimizer steps with when clipping to 1.0 runs before the loss scaler's unscale_",
        1,
        name="grad_norm",
        expected=_clipped_norm,
        rtol=1e-3,  # the prompt asks for 3 significant digits
        mistakes=_p2_mistakes,
    ),
    "p3": Choice(
        "the loss's saved log-softmax when 48 of each row's 64 labels are masked with -100",
        1,
    ),
    "p4": Numeric(
        "the checkpointed activations of 4 × 512 tokens: the loss's log-softmax and 30 layer inputs",
        2,
        name="saved_mb",
        expected=_p4_expected,
        rtol=2e-3,  # the prompt asks for 3 significant digits
        mistakes=_p4_mistakes,
        unit="MB",
    ),
    "p5": Function(
        "implement ledger_gb (partial total plus NF4 metadata)",
        4,
        name="ledger_gb",
        reference=ledger_gb,
        public=_p5_public,
        hidden=_p5_hidden,
        outputs=("total_gb",),
        mistakes=_p5_mistakes,
        rtol=P5_RTOL,
        atol=1e-9,
    ),
    "p6": Choice(
        "a bf16 weight of 1.0 after 1,000 steps of +0.001",
        1,
    ),
}
