"""Attention kernels at the default shape (B=128, T=2048, H=4, D=128, bf16), forward + backward, on CUDA.

    python3 benchmarks/train_speed/attention_variants.py [results.json]

For the sliding-window (S, window T/2) and the full causal (L) layers: FlexAttention (compiled, as train.py
used it before issue #9), cuDNN's band mask through its Python API (as kernels.py runs it now), PyTorch's
FlashAttention-2 with its native sliding window (aten ops, [B, T, H, D] layout), the window built from
cuDNN's causal kernel (three causal blocks merged by log-sum-exp), and for the L layers the SDPA backends. Median of timed runs; the errors are the relative L2 distances of the output and of q's
gradient to FlexAttention's.
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.common import cuda_median_ms, report  # noqa: E402

B, T, H, D = 128, 2048, 4, 128


def flex(window):
    def mask_mod(b, h, q, k):
        return (q >= k) & (q - k <= window)
    block_mask = create_block_mask(mask_mod, None, None, T, T, device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    block_mask=block_mask).transpose(1, 2)


class FlashWindow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, window):
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, T, T, 0.0, True, False, window_size_left=window, window_size_right=0)
        ctx.save_for_backward(q, k, v, out, lse, rng, unused)
        ctx.window = window
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.contiguous(), q, k, v, out, lse, None, None, T, T, 0.0, True, rng, unused,
            window_size_left=ctx.window, window_size_right=0)
        return dq, dk, dv, None


def cudnn_fwd(q, k, v):
    """Causal cuDNN attention on [B, T, H, D] (views allowed): out [B, T, H, D], lse [B, H, T], extras."""
    out, lse, _, _, _, _, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, True, 0.0, True, False)
    return out.transpose(1, 2), lse, (seed, offset)


def cudnn_bwd(dout, q, k, v, out, lse, extras):
    T = q.size(1)
    seed, offset = extras
    dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dout.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), out.transpose(1, 2),
        lse, seed, offset, None, None, None, T, T, 0.0, True)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


class ChunkedWindow(torch.autograd.Function):
    """Window T/2 on [B, T, H, D] from cuDNN's causal kernel: causal attention within each half (one call on
    [2B, T/2]), plus the second half's queries on the first half's keys, where key j is visible to query i
    when j >= i: causal once both are reversed in time. Merged by log-sum-exp; the backward runs both calls'
    kernels with the merged output and log-sum-exp (as ring attention does)."""
    @staticmethod
    def forward(ctx, q, k, v):
        B, T, H, D = q.shape
        h = T // 2
        oc, lc, ec = cudnn_fwd(*(x.view(2 * B, h, H, D) for x in (q, k, v)))
        ob, lb, eb = cudnn_fwd(q[:, h:].flip(1), k[:, :h].flip(1), v[:, :h].flip(1))
        ob, lb = ob.flip(1), lb.flip(2)
        ctx.lse_shapes = lc.shape, lb.shape  # cuDNN's: [B, H, T] or [B, H, T, 1]
        lc = lc.view(B, 2, H, h)
        oc = oc.view(B, 2, h, H, D)
        lse2 = torch.logaddexp(lc[:, 1], lb.view(B, H, h))
        wc = torch.exp(lc[:, 1] - lse2).transpose(1, 2).unsqueeze(-1)
        wb = torch.exp(lb.view(B, H, h) - lse2).transpose(1, 2).unsqueeze(-1)
        o2 = (oc[:, 1].float() * wc + ob.float() * wb).to(q.dtype)
        out = torch.cat([oc[:, 0], o2], dim=1)
        lse = torch.stack([lc[:, 0], lse2], dim=1)
        ctx.save_for_backward(q, k, v, out, lse, *ec, *eb)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *extras = ctx.saved_tensors
        B, T, H, D = q.shape
        h = T // 2
        dout = dout.contiguous()
        dq, dk, dv = cudnn_bwd(*(x.view(2 * B, h, H, D) for x in (dout, q, k, v, out)),
                               lse.reshape(ctx.lse_shapes[0]), extras[:2])
        gb = cudnn_bwd(*(x.flip(1) for x in (dout[:, h:], q[:, h:], k[:, :h], v[:, :h], out[:, h:])),
                       lse[:, 1].reshape(ctx.lse_shapes[1]).flip(2), extras[2:])
        gb = [g.flip(1) for g in gb]
        dq = dq.reshape(B, T, H, D)
        dk = dk.reshape(B, T, H, D)
        dv = dv.reshape(B, T, H, D)
        dq = torch.cat([dq[:, :h], dq[:, h:] + gb[0]], dim=1)
        dk = torch.cat([dk[:, :h] + gb[1], dk[:, h:]], dim=1)
        dv = torch.cat([dv[:, :h] + gb[2], dv[:, h:]], dim=1)
        return dq, dk, dv


def chunked(q, k, v):
    return ChunkedWindow.apply(q, k, v)


def cudnn_band(window):
    from cudnn.experimental.ops.sdpa import scaled_dot_product_attention
    return lambda q, k, v: scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                        is_causal=True, left_bound=window + 1).transpose(1, 2)


def flash(window):
    return lambda q, k, v: FlashWindow.apply(q, k, v, window)


def sdpa(backend):
    def run(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True).transpose(1, 2)
    return run


if __name__ == "__main__":
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    gout = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [B, T, H, D]}
    print("| kernel | window | fwd+bwd ms | out error | dq error |\n|---|---|---|---|---|", flush=True)
    for window in (T // 2, T):
        variants = [("flex", flex(window)), ("cudnn band", cudnn_band(window)),
                    ("flash2 window", flash(window if window < T else -1))]
        if window < T:
            variants += [("cudnn halves + reversed band, compiled", torch.compile(chunked, dynamic=False))]
        else:
            variants += [("sdpa cudnn causal", sdpa(SDPBackend.CUDNN_ATTENTION)),
                         ("sdpa flash causal", sdpa(SDPBackend.FLASH_ATTENTION))]
        base = None
        for name, fn in variants:
            try:
                q.grad = None
                out = fn(q, k, v)
                out.backward(gout)
                out, dq = out.float(), q.grad.float()
                if base is None:
                    base = out, dq
                errs = [((a - b).norm() / b.norm()).item() for a, b in zip((out, dq), base)]
                ms = cuda_median_ms(lambda: fn(q, k, v).backward(gout))
                results[f"{name} w{window} ms"] = round(ms, 3)
                print(f"| {name} | {window} | {ms:.2f} | {errs[0]:.1e} | {errs[1]:.1e} |", flush=True)
            except Exception as e:  # a kernel this GPU or build lacks
                print(f"| {name} | {window} | failed: {type(e).__name__}: {str(e)[:100]} | | |", flush=True)
    report(results, sys.argv[1] if len(sys.argv) > 1 else None, omit=results.keys())
