"""Lesson 01 ("When to adapt"): graded items score right answers fully, typical wrong answers less, with
the diagnostics a student needs; the notebook's test cells agree with the item registry."""

from pathlib import Path

import pytest

from coursekit import memory
from coursekit.grading import check
from coursekit.grading.lessons.lesson01 import ITEMS

ROOT = Path(__file__).resolve().parents[1]


def right_ledger(n_params, n_adapter, method, n_unfrozen):
    """The solution's arithmetic, written out: the unfrozen part of the base is bf16 and trained (2 + 2 + 8 bytes)."""
    if method == "full":  # every weight bf16 and trained; no adapter (memory.ledger is withheld while p5 is graded)
        return {"base_weights": 2 * n_params, "base_grads": 2 * n_params, "base_moments": 8 * n_params, "adapter": 0}
    frozen = n_params - n_unfrozen
    return {"base_weights": frozen * (0.5 if method == "qlora" else 2) + 2 * n_unfrozen,
            "base_grads": 2 * n_unfrozen, "base_moments": 8 * n_unfrozen, "adapter": 12 * n_adapter}


RIGHT = {"w1": "a", "w2": "c", "w3": "d", "p1": "d", "p2": {"c", "f"},
         "p3": ["base", "data", "baseline", "method", "compare"], "p4": 409_007_040, "p5": right_ledger, "p6": "b"}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"01.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_letters_are_forgiving_about_case_and_format():
    assert check("01.w1", "A)").full
    assert check("01.p2", "c, f").full
    assert check("01.p2", ["F", "c"]).full


# --------------------------------------------------------------------------- wrong answers


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "b", "same adapter factors"),
        ("w1", "c", "not its logical shape"),
        ("w2", "a", "not a dependable database"),
        ("w2", "d", "shape of an answer"),
        ("w3", "a", "not a persistent tensor"),
        ("w3", "b", "four times"),
        ("p1", "a", "only the answer's form is wrong"),
        ("p1", "c", "no fact is missing"),
        ("p1", "b", "nothing here calls for training"),
        ("p6", "a", "so does an 8-bit base"),
        ("p6", "c", "not the weights, and the bf16 base alone is 68 GB"),
        ("p6", "d", "408 GB"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"01.{item_id}", answer)
    assert fb.points == 0
    joined = " ".join(fb.lines)
    assert text in joined and "Reread Know this" in joined


def test_p6_key_is_the_most_precise_base_that_fits_48_gb():
    """Measured with coursekit.memory for a 34B base: the persistent tensors each option keeps whatever its activation
    lever (checkpointing and accumulation shrink activations only), plus the 10 GB the question keeps free. The NF4
    and the 8-bit base both fit 48 GB; of those the 8-bit base stores more bits per weight. The hints' numbers
    (17, 34, 68 and 408 GB) are these."""
    from coursekit.grading.keys import load as key_file

    n = 34e9
    bytes_per_weight = {"a": 0.5, "b": 1, "c": 2}
    gb = {
        "a": memory.to_gb(memory.ledger(n, 0, "qlora")["base_weights"]),
        "b": memory.to_gb(memory.ledger(n, 0, "lora", weight_bytes=1)["base_weights"]),
        "c": memory.to_gb(memory.ledger(n, 0, "lora")["base_weights"]),
        "d": memory.to_gb(memory.total(memory.ledger(n, 0, "full"))),
    }
    assert gb == {"a": 17, "b": 34, "c": 68, "d": 408}
    assert {k: gb[k] / (n / 1e9) for k in bytes_per_weight} == bytes_per_weight
    fits = [k for k, v in gb.items() if v + 10 <= 48]
    assert fits == ["a", "b"]
    most_precise = max(fits, key=bytes_per_weight.get)
    assert most_precise == RIGHT["p6"] == key_file("01")["keys"]["p6"]


@pytest.mark.parametrize("blank", [None, ..., "", "z", 3])
def test_blank_or_malformed_choice_scores_zero(blank):
    fb = check("01.w1", blank)
    assert fb.points == 0 and fb.lines


