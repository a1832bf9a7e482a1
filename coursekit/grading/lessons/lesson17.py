"""Graded items of lesson 17, "What QLoRA actually costs" (solutions/17-what-qlora-actually-costs).

Numeric items are checked against :mod:`coursekit.memory` and torch, the ``saved_bytes`` function against
:class:`coursekit.memory.SavedTensors`; choice keys live in the instructor's ``autograder/keys/17.json``.
"""

from __future__ import annotations

import numpy as np
import torch

from ... import memory
from .. import Choice, Function, Numeric
from ..checkers import Case, Mistake, worded

READ_LEDGER = "(Lesson 17, 'The ledger, bucket by bucket'.)"
READ_UNITS = "(Lesson 17, 'Vary it'.)"


# --------------------------------------------------------------------------- p5: counting what autograd saves

READ_SAVED = "(Lesson 17, 'Measured: activations saved for backward'.)"


class GatedBlock(torch.nn.Module):
    """P5's cases: a small decoder MLP as lesson 09 wrote it, behind an RMSNorm, with a frozen base (the norm's weight
    and the gate, up and down projections, bias-free) and LoRA adapters (trainable ``lora_A``, ``lora_B``, r = 2) on
    the projections named in ``adapted``. The weights are drawn from ``seed``."""

    def __init__(self, d: int, h: int, adapted: tuple[str, ...], seed: int, r: int = 2) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        shapes = {"gate": (d, h), "up": (d, h), "down": (h, d)}
        self.norm_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(d, generator=g), requires_grad=False)
        self.base = torch.nn.ModuleDict()
        self.lora_A, self.lora_B = torch.nn.ModuleDict(), torch.nn.ModuleDict()
        for name, (din, dout) in shapes.items():
            lin = torch.nn.Linear(din, dout, bias=False)
            lin.weight = torch.nn.Parameter(torch.randn(dout, din, generator=g) / din**0.5, requires_grad=False)
            self.base[name] = lin
            if name in adapted:
                self.lora_A[name] = torch.nn.Linear(din, r, bias=False)
                self.lora_A[name].weight = torch.nn.Parameter(torch.randn(r, din, generator=g) / din**0.5)
                self.lora_B[name] = torch.nn.Linear(r, dout, bias=False)
                self.lora_B[name].weight = torch.nn.Parameter(0.1 * torch.randn(dout, r, generator=g))

    def _proj(self, name: str, x: torch.Tensor) -> torch.Tensor:
        y = self.base[name](x)
        if name in self.lora_A:
            y = y + 2.0 * self.lora_B[name](self.lora_A[name](x))
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_weight
        return self._proj("down", torch.nn.functional.silu(self._proj("gate", x)) * self._proj("up", x))


def saved_bytes(model, x):
    """Reference for p5: the bytes autograd saves for backward while ``model(x)`` runs, each distinct storage once,
    the model's parameters and buffers left out: what :class:`coursekit.memory.SavedTensors` counts."""
    with memory.SavedTensors(exclude=model) as saved:
        out = model(x)
    del out
    return saved.nbytes


def count_saves(model, x, *, dedup: bool = True, exclude_params: bool = True, unit: str = "bytes") -> int:
    """What autograd saves during ``model(x)``, counted with one of P5's likely mistakes switched on: ``dedup=False``
    adds a storage once per save (a tensor saved by two operations counts twice), ``exclude_params=False`` keeps the
    frozen weights that a matmul saves for its input gradient, ``unit="elements"`` counts numbers, not bytes."""
    params = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
    seen, total = {}, 0

    def pack(t):
        nonlocal total
        s = t.untyped_storage()
        if exclude_params and s.data_ptr() in params:
            return t
        size = s.nbytes() if unit == "bytes" else s.nbytes() // t.element_size()
        if not dedup:
            total += size
        elif s.data_ptr() not in seen:
            seen[s.data_ptr()] = (s, size)   # the storage itself, held until the end: its address cannot be reused
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    del out
    return total if not dedup else sum(size for _, size in seen.values())


def _p5_case(d: int, h: int, n: int, adapted: tuple[str, ...], x_grad: bool, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, d, generator=g).requires_grad_(x_grad)
    return {"model": GatedBlock(d, h, adapted, seed), "x": x}


