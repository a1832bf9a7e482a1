"""coursekit.capstone: the store's contract, on small stand-in results (the real run: tests/test_capstone_run.py)."""

from __future__ import annotations

import json
import threading

import pytest

from coursekit import capstone


# --------------------------------------------------------------------------- the store


def test_store_computes_once_and_then_reads(tmp_path):
    store = capstone.Store(root=tmp_path, compute=True)
    calls = []

    def compute():
        calls.append(1)
        return {"value": 42}

    first = store.result("kind", {"a": 1}, compute, by="test")
    again = store.result("kind", {"a": 1}, compute, by="test")
    assert calls == [1] and first["value"] == again["value"] == 42
    assert first["cached"] is False and again["cached"] is True and again["by"] == "test" and "when" in again
    assert store.result("kind", {"a": 2}, compute, by="test")["value"] == 42 and calls == [1, 1]


def test_the_default_store_on_a_fresh_machine_prepares_the_model_first(tmp_path, monkeypatch):
    """`coursekit capstone` (make capstone) on a fresh machine: the store is named by the checkpoint's hash, so it
    converts the embedded model first instead of failing on the missing manifest."""
    from coursekit import model

    monkeypatch.setenv("COURSEKIT_CACHE", str(tmp_path))
    calls = []

    def prepare_model(progress=True):
        calls.append(progress)
        out = model.default_checkpoint_dir()
        out.mkdir(parents=True)
        (out / model.MANIFEST).write_text(json.dumps({"model": model.MODEL_NAME, "route": model.ROUTE,
                                                      "checkpoint": {"files": {"model.safetensors": "ab" * 32}}}))
        return out

    monkeypatch.setattr(model, "prepare_model", prepare_model)
    store = capstone.Store()
    assert calls == [False] and store.root.parent == tmp_path / "capstone" and "-abababababab-" in store.root.name
    capstone.Store()
    assert calls == [False]  # prepared once; the next store only reads the manifest


def test_a_store_that_may_not_compute_says_how_to_fill_it(tmp_path):
    with pytest.raises(capstone.CacheMiss, match="coursekit capstone"):
        capstone.Store(root=tmp_path, compute=False).result("kind", {"a": 1}, lambda: {"v": 1}, by="test")


def test_inside_nbgrader_autograde_the_store_only_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    store = capstone.Store(root=tmp_path)
    assert store.compute is False
    with pytest.raises(capstone.CacheMiss):
        store.result("kind", {}, lambda: {"v": 1}, by="test")


def test_fresh_recomputes_each_result_once(tmp_path):
    capstone.Store(root=tmp_path, compute=True).result("k", {}, lambda: {"v": 1}, by="old")
    fresh = capstone.Store(root=tmp_path, compute=True, fresh=True)
    assert fresh.result("k", {}, lambda: {"v": 2}, by="new")["v"] == 2
    assert fresh.result("k", {}, lambda: {"v": 3}, by="newer")["v"] == 2  # computed once per fresh run, then read


def test_two_processes_wait_for_each_other_and_share_one_result(tmp_path):
    store = capstone.Store(root=tmp_path, compute=True)
    calls, out = [], []
    gate = threading.Event()

    def slow():
        calls.append(1)
        gate.wait(5)
        return {"v": len(calls)}

    threads = [threading.Thread(target=lambda: out.append(store.result("k", {}, slow, by="t"))) for _ in range(2)]
    threads[0].start()
    threads[1].start()
    gate.set()
    for t in threads:
        t.join(30)
    assert calls == [1] and [r["v"] for r in out] == [1, 1]


def test_a_half_written_result_is_never_read(tmp_path):
    store = capstone.Store(root=tmp_path, compute=True)
    folder = store.folder("k", {})
    folder.mkdir(parents=True)
    (folder / "result.json.tmp").write_text("{")  # a writer that died before its atomic rename
    assert store.result("k", {}, lambda: {"v": 1}, by="t")["v"] == 1


def test_runs_differ_from_qlora_in_one_thing_each():
    base = capstone.RUNS["qlora"]
    assert base[0] is True and base[1] == capstone.CONFIG
    for name, (quantize, cfg, _) in capstone.RUNS.items():
        changed = (quantize != base[0]) + sum(getattr(cfg, f) != getattr(base[1], f) for f in vars(cfg))
        assert changed == (name != "qlora"), name


# --------------------------------------------------------------------------- a merge row's paired test


def test_a_scored_row_pairs_its_tickets_with_the_reference_by_the_course_s_mcnemar_test():
    """merge_comparison's rows: the per-ticket labels kept in coursekit.evaluate's form, the accuracy with n and its
    Wilson interval, and the paired test against the reference (coursekit.paired.compare, this row as A): a_only the
    tickets gained (right only for the row), b_only those lost (right only for the reference), McNemar's exact p."""
    from coursekit import evaluate, paired

    examples = [{"id": f"t{i}", "label": "hydraulic" if i % 2 else "electrical", "symptom": f"s{i // 3}"}
                for i in range(30)]
    true = [ex["label"] for ex in examples]
    ref = list(true)
    ref[:6] = ["(other)"] * 6  # the reference misses tickets 0-5
    pred = list(true)
    pred[3:5] = ["(other)"] * 2  # the row gets 0-2 and 5 right where the reference did not
    pred[10:17] = ["(other)"] * 7  # and loses 10-16, which the reference got right
    row = capstone.scored_against(pred, ref, examples)
    c = row["paired"]
    assert (c["a_only"], c["b_only"]) == (4, 7) and c["n"] == row["n"] == 30
    right = [p == t for p, t in zip(pred, true)]
    assert c["p_value"] == paired.mcnemar_exact(right, [p == t for p, t in zip(ref, true)])["p_value"]
    assert row["correct"] == sum(right) == 21 and row["accuracy"] == 21 / 30
    assert row["interval"] == list(evaluate.wilson_interval(21, 30))
    assert [p["pred"] for p in row["predictions"]] == pred and [p["id"] for p in row["predictions"]] == [
        ex["id"] for ex in examples]
    assert c["n_groups"] == 10 and c["grouped"]  # the clustered interval resamples the symptoms
    alone = capstone.scored_against(ref, None, examples)
    assert "paired" not in alone and alone["correct"] == 24
    with pytest.raises(ValueError, match="one label per ticket"):
        capstone.scored_against(pred[:-1], ref, examples)
