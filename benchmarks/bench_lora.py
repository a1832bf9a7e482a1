"""`make bench`: speed of the reference LoRA kernels on this machine (not a test: numbers vary).

Times, with torch.utils.benchmark (warm-up and run counts chosen by the library):
- coursekit.lora forward + backward (NumPy, float64) vs torch autograd on the same layer (float64);
- the unmerged adapted forward vs the merged one (torch, float32), as a ratio.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.utils.benchmark as benchmark

from coursekit import lora


def main() -> None:
    torch.manual_seed(0)
    n, d, m, r, s = 256, 1024, 1024, 16, 2.0
    rng = np.random.default_rng(0)
    X, W = rng.standard_normal((n, d)), rng.standard_normal((d, m)) / 32
    A, B = rng.standard_normal((d, r)) / 32, rng.standard_normal((r, m)) / 32
    D = rng.standard_normal((n, m))

    def numpy_fwd_bwd():
        Y, cache = lora.lora_forward(X, W, A, B, s)
        return lora.lora_backward(D, cache)

    Xt, Wt, Dt = (torch.tensor(a) for a in (X, W, D))
    At, Bt = torch.tensor(A, requires_grad=True), torch.tensor(B, requires_grad=True)
    Xt.requires_grad_(True)

    def autograd_fwd_bwd():
        Y = Xt @ Wt + s * (Xt @ At) @ Bt
        return torch.autograd.grad(Y, (Xt, At, Bt), Dt)

    rows = []
    for label, fn in (("coursekit NumPy fwd+bwd (float64)", numpy_fwd_bwd), ("torch autograd fwd+bwd (float64)", autograd_fwd_bwd)):
        t = benchmark.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=1.0)
        rows.append((label, t.median))

    Xf, Wf, Af, Bf = (torch.tensor(a, dtype=torch.float32) for a in (X, W, A, B))
    Wm = lora.merge(Wf, Af, Bf, s)
    tu = benchmark.Timer("X @ W + s * (X @ A) @ B", globals=dict(X=Xf, W=Wf, A=Af, B=Bf, s=s)).blocked_autorange(min_run_time=1.0)
    tm = benchmark.Timer("X @ Wm", globals=dict(X=Xf, Wm=Wm)).blocked_autorange(min_run_time=1.0)
    rows += [("unmerged forward (float32)", tu.median), ("merged forward (float32)", tm.median)]

    print(f"LoRA layer n={n} d={d} m={m} r={r}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    for label, sec in rows:
        print(f"  {label:<36} {sec * 1e3:9.3f} ms")
    print(f"  unmerged / merged forward: {tu.median / tm.median:.2f}x")


if __name__ == "__main__":
    main()
