"""Graded items of lesson 14, "Blockwise quantization"."""

from __future__ import annotations

import numpy as np

from ... import quant, walk
from ..checkers import Case, Feedback, Mistake, as_array
from .. import Array, Choice, Function, Numeric

READ_ABSMAX = "(Lesson 14, 'Absmax scaling'.)"
READ_BLOCKS = "(Lesson 14, 'Blocks'.)"
READ_TOY = "(Lesson 14, 'The toy INT4 base'.)"
READ_WALK = "(Lesson 14, 'The rank-one walk on Ŵ'.)"
READ_WALK_SECTION = "Reread 'The rank-one walk on Ŵ' in Know this."
READ_BACKWARD = "(Lesson 14, 'Backward needs DŴᵀ, not a derivative of rounding'.)"


def _q(bits: int) -> int:
    return 2 ** (int(bits) - 1) - 1


# --------------------------------------------------------------------------- references


def absmax_quantize_block(x, bits):
    """Reference for p1: one block, ``absmax = max |x|``, ``code = round(x / absmax · Q)`` (Q = 127 or 7);
    an all-zero block gives absmax 0 and codes 0. Returns ``(codes, absmax)``."""
    codes, absmax = quant.absmax_quantize(x, bits=int(bits), blocksize=max(len(x), 1))
    return codes.astype(np.float64), float(absmax[0])


def absmax_quantize_blocks(x, bits, blocksize):
    """Reference for p2: blockwise absmax over a 1-D array (the last block may be shorter)."""
    codes, absmax = quant.absmax_quantize(x, bits=int(bits), blocksize=int(blocksize))
    return codes.astype(np.float64), absmax


def _w_hat(W, step, rounding=np.round):
    return step * rounding(np.asarray(W, dtype=np.float64) / step)


def _walk_D(X, W_used, A, B, s, target):
    Y = X @ W_used + s * (X @ A) @ B
    return walk.cross_entropy_backward(walk.cross_entropy_forward(Y, target)[1])


def toy_walk_D(X, W, A, B, s, target, step):
    """Reference for p3: on the toy INT4 base Ŵ = step · round(W / step), one row X (1 × d):
    ``D = softmax(X Ŵ + s (XA) B) − onehot(target)`` and ``∇X = D Ŵᵀ + s D Bᵀ Aᵀ``. Returns ``(D, dX)``."""
    W_hat = quant.toy_int4(W, step)[1]
    D = _walk_D(X, W_hat, A, B, s, target)
    return D, D @ W_hat.T + s * (D @ B.T) @ A.T


# --------------------------------------------------------------------------- p1 / p2 cases and mistakes


def _p1_public() -> list[Case]:
    return [
        Case(dict(x=np.array([0.12, -0.9, 0.35, 0.6]), bits=8), "int8, absmax 0.9 (Warm-up 1's block)"),
        Case(dict(x=np.array([0.12, -0.9, 0.35, 0.6]), bits=4), "the same block in int4"),
        Case(dict(x=np.array([0.03, -0.01, 2.5, 0.02, -0.04, 0.01]), bits=4), "int4, one outlier"),
        Case(dict(x=np.zeros(4), bits=8), "an all-zero block: absmax 0, codes 0 (no division by zero)"),
    ]


def _block(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n) * float(rng.choice([0.02, 1.0, 5.0]))


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(dict(x=_block(rng, int(rng.integers(3, 65))), bits=int(b))) for b in (8, 4, 8, 4, 4)]