def _p5_public() -> list[Case]:
    return [
        Case(_p5_case(8, 16, 4, ("up",), True, 1), "adapter on up; x requires grad (a layer above trains)"),
        Case(_p5_case(8, 16, 4, ("gate", "up"), False, 2), "adapters on gate and up; x requires no grad"),
        Case(_p5_case(6, 12, 3, ("gate", "up", "down"), True, 3), "adapters on gate, up and down; x requires grad"),
    ]


def _p5_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for x_grad in (True, False, True, False, True, True):
        # without an input gradient the norm saves nothing: two adapters that read the same normed x make the repeat
        pool = ("gate", "up", "down")
        k = int(rng.integers(1, 4)) if x_grad else int(rng.integers(2, 4))
        adapted = tuple(sorted(rng.choice(pool, size=k, replace=False))) if x_grad else \
            tuple(sorted({"gate", "up"} | set(rng.choice(pool, size=k - 2, replace=False))))
        cases.append(Case(_p5_case(int(rng.integers(4, 12)), int(rng.integers(8, 24)), int(rng.integers(1, 6)),
                                   adapted, x_grad, int(rng.integers(0, 2**31)))))
    return cases


def _p5_mistakes(kwargs: dict, answers: dict) -> dict[str, list[Mistake]]:
    model, x = kwargs["model"], kwargs["x"]
    run = lambda **kw: count_saves(model, x.detach().clone().requires_grad_(x.requires_grad), **kw)
    right = run()
    out = [
        Mistake("every save", run(dedup=False),
                "you added a storage once per save: one tensor saved by two operations (the norm's input, or the normed "
                "x that two adapters read) holds its bytes once. Keep the storages you have seen and count each once. "
                + READ_SAVED),
        Mistake("parameters counted", run(exclude_params=False),
                "you counted the model's own parameters: a frozen weight that a matmul saves to form its input gradient "
                "is already in the weights bucket. Leave out every storage of model.parameters(). " + READ_SAVED),
        Mistake("elements", run(unit="elements"),
                "that is a count of numbers, not of bytes: multiply by each tensor's element_size() (4 for fp32), or "
                "take untyped_storage().nbytes(). " + READ_SAVED),
    ]
    return {"nbytes": worded([m for m in out if m.value != right])}   # the messages quote no case's sizes


# --------------------------------------------------------------------------- p1, p2, p4: numbers

P1_RTOL = 5e-4    # P1's total (about 4.9 GB) given to three decimals passes; two decimals do not


def _fixed(label: str, value, message: str) -> Mistake:
    """A mistake whose message quotes only fixed rates (bytes per parameter, 1e9 bytes per GB), never a case's sizes:
    the message is its own hint."""
    return Mistake(label, value, message, hint=message)


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


# P4: what a checkpointed forward keeps for backward, on a model of another shape and without the preparation's fp32
# cast. The lesson measured the checkpointed forward as one input per decoder layer (tokens × hidden size, in the
# residual stream's dtype) plus, after the last layer, the loss's log-softmax (tokens × vocabulary, fp32 whatever the
# logits' dtype: transformers' ForCausalLMLoss begins with logits.float()), and a little more (what the final
# norm keeps, the labels). P4's colleague attaches the adapter with attach_adapter(..., quantized=False), which skips
# prepare_model_for_kbit_training: the embedding and the norms keep load_model("nf4")'s bf16, and so does the residual
# stream, so the layer inputs are bf16 while the log-softmax stays fp32. The sizes are no model this lesson loads (a
# Llama-architecture model with a bigger vocabulary and hidden size), so the printed SmolLM2 numbers do not scale to
# them. tests/test_lesson17_items.py measures both terms on SmolLM2 without the preparation (the notebook measures it
# with it) and on a tiny Llama of another shape, prepared (the fp32 layer inputs of the "layer inputs in fp32" mistake)
# and not (the key); that no logits are saved; and the bf16 log-softmax cross_entropy keeps when nothing upcasts (the
# "log-softmax in bf16" mistake).
P4 = dict(batch=4, seq=512, vocab=128_256, hidden=2_048, layers=16)
SMOLLM2 = dict(vocab=49_152, hidden=576, layers=30)   # the lesson's model (the converted checkpoint's config.json)
READ_CKPT = "(Lesson 17, 'Measured: gradient checkpointing'.)"
READ_LOSS = "(Lesson 17, 'Measured: activations saved for backward'.)"


