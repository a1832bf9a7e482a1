"""Lesson 04 ("The training objective"): graded items score right answers fully and typical wrong answers
less, naming the mistake (shifted twice, averaged per example, masked the EOS, forgot -100 on the prompt);
the notebook's test cells agree with the item registry."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coursekit.data import EmptyBatchError
from coursekit.grading import check
from coursekit.grading.lessons import lesson04 as L
from coursekit.grading.lessons.lesson04 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
LID = "04-the-training-objective"


# --------------------------------------------------------------------------- student-style answers


def make_labels(input_ids, attention_mask, prompt_len, pad_id):
    labels = input_ids.copy()
    t = np.arange(input_ids.shape[1])[None, :]
    labels[t < prompt_len[:, None]] = -100
    labels[attention_mask == 0] = -100
    return labels


def masked_mean_loss(logits, labels):
    lg, lb = logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
    n = int((lb != -100).sum())
    if n == 0:
        raise EmptyBatchError("no supervised token")
    return F.cross_entropy(lg, lb, ignore_index=-100, reduction="sum") / n


def _p4_right():
    return [int(p) for p in L.p4_positions()]


RIGHT = {"w1": "b", "w2": "a", "w3": "c", "p1": make_labels, "p2": masked_mean_loss, "p3": 2.0,
         "p4": None, "p5": 149, "p6": 3.202345485592187, "p7": "a"}


def _right(item_id):
    return _p4_right() if item_id == "p4" else RIGHT[item_id]


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def measured_p3_factors(normaliser):
    """04.p3's loop measured with autograd: three micro-batches with 4, 16 and 20 supervised tokens; backward() on each
    micro-batch's summed loss divided by ``normaliser(counts, j)`` for micro-batch j, against backward() on the
    token-weighted loss of the window. Returns, per micro-batch, the factor by which the loop scales the gradient on the
    logits of one of its supervised tokens."""
    g = torch.Generator().manual_seed(4)
    V = 8

    def micro(n_sup, T=24):
        logits = torch.randn(1, T, V, generator=g, dtype=torch.float64)
        labels = torch.randint(0, V, (1, T), generator=g)
        labels[0, : T - n_sup] = -100          # the first T - n_sup positions are prompt
        return logits, labels

    mbs = [micro(4), micro(16), micro(20)]
    counts = [int((y[:, 1:] != -100).sum()) for _, y in mbs]
    assert counts == [4, 16, 20]
    N = sum(counts)

    def grads(loss_of):
        leaves = [lg.clone().requires_grad_() for lg, _ in mbs]
        for j, (leaf, (_, y)) in enumerate(zip(leaves, mbs)):
            loss_of(leaf, y, j).backward()     # one backward per micro-batch, as accumulation does
        return [leaf.grad for leaf in leaves]

    def ce_sum(lg, y):
        return torch.nn.functional.cross_entropy(lg[0, :-1], y[0, 1:], ignore_index=-100, reduction="sum")

    loop = grads(lambda lg, y, j: ce_sum(lg, y) / normaliser(counts, j))
    token = grads(lambda lg, y, j: ce_sum(lg, y) / N)
    factors = []
    for gl, gt in zip(loop, token):
        ratio = gl[gt != 0] / gt[gt != 0]
        torch.testing.assert_close(ratio, torch.full_like(ratio, ratio[0].item()))   # one factor for every entry
        factors.append(ratio[0].item())
    return factors


def running_count(counts, j):
    """The item's loop: the supervised tokens counted so far in the window, this micro-batch included."""
    return sum(counts[: j + 1])


def test_p3_key_and_mistakes_are_measured_with_autograd():
    """The key (2) is what autograd gives a token of the second micro-batch under the running-count loop; each named
    mistake is the factor of a mistaken loop or token, measured the same way."""
    running = measured_p3_factors(running_count)
    assert running[1] == pytest.approx(ITEMS["p3"].expected()) == pytest.approx(RIGHT["p3"])
    assert running[2] == pytest.approx(1)                     # only the last micro-batch gets the window's N
    named = {m.label: m.value for m in ITEMS["p3"].mistakes()}
    assert named["nothing changes"] == pytest.approx(running[2])
    assert named["first micro-batch"] == pytest.approx(running[0])
    assert named["own count"] == pytest.approx(measured_p3_factors(lambda counts, j: counts[j])[1])
    assert named["mean of means"] == pytest.approx(
        measured_p3_factors(lambda counts, j: counts[j] * len(counts))[1])
    assert named["inverted"] == pytest.approx(1 / running[1])


