"""Lesson 12 ("Adapters as artifacts"): graded items score right answers fully, typical wrong answers less, with
the diagnostics a student needs; the notebook's test cells agree with the item registry."""

import json
from pathlib import Path

import pytest
import torch

from coursekit import artifacts
from coursekit.grading import check
from coursekit.grading.lessons import lesson12
from coursekit.grading.lessons.lesson12 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "12-adapters-as-artifacts" / "12-adapters-as-artifacts.ipynb"


def _attached(base, run_dir):
    """An adapter built from the run folder's settings on ``base`` (fresh: lora_B = 0, training mode)."""
    from peft import LoraConfig, get_peft_model

    settings = json.loads((Path(run_dir) / "lora_config.json").read_text())
    return get_peft_model(base, LoraConfig(**settings))


def right_reload(base, run_dir):
    model = _attached(base, run_dir)
    artifacts.load_checkpoint(Path(run_dir) / "checkpoint.pt", model, restore_rng=False)
    return model.eval()


def rng_moving_reload(base, run_dir):
    # load_checkpoint's default restore_rng=True: the same logits (the grader puts the RNG back around the call)
    model = _attached(base, run_dir)
    artifacts.load_checkpoint(Path(run_dir) / "checkpoint.pt", model)
    return model.eval()


def fresh_adapter(base, run_dir):
    return _attached(base, run_dir).eval()


def fresh_adapter_train_mode(base, run_dir):
    return _attached(base, run_dir)


def trainable_reload(base, run_dir):
    model = _attached(base, run_dir)
    artifacts.load_checkpoint(Path(run_dir) / "checkpoint.pt", model, restore_rng=False)
    return model                                          # no eval(): dropout on


def merged_reload(base, run_dir):
    return right_reload(base, run_dir).merge_and_unload()


def export_reload(base, run_dir):
    # the one-liner of 'Reloading', on a folder that holds no export
    from peft import PeftModel

    return PeftModel.from_pretrained(base, run_dir).eval()


def own_base(base, run_dir):
    # Ignores the base it is given and builds the lesson's own: right for the first public case only.
    return right_reload(artifacts.TinyNet(seed=0), run_dir)


RIGHT = {"w1": "d", "w2": "c", "w3": "b", "p1": "a", "p2": 1e-2, "p3": right_reload,
         "p4": ["base", "attach", "optimizer", "load", "preflight", "rng", "step"], "p5": {"b", "c", "d"}, "p6": "c"}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def test_notebook_writes_only_to_a_temporary_folder():
    text = NOTEBOOK.read_text()
    assert "tempfile.mkdtemp" in text
    assert not list((ROOT / "solutions" / "12-adapters-as-artifacts").glob("*.pt"))


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("item_id", sorted(set(RIGHT) - {"p3"}))
def test_right_answers_score_full(item_id):
    for hidden in (False, True):
        fb = check(f"12.{item_id}", RIGHT[item_id], hidden=hidden)
        assert fb.full, fb.text()


def test_reload_right_answer_scores_full_with_hidden_cases_and_leaves_rng_alone():
    torch.manual_seed(7)
    before = torch.get_rng_state()
    fb = check("12.p3", right_reload, hidden=True)
    assert fb.full, fb.text()
    assert fb.text().count("hidden case") == 3 and "bit for bit" in fb.text()
    assert torch.equal(torch.get_rng_state(), before)  # grading does not move the student's RNG


