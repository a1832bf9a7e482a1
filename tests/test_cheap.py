"""coursekit.cheap: the cheap rungs of lesson 19 (bag of words, kNN and a probe on the frozen base), each on a
tiny setting, and the rule that every choice is made on training tickets only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from coursekit import cheap, data, model as cmodel


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama with the real tokenizer's vocabulary (so real tickets and chat prompts run through it)."""
    path = cmodel.tiny_checkpoint(tmp_path_factory.mktemp("tiny-cheap"), seed=3, vocab_size=49152, num_hidden_layers=2)
    net = cmodel.load_model("fp32", path)
    return net, cmodel.load_tokenizer()


def test_pool_ignores_padding_on_either_side_and_last_is_the_last_real_token():
    h = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]])
    torch.testing.assert_close(cheap.pool(h, mask, "mean"), torch.stack([h[0, :2].mean(0), h[1, 1:].mean(0)]))
    torch.testing.assert_close(cheap.pool(h, mask, "last"), torch.stack([h[0, 1], h[1, 3]]))
    with pytest.raises(ValueError, match="no real token"):
        cheap.pool(h, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]]), "mean")
    with pytest.raises(ValueError, match="pooling"):
        cheap.pool(h, mask, "max")


def test_layer_features_are_the_layers_mean_over_real_tokens_whatever_the_padding(tiny):
    net, _ = tiny
    ids = torch.tensor([[5, 9, 14, 3]])
    alone = cheap.layer_features(net, ids, torch.ones_like(ids), 1)
    padded = cheap.layer_features(net, torch.tensor([[5, 9, 14, 3, 1, 1], [7, 8, 1, 1, 1, 1]]),
                                  torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]]), 1)
    torch.testing.assert_close(padded[:1], alone, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        want = net(input_ids=ids, output_hidden_states=True).hidden_states[1].mean(1)
    torch.testing.assert_close(alone, want)
    assert not torch.allclose(alone, cheap.layer_features(net, ids, torch.ones_like(ids), 2))  # layers differ


def test_hidden_features_match_one_ticket_at_a_time(tiny):
    """Batched by length, padded and (for the chat prompt) prefix-cached: every ticket's features are those of
    its own unpadded forward, in input order."""
    net, tok = tiny
    tickets = [ex["ticket"] for ex in data.load_split("train")[:5]] + ["Short one."]
    for fed in cheap.FED:
        got = cheap.hidden_features(net, tok, tickets, fed, layers=(0, 2), batch_size=4)
        for i, t in enumerate(tickets):
            if fed == "ticket":
                ids = tok.encode(t, add_special_tokens=False)
                own = slice(0, len(ids))
            else:
                prompts = cheap.ceval.encode_prompts(tok, [data.prompt_messages(x) for x in tickets])
                ids, own = prompts[i], slice(cheap.ceval.common_prefix_length(prompts), None)
            with torch.no_grad():
                hs = net(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
            for layer in (0, 2):
                np.testing.assert_allclose(got[(layer, "mean")][i], hs[layer][0, own].mean(0).numpy(), atol=2e-4)
                np.testing.assert_allclose(got[(layer, "last")][i], hs[layer][0, -1].numpy(), atol=2e-4)


def test_knn_votes_and_breaks_ties_by_the_nearest():
    train = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9], [0.2, 0.8]], dtype=np.float32)
    y = ["a", "a", "b", "b", "b"]
    assert cheap.knn_predict(train, y, np.array([[1, 0.05], [0.05, 1]]), 1) == ["a", "b"]
    assert cheap.knn_predict(train, y, np.array([[1, 0.05]]), 5) == ["b"]  # 3 b against 2 a
    assert cheap.knn_predict(train, y, np.array([[1, 0.05]]), 4) == ["a"]  # 2 against 2: the nearest's label
    with pytest.raises(ValueError):
        cheap.knn_predict(train, y, train, 6)


def test_grouped_cv_never_fits_on_a_tested_group():
    y = ["a", "b"] * 10
    groups = [f"s{i // 2}" for i in range(20)]
    seen = []

    def fit_predict(tr, te):
        assert not {groups[i] for i in tr} & {groups[i] for i in te}
        seen.extend(te)
        return [y[i] for i in te]

    assert cheap.grouped_cv(fit_predict, y, groups, folds=5) == 1.0
    assert sorted(seen) == list(range(20))  # every training row tested exactly once


def test_the_searches_refuse_held_out_tickets():
    mixed = data.load_split("train")[:10] + data.load_split("unseen_symptom")[:2]
    for search in (lambda: cheap.bow_search(mixed), lambda: cheap.knn_search(mixed, {}),
                   lambda: cheap.probe_search(mixed, {})):
        with pytest.raises(ValueError, match="training tickets only"):
            search()


def _small_splits(heldout_text=None):
    train = [ex for ex in data.load_split("train") if int(ex["symptom"].rsplit("-", 1)[1]) < 3][:90]
    out = {"train": train}
    for s in data.HELDOUT_SPLITS:
        held = data.load_split(s)[:12]
        out[s] = held if heldout_text is None else [{**ex, "ticket": heldout_text(ex)} for ex in held]
    return out