def test_p3_asks_a_loop_the_lesson_does_not_show():
    """The lesson's cell shows the mean of means (1/(k · c)) and the fix (1/N); the running count gives neither."""
    ours = ITEMS["p3"].expected()
    counts = L.P3_COUNTS
    assert ours != pytest.approx(sum(counts) / (len(counts) * counts[1])) and ours != pytest.approx(1)


def test_numbers_come_from_coursekit():
    assert ITEMS["p3"].expected() == pytest.approx(measured_p3_factors(running_count)[1]) == pytest.approx(40 / 20)
    assert ITEMS["p5"].expected() == 149  # 152 real tokens, less each row's position 0
    hit = np.log1p(7 * np.exp(-8.0))
    assert ITEMS["p6"].expected() == pytest.approx(3.2 + hit)  # four of the ten scored positions miss, by 8 each


def test_p6_prediction_tolerance_accepts_the_reasoned_value_only():
    assert check("04.p6", 3.2).full           # "four misses of ten at margin 8" is within 3 significant digits
    assert check("04.p6", 3.21).points == 0 and check("04.p6", 3.19).points == 0


def _p6_rows_up_to_renaming():
    """Every P6 row up to a renaming of the four words: the answers whose words first appear in the order a, b, c, d
    (restricted growth strings of length 10 with 4 symbols: S(10, 4) = 34105 of them)."""
    n, k = L.P6_ANSWER_LEN, len(L.P6_WORDS)
    out = []

    def grow(prefix, used):
        if len(prefix) == n:
            if used == k:
                out.append((0,) + tuple(L.P6_WORDS[v] for v in prefix) + (L.EOS,))
            return
        for v in range(min(used + 1, k)):
            grow(prefix + (v,), max(used, v + 1))

    grow((), 0)
    return torch.tensor(out)


def _double_shifted_losses(rows, margin=L.P6_MARGIN):
    """Per row: the oracle's loss with labels shifted by hand and then by the loss (logits[:, :-1] against labels[:, 1:]),
    written out with F.cross_entropy, not with coursekit's loss; and the per-position losses."""
    logits = torch.zeros(*rows.shape, L.P6_VOCAB, dtype=torch.float64)
    logits[:, :-1].scatter_(2, rows[:, 1:, None], margin)                   # the margin on each true next token
    labels = torch.cat([rows[:, 1:], torch.full_like(rows[:, :1], -100)], 1)  # the hand shift
    tok = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100, reduction="none")
    return tok.sum(1) / (labels[:, 1:] != -100).sum(1), tok


