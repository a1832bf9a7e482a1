"""coursekit.capstone_markdown: the capstone page's numbers (docs/capstone.md) are the command's own output. Each block equals
the results file the command wrote, and the writer renders a report's numbers (a stand-in report here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coursekit import capstone_markdown as cm
from coursekit import data, evaluate

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_each_readme_block_is_the_file_the_command_wrote(dtype):
    written = (ROOT / "docs" / f"capstone-results-{dtype}.md").read_text()
    assert cm.block((ROOT / "docs" / "capstone.md").read_text(), dtype) == written
    assert written.startswith("`coursekit capstone`, matmuls in " + dtype)


def _res(split, right_every):
    examples = data.load_split(split)
    preds = [ex["label"] if i % right_every == 0 else "other" for i, ex in enumerate(examples)]
    return evaluate.summarize([ex["label"] for ex in examples], preds, [ex["id"] for ex in examples])


def _report():
    both = lambda k: {s: _res(s, k) for s in data.HELDOUT_SPLITS}  # noqa: E731
    return {"ladder": {"prompt tuned on train: system turn, 6 shots, calibrated": both(2)},
            "heldout": {"qlora": {"labels": both(1)}}, "runs": {}, "merge": None,
            "store": {"computed": 0, "read": 9}, "matmul": "float32", "threads": 2, "usable_cpus": 2,
            "wall_seconds": 754.4}


def test_markdown_renders_the_reports_numbers_and_its_own_time():
    text = cm.markdown(_report())
    assert text.startswith("`coursekit capstone`, matmuls in float32, 2 torch threads (2 usable CPUs), warm: every "
                           "result read from the store: **12 min 34 s**.")
    assert "| untrained, prompt tuned on train: system turn, 6 shots, calibrated | 50.0 % [41.2, 58.8] | 50.0 % [41.9, 58.1] |" in text
    assert "| **QLoRA**, label scoring | 100.0 % [96.9, 100.0] | 100.0 % [97.4, 100.0] |" in text
    assert "- unseen symptom: QLoRA vs the tuned prompt, 144 tickets: +50.0 points; right only for QLoRA on 72" in text
    cold = cm.markdown({**_report(), "store": {"computed": 9, "read": 0}})
    assert "cold: every result computed" in cold


def _rung(right_every, chosen, needs_base):
    return {**{s: _res(s, right_every) for s in data.HELDOUT_SPLITS}, "chosen": {**chosen, "cv_accuracy": 0.625},
            "cost": {"search_seconds": 12.3, "fit_predict_cpu_seconds": 0.456, "kept_mb": 1.234, "needs_base": needs_base}}


def test_markdown_shows_each_cheap_rung_its_choice_its_cost_and_its_paired_test_with_qlora():
    cheap = {"rungs": {"bow": _rung(4, {"C": 10.0}, False), "probe": _rung(3, {"fed": "prompt", "layer": 20, "pooling": "mean", "C": 0.01}, True)},
             "features_seconds": 98.7, "features_cpu_seconds": 190.2, "n_train": 360}
    text = cm.markdown({**_report(), "cheap": cheap})
    bow = _res("unseen_symptom", 4)
    assert f"| cheap: bag of words | {cm._pct(_res('unseen_phrasing', 4))} | {cm._pct(bow)} |" in text
    assert "| probe on base states | fed prompt, layer 20, pooling mean, C 0.01 | 62.5 % | 12 | 0.46 | 1.23 MB + the base |" in text
    assert "| bag of words | C 10.0 | 62.5 % | 12 | 0.46 | 1.23 MB |" in text
    assert "one pass over every ticket, 99 s (190 CPU s)" in text
    wrong = round(100 * (1 - bow["accuracy"]), 1)
    assert f"- unseen symptom: QLoRA vs bag of words, 144 tickets: +{wrong:.1f} points" in text
    assert "cheap" not in cm.markdown(_report())

def test_splice_replaces_only_its_own_block_and_refuses_a_missing_one():
    text = f"a\n{cm.begin('float32')}\nold\n{cm.end('float32')}\nb\n{cm.begin('bfloat16')}\nkeep\n{cm.end('bfloat16')}\n"
    out = cm.splice(text, "new\n", "float32")
    assert cm.block(out, "float32") == "new\n" and cm.block(out, "bfloat16") == "keep\n"
    assert out.startswith("a\n") and out.endswith(f"{cm.end('bfloat16')}\n")
    with pytest.raises(ValueError, match="exactly one"):
        cm.splice("no markers", "x", "float32")
    with pytest.raises(ValueError):
        cm.block(text + cm.begin("float32"), "float32")


def test_splice_refuses_what_would_break_the_file_and_keeps_the_end_marker_on_its_own_line():
    text = f"a\n{cm.begin('float32')}\nold\n{cm.end('float32')}\n"
    assert cm.block(cm.splice(text, "no newline", "float32"), "float32") == "no newline\n"
    with pytest.raises(TypeError, match="block must be str"):
        cm.splice(text, None, "float32")
    with pytest.raises(ValueError, match="marker"):
        cm.splice(text, f"x\n{cm.end('float32')}\n", "float32")


def _memory(peak):
    return {"peak_rss_mb": peak, "saved_activations_mb": 100.0}


def test_the_cost_table_says_when_its_times_were_measured():
    runs = {name: {"seconds_per_step": 1.0, "losses": [1.0] * 40, "footprint_mb": 200.0, "memory": _memory(900.0)}
            for name in ("qlora", "lora_bf16")}
    warm = cm.markdown({**_report(), "runs": runs})
    assert "| cost, as measured when each result was computed |" in warm and "same run" not in warm
    cold = cm.markdown({**_report(), "runs": runs, "store": {"computed": 9, "read": 0}})
    assert "| cost, measured in the same run |" in cold


def test_readme_is_written_only_by_a_cold_run(capsys):
    from coursekit.cli import main

    assert main(["capstone", "--readme", "docs/capstone.md"]) == 2  # refused before anything runs
    assert "add --retrain" in capsys.readouterr().err


def test_the_merge_table_gives_each_row_its_n_interval_and_paired_test_against_the_trained_function():
    from coursekit import capstone

    examples = data.load_split("unseen_symptom")
    true = [ex["label"] for ex in examples]
    ref = [t if i % 5 else "(other)" for i, t in enumerate(true)]
    w16 = [t if i % 4 else "(other)" for i, t in enumerate(true)]
    row = lambda pred: {"agreement": sum(a == b for a, b in zip(pred, ref)) / len(pred),  # noqa: E731
                        **capstone.scored_against(pred, ref, examples)}
    merge = {"reload_max_abs_diff": 0.0, "reference": capstone.scored_against(ref, None, examples), "n": len(examples),
             "nf4_codes_changed": 1e-5, "base": row(["(other)"] * len(examples)), "merges": {"onto W16 (bf16 base)": row(w16)}}
    text = cm.markdown({**_report(), "merge": merge})
    c = merge["merges"]["onto W16 (bf16 base)"]["paired"]
    assert f"(NF4 + adapter, {cm._pct(merge['reference'])}, n=144)" in text
    assert (f"| merged onto W16 (bf16 base) | {100 * merge['merges']['onto W16 (bf16 base)']['agreement']:.1f} % | "
            f"{cm._pct(merge['merges']['onto W16 (bf16 base)'])} (n=144) | {c['b_only']} / {c['a_only']} | "
            f"{c['p_value']:.2g} |") in text