def test_each_rung_on_a_tiny_setting_and_no_choice_depends_on_a_held_out_ticket(tiny):
    """The three rungs run end to end on a tiny base; then the held-out tickets are replaced by other text: every
    search table and every choice stays the same (only the held-out scores may move). A search that looked at a
    held-out ticket would change."""
    net, tok = tiny
    one = cheap.compute_ladder(net, tok, _small_splits(), progress=False, layers=(0, 2))
    other = cheap.compute_ladder(net, tok, _small_splits(lambda ex: "The " + ex["label"] + " fault on unit 7."),
                                 progress=False, layers=(0, 2))
    for name in ("bow", "knn", "probe"):
        r = one["rungs"][name]
        assert r["search"] and r["chosen"] in r["search"]
        assert r["chosen"]["cv_accuracy"] == max(row["cv_accuracy"] for row in r["search"])
        for s in data.HELDOUT_SPLITS:
            assert r[s]["n"] == 12 and 0 <= r[s]["accuracy"] <= 1 and len(r[s]["predictions"]) == 12
        assert r["search"] == other["rungs"][name]["search"] and r["chosen"] == other["rungs"][name]["chosen"]
        assert r["cost"]["kept_mb"] > 0
    assert len(one["rungs"]["knn"]["search"]) == len(cheap.FED) * 2 * len(cheap.POOLINGS) * len(cheap.KS)
    # the probe's chosen features travel with the result: the stored probe predicts the same from them
    ch, feats = one["rungs"]["probe"]["chosen"], cheap.chosen_features(json.loads(json.dumps(one)))
    splits = _small_splits()
    assert {s: f.shape[0] for s, f in feats.items()} == {s: len(v) for s, v in splits.items()}
    refit = cheap.fit_probe(feats["train"], [ex["label"] for ex in splits["train"]], ch["C"])
    for s in data.HELDOUT_SPLITS:
        assert list(refit.predict(feats[s])) == [p["pred"] for p in one["rungs"]["probe"][s]["predictions"]]
    # the replaced tickets name their label: the bag of words now reads them off, so the held-out side did change
    assert other["rungs"]["bow"]["unseen_symptom"]["predictions"] != one["rungs"]["bow"]["unseen_symptom"]["predictions"]


def test_the_store_key_follows_the_code():
    key = cheap.code_key()
    assert set(key) >= {"compute_ladder", "hidden_features", "probe_search", "grid"}
    assert key == cheap.code_key()


# --------------------------------------------------------------------------- the probe's gradient descent (P10)


def _probe_data(seed=0, n=23, h=5, k=4):
    g = torch.Generator().manual_seed(seed)
    classes = ["network", "billing", "software", "access"][:k]
    labels = [classes[i] for i in torch.randint(0, k, (n,), generator=g)]
    return torch.randn(n, h, generator=g), labels, classes


def test_train_probe_is_gradient_descent_on_the_mean_cross_entropy_as_autograd_computes_it():
    x, labels, classes = _probe_data()
    y = torch.tensor([classes.index(lab) for lab in labels])
    W, b = torch.zeros(5, 4, requires_grad=True), torch.zeros(4, requires_grad=True)
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(x @ W + b, y)
        gW, gb = torch.autograd.grad(loss, (W, b))
        with torch.no_grad():
            W -= 0.3 * gW
            b -= 0.3 * gb
    mine = cheap.train_probe(x, labels, classes, 30, 0.3)
    torch.testing.assert_close(mine[0], W.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine[1], b.detach(), rtol=1e-5, atol=1e-6)
    assert mine[0].dtype == mine[1].dtype == torch.float32
    zero = cheap.train_probe(x, labels, classes, 0, 0.3)
    assert not zero[0].any() and not zero[1].any()


def test_train_probe_columns_follow_classes_not_the_labels_order():
    x, labels, classes = _probe_data(1)
    W, b = cheap.train_probe(x, labels, classes, 5, 0.5)
    W2, b2 = cheap.train_probe(x, labels, classes[::-1], 5, 0.5)
    torch.testing.assert_close(W2, W.flip(1))
    torch.testing.assert_close(b2, b.flip(0))
    assert not torch.allclose(W2, W)


@pytest.mark.parametrize("change, match", [
    (lambda x, l, c: (x[:0], l[:0], c), "N >= 1"), (lambda x, l, c: (x, l[:-1], c), "labels"),
    (lambda x, l, c: (x, l, c[:-1]), "not in classes"), (lambda x, l, c: (x, l, c + c[:1]), "repeat"),
    (lambda x, l, c: (x.masked_fill(torch.zeros_like(x, dtype=torch.bool).index_fill(0, torch.tensor([2]), True), float("nan")), l, c), "NaN"),
    (lambda x, l, c: (x[0], l, c), r"\[N, H\]")])
def test_train_probe_refuses_bad_input_with_the_reason(change, match):
    x, labels, classes = _probe_data()
    with pytest.raises(ValueError, match=match):
        cheap.train_probe(*change(x, labels, classes), 3, 0.1)
    with pytest.raises(ValueError, match="steps"):
        cheap.train_probe(x, labels, classes, -1, 0.1)