def _exported_adapter(tmp_path: Path):
    """A LoRA adapter (r = 4 on fc1 and fc2) on TinyNet(seed=0), with lora_B drawn from N(0, 1) after torch.manual_seed(0)
    so that it changes the logits (B = 0 would only warn), and the folder artifacts.export_adapter wrote it to."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(artifacts.TinyNet(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=["fc1", "fc2"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()
    return model, artifacts.export_adapter(model, tmp_path / "adapter")


def _lesson_run(p_drop=0.1, lora_dropout=0.1):
    """The lesson's setup (TinyNet(seed=0), r = 4 adapter on fc1 and fc2, AdamW at lr 1e-2, LinearLR over 12 steps,
    ShuffledBatches of 8 over 64 rows): (X, y, build)."""
    from peft import LoraConfig, get_peft_model

    X, y = artifacts.tiny_data(n=64, d_in=8, n_classes=4, seed=0)

    def build():
        model = get_peft_model(artifacts.TinyNet(seed=0, p_drop=p_drop),
                               LoraConfig(r=4, lora_alpha=8, lora_dropout=lora_dropout, target_modules=["fc1", "fc2"]))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=12)
        return model, opt, sched, artifacts.ShuffledBatches(len(X), batch_size=8, seed=0)

    return X, y, build


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_p2s_key_is_the_rate_the_resumed_optimizer_holds_without_its_state(tmp_path):
    """P2's key measured: the lesson's run, a checkpoint after step 6, then the table's "no optimizer moments" resume
    (fresh AdamW and LinearLR, load_checkpoint with optimizer=None: the scheduler's state restored). The rate AdamW
    applies at step k + 1 is in its param_groups: the fresh optimizer's 1e-2. The named mistakes are the rates the
    uninterrupted run applied at step k + 1 (the schedule's) and at step k."""
    from test_artifacts import _steps

    X, y, build = _lesson_run()
    torch.manual_seed(0)
    model, opt, sched, sampler = build()
    applied = []                                       # the lr each step of the uninterrupted run applies
    for _ in range(6):
        applied.append(opt.param_groups[0]["lr"])
        _steps(model, opt, sched, sampler, 1, X, y)
    path = artifacts.save_checkpoint(tmp_path / "step6.pt", model, opt, sched, step=6, data_state=sampler.state_dict())
    applied.append(opt.param_groups[0]["lr"])         # step k + 1 = 7, uninterrupted

    torch.manual_seed(12345)
    m, o, s, smp = build()
    state = artifacts.load_checkpoint(path, m, None, s)
    smp.load_state_dict(state["data_state"])
    assert s.last_epoch == 6                           # the scheduler's counter did come back
    measured = o.param_groups[0]["lr"]
    before = torch.cat([p.detach().flatten() for p in m.parameters() if p.requires_grad]).clone()
    _steps(m, o, s, smp, 1, X, y)
    after = torch.cat([p.detach().flatten() for p in m.parameters() if p.requires_grad])
    step = (after - before).abs().max().item()
    assert 0.99 * measured < step < 1.02 * measured    # AdamW's first step moves the largest entry by about that lr
    assert measured == ITEMS["p2"].expected() == RIGHT["p2"]
    mistakes = {m_.label: m_.value for m_ in ITEMS["p2"].mistakes()}
    assert mistakes == {"scheduler's lr": pytest.approx(applied[6], rel=1e-12),
                        "step k's lr": pytest.approx(applied[5], rel=1e-12)}
    assert applied[6] != measured and applied[5] != measured


def test_p1s_key_is_what_load_adapter_checked_does_with_a_bfloat16_round_trip(tmp_path):
    """P1's key measured: an adapter exported from TinyNet(seed=0), as in the lesson, and load_adapter_checked on the same
    base rounded to bfloat16 and back to float32. The structure (names, shapes, dtypes) is the trained base's again
    (not b), but the rounding changed the bytes, so it refuses (not c) as for other weights (a); no model on those
    weights could give the trained logits bit for bit (not d)."""
    import json

    from coursekit import artifacts

    _, folder = _exported_adapter(tmp_path)
    round_trip = artifacts.TinyNet(seed=0).to(torch.bfloat16).to(torch.float32)
    try:
        artifacts.load_adapter_checked(round_trip, folder)
        measured = "c"
    except ValueError as e:
        measured = "b" if "another architecture" in str(e) else (
            "a" if "same shapes but other weights" in str(e) else None)
    fp32 = artifacts.TinyNet(seed=0)
    assert artifacts.base_fingerprint(round_trip)["structure"] == artifacts.base_fingerprint(fp32)["structure"]
    assert any(not torch.equal(p, q) for p, q in zip(round_trip.parameters(), fp32.parameters()))   # d: rounded
    artifacts.load_adapter_checked(artifacts.TinyNet(seed=0), folder)                                # its own base loads
    keys = json.loads((ROOT / "autograder" / "keys" / "12.json").read_text())["keys"]
    assert measured == keys["p1"] == RIGHT["p1"]


def test_p6s_key_is_measured_by_attaching_the_adapter_to_its_merged_model(tmp_path):
    """P6's key measured: an adapter exported from TinyNet(seed=0), merged with merge_and_unload(), then attached again
    with PeftModel.from_pretrained. It loads (not d); its eval-mode logits are those of weights W + 2sAB (c), not the
    adapter's own (a) nor the base's (b). The hint of d says load_adapter_checked would refuse it: checked too."""
    import json

    from peft import PeftModel

    from coursekit import artifacts

    _, folder = _exported_adapter(tmp_path)
    X, _ = artifacts.tiny_data(n=64, d_in=8, n_classes=4, seed=0)
    once = PeftModel.from_pretrained(artifacts.TinyNet(seed=0), folder).eval()
    deltas = {name.split(".")[-1]: mod.get_delta_weight("default").detach().clone()
              for name, mod in once.named_modules() if hasattr(mod, "get_delta_weight")}
    with torch.no_grad():
        adapter_logits = once(X)
        base_logits = artifacts.TinyNet(seed=0).eval()(X)
        doubled = artifacts.TinyNet(seed=0).eval()
        for layer, delta in deltas.items():
            getattr(doubled, layer).weight += 2 * delta          # W + 2sAB
        doubled_logits = doubled(X)
    merged = PeftModel.from_pretrained(artifacts.TinyNet(seed=0), folder).merge_and_unload()
    try:
        twice = PeftModel.from_pretrained(merged, folder).eval()
    except Exception:
        measured = "d"
    else:
        with torch.no_grad():
            logits = twice(X)
        matches = [letter for letter, ref in (("a", adapter_logits), ("b", base_logits), ("c", doubled_logits))
                   if torch.allclose(logits, ref, rtol=1e-5, atol=1e-4)]
        assert len(matches) == 1, matches
        measured = matches[0]
    assert sorted(deltas) == ["fc1", "fc2"] and not torch.allclose(adapter_logits, doubled_logits, atol=1e-3)
    with pytest.raises(ValueError, match="same shapes but other weights"):      # d's hint: the course's check refuses
        artifacts.load_adapter_checked(PeftModel.from_pretrained(artifacts.TinyNet(seed=0), folder).merge_and_unload(),
                                       folder)
    keys = json.loads((ROOT / "autograder" / "keys" / "12.json").read_text())["keys"]
    assert measured == keys["p6"] == RIGHT["p6"]


# --------------------------------------------------------------------------- wrong answers


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "B alone means nothing"),
        ("w1", "c", "Optimizer moments are for resuming"),
        ("w1", "b", "merged model"),
        ("w2", "a", "at every training forward"),
        ("w2", "d", "Resumed steps are training steps"),
        ("w3", "a", "copies the saved factors"),
        ("w3", "c", "dropout makes two calls differ"),
        ("w3", "d", "still there"),
        ("p1", "c", "compares the values fingerprint"),
        ("p1", "b", "not the dtypes it passed through"),
        ("p1", "d", "It does not load: the values fingerprint"),
        ("p6", "a", "PEFT cannot tell"),
        ("p6", "b", "it subtracts nothing"),
        ("p6", "d", "it loads silently"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"12.{item_id}", answer)
    assert fb.points == 0 and text in fb.text()
    assert "Reread" in fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("p2", 0.0055, "Restoring the scheduler brings back its counter"),
        ("p2", 0.00625, "the learning rate of step k"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"12.{item_id}", answer)
    assert fb.points == 0 and text in fb.text()


def test_multi_and_ordering_partial_credit():
    fb = check("12.p5", {"b", "c", "d", "e"})
    assert 0 < fb.points < 2 and "Python's random" in fb.text()
    fb = check("12.p5", {"a", "b", "c", "d"})
    assert 0 < fb.points < 2 and "Not without dropout" in fb.text()
    fb = check("12.p5", {"b", "c"})
    assert 0 < fb.points < 2 and "missing" in fb.text()
    fb = check("12.p4", ["base", "optimizer", "attach", "load", "preflight", "rng", "step"])   # cannot run: partial
    assert 0 < fb.points < 2 and "position 2: 'optimizer'" in fb.text() and "all or nothing" not in fb.text()
    fb = check("12.p4", ["rng", "base", "attach", "optimizer", "load", "preflight", "step"])   # runs, not bitwise: 0
    assert fb.points == 0 and "position 1: 'rng'" in fb.text()
    assert "every right order puts it after 'preflight'" in fb.text()


def test_fresh_adapter_is_named():
    fb = check("12.p3", fresh_adapter, hidden=False)
    assert fb.points == 0
    assert "your outputs equal the base model's: you created a fresh adapter (B = 0) instead of loading the saved one" in fb.text()
    assert "the same mistake as public case 1" in fb.text()


def test_fresh_adapter_in_train_mode_names_both_mistakes():
    fb = check("12.p3", fresh_adapter_train_mode, hidden=False)
    assert fb.points == 0 and "fresh adapter (B = 0)" in fb.text() and "dropout is still active" in fb.text()


def test_training_mode_reload_is_named():
    fb = check("12.p3", trainable_reload, hidden=False)
    assert fb.points == 0 and "dropout is still active" in fb.text() and "get_peft_model leaves it so" in fb.text()


def test_p3_needs_more_than_the_export_reload_and_takes_a_checkpoint_reload_that_moves_the_rng():
    """The run folder holds no export: PeftModel.from_pretrained, the reload of 'Reloading', fails on it with a sentence
    that says what the folder holds. load_checkpoint with its default restore_rng=True gives the same logits (full
    points), and the grader leaves the caller's RNG where it was."""
    fb = check("12.p3", export_reload, hidden=False)
    assert fb.points == 0 and "holds no adapter export" in fb.text() and "checkpoint.pt" in fb.text(), fb.text()
    torch.manual_seed(3)
    before = torch.get_rng_state()
    assert check("12.p3", rng_moving_reload, hidden=False).full
    assert torch.equal(torch.get_rng_state(), before)


def test_merged_reload_is_named():
    fb = check("12.p3", merged_reload, hidden=False)
    assert fb.points == 0 and "not bitwise equal" in fb.text() and "Merging is not saving" in fb.text()


@pytest.mark.parametrize("fn, labels", [("fresh_adapter", ["fresh adapter"]),
                                        ("fresh_adapter_train_mode", ["fresh adapter", "dropout active"]),
                                        ("trainable_reload", ["dropout active"]), ("merged_reload", ["merged or cast"])])
def test_the_mistakes_are_stored_by_name_for_the_class_report(fn, labels):
    assert check("12.p3", globals()[fn], hidden=False).mistakes == labels


def test_logits_of_another_dtype_are_named_not_a_grader_error():
    """A model whose logits come back in float64 (equal after a cast) fails with a sentence; comparing float64 with
    float32 logits raised in the check before, which scored the item 0 with no feedback."""
    def reload_cast(base, run_dir):
        m = right_reload(base, run_dir)
        return lambda X: m(X).double()

    fb = check("12.p3", reload_cast, hidden=False)
    assert fb.points == 0 and "the logits are float64; the trained model's are float32" in fb.text(), fb.text()


def test_hidden_cases_defeat_an_answer_that_ignores_its_arguments():
    fb = check("12.p3", own_base, hidden=True)
    assert fb.points == pytest.approx(3 / 5) and "✓ public case 1" in fb.text() and "✗ public case 2" in fb.text()


@pytest.mark.parametrize("bad, text", [(None, "should be a function"), (lambda base, run_dir: None, "returned None"),
                                       (lambda base: base, "could not be called")])
def test_reload_bad_answers(bad, text):
    fb = check("12.p3", bad, hidden=False)
    assert fb.points == 0 and text in fb.text()


def test_stub_reports_not_implemented():
    def stub(base, run_dir):
        raise NotImplementedError()

    fb = check("12.p3", stub, hidden=False)
    assert fb.points == 0 and "NotImplementedError" in fb.text()


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_p4s_right_orders_are_measured_by_resuming_in_every_executable_order(tmp_path):
    """P4's key and its scoring measured: the lesson's run with dropout, a checkpoint after step 6, then a resume that
    also runs train.preflight (with the optimizer, on the fixed batch X[:8]), its seven steps executed in every order
    that runs as a resume (the base before the adapter, the adapter before the optimizer, the optimizer before the
    load, the preflight and step k + 1; the RNG restore anywhere), the resumed run's remaining steps after the last
    of them. The orders whose six resumed steps equal the uninterrupted run's bit for bit are exactly the key's order
    and its "also" orders: the restore must follow the adapter's initialisation and the preflight's training-mode
    forwards, both of which draw from the torch RNG, and step k + 1 must follow everything. Every other order among
    them silently resumes another run, and scores 0: the key's "critical" entries (rng, step, and the pair
    [preflight, attach]). And of all 5,040 orders, each that keeps part of the points fails at once with an error (a
    step that needs an object not built yet, or the preflight or the load refusing an optimizer built before the
    adapter): none of them resumes another run without a word. Without the pair [preflight, attach], two orders
    would (the optimizer built over the base before the adapter is attached, the preflight run on the bare base):
    they train nothing. The preflight's other relations are not critical: an order that runs it before the optimizer
    it is given fails at once, and keeps its share of pairs, like any other order that fails loudly."""
    import itertools

    import torch.nn.functional as F

    from test_artifacts import _steps

    from coursekit import train

    X, y, _ = _lesson_run()
    config = dict(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["fc1", "fc2"])

    def fresh():
        from peft import LoraConfig, get_peft_model

        base = artifacts.TinyNet(seed=0)
        model = get_peft_model(base, LoraConfig(**config))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=12)
        return model, opt, sched

    torch.manual_seed(0)
    model, opt, sched = fresh()
    sampler = artifacts.ShuffledBatches(len(X), batch_size=8, seed=0)
    _steps(model, opt, sched, sampler, 6, X, y)
    path = artifacts.save_checkpoint(tmp_path / "step6.pt", model, opt, sched, step=6, data_state=sampler.state_dict())
    reference = _steps(model, opt, sched, sampler, 6, X, y)
    saved_rng = torch.load(path, weights_only=True)["rng"]

    def resume(order):
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(12345)                       # a new process
        s = {"sampler": artifacts.ShuffledBatches(len(X), batch_size=8, seed=0)}
        run = []
        for label in order:
            if label == "base":
                s["model"] = artifacts.TinyNet(seed=0)
            elif label == "attach":
                s["model"] = get_peft_model(s["model"], LoraConfig(**config))
            elif label == "optimizer":
                s["opt"] = torch.optim.AdamW([p for p in s["model"].parameters() if p.requires_grad], lr=1e-2)
                s["sched"] = torch.optim.lr_scheduler.LinearLR(s["opt"], start_factor=1.0, end_factor=0.1, total_iters=12)
            elif label == "load":
                state = artifacts.load_checkpoint(path, s["model"], s["opt"], s["sched"], restore_rng=False)
                s["sampler"].load_state_dict(state["data_state"])
            elif label == "preflight":
                train.preflight(s["model"], (X[:8], y[:8]), loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                                optimizer=s["opt"])
            elif label == "rng":
                artifacts.set_rng_state(saved_rng)
            else:
                run += _steps(s["model"], s["opt"], s["sched"], s["sampler"], 1, X, y)      # step k + 1
        return run + _steps(s["model"], s["opt"], s["sched"], s["sampler"], 5, X, y)        # steps k + 2 to k + 6

    def executable(order):
        at = {label: i for i, label in enumerate(order)}
        return at["base"] < at["attach"] < at["optimizer"] < min(at["load"], at["preflight"], at["step"])

    labels = sorted(ITEMS["p4"].labels)
    orders = [list(o) for o in itertools.permutations(labels) if executable(o)]
    assert len(orders) == 42                           # six orders of load, preflight and step, seven places for the restore
    exact = []
    for order in orders:
        run = resume(order)
        if all(l1 == l2 and torch.equal(p1, p2) for (l1, p1), (l2, p2) in zip(run, reference)):
            exact.append(order)
    keys = json.loads((ROOT / "autograder" / "keys" / "12.json").read_text())["keys"]["p4"]
    assert sorted(exact) == sorted([keys["order"], *keys["also"]])
    assert keys["order"] == RIGHT["p4"] and keys["critical"] == ["rng", "step", ["preflight", "attach"]]
    for order in exact:
        assert check("12.p4", order).full, order
    for order in orders:                               # runs, but resumes another run: nothing
        if order not in exact:
            fb = check("12.p4", order)
            assert fb.points == 0 and "all or nothing" in fb.text(), order
    # The RNG restored right after the load, before the preflight: one pair of 21 out of place, and no points.
    assert check("12.p4", ["base", "attach", "optimizer", "load", "rng", "preflight", "step"]).points == 0
    # Every order that keeps part of the points fails at once; it never resumes another run.
    kept = [list(o) for o in itertools.permutations(labels) if 0 < check("12.p4", list(o)).points < 2]
    assert len(kept) == 69 and not any(executable(o) for o in kept)
    for order in kept:
        with pytest.raises((KeyError, train.PreflightError, ValueError)):
            resume(order)
    assert check("12.p4", ["base", "optimizer", "attach", "load", "preflight", "rng", "step"]).points == pytest.approx(
        2 * 20 / 21 * 0.999)                           # the preflight catches the optimizer built before the adapter
    silent = ["base", "optimizer", "preflight", "attach", "load", "rng", "step"]   # it cannot catch it on the bare base
    run = resume(silent)
    assert not all(l1 == l2 and torch.equal(p1, p2) for (l1, p1), (l2, p2) in zip(run, reference))
    assert check("12.p4", silent).points == 0 and "puts it after 'attach'" in check("12.p4", silent).text()


