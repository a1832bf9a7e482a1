"""`make bench` (third part): the capstone's training step against the bound its matrix products set, in one run.

For QLoRA (NF4 base) and LoRA on the bf16 base, with the capstone's configuration and batches, computing in the
dtype the capstone uses on this CPU (``coursekit.model.matmul_dtype``: bf16 where the CPU multiplies bf16 in
hardware, else float32, exactly as ``capstone.for_this_cpu`` sets it up): seconds per optimizer step (median of
the steps after a warm-up), and the bound that GEMMs in that dtype alone would allow: the step's multiply-adds
(the frozen base's forward and input gradients, the adapters' forward and both gradients, the output layer at
the supervised positions; attention scores and element-wise work not counted) divided by the GEMM rate this CPU
reaches in that dtype at the model's own shapes, measured once in the same process after both timings. The two
steps multiply the same shapes, so they share one bound. The ratio says
how far eager PyTorch on this machine is from the arithmetic; a profiled step says how much of its CPU time is
matrix products and how many operations it dispatches.

Writes .artifacts/bench-capstone.json and prints a table. Numbers vary with what else the machine does.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import warnings
from pathlib import Path

import torch

from coursekit import capstone, data, model, train


def gemm_rate(tokens: int, shapes: list[tuple[int, int, int]], dtype: torch.dtype, repeats: int = 20) -> float:
    """Multiply-add rate in FLOP/s of ``dtype`` GEMMs over the model's linear shapes (d_in, d_out, count per layer),
    weighted by their FLOPs, for ``tokens`` rows: the best a step made of these products could do on this CPU."""
    total_flop, total_s = 0.0, 0.0
    for d_in, d_out, count in shapes:
        x = torch.randn(tokens, d_in, dtype=dtype)
        w = torch.randn(d_in, d_out, dtype=dtype)
        for _ in range(3):
            x @ w
        t0 = time.perf_counter()
        for _ in range(repeats):
            x @ w
        dt = (time.perf_counter() - t0) / repeats
        total_flop += 2 * tokens * d_in * d_out * count
        total_s += dt * count
    return total_flop / total_s


def step_flop(m, tokens: int, supervised: int, r: int, targets: set[str] | None) -> tuple[float, list[tuple[int, int, int]]]:
    """Multiply-add FLOPs of one training step and the distinct linear shapes of one decoder layer."""
    cfg = m.config
    d, inter, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    layer = {"q_proj": (d, d), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (d, d),
             "gate_proj": (d, inter), "up_proj": (d, inter), "down_proj": (inter, d)}
    L = cfg.num_hidden_layers
    base = sum(2 * tokens * a * b for a, b in layer.values()) * L * 2            # forward + input gradient
    adapted = layer if targets is None else {k: v for k, v in layer.items() if k in targets}
    lora = sum(2 * tokens * r * (a + b) for a, b in adapted.values()) * L * 3    # forward + both gradients
    head = 2 * supervised * d * cfg.vocab_size * 2                             # forward + input gradient
    shapes: dict[tuple[int, int], int] = {}
    for a, b in layer.values():
        shapes[(a, b)] = shapes.get((a, b), 0) + 1
    return base + lora + head, [(a, b, c) for (a, b), c in shapes.items()]


def timed_steps(quantize: bool, steps: int) -> dict:
    """``steps`` + 1 steps of the capstone's configuration with coursekit's reference loop; the first is a warm-up."""
    _, cfg, _ = capstone.RUNS["qlora"]
    tok = model.load_tokenizer()
    torch.manual_seed(cfg.seed)
    m = capstone.for_this_cpu(train.load_for_lora(model.prepare_model(progress=False), cfg.r, cfg.lora_alpha,
                                                  cfg.target_modules, quantize))
    footprint = model.footprint(m)
    windows = train.make_windows(data.load_split("train"), tok, capstone.dataclasses.replace(cfg, steps=steps + 1))
    opt = train.adapter_optimizer(m, cfg.lr)
    hist = train.train_steps(m, windows, opt, progress=False)
    batch = windows[0][0]
    # Where one more step's time goes: matrix products against everything else (element-wise ops, casts, copies,
    # attention, the optimizer, and the per-op cost of eager PyTorch across 30 layers × 7 adapted projections).
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train.train_steps(m, windows[:1], opt, progress=False)
    events = prof.key_averages()
    total_us = sum(e.self_cpu_time_total for e in events)
    gemm_us = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
    tokens, supervised = batch["input_ids"].numel(), data.count_supervised(batch["labels"])
    flop, shapes = step_flop(m.get_base_model(), tokens, supervised, cfg.r, None)
    return {"seconds_per_step": statistics.median(hist["seconds"][1:]), "step_gflop": flop / 1e9,
            "dtype": str(model.matmul_dtype()).removeprefix("torch."), "tokens_per_step": tokens, "shapes": shapes,
            "footprint_mb": footprint / 1e6, "profiled_share_in_matmuls": gemm_us / total_us,
            "profiled_ops": sum(e.count for e in events)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps per base (after one warm-up step)")
    p.add_argument("--out", default=".artifacts/bench-capstone.json")
    a = p.parse_args()
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    model.use_usable_cpus()
    t0 = time.perf_counter()
    jobs = {"QLoRA (NF4)": timed_steps(True, a.steps), "LoRA (bf16)": timed_steps(False, a.steps)}
    first = jobs["QLoRA (NF4)"]
    assert all(j["shapes"] == first["shapes"] and j["tokens_per_step"] == first["tokens_per_step"] for j in jobs.values())
    rate = gemm_rate(first["tokens_per_step"], first["shapes"], model.matmul_dtype())
    for j in jobs.values():
        bound = j["step_gflop"] * 1e9 / rate
        j.update(gemm_gflops=rate / 1e9, bound_seconds=bound, ratio_to_bound=j["seconds_per_step"] / bound)
    result = {"jobs": jobs, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "bench_seconds": time.perf_counter() - t0}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':14s}{'s/step':>8s}{'GFLOP/step':>12s}{'dtype':>10s}{'GEMM GFLOP/s':>14s}{'bound s':>9s}{'ratio':>7s}"
          f"{'in matmuls':>12s}{'ops/step':>10s}{'params MB':>11s}")
    for name, j in jobs.items():
        print(f"{name:14s}{j['seconds_per_step']:8.2f}{j['step_gflop']:12.1f}{j['dtype']:>10s}{j['gemm_gflops']:14.0f}"
              f"{j['bound_seconds']:9.2f}{j['ratio_to_bound']:7.2f}{100 * j['profiled_share_in_matmuls']:11.0f}%"
              f"{j['profiled_ops']:10d}{j['footprint_mb']:11.0f}")
    print(f"({a.steps} timed steps each, {torch.get_num_threads()} threads of {model.usable_cpus()} usable CPUs; "
          f"written to {out})")


if __name__ == "__main__":
    main()
