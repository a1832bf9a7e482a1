"""Graded items of lesson 04, "The training objective"."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ... import objective
from ...data import IGNORE_INDEX, count_supervised, token_loss_sum
from ..checkers import Case, Mistake
from .. import Array, Choice, Function, Numeric

READ_MASKS = "Reread 'Two masks, two jobs' in Know this."
READ_SHIFT = "Reread 'The shift happens once' in Know this."
READ_PAD = "Reread 'When pad == eos' in Know this."
READ_AVG = "Reread 'Token- or example-weighted' in Know this."
READ_EMPTY = "Reread 'No supervised token, no loss' in Know this."

# --------------------------------------------------------------------------- P1: make_labels


def make_labels(input_ids, attention_mask, prompt_len, pad_id):
    """Reference for p1: labels aligned with input_ids, -100 on the prompt and on padding.

    input_ids, attention_mask: int64 [B, T] (right padding); prompt_len: int64 [B]; pad_id: int
    (unused on purpose: padding is read from attention_mask, never from ids).
    """
    ids = np.asarray(input_ids)
    t = np.arange(ids.shape[1])[None, :]
    keep = (t >= np.asarray(prompt_len)[:, None]) & (np.asarray(attention_mask) == 1)
    return np.where(keep, ids, IGNORE_INDEX).astype(np.int64)


def _batch(rows: list[list[int]], prompt_len: list[int], pad_id: int) -> dict:
    T = max(len(r) for r in rows)
    ids = np.full((len(rows), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
        mask[b, : len(r)] = 1
    return dict(input_ids=ids, attention_mask=mask, prompt_len=np.array(prompt_len, dtype=np.int64), pad_id=pad_id)


# Toy vocabulary of the lesson: 0 "<s>", 1 "user:", 2 "EOS", 3 "a", 4 "b", 5 "c", 6 "d", 7 "bot:".
EOS = 2


def _p1_public() -> list[Case]:
    return [
        Case(_batch([[0, 1, 3, 7, 4, 5, EOS]], [4], EOS), "one row, no padding, a prompt of 4 tokens"),
        Case(_batch([[3, 4, EOS], [3, 4, 5, 6, EOS]], [1, 1], EOS),
             "pad == eos: rows `a b EOS` and `a b c d EOS`, right-padded with the eos id"),
        Case(_batch([[1, 3, EOS, 7, 4, EOS], [1, 5, 6, EOS, 7, 3, 3, EOS], [1, 4, EOS, 7, 6, EOS]], [4, 5, 4], EOS),
             "chat-like rows: EOS also closes the user turn inside the prompt"),
    ]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for i in range(6):
        pad_id = EOS if i < 4 else int(rng.integers(8, 12))  # mostly pad == eos, as SmolLM2 ships
        B = int(rng.integers(2, 5))
        rows, plens = [], []
        for _ in range(B):
            p = int(rng.integers(2, 6))
            a = int(rng.integers(1, 5))
            prompt = [1] + [int(x) for x in rng.integers(3, 7, size=p - 2)] + [7]
            if p >= 4:
                prompt[p // 2] = EOS  # an end-of-turn inside the prompt
            rows.append(prompt + [int(x) for x in rng.integers(3, 7, size=a)] + [EOS])
            plens.append(p)
        while len({len(r) for r in rows}) == 1:  # make sure some row is padded
            rows[0].insert(-1, 3)
        out.append(Case(_batch(rows, plens, pad_id)))
    return out


def _p1_mistakes(kw: dict, got: dict) -> dict:
    ids, mask = np.asarray(kw["input_ids"]), np.asarray(kw["attention_mask"])
    plen, pad_id = np.asarray(kw["prompt_len"]), int(kw["pad_id"])
    T = ids.shape[1]
    t = np.arange(T)[None, :]
    ref = make_labels(ids, mask, plen, pad_id)
    only_pad = np.where(mask == 1, ids, IGNORE_INDEX)
    by_id = np.where(ids == pad_id, IGNORE_INDEX, ref)
    shifted = np.full_like(ref, IGNORE_INDEX)
    shifted[:, :-1] = ref[:, 1:]
    eos_msg = (f"every token whose id equals pad_id ({pad_id}) got -100. Here pad == eos, so each row's real end token lost "
               "its label too and the model never learns to stop. Decide padding from attention_mask (the row's length), "
               "not from ids. " + READ_PAD)
    eos_hint = ("every token whose id equals pad_id got -100. Here pad == eos, so each row's real end token lost its label "
                "too and the model never learns to stop. Decide padding from attention_mask (the row's length), not from "
                "ids. " + READ_PAD)
    # The other messages quote only the rule's fixed offsets (t + 1, prompt_len[b] − 1, -100): they are their own hints.
    msgs = {
        "forgot the prompt": "forgot -100 on the prompt: positions t < prompt_len[b] keep their ids, so the model is trained "
                             "to write the user's turn too. Assistant-only supervision masks them. " + READ_MASKS,
        "forgot the padding": "the padding positions (attention_mask == 0) are supervised: the loss would teach the model to "
                              "emit pad tokens. Give them -100. " + READ_MASKS,
        "shifted": "your labels are shifted left by one: the model shifts labels itself, so this would be shifted twice "
                   "(logit t scored against token t + 2). Keep labels aligned with input_ids. " + READ_SHIFT,
        "first answer token masked": "the first answer token (position prompt_len[b]) got -100: use t >= prompt_len, not "
                                     "t > prompt_len.",
        "last prompt token kept": "the last prompt token (position prompt_len[b] - 1) is supervised: the prompt is "
                                  "t < prompt_len[b].",
    }
    prompt_too = " The prompt positions (t < prompt_len) need -100 as well."
    out = [
        Mistake("masked the EOS", by_id, "masked the EOS: " + eos_msg, hint="masked the EOS: " + eos_hint),
        Mistake("forgot the prompt", only_pad, msgs["forgot the prompt"], hint=msgs["forgot the prompt"]),
        Mistake("masked the EOS, prompt kept", np.where(ids == pad_id, IGNORE_INDEX, only_pad),
                "masked the EOS and forgot -100 on the prompt: " + eos_msg + prompt_too,
                hint="masked the EOS and forgot -100 on the prompt: " + eos_hint + prompt_too),
        Mistake("forgot the padding", np.where(t >= plen[:, None], ids, IGNORE_INDEX), msgs["forgot the padding"],
                hint=msgs["forgot the padding"]),
        Mistake("shifted", shifted, msgs["shifted"], hint=msgs["shifted"]),
        Mistake("first answer token masked", np.where(t >= plen[:, None] + 1, ref, IGNORE_INDEX),
                msgs["first answer token masked"], hint=msgs["first answer token masked"] + " " + READ_MASKS),
        Mistake("last prompt token kept", np.where((t >= plen[:, None] - 1) & (mask == 1), ids, IGNORE_INDEX),
                msgs["last prompt token kept"], hint=msgs["last prompt token kept"] + " " + READ_MASKS),
    ]
    return {"labels": out}


def _p1_in_place(fn, case: Case) -> list[str] | None:
    """make_labels must not write into input_ids (``labels = input_ids`` is the same array)."""
    kw = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in case.kwargs.items()}
    fn(**kw)
    if not np.array_equal(kw["input_ids"], case.kwargs["input_ids"]):
        return ["your function changed input_ids in place: `labels = input_ids` names the same array, so writing -100 into "
                "labels also overwrites the model's inputs. Start from a copy (input_ids.copy(), or .clone() in torch)."]
    return None


# --------------------------------------------------------------------------- P2: masked_mean_loss

EMPTY_TAG = "also: an all -100 batch must raise"


def masked_mean_loss(logits, labels):
    """Reference for p2: the token-weighted mean causal-LM loss, shifted once (coursekit.data)."""
    return token_loss_sum(logits, labels) / count_supervised(labels)


def _loss_case(rng: np.random.Generator, B: int, T: int, V: int, prompt: bool, pad: bool, full_first: bool = False) -> dict:
    logits = torch.from_numpy(rng.standard_normal((B, T, V)) * 2.0)
    labels = torch.from_numpy(rng.integers(0, V, size=(B, T)).astype(np.int64))
    lengths = [T] + [int(rng.integers(max(3, T // 2), T + 1)) for _ in range(B - 1)] if pad else [T] * B
    for b in range(B):
        p = 0 if full_first and b == 0 else (int(rng.integers(1, max(2, lengths[b] - 1))) if prompt else 0)
        labels[b, :p] = IGNORE_INDEX
        labels[b, lengths[b]:] = IGNORE_INDEX
    return dict(logits=logits, labels=labels)


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(4)
    return [
        Case(_loss_case(rng, 1, 6, 5, prompt=False, pad=False), "one row, every label supervised (pretraining style)"),
        Case(_loss_case(rng, 3, 7, 6, prompt=True, pad=True), "three rows, prompts and padding masked with -100; " + EMPTY_TAG),
        Case(_loss_case(rng, 2, 9, 4, prompt=True, pad=True, full_first=True), "two rows of different supervised lengths"),
    ]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for i in range(5):
        B, T, V = int(rng.integers(2, 5)), int(rng.integers(5, 10)), int(rng.integers(3, 9))
        out.append(Case(_loss_case(rng, B, T, V, prompt=True, pad=True, full_first=(i % 2 == 0)), EMPTY_TAG if i == 0 else ""))
    return out


def _p2_mistakes(kw: dict, got: dict) -> dict:
    logits, labels = kw["logits"], kw["labels"]
    V = logits.shape[-1]
    n = count_supervised(labels)
    total = float(token_loss_sum(logits, labels))
    sums, counts = objective.per_row_loss(logits, labels)
    out = []

    def ce(lg, lb, reduction="mean"):
        return float(torch.nn.functional.cross_entropy(lg.reshape(-1, V), lb.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction))

    # These messages quote only slice offsets (t + 1, [:, 1:], -100), the same for every batch: they are their own hints.
    msgs = {
        "not shifted": "you scored logit t against label t: the causal shift is missing (logit t predicts token t + 1). "
                       "Compare logits[:, :-1] with labels[:, 1:]. " + READ_SHIFT,
        "shifted twice": "shifted twice: you compared logits[:, :-2] with labels[:, 2:] (or shifted labels that were already "
                         "shifted). Shift exactly once. " + READ_SHIFT,
        "all positions": "you divided by every scored position, including those labelled -100: divide by the number of "
                         "supervised tokens (labels[:, 1:] != -100). " + READ_MASKS,
        "position 0 counted": "your denominator also counts labels[:, 0]; no logit predicts position 0 after the shift, so "
                              "count labels[:, 1:] != -100 only. " + READ_SHIFT,
    }
    if (labels != IGNORE_INDEX).any():
        out.append(Mistake("not shifted", ce(logits, labels), msgs["not shifted"], hint=msgs["not shifted"]))
    if labels.shape[1] > 2 and (labels[:, 2:] != IGNORE_INDEX).any():
        out.append(Mistake("shifted twice", ce(logits[:, :-2], labels[:, 2:]), msgs["shifted twice"], hint=msgs["shifted twice"]))
    if bool((counts > 0).all()):
        out.append(Mistake("per example", float((sums / counts).mean()),
                           "averaged per example: you took each row's mean and then the mean over rows, so a token of a short "
                           "answer weighs more than a token of a long one. Divide the total loss by the total number of "
                           "supervised tokens. " + READ_AVG))
    out += [
        Mistake("all positions", total / (labels.shape[0] * (labels.shape[1] - 1)), msgs["all positions"],
                hint=msgs["all positions"]),
        Mistake("position 0 counted", total / int((labels != IGNORE_INDEX).sum()), msgs["position 0 counted"],
                hint=msgs["position 0 counted"]),
        Mistake("sum", total, "that is the summed token loss; divide it by the number of supervised tokens."),
    ]
    if total / n > 0:
        out.append(Mistake("sign", -total / n, "the sign is flipped: the loss is the mean of −log p(correct token), a positive number."))
    return {"loss": out}


def _p2_empty(fn, case: Case) -> list[str] | None:
    """For the tagged cases: a batch whose labels are all -100 must raise, not return NaN or 0."""
    if EMPTY_TAG not in case.label:
        return None
    empty = torch.full_like(case.kwargs["labels"], IGNORE_INDEX)
    try:
        got = fn(logits=case.kwargs["logits"].clone(), labels=empty)
    except ValueError:  # EmptyBatchError is a ValueError
        return None
    except ZeroDivisionError:
        return ["on a batch whose labels are all -100 your function raised ZeroDivisionError; raise "
                "EmptyBatchError (from coursekit.data) with a message that says the batch has no supervised token. " + READ_EMPTY]
    except Exception as e:
        return [f"on a batch whose labels are all -100 your function raised {type(e).__name__}: {e}; check for N = 0 first "
                "and raise EmptyBatchError. " + READ_EMPTY]
    try:
        value = float(got)
    except Exception:
        value = got
    return [f"on a batch whose labels are all -100 your function returned {value}: with no supervised token the mean is "
            "0/0, which torch turns into NaN (or a silent 0). Raise EmptyBatchError instead. " + READ_EMPTY]


# --------------------------------------------------------------------------- numeric items

# P3 asks about a normaliser the lesson does not show. 'Token- or example-weighted' gives each micro-batch's mean divided by
# the number of micro-batches (its plot: 1/(k · c)) and the fix, each summed loss divided by the window's N. Here a loop
# that cannot know N before the window ends divides each micro-batch's summed loss by the supervised tokens counted so
# far in the window (its running count): only the last micro-batch gets the window's N. With 4, 16 and 20 tokens, a
# token of the second micro-batch weighs 1/(4 + 16) in that loop against the token-weighted 1/40.
P3_COUNTS = (4, 16, 20)
P3_ASKED = 1  # the second micro-batch (index 1)


def _p3_weights(counts: tuple[int, ...] = P3_COUNTS, asked: int = P3_ASKED) -> tuple[float, float]:
    """(a token's weight in the running-count loop's loss, its weight in the token-weighted window loss), for a token
    of micro-batch ``asked``."""
    return 1 / sum(counts[: asked + 1]), 1 / sum(counts)


def _p3_expected() -> float:
    loop, token = _p3_weights()
    return loop / token


def _p3_mistakes() -> list[Mistake]:
    counts, j = P3_COUNTS, P3_ASKED
    n, k, c = sum(counts), len(counts), counts[j]
    running = sum(counts[: j + 1])
    return [
        Mistake("nothing changes", 1.0, f"only the last micro-batch is divided by the window's N = {n}; the second is "
                f"divided by the {running} tokens counted so far, so its token weighs 1/{running}, not 1/{n}. " + READ_AVG),
        Mistake("own count", n / c, f"that divides by the micro-batch's own {c} tokens (its mean); the loop divides by "
                f"the running count, {' + '.join(map(str, counts[: j + 1]))} = {running}. " + READ_AVG),
        Mistake("first micro-batch", n / counts[0], f"that is the factor of a token of the first micro-batch "
                f"(1/{counts[0]} against 1/{n}); the question asks about the second. " + READ_AVG),
        Mistake("mean of means", n / (k * c), f"that is the weight 1/({k} × {c}) of a loop that averages the "
                f"{k} micro-batch means; this loop divides each summed loss by the running count alone. " + READ_AVG),
        Mistake("inverted", running / n, f"that is the token-weighted weight over the loop's; the loop's token weighs "
                f"more, 1/{running} against 1/{n}, so its gradient grows. " + READ_AVG),
    ]


# P4 asks for a configuration the lesson does not print: the three tickets of 'Two masks, two jobs' (rows of 49, 46 and
# 57 tokens, right-padded there, row 0 supervised at [47, 48]) collated with the padding on the LEFT, as batched
# generation pads. Labels move with their tokens: row 0's supervised positions become the last two of the padded row.


def left_collate(rows: list[dict], pad_id: int) -> dict:
    """``collate`` with the padding first: each row's -100 labels, 0 mask and pad_id ids precede its tokens."""
    T = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    labels = torch.full((len(rows), T), IGNORE_INDEX, dtype=torch.long)
    for b, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[b, T - n:] = torch.tensor(r["input_ids"])
        mask[b, T - n:] = 1
        labels[b, T - n:] = torch.tensor(r["labels"])
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