def test_p5s_key_is_measured_by_resuming_a_run_without_dropout(tmp_path):
    """P5's key ({b, c, d}), measured: the lesson's run (AdamW, LinearLR, ShuffledBatches, a checkpoint after step 6 of 12)
    with no dropout anywhere, resumed once with everything and once without each part. Leaving out the moments, the
    scheduler or the data position changes the resumed run; leaving out the torch/NumPy/Python RNG states does not (a),
    nor Python's alone (e); the frozen base (f) is never in the checkpoint."""
    from peft import LoraConfig, get_peft_model
    from test_artifacts import _steps  # the resume tests' training loop: (loss, trainable parameters) after each step

    X, y = artifacts.tiny_data(n=64, d_in=8, n_classes=4, seed=0)
    total, k = 12, 6

    def build():
        model = get_peft_model(artifacts.TinyNet(seed=0, p_drop=0.0),
                               LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["fc1", "fc2"]))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=total)
        return model, opt, sched, artifacts.ShuffledBatches(len(X), batch_size=8, seed=0)

    def steps(model, opt, sched, sampler, n):
        return _steps(model, opt, sched, sampler, n, X, y)

    torch.manual_seed(0)
    model, opt, sched, sampler = build()
    steps(model, opt, sched, sampler, k)
    path = artifacts.save_checkpoint(tmp_path / "step6.pt", model, opt, sched, step=k, data_state=sampler.state_dict())
    reference = steps(model, opt, sched, sampler, total - k)

    def resumed_differs(optimizer=True, scheduler=True, rng=True, data=True):
        torch.manual_seed(12345)
        m, o, s, smp = build()
        state = artifacts.load_checkpoint(path, m, o if optimizer else None, s if scheduler else None, restore_rng=rng)
        if data:
            smp.load_state_dict(state["data_state"])
        run = steps(m, o, s, smp, total - state["step"])
        return not all(l1 == l2 and torch.equal(p1, p2) for (l1, p1), (l2, p2) in zip(run, reference))

    assert not resumed_differs()
    measured = {"a": resumed_differs(rng=False), "b": resumed_differs(optimizer=False), "c": resumed_differs(scheduler=False),
                "d": resumed_differs(data=False), "e": resumed_differs(rng=("torch", "numpy"))}
    assert {letter for letter, differs in measured.items() if differs} == RIGHT["p5"] == {"b", "c", "d"}
    keys = json.loads((ROOT / "autograder" / "keys" / "12.json").read_text())["keys"]
    assert set(keys["p5"]) == RIGHT["p5"]


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_p7s_model_answer_is_measured_by_a_look_before_the_first_resumed_step(tmp_path):
    """P7's model answer measured: the lesson's run with dropout, resumed with everything; one eval-mode forward under
    no_grad before step k + 1 keeps the run bitwise the uninterrupted one on X, and changes step k + 1's loss on the
    restored sampler's next batch (the sampler moves on; no RNG is drawn: the torch RNG state after the look is the
    restored one). The look in training mode (which P4's preflight teaches) changes it too."""
    from test_artifacts import _steps

    X, y, build = _lesson_run()
    torch.manual_seed(0)
    model, opt, sched, sampler = build()
    _steps(model, opt, sched, sampler, 6, X, y)
    path = artifacts.save_checkpoint(tmp_path / "step6.pt", model, opt, sched, step=6, data_state=sampler.state_dict())
    reference = _steps(model, opt, sched, sampler, 6, X, y)

    def resumed(look):
        torch.manual_seed(12345)
        m, o, s, smp = build()
        state = artifacts.load_checkpoint(path, m, o, s)
        smp.load_state_dict(state["data_state"])
        restored_rng = torch.get_rng_state()
        if look is not None:
            m.eval() if look != "train" else m.train()
            with torch.no_grad():
                m(X[next(smp)] if look == "next batch" else X)
            m.train()
        if look != "train":
            assert torch.equal(torch.get_rng_state(), restored_rng)   # an eval-mode look draws no random numbers
        return _steps(m, o, s, smp, 6, X, y)

    def same(run):
        return all(l1 == l2 and torch.equal(p1, p2) for (l1, p1), (l2, p2) in zip(run, reference))

    assert same(resumed(None)) and same(resumed("eval"))
    next_batch = resumed("next batch")
    assert next_batch[0][0] != reference[0][0]
    assert resumed("train")[0][0] != reference[0][0]


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_p8s_model_answer_is_measured_on_bases_the_fingerprint_cannot_tell_apart(tmp_path):
    """P8's model answer measured: load_adapter_checked accepts the lesson's adapter on TinyNet(seed=0, p_drop=0.5) and
    on a TinyNet(seed=0) whose forward uses GELU; the first gives the trained logits bit for bit in eval mode, the
    second other logits. And SmolLM2's rms_norm_eps is no tensor: a Llama model with another one has the same
    fingerprint."""
    from transformers import LlamaConfig, LlamaForCausalLM

    class GeluNet(artifacts.TinyNet):
        def forward(self, x):
            return self.fc2(self.drop(torch.nn.functional.gelu(self.fc1(x))))

    X, y, build = _lesson_run()
    model, folder = _exported_adapter(tmp_path)
    model.eval()
    with torch.no_grad():
        trained = model(X)
        drop = artifacts.load_adapter_checked(artifacts.TinyNet(seed=0, p_drop=0.5), folder)   # accepted
        gelu = artifacts.load_adapter_checked(GeluNet(seed=0), folder)                         # accepted
        assert not drop.training and not gelu.training
        assert torch.equal(drop(X), trained)
        assert not torch.allclose(gelu(X), trained, atol=1e-3)

    def fingerprint(eps):
        cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
                          intermediate_size=32, vocab_size=16, rms_norm_eps=eps)
        torch.manual_seed(0)
        return artifacts.base_fingerprint(LlamaForCausalLM(cfg))

    assert fingerprint(1e-5) == fingerprint(1e-3)
