"""Head and loss at the default shape (one micro-batch: 128 x 2048 = 262,144 tokens, width 512, vocabulary
8192, bf16 under autocast), forward + backward, on CUDA.

    python3 benchmarks/train_speed/loss_kernel.py [--json FILE]

Times the compiled definition (lm_head, float32 soft cap, cross-entropy: what train.py did before issue #9)
against kernels.py's head_loss (one Triton kernel that writes the loss gradient over the logits), both under
torch.compile, and the memory each needs on top of its inputs; then tries warp counts for the kernel.
Median of timed runs. Agreement with the float64 definition is tested in tests/test_kernels.py.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernels  # noqa: E402
from benchmarks.common import cuda_median_ms, report  # noqa: E402

N, C, V = 128 * 2048, 512, 8192


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(N, C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(V, C, device="cuda") * 0.05).requires_grad_()
    t = torch.randint(0, V, (N,), device="cuda")

    def definition(x, w, t):  # as train.py computed it before
        return F.cross_entropy(15 * torch.tanh(F.linear(x, w).float() / 15), t)

    def step(loss_fn):
        x.grad = w.grad = None
        with torch.autocast("cuda", torch.bfloat16):
            loss = loss_fn(x, w, t)
        loss.backward()

    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": N, "width": C,
               "vocab": V, "date": time.strftime("%Y-%m-%d")}
    for name, fn in [("compiled_definition", definition), ("fused", kernels.head_loss)]:
        compiled = torch.compile(fn)
        results[f"{name}_ms"] = round(cuda_median_ms(lambda: step(compiled)), 3)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(compiled)
        torch.cuda.synchronize()
        results[f"{name}_extra_memory_mb"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
    results["logits_bf16_mb"] = N * V * 2 / 2**20
    sweep = {}
    for warps in (4, 8, 16, 32):
        kernels.CE_WARPS = warps
        sweep[f"{warps} warps"] = round(cuda_median_ms(lambda: step(kernels.head_loss)), 3)
    results["eager_fused_sweep_ms"] = sweep
    report(results, args.json)


if __name__ == "__main__":
    main()