def _code_mistakes(x: np.ndarray, bits: int, absmax_of) -> list[Mistake]:
    """Wrong codes for the values ``x`` given a function mapping x to the per-value absmax it should use."""
    q = _q(bits)
    am = absmax_of(x)
    safe = np.where(am == 0, 1.0, am)
    floor, trunc = np.where(am == 0, 0.0, np.floor(x / safe * q)), np.where(am == 0, 0.0, np.trunc(x / safe * q))
    both = " (here also what truncation toward zero gives: you truncated toward zero or used floor)" if np.array_equal(floor, trunc) else ""
    # The floor and truncation messages quote a fixed worked example (84.67), never this case's values: they are
    # their own hints.
    floor_msg = (f"you used floor where round belongs{both}: floor sends every value down (e.g. 84.67 → 84, −0.3 → −1), "
                 f"a bias of half a step on average; code = round(x / absmax · Q). {READ_ABSMAX}")
    trunc_msg = (f"you truncated toward zero (int(...) or .astype(int)) instead of rounding to nearest: 84.67 becomes 84, "
                 f"not 85. Use np.round. {READ_ABSMAX}")
    out = [
        Mistake("forgot Q", np.where(am == 0, 0.0, np.round(x / safe)),
                f"you divided by absmax but forgot to multiply by Q = {q} (2^(bits−1) − 1: 127 for int8, 7 for int4): "
                f"x / absmax lies in [−1, 1], so your codes are only −1, 0 or 1. {READ_ABSMAX}",
                hint=f"you divided by absmax but forgot to multiply by Q = 2^(bits−1) − 1 (127 for int8, 7 for int4): "
                     f"x / absmax lies in [−1, 1], so your codes are only −1, 0 or 1. {READ_ABSMAX}"),
        Mistake("floor", floor, floor_msg, hint=floor_msg),
        Mistake("truncated", trunc, trunc_msg, hint=trunc_msg),
        Mistake("unrounded", np.where(am == 0, 0.0, x / safe * q),
                f"your codes are not integers: round x / absmax · Q to the nearest integer. {READ_ABSMAX}"),
    ]
    other = 4 if bits == 8 else 8
    out.append(Mistake("other bits", np.where(am == 0, 0.0, np.round(x / safe * _q(other))),
                       f"you used Q = {_q(other)}, the scale of int{other}; for int{bits} Q = 2^({bits}−1) − 1 = {q}. {READ_ABSMAX}",
                       hint=f"you used the Q of the other bit width (127 is int8's, 7 is int4's): Q = 2^(bits−1) − 1 "
                            f"with this case's bits. {READ_ABSMAX}"))
    full = 2 ** bits - 1
    out.append(Mistake("Q = 2^b - 1", np.where(am == 0, 0.0, np.round(x / safe * full)),
                       f"you scaled by 2^bits − 1 = {full}, the top of the unsigned range; signed symmetric codes use "
                       f"Q = 2^(bits−1) − 1 = {q}, one bit going to the sign. {READ_ABSMAX}",
                       hint=f"you scaled by 2^bits − 1, the top of the unsigned range; signed symmetric codes use "
                            f"Q = 2^(bits−1) − 1, one bit going to the sign. {READ_ABSMAX}"))
    half = 2 ** (bits - 1)
    msg_half = (f"you scaled by 2^(bits−1) = {half} instead of Q = 2^(bits−1) − 1 = {q}: symmetric absmax maps max |x| onto ±{q} "
                f"and leaves the code −{half} unused. {READ_ABSMAX}")
    hint_half = (f"you scaled by 2^(bits−1) instead of Q = 2^(bits−1) − 1: symmetric absmax maps max |x| onto ±Q "
                 f"and leaves the code −2^(bits−1) unused. {READ_ABSMAX}")
    unclipped = np.where(am == 0, 0.0, np.round(x / safe * half))
    out.append(Mistake("Q = 2^(b-1), clipped", np.clip(unclipped, -half, half - 1), msg_half, hint=hint_half))
    out.append(Mistake("Q = 2^(b-1)", unclipped, msg_half, hint=hint_half))
    out.append(Mistake("reconstruction", np.where(am == 0, 0.0, np.round(x / safe * q) / q * am),
                       f"these are the reconstructed values x̂ = code / Q · absmax; return the integer codes themselves. {READ_ABSMAX}"))
    return out


def p1_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    x, bits = np.asarray(kw["x"], dtype=np.float64), int(kw["bits"])
    codes = _code_mistakes(x, bits, lambda v: np.full(v.shape, np.abs(v).max()))
    am = float(np.abs(x).max())
    absmax = [Mistake("max not abs", float(x.max()),
                      f"absmax is the largest |x|, not the largest x: here max(x) = {x.max():g} but max |x| = {am:g}. {READ_ABSMAX}",
                      hint=f"absmax is the largest |x|, not the largest x: in this block a negative value has the largest "
                           f"magnitude. {READ_ABSMAX}")] \
        if x.max() != am else []
    return {"codes": codes, "absmax": absmax}


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(1414)
    x = rng.standard_normal(12) * 0.1
    x[2] = 1.5  # an outlier in the first block only
    return [
        Case(dict(x=x, bits=4, blocksize=4), "int4, 3 blocks of 4, an outlier in block 0"),
        Case(dict(x=rng.standard_normal(10), bits=8, blocksize=4), "int8, 10 values: the last block holds 2"),
        Case(dict(x=np.array([0.5, -0.2, 0.0, 0.0, 0.0, 0.0, 3.0, -1.0]), bits=4, blocksize=2), "int4, an all-zero block in the middle"),
    ]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for bits in (4, 8, 4, 4):
        bs = int(rng.choice([2, 4, 8, 16]))
        x = _block(rng, int(rng.integers(2, 6)) * bs + int(rng.integers(0, bs)))
        x[int(rng.integers(0, x.size))] *= 20.0  # one outlier: per-block and per-tensor absmax differ
        out.append(Case(dict(x=x, bits=bits, blocksize=bs)))
    return out


