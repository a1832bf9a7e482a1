"""coursekit.quantloss: the round trips against the kernels they stand for (bitsandbytes, the NumPy absmax kernels),
the per-ticket losses against the slow full-sequence computation, and the whole comparison against a model really
loaded in NF4 by bitsandbytes, all on a tiny Llama with SmolLM2's tokenizer."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from coursekit import data, model, quant, quantloss as QL, sandbox

EXAMPLES = data.load_split("unseen_phrasing")[:12]


@pytest.fixture(scope="module")
def tok():
    return model.load_tokenizer()


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tok):
    return model.tiny_checkpoint(tmp_path_factory.mktemp("tiny"), vocab_size=len(tok), seed=4)


@pytest.fixture()
def tiny(folder):
    return model.compute_in_float32(model.load_model("bf16", folder))


def slow_losses(net, tok, examples, start):
    """Each example alone, the whole sequence, no cache: Σ −log p(token t | tokens < t) for t ≥ start."""
    out = []
    with torch.no_grad():
        for ex in examples:
            row = data.encode_example(ex, tok)["input_ids"]
            logp = torch.log_softmax(net(input_ids=torch.tensor([row])).logits[0].double(), -1)
            out.append(-sum(logp[t - 1, row[t]].item() for t in range(start, len(row))))
    return np.array(out)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_nf4_and_fp4_round_trips_are_bitsandbytes_decoding_its_own_codes(quant_type):
    import bitsandbytes.functional as bnbF

    W = (torch.randn(96, 128, generator=torch.Generator().manual_seed(1)) * 0.05).to(torch.bfloat16)
    packed, state = bnbF.quantize_4bit(W.float(), blocksize=64, quant_type=quant_type)
    want = bnbF.dequantize_4bit(packed, state)
    got = QL.round_trip(W, quant_type)
    assert got.dtype == torch.float32 and got.shape == W.shape
    assert torch.equal(got, want.reshape(W.shape))


def test_int4_is_blockwise_absmax_with_15_levels_and_bf16_is_the_checkpoint():
    W = (torch.randn(70, 64, generator=torch.Generator().manual_seed(2)) * 0.05).to(torch.bfloat16)
    codes, absmax = quant.absmax_quantize(W.float().numpy(), bits=4, blocksize=64)
    want = quant.absmax_dequantize(codes, absmax, tuple(W.shape), bits=4, blocksize=64)
    got = QL.round_trip(W, "int4")
    assert torch.equal(got, torch.from_numpy(want).float())
    per_block = (got.reshape(-1, 64) / torch.from_numpy(absmax).float()[:, None] * 7)
    assert torch.allclose(per_block, per_block.round(), atol=1e-4) and per_block.abs().max() <= 7 + 1e-4
    assert torch.equal(QL.round_trip(W, "bf16"), W.float())
    with pytest.raises(ValueError, match="data_type must be one of"):
        QL.round_trip(W, "int8")
    with pytest.raises(quant.QuantError):
        QL.round_trip(W.to(torch.int32), "nf4")


@pytest.mark.parametrize("n,blocksize,bits", [(1, 64, 4), (63, 64, 4), (64, 64, 4), (1000, 64, 4), (1000, 7, 8), (130, 32, 8)])
def test_absmax_round_trip_is_the_numpy_kernels_bit_for_bit(n, blocksize, bits):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
    x[: min(n, blocksize)] = 0 if n > blocksize else x[: min(n, blocksize)]      # an all-zero block when there are two
    x[-1] = x[-1].abs() * 2 if n > 1 else x[-1]
    want = quant.absmax_dequantize(*quant.absmax_quantize(x.numpy(), bits=bits, blocksize=blocksize), bits=bits,
                                   blocksize=blocksize)
    got = quant.absmax_round_trip(x, bits=bits, blocksize=blocksize)
    assert got.dtype == torch.float64 and torch.equal(got, torch.from_numpy(want))


def test_absmax_round_trip_refuses_bad_input():
    with pytest.raises(quant.QuantError, match="bits"):
        quant.absmax_round_trip(torch.ones(4), bits=3)
    with pytest.raises(quant.QuantError, match="blocksize"):
        quant.absmax_round_trip(torch.ones(4), blocksize=0)
    with pytest.raises(quant.QuantError, match="NaN or infinite"):
        quant.absmax_round_trip(torch.tensor([1.0, float("nan")]))
    with pytest.raises(quant.QuantError):
        quant.absmax_round_trip(torch.ones(0))


def test_ticket_losses_equal_the_slow_full_sequence_loss(tiny, tok):
    r = QL.ticket_losses(tiny, tok, EXAMPLES, batch_size=5)   # batches of different lengths, the last one short
    P = r["prefix"]
    assert P > 20                                             # the system turn and the instruction are shared
    np.testing.assert_allclose(r["loss"], slow_losses(tiny, tok, EXAMPLES, P), rtol=1e-5)
    rows = [data.encode_example(ex, tok)["input_ids"] for ex in EXAMPLES]
    assert r["tokens"].tolist() == [len(x) - P for x in rows]
    assert r["ids"] == [ex["id"] for ex in EXAMPLES]
    np.testing.assert_allclose(QL.ticket_losses(tiny, tok, EXAMPLES, batch_size=12)["loss"], r["loss"], rtol=1e-5)


def test_one_example_has_no_shared_prefix_and_scores_every_token_after_the_first(tiny, tok):
    r = QL.ticket_losses(tiny, tok, EXAMPLES[:1])
    assert r["prefix"] == 0
    np.testing.assert_allclose(r["loss"], slow_losses(tiny, tok, EXAMPLES[:1], 1), rtol=1e-5)


def test_ticket_losses_refuse_bad_input(tiny, tok):
    with pytest.raises(ValueError, match="no examples"):
        QL.ticket_losses(tiny, tok, [])
    with pytest.raises(ValueError, match="batch_size"):
        QL.ticket_losses(tiny, tok, EXAMPLES, batch_size=0)
    with pytest.raises(ValueError, match="assistant"):
        QL.ticket_losses(tiny, tok, [{"messages": EXAMPLES[0]["messages"][:1]}])


def test_set_base_writes_the_round_trip_into_the_decoder_blocks_only(tiny):
    layers = QL.base_linears(tiny)
    assert len(layers) == 7 * tiny.config.num_hidden_layers
    originals = {n: m.weight.detach().clone() for n, m in layers}
    embed = tiny.model.embed_tokens.weight.detach().clone()
    assert QL.set_base(tiny, originals, "fp4") == len(layers)
    for n, m in layers:
        assert torch.equal(m.weight, QL.round_trip(originals[n], "fp4"))
    assert torch.equal(tiny.model.embed_tokens.weight, embed) and tiny.lm_head.weight is tiny.model.embed_tokens.weight
    with pytest.raises(ValueError, match="originals"):
        QL.set_base(tiny, {}, "nf4")


def test_the_nf4_row_is_the_loss_of_the_model_bitsandbytes_loads_in_nf4(tiny, tok, folder):
    result = QL.compare_data_types(tiny, tok, EXAMPLES, batch_size=6, n_boot=500)
    rows = {r["data_type"]: r for r in result["rows"]}
    assert [r["data_type"] for r in result["rows"]] == list(QL.DATA_TYPES)

    nf4 = model.compute_in_float32(model.load_model("nf4", folder, double_quant=False))
    real = QL.ticket_losses(nf4, tok, EXAMPLES)
    np.testing.assert_allclose(result["losses"]["nf4"], real["loss"], rtol=1e-5)
    assert np.isclose(rows["nf4"]["loss"], real["loss"].sum() / real["tokens"].sum(), rtol=1e-6)

    plain = QL.ticket_losses(tiny, tok, EXAMPLES)             # the base weights are back afterwards
    np.testing.assert_allclose(plain["loss"], result["losses"]["bf16"], rtol=1e-6)
    assert rows["bf16"]["difference"] == 0 and rows["bf16"]["interval"] is None
    for d in ("nf4", "fp4", "int4"):
        r = rows[d]
        assert r["difference"] != 0 and r["interval"][0] <= r["difference"] <= r["interval"][1]
        assert np.isclose(r["difference"], r["loss"] - rows["bf16"]["loss"])
        assert (r["n_examples"], r["n_tokens"]) == (12, int(plain["tokens"].sum()))
        assert r["n_groups"] == len({ex["symptom"] for ex in EXAMPLES})


def test_the_base_is_restored_after_an_error(tiny, tok):
    before = {n: m.weight.detach().clone() for n, m in QL.base_linears(tiny)}
    broken = [dict(EXAMPLES[0]), {"messages": [{"role": "user", "content": "hi"}], "symptom": "x"}]
    with pytest.raises(ValueError):
        QL.compare_data_types(tiny, tok, broken, data_types=("nf4", "bf16"))
    assert all(torch.equal(m.weight, before[n]) for n, m in QL.base_linears(tiny))


def test_compare_data_types_refuses_what_it_cannot_compare(tiny, tok, folder):
    with pytest.raises(ValueError, match="data_types must be among"):
        QL.compare_data_types(tiny, tok, EXAMPLES, data_types=("nf4", "q4_k"))
    with pytest.raises(ValueError, match="reference"):
        QL.compare_data_types(tiny, tok, EXAMPLES, data_types=("nf4", "fp4"))
    with pytest.raises(ValueError, match="to group by"):
        QL.compare_data_types(tiny, tok, [{"messages": ex["messages"]} for ex in EXAMPLES])
    with pytest.raises(ValueError, match="not already in 4 bits"):
        QL.base_linears(model.load_model("nf4", folder))


def test_stored_comparison_computes_once_then_reads_the_same_numbers(folder, tok, tmp_path, monkeypatch):
    from coursekit import capstone

    store = capstone.Store(root=tmp_path, compute=True)
    first = QL.stored_comparison(store, EXAMPLES[:4], folder, batch_size=2, progress=False)
    direct = QL.compare_data_types(model.compute_in_float32(model.load_model("bf16", folder)), tok, EXAMPLES[:4],
                                   batch_size=2)
    assert not first["cached"] and first["rows"] == direct["rows"]
    assert all(np.array_equal(first["losses"][d], direct["losses"][d]) for d in QL.DATA_TYPES)
    tiny_net = model.compute_in_float32(model.load_model("bf16", folder))
    assert first["weight_error"] == QL.weight_errors(tiny_net) and first["n_weights"] == 14 and first["n_layers"] == 2

    def no_load(*a, **k):
        raise AssertionError("a stored result must not load the model")

    monkeypatch.setattr(model, "load_model", no_load)
    again = QL.stored_comparison(capstone.Store(root=tmp_path, compute=False), EXAMPLES[:4], folder, batch_size=2,
                                 progress=False)
    assert again["cached"] and again["rows"] == first["rows"] and again["seconds"] == first["seconds"]
    assert all(np.array_equal(again["losses"][d], first["losses"][d]) for d in QL.DATA_TYPES)
    assert again["tokens"].dtype == np.int64 and np.array_equal(again["tokens"], first["tokens"])
    with pytest.raises(AssertionError, match="must not load"):   # other tickets are another result
        QL.stored_comparison(store, EXAMPLES[:3], folder, batch_size=2, progress=False)
    with pytest.raises(AssertionError, match="must not load"):   # fresh=True computes again
        QL.stored_comparison(capstone.Store(root=tmp_path, compute=True, fresh=True), EXAMPLES[:4], folder,
                             batch_size=2, progress=False)


def test_a_store_that_may_not_compute_still_gives_the_result_and_keeps_nothing(folder, tmp_path):
    from coursekit import capstone

    out = QL.stored_comparison(capstone.Store(root=tmp_path, compute=False), EXAMPLES[:2], folder,
                               data_types=("bf16", "nf4"), progress=False)
    assert not out["cached"] and [r["data_type"] for r in out["rows"]] == ["bf16", "nf4"]
    assert not list(tmp_path.rglob("result.json"))


def test_weight_errors_pool_the_layers_and_stored_comparison_refuses_no_tickets(tiny, tmp_path):
    from coursekit import capstone

    layers = QL.base_linears(tiny)
    num = sum((QL.round_trip(m.weight, "int4") - m.weight).double().square().sum().item() for _, m in layers)
    den = sum(m.weight.double().square().sum().item() for _, m in layers)
    assert QL.weight_errors(tiny, ["int4"]) == pytest.approx({"int4": (num / den) ** 0.5}, rel=1e-12)
    with pytest.raises(ValueError, match="no examples"):
        QL.stored_comparison(capstone.Store(root=tmp_path, compute=True), [], progress=False)


@pytest.mark.skipif(sandbox.problem() is not None and os.environ.get("CI") != "true",
                    reason=f"no sandbox here: {sandbox.problem()}")
def test_in_the_grading_sandbox_a_missing_result_is_computed_and_not_kept(folder, tmp_path):
    """Graded lesson 15 runs in the sandbox, where the store is a read-only mount (as root too): the comparison is
    computed there, nothing is written, and no lock is taken."""
    store_root = tmp_path / "store"
    store_root.mkdir()
    sandbox.readable_by_sandbox(tmp_path)
    sandbox.readable_by_sandbox(folder)
    src = (f"from pathlib import Path\nfrom coursekit import capstone, data, quantloss as QL\n"
           f"out = QL.stored_comparison(capstone.Store(root=Path({str(store_root)!r}), compute=False), "
           f"data.load_split('unseen_phrasing')[:2], {str(folder)!r}, data_types=('bf16', 'nf4'), progress=False)\n"
           f"print('ROWS', [r['data_type'] for r in out['rows']], out['cached'])\n")
    r = subprocess.run(sandbox.command([sys.executable, "-c", src], sandbox.Spec(readable=[tmp_path, folder])),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ROWS ['bf16', 'nf4'] False" in r.stdout
    assert not list(store_root.rglob("*"))


def test_the_grader_fills_the_store_with_exactly_the_comparison_lesson_15_asks_for():
    """`coursekit grade` computes lesson 15's comparison once before grading it (course._fill_quantloss_store), so
    the lesson's cell must ask for that one: the first LESSON_TICKETS tickets of unseen_phrasing, as one batch,
    with the default data types, blocksize and checkpoint. Otherwise every graded notebook computes its own."""
    import inspect
    import json
    from pathlib import Path

    from coursekit import course

    nb = json.loads(next(Path(__file__).parents[1].glob("solutions/15-*/15-*.ipynb")).read_text())
    src = "".join(next("".join(c["source"]) for c in nb["cells"] if "stored_comparison(" in "".join(c["source"])))
    assert f"N_TICKETS = {QL.LESSON_TICKETS}\n" in src
    assert 'held_out = cdata.load_split("unseen_phrasing")[:N_TICKETS]' in src
    assert "quantloss.stored_comparison(capstone.Store(), held_out, batch_size=N_TICKETS)" in src
    fill = inspect.getsource(course._fill_quantloss_store)
    assert 'data.load_split("unseen_phrasing")[:n], batch_size=n,' in fill
    assert next(Path(__file__).parents[1].glob("solutions/15-*")).name == course.QUANTLOSS