@lru_cache(maxsize=1)
def p4_rows() -> tuple[dict, ...]:
    """The three tickets of 'Two masks, two jobs' (P5_TICKETS), encoded as the lesson encodes them."""
    from ... import data, model

    tok = model.load_tokenizer()
    return tuple(data.encode_example(data.chat_example(t, l), tok) for t, l in P5_TICKETS)


def _row0(labels) -> np.ndarray:
    return np.array([t for t, l in enumerate(labels[0].tolist()) if l != IGNORE_INDEX], dtype=np.float64)


def p4_positions() -> np.ndarray:
    """Row 0's positions whose label is not -100 when the three tickets are collated with left padding."""
    return _row0(left_collate(list(p4_rows()), pad_id=0)["labels"])


def _p4_mistakes() -> list[Mistake]:
    from ... import model
    from ...data import collate

    rows = list(p4_rows())
    pad_id = model.load_tokenizer().pad_token_id  # SmolLM2's pad id is its <|im_end|> id ('When pad == eos')
    left = left_collate(rows, pad_id=pad_id)
    pos = _row0(left["labels"])
    by_id = left["input_ids"].masked_fill(left["input_ids"] == pad_id, IGNORE_INDEX)
    by_id = by_id.masked_fill(left["labels"] == IGNORE_INDEX, IGNORE_INDEX)
    return [
        Mistake("right padding", _row0(collate(rows, pad_id=pad_id)["labels"]), "those are row 0's positions with the "
                "padding on the right, as 'Two masks, two jobs' printed them. With the padding first, every token of row 0 "
                "moves right by the padding's length (T minus the row's own length), and its labels move with it. " + READ_MASKS),
        Mistake("shifted", _row0(objective.shift_left(left["labels"])), "these are one position to the left: labels stay "
                "aligned with input_ids, and the model shifts them once itself. " + READ_SHIFT),
        Mistake("counted from 1", pos + 1, "these are one position to the right: positions count from 0, so the last "
                "position of a batch of length T is T − 1. " + READ_MASKS),
        Mistake("masked by id", _row0(by_id), "the end-of-turn token <|im_end|> after the answer is supervised too, at the "
                "row's last position: it teaches the model to stop. Masking the padding by id (pad == eos) would drop it. "
                + READ_PAD),
    ]


