"""Lesson 17 ("What QLoRA actually costs"): graded items score right answers fully, the likely mistakes (the measured
policy misapplied, the loss scaler's order, the checkpointed activations, a saved-tensor count without deduplication or
with the parameters in it) less, with a diagnosis; every key is measured here (torch, bitsandbytes, coursekit.memory)."""

import math
from pathlib import Path

import nbformat
import pytest
import torch

from coursekit import memory
from coursekit.grading import check
from coursekit.grading.lessons.lesson17 import ITEMS, GatedBlock, count_saves, saved_bytes

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "17-what-qlora-actually-costs" / "17-what-qlora-actually-costs.ipynb"


def hooked(model, x, dedup=True, params_out=True, per_element=False):
    """saved_bytes as a student writes it from the prompt (torch's hooks, storages by data_ptr), independent of
    lesson17.count_saves; the keywords switch on the likely mistakes."""
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()} if params_out else set()
    seen, saves = {}, []

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            size = st.nbytes() // t.element_size() if per_element else st.nbytes()
            seen.setdefault(st.data_ptr(), (st, size))
            saves.append(size)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    del out
    return sum(saves) if not dedup else sum(size for _, size in seen.values())


def measured_policy_gb(n_params, vocab, hidden, n_adapter, heads=2):
    """P1 written out: two vocab × hidden matrices in fp32, every other base parameter half a byte, 16 bytes per adapter
    parameter (fp32 weight, gradient and two AdamW moments); the policy test below measures each rate on a real load."""
    kept = heads * vocab * hidden
    return ((n_params - kept) * 0.5 + kept * 4 + n_adapter * 16) / 1e9


RIGHT = {"w1": "b", "w2": "c", "w3": "d", "p1": measured_policy_gb(6.74e9, 32_000, 4_096, 40e6),
         "p2": 1 / 2**16,
         "p3": "b", "p4": 4 * 512 * (16 * 2_048 * 2 + 128_256 * 4) / 1e6, "p5": hooked, "p6": "c"}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def test_notebook_loads_the_real_model_once():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert src.count("load_model(") == 1


def test_w1_key_is_the_ledgers_two_buckets():
    """W1's key, computed: lesson 01's QLoRA column for 7e9 base parameters and a 20e6-parameter adapter is 3.74 GB, the
    4-bit codes (3.5 GB) and the adapter's 12 bytes per parameter (0.24 GB) and nothing else (b); the block scales
    its explanation of (c) quotes, 0.11 GB with double quantization and 0.44 GB without, are not in it."""
    col = memory.ledger(7e9, 20e6, "qlora")
    assert memory.total(col) / 1e9 == pytest.approx(3.74)
    assert col["base_weights"] / 1e9 == pytest.approx(3.5) and col["adapter"] / 1e9 == pytest.approx(0.24)
    assert col["base_grads"] == col["base_moments"] == 0
    assert round(memory.nf4_metadata_bytes(7e9) / 1e9, 2) == 0.11
    assert round(memory.nf4_metadata_bytes(7e9, double_quant=False) / 1e9, 2) == 0.44


def _blocks():
    """The public cases, then the hidden ones."""
    from coursekit.grading import _Context

    ctx = _Context("17", "p5", True)
    return list(ITEMS["p5"].public()) + list(ITEMS["p5"].hidden(ctx.rng()))


def test_p5_key_is_what_autograd_saves_counted_three_ways():
    """P5's key, measured: the reference (memory.SavedTensors), lesson17.count_saves and a student's hooks agree on every
    case; and on one case, counted by hand from what each operation needs for backward: with x requiring no grad and one
    adapter on up, the forward saves the normed x (lora_A's input), lora_A's output (lora_B's input) and silu(gate)
    (the other factor of the product with up's output), all fp32, and nothing of the frozen base."""
    for case in _blocks():
        kw = case.kwargs
        right = saved_bytes(**kw)
        assert right == count_saves(**kw) == hooked(**kw) > 0, case.label
    n, d, h, r = 4, 8, 16, 2
    model, x = GatedBlock(d, h, ("up",), seed=0), torch.randn(n, d)
    assert saved_bytes(model, x) == (n * d + n * r + n * h) * 4
    frozen = GatedBlock(d, h, (), seed=0)
    assert saved_bytes(frozen, x) == 0                          # nothing requires a gradient: nothing is saved