def p2_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    x, bits, bs = np.asarray(kw["x"], dtype=np.float64), int(kw["bits"]), int(kw["blocksize"])
    q = _q(bits)
    per_tensor_msg = (f"you used one absmax for the whole tensor (max |x| = {np.abs(x).max():g}) instead of one per block of "
                      f"{bs}: each block scales by its own max |x|, so one outlier coarsens only its own block. {READ_BLOCKS}")
    per_tensor_hint = (f"you used one absmax for the whole tensor instead of one per block: each block scales by its own "
                       f"max |x|, so one outlier coarsens only its own block. {READ_BLOCKS}")
    per_block = np.repeat(quant.absmax_quantize(x, bits, bs)[1], bs)[: x.size]
    codes = [Mistake("per tensor", np.round(x / np.abs(x).max() * q), per_tensor_msg, hint=per_tensor_hint)]
    codes += _code_mistakes(x, bits, lambda v: per_block)
    absmax = [Mistake("per tensor", np.array([np.abs(x).max()]), per_tensor_msg, hint=per_tensor_hint),
              Mistake("per tensor, repeated", np.full(-(-x.size // bs), np.abs(x).max()), per_tensor_msg, hint=per_tensor_hint)]
    if x.size % bs:
        full = x[: x.size - x.size % bs]
        absmax.append(Mistake("dropped last block", quant.absmax_quantize(full, bits, bs)[1],
                              f"you dropped the last, shorter block ({x.size % bs} values): {x.size} values in blocks of {bs} make "
                              f"{-(-x.size // bs)} blocks. {READ_BLOCKS}",
                              hint=f"you dropped the last, shorter block: when the length is not a multiple of the "
                                   f"block size, the leftover values form one more block with its own absmax, "
                                   f"ceil(n / blocksize) blocks in all. {READ_BLOCKS}"))
    return {"codes": codes, "absmax": absmax}


# --------------------------------------------------------------------------- p3 cases and mistakes


def _walk_case(rng: np.random.Generator, step: float) -> dict:
    d, m, r = int(rng.integers(2, 5)), int(rng.integers(2, 5)), int(rng.integers(1, 3))
    return dict(
        X=rng.standard_normal((1, d)),
        W=rng.uniform(-6.4 * step, 6.4 * step, (d, m)),  # codes stay inside −8..7
        A=rng.standard_normal((d, r)) * 0.5,
        B=rng.standard_normal((r, m)) * 0.5,            # nonzero B: the adapter's path in ∇X shows
        s=float(rng.choice([0.5, 1.0, 2.0])),
        target=int(rng.integers(0, m)),
        step=step,
    )


def _p3_public() -> list[Case]:
    ex = walk.worked_example()
    seed = dict(ex, B=np.array([[0.3, -0.2]]), step=0.2)
    rng = np.random.default_rng(14)
    return [
        Case(seed, "lesson 06's X, W, A, target with B = [0.3, −0.2], step 0.2"),
        Case(_walk_case(rng, 0.2) | dict(s=2.0), "random, step 0.2, s = 2"),
        Case(_walk_case(rng, 0.25) | dict(s=0.5), "random, step 0.25, s = 0.5"),
    ]


def _p3_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_walk_case(rng, float(step)) | dict(s=s)) for step, s in ((0.2, 2.0), (0.1, 1.0), (0.25, 0.5), (0.5, 2.0))]


def p3_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    X, W, A, B = (np.asarray(kw[k], dtype=np.float64) for k in ("X", "W", "A", "B"))
    s, t, step = float(kw["s"]), kw["target"], float(kw["step"])
    Wh = _w_hat(W, step)
    D = _walk_D(X, Wh, A, B, s, t)
    adapter = s * (D @ B.T) @ A.T
    D_W = _walk_D(X, W, A, B, s, t)
    out_D = [Mistake("W in forward", D_W,
                     f"your D is the unquantized walk's: the forward must use Ŵ = step · round(W / step), the base the model "
                     f"actually runs, so p and D change with Ŵ. {READ_WALK}")]
    out_dX = [
        Mistake("W in DWᵀ", D @ W.T + adapter,
                f"you used W instead of Ŵ in D·Ŵᵀ: backward goes through the same reconstructed base as the forward; the "
                f"original W is not in the model any more. {READ_BACKWARD}"),
        Mistake("W everywhere", D_W @ W.T + s * (D_W @ B.T) @ A.T,
                f"this is the unquantized walk's ∇X: both the forward (D) and the base path (D·Ŵᵀ) must use Ŵ. {READ_WALK}"),
        Mistake("no adapter path", D @ Wh.T,
                f"∇X is missing the adapter's path s·D·Bᵀ·Aᵀ: both input paths add (lesson 05). {READ_BACKWARD}"),
        Mistake("no base path", adapter,
                f"∇X is missing the base path D·Ŵᵀ: a frozen, quantized base still passes gradient to X. {READ_BACKWARD}"),
        Mistake("no s in dX", D @ Wh.T + (D @ B.T) @ A.T,
                f"the adapter's path of ∇X is s·D·Bᵀ·Aᵀ: you left out the scale s (here s = {s:g}). {READ_WALK}",
                hint=f"the adapter's path of ∇X is s·D·Bᵀ·Aᵀ: you left out the scale s. {READ_WALK}"),
        Mistake("sign", -(D @ Wh.T + adapter),
                f"∇X has the wrong sign: it follows from D = softmax(Y) − onehot(target), not onehot − softmax. {READ_WALK}"),
    ]
    D_no_s = _walk_D(X, Wh, A, B, 1.0, t)
    out_D += [
        Mistake("no s in forward", D_no_s, f"your forward left out the scale s: Y = XŴ + s(XA)B (here s = {s:g}). {READ_WALK}",
                hint=f"your forward left out the scale s: Y = XŴ + s(XA)B. {READ_WALK}"),
        Mistake("sign", -D, f"D has the wrong sign: D = ∂L/∂Y = softmax(Y) − onehot(target). {READ_WALK}"),
        Mistake("no onehot", D + np.eye(D.shape[1])[[int(t)]],
                f"that is softmax(Y) alone: subtract 1 at the target class, D = softmax(Y) − onehot(target). {READ_WALK}",
                hint=f"that is softmax(Y) alone: subtract 1 at the target class, D = softmax(Y) − onehot(target). {READ_WALK}"),
    ]
    out_dX.append(Mistake("no s anywhere", D_no_s @ Wh.T + (D_no_s @ B.T) @ A.T,
                          f"you left out the scale s (here s = {s:g}) in the forward and in ∇X's adapter path. {READ_WALK}",
                          hint=f"you left out the scale s in the forward and in ∇X's adapter path. {READ_WALK}"))
    for name, fn, msg in (("floor", np.floor, "floor"), ("truncated", np.trunc, "truncation toward zero")):
        Wb = _w_hat(W, step, fn)
        if not np.allclose(Wb, Wh):
            Db = _walk_D(X, Wb, A, B, s, t)
            text = f"your Ŵ uses {msg} instead of round: code = round(W / step). {READ_TOY}"
            out_D.append(Mistake(name, Db, text))
            out_dX.append(Mistake(name, Db @ Wb.T + s * (Db @ B.T) @ A.T, text))
    return {"D": out_D, "dX": out_dX}


# --------------------------------------------------------------------------- lesson 06's worked walk on Ŵ


def seed_walk(rounding=np.round, steps: int = 1, target: int | None = None, **kw):
    """Lesson 06's walk (AdamW, lr 0.01) on Ŵ = 0.2 · rounding(W / 0.2); ``rounding=None`` keeps W. ``target``
    replaces the walk's target class (1); ``kw`` goes to :func:`coursekit.walk.run_walk` (e.g. ``optimizer="sgd"``)."""
    ex = walk.worked_example()
    if rounding is not None:
        ex["W"] = _w_hat(ex["W"], 0.2, rounding)
    if target is not None:
        ex["target"] = target
    return walk.run_walk(**ex, steps=steps, **kw)


READ_QAT = "(Lesson 14, 'QAT and the straight-through estimator'.)"

# P6: the QAT demo's first SGD step with the straight-through estimator: lesson 06's X, W and target class 1, no adapter,
# q = the toy base's rounding at step 0.2 (codes clamped to −8 … 7), lr 0.2.
P6_LR = 0.2


def qat_step(graph: str = "ste", lr: float = P6_LR, loss: str = "ce", start: str = "W") -> np.ndarray:
    """W after one SGD step of lesson 14's QAT demo, measured with autograd. ``graph`` is what the forward multiplies X by:
    "ste" w + (q(w) − w).detach() (the key: value q(W), gradient that of W), "round" q(w) inside the graph (autograd's
    gradient through round is 0), "W" the unquantized w (no quantizer). ``loss`` "ce" is cross-entropy with the target,
    "logsumexp" leaves out the target term (D = softmax alone). ``start`` "W hat" applies the step to Ŵ instead of W."""
    import torch

    ex = walk.worked_example()
    w = torch.tensor(ex["W"], requires_grad=True)

    def q(v):
        return (v / 0.2).round().clamp(-8, 7) * 0.2

    used = {"ste": lambda: w + (q(w) - w).detach(), "round": lambda: q(w), "W": lambda: w}[graph]()
    Y = torch.tensor(ex["X"]) @ used
    value = (torch.nn.functional.cross_entropy(Y, torch.tensor([ex["target"]])) if loss == "ce"
             else torch.logsumexp(Y, dim=1).sum())
    value.backward()
    base = quant.toy_int4(ex["W"], 0.2)[1] if start == "W hat" else ex["W"]
    return base - lr * w.grad.numpy()


def _p6_mistakes() -> list[Mistake]:
    W = walk.worked_example()["W"]
    grad = (W - qat_step()) / P6_LR                                   # the STE's ∇W, from the measured step
    return [
        Mistake("plain round", qat_step("round"),
                f"that is W unchanged: with q(W) itself in the graph, autograd's derivative of round is 0 and W never moves. "
                f"The STE keeps q(W)'s value in the forward and treats q as the identity in backward, so ∇W = XᵀD. {READ_QAT}"),
        Mistake("W in forward", qat_step("W"),
                f"your gradient comes from a forward pass on W; the STE's forward uses q(W) = Ŵ, so D = softmax(XŴ) − onehot(1) "
                f"is the toy base's D. Only backward pretends q is the identity. {READ_QAT}"),
        Mistake("stepped W hat", qat_step(start="W hat"),
                f"you applied the step to Ŵ; in QAT the trainable parameter is the full-precision W, and the next forward "
                f"recomputes q(W) from it. {READ_QAT}"),
        Mistake("q(W)", quant.toy_int4(W, 0.2)[1],
                f"that is Ŵ = q(W), the value the forward uses (this step moves no code across a rounding boundary); the "
                f"question asks for W itself after the step. {READ_QAT}"),
        Mistake("gradient", grad, f"that is the STE's gradient ∇W = XᵀD; the question asks for W after the step, W − lr·∇W. {READ_QAT}"),
        Mistake("sign", qat_step(lr=-P6_LR), f"you stepped uphill: SGD subtracts lr·∇W. {READ_QAT}"),
        Mistake("no lr", qat_step(lr=1.0), f"you left out the learning rate: the step is W − 0.2·∇W. {READ_QAT}"),
        Mistake("transposed", W - P6_LR * grad.T, f"your gradient is transposed: ∇W = XᵀD has W's shape, row i from X[i]. {READ_QAT}"),
        Mistake("no onehot", qat_step(loss="logsumexp"),
                f"your D is softmax(XŴ) alone: subtract 1 at the target class, D = softmax − onehot(1). {READ_QAT}"),
    ]


# P8: for which input X = [1, x₂] rounding W to the toy base leaves the target's margin Y₁ − Y₀ where it was.
P8_X = np.array([[1.0, -2.0]])


def margin_change(X=P8_X, rounding=np.round, sign: float = 1.0, flip: bool = False) -> float:
    """The change of the margin Y₁ − Y₀ when the walk's W is replaced by 0.2 · rounding(W / 0.2), B = 0, measured on
    run_walk's forward for the input ``X`` (``sign`` −1: W's margin minus Ŵ's; ``flip``: both bases used transposed, a slip
    of the hand computation)."""
    ex = walk.worked_example()
    margins = []
    for W_used in (ex["W"], _w_hat(ex["W"], 0.2, rounding)):
        W_used = W_used.T if flip else W_used
        Y = walk.run_walk(**(ex | dict(X=np.asarray(X, dtype=np.float64), W=W_used)), steps=1)[0].Y
        margins.append(float(Y[0, 1] - Y[0, 0]))
    return sign * (margins[1] - margins[0])


def _logit_changes(X=P8_X) -> np.ndarray:
    ex = walk.worked_example()
    Ys = [walk.run_walk(**(ex | dict(X=np.asarray(X, dtype=np.float64), W=W_used)), steps=1)[0].Y
          for W_used in (ex["W"], _w_hat(ex["W"], 0.2))]
    return (Ys[1] - Ys[0]).ravel()


def neutral_x2(change=None) -> float:
    """P8's key: the x₂ for which rounding W to the toy base leaves the margin unchanged on the input X = [1, x₂] (B = 0).
    ``change(x2)`` is the margin change measured for that x₂ (default: :func:`margin_change` on X = [1, x₂]); it is linear
    in x₂ (Y = XW), so two forward passes, at x₂ = 0 and x₂ = 1, fix its root. The mistaken variants pass another
    ``change``, each a mistaken computation actually run."""
    if change is None:
        change = lambda x2: margin_change(np.array([[1.0, x2]]))
    c0, c1 = change(0.0), change(1.0)
    return float(-c0 / (c1 - c0))


def _p8_mistakes() -> list[Mistake]:
    ex = walk.worked_example()
    W_hat = _w_hat(ex["W"], 0.2)

    def on(x2):
        return np.array([[1.0, x2]])

    return [
        Mistake("row 1 per 2", neutral_x2(lambda x2: margin_change(on(2.0 * x2))),
                f"you took what the second row of Ŵ − W gives the margin for the lesson's X = [1, 2] (0.18 + 0.16 = 0.34) as "
                f"its share per unit of x₂; that share was for x₂ = 2, so per unit of x₂ it is half of it. {READ_WALK}"),
        Mistake("sign", neutral_x2(lambda x2: margin_change(on(-x2))),
                f"your x₂ has the wrong sign: the first row adds 0.10 to the margin and the second row adds 0.17 per unit of "
                f"x₂, so they cancel only for a negative x₂. {READ_WALK}"),
        Mistake("truncated", neutral_x2(lambda x2: margin_change(on(x2), rounding=np.trunc)),
                f"your Ŵ has 0.8 where round gives 1.0: 0.91 / 0.2 = 4.55 rounds to 5, not 4 (truncation). {READ_TOY}"),
        Mistake("floor", neutral_x2(lambda x2: margin_change(on(x2), rounding=np.floor)),
                f"your Ŵ uses floor (−2.35 → −3) instead of round. {READ_TOY}"),
        Mistake("target logit only", neutral_x2(lambda x2: float(_logit_changes(on(x2))[1])),
                f"that x₂ leaves the target's logit Y₁ unchanged; the margin is Y₁ − Y₀, and Y₀ moves too. {READ_WALK}"),
        Mistake("other logit only", neutral_x2(lambda x2: float(_logit_changes(on(x2))[0])),
                f"that x₂ leaves the other class's logit Y₀ unchanged; the margin is Y₁ − Y₀, and Y₁ moves too. {READ_WALK}"),
        Mistake("margin on W hat", neutral_x2(lambda x2: float((on(x2) @ W_hat @ np.array([-1.0, 1.0]))[0])),
                f"that x₂ makes the margin Y₁ − Y₀ on Ŵ itself zero; the question asks where rounding does not change it, "
                f"where the margins on W and on Ŵ are equal. {READ_WALK}"),
        Mistake("transposed", neutral_x2(lambda x2: margin_change(on(x2), flip=True)),
                f"you multiplied with the transpose: Y = XW sums over the rows of W, so row i of Ŵ − W is weighted by X[i]. "
                f"{READ_WALK}"),
        Mistake("first entry", neutral_x2(lambda x1: margin_change(np.array([[x1, 1.0]]))),
                f"you solved for the first entry of X with the second held at 1; the question keeps X₁ = 1 and asks for x₂. "
                f"{READ_WALK}"),
    ]


# P5: how large AdamW's learning rate must be for its first update to undo what rounding did to the target-0 walk: the
# walk on the toy base Ŵ, target class 0, ends its first step at the loss the walk on W starts from (the lesson prints both
# starting losses). AdamW's first step moves each entry of B by lr against its gradient's sign, whatever the gradient's
# size, so the margin Y₀ − Y₁ grows by 2·s·|XA|·lr = 0.6·lr and must win back the 0.44 rounding took from it.


def _bisect(f, lo: float, hi: float, iters: int = 200) -> float:
    """The root of an increasing-or-decreasing ``f`` between ``lo`` and ``hi`` (signs differ there), by bisection."""
    flo = f(lo)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
    return 0.5 * (lo + hi)


def undo_lr(optimizer: str = "adamw", z_one: bool = False, goal: str = "W start", moving: str = "both") -> float:
    """The learning rate at which the first update of the walk on the toy base (target class 0) ends at the loss of the walk
    on W before any update, found by bisection on :func:`coursekit.walk.run_walk` (the key of p5). The mistaken variants:
    ``optimizer`` "sgd"; ``z_one`` an A scaled so that XA = −1 (the factor s·XA left out of ΔY = s(XA)ΔB); ``goal`` "W after"
    matches the loss the walk on W reaches after its own first step (lr 0.01); ``moving`` "one" lets only B's first entry
    move (by lr, against its gradient's sign), the other staying at 0."""
    ex = walk.worked_example() | dict(target=0)
    if z_one:
        ex["A"] = ex["A"] / -float((ex["X"] @ ex["A"])[0, 0])
    W_hat = _w_hat(ex["W"], 0.2)
    start = walk.run_walk(**ex, steps=1)[0]
    want = start.loss if goal == "W start" else start.loss_after

    def after(lr):
        if moving == "one":
            rec = walk.run_walk(**(ex | dict(W=W_hat)), steps=1)[0]
            B1 = np.array([[-lr * np.sign(rec.dB[0, 0]), 0.0]])
            Y = ex["X"] @ W_hat + ex["s"] * (ex["X"] @ ex["A"]) @ B1
            return walk.cross_entropy_forward(Y, ex["target"])[0]
        return walk.run_walk(**(ex | dict(W=W_hat)), steps=1, lr=lr, optimizer=optimizer)[0].loss_after

    return _bisect(lambda lr: after(lr) - want, 1e-6, 10.0)


def _p5_mistakes() -> list[Mistake]:
    return [
        Mistake("SGD", undo_lr("sgd"),
                f"that is the learning rate plain gradient descent would need (B −= lr·∇B, a step scaled by the gradient's "
                f"size); AdamW's first step moves every entry of B by lr itself, against the sign of its gradient "
                f"(m̂/√v̂ = ±1), however small the gradient is. {READ_WALK}"),
        Mistake("no XA", undo_lr(z_one=True),
                f"you let a step of B move the logits one for one; they move by s(XA)ΔB, and XA = −0.3, so each lr-sized step "
                f"of an entry of B moves its logit by 0.3·lr. {READ_WALK}"),
        Mistake("one entry", undo_lr(moving="one"),
                f"you moved only one entry of B; AdamW's first step moves both entries by lr (their gradients are ±, both "
                f"nonzero), so one logit rises and the other falls, and the margin moves twice as fast. {READ_WALK}"),
        Mistake("W after", undo_lr(goal="W after"),
                f"you matched the loss the walk on W reaches after its own first step; the question asks for the loss it "
                f"starts from, before any update. {READ_WALK}"),
    ]


# P4: lesson 06's walk (AdamW, lr 0.01, target class 1) on its W seen as the corner of a larger weight V that is quantized in
# int4 absmax blocks of 64, flattened row by row (Lesson 14, 'Blocks'): V is 2 × 64, V[:, :2] = W, one outlier
# V[1, 40] = 4.2, every other entry smaller than 0.2 in magnitude. Row 0 of V is one block (absmax 0.63, its largest entry is W's 0.63), row 1
# the other, with the outlier as its absmax: row 0 keeps a fine grid, row 1's step is 4.2 / 7 = 0.6 and 0.28 becomes 0.
P4_COLS, P4_OUTLIER, P4_OUTLIER_AT, P4_BLOCKSIZE = 64, 4.2, (1, 40), 64


def outlier_weight(seed: int = 14) -> np.ndarray:
    """p4's 2 × 64 weight V: the walk's W in columns 0–1, the outlier 4.2 at V[1, 40], every other entry drawn uniformly
    from (−0.2, 0.2) with ``seed`` (the key does not depend on them: they are never a block's absmax)."""
    V = np.random.default_rng(seed).uniform(-0.2, 0.2, (2, P4_COLS))
    V[:, :2] = walk.worked_example()["W"]
    V[P4_OUTLIER_AT] = P4_OUTLIER
    return V


def outlier_corner(seed: int = 14) -> np.ndarray:
    """The corner Ŵ = V̂[:, :2] of V quantized by ``coursekit.quant`` in int4 absmax, blocks of 64."""
    V = outlier_weight(seed)
    codes, absmax = quant.absmax_quantize(V, bits=4, blocksize=P4_BLOCKSIZE)
    return quant.absmax_dequantize(codes, absmax, V.shape, bits=4, blocksize=P4_BLOCKSIZE)[:, :2]


def outlier_walk(steps: int = 1, seed: int = 14):
    """Lesson 06's walk on the corner Ŵ of the blockwise-quantized V (the key of p4 is its first ∇B)."""
    return walk.run_walk(**(walk.worked_example() | dict(W=outlier_corner(seed))), steps=steps)


def _corner_variant_dB(q: float = 7.0, rounding=np.round, absmax=(0.63, P4_OUTLIER), rescale: bool = True) -> np.ndarray:
    """The first-step ∇B of the walk on a mistaken reconstruction of the corner: ``absmax`` one value per row of W (the
    blocks of V it sits in), scale ``q`` instead of Q = 7, ``rounding`` instead of round, or the integer codes themselves
    (``rescale`` False)."""
    ex = walk.worked_example()
    am = np.asarray(absmax, dtype=np.float64).reshape(2, 1)
    codes = rounding(ex["W"] / am * q)
    W_used = codes / q * am if rescale else codes
    return walk.run_walk(**(ex | dict(W=W_used)), steps=1)[0].dB


def _p4_mistakes() -> list[Mistake]:
    key = outlier_walk()[0]
    return [
        Mistake("W", seed_walk(None)[0].dB,
                f"that is the unquantized walk's value (lesson 06): run the same step with W replaced by its int4 "
                f"reconstruction, taken from the quantized V. {READ_WALK}"),
        Mistake("own absmax", _corner_variant_dB(absmax=(0.91, 0.91)),
                f"you quantized W's four entries with one absmax of their own (0.91), as if they were a block by themselves "
                f"(or as if the blocks ran down V's columns); blockwise quantization flattens V row by row, so each row of V "
                f"is one block of 64, and row 1's absmax is the outlier. {READ_BLOCKS}"),
        Mistake("per tensor", _corner_variant_dB(absmax=(P4_OUTLIER, P4_OUTLIER)),
                f"you gave the whole of V one absmax, the outlier's 4.2; with blocks of 64, row 0 of V is a block of its own, "
                f"without the outlier, and keeps a fine grid. {READ_BLOCKS}"),
        Mistake("outlier in row 0", _corner_variant_dB(absmax=(P4_OUTLIER, 0.91)),
                f"you put the outlier's coarse grid on the wrong row: V[1, 40] lies in row 1 of V, the block that holds "
                f"W's second row (0.28, 0.91). {READ_BLOCKS}"),
        Mistake("toy base", seed_walk()[0].dB,
                f"that is ∇B on the toy base, whose step is fixed at 0.2; in absmax quantization each block's step is its "
                f"absmax / Q. {READ_TOY}"),
        Mistake("Q = 8", _corner_variant_dB(q=8.0),
                f"you scaled by 2^(bits−1) = 8 instead of Q = 2^(bits−1) − 1 = 7: symmetric int4 absmax maps each block's "
                f"max |x| onto ±7. {READ_ABSMAX}"),
        Mistake("Q = 2^b - 1", _corner_variant_dB(q=15.0),
                f"you scaled by 2^4 − 1 = 15, the top of the unsigned range; signed int4 codes use Q = 7. {READ_ABSMAX}"),
        Mistake("int8", _corner_variant_dB(q=127.0),
                f"you used int8's Q = 127; the question asks for int4, Q = 7. {READ_ABSMAX}"),
        Mistake("forgot Q", _corner_variant_dB(q=1.0),
                f"you divided by absmax but forgot to multiply by Q = 7: your codes are only −1, 0 or 1. {READ_ABSMAX}"),
        Mistake("truncated", _corner_variant_dB(rounding=np.trunc),
                f"your codes truncate toward zero (int(...) or .astype(int)); code = round(x / absmax · Q). {READ_ABSMAX}"),
        Mistake("floor", _corner_variant_dB(rounding=np.floor),
                f"your codes use floor, which sends −0.47 / 0.63 · 7 = −5.22 down to −6; code = round(x / absmax · Q). "
                f"{READ_ABSMAX}"),
        Mistake("codes", _corner_variant_dB(rescale=False),
                f"you ran the walk on the integer codes; the model computes with the reconstruction Ŵ = code / Q · absmax. "
                f"{READ_ABSMAX}"),
        Mistake("two steps", outlier_walk(steps=2)[1].dB,
                f"that is the value of the second step; the question asks for the first. {READ_WALK}"),
        Mistake("sign", -key.dB, f"your ∇B has the wrong sign: D = softmax(Y) − onehot(target), then ∇B = s ZᵀD. {READ_WALK}"),
        Mistake("D", key.D, f"that is D = ∂L/∂Y; ∇B = s ZᵀD multiplies it by Z = XA. {READ_WALK}"),
    ]


class RowArray(Array):
    """An :class:`Array` whose expected value is one row (1 × m): a flat list or 1-D array of the same
    m numbers is the same answer and is read as that row, with a note."""

    def check(self, answer, ctx) -> Feedback:
        a, want = as_array(answer), np.asarray(self.expected())
        if a is not None and a.ndim == 1 and want.ndim == 2 and want.shape[0] == 1 and a.size == want.size:
            fb = super().check(a.reshape(want.shape), ctx)
            note = f"(Your {self.name} is flat, shape {a.shape}; read as the 1 × {a.size} row it stands for.)"
            at = len(fb.lines) - (bool(fb.lines) and fb.lines[-1] == self.reread)  # the section to reread stays last
            fb.lines.insert(at, note)
            return fb
        return super().check(answer, ctx)


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 8

ITEMS = {
    "w1": Numeric(
        "int8 absmax code of 0.6 in the block [0.12, −0.9, 0.35, 0.6]",
        0,
        name="code",
        expected=lambda: float(quant.absmax_quantize([0.12, -0.9, 0.35, 0.6], bits=8, blocksize=4)[0][3]),
        rtol=0.0,
        atol=1e-9,
        mistakes=lambda: [
            Mistake("floor", 84, f"0.6 / 0.9 · 127 = 84.67, and 84 is what floor (or truncation) makes of it: a code is the nearest integer. {READ_ABSMAX}"),
            *[Mistake("unrounded", v, f"a code is an integer: round x / absmax · Q to the nearest one. {READ_ABSMAX}")
              for v in (0.6 / 0.9 * 127, 84.7, 84.67, 84.667)],
            Mistake("forgot Q", 1, f"you divided by absmax but forgot to multiply by Q = 127: x / absmax lies in [−1, 1]. {READ_ABSMAX}"),
            Mistake("int4", 5, f"5 is the int4 code (Q = 7); the question asks for int8, Q = 127. {READ_ABSMAX}"),
            Mistake("absmax 1", 76, f"you used absmax = 1 (0.6 · 127 = 76.2); scale by the block's absmax = max |x| = 0.9 first. {READ_ABSMAX}"),
            Mistake("max not abs", 127, f"absmax is max |x| = 0.9 (from −0.9), not max x = 0.6. {READ_ABSMAX}"),
        ],
    ),
    "w2": Choice(
        "why bitsandbytes gives every block of 64 values its own absmax",
        0,
        key="d",
        explain={
            "a": "Blocks cost work and memory (one absmax per block); they are there for accuracy, not speed. (Lesson 14, 'Blocks'.)",
            "b": "In QLoRA the codes are frozen; nothing about blocks makes them trainable. (Lesson 14, 'Backward needs DŴᵀ, not a derivative of rounding'.)",
            "c": "The codes address levels (16 for 4 bits), not positions: the block size is a separate choice (32 … 4096). (Lesson 14, 'Blocks'.)",
            "d": "In absmax quantization the block's largest magnitude sets the grid (the int4 step is absmax / 7), so an outlier makes its block's grid so coarse that most ordinary values in it round to code 0. With one absmax per 64 values only that block pays; with one absmax per tensor, about nine in ten ordinary values of the lesson's test weight were coded 0. The price is 32 / 64 = 0.5 extra bit per weight for the fp32 absmax. (Lesson 14, 'Outliers and block size'.)",
        },
    ),
    "w3": Array(
        "toy INT4 codes of lesson 06's W at step 0.2",
        0,
        name="codes",
        expected=lambda: quant.toy_int4(walk.worked_example()["W"], 0.2)[0],
        rtol=0.0,
        atol=1e-9,
        mistakes=lambda: [
            Mistake("truncated", np.trunc(walk.worked_example()["W"] / 0.2),
                    f"you truncated toward zero (int(...) or .astype(int)): 0.91 / 0.2 = 4.55, and a code is the nearest integer. {READ_TOY}"),
            Mistake("floor", np.floor(walk.worked_example()["W"] / 0.2),
                    f"you used floor, which sends −2.35 and 4.55 down; a code is the nearest integer. {READ_TOY}"),
            Mistake("transposed", quant.toy_int4(walk.worked_example()["W"], 0.2)[0].T,
                    f"your codes are transposed: codes[i, j] belongs to W[i, j] (row i of W). {READ_TOY}"),
            Mistake("W hat", quant.toy_int4(walk.worked_example()["W"], 0.2)[1],
                    f"that is Ŵ = 0.2 · code, the reconstruction; the question asks for the integer codes. {READ_TOY}"),
        ],
    ),
    "p1": Function(
        "implement absmax_quantize_block",
        3,
        name="absmax_quantize_block",
        reference=absmax_quantize_block,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("codes", "absmax"),
        mistakes=p1_mistakes,
    ),
    "p2": Function(
        "implement absmax_quantize_blocks",
        2,
        name="absmax_quantize_blocks",
        reference=absmax_quantize_blocks,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("codes", "absmax"),
        mistakes=p2_mistakes,
    ),
    "p3": Function(
        "implement toy_walk_D (D and ∇X on the toy INT4 base)",
        3,
        name="toy_walk_D",
        reference=toy_walk_D,
        public=_p3_public,
        hidden=_p3_hidden,
        outputs=("D", "dX"),
        mistakes=p3_mistakes,
    ),
    "p4": RowArray(
        "first-step ∇B of lesson 06's walk on its W as the corner of a 2 × 64 weight with one outlier, quantized in int4 "
        "absmax blocks of 64",
        2,
        name="dB",
        expected=lambda: outlier_walk()[0].dB,
        rtol=5e-4,  # "4 significant digits": −0.06325 for −0.0632455; the nearest listed mistake (two steps) is 0.5 % away
        atol=1e-6,
        mistakes=_p4_mistakes,
        reread="Reread 'Blocks' in Know this.",  # the thought P4 asks for: which block, which absmax
    ),
    "p5": Numeric(
        "predict the learning rate at which AdamW's first update of the walk on Ŵ (target class 0) reaches the loss the walk "
        "on W starts from",
        1,
        name="lr",
        expected=undo_lr,
        rtol=5e-4,  # "4 significant digits": 0.7333 for 0.733333; the nearest listed mistake (W after, 0.7433) is 1.4 % away
        mistakes=_p5_mistakes,
        reread=READ_WALK_SECTION,
    ),
    "p6": Array(
        "W after the first straight-through (STE) SGD step of the QAT demo, lr 0.2",
        1,
        name="W",
        expected=qat_step,
        rtol=5e-4,  # "4 significant digits": 0.1383 for 0.138263; every listed mistake is off by 0.02 or more in some entry
        atol=1e-9,
        mistakes=_p6_mistakes,
        reread="Reread 'QAT and the straight-through estimator' in Know this.",
    ),
    "p7": Choice(
        "predict ∇X, ∇A and ∇B of the toy base's autograd check with the rounding put inside the graph",
        1,
    ),
    "p8": Numeric(
        "predict the input X = [1, x₂] for which rounding W to the toy base leaves the margin Y₁ − Y₀ unchanged",
        1,
        name="x2",
        expected=neutral_x2,
        rtol=5e-3,  # "3 significant digits": −0.588 for −0.588235; the nearest listed mistake (row 1 per 2, −0.294) is far
        mistakes=_p8_mistakes,
        reread=READ_WALK_SECTION,
    ),
}