# P5 asks for a configuration the lesson does not print: the three tickets of 'Two masks, two jobs' (152 real tokens, 7
# scored under assistant-only labels) trained on every real token, prompt included, with -100 on the padding only. The
# student predicts N from the printed 152 and the one shift: no logit predicts position 0, so each row loses one position.
P5_TICKETS = (("The drive motor overheats on the case packer.", "thermal"),
              ("The fieldbus reports communication timeouts.", "network"),
              ("Ticket: a bolt on the mounting bracket has sheared off (the laser cutter).", "mechanical"))


@lru_cache(maxsize=1)
def p5_batch() -> dict:
    """The lesson's three tickets collated as 'Two masks, two jobs' collates them (assistant-only ``labels``), with
    ``full_labels``: input_ids on every real token, -100 on the padding (read from the attention mask)."""
    from ... import data, model

    tok = model.load_tokenizer()
    rows = [data.encode_example(data.chat_example(t, l), tok) for t, l in P5_TICKETS]
    batch = data.collate(rows, pad_id=tok.pad_token_id)
    full = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
    return dict(batch, full_labels=full, pad_id=tok.pad_token_id)


def _p5_expected() -> float:
    return float(count_supervised(p5_batch()["full_labels"]))


def _p5_mistakes() -> list[Mistake]:
    b = p5_batch()
    ids, full = b["input_ids"], b["full_labels"]
    B, T = ids.shape
    n_real = int(b["attention_mask"].sum())
    by_id = ids.masked_fill(ids == b["pad_id"], IGNORE_INDEX)  # padding masked by id: pad == eos here
    return [
        Mistake("position 0 counted", n_real, f"that is every real token, {n_real}: no logit predicts a row's first token "
                "(the shift compares logits[:, :-1] with labels[:, 1:]), so each row's position 0 is never scored. "
                + READ_SHIFT),
        Mistake("one shift for the batch", n_real - 1, "you dropped one position for the whole batch: the shift happens in "
                "every row, so each row's first token goes unscored, one per row. " + READ_SHIFT),
        Mistake("padding scored", B * (T - 1), f"that counts the padding too ({B} rows × {T - 1} shifted positions): "
                "its labels are -100, so the loss skips it. " + READ_MASKS),
        Mistake("every position", B * T, f"that is every position of the padded {B} × {T} batch: the padding is -100, and "
                "no logit predicts a row's first token. " + READ_MASKS),
        Mistake("answer only", count_supervised(b["labels"]), "that is the assistant-only count printed in 'Two masks, two "
                "jobs'; here the prompt is a target as well. " + READ_MASKS),
        Mistake("masked by id", count_supervised(by_id), "that is what is left after masking every token whose id equals "
                "pad_id: with pad == eos that also removes every real <|im_end|>, prompt turns included. The padding is "
                "decided by the attention mask here. " + READ_PAD),
    ]