def test_p6_key_is_the_lowest_double_shifted_loss_of_every_p6_row():
    """P6's key, searched: no row of P6's kind (`<s>`, ten tokens using each of a b c d, EOS) has a lower double-shifted
    loss than P6_BEST's, the key; the search covers every row, since renaming the words leaves the loss unchanged (checked
    on random rows). transformers' ForCausalLMLoss gives the key on P6_BEST's hand-shifted labels."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    from coursekit import objective

    rows = _p6_rows_up_to_renaming()
    assert len(rows) == 34105 and all(L.p6_admissible(r) for r in rows[::997].tolist())
    losses, _ = _double_shifted_losses(rows)
    key = ITEMS["p6"].expected()
    assert L.p6_admissible(L.P6_BEST)
    assert float(losses.min()) == pytest.approx(key, rel=1e-12) == pytest.approx(RIGHT["p6"], rel=1e-12)
    best = rows[int(losses.argmin())].tolist()
    assert float(_double_shifted_losses(torch.tensor([L.P6_BEST]))[0][0]) == pytest.approx(float(losses.min()), rel=1e-12)
    # Every row that reaches the minimum gives each word one run; there are 4! orders of the runs, times the ways to
    # cut ten tokens into four runs (C(9, 3) = 84), and the search holds them up to renaming: 84 rows.
    minimal = rows[(losses - losses.min()).abs() < 1e-9]
    assert len(minimal) == 84 and best in minimal.tolist()
    assert all(sum(a != b for a, b in zip(r[1:-2], r[2:-1])) == 3 for r in minimal.tolist())
    # renaming the words leaves the loss unchanged, so the search above is over every row
    rng = np.random.default_rng(6)
    words = torch.tensor(L.P6_WORDS)
    for _ in range(50):
        answer = torch.tensor(rng.permutation(np.r_[0:4, rng.integers(0, 4, 6)]))
        renamed = torch.tensor(rng.permutation(4))
        pair = torch.stack([torch.cat([torch.tensor([0]), words[answer], torch.tensor([L.EOS])]),
                            torch.cat([torch.tensor([0]), words[renamed[answer]], torch.tensor([L.EOS])])])
        a, b = _double_shifted_losses(pair)[0].tolist()
        assert a == pytest.approx(b, rel=1e-12)
    ids = torch.tensor([L.P6_BEST])
    oracle = objective.oracle_logits(ids, L.P6_VOCAB, L.P6_MARGIN)
    hf = float(ForCausalLMLoss(oracle, objective.shift_left(ids), vocab_size=L.P6_VOCAB))
    assert hf == pytest.approx(key, rel=1e-6)


def test_p6_mistakes_are_the_mistaken_variants_run():
    """Each value P6 names is what its mistaken variant gives when run, here with transformers' own causal-LM loss
    (the one LlamaForCausalLM calls; it computes in float32), and it scores 0 and is named."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    from coursekit import objective

    a, b, c, d = L.P6_WORDS
    best = torch.tensor([L.P6_BEST])

    def run(row=best, margin=L.P6_MARGIN, shift=objective.shift_left):
        row = torch.as_tensor(row).reshape(1, -1)
        oracle = objective.oracle_logits(row, L.P6_VOCAB, margin)
        return float(ForCausalLMLoss(oracle, shift(row), vocab_size=L.P6_VOCAB))

    oracle = objective.oracle_logits(best, L.P6_VOCAB, L.P6_MARGIN)
    hand = objective.shift_left(best)
    measured = {
        "shifted once": run(shift=lambda ids: ids),                                # labels = input_ids
        "last position free": run(list(L.P6_BEST[:-1]) + [L.P6_BEST[-2]]),          # ... d d: the end taken as a repeat
        "label 0 counted": float(ForCausalLMLoss(oracle, hand, vocab_size=L.P6_VOCAB, num_items_in_batch=1))
        / int((hand != -100).sum()),                                               # the sum over every label not -100
        "wrapped shift": run(shift=lambda ids: torch.roll(ids, -1, dims=1)),       # a hand shift without the -100
        "margin 5": run(margin=5.0),                                               # the margin of the lesson's cell
        "a word in two runs": run([0, a, b, c, d] + [a] * 6 + [L.EOS]),
        "no repeats": run([0] + [a, b, c, d] * 2 + [a, b, L.EOS]),
    }
    named = {m.label: m.value for m in L._p6_mistakes()}
    assert set(named) == set(measured)
    key = ITEMS["p6"].expected()
    for label, value in named.items():
        assert value == pytest.approx(measured[label], rel=1e-5, abs=1e-6), label  # ForCausalLMLoss is float32
        assert abs(value - key) > 1e-2 * key, label
        fb = check("04.p6", value)
        assert fb.points == 0 and fb.mistakes == [label], (label, fb.text())
    # "four misses of ten" also covers the student who scores 11 positions with the same four misses (the last logit
    # counted as a hit): (7 hits + 4 misses) / 11 is within the tolerance of the label-0 value.
    hit = np.log1p(7 * np.exp(-8.0))
    assert check("04.p6", (7 * hit + 4 * (8 + hit)) / 11).mistakes == ["label 0 counted"]


