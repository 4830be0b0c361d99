"""A GPT-2 style language model trained on random tokens: a model this project did not design, profiled the way
an outside user would (`profiling.Profiler`, or a plain torch.profiler trace for `research profile`).

Architecture, written from the published descriptions (Radford et al. 2019, "Language Models are Unsupervised
Multitask Learners", section 2.3, on top of GPT-1's decoder): learned absolute position embeddings; pre-LayerNorm
residual blocks (LayerNorm -> causal multi-head self-attention -> residual, LayerNorm -> MLP -> residual) and a
final LayerNorm; a 4x-wide MLP with GELU; biases in every linear layer and norm; the output head tied to the
token embedding; residual projections initialized with std 0.02 / sqrt(2 * layers). Attention is
torch.nn.functional.scaled_dot_product_attention(is_causal=True). Sizes: `tiny` (CPU tests) and `124m`
(GPT-2 small: 12 layers, 768 wide, 12 heads, 1024 tokens; vocab 50304, 50257 padded to a multiple of 64).

    python examples/gpt2_train.py --size tiny --steps 3 --device cpu
    python examples/gpt2_train.py --size 124m --compile --profile profiles     # report via profiling.Profiler
    python examples/gpt2_train.py --size 124m --compile --plain-trace gpt2.json  # then: research profile gpt2.json
    python examples/gpt2_train.py --size 124m --compile --plant dense_mask --profile profiles

--plant dense_mask: the causal mask as a boolean [T, T] buffer passed as attn_mask (as ports of the original
TensorFlow code and older Hugging Face code do) instead of is_causal=True: SDPA cannot use its flash kernel
for an arbitrary mask, so attention falls back to a slower one that also reads the mask.
"""
import argparse
import math
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

PLANTS = ("dense_mask",)


@dataclass
class Config:
    n_layer: int
    n_embd: int
    n_head: int
    seq_len: int
    vocab: int
    batch: int  # the default batch per step


SIZES = {
    "tiny": Config(n_layer=2, n_embd=64, n_head=4, seq_len=64, vocab=512, batch=4),
    "124m": Config(n_layer=12, n_embd=768, n_head=12, seq_len=1024, vocab=50304, batch=16),
}


class Attention(nn.Module):
    def __init__(self, cfg, dense_mask):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k and v in one GEMM
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dense_mask = dense_mask
        if dense_mask:
            mask = torch.tril(torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool))
            self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.dense_mask:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:T, :T])
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # GPT-2's GELU is the tanh approximation


class Block(nn.Module):
    def __init__(self, cfg, dense_mask):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg, dense_mask)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg, dense_mask=False):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab, cfg.n_embd),
            wpe=nn.Embedding(cfg.seq_len, cfg.n_embd),
            h=nn.ModuleList(Block(cfg, dense_mask) for _ in range(cfg.n_layer)),
            ln_f=nn.LayerNorm(cfg.n_embd),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: named_parameters lists it once, as wte
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def flops_per_token(self):
        """6 x the parameters that multiply (the position table is only read), plus causal attention's
        QK^T and AV counted in full, as nanoGPT and PaLM's MFU do: 12 x layers x width x sequence."""
        n = sum(p.numel() for p in self.parameters()) - self.transformer.wpe.weight.numel()
        return 6 * n + 12 * self.cfg.n_layer * self.cfg.n_embd * self.cfg.seq_len


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
    model = GPT2(cfg, dense_mask=args.plant == "dense_mask").to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    forward = torch.compile(model) if args.compile else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    print(f"GPT-2 {args.size}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, batch {batch} "
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
