"""`make bench`: blockwise NF4 quantize and dequantize of a 4096×4096 weight, coursekit.quant vs
bitsandbytes on this CPU, in one run, as a ratio (not a test: numbers vary with the machine).

Both sides produce the same bytes (tests/test_quant.py). bitsandbytes' quantize_4bit has no CPU kernel
(its pure-torch default runs); its dequantize_4bit runs the native C++ kernel when it loaded.
Times with torch.utils.benchmark (median of blocked runs, at least 2 s each)."""

from __future__ import annotations

import logging
import warnings

import torch
import torch.utils.benchmark as benchmark

from coursekit import quant as Q


def main() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
        import bitsandbytes
        import bitsandbytes.functional as F
    W = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    print(f"NF4 quantization of a 4096x4096 bf16 weight, blocksize 64; torch {torch.__version__}, "
          f"bitsandbytes {bitsandbytes.__version__}, {torch.get_num_threads()} threads")
    for cs in (False, True):
        pb, sb = F.quantize_4bit(W, blocksize=64, quant_type="nf4", compress_statistics=cs)
        pc, sc = Q.quantize_4bit(W, blocksize=64, quant_type="nf4", compress_statistics=cs)
        assert torch.equal(pb, pc), "coursekit and bitsandbytes disagree: run tests/test_quant.py"
        cases = {
            "quantize": (lambda: Q.quantize_4bit(W, 64, "nf4", cs),
                         lambda: F.quantize_4bit(W, blocksize=64, quant_type="nf4", compress_statistics=cs)),
            "dequantize": (lambda: Q.dequantize_4bit(pc, sc), lambda: F.dequantize_4bit(pb, sb)),
        }
        label = "double quant" if cs else "plain"
        for op, (ours, theirs) in cases.items():
            t_ours = benchmark.Timer("f()", globals={"f": ours}).blocked_autorange(min_run_time=2.0).median
            t_bnb = benchmark.Timer("f()", globals={"f": theirs}).blocked_autorange(min_run_time=2.0).median
            print(f"  {op:<10} ({label:<12})  coursekit {t_ours * 1e3:8.1f} ms   bitsandbytes {t_bnb * 1e3:8.1f} ms"
                  f"   coursekit / bitsandbytes {t_ours / t_bnb:6.2f}x")


if __name__ == "__main__":
    main()