def test_p5_every_case_has_a_repeated_save_and_saved_parameters():
    """Each likely mistake changes the count on every case (so an example student who makes it loses all 4 points, and
    the feedback names it): a storage saved twice, a frozen weight saved for an input gradient, fp32 numbers."""
    for case in _blocks():
        kw = case.kwargs
        right = hooked(**kw)
        assert hooked(**kw, dedup=False) > right, case.label
        assert hooked(**kw, params_out=False) > right, case.label
        assert hooked(**kw, per_element=True) * 4 == right, case.label


def test_p5_hidden_cases_are_deterministic_and_defeat_hard_coding():
    a = check("17.p5", hooked, hidden=True).text()
    assert a == check("17.p5", hooked, hidden=True).text() and a.count("hidden case") == 6
    table = {(tuple(c.kwargs["x"].shape), c.kwargs["x"].requires_grad): saved_bytes(**c.kwargs) for c in ITEMS["p5"].public()}
    assert len(table) == len(ITEMS["p5"].public())

    def lookup(model, x):                                      # the public answers, recognised by x alone
        return table.get((tuple(x.shape), x.requires_grad), 0)

    assert check("17.p5", lookup, hidden=False).full
    assert check("17.p5", lookup, hidden=True).points <= 4 * 4 / 9


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"17.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