def test_multi_partial_credit_and_hints():
    fb = check("01.p2", {"c"})
    assert 0 < fb.points < 3 and "missing" in fb.text()
    fb = check("01.p2", {"c", "d", "f"})
    assert 0 < fb.points < 3 and "the adapter bucket not at all" in fb.text()
    fb = check("01.p2", {"a", "e"})
    assert fb.points == 0 and "under LoRA and QLoRA alike" in fb.text() and "10 of the 12 bytes" in fb.text()


def test_p2_key_is_what_the_ledger_gives_for_any_sizes():
    """P2's key, computed: each statement evaluated with coursekit.memory.ledger over bases from 10⁶ to 10¹¹
    parameters and adapters on both sides of N / 24; a statement is true only if it holds for every pair."""
    import json
    import math

    def statements(n, a):
        full, lora, qlora = (memory.ledger(n, a, m) for m in ("full", "lora", "qlora"))
        return {
            "a": qlora["adapter"] * 4 == lora["adapter"],
            "b": False,  # a reason, not a number: LoRA's bf16 base has no gradient bucket either
            "c": math.isclose(memory.total(full), 6 * lora["base_weights"]),
            "d": memory.total(qlora) < memory.total(lora) / 4,
            "e": full["base_weights"] - lora["base_weights"] > memory.total(full) - memory.total(lora) - (
                full["base_weights"] - lora["base_weights"]),
            "f": (qlora["adapter"] > qlora["base_weights"]) == (a > n / 24),
        }

    pairs = [(n, n * f) for n in (1e6, 1.35e8, 7e9, 7e10) for f in (1e-4, 1 / 48, 1 / 23, 0.5)]
    assert memory.ledger(7e9, 0, "lora")["base_grads"] == 0  # (b): no base-gradient bucket with a bf16 base either
    true = {k for k in "abcdef" if all(statements(n, a)[k] for n, a in pairs)}
    keys = json.loads((ROOT / "autograder" / "keys" / "01.json").read_text())["keys"]
    assert true == set(keys["p2"]) == RIGHT["p2"] == {"c", "f"}


def test_ordering_partial_credit_names_the_first_misplaced_step():
    fb = check("01.p3", ["data", "baseline", "base", "method", "compare"])
    assert 0 < fb.points < 2
    assert "position 1: 'data'" in fb.text()
    fb = check("01.p3", ["compare", "method", "baseline", "data", "base"])
    assert fb.points == 0
    fb = check("01.p3", ["baseline", "data", "base", "method"])
    assert fb.points == 0 and "exactly once" in fb.text()