def test_p8_model_answer_reads_p6_row_position_by_position():
    """P8's model answer on P6_BEST: ten scored logits (0 to 9), the misses at a→b, b→c, c→d and d→EOS (logits 6 to 9),
    each costing 8 + log(1 + 7e⁻⁸), the hits log(1 + 7e⁻⁸), the loss ≈ 3.20; and on every P6 row the last scored
    logit (it predicts the answer's last token and is scored against the EOS) misses."""
    _, tok = _double_shifted_losses(torch.tensor([L.P6_BEST]))
    hit = np.log1p(7 * np.exp(-8.0))
    scored = [t for t in range(tok.shape[1]) if t < len(L.P6_BEST) - 2]
    assert scored == list(range(10))
    missed = [t for t in scored if tok[0, t] > 1]
    assert missed == [6, 7, 8, 9]
    np.testing.assert_allclose(tok[0, missed].numpy(), 8 + hit, rtol=1e-12)
    np.testing.assert_allclose(tok[0, [t for t in scored if t not in missed]].numpy(), hit, rtol=1e-9)
    assert round(float(tok[0].sum()) / 10, 2) == 3.20 and round(hit, 4) == 0.0023
    _, every = _double_shifted_losses(_p6_rows_up_to_renaming())
    assert bool((every[:, 9] > 8).all())                   # the d→EOS miss of every row


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"04.{item_id}", _right(item_id), hidden=hidden)
    assert fb.full, fb.text()


def test_torch_tensors_and_floats_are_accepted():
    assert check("04.p4", torch.tensor(_p4_right())).full
    assert check("04.p6", torch.tensor(3.202345485592187, dtype=torch.float64)).full

    def float_loss(logits, labels):
        return float(masked_mean_loss(logits, labels))

    assert check("04.p2", float_loss, hidden=True).full


def test_hidden_cases_are_deterministic_and_cover_pad_eq_eos():
    a = check("04.p1", make_labels, hidden=True).text()
    assert a == check("04.p1", make_labels, hidden=True).text() and a.count("hidden case") == 6
    cases = L._p1_hidden(np.random.default_rng(0))
    assert sum(c.kwargs["pad_id"] == L.EOS for c in cases) >= 3
    for c in cases:
        lengths = c.kwargs["attention_mask"].sum(1)
        assert lengths.min() < lengths.max()  # some row is padded
        assert (c.kwargs["prompt_len"] < lengths).all()


# --------------------------------------------------------------------------- wrong choices


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "not a token id"),
        ("w1", "c", "attention mask's job"),
        ("w2", "c", "full-conversation training"),
        ("w2", "b", "could not read the question"),
        ("w3", "d", "shifting first makes it happen twice"),
        ("w3", "a", "copy its input"),
        ("p7", "b", "every end-of-turn token keeps its label"),
        ("p7", "c", "never of the token after it"),
        ("p7", "d", "N > 0"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"04.{item_id}", answer)
    assert fb.points == 0
    assert text in fb.text() and "Reread" in fb.text()


# --------------------------------------------------------------------------- P1 make_labels


def masked_eos(input_ids, attention_mask, prompt_len, pad_id):
    labels = make_labels(input_ids, attention_mask, prompt_len, pad_id)
    labels[input_ids == pad_id] = -100
    return labels


def forgot_prompt(input_ids, attention_mask, prompt_len, pad_id):
    return np.where(attention_mask == 1, input_ids, -100)


def forgot_padding(input_ids, attention_mask, prompt_len, pad_id):
    t = np.arange(input_ids.shape[1])[None, :]
    return np.where(t >= prompt_len[:, None], input_ids, -100)


def shifted_labels(input_ids, attention_mask, prompt_len, pad_id):
    labels = make_labels(input_ids, attention_mask, prompt_len, pad_id)
    return np.concatenate([labels[:, 1:], np.full((labels.shape[0], 1), -100)], axis=1)