def checkpointed_saved_bytes(tokens: int, vocab: int, hidden: int, layers: int, *, stream_bytes: int = 4,
                             loss_bytes: int = 4, logits_bytes: int = 0) -> int:
    """The two big terms a forward with one reentrant checkpoint per decoder layer keeps for backward, in bytes: the input
    of each checkpointed layer (``layers`` hidden states of ``tokens`` × ``hidden``, ``stream_bytes`` each: the residual
    stream's dtype, 4 after prepare_model_for_kbit_training, 2 without it) and the loss's log-softmax (``tokens`` ×
    ``vocab``, ``loss_bytes`` each: 4, since the loss upcasts the logits). ``logits_bytes`` > 0 adds the logits as a
    third saved tensor (a mistake: nothing saves them). The little rest (the final norm's statistics, the labels) is
    left out."""
    return tokens * (layers * hidden * stream_bytes + vocab * (loss_bytes + logits_bytes))


def _p4_mb(**kw) -> float:
    """P4's sizes through :func:`checkpointed_saved_bytes` (bf16 residual stream), in MB; ``batch`` and the function's
    keywords override."""
    batch = kw.pop("batch", P4["batch"])
    kw = {"stream_bytes": 2, **kw}
    return checkpointed_saved_bytes(batch * P4["seq"], kw.pop("vocab", P4["vocab"]), P4["hidden"],
                                    kw.pop("layers", P4["layers"]), **kw) / 1e6


def _p4_expected() -> float:
    return _p4_mb()


P4_RTOL = 1e-3   # the prompt asks for the nearest MB (about 1,185 MB): 1 MB is 0.08 %


def _p4_mistakes() -> list[Mistake]:
    right = _p4_mb()
    out = [
        Mistake("layer inputs in fp32", _p4_mb(stream_bytes=4),
                "you counted the layer inputs in fp32, as in this lesson's run. There prepare_model_for_kbit_training had "
                "cast the embedding and the norms to fp32, and the residual stream followed; skipped, they keep the bf16 "
                "that load_model('nf4') gives them, and so does every hidden state a checkpoint keeps: 2 bytes per number. "
                "(Lesson 17, 'The mixed-precision contract'.)"),
        Mistake("log-softmax in bf16", _p4_mb(loss_bytes=2),
                "you counted the loss's log-softmax in bf16, like the logits. The loss casts the logits to fp32 before its "
                f"softmax (logits.float() in transformers' causal-LM loss), so it saves 4 bytes per entry whatever the "
                f"model computes in. {READ_LOSS}"),
        Mistake("logits saved too", _p4_mb(logits_bytes=2),
                "you also counted the logits: nothing saves them. The output head is frozen (its input gradient needs its "
                "weight, not its input or output), the cast to fp32 needs nothing for its backward, and the loss keeps only "
                f"its log-softmax. {READ_LOSS}"),
        Mistake("log-softmax only", _p4_mb(layers=0),
                "you counted only the loss's log-softmax: each checkpointed decoder layer still keeps its input, one "
                f"hidden state per token, to rerun its forward during backward. {READ_CKPT}"),
        Mistake("layer inputs only", _p4_mb(vocab=0),
                "you counted only the layer inputs: the loss's log-softmax sits after the last checkpointed layer, so "
                f"its full-vocabulary fp32 tensor is kept as well. {READ_CKPT}"),
        Mistake("one sequence", _p4_mb(batch=1),
                "you counted one sequence of 512 tokens: the micro-batch holds 4, and every saved tensor has one row per "
                f"token. {READ_CKPT}"),
        Mistake("MiB", right * 1e6 / 2**20, f"that is in MiB (2²⁰ bytes); the question asks for decimal MB, 10⁶ bytes. {READ_UNITS}"),
        Mistake("GB", right / 1e3, f"that is in GB; the question asks for MB (10⁶ bytes). {READ_UNITS}"),
        Mistake("bytes", right * 1e6, f"that is in bytes; the question asks for MB (10⁶ bytes). {READ_UNITS}"),
    ]
    return [m for m in out if not np.isclose(m.value, right, rtol=P4_RTOL)]


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 18

