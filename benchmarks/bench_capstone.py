"""`make bench` (second part): the capstone's figures and bf16 vs NF4 on the same short job, in one run.

Writes .artifacts/bench-capstone.json and prints a table. The capstone itself reuses a cached adapter
when one exists for the default configuration (its training seconds per step come from that run's
history); pass --retrain to train it again here.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from coursekit import capstone, data, model, train


def short_job(precision: str, steps: int = 8) -> dict:
    """LoRA (r 16, all linear) on a bf16 or NF4 base: seconds per step (after a warm-up step) and footprint."""
    tok = model.load_tokenizer()
    base = model.load_model(precision)
    footprint = model.footprint(base)
    cfg = train.TrainConfig(steps=steps + 1, warmup_steps=0)
    peft_model = train.attach_adapter(base, cfg, quantized=(precision == "nf4"))
    hist = train.train(peft_model, tok, data.load_split("train"), cfg, progress=False)
    sec = hist["seconds"][1:]
    return {"precision": precision, "seconds_per_step": sum(sec) / len(sec), "footprint_mb": footprint / 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--retrain", action="store_true")
    p.add_argument("--out", default=".artifacts/bench-capstone.json")
    a = p.parse_args()
    t0 = time.perf_counter()
    s = capstone.run(train.TrainConfig(), retrain=a.retrain, progress=False, log=lambda *x: None)
    jobs = {prec: short_job(prec) for prec in ("bf16", "nf4")}
    result = {
        "capstone": {k: s[k] for k in ("baseline_accuracy", "tuned_accuracy", "merged_bf16_accuracy", "merged_agreement",
                                        "steps", "seconds_per_step", "train_seconds", "wall_seconds", "peak_rss_mb",
                                        "footprint_nf4_mb", "footprint_bf16_mb", "adapter_cached")},
        "short_job": jobs,
        "nf4_over_bf16_seconds_per_step": jobs["nf4"]["seconds_per_step"] / jobs["bf16"]["seconds_per_step"],
        "bf16_over_nf4_footprint": jobs["bf16"]["footprint_mb"] / jobs["nf4"]["footprint_mb"],
        "torch": torch.__version__, "threads": torch.get_num_threads(), "bench_seconds": time.perf_counter() - t0,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(capstone.format_summary(s))
    print(f"\nsame short job (r 16, batch 8): bf16 {jobs['bf16']['seconds_per_step']:.2f} s/step, "
          f"NF4 {jobs['nf4']['seconds_per_step']:.2f} s/step (NF4/bf16 {result['nf4_over_bf16_seconds_per_step']:.2f}x); "
          f"footprint bf16/NF4 {result['bf16_over_nf4_footprint']:.2f}x")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
