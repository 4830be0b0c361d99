"""Attention kernels at the default shape (B=128, H=4, T=2048, D=128, bf16), forward + backward, on CUDA.

    python3 benchmarks/attention_variants.py

Times FlexAttention (as train.py uses it) with its default and a few explicit kernel options, and the SDPA
backends for the plain causal (L) layers, to find where the attention time can go. Median of timed runs.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from common import cuda_median_ms

B, H, T, D = 128, 4, 2048, 128


def mask_for(window):
    def mask_mod(b, h, q, k):
        return (q >= k) & (q - k <= window)
    return create_block_mask(mask_mod, None, None, T, T, device="cuda")


def bench(fn, q, k, v):
    return cuda_median_ms(lambda: fn(q, k, v).backward(gout))


def flex(block_mask, options=None):
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask, kernel_options=options)


def sdpa(backend):
    def run(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return run


if __name__ == "__main__":
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    gout = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    ref = {w: None for w in (T // 2, T)}
    variants = [("default", None),
                ("fwd 128x128 w8 s3", dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)),
                ("fwd 128x64 w4 s3", dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)),
                ("bwd 64x128/128x64 w8 s3", dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64,
                                                  num_warps=8, num_stages=3)),
                ("bwd 32x128/128x32 w4 s3", dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32,
                                                  num_warps=4, num_stages=3))]
    print("| kernel | window | fwd+bwd ms | rel. error vs default |", flush=True)
    print("|---|---|---|---|")
    for window in (T // 2, T):
        bm = mask_for(window)
        base = flex(bm)(q, k, v).float()
        for name, opts in variants:
            try:
                fn = flex(bm, opts)
                out = fn(q, k, v).float()
                err = ((out - base).norm() / base.norm()).item()
                print(f"| flex {name} | {window} | {bench(fn, q, k, v):.2f} | {err:.1e} |", flush=True)
            except Exception as e:  # an option the kernel cannot take on this GPU
                print(f"| flex {name} | {window} | failed: {type(e).__name__}: {str(e)[:80]} | |", flush=True)
        if window == T:
            for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
                try:
                    fn = sdpa(backend)
                    out = fn(q, k, v).float()
                    err = ((out - base).norm() / base.norm()).item()
                    print(f"| sdpa {backend.name} causal | {window} | {bench(fn, q, k, v):.2f} | {err:.1e} |",
                          flush=True)
                except Exception as e:
                    print(f"| sdpa {backend.name} | {window} | failed: {str(e)[:80]} | |", flush=True)
    sys.exit(0)
