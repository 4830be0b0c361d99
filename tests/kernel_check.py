"""Runs kernels.py's Triton kernels against their float64 definitions and prints the largest errors as JSON.

On CPU (TRITON_INTERPRET=1, Triton's interpreter): the loss kernel alone (its losses and the gradient it
writes in place of the logits) and rotary_norm. On CUDA: head_loss end to end (the losses, and the
gradients of x and the weight) and rotary_norm, optionally compiled."""
import json
import sys

import torch

if __name__ == "__main__" and not torch.cuda.is_available():
    torch.library.wrap_triton = lambda kernel: kernel  # the interpreter runs plain (not compiled) kernels

import kernels  # noqa: E402


def definition(logits, targets, cap=15.0):
    """Per-token losses: cross-entropy of the float32 soft-capped logits (0 where the target is -1)."""
    capped = cap * torch.tanh(logits.double() / cap)
    return torch.nn.functional.cross_entropy(capped, targets, ignore_index=-1, reduction="none")


SHAPES = [(9, 300, torch.bfloat16), (6, 128, torch.float32), (33, 1000, torch.bfloat16)]


def relative(a, b):
    return ((a.double() - b).abs().max() / b.abs().max()).item()


def inputs(N, V, device, C=64):
    x = torch.randn(N, C, device=device)
    w = torch.randn(V, C, device=device) * 3  # logits of about +-25: many past the cap
    t = torch.randint(0, V, (N,), device=device)
    t[1], t[2] = -1, V - 1  # an ignored row, the last column
    return x, w, t


def rotary_tables(T, D, base=10000):
    """cos and sin [1, T, 1, D / 2] in bf16, as train.py makes them."""
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    return freqs.cos().bfloat16()[None, :, None, :], freqs.sin().bfloat16()[None, :, None, :]


def check_rotary_norm(device, compiled=False):
    """rotary_norm's output and input gradient, for head dims with and without a power-of-two half."""
    kernels.ROTARY_ROWS = 4 if device == "cpu" else kernels.ROTARY_ROWS  # a partial last block of rows
    fn = torch.compile(kernels.rotary_norm, dynamic=False) if compiled else kernels.rotary_norm  # as train.py
    errors = {}
    for B, T, H, D, dtype in [(2, 8, 3, 16, torch.float32), (1, 5, 2, 24, torch.bfloat16),
                              (3, 7, 1, 128, torch.bfloat16)]:
        cos, sin = (f.to(device) for f in rotary_tables(T, D))
        x = torch.randn(B, T, H, D, device=device).to(dtype).requires_grad_()
        y = torch.ops.autoresearch.rotary_norm(x, cos, sin) if device == "cpu" else fn(x, cos, sin)
        dy = torch.randn(B, H, T, D, device=device).to(dtype).transpose(1, 2)  # the attention's layout
        y.backward(dy)
        xd = x.detach().double().requires_grad_()
        exact = kernels.rotary_norm_reference(xd, cos.double(), sin.double())
        exact.backward(dy.double())
        errors[f"rotary {B}x{T}x{H}x{D}:{dtype}"] = {"y": relative(y, exact), "dx": relative(x.grad, xd.grad)}
    return errors


def check_kernel():
    """The kernel in Triton's interpreter (CPU): losses and in-place gradient for unit upstream gradients."""
    errors = {}
    for N, V, dtype in SHAPES:
        x, w, t = inputs(N, V, "cpu")
        logits = (x @ w.t()).to(dtype)
        exact_in = logits.double().requires_grad_()
        exact = definition(exact_in, t)
        exact.sum().backward()
        grad = logits.clone()
        losses = torch.ops.autoresearch.softcap_ce_(grad, t, 15.0, True)
        errors[f"{N}x{V}:{dtype}"] = {"loss": (losses.double() - exact).abs().max().item(),
                                      "grad": relative(grad, exact_in.grad), "ignored_loss": losses[1].item(),
                                      "ignored_grad": grad[1].abs().max().item()}
    return errors


def check_head_loss(compiled=False):
    """head_loss on CUDA under autocast, as train.py calls it: the per-token losses, and the mean's
    gradients for x and the weight, against float64 on the same bf16 inputs."""
    torch.manual_seed(0)
    fn = torch.compile(kernels.head_loss, dynamic=False) if compiled else kernels.head_loss  # as train.py
    errors = {}
    for N, V, _ in SHAPES:
        x, w, t = inputs(N, V, "cuda")
        x.requires_grad_(), w.requires_grad_()
        with torch.autocast("cuda", torch.bfloat16):
            fn(x, w, t).backward()
            with torch.no_grad():
                losses = fn(x, w, t, "none")
        xd, wd = x.detach().bfloat16().double().requires_grad_(), w.detach().bfloat16().double().requires_grad_()
        exact = definition(xd @ wd.t(), t)
        (exact.sum() / (t != -1).sum()).backward()
        errors[f"{N}x{V}"] = {"loss": relative(losses, exact), "dx": relative(x.grad, xd.grad),
                              "dw": relative(w.grad, wd.grad), "ignored_loss": losses[1].item()}
    return errors


if __name__ == "__main__":
    cuda = torch.cuda.is_available()
    errors = check_head_loss() if cuda else check_kernel()
    json.dump({**errors, **check_rotary_norm("cuda" if cuda else "cpu")}, sys.stdout)
