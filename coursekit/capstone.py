"""The capstone: a real QLoRA run on the embedded base model, end to end, on CPU.

``run()`` is what ``coursekit capstone`` and lesson 19 drive: baseline (zero-shot) accuracy on the
held-out split, attach LoRA to the NF4 base, preflight, train, held-out accuracy, generation
probes, save + exact reload, merge into the bf16 base and compare greedy answers, footprints and
seconds per step. A trained adapter is cached by (config, base checkpoint, data) so that a re-run
— a lesson re-executed, the grader, the tests — reuses it instead of training again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from . import data as cdata
from . import model as cmodel
from . import train as ctrain

PROBES = [
    "The cooling fan on the lathe spins but the housing is hot to the touch.",
    "After the firmware update the PLC rejects every recipe file.",
    "Hydraulic press loses pressure when the ram extends.",
    "Operator reports a burning smell near the main breaker.",
]


def data_key(seed: int = 0) -> str:
    splits = cdata.make_splits(seed)
    text = json.dumps({k: [ex["messages"] for ex in v] for k, v in splits.items()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_dir(cfg: ctrain.TrainConfig) -> Path:
    """Where this config's adapter, history and summary are cached."""
    base = ctrain.base_identity()
    sha = list(base["checkpoint_files"].values())[0][:12]
    return cmodel.cache_root() / "capstone" / f"{cfg.key()}-{sha}-{data_key()}"


@contextlib.contextmanager
def _lock(folder: Path):
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # a second process waits, then reuses the first one's adapter
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def train_or_load(model, tokenizer, cfg: ctrain.TrainConfig, retrain: bool = False, progress: bool = True):
    """Train the adapter of ``model`` (a PeftModel on the NF4 base) or, if this exact run is cached, load its
    weights. Returns ``(model, history, cached)``; history has loss, lr and seconds per step."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = run_dir(cfg)
    with _lock(folder):
        hist_file = folder / "history.json"
        if not retrain and hist_file.is_file() and (folder / "adapter" / "adapter_model.safetensors").is_file():
            set_peft_model_state_dict(model, load_file(str(folder / "adapter" / "adapter_model.safetensors")))
            return model, json.loads(hist_file.read_text()), True
        hist = ctrain.train(model, tokenizer, cdata.load_split("train"), cfg, progress=progress)
        ctrain.save_adapter(model, folder / "adapter", cfg, extra={"data": data_key()})
        hist_file.write_text(json.dumps(hist) + "\n")
        return model, hist, False


def run(cfg: ctrain.TrainConfig | None = None, retrain: bool = False, progress: bool = True, log=print) -> dict:
    """The whole capstone; returns a summary dict (also written to the run folder as summary.json)."""
    cfg = cfg or ctrain.TrainConfig()
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    cmodel.prepare_model(progress=progress)
    tok = cmodel.load_tokenizer()
    heldout = cdata.load_split("heldout")
    log("loading the NF4 base …")
    base = cmodel.load_model("nf4")
    nf4_bytes = cmodel.footprint(base)

    log(f"baseline: greedy answers on {len(heldout)} held-out tickets …")
    baseline = ctrain.evaluate(base, tok, heldout, cfg.max_new_tokens)

    model = ctrain.attach_adapter(base, cfg)
    first = cdata.collate([cdata.encode_example(ex, tok) for ex in cdata.load_split("train")[: cfg.micro_batch]],
                          ctrain._pad_id(tok))
    pre = ctrain.preflight(model, first)
    model, hist, cached = train_or_load(model, tok, cfg, retrain, progress)
    log("tuned: greedy answers on the held-out split …")
    tuned = ctrain.evaluate(model, tok, heldout, cfg.max_new_tokens)
    probes = dict(zip(PROBES, ctrain.generate_answers(model, tok, PROBES, cfg.max_new_tokens)))

    # Save, reload on a fresh NF4 base, and compare logits exactly.
    folder = run_dir(cfg)
    adapter_dir = folder / "adapter"
    enc = {k: v for k, v in first.items() if k != "labels"}
    model.eval()
    with torch.no_grad():
        logits = model(**enc).logits
    fresh = ctrain.load_nf4_with_adapter(adapter_dir)
    fresh.eval()
    with torch.no_grad():
        logits2 = fresh(**enc).logits
    reload_max_diff = float((logits - logits2).abs().max())
    del fresh

    log("merging into the bf16 base …")
    merged = ctrain.merge_into_bf16(adapter_dir)
    bf16_bytes = cmodel.footprint(merged)
    merged_answers = ctrain.generate_answers(merged, tok, [ex["ticket"] for ex in heldout], cfg.max_new_tokens)
    agree = sum(ctrain._first_word(a) == ctrain._first_word(p["answer"]) for a, p in zip(merged_answers, tuned["predictions"]))
    merged_acc = sum(ctrain._first_word(a) == ex["label"] for a, ex in zip(merged_answers, heldout)) / len(heldout)
    del merged

    steady = hist["seconds"][1:] or hist["seconds"]
    summary = {
        "config": asdict(cfg),
        "baseline_accuracy": baseline["accuracy"],
        "tuned_accuracy": tuned["accuracy"],
        "merged_bf16_accuracy": merged_acc,
        "merged_agreement": agree / len(heldout),
        "baseline_per_label": baseline["per_label"],
        "tuned_per_label": tuned["per_label"],
        "steps": cfg.steps,
        "seconds_per_step": sum(steady) / len(steady),
        "train_seconds": sum(hist["seconds"]),
        "adapter_cached": cached,
        "first_loss": hist["loss"][0],
        "last_loss": hist["loss"][-1],
        "reload_max_logit_diff": reload_max_diff,
        "preflight": pre,
        "footprint_nf4_mb": nf4_bytes / 1e6,
        "footprint_bf16_mb": bf16_bytes / 1e6,
        "peak_rss_mb": ctrain.peak_rss_mb(),
        "wall_seconds": time.perf_counter() - t_start,
        "probes": probes,
        "history": hist,
        "baseline_predictions": baseline["predictions"],
        "tuned_predictions": tuned["predictions"],
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def format_summary(s: dict) -> str:
    rows = [
        ("held-out accuracy, zero-shot baseline", f"{s['baseline_accuracy']:.1%}"),
        ("held-out accuracy, QLoRA adapter (NF4 base)", f"{s['tuned_accuracy']:.1%}"),
        ("held-out accuracy, merged into bf16", f"{s['merged_bf16_accuracy']:.1%}"),
        ("merged answers equal to the adapter's", f"{s['merged_agreement']:.1%}"),
        ("training steps", f"{s['steps']}" + (" (adapter reused from the cache)" if s["adapter_cached"] else "")),
        ("seconds per step", f"{s['seconds_per_step']:.2f}"),
        ("loss, first → last step", f"{s['first_loss']:.3f} → {s['last_loss']:.3f}"),
        ("reload: max |logit difference|", f"{s['reload_max_logit_diff']:.3g}"),
        ("footprint NF4 / bf16 (MB)", f"{s['footprint_nf4_mb']:.0f} / {s['footprint_bf16_mb']:.0f}"),
        ("peak resident memory (MB)", f"{s['peak_rss_mb']:.0f}"),
        ("wall time (s)", f"{s['wall_seconds']:.0f}"),
    ]
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)