# P6 asks for a row the student designs, which no cell of the lesson computes: among the rows `<s>`, ten answer tokens
# that use each of a, b, c, d (and nothing else), and the row's only EOS, which gives the lowest loss when the labels
# are shifted by hand and then again by the model? Logit t puts the oracle's margin on token t + 1 and is scored
# against token t + 2, so a position escapes exactly where the two are the same token. Ten positions are scored (the
# model never scores label 0, the hand shift's last label is -100); the answer changes word at least three times, and
# its last token is never the EOS after it: at least four of the ten miss, which one run per word achieves
# (tests/test_lesson04_items.py searches every such row). The loss of that row is the key; each named mistake is the
# loss the mistaken variant gives when run.
P6_VOCAB = 8
P6_MARGIN = 8.0
P6_WORDS = (3, 4, 5, 6)      # a b c d in the toy vocabulary
P6_ANSWER_LEN = 10
P6_BEST = (0,) + (3,) * 7 + (4, 5, 6) + (EOS,)  # "<s> a a a a a a a b c d EOS": one run per word


def p6_admissible(row) -> bool:
    """Whether ``row`` is one of P6's rows: `<s>`, ten tokens among a b c d using each of them, then `EOS`."""
    row = tuple(int(i) for i in row)
    answer = row[1:-1]
    return (len(answer) == P6_ANSWER_LEN and row[0] == 0 and row[-1] == EOS and set(answer) == set(P6_WORDS))