def _measured_llama_params(drop=(), **overrides):
    """Parameters of the Llama model transformers builds from P4's configuration (on the meta device: shapes only, no
    memory), each parameter counted once as model.parameters() yields it; ``drop`` leaves out the parameters whose
    names contain one of its strings, ``overrides`` change the configuration: the slips a student makes, run."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=16,
               num_key_value_heads=4, head_dim=64, vocab_size=49_152, tie_word_embeddings=False,
               attention_bias=False, mlp_bias=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**{**cfg, **overrides}))
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if id(p) not in seen and not any(d in name for d in drop):
            seen.add(id(p))
            total += p.numel()
    return total


def test_p4_key_and_named_mistakes_are_measured_on_the_model_transformers_builds():
    """P4's key is the parameter count of the Llama model transformers builds from the question's configuration, and
    every named mistake is the count of that model built or counted the mistaken way; "SmolLM2's count copied" is
    Real-world reps' count of SmolLM2-135M (134,515,008, checked there against the model file: q and o hidden × hidden,
    the embedding tied) run with P4's constants."""
    import json

    from coursekit.grading.lessons.lesson01 import P4_CONFIG, P4_TIED, _llama_params

    key = _measured_llama_params()
    assert ITEMS["p4"].expected() == key == RIGHT["p4"]
    assert check("01.p4", key).full
    assert _llama_params(576, 1536, 30, 9, 3, 64, 49_152) == 134_515_008
    # Real-world reps' cell, run with P4's constants in its first line: SmolLM2's shortcuts give another count.
    nb = json.loads((ROOT / "lessons" / "01-when-to-adapt" / "01-when-to-adapt.ipynb").read_text())
    (cell,) = ["".join(c["source"]) for c in nb["cells"] if c.get("id") == "ad5b425b"]
    first, rest = cell.split("\n", 1)
    assert first.startswith("hidden, inter, layers, heads, kv_heads, head_dim, vocab = 576, 1536, 30, 9, 3, 64, 49_152")
    ns: dict = {"print": lambda *a, **k: None}
    exec(f"hidden, inter, layers, heads, kv_heads, head_dim, vocab = {tuple(P4_CONFIG.values())}\n{rest}", ns)
    assert ns["n_smol"] == _measured_llama_params(tie_word_embeddings=True, num_attention_heads=15) != key
    assert P4_CONFIG == dict(hidden=960, inter=2560, layers=32, heads=16, kv_heads=4, head_dim=64, vocab=49_152)
    assert not P4_TIED and P4_CONFIG["heads"] * P4_CONFIG["head_dim"] != P4_CONFIG["hidden"]   # what SmolLM2-135M lacks

    made = {
        "SmolLM2's count copied": _measured_llama_params(tie_word_embeddings=True, num_attention_heads=15),
        "tied": _measured_llama_params(tie_word_embeddings=True),
        "q and o hidden × hidden": _measured_llama_params(num_attention_heads=15),   # 15 × 64 = 960
        "full-width k and v": _measured_llama_params(num_key_value_heads=16),
        "no norms": _measured_llama_params(drop=("norm",)),
        "no embeddings": _measured_llama_params(drop=("embed_tokens", "lm_head")),
        "two MLP matrices": _measured_llama_params(drop=("gate_proj",)),
    }
    named = {m.label: m.value for m in ITEMS["p4"].mistakes()}
    assert named == made
    for label, value in made.items():
        fb = check("01.p4", value)
        assert fb.points == 0 and fb.mistakes == [label] and "Real-world reps" in fb.text(), (label, fb.text())
    fb = check("01.p4", key + 960)
    assert fb.points == 0 and "Likely mistake" not in fb.text()
    assert check("01.p4", key / 1e6).points == 0                      # millions are not the count
    assert check("01.p4", str(key)).points == 0                       # a string is not a number


# --------------------------------------------------------------------------- the ledger function


PUBLIC = {(7_000_000_000, 20_000_000, m, 0) for m in ("full", "lora", "qlora")} | {
    (134_515_008, 4_884_480, m, 49_152 * 576) for m in ("lora", "qlora")}


def hard_coded(n_params, n_adapter, method, n_unfrozen):
    # A table of the public cases' answers: passes them, fails the hidden ones.
    key = next(k for k in PUBLIC if k[2] == method and (k[0] == 7_000_000_000) == (n_unfrozen == 0))
    return right_ledger(*key)


def test_the_unfrozen_ledger_builds_on_coursekit_memory():
    """The reference (lesson01._ledger_buckets) agrees with the arithmetic above, reduces to memory.ledger with nothing
    unfrozen, and gives SmolLM2 with its embedding unfrozen the numbers worked out by hand."""
    from coursekit.grading.lessons.lesson01 import _SMOL, _ledger_buckets

    for m in ("full", "lora", "qlora"):
        assert _ledger_buckets(7e9, 20e6, m, 0) == memory.ledger(7e9, 20e6, m)
        assert _ledger_buckets(**_SMOL, method=m) == pytest.approx(right_ledger(**_SMOL, method=m))
    n, a, u = _SMOL["n_params"], _SMOL["n_adapter"], _SMOL["n_unfrozen"]
    assert u == 28_311_552 and _ledger_buckets(**_SMOL, method="qlora") == pytest.approx(
        {"base_weights": (n - u) / 2 + 2 * u, "base_grads": 2 * u, "base_moments": 8 * u, "adapter": 12 * a})


def test_hidden_cases_defeat_a_hard_coded_answer():
    assert check("01.p5", hard_coded, hidden=False).full
    fb = check("01.p5", hard_coded, hidden=True)
    assert fb.points == pytest.approx(4 * 5 / 11) and "hidden case" in fb.text()