# --------------------------------------------------------------------------- wrong answers


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "Activations live only between a forward pass and its backward"),
        ("w1", "c", "writes the block scales next to the total"),
        ("w1", "d", "The dequantized copy is a temporary"),
        ("w2", "a", "sums every token's contribution"),
        ("w2", "b", "a fixed cost of the adapter"),
        ("w2", "d", "keeps only the packed codes"),
        ("w3", "a", "not their precision"),
        ("w3", "c", "optimizer state is untouched"),
        ("w3", "b", "weights stay where they are"),
        ("p3", "a", "takes log_softmax over every row of the logits first"),
        ("p3", "c", "still need their log-probabilities"),
        ("p3", "d", "the label tensor itself"),
        ("p6", "a", "no weight gets a gradient any more"),
        ("p6", "b", "it reaches them only through layers 29 down to 15"),
        ("p6", "d", "needs its weight, not its input"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"17.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_p4_names_each_slip_in_the_checkpointed_activations():
    """P4's key is lesson17.checkpointed_saved_bytes at the prompt's sizes with a bf16 residual stream; each named
    mistake is the same function with one knob turned the wrong way (the measured tests below run each variant)."""
    tokens, vocab, hidden, layers = 4 * 512, 128_256, 2_048, 16
    right = tokens * (layers * hidden * 2 + vocab * 4)
    assert ITEMS["p4"].expected() == right / 1e6 == RIGHT["p4"]
    for answer in (right / 1e6, round(right / 1e6), 1184, 1186):                # the nearest MB: 1,185
        assert check("17.p4", answer).points == 2, answer
    for answer, label, text in [
            (tokens * (layers * hidden * 4 + vocab * 4) / 1e6, "layer inputs in fp32", "counted the layer inputs in fp32"),
            (tokens * (layers * hidden * 2 + vocab * 2) / 1e6, "log-softmax in bf16", "log-softmax in bf16, like the logits"),
            (tokens * (layers * hidden * 2 + vocab * 6) / 1e6, "logits saved too", "you also counted the logits"),
            (tokens * vocab * 4 / 1e6, "log-softmax only", "only the loss's log-softmax"),
            (tokens * layers * hidden * 2 / 1e6, "layer inputs only", "only the layer inputs"),
            (right / 4 / 1e6, "one sequence", "one sequence of 512 tokens"),
            (right / 2**20, "MiB", "MiB"),
            (right / 1e9, "GB", "that is in GB"),
            (right, "bytes", "in bytes")]:
        fb = check("17.p4", answer)
        assert fb.points == 0 and text in fb.text() and fb.mistakes == [label], (answer, fb.text())
    for answer in (1180, 1190, 1100):                                          # three significant digits are too coarse
        fb = check("17.p4", answer)
        assert fb.points == 0 and "not right (tolerance" in fb.text(), (answer, fb.text())


def test_smollm2s_sizes_and_the_loss_saves_an_fp32_log_softmax_of_bf16_logits():
    """The sizes the lesson and the tests quote for SmolLM2 are the converted checkpoint's; and transformers' causal-LM loss
    (the model's own loss_function) keeps one fp32 tensor of tokens × vocabulary for backward, from fp32 or bf16 logits
    alike (it upcasts them, loss_utils.py), and not the logits; cross_entropy called on the bf16 logits themselves keeps a
    bf16 one: the variant P4's "log-softmax in bf16" mistake describes."""
    import json

    from transformers.loss.loss_utils import ForCausalLMLoss

    from coursekit import model as cmodel
    from coursekit.grading.lessons.lesson17 import SMOLLM2

    cfg = json.loads((cmodel.default_checkpoint_dir() / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (SMOLLM2["vocab"], SMOLLM2["hidden"], SMOLLM2["layers"])
    vocab = SMOLLM2["vocab"]
    labels = torch.randint(0, vocab, (1, 8))
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(1, 8, vocab, dtype=dtype, requires_grad=True)
        with memory.SavedTensors() as saved:
            ForCausalLMLoss(logits, labels, vocab_size=vocab)
        assert saved.largest(1)[0] == (8 * vocab * 4, (8, vocab), "float32"), dtype
        assert saved.nbytes - 8 * vocab * 4 < 100 and "bfloat16" not in saved.by_dtype
    logits = torch.randn(8, vocab, dtype=torch.bfloat16, requires_grad=True)
    with memory.SavedTensors(exclude=[logits]) as saved:
        torch.nn.functional.cross_entropy(logits, labels[0])
    assert saved.largest(1)[0] == (8 * vocab * 2, (8, vocab), "bfloat16")
    from coursekit.grading.lessons import lesson17 as L

    mistakes = {m.label: m.value for m in L._p4_mistakes()}
    assert L._p4_mb(loss_bytes=saved.largest(1)[0][0] // (8 * vocab)) == mistakes["log-softmax in bf16"]


def _checkpointed_saves(base, batch, prepared: bool):
    """The lesson's checkpointed recipe on ``base``: attach_adapter (``prepared``: with prepare_model_for_kbit_training,
    as the lesson runs; else quantized=False, which skips it, as P4's colleague does), reentrant checkpointing switched on
    through transformers as the lesson does, one forward counted by memory.SavedTensors, one backward. Returns the saved
    storages (bytes, shape, dtype), largest first, and whether every lora_B got a nonzero gradient (the run trains)."""
    from coursekit import train

    model = train.attach_adapter(base, train.TrainConfig(), quantized=prepared)
    kw = {"use_reentrant": True}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    model.train()
    with memory.SavedTensors(exclude=model) as saved:
        loss = model(**batch).loss
    loss.backward()
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    trains = bool(lora_b) and all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in lora_b)
    return saved.nbytes, saved.largest(saved.n_storages), trains


def _check_the_two_terms(nbytes, rows, trains, batch_shape, vocab, hidden, layers, prepared):
    """What P4's model says the checkpointed forward keeps, checked storage by storage: one input per decoder layer in
    the residual stream's dtype (fp32 prepared, bf16 not), the loss's fp32 log-softmax, no logits, and a rest smaller
    than two fp32 hidden states (the final norm's input or its fp32 copy, its statistics, the labels). Returns the
    measured bytes per number of the layer inputs and of the log-softmax."""
    from coursekit.grading.lessons.lesson17 import checkpointed_saved_bytes

    tokens = batch_shape[0] * batch_shape[1]
    stream = "float32" if prepared else "bfloat16"
    hidden_rows = [r for r in rows if r[1] == (*batch_shape, hidden)]
    counts = {dt: sum(r[2] == dt for r in hidden_rows) for dt in ("float32", "bfloat16")}
    assert counts == ({"float32": layers + 1, "bfloat16": 0} if prepared else {"float32": 1, "bfloat16": layers}), counts
    assert rows[0] == (tokens * vocab * 4, (tokens, vocab), "float32")          # the log-softmax
    assert [r for r in rows if vocab in r[1]] == [rows[0]]                       # the logits are not saved
    stream_bytes = next(r[0] for r in hidden_rows if r[2] == stream) // (tokens * hidden)
    two = checkpointed_saved_bytes(tokens, vocab, hidden, layers, stream_bytes=stream_bytes)
    assert two == tokens * vocab * 4 + layers * tokens * hidden * (4 if prepared else 2)
    assert 0 < nbytes - two < 2 * tokens * hidden * 4
    assert trains
    return stream_bytes, rows[0][0] // (tokens * vocab)


@pytest.mark.parametrize("prepared", [True, False])
def test_p4_model_measured_on_a_tiny_llama_of_another_shape(tmp_path, prepared):
    """P4's model carried to another shape, as P4 carries it: a tiny Llama (vocabulary 1,000, hidden size 128, 3 decoder
    layers, tied embedding) loaded with load_model("nf4") and run through the lesson's checkpointed recipe, prepared and
    not. The checkpointed forward keeps what lesson17.checkpointed_saved_bytes counts, in the dtypes P4's key uses
    without the preparation, and its "layer inputs in fp32" mistake measures with it: the layer inputs follow the
    embedding's dtype, the log-softmax is fp32 either way. So P4's key and that mistake are the function at the prompt's
    sizes with the measured bytes per number."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from coursekit import model as cmodel
    from coursekit.grading.lessons import lesson17 as L

    vocab, hidden, layers = 1_000, 128, 3
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=256, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    base = cmodel.load_model("nf4", tmp_path)
    ids = torch.randint(2, vocab, (2, 24), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    stream_bytes, loss_bytes = _check_the_two_terms(*_checkpointed_saves(base, batch, prepared), (2, 24), vocab, hidden,
                                                    layers, prepared)
    mistakes = {m.label: m.value for m in L._p4_mistakes()}
    measured = L._p4_mb(stream_bytes=stream_bytes, loss_bytes=loss_bytes)
    assert measured == (ITEMS["p4"].expected() if not prepared else mistakes["layer inputs in fp32"])


def test_p4_model_measured_on_smollm2_without_the_preparation():
    """P4's colleague's path on the lesson's own model and batch shape (SmolLM2-135M in NF4, attach_adapter with
    quantized=False, reentrant checkpointing, 2 × 64 tokens, every token supervised): 30 bf16 layer inputs, the fp32
    log-softmax, no logits, and a rest of under two hidden states; the adapters still train. The notebook measures the
    same forward by casting its prepared model back to bf16 (Real-world reps 2)."""
    from coursekit import model as cmodel
    from coursekit.grading.lessons.lesson17 import SMOLLM2

    tokenizer = cmodel.load_tokenizer()
    text = "Ticket 4471: the hydraulic press on line 3 loses pressure after ten minutes and the pump gets loud. " * 3
    enc = tokenizer([text, text.replace("4471", "4472")], return_tensors="pt", truncation=True, max_length=64)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": enc["input_ids"].clone()}
    assert batch["input_ids"].shape == (2, 64) and bool(batch["attention_mask"].all())
    base = cmodel.load_model("nf4")
    assert base.get_input_embeddings().weight.dtype == torch.bfloat16
    assert _check_the_two_terms(*_checkpointed_saves(base, batch, prepared=False), (2, 64), SMOLLM2["vocab"],
                                SMOLLM2["hidden"], SMOLLM2["layers"], prepared=False) == (2, 4)


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("p2", 2.0, "not right (tolerance"),
        ("p1", 0.5 * 6.74 + 12 * 0.04, "the ledger's policy"),
        ("p1", RIGHT["p1"] - 2 * 32_000 * 4_096 * 2 / 1e9, "kept the embedding and the output head in bf16"),
        ("p1", 0.5 * 6.74 + 16 * 0.04, "you quantized the embedding and the output head too"),
        ("p1", measured_policy_gb(6.74e9, 32_000, 4_096, 40e6, heads=1), "is not tied to its embedding"),
        ("p1", RIGHT["p1"] - 4 * 0.04, "12 bytes per adapter parameter"),
        ("p1", RIGHT["p1"] - 12 * 0.04, "only the adapter's fp32 weights"),
        ("p1", RIGHT["p1"] + 3.5 * (6.74 - 2 * 0.131072), "each 4-bit code as 4 bytes"),
        ("p1", RIGHT["p1"] * 1e9 / 2**30, "in GiB"),
        ("p1", RIGHT["p1"] * 1e9, "in bytes"),
        ("p1", 20.0, "not right (tolerance"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"17.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


@pytest.mark.parametrize(
    "mistake, label, text",
    [
        (dict(dedup=False), "every save", "you added a storage once per save"),
        (dict(params_out=False), "parameters counted", "you counted the model's own parameters"),
        (dict(per_element=True), "elements", "a count of numbers, not of bytes"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_p5_mistakes_run_lose_every_case_and_are_named(mistake, label, text, hidden):
    def fn(model, x):
        return hooked(model, x, **mistake)

    fb = check("17.p5", fn, hidden=hidden)
    assert fb.points == 0 and text in fb.text(), fb.text()
    assert fb.mistakes == [label], fb.mistakes


def test_function_stub_and_non_function():
    def stub(model, x):
        raise NotImplementedError()

    assert check("17.p5", stub).points == 0
    fb = check("17.p5", 3.74)
    assert fb.points == 0 and "should be a function" in fb.text()


@pytest.mark.parametrize("answer, points", [(4.928, 2), (4.9275, 2), (4.927504, 2), (4.924, 0), (4.93, 0), (4.9, 0), (5, 0)])
def test_p1_accepts_three_decimals_and_names_coarser_rounding(answer, points):
    import numpy as np

    fb = check("17.p1", answer)
    assert fb.points == points, fb.text()
    if not points and answer != 4.924:
        assert "looks rounded" in fb.text() and "4.9275" not in fb.text()
    assert check("17.p1", np.float32(answer)).points == points


def test_p1_policy_is_what_a_4bit_load_of_an_untied_model_keeps(tmp_path):
    """P1's key, measured: a tiny Llama with an output head *not* tied to its embedding, loaded as the lesson loads
    SmolLM2 (coursekit.model.load_model("nf4"), then coursekit.train.attach_adapter: prepare_model_for_kbit_training and
    PEFT's LoRA on every linear layer), one backward and one AdamW step. Its persistent bytes, norms and step counters
    aside, are exactly P1's policy: half a byte per quantized weight, the embedding and the head (not quantized) in
    fp32, 16 bytes per adapter parameter. So the key is the policy applied to the prompt's sizes."""
    import bitsandbytes as bnb
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from coursekit import model as cmodel, train
    from coursekit.grading.lessons import lesson17 as L

    vocab, hidden = 128, 64
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    base = cmodel.load_model("nf4", tmp_path)
    assert not isinstance(base.lm_head, bnb.nn.Linear4bit) and base.lm_head.weight is not base.get_input_embeddings().weight
    model = train.attach_adapter(base, train.TrainConfig(r=4, lora_alpha=8))
    adapter = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(adapter, lr=1e-3)
    ids = torch.randint(2, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()

    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    codes = [p for p in frozen if type(p).__name__ == "Params4bit"]
    kept = [base.get_input_embeddings().weight, base.lm_head.weight]
    norms = [p for p in frozen if p.ndim == 1]
    assert len(frozen) == len(codes) + len(kept) + len(norms)
    assert all(p.dtype == torch.float32 for p in kept + norms + adapter)
    n_quantized = sum(p.quant_state.shape.numel() for p in codes)
    n_adapter = sum(p.numel() for p in adapter)
    moments = [t for p in adapter for k, t in opt.state[p].items() if k != "step"]
    measured = nbytes(codes) + nbytes(kept) + nbytes(adapter) + nbytes(p.grad for p in adapter) + nbytes(moments)
    assert measured == L.policy_bytes(n_quantized + 2 * vocab * hidden, vocab, hidden, n_adapter)
    assert ITEMS["p1"].expected() == pytest.approx(RIGHT["p1"], rel=1e-12) == L.policy_bytes(**L.P1) / 1e9


@pytest.mark.parametrize("junk", [None, "3.74", float("nan"), [1, 2]])
def test_junk_answers_score_zero_without_raising(junk):
    for item in ("p1", "p2", "p5"):
        assert check(f"17.{item}", junk).points == 0
    assert check("17.p5", lambda model, x: junk).points == 0


def test_p3_key_is_what_the_models_own_loss_saves_with_masked_labels():
    """P3's key, run: transformers' causal-LM loss (the function SmolLM2's forward calls) on the lesson's 2 × 64 batch
    shape saves the same bytes for backward whether every label counts or 48 of each row's 64 are −100: one fp32
    128 × 49,152 log-softmax, 25 MB (b); not a quarter of it (a), not nothing (c), not twice it (d)."""
    import json

    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    from coursekit.grading.lessons.lesson17 import SMOLLM2

    vocab, MB = SMOLLM2["vocab"], 1e6
    logits = torch.randn(2, 64, vocab, requires_grad=True)
    labels = torch.randint(0, vocab, (2, 64))
    masked = labels.clone()
    masked[:, :48] = -100
    saved = {}
    for name, lab in (("every token", labels), ("48 of 64 masked", masked)):
        with memory.SavedTensors(exclude=[logits]) as s:
            ForCausalLMLoss(logits, lab, vocab_size=vocab)
        saved[name] = s
    full, part = saved["every token"], saved["48 of 64 masked"]
    assert full.largest(1)[0] == part.largest(1)[0] == (128 * vocab * 4, (128, vocab), "float32")
    ratio = part.nbytes / full.nbytes
    measured = "b" if abs(ratio - 1) < 0.01 else "a" if abs(ratio - 0.25) < 0.05 else "c" if ratio < 0.1 else "d" if ratio > 1.9 else None
    keys = json.loads((ROOT / "autograder" / "keys" / "17.json").read_text())["keys"]
    assert measured == keys["p3"] == RIGHT["p3"]
    assert round(128 * vocab * 4 / MB) == 25                                  # the 25 MB the prompt quotes


def _saved_per_layer(peft_model, batch):
    """Bytes autograd saves during one forward, as memory.SavedTensors counts them (each distinct storage once, the
    model's parameters and buffers left out), each storage credited to the decoder layer running when it is first saved
    (None: outside every decoder layer)."""
    layers = peft_model.get_base_model().model.layers
    current = [None]
    hooks = [h for i, layer in enumerate(layers)
             for h in (layer.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, i)),
                       layer.register_forward_hook(lambda m, a, o: current.__setitem__(0, None)))]
    own = {t.untyped_storage().data_ptr() for t in [*peft_model.parameters(), *peft_model.buffers()]}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in own and st.data_ptr() not in seen:
            seen[st.data_ptr()] = (st, current[0])
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = peft_model(**batch).loss
    finally:
        for h in hooks:
            h.remove()
    per_layer = [0] * len(layers)
    for st, i in seen.values():
        if i is not None:
            per_layer[i] += st.nbytes()
    with memory.SavedTensors(exclude=peft_model) as counted:
        loss2 = peft_model(**batch).loss
    assert counted.nbytes == sum(st.nbytes() for st, _ in seen.values())      # the lesson's count, split by layer
    del loss, loss2
    return per_layer


def test_p6_key_is_what_frozen_upper_layers_save_with_adapters_only_below():
    """P6's key, measured on the lesson's model and batch shape (SmolLM2-135M in NF4, attach_adapter's r = 16 on every
    linear layer of the decoder, 2 rows × 64 tokens, every token supervised, no checkpointing): with the adapter on
    layers 0–14 only, the upper 15 layers save less for backward than with adapters of their own, and more than
    nothing (c): not the same (a), not nothing (b), not more (d). The layers below keep what they saved before."""
    import json

    from coursekit import model as cmodel, train

    lower = r"model\.layers\.([0-9]|1[0-4])\.(self_attn|mlp)\.\w+_proj"
    tokenizer = cmodel.load_tokenizer()
    text = "Ticket 4471: the hydraulic press on line 3 loses pressure after ten minutes and the pump gets loud. " * 3
    enc = tokenizer([text, text.replace("4471", "4472")], return_tensors="pt", truncation=True, max_length=64)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": enc["input_ids"].clone()}
    assert batch["input_ids"].shape == (2, 64)
    per = {}
    for name, targets in (("every layer", "all-linear"), ("layers 0-14", lower)):
        peft_model = train.attach_adapter(cmodel.load_model("nf4"), train.TrainConfig(target_modules=targets))
        peft_model.train()
        adapted = {n.split(".layers.")[1].split(".")[0] for n, p in peft_model.named_parameters() if p.requires_grad}
        assert adapted == {str(i) for i in (range(30) if name == "every layer" else range(15))}
        assert sum("lora_A" in n for n, p in peft_model.named_parameters() if p.requires_grad) == 7 * len(adapted)
        per[name] = _saved_per_layer(peft_model, batch)
    upper_before, upper_after = sum(per["every layer"][15:]), sum(per["layers 0-14"][15:])
    assert all(b > 0 for b in per["layers 0-14"][15:])                              # every upper layer saves something
    ratio = upper_after / upper_before
    measured = ("a" if abs(ratio - 1) < 0.01 else "b" if upper_after == 0 else "c" if 0 < ratio < 0.99
                else "d" if ratio > 1.01 else None)
    keys = json.loads((ROOT / "autograder" / "keys" / "17.json").read_text())["keys"]
    assert measured == keys["p6"] == RIGHT["p6"], (ratio, upper_after, upper_before)
    assert per["layers 0-14"][1:15] == per["every layer"][1:15]                    # below the cut nothing changes


def _scaler_step(order: str, true_grad=(0.3, 0.4), max_norm=1.0):
    """One step of a loop with torch.amp.GradScaler at its default starting scale on a two-entry parameter whose true
    gradient (of the unscaled loss) is ``true_grad`` (norm 0.5), clipping to ``max_norm``. ``order``: "unscale first"
    (unscale_, clip, step: the lesson's order), "clip first" (clip, then step, which unscales: P2's loop). Returns the
    scale, the norm clip_grad_norm_ measured, the norm it left, and the norm of the gradients the optimizer stepped
    with (scaler.step unscales them in place; SGD with lr 0 leaves the parameter alone)."""
    import torch

    p = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale((p * torch.tensor(true_grad)).sum()).backward()
    if order == "unscale first":
        scaler.unscale_(opt)
    seen = torch.nn.utils.clip_grad_norm_([p], max_norm).item()
    left = p.grad.norm().item()
    scaler.step(opt)
    scaler.update()
    return {"scale": scaler._init_scale, "seen": seen, "left": left, "stepped": p.grad.norm().item()}


def test_p2_key_is_the_measured_norm_when_clipping_runs_before_unscale():
    """P2's key, run: torch's GradScaler (default starting scale 2¹⁶) and clip_grad_norm_ in the colleague's order (clip,
    then scaler.step, which unscales): the optimizer steps with norm 1/S. Each named mistake is a number the same loop
    produces read the wrong way: the lesson's order (unscale_ first) steps with the true 0.5; the clipped gradients before
    scaler.step have norm 1.0; clip_grad_norm_ measured 0.5 · S."""
    from coursekit.grading.lessons.lesson17 import P2

    wrong, right = _scaler_step("clip first"), _scaler_step("unscale first")
    assert wrong["scale"] == P2["scale"] == 2.0**16 and math.isclose(math.hypot(0.3, 0.4), P2["true_norm"])
    assert check("17.p2", wrong["stepped"]).full and math.isclose(wrong["stepped"], RIGHT["p2"], rel_tol=1e-3)
    assert math.isclose(ITEMS["p2"].expected(), wrong["stepped"], rel_tol=1e-5)
    for value, text in ((right["stepped"], "0.5 is what the right order gives"),
                        (wrong["left"], "1.0 is the norm clip_grad_norm_ leaves"),
                        (wrong["seen"], "32,768 is the norm clip_grad_norm_ measures")):
        fb = check("17.p2", value)
        assert fb.points == 0 and text in fb.text(), (value, fb.text())
    assert math.isclose(right["stepped"], 0.5, rel_tol=1e-6) and math.isclose(wrong["left"], 1.0, rel_tol=1e-5)
    assert wrong["seen"] == 0.5 * 2**16 == 32_768 and right["seen"] == pytest.approx(0.5)


def test_p5_handing_in_the_lessons_counter_scores_nothing():
    """memory.SavedTensors is the lesson's own counter and P5's reference: the grader's runner withholds it (its stub
    raises), and the notebook's check runs the answer the same way."""
    from coursekit.grading.remote import withheld_of

    assert "coursekit.memory:SavedTensors.__init__" in withheld_of(ITEMS["p5"])

    def borrowed(model, x):
        with memory.SavedTensors(exclude=model) as saved:
            model(x)
        return saved.nbytes

    for fn in (borrowed, lambda model, x: memory.saved_activation_bytes(lambda: model(x), exclude=model)[1]):
        fb = check("17.p5", fn, hidden=True)
        assert fb.points == 0 and "is withheld" in fb.text(), fb.text()