def p6_double_shift_loss(row, margin: float = P6_MARGIN, shift=objective.shift_left) -> float:
    """The token-weighted loss of oracle logits (``margin`` on each true next token, P6_VOCAB words) on ``row`` when its
    labels are shifted by hand with ``shift`` and then passed to the loss, which shifts once more."""
    ids = torch.tensor([tuple(row)], dtype=torch.long)
    logits = objective.oracle_logits(ids, P6_VOCAB, margin)
    return float(objective.token_weighted_loss(logits, shift(ids)))


def _p6_expected() -> float:
    return p6_double_shift_loss(P6_BEST)


def _p6_denominator_with_label_0() -> float:
    """P6_BEST's summed double-shifted loss divided by every label that is not -100, label 0 included."""
    ids = torch.tensor([P6_BEST])
    logits, labels = objective.oracle_logits(ids, P6_VOCAB, P6_MARGIN), objective.shift_left(ids)
    return float(token_loss_sum(logits, labels)) / int((labels != IGNORE_INDEX).sum())


def _p6_mistakes() -> list[Mistake]:
    a, b, c, d = P6_WORDS
    return [
        Mistake("shifted once", p6_double_shift_loss(P6_BEST, shift=lambda ids: ids),
                "that is about log(1 + 7·e⁻⁸), the cost of a position the oracle gets right: the loss with labels = "
                "input_ids, shifted once (by the model), which is the same on every row. P6's labels are shifted by hand "
                "first, and the model shifts them again. " + READ_SHIFT),
        Mistake("last position free", p6_double_shift_loss(P6_BEST[:-1] + (P6_BEST[-2],)),
                "that counts the last scored position as one the oracle gets right, as if the row ended with a repeat of "
                "its last word. The last logit the loss scores predicts the answer's last token and is scored against the "
                "token after it, the EOS, which no answer token equals: that position misses on every such row. "
                + READ_SHIFT),
        Mistake("label 0 counted", _p6_denominator_with_label_0(),
                "you divided by 11 positions: the hand-shifted labels hold 11 values that are not −100, label 0 among "
                "them, but no logit predicts position 0, so the model's loss never scores label 0. " + READ_SHIFT),
        Mistake("wrapped shift", p6_double_shift_loss(P6_BEST, shift=lambda ids: torch.roll(ids, -1, dims=1)),
                "that scores 11 positions, the extra one a miss: it is what a hand shift with torch.roll gives, whose "
                "last label wraps around to the row's first token. shift_left writes −100 there, so logit 10, which the "
                "model's loss scores against that last label, is not scored. " + READ_SHIFT),
        Mistake("margin 5", p6_double_shift_loss(P6_BEST, margin=5.0),
                "that is the best row at margin 5, the margin of 'The shift happens once'. P6's oracle has margin 8: a "
                "position it gets right costs log(1 + 7·e⁻⁸), one it misses 8 more. " + READ_SHIFT),
        Mistake("a word in two runs", p6_double_shift_loss((0, a, b, c, d) + (a,) * 6 + (EOS,)),
                "that is a row with one miss too many, such as `<s> a b c d a a a a a a EOS`, where a word appears in "
                "two separate runs. Every change of word between neighbours costs a miss; find the row with the fewest "
                "changes. " + READ_SHIFT),
        # 8 and 8.0023 agree to 3 significant digits: one mistake, the margin paid at every position.
        Mistake("no repeats", p6_double_shift_loss((0,) + (a, b, c, d) * 2 + (a, b, EOS)),
                "that is about the margin: every scored position misses, as on a row whose neighbouring tokens always "
                "differ (the row of 'The shift happens once'). Where the token a logit predicts and the token it is "
                "scored against are the same word, the oracle is right anyway. " + READ_SHIFT),
    ]


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 6

