"""A Llama style language model trained on random tokens: a model this project did not design, profiled the way
an outside user would (`profiling.Profiler`, or a plain torch.profiler trace for `research profile`).

Architecture, written from the published descriptions (Touvron et al. 2023, "LLaMA" section 2.2 and "Llama 2"
section 2.2 / appendix A.2.1): pre-normalization with RMSNorm (attention_norm, ffn_norm, a final norm); a SwiGLU
MLP, w2(silu(w1 x) * w3 x), its hidden width 2/3 of 4x rounded up to a multiple of 256 (32 for `tiny`); rotary
position embeddings on queries and keys (pairs of adjacent channels rotated, base 10000); grouped-query
attention (n_kv_heads < n_heads: each key/value head serves several query heads) through
torch.nn.functional.scaled_dot_product_attention(is_causal=True, enable_gqa=True); no biases; an output head
not tied to tok_embeddings. Module names follow Meta's reference code (tok_embeddings, layers.N.attention.wq,
feed_forward.w1, ..., output). Sizes: `tiny` (CPU tests) and `small` (~125M parameters: 12 layers, 768 wide,
12 heads, 4 key/value heads, 1024 tokens, Llama 2's vocab of 32000).

    python examples/llama_train.py --size tiny --steps 3 --device cpu
    python examples/llama_train.py --size small --compile --profile profiles     # report via profiling.Profiler
    python examples/llama_train.py --size small --compile --plain-trace llama.json  # then: research profile llama.json
    python examples/llama_train.py --size small --compile --plant repeat_kv --profile profiles

--plant repeat_kv: attention as Meta's reference inference code writes it, ported to training: the key/value
heads copied n_heads / n_kv_heads times with repeat_interleave, and an explicit float [T, T] mask of -inf
above the diagonal, built every forward, instead of is_causal=True: copies of k and v, and an attention kernel
that reads a mask (no flash kernel) instead of skipping the masked half.
"""
import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

PLANTS = ("repeat_kv",)


@dataclass
class Config:
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    seq_len: int
    vocab: int
    multiple_of: int  # the SwiGLU hidden width is rounded up to a multiple of this
    batch: int        # the default batch per step


SIZES = {
    "tiny": Config(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, seq_len=64, vocab=512, multiple_of=32, batch=4),
    "small": Config(n_layers=12, dim=768, n_heads=12, n_kv_heads=4, seq_len=1024, vocab=32000, multiple_of=256,
                    batch=16),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x.float(), (x.size(-1),), eps=self.eps).type_as(x) * self.weight  # in fp32, as Meta's


def rotary(x, cos, sin):
    """Rotate each adjacent channel pair (x[2i], x[2i+1]) of x [B, T, heads, head_dim] by position x frequency i."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg, repeat_kv):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)
        self.repeat_kv = repeat_kv

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = rotary(self.wq(x).view(B, T, self.n_heads, self.head_dim), cos, sin).transpose(1, 2)
        k = rotary(self.wk(x).view(B, T, self.n_kv_heads, self.head_dim), cos, sin).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.repeat_kv:
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            mask = torch.full((T, T), float("-inf"), device=x.device).triu(1).to(q.dtype)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hidden = int(2 * 4 * cfg.dim / 3)
        hidden = cfg.multiple_of * -(-hidden // cfg.multiple_of)
        self.w1 = nn.Linear(cfg.dim, hidden, bias=False)  # gate
        self.w2 = nn.Linear(hidden, cfg.dim, bias=False)  # down
        self.w3 = nn.Linear(cfg.dim, hidden, bias=False)  # up

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg, repeat_kv):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim)
        self.attention = Attention(cfg, repeat_kv)
        self.ffn_norm = RMSNorm(cfg.dim)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg, repeat_kv=False, theta=10000.0):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg, repeat_kv) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        head_dim = cfg.dim // cfg.n_heads
        freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(cfg.seq_len).float(), freqs)[:, None, :]  # [T, 1 (heads), head_dim / 2]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets):
        T = tokens.size(1)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.cos[:T], self.sin[:T])
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def flops_per_token(self):
        """6 x the parameters that multiply (the token table is only read; the untied output head multiplies),
        plus causal attention's QK^T and AV counted in full, as PaLM's MFU does: 12 x layers x width x sequence."""
        n = sum(p.numel() for p in self.parameters()) - self.tok_embeddings.weight.numel()
        return 6 * n + 12 * self.cfg.n_layers * self.cfg.dim * self.cfg.seq_len


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=SIZES, default="tiny")
    p.add_argument("--steps", type=int, default=20, help="training steps (a profile runs as many as it needs)")
    p.add_argument("--batch", type=int, help="sequences per step (default: the size's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--plant", choices=PLANTS, help="a planted slowdown (see the module docstring)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--profile", metavar="DIR", help="profile through profiling.Profiler into DIR; print the report")
    out.add_argument("--plain-trace", metavar="FILE", help="write a plain torch.profiler Chrome trace to FILE")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps needs 1 or more")
    return args


def plain_profiler(path, device):
    """torch.profiler as its tutorials set it up, nothing of this project's."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities, schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(path), record_shapes=True, with_stack=True)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    device = torch.device(args.device)
    cfg = SIZES[args.size]
    batch = args.batch or cfg.batch
    model = Llama(cfg, repeat_kv=args.plant == "repeat_kv").to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    forward = torch.compile(model) if args.compile else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    print(f"Llama {args.size}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, batch {batch} "
          f"x {cfg.seq_len} tokens on {device}" + (", compiled" if args.compile else "")
          + (f", planted {args.plant}" if args.plant else ""))

    prof, trace, steps = None, None, args.steps
    if args.profile:
        import profiling  # created before the first compiled call, so compiled kernels keep their lines
        prof = profiling.Profiler(model, tokens_per_step=batch * cfg.seq_len,
                                  flops_per_token=model.flops_per_token(), out_dir=args.profile)
        steps = max(steps, prof.total_steps)
    elif args.plain_trace:
        trace = plain_profiler(args.plain_trace, device)
        trace.start()
        steps = max(steps, 5)  # wait 1 + warmup 1 + active 3
    timed_from = steps // 2  # the first half warms up (compilation, autotuning, the allocator)

    for step in range(steps):
        if step == timed_from:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        tokens = torch.randint(cfg.vocab, (batch, cfg.seq_len + 1), device=device)
        with autocast:
            loss = forward(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if prof:
            prof.step()
            if prof.done:
                break
        if trace:
            trace.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t0) / (step + 1 - timed_from)
    if trace:
        trace.stop()
        print(f"plain trace: {args.plain_trace}")
    print(f"loss {loss.item():.4f} after {step + 1} steps; {ms:.2f} ms/step over the last {step + 1 - timed_from}")
    if prof:
        prof.close()  # a loop that ended first: the report of what was recorded (a no-op once done)
        print(prof.report)


if __name__ == "__main__":
    main()