ITEMS = {
    # ------------------------------------------------------------------ warm-up
    "w1": Choice(
        "what lesson 01's 3.74 GB for a 7B QLoRA job with a 20M adapter counts",
        0,
        key="b",
        explain={
            "a": "Activations live only between a forward pass and its backward, and they grow with micro-batch size × sequence length; the ledger assumes no batch at all. It counts persistent tensors only (weights, gradients, optimizer state), and the lesson measures the activations separately. (Lesson 17, 'What the partial totals leave out'.)",
            "b": "3.74 GB is 7e9 × 0.5 bytes of 4-bit codes (3.5 GB) plus 20e6 × 12 bytes for the adapter (bf16 weight and gradient, two fp32 Adam moments: 0.24 GB), and nothing else: no block scales, no activations, no temporary dequantized weights, no allocator overhead. That is why the lesson calls it a partial total. (Lesson 17, 'The ledger, bucket by bucket'.)",
            "c": "The ledger prices each code at exactly half a byte and writes the block scales next to the total, as '+ quantization metadata': one absmax per block of 64 weights adds about 0.11 GB on a 7B base with double quantization, 0.44 GB without. (Lesson 17, 'The metadata the QLoRA column leaves out'.)",
            "d": "The dequantized copy is a temporary: a 4-bit layer rebuilds its weight (or tiles of it) for each matmul and frees it afterwards. The ledger counts persistent tensors only, so temporaries, kernel workspace and allocator overhead are outside the 3.74 GB. (Lesson 17, 'What the partial totals leave out'.)",
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
            "d": "bitsandbytes dequantizes a weight for its matmul and frees the copy afterwards (MatMul4Bit keeps only the packed codes for the backward pass, lesson 16): the copy has the weight's shape, out × in, whatever the batch. (Lesson 17, 'What the partial totals leave out'.)",
        },
    ),
    "w3": Choice(
        "what gradient checkpointing trades",
        0,
        key="d",
        explain={
            "a": "Checkpointing changes which activations are kept, not their precision. (Lesson 17, 'Measured: gradient checkpointing'.)",
            "b": "The weights stay where they are: checkpointing only drops activations saved for backward. (Lesson 17, 'Measured: gradient checkpointing'.)",
            "c": "The optimizer state is untouched: AdamW still holds two moments per trainable parameter. (Lesson 17, 'Measured: gradient checkpointing'.)",
            "d": "With checkpointing each decoder layer runs its forward saving only its input, and during backward it runs that forward again to rebuild the tensors its backward needs, one layer at a time. So you pay an extra forward of every checkpointed layer to keep less: in the lesson the forward kept about 5× less, not 30×, because the loss's full-vocabulary log-softmax sits after the last checkpointed layer. (Lesson 17, 'Measured: gradient checkpointing'.)",
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
        reread="Reread 'Ledger vs measured' in Know this.",
    ),
    "p2": Numeric(
        "the gradient norm the optimizer steps with when clipping to 1.0 runs before the loss scaler's unscale_",
        1,
        name="grad_norm",
        expected=_clipped_norm,
        rtol=1e-3,  # the prompt asks for 3 significant digits
        mistakes=_p2_mistakes,
        reread="Reread 'The mixed-precision contract' in Know this.",
    ),
    "p3": Choice(
        "the loss's saved log-softmax when 48 of each row's 64 labels are masked with -100",
        1,
    ),
    "p4": Numeric(
        "what a checkpointed forward keeps on a bigger model whose adapter was attached without the fp32 preparation",
        2,
        name="saved_mb",
        expected=_p4_expected,
        rtol=P4_RTOL,
        mistakes=_p4_mistakes,
        unit="MB",
        reread="Reread 'Measured: gradient checkpointing' in Know this.",
    ),
    "p5": Function(
        "implement saved_bytes (what autograd saves for backward, each storage once, parameters left out)",
        4,
        name="saved_bytes",
        reference=saved_bytes,
        public=_p5_public,
        hidden=_p5_hidden,
        outputs=("nbytes",),
        mistakes=_p5_mistakes,
        rtol=0,
        atol=0.5,   # bytes are integers
        withheld=("coursekit.memory:SavedTensors.__init__", "coursekit.memory:saved_activation_bytes"),
    ),
    "p6": Choice(
        "what the upper 15 decoder layers save for backward when only layers 0–14 carry adapters",
        1,
    ),
}