ITEMS = {
    "w1": Choice(
        "what -100 in labels means",
        0,
        key="b",
        explain={
            "a": "-100 is not a token id (ids are >= 0); padding gets its own id, pad_id. -100 is a label value that the loss skips. Reread '−100: the label the loss skips' in Know this.",
            "b": "−100 is PyTorch's default ignore_index: F.cross_entropy gives a position with label −100 no loss, and with reduction=\"mean\" leaves it out of the denominator too. The mean runs over the N supervised positions only. (Lesson 04, '−100: the label the loss skips'.)",
            "c": "Which positions may be attended to is the attention mask's job; a -100 label leaves attention alone. Reread 'Two masks, two jobs' in Know this.",
            "d": "Nothing is penalised: the position contributes exactly zero to the loss and to the count N. Reread '−100: the label the loss skips' in Know this.",
        },
    ),
    "w2": Choice(
        "a prompt token under assistant-only supervision",
        0,
        key="a",
        explain={
            "a": "The two masks do different jobs: attention_mask 1 lets the answer tokens read the question, and label −100 keeps the question out of the loss. The prompt is visible but not supervised. (Lesson 04, 'Two masks, two jobs'.)",
            "b": "attention_mask 0 would hide the prompt from the answer tokens: the model could not read the question. Reread 'Two masks, two jobs' in Know this.",
            "c": "With its own id as label, the prompt would be trained on too (full-conversation training, not assistant-only). Reread 'Two masks, two jobs' in Know this.",
            "d": "That hides the prompt and trains on it: both masks are the wrong way round. Reread 'Two masks, two jobs' in Know this.",
        },
    ),
    "w3": Choice(
        "who does the causal shift",
        0,
        key="c",
        explain={
            "a": "Logit t is the prediction made after reading tokens 0..t; scoring it against token t would let it copy its input. Reread 'The shift happens once' in Know this.",
            "b": "Logit t + 1 has already seen token t + 1: nothing left to predict. Reread 'The shift happens once' in Know this.",
            "c": "Logit t − 1 has read tokens 0…t − 1 and predicts token t. transformers' causal LMs do the shift once, inside their loss (ForCausalLMLoss), comparing logits[:, :-1] with labels[:, 1:], so labels aligned with input_ids are what you pass, and the label at position 0 is never scored. (Lesson 04, 'The shift happens once'.)",
            "d": "transformers' causal LMs shift inside their loss (ForCausalLMLoss); shifting first makes it happen twice. Reread 'The shift happens once' in Know this.",
        },
    ),
    "p1": Function(
        "implement make_labels",
        3,
        name="make_labels",
        reference=make_labels,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("labels",),
        mistakes=_p1_mistakes,
        extra=_p1_in_place,
        rtol=0,
        atol=0,
    ),
    "p2": Function(
        "implement masked_mean_loss",
        3,
        name="masked_mean_loss",
        reference=masked_mean_loss,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("loss",),
        mistakes=_p2_mistakes,
        extra=_p2_empty,
        rtol=1e-6,
        atol=1e-9,
    ),
    "p3": Numeric(
        "gradient factor of a token when each micro-batch is divided by the running count",
        1,
        name="answer_p3",
        expected=_p3_expected,
        rtol=1e-6,
        mistakes=_p3_mistakes,
        reread=READ_AVG,
    ),
    "p4": Array(
        "predict row 0's supervised positions when the three tickets are padded on the left",
        1,
        name="positions",
        expected=p4_positions,
        rtol=0,
        atol=0,
        mistakes=_p4_mistakes,
        reread=READ_MASKS,
    ),
    "p5": Numeric(
        "predict the positions the loss scores when three tickets are trained on every real token",
        1,
        name="n_supervised",
        expected=_p5_expected,
        rtol=0,
        mistakes=_p5_mistakes,
        reread=READ_SHIFT,
    ),
    "p6": Numeric(
        "design the row that hides the double shift best, and predict its loss",
        1,
        name="lowest_loss",
        expected=_p6_expected,
        rtol=1e-3,  # the prompt asks for 3 significant digits: 3.2 (misses paid at the margin alone) is close enough
        mistakes=_p6_mistakes,
        reread=READ_SHIFT,
    ),
    "p7": Choice(
        "pad = <|im_start|> (bos) and an id mask: what happens to the labels?",
        1,
    ),
}
