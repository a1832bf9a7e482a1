"""coursekit.artifacts: adapter export bound to its base, and a checkpoint whose resume is bitwise identical."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coursekit import artifacts

peft = pytest.importorskip("peft")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

LCFG = dict(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["fc1", "fc2"])


# --------------------------------------------------------------------------- the tiny setup


def test_tinynet_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    a, b, c = artifacts.TinyNet(seed=0), artifacts.TinyNet(seed=0), artifacts.TinyNet(seed=1)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.fc1.weight, c.fc1.weight)
    assert a.fc1.weight.shape == (16, 8) and a.fc2.weight.shape == (4, 16)


@pytest.mark.parametrize("kw, name", [({"d_in": 0}, "d_in"), ({"hidden": 2.5}, "hidden"), ({"p_drop": 1.0}, "p_drop")])
def test_tinynet_rejects_bad_sizes(kw, name):
    with pytest.raises(ValueError, match=name):
        artifacts.TinyNet(**kw)


def test_dropout_makes_training_forwards_random_and_eval_deterministic():
    net, x = artifacts.TinyNet(p_drop=0.5), torch.randn(8, 8)
    assert not torch.equal(net(x), net(x))
    net.eval()
    assert torch.equal(net(x), net(x))


def test_tiny_data_shapes_and_errors():
    X, y = artifacts.tiny_data(10, 3, 5, seed=2)
    assert X.shape == (10, 3) and y.shape == (10,) and y.dtype == torch.int64 and int(y.max()) < 5
    X2, y2 = artifacts.tiny_data(10, 3, 5, seed=2)
    assert torch.equal(X, X2) and torch.equal(y, y2)
    with pytest.raises(ValueError, match="n must"):
        artifacts.tiny_data(0)


def test_sampler_covers_each_row_once_per_epoch_and_resumes():
    s = artifacts.ShuffledBatches(12, 4, seed=5)
    epoch0 = torch.cat([next(s) for _ in range(3)])
    assert sorted(epoch0.tolist()) == list(range(12))
    first_of_epoch1 = next(s)
    assert s.state_dict()["epoch"] == 1 and s.state_dict()["position"] == 4
    state = s.state_dict()
    ahead = [next(s) for _ in range(4)]
    t = artifacts.ShuffledBatches(12, 4, seed=5)
    t.load_state_dict(state)
    assert all(torch.equal(a, next(t)) for a in ahead)
    assert not torch.equal(first_of_epoch1, epoch0[:4])  # each epoch draws its own order


def test_sampler_errors():
    with pytest.raises(ValueError, match="batch_size"):
        artifacts.ShuffledBatches(4, 5)
    with pytest.raises(ValueError, match="n must"):
        artifacts.ShuffledBatches(0, 1)
    with pytest.raises(ValueError, match="batch_size=3"):
        artifacts.ShuffledBatches(12, 4).load_state_dict(artifacts.ShuffledBatches(12, 3).state_dict())


# --------------------------------------------------------------------------- fingerprint and export


def _peft(seed=0, **kw):
    torch.manual_seed(seed)
    return get_peft_model(artifacts.TinyNet(seed=seed, **kw), LoraConfig(**LCFG))


def test_base_parameters_undo_peft_renaming():
    bare = artifacts.TinyNet(seed=0)
    wrapped = _peft(0)
    assert sorted(artifacts.base_parameters(bare)) == sorted(artifacts.base_parameters(wrapped)) == \
        ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert artifacts.base_fingerprint(bare) == artifacts.base_fingerprint(wrapped)


def test_fingerprint_separates_structure_and_values():
    a, b = artifacts.base_fingerprint(artifacts.TinyNet(seed=0)), artifacts.base_fingerprint(artifacts.TinyNet(seed=1))
    c = artifacts.base_fingerprint(artifacts.TinyNet(hidden=12))
    d = artifacts.base_fingerprint(artifacts.TinyNet(seed=0).double())
    assert a["structure"] == b["structure"] and a["values"] != b["values"]
    assert a["structure"] != c["structure"] and a["structure"] != d["structure"]
    assert a["shapes"]["fc1.weight"] == [16, 8]
    with pytest.raises(ValueError, match="no base parameters"):
        artifacts.base_fingerprint(torch.nn.Module())


def test_export_and_checked_reload_are_exact(tmp_path):
    m = _peft(0)
    X, y = artifacts.tiny_data()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        F.cross_entropy(m(X), y).backward()
        opt.step()
        opt.zero_grad()
    folder = artifacts.export_adapter(m, tmp_path / "ad")
    assert {p.name for p in folder.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors", artifacts.FINGERPRINT_FILE}
    m.eval()
    with torch.no_grad():
        want = m(X)
        got = artifacts.load_adapter_checked(artifacts.TinyNet(seed=0), folder)(X)
    assert torch.equal(got, want)
    assert json.loads((folder / artifacts.FINGERPRINT_FILE).read_text())["values"] == artifacts.base_fingerprint(m)["values"]


@pytest.mark.filterwarnings("ignore::coursekit.artifacts.UntrainedAdapterWarning")
def test_checked_reload_refuses_other_bases_with_clear_messages(tmp_path):
    folder = artifacts.export_adapter(_peft(0), tmp_path / "ad")
    with pytest.raises(ValueError, match="same shapes but other weights"):
        artifacts.load_adapter_checked(artifacts.TinyNet(seed=1), folder)
    with pytest.raises(ValueError, match=r"fc1\.\w+ has shape \(16.*\) in the saved base and \(12.*\) here"):
        artifacts.load_adapter_checked(artifacts.TinyNet(hidden=12), folder)
    with pytest.raises(ValueError, match="adapter_config.json is missing"):
        artifacts.load_adapter_checked(artifacts.TinyNet(), tmp_path)
    # PEFT alone accepts the same-shaped other base: that is what the fingerprint is for.
    assert isinstance(PeftModel.from_pretrained(artifacts.TinyNet(seed=1), str(folder)), PeftModel)


def test_an_untrained_adapter_warns_on_export_and_on_reload_and_a_trained_one_does_not(tmp_path):
    """B = 0 reproduces the base exactly, so every later check passes on it: the silent path must make a noise."""
    import warnings

    with pytest.warns(artifacts.UntrainedAdapterWarning, match="Likely cause: it was saved before any training step"):
        folder = artifacts.export_adapter(_peft(0), tmp_path / "fresh")
    with pytest.warns(artifacts.UntrainedAdapterWarning, match="all zero"):
        artifacts.load_adapter_checked(artifacts.TinyNet(seed=0), folder)
    trained = _peft(0)
    with torch.no_grad():
        next(p for n, p in trained.named_parameters() if "lora_B" in n).add_(0.1)  # one nonzero lora_B is enough
    with warnings.catch_warnings():
        warnings.simplefilter("error", artifacts.UntrainedAdapterWarning)
        artifacts.load_adapter_checked(artifacts.TinyNet(seed=0), artifacts.export_adapter(trained, tmp_path / "ok"))
    assert artifacts.zero_lora_B(trained) == (len([n for n, _ in trained.named_parameters() if "lora_B" in n]) - 1,
                                              len([n for n, _ in trained.named_parameters() if "lora_B" in n]))


def test_export_needs_a_peft_model(tmp_path):
    with pytest.raises(TypeError, match="PeftModel"):
        artifacts.export_adapter(artifacts.TinyNet(), tmp_path)


# --------------------------------------------------------------------------- RNG states


def _draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_rng_state_round_trip_and_parts():
    state = artifacts.rng_state()
    first = _draws()
    artifacts.set_rng_state(state)
    assert _draws() == first
    artifacts.set_rng_state(state, ("torch",))
    t, n, p = _draws()
    assert t == first[0] and n != first[1] and p != first[2]
    with pytest.raises(ValueError, match="unknown RNG part"):
        artifacts.set_rng_state(state, ("cuda",))
    with pytest.raises(ValueError, match="lacks"):
        artifacts.set_rng_state({"torch": state["torch"]})


# --------------------------------------------------------------------------- checkpoints


def _build():
    m = get_peft_model(artifacts.TinyNet(seed=0), LoraConfig(**LCFG))
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=8)
    return m, opt, sched, artifacts.ShuffledBatches(64, 8, seed=0)


def _steps(m, opt, sched, smp, n, X, y):
    m.train()
    out = []
    for _ in range(n):
        idx = next(smp)
        loss = F.cross_entropy(m(X[idx]), y[idx])
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        out.append((loss.item(), torch.cat([p.detach().flatten() for p in m.parameters() if p.requires_grad]).clone()))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    X, y = artifacts.tiny_data()
    path = tmp_path_factory.mktemp("ck") / "step4.pt"
    torch.manual_seed(0)
    m, opt, sched, smp = _build()
    _steps(m, opt, sched, smp, 4, X, y)
    artifacts.save_checkpoint(path, m, opt, sched, 4, smp.state_dict())
    return path, _steps(m, opt, sched, smp, 4, X, y), X, y


def _resume(run, **kw):
    path, _, X, y = run
    torch.manual_seed(99)
    m, opt, sched, smp = _build()
    st = artifacts.load_checkpoint(path, m, None if kw.get("no_opt") else opt, sched, restore_rng=not kw.get("no_rng"))
    smp.load_state_dict(st["data_state"])
    assert st["step"] == 4
    return _steps(m, opt, sched, smp, 4, X, y)


def _same(a, b):
    return all(la == lb and torch.equal(pa, pb) for (la, pa), (lb, pb) in zip(a, b))


def test_resume_is_bitwise_identical(run):
    assert _same(_resume(run), run[1])


def test_resume_without_rng_or_moments_diverges(run):
    no_rng, no_opt = _resume(run, no_rng=True), _resume(run, no_opt=True)
    assert not _same(no_rng, run[1]) and no_rng[0][0] != run[1][0][0]
    assert not _same(no_opt, run[1]) and no_opt[0][0] == run[1][0][0] and not torch.equal(no_opt[0][1], run[1][0][1])


def test_checkpoint_holds_every_part(run):
    ck = torch.load(run[0], weights_only=True)
    assert {"params", "optimizer", "scheduler", "rng", "step", "data_state", "base"} <= set(ck)
    assert set(ck["optimizer"]["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert all("lora_" in n for n in ck["params"])


def test_load_checkpoint_errors(run, tmp_path):
    path = run[0]
    with pytest.raises(FileNotFoundError):
        artifacts.load_checkpoint(tmp_path / "none.pt", _build()[0])
    with pytest.raises(ValueError, match="same shapes but other weights"):
        artifacts.load_checkpoint(path, get_peft_model(artifacts.TinyNet(seed=1), LoraConfig(**LCFG)))
    with pytest.raises(ValueError, match="do not match the checkpoint"):
        artifacts.load_checkpoint(path, get_peft_model(artifacts.TinyNet(seed=0), LoraConfig(**{**LCFG, "target_modules": ["fc1"]})))
    with pytest.raises(ValueError, match=r"has shape \(2, 8\) in the model and \(4, 8\)"):
        artifacts.load_checkpoint(path, get_peft_model(artifacts.TinyNet(seed=0), LoraConfig(**{**LCFG, "r": 2})))


def test_save_checkpoint_errors(tmp_path):
    m, opt, sched, _ = _build()
    with pytest.raises(ValueError, match="step must be"):
        artifacts.save_checkpoint(tmp_path / "x.pt", m, opt, sched, -1, {})
    bare = artifacts.TinyNet()
    bare.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        artifacts.save_checkpoint(tmp_path / "x.pt", bare, opt, None, 0, {})