def test_hidden_cases_are_deterministic():
    a = check("01.p5", right_ledger, hidden=True).text()
    b = check("01.p5", right_ledger, hidden=True).text()
    assert a == b and a.count("hidden case") == 6


def _with(method_, bucket, f):
    """The right ledger with one bucket of one method wrong: a typical student mistake."""
    def fn(n_params, n_adapter, method, n_unfrozen):
        out = right_ledger(n_params, n_adapter, method, n_unfrozen)
        if method == method_:
            out[bucket] = f(n_params, n_adapter, n_unfrozen)
        return out
    return fn


@pytest.mark.parametrize(
    "fn, text",
    [
        (_with("qlora", "base_weights", lambda n, a, u: 2 * n), "frozen base is stored as 4-bit codes"),
        (_with("qlora", "base_weights", lambda n, a, u: n / 2), "cannot stay 4-bit codes"),
        (_with("lora", "base_grads", lambda n, a, u: 2 * n), "the frozen rest stores no gradient"),
        (_with("lora", "base_grads", lambda n, a, u: 0), "each stores a bf16 gradient"),
        (_with("qlora", "base_moments", lambda n, a, u: 0), "two fp32 Adam moments (8 bytes)"),
        (_with("lora", "base_moments", lambda n, a, u: 8 * n), "a frozen weight has no optimizer state"),
        (_with("full", "base_moments", lambda n, a, u: 4 * n), "two moments per trainable parameter"),
        (_with("full", "adapter", lambda n, a, u: 12 * a), "it has no adapter"),
        (_with("qlora", "adapter", lambda n, a, u: 4 * a), "add its two fp32 Adam moments"),
        (_with("lora", "adapter", lambda n, a, u: 16 * a), "only the Adam moments are fp32"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_ledger_mistakes_lose_points_with_a_diagnosis(fn, text, hidden):
    fb = check("01.p5", fn, hidden=hidden)
    assert 0 < fb.points < 4
    assert text in fb.text()


def test_ledger_stub_missing_key_and_wrong_type():
    def stub(n_params, n_adapter, method, n_unfrozen):
        raise NotImplementedError()

    fb = check("01.p5", stub)
    assert fb.points == 0 and "NotImplementedError" in fb.text()

    def missing(n_params, n_adapter, method, n_unfrozen):
        out = right_ledger(n_params, n_adapter, method, n_unfrozen)
        del out["adapter"]
        return out

    fb = check("01.p5", missing)
    assert fb.points == 0 and "no key(s) ['adapter']" in fb.text()

    def as_list(n_params, n_adapter, method, n_unfrozen):
        return list(right_ledger(n_params, n_adapter, method, n_unfrozen).values())

    assert check("01.p5", as_list).full  # four values in bucket order are accepted too

    def total_only(n_params, n_adapter, method, n_unfrozen):
        return memory.total(right_ledger(n_params, n_adapter, method, n_unfrozen))

    fb = check("01.p5", total_only)
    assert fb.points == 0 and "should return 4 values" in fb.text()

    fb = check("01.p5", "ledger")
    assert fb.points == 0 and "should be a function" in fb.text()


def test_p5_prompt_says_what_peft_modules_to_save_does():
    """P5's prompt contrasts unfreezing in place with PEFT's modules_to_save, which (in the installed PEFT) trains a deep
    copy of each listed module and freezes the original: two stored copies of those weights, one of them trainable."""
    import torch
    from peft import LoraConfig, get_peft_model

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8, bias=False)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(self.proj(x))

    model = get_peft_model(Tiny(), LoraConfig(r=2, target_modules=["proj"], modules_to_save=["norm"]))
    wrapper = model.base_model.model.norm
    original, copy = wrapper.original_module, wrapper.modules_to_save["default"]
    assert not original.weight.requires_grad and copy.weight.requires_grad
    assert original.weight.data_ptr() != copy.weight.data_ptr()
    assert torch.equal(original.weight, copy.weight)   # a copy, so the weights are stored twice
    nb = (ROOT / "solutions" / "01-when-to-adapt" / "01-when-to-adapt.ipynb").read_text()
    assert "trains a copy of each listed module and keeps the frozen original" in nb