def off_by_one(input_ids, attention_mask, prompt_len, pad_id):
    labels = make_labels(input_ids, attention_mask, prompt_len, pad_id)
    labels[np.arange(input_ids.shape[1])[None, :] <= prompt_len[:, None]] = -100
    return labels


def in_place(input_ids, attention_mask, prompt_len, pad_id):
    labels = input_ids
    labels[np.arange(input_ids.shape[1])[None, :] < prompt_len[:, None]] = -100
    labels[attention_mask == 0] = -100
    return labels


@pytest.mark.parametrize(
    "fn, text",
    [
        (masked_eos, "masked the EOS"),
        (forgot_prompt, "forgot -100 on the prompt"),
        (forgot_padding, "padding positions (attention_mask == 0) are supervised"),
        (shifted_labels, "shifted twice"),
        (off_by_one, "first answer token"),
        (in_place, "changed input_ids in place"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_make_labels_mistakes_are_named(fn, text, hidden):
    fb = check("04.p1", fn, hidden=hidden)
    assert fb.points < 3 and text in fb.text(), fb.text()


def test_masked_eos_loses_every_pad_eq_eos_case():
    fb = check("04.p1", masked_eos, hidden=True)
    cases = L._p1_public() + L._p1_hidden(np.random.default_rng(0))
    n_eq = sum(c.kwargs["pad_id"] == L.EOS for c in cases)
    assert n_eq >= 6 and "When pad == eos" in fb.text()
    assert fb.points <= 3 * (len(cases) - n_eq) / len(cases) + 1e-9


def test_make_labels_hard_coded_fails_hidden_cases():
    answers = {tuple(map(tuple, c.kwargs["input_ids"])): L.make_labels(**c.kwargs) for c in L._p1_public()}

    def hard_coded(input_ids, attention_mask, prompt_len, pad_id):
        return answers.get(tuple(map(tuple, input_ids)), np.zeros_like(input_ids))

    assert check("04.p1", hard_coded, hidden=False).full
    assert check("04.p1", hard_coded, hidden=True).points == pytest.approx(3 * 3 / 9)


def test_make_labels_stub_and_wrong_types():
    def stub(input_ids, attention_mask, prompt_len, pad_id):
        raise NotImplementedError()

    fb = check("04.p1", stub)
    assert fb.points == 0 and "NotImplementedError" in fb.text()
    fb = check("04.p1", "make_labels")
    assert fb.points == 0 and "should be a function" in fb.text()

    def wrong_signature(input_ids, attention_mask):
        return input_ids

    fb = check("04.p1", wrong_signature)
    assert fb.points == 0 and "could not be called" in fb.text()


# --------------------------------------------------------------------------- P2 masked_mean_loss


def no_shift(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def shifted_twice(logits, labels):
    return F.cross_entropy(logits[:, :-2].reshape(-1, logits.shape[-1]), labels[:, 2:].reshape(-1), ignore_index=-100)


def per_example(logits, labels):
    rows = [F.cross_entropy(logits[b, :-1], labels[b, 1:], ignore_index=-100) for b in range(labels.shape[0])]
    return torch.stack(rows).mean()


def returns_nan(logits, labels):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def divides_by_all(logits, labels):
    s = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
    return s / (labels.shape[0] * (labels.shape[1] - 1))


def counts_position_0(logits, labels):
    s = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
    return s / (labels != -100).sum()


def zero_division(logits, labels):
    s = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
    return float(s) / int((labels[:, 1:] != -100).sum())


@pytest.mark.parametrize(
    "fn, text, max_points",
    [
        (no_shift, "the causal shift is missing", 0),
        (shifted_twice, "shifted twice", 0),
        (per_example, "averaged per example", 1.5),
        (returns_nan, "returned nan", 2.5),
        (divides_by_all, "including those labelled -100", 1.5),
        (counts_position_0, "counts labels[:, 0]", 2),
        (zero_division, "raised ZeroDivisionError", 2.5),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_masked_mean_loss_mistakes_are_named(fn, text, max_points, hidden):
    fb = check("04.p2", fn, hidden=hidden)
    assert fb.points <= max_points and fb.points < 3 and text in fb.text(), fb.text()


def test_masked_mean_loss_does_not_crash_the_checker_on_garbage():
    def returns_vector(logits, labels):
        return torch.zeros(3)

    fb = check("04.p2", returns_vector)
    assert fb.points == 0 and "shape" in fb.text()


# --------------------------------------------------------------------------- numbers and arrays


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("p3", 1, "only the last micro-batch is divided by the window's N = 40"),
        ("p3", 2.5, "divides by the micro-batch's own 16 tokens"),
        ("p3", 10, "the factor of a token of the first micro-batch"),
        ("p3", 40 / 48, "averages the 3 micro-batch means"),
        ("p3", 0.5, "so its gradient grows"),
        ("p6", 0.0023454855921863655, "labels = input_ids"),
        ("p6", 2.402, "misses on every such row"),
        ("p6", 2.91, "never scores label 0"),
        ("p6", 3.64, "torch.roll"),
        ("p6", 2.046, "margin 5"),
        ("p6", 4.0, "two separate runs"),
        ("p6", 8.0, "every scored position misses"),
        ("p6", 8.002345485592187, "every scored position misses"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"04.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def measured_p5_counts() -> dict:
    """04.p5 measured by transformers' own causal-LM loss (the one LlamaForCausalLM calls): with all-zero logits every
    scored position costs log V, so the summed loss (num_items_in_batch=1) over log V counts the positions the loss
    scores. The right labels and each mistaken variant are run on the lesson's three tickets."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    b = L.p5_batch()
    ids, mask, B, T = b["input_ids"], b["attention_mask"], *b["input_ids"].shape
    V = int(ids.max()) + 1
    logits = torch.zeros(B, T, V)

    def scored(labels, lg=logits):
        total = ForCausalLMLoss(lg, labels, vocab_size=lg.shape[-1], num_items_in_batch=1)
        return int(round(float(total) / float(np.log(lg.shape[-1]))))

    def unshifted(labels):  # scoring logit t against label t: the shift forgotten
        return int(round(float(F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100,
                                               reduction="sum")) / float(np.log(V))))

    full = ids.masked_fill(mask == 0, -100)
    return {
        "right": scored(full),
        "position 0 counted": unshifted(full),
        "one shift for the batch": scored(full.reshape(1, -1), logits.reshape(1, B * T, V)),
        "padding scored": scored(ids),
        "every position": unshifted(ids),
        "answer only": scored(b["labels"]),
        "masked by id": scored(ids.masked_fill(ids == b["pad_id"], -100)),
    }


def test_p5_key_and_mistakes_are_measured_by_the_models_loss():
    """P5's key is what transformers' ForCausalLMLoss scores on the tickets with full-conversation labels, and every
    named wrong answer is what the mistaken variant scores; the notebook's tickets are the graded ones."""
    import nbformat

    counts = measured_p5_counts()
    assert ITEMS["p5"].expected() == counts["right"] == RIGHT["p5"]
    b = L.p5_batch()
    assert counts["position 0 counted"] == int(b["attention_mask"].sum()) == 152   # the number P5's prose quotes
    assert counts["answer only"] == 7
    named = {m.label: m.value for m in L._p5_mistakes()}
    assert set(named) == set(counts) - {"right"}
    for label, value in named.items():
        assert value == counts[label], label
        assert value != counts["right"], label
        fb = check("04.p5", value)
        assert fb.points == 0 and label in fb.mistakes, (label, fb.text())
    assert check("04.p5", counts["right"]).full
    nb = nbformat.read(ROOT / "solutions" / LID / f"{LID}.ipynb", as_version=4)
    src = next(c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith("tok = load_tokenizer()"))
    ns = {}
    exec(src.split("encoded =")[0].split("\n", 1)[1], {}, ns)    # the `tickets = [...]` lines of 'Two masks, two jobs'
    assert tuple(ns["tickets"]) == L.P5_TICKETS


def test_p4_key_is_measured_with_transformers_left_padding_collator():
    """P4's key measured with transformers' own collator: DataCollatorForSeq2Seq pads input_ids, attention_mask and
    labels (with -100) on the tokenizer's padding side; on the left, row 0's answer and <|im_end|> are the batch's last
    two positions, T - 2 and T - 1, where collate (right padding) has them at 47 and 48."""
    from transformers import DataCollatorForSeq2Seq

    from coursekit import model
    from coursekit.data import collate

    tok = model.load_tokenizer()
    tok.padding_side = "left"
    rows = [dict(r) for r in L.p4_rows()]
    batch = DataCollatorForSeq2Seq(tok, label_pad_token_id=-100, return_tensors="pt")(rows)
    T = batch["input_ids"].shape[1]
    measured = [t for t, lab in enumerate(batch["labels"][0].tolist()) if lab != -100]
    assert measured == _p4_right() == [T - 2, T - 1]
    assert torch.equal(batch["attention_mask"], L.left_collate(list(L.p4_rows()), tok.pad_token_id)["attention_mask"])
    right = collate(list(L.p4_rows()), pad_id=tok.pad_token_id)
    assert [t for t, lab in enumerate(right["labels"][0].tolist()) if lab != -100] == [47, 48]
    assert len(L.p4_rows()[0]["input_ids"]) == 49 < T   # row 0 is not the longest: its padding is real


@pytest.mark.parametrize(
    "wrong, label, text",
    [("right", "right padding", "padding on the right"), ("shift", "shifted", "one position to the left"),
     ("from1", "counted from 1", "positions count from 0"), ("by_id", "masked by id", "<|im_end|>")],
)
def test_p4_mistakes_are_the_mistaken_variants_run(wrong, label, text):
    """Each named wrong answer is produced here by running the mistaken variant, not written down."""
    from coursekit import model, objective
    from coursekit.data import collate

    pad_id = model.load_tokenizer().pad_token_id
    rows = list(L.p4_rows())
    left = L.left_collate(rows, pad_id)

    def row0(labels):
        return [t for t, lab in enumerate(labels[0].tolist()) if lab != -100]

    answers = {
        "right": row0(collate(rows, pad_id=pad_id)["labels"]),                 # collate's right padding
        "shift": row0(objective.shift_left(left["labels"])),                   # labels shifted by hand
        "from1": [t for t, lab in enumerate(left["labels"][0].tolist(), start=1) if lab != -100],  # 1-based count
        "by_id": row0(left["labels"].masked_fill(left["input_ids"] == pad_id, -100)),  # padding masked by id
    }
    fb = check("04.p4", answers[wrong])
    assert fb.points < 1 and label in fb.mistakes and text in fb.text(), fb.text()


def test_p7_key_is_what_the_id_mask_does_to_smollm2_batches():
    """P7's key, computed: with pad = bos (<|im_start|>) masking padding by id leaves every label as collate builds it
    (the id occurs only in the prompt), while with pad = eos the same mask drops each row's supervised <|im_end|>
    (the option the key file's hint for "b" answers)."""
    from coursekit import data, model

    tok = model.load_tokenizer()
    assert tok.bos_token == "<|im_start|>" and tok.pad_token_id == tok.eos_token_id
    rows = [data.encode_example(data.chat_example(t, lab), tok) for t, lab in L.P5_TICKETS]
    for row in rows:  # P9's model answer: three <|im_end|> per row, only the answer's supervised; no <|im_start|> is
        pairs = list(zip(row["input_ids"], row["labels"]))
        assert sum(i == tok.eos_token_id for i, _ in pairs) == 3
        assert sum(i == tok.eos_token_id and lab != -100 for i, lab in pairs) == 1
        assert not any(i == tok.bos_token_id and lab != -100 for i, lab in pairs)
    for pad_id, unchanged in ((tok.bos_token_id, True), (tok.eos_token_id, False)):
        batch = data.collate(rows, pad_id=pad_id)
        by_id = batch["labels"].masked_fill(batch["input_ids"] == pad_id, -100)
        assert data.count_supervised(by_id) > 0
        assert bool(torch.equal(by_id, batch["labels"])) is unchanged
        if not unchanged:
            assert data.count_supervised(batch["labels"]) - data.count_supervised(by_id) == len(rows)
