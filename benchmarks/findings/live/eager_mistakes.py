"""Mistakes real eager training loops make, each profiled and each fix timed (issue #56).

Twelve loops, each one common mistake (from forum threads, issues and tutorials) in an otherwise healthy
CUDA loop, and its fix. For each case, one fresh process runs the mistake: warm-up, its unprofiled step timed,
then the profile (profiling.Profiler's defaults) whose trace and report come back; a second fresh process
times the fix. The claim of the report's top finding is then held against what the fix recovered
(`report` below, on any machine, from the traces brought back).

    mistake                 the loop does                                        the fix
    ema_state_dict          timm ModelEmaV2's update: a Python loop over          torch._foreach_lerp_ over
                            state_dict() values, ema = ema*d + (1-d)*p            the parameters
    param_group_each        layer-wise lr decay with one param group per tensor   one group per lr (per layer)
    grad_norm_loop          the gradient norm for the log: sum over parameters    torch.nn.utils.get_total_norm
                            of (g**2).sum(), then .item()                         (foreach), .item() as before
    per_sample_loss         a loss per sample in a Python loop, stacked, mean     one cross_entropy over the batch
    item_per_sample         accuracy counted with .item() per sample              (pred == y).sum() on the device,
                                                                                  read once a step
    empty_cache             torch.cuda.empty_cache() after every step             not called
    host_gather             the batch gathered on the host from a CPU tensor      the set kept on the GPU, indexed
                            set (torch.stack of rows), then .cuda()               there
    lstm_cell_loop          nn.LSTMCell stepped over the sequence in Python       nn.LSTM (cuDNN) over it at once
    heads_loop              attention as a ModuleList of heads, each called in    the heads' weights in one
                            a Python loop (the way tutorials write it)            matmul, all heads at once
    fp32                    a transformer trained in float32                      bf16 autocast
    mask_on_host            a causal mask built on the CPU in each attention      built once, a buffer on the GPU
                            forward, then .to(device)
    cudnn_benchmark_varlen  a Conv1d net on a new input length every step with    cudnn.benchmark off
                            cudnn.benchmark=True

Ten more are held out (`--cases heldout`): written after the rules were tuned on the twelve, never tuned
against, each with the finding that would name it written down before its first run (HELD_OUT_EXPECTED):

    randn_on_host           a denoiser's noise drawn on the CPU, then copied       torch.randn_like on the GPU
    bool_mask_loss          padding dropped from the loss by boolean indexing      cross_entropy(ignore_index=-100)
    metric_on_cpu           a numpy confusion matrix fed each step's predictions   index_put_ into a GPU tensor
    manual_attention        causal attention written out (scores, mask, softmax)   F.scaled_dot_product_attention
    clamp_grad_loop         p.grad.data.clamp_ per parameter (the DQN tutorial)    clip_grad_value_ (foreach)
    onehot_smoothing        label smoothing through one_hot over 32k classes       cross_entropy(label_smoothing)
    char_encode_in_step     each batch encoded from text, character by character   the text encoded once, on the GPU

and three more, written after the first seven's fixes (the second batch):

    sync_timing             torch.cuda.synchronize() around each step, to time it  CUDA events, read every 20 steps
    eval_every_step         a validation batch's loss every step, for the log      every 50 steps
    model_to_each_step      model.to(device) and model.train() inside the step     called once, before the loop

    python3 benchmarks/findings/live/eager_mistakes.py run OUT [--cases ...]     # the GPU (one call)
    uv run python benchmarks/findings/live/eager_mistakes.py report OUT            # anywhere: the table

`run` writes OUT/results.jsonl (a line per process: case, variant, ms/step of each timed rep) and, for each
mistake, the profile's folder (trace, report.md, summary.json) as <case>/ in OUT/profiles-N.tar (four cases
each; `tar xf` them before `report`). On a CPU it runs small.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
WARMUP, STEPS, REPS, REP_S = 10, 20, 5, 4.0
VARIANTS = ("mistake", "fix", "compiled", "batch2", "threads1")
BATCH_X = [1]  # "batch2": the Lm loops' batch doubled, the mistake kept (launch_bound's other remedy)
# the finding that names each case's mistake at its line (what the report should lead with)
MECHANISM = {"ema_state_dict": "per_parameter_loop", "param_group_each": "per_parameter_loop",
             "grad_norm_loop": "per_parameter_loop", "per_sample_loss": "python_loop", "item_per_sample": "python_loop",
             "empty_cache": "alloc_churn", "host_gather": "python_loop", "lstm_cell_loop": "python_loop",
             "heads_loop": "python_loop", "fp32": "fp32_matmul", "mask_on_host": "host_tensor",
             "cudnn_benchmark_varlen": "alloc_churn"}


def _torch():
    import torch
    return torch, torch.nn, torch.nn.functional


def blocks(depth, width, heads=8):
    """A pre-norm transformer encoder (torch's own layer), as many small tensors as a real one."""
    torch, nn, _ = _torch()
    layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)


# GPT-2 small's width and depth at 16 x 512 tokens: an eager step whose kernels keep an H200 about as busy as its
# host is launching them (the float32 case's bf16 fix, 8 such layers: 19.6 ms/step), so that a mistake's host
# work is what the step waits on. The per-parameter cases' first round (eager_mistakes_results.md) ran width 256
# at 16 x 128 tokens, a model launch-bound on its own.
GPT2S = dict(depth=12, width=768, batch=16, seq=512)


class Lm:
    """A token model: embedding, blocks, head. `step()` trains one batch."""

    def __init__(self, dev, depth=8, width=256, vocab=8192, batch=16, seq=128, dtype_bf16=True, lr_groups=None):
        torch, nn, F = _torch()
        torch.manual_seed(0)
        batch *= BATCH_X[0]
        self.dev, self.batch, self.seq, self.vocab, self.bf16 = dev, batch, seq, vocab, dtype_bf16
        self.model = nn.Sequential(nn.Embedding(vocab, width), blocks(depth, width), nn.LayerNorm(width),
                                   nn.Linear(width, vocab)).to(dev)
        self.opt = torch.optim.AdamW(lr_groups(self.model) if lr_groups else self.model.parameters(), lr=1e-4)
        self.x = torch.randint(0, vocab, (batch, seq), device=dev)
        self.y = torch.randint(0, vocab, (batch, seq), device=dev)

    def loss(self):
        torch, _, F = _torch()
        with torch.autocast(self.dev, torch.bfloat16, enabled=self.bf16):
            logits = self.model(self.x)
        return F.cross_entropy(logits.float().view(-1, self.vocab), self.y.view(-1))

    def update(self, loss):
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------------------------
# The cases: build(variant, dev) -> (step function, model, tokens per step)
# ---------------------------------------------------------------------------------------------------------

def ema_state_dict(variant, dev):
    torch, _, _ = _torch()
    import copy
    lm = Lm(dev, **GPT2S)
    ema = copy.deepcopy(lm.model).requires_grad_(False)
    decay = 0.999
    ema_params, params = list(ema.parameters()), list(lm.model.parameters())

    def step():
        lm.update(lm.loss())
        with torch.no_grad():
            if variant == "mistake":
                for ema_v, model_v in zip(ema.state_dict().values(), lm.model.state_dict().values()):
                    ema_v.copy_(ema_v * decay + (1.0 - decay) * model_v)
            else:
                torch._foreach_lerp_(ema_params, params, 1.0 - decay)
    return step, lm.model, lm.batch * lm.seq


def param_group_each(variant, dev):
    torch, _, _ = _torch()
    base, decay = 1e-4, 0.9

    def depth_of(name):
        parts = name.split(".")
        return int(parts[2]) + 1 if parts[0] == "1" and len(parts) > 2 and parts[2].isdigit() else (
            0 if parts[0] == "0" else 13)

    def groups(model):
        named = list(model.named_parameters())
        if variant == "mistake":
            return [{"params": [p], "lr": base * decay ** (13 - depth_of(n))} for n, p in named]
        by = {}
        for n, p in named:
            by.setdefault(depth_of(n), []).append(p)
        return [{"params": ps, "lr": base * decay ** (13 - d)} for d, ps in sorted(by.items())]
    lm = Lm(dev, **GPT2S, lr_groups=groups)

    def step():
        lm.update(lm.loss())
    return step, lm.model, lm.batch * lm.seq


def grad_norm_loop(variant, dev):
    torch, _, _ = _torch()
    lm = Lm(dev, **GPT2S)
    params = list(lm.model.parameters())
    log = []

    def step():
        loss = lm.loss()
        loss.backward()
        if variant == "mistake":
            norm = torch.sqrt(sum((p.grad ** 2).sum() for p in lm.model.parameters()))
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        log.append(norm.item())
        lm.opt.step()
        lm.opt.zero_grad(set_to_none=True)
    return step, lm.model, lm.batch * lm.seq


def _classifier(dev, classes=100, batch=512, width=512):
    torch, nn, _ = _torch()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                          nn.Linear(width, classes)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 256, device=dev)
    y = torch.randint(0, classes, (batch,), device=dev)
    return model, opt, x, y


def per_sample_loss(variant, dev):
    torch, _, F = _torch()
    model, opt, x, y = _classifier(dev)

    def step():
        with torch.autocast(dev, torch.bfloat16):
            logits = model(x)
        if variant == "mistake":
            loss = torch.stack([F.cross_entropy(logits[i].float(), y[i]) for i in range(len(y))]).mean()
        else:
            loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, model, None


def item_per_sample(variant, dev):
    torch, _, F = _torch()
    model, opt, x, y = _classifier(dev)
    seen = {"correct": 0}

    def step():
        with torch.autocast(dev, torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        pred = logits.argmax(-1)
        if variant == "mistake":
            seen["correct"] += sum(int(p.item() == t.item()) for p, t in zip(pred, y))
        else:
            seen["correct"] += int((pred == y).sum().item())
    return step, model, None


def empty_cache(variant, dev):
    torch, _, _ = _torch()
    lm = Lm(dev, **GPT2S)

    def step():
        lm.update(lm.loss())
        if variant == "mistake" and dev == "cuda":
            torch.cuda.empty_cache()
    return step, lm.model, lm.batch * lm.seq


def host_gather(variant, dev):
    torch, nn, F = _torch()
    torch.manual_seed(0)
    images = torch.randint(0, 256, (20000, 3, 32, 32), dtype=torch.uint8)
    labels = torch.randint(0, 10, (20000,))

    def conv(cin, cout, stride=1):
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
    model = nn.Sequential(*conv(3, 64), *conv(64, 128, 2), *conv(128, 128), *conv(128, 256, 2), *conv(256, 256),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))
    model = model.to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    on_device = (images.to(dev), labels.to(dev))
    g = torch.Generator().manual_seed(0)

    def step():
        idx = torch.randint(0, len(images), (256,), generator=g)
        if variant == "mistake":
            xb = torch.stack([images[i] for i in idx]).to(dev).float().div_(255)
            yb = torch.stack([labels[i] for i in idx]).to(dev)
        else:
            idx = idx.to(dev, non_blocking=True)
            xb, yb = on_device[0][idx].float().div_(255), on_device[1][idx]
        with torch.autocast(dev, torch.bfloat16):
            loss = F.cross_entropy(model(xb.contiguous(memory_format=torch.channels_last)), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, model, None


def lstm_cell_loop(variant, dev):
    torch, nn, F = _torch()
    torch.manual_seed(0)
    vocab, width, batch, seq = 4096, 512, 64, 64
    emb, head = nn.Embedding(vocab, width).to(dev), nn.Linear(width, vocab).to(dev)
    cell = nn.LSTMCell(width, width).to(dev)
    lstm = nn.LSTM(width, width, batch_first=True).to(dev)
    with torch.no_grad():  # the same weights either way
        lstm.weight_ih_l0.copy_(cell.weight_ih), lstm.weight_hh_l0.copy_(cell.weight_hh)
        lstm.bias_ih_l0.copy_(cell.bias_ih), lstm.bias_hh_l0.copy_(cell.bias_hh)
    rnn = cell if variant == "mistake" else lstm
    model = nn.ModuleList([emb, rnn, head])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, vocab, (batch, seq), device=dev)
    y = torch.randint(0, vocab, (batch, seq), device=dev)

    def step():
        e = emb(x)
        if variant == "mistake":
            h = c = torch.zeros(batch, width, device=dev)
            outs = []
            for t in range(seq):
                h, c = cell(e[:, t], (h, c))
                outs.append(h)
            out = torch.stack(outs, 1)
        else:
            out, _ = lstm(e)
        loss = F.cross_entropy(head(out).view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, model, batch * seq


def heads_loop(variant, dev):
    torch, nn, F = _torch()
    torch.manual_seed(0)
    vocab, width, heads, depth, batch, seq = 8192, 384, 6, 6, 32, 256
    size = width // heads

    class Head(nn.Module):  # one attention head, as a ModuleList of them is often written
        def __init__(self):
            super().__init__()
            self.key, self.query, self.value = (nn.Linear(width, size, bias=False) for _ in range(3))

        def forward(self, x):
            k, q, v = self.key(x), self.query(x), self.value(x)
            w = (q @ k.transpose(-2, -1)) * size ** -0.5
            w = w.masked_fill(causal[:x.shape[1], :x.shape[1]], float("-inf")).softmax(-1)
            return w @ v

    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads, self.proj = nn.ModuleList(Head() for _ in range(heads)), nn.Linear(width, width)

        def forward(self, x):
            if variant == "mistake":
                return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))
            b, t, _ = x.shape  # the same heads' weights, all at once
            w = lambda name: torch.cat([getattr(h, name).weight for h in self.heads])
            q, k, v = (F.linear(x, w(n)).view(b, t, heads, size).transpose(1, 2) for n in ("query", "key", "value"))
            a = ((q @ k.transpose(-2, -1)) * size ** -0.5).masked_fill(causal[:t, :t], float("-inf")).softmax(-1)
            return self.proj((a @ v).transpose(1, 2).reshape(b, t, width))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2, self.attn = nn.LayerNorm(width), nn.LayerNorm(width), Heads()
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width))

        def forward(self, x):
            x = x + self.attn(self.n1(x))
            return x + self.mlp(self.n2(x))

    causal = torch.ones(seq, seq, dtype=torch.bool, device=dev).triu(1)
    model = nn.Sequential(nn.Embedding(vocab, width), *[Block() for _ in range(depth)], nn.LayerNorm(width),
                          nn.Linear(width, vocab)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x = torch.randint(0, vocab, (batch, seq), device=dev)
    y = torch.randint(0, vocab, (batch, seq), device=dev)

    def step():
        with torch.autocast(dev, torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, model, batch * seq


def fp32(variant, dev):
    lm = Lm(dev, depth=8, width=768, batch=16, seq=512, dtype_bf16=variant != "mistake")

    def step():
        lm.update(lm.loss())
    return step, lm.model, lm.batch * lm.seq


def _attention_lm(attention, dev, vocab, width, depth, batch, seq, fused=False):
    """(step, model, tokens per step) of a pre-norm transformer LM whose blocks use `attention` (a module class
    taking no arguments), trained by AdamW under bf16 autocast on one random batch."""
    torch, nn, F = _torch()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2, self.attn = nn.LayerNorm(width), nn.LayerNorm(width), attention()
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x):
            x = x + self.attn(self.n1(x))
            return x + self.mlp(self.n2(x))

    model = nn.Sequential(nn.Embedding(vocab, width), *[Block() for _ in range(depth)], nn.LayerNorm(width),
                          nn.Linear(width, vocab)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    x = torch.randint(0, vocab, (batch, seq), device=dev)
    y = torch.randint(0, vocab, (batch, seq), device=dev)

    def step():
        with torch.autocast(dev, torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, model, batch * seq


def mask_on_host(variant, dev):
    torch, nn, F = _torch()
    torch.manual_seed(0)
    vocab, width, heads, depth, batch, seq = 8192, 256, 8, 12, 16, 512

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, -1).permute(2, 0, 3, 1, 4)
            if variant == "mistake":
                mask = torch.tril(torch.ones(t, t, dtype=torch.bool)).to(x.device)
            else:
                mask = self.mask[:t, :t]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.out(y.transpose(1, 2).reshape(b, t, width))

    return _attention_lm(Attention, dev, vocab, width, depth, batch, seq)


def cudnn_benchmark_varlen(variant, dev):
    torch, nn, F = _torch()
    torch.backends.cudnn.benchmark = variant == "mistake"
    torch.manual_seed(0)
    chans = 256
    layers = [nn.Conv1d(80, chans, 5, padding=2), nn.GELU()]
    for _ in range(6):
        layers += [nn.Conv1d(chans, chans, 5, padding=2), nn.BatchNorm1d(chans), nn.GELU()]
    model = nn.Sequential(*layers, nn.Conv1d(chans, 32, 1)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)

    def step():
        frames = int(torch.randint(200, 1600, (1,), generator=g))  # an utterance batch of a new length
        x = torch.randn(16, 80, frames, device=dev)
        y = torch.randint(0, 32, (16, frames), device=dev)
        with torch.autocast(dev, torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, model, None


CASES = {f.__name__: f for f in (ema_state_dict, param_group_each, grad_norm_loop, per_sample_loss, item_per_sample,
                                 empty_cache, host_gather, lstm_cell_loop, heads_loop, fp32, mask_on_host,
                                 cudnn_benchmark_varlen)}


# ---------------------------------------------------------------------------------------------------------
# Held out: seven more mistakes, written after the rules above were tuned and never tuned against (the rules'
# test of a model and a slowdown nobody planted for them). Each mistake's line carries `# MISTAKE`, so `report`
# can say whether the top finding names it; HELD_OUT_EXPECTED, written before their first run, is the finding
# kind that would name each one's mechanism.
# ---------------------------------------------------------------------------------------------------------

def randn_on_host(variant, dev):
    """A denoiser's training step (diffusion tutorials): the noise drawn on the CPU, then copied."""
    torch, nn, F = _torch()
    torch.manual_seed(0)
    dim, batch = 3 * 32 * 32, 512
    model = nn.Sequential(nn.Linear(dim + 1, 2048), nn.SiLU(), nn.Linear(2048, 2048), nn.SiLU(),
                          nn.Linear(2048, dim)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x0 = torch.randn(batch, dim, device=dev)

    def step():
        t = torch.rand(batch, 1, device=dev)
        if variant == "mistake":
            noise = torch.randn(x0.shape).to(dev)  # MISTAKE
        else:
            noise = torch.randn_like(x0)
        xt = (1 - t).sqrt() * x0 + t.sqrt() * noise
        with torch.autocast(dev, torch.bfloat16):
            pred = model(torch.cat([xt, t], 1))
        loss = F.mse_loss(pred.float(), noise)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, model, None


def bool_mask_loss(variant, dev):
    """Padding left out of the loss by boolean indexing (a size the host must read) where ignore_index does it."""
    torch, _, F = _torch()
    lm = Lm(dev)
    y = lm.y.clone()
    y[:, -lm.seq // 8:] = -100  # the padded tail of each sequence

    def step():
        with torch.autocast(dev, torch.bfloat16):
            logits = lm.model(lm.x).float().view(-1, lm.vocab)
        if variant == "mistake":
            keep = y.view(-1) != -100
            loss = F.cross_entropy(logits[keep], y.view(-1)[keep])  # MISTAKE
        else:
            loss = F.cross_entropy(logits, y.view(-1), ignore_index=-100)
        lm.update(loss)
    return step, lm.model, lm.batch * lm.seq


def metric_on_cpu(variant, dev):
    """A confusion matrix kept in numpy, each step's predictions copied to the host for it."""
    torch, _, F = _torch()
    import numpy as np
    classes = 100
    model, opt, x, y = _classifier(dev, classes=classes, batch=2048, width=1024)
    confusion = {"host": np.zeros((classes, classes), dtype=np.int64),
                 "device": torch.zeros(classes * classes, dtype=torch.int64, device=dev)}
    ones = torch.ones(len(y), dtype=torch.int64, device=dev)  # (torch.bincount would sync: it reads its max)

    def step():
        with torch.autocast(dev, torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        pred = logits.argmax(-1)
        if variant == "mistake":
            np.add.at(confusion["host"], (y.cpu().numpy(), pred.cpu().numpy()), 1)  # MISTAKE
        else:
            confusion["device"].index_put_((y * classes + pred,), ones, accumulate=True)
    return step, model, None


def manual_attention(variant, dev):
    """Causal attention written out (scores, mask, softmax, weighted sum), as tutorials teach it."""
    torch, nn, F = _torch()
    torch.manual_seed(0)
    vocab, width, heads, depth, batch, seq = 8192, 768, 12, 6, 8, 1024

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq), persistent=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, -1).permute(2, 0, 3, 1, 4)
            if variant == "mistake":
                att = (q @ k.transpose(-2, -1)) * (1.0 / (width // heads) ** 0.5)  # MISTAKE
                att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))  # MISTAKE
                y = F.softmax(att, dim=-1) @ v  # MISTAKE
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, width))

    return _attention_lm(Attention, dev, vocab, width, depth, batch, seq, fused=dev == "cuda")


def clamp_grad_loop(variant, dev):
    """Gradients clipped by value in a loop over the parameters (PyTorch's DQN tutorial writes it so)."""
    torch, _, _ = _torch()
    lm = Lm(dev, **GPT2S)

    def step():
        lm.loss().backward()
        if variant == "mistake":
            for p in lm.model.parameters():
                p.grad.data.clamp_(-1, 1)  # MISTAKE
        else:
            torch.nn.utils.clip_grad_value_(lm.model.parameters(), 1.0)
        lm.opt.step()
        lm.opt.zero_grad(set_to_none=True)
    return step, lm.model, lm.batch * lm.seq


def onehot_smoothing(variant, dev):
    """Label smoothing written out with one_hot over a 32k vocabulary, where cross_entropy takes label_smoothing."""
    torch, _, F = _torch()
    lm = Lm(dev, depth=4, width=512, vocab=32768, batch=16, seq=256)
    eps, v = 0.1, lm.vocab

    def step():
        with torch.autocast(dev, torch.bfloat16):
            logits = lm.model(lm.x).float().view(-1, v)
        if variant == "mistake":
            target = F.one_hot(lm.y.view(-1), v).float() * (1 - eps) + eps / v  # MISTAKE
            loss = -(target * F.log_softmax(logits, -1)).sum(-1).mean()  # MISTAKE
        else:
            loss = F.cross_entropy(logits, lm.y.view(-1), label_smoothing=eps)
        lm.update(loss)
    return step, lm.model, lm.batch * lm.seq


def char_encode_in_step(variant, dev):
    """A character model whose batch is encoded from text inside the step, character by character."""
    torch, _, F = _torch()
    g = torch.Generator().manual_seed(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz .,;\n"
    text = "".join(alphabet[i] for i in torch.randint(0, len(alphabet), (400_000,), generator=g).tolist())
    stoi = {c: i for i, c in enumerate(alphabet)}
    lm = Lm(dev, depth=6, width=384, vocab=len(alphabet), batch=32, seq=256)
    data = torch.tensor([stoi[c] for c in text], device=dev)
    span = torch.arange(lm.seq + 1, device=dev)

    def encode(chunk):
        return torch.tensor([stoi[c] for c in chunk])  # MISTAKE (called by the step's line below)

    def step():
        starts = torch.randint(0, len(text) - lm.seq - 1, (lm.batch,), generator=g)
        if variant == "mistake":
            rows = torch.stack([encode(text[i:i + lm.seq + 1]) for i in starts.tolist()]).to(dev)  # MISTAKE
        else:
            rows = data[starts.to(dev)[:, None] + span]
        lm.x, lm.y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        lm.update(lm.loss())
    return step, lm.model, lm.batch * lm.seq


def sync_timing(variant, dev):
    """Each step timed with torch.cuda.synchronize() around it, for a log of step times (the fix: CUDA events,
    read once per 20 steps)."""
    torch, _, _ = _torch()
    lm = Lm(dev, **GPT2S)
    times, events = [], []

    def step():
        if variant == "mistake":
            if dev == "cuda":
                torch.cuda.synchronize()  # MISTAKE
            t = time.perf_counter()
            lm.update(lm.loss())
            if dev == "cuda":
                torch.cuda.synchronize()  # MISTAKE
            times.append(time.perf_counter() - t)
        else:
            start = end = None
            if dev == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            lm.update(lm.loss())
            if dev == "cuda":
                end.record()
                events.append((start, end))
            if len(events) >= 20:  # read when the log needs them, long after they ran
                times.extend(a.elapsed_time(b) for a, b in events[:-1])
                del events[:-1]
    return step, lm.model, lm.batch * lm.seq


def eval_every_step(variant, dev):
    """A validation batch's loss computed every step for the log (the fix: every 50 steps)."""
    torch, _, _ = _torch()
    lm = Lm(dev, **GPT2S)
    x_val = torch.randint(0, lm.vocab, (lm.batch, lm.seq), device=dev)
    y_val = torch.randint(0, lm.vocab, (lm.batch, lm.seq), device=dev)
    seen, log = [0], []

    def step():
        lm.update(lm.loss())
        seen[0] += 1
        if variant == "mistake" or seen[0] % 50 == 0:
            with torch.no_grad():
                x, y = lm.x, lm.y
                lm.x, lm.y = x_val, y_val
                log.append(lm.loss())  # MISTAKE
                lm.x, lm.y = x, y
    return step, lm.model, lm.batch * lm.seq


def model_to_each_step(variant, dev):
    """model.to(device) and model.train() called inside the step, as some tutorials' loops do."""
    torch, _, _ = _torch()
    lm = Lm(dev, **GPT2S)

    def step():
        if variant == "mistake":
            lm.model.to(dev)  # MISTAKE
            lm.model.train()  # MISTAKE
        lm.update(lm.loss())
    return step, lm.model, lm.batch * lm.seq


HELD_OUT = (randn_on_host, bool_mask_loss, metric_on_cpu, manual_attention, clamp_grad_loop, onehot_smoothing,
            char_encode_in_step, sync_timing, eval_every_step, model_to_each_step)
HELD_OUT_EXPECTED = {"randn_on_host": "host_tensor", "bool_mask_loss": "host_sync", "metric_on_cpu": "host_sync",
                     "manual_attention": "math_attention", "clamp_grad_loop": "per_parameter_loop",
                     "onehot_smoothing": "eager_code", "char_encode_in_step": "host_tensor",
                     # the second batch (2026-11-29, after the first batch's fixes)
                     "sync_timing": "cuda_sync", "eval_every_step": "forward_without_backward",
                     "model_to_each_step": "gpu_waits_on_host"}
PLANTED = list(CASES)
CASES.update((f.__name__, f) for f in HELD_OUT)
MECHANISM.update(HELD_OUT_EXPECTED)


# ---------------------------------------------------------------------------------------------------------
# One process: time a variant, profile the mistake
# ---------------------------------------------------------------------------------------------------------

def sync(dev):
    torch, _, _ = _torch()
    if dev == "cuda":
        torch.cuda.synchronize()


def timed(step, dev, reps=REPS, steps=STEPS, cap_s=REP_S):
    """ms/step of each rep: `steps` steps between two syncs, fewer where they would take over cap_s."""
    out = []
    for _ in range(reps):
        sync(dev)
        t, n = time.perf_counter(), 0
        while n < steps and (n < 3 or time.perf_counter() - t < cap_s):
            step()
            n += 1
        sync(dev)
        out.append(round((time.perf_counter() - t) / n * 1e3, 3))
    return out


def one(case, variant, out, profile):
    torch, _, _ = _torch()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    BATCH_X[0] = 2 if variant == "batch2" else 1
    if variant == "threads1":  # the mistake kept, one intra-op thread for the host's CPU operators
        torch.set_num_threads(1)
    step, model, tokens = CASES[case]("mistake" if variant in ("compiled", "batch2", "threads1") else variant, dev)
    if variant == "compiled":  # the mistake kept, the model compiled: what launch_bound's remedy recovers
        # not model.compile(): on torch 2.11 it leaves a built-in container (nn.Sequential) uncompiled, with no
        # word (pytorch/pytorch#150915: its _call_impl and forward are both in Dynamo's skip files)
        model.forward = torch.compile(model.forward)
    t = time.perf_counter()
    step()
    sync(dev)
    first = time.perf_counter() - t  # the first step: a compile's time where the variant compiles
    for _ in range(WARMUP - 1):
        step()
    row = {"case": case, "variant": variant, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "first_step_s": round(first, 2), "ms": timed(step, dev), "batch_x": BATCH_X[0]}
    if profile:
        sys.path.insert(0, ROOT)
        import profiling
        work = os.path.join(tempfile.gettempdir(), "eager-mistakes", case)
        prof = profiling.Profiler(model, tokens_per_step=tokens, out_dir=work)
        while not prof.done:
            step()
            prof.step()
        shutil.copytree(prof.folder, os.path.join(out, case), dirs_exist_ok=True)
        top = (prof.summary or {}).get("findings") or []
        row["top"] = [{k: f.get(k) for k in ("kind", "ms_per_step", "evidence", "fix")} for f in top[:3]]
        row["profiled_ms"] = (prof.summary or {}).get("step_ms")
        row["ms_after"] = timed(step, dev, reps=1)
    return row


def run(out, cases, timeout, budget, variants=("mistake", "fix"), profile=True, rounds=1):
    """Each case's variants in fresh processes, `rounds` times over, alternated (mistake, fix, mistake, fix...):
    a host whose pace drifts between processes moves both alike. The mistake is profiled in the first round."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.jsonl")
    start = time.perf_counter()
    for case in cases:
        if time.perf_counter() - start > budget:
            print(f"budget of {budget:g} s spent: {case} and after not run", flush=True)
            break
        for r, variant in ((r, v) for r in range(rounds) for v in variants):
            t = time.perf_counter()
            cmd = [sys.executable, os.path.abspath(__file__), "one", case, variant, out] + (
                ["--profile"] if variant == "mistake" and profile and r == 0 else [])
            try:
                p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
                lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
                row = json.loads(lines[-1]) if p.returncode == 0 and lines else {
                    "case": case, "variant": variant, "failed": p.returncode, "stderr": p.stderr[-2000:]}
            except subprocess.TimeoutExpired:
                row = {"case": case, "variant": variant, "failed": "timeout"}
            row["seconds"], row["round"] = round(time.perf_counter() - t, 1), r
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({k: row.get(k) for k in ("case", "variant", "round", "ms", "profiled_ms", "failed",
                                                      "seconds")}), flush=True)
            if row.get("top"):
                print("   top:", row["top"][0]["kind"], row["top"][0]["ms_per_step"], flush=True)
    made = [case for case in cases if os.path.isdir(os.path.join(out, case))]
    for k in range(0, len(made), 4):  # few files, each under 16 MiB: a device call returns no more
        with tarfile.open(os.path.join(out, f"profiles-{k // 4 + 1}.tar"), "w") as tar:
            for case in made[k:k + 4]:
                tar.add(os.path.join(out, case), arcname=case)
                shutil.rmtree(os.path.join(out, case))


# ---------------------------------------------------------------------------------------------------------
# The table, from what a run brought back (the claims re-read from the traces with today's rules)
# ---------------------------------------------------------------------------------------------------------

def rows(out, timings=()):
    """{case: {variant: [the rows of its processes]}}: OUT's results.jsonl, or, given, the raw timing files pooled
    (each case's variants from all of them: more processes against the host's drift)."""
    by = {}
    for path in timings or (os.path.join(out, "results.jsonl"),):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                by.setdefault(r["case"], {}).setdefault(r["variant"], []).append(r)
    return by


def ms_of(processes):
    """A variant's ms/step: the median over its processes of each one's median rep (None: none ran)."""
    each = [statistics.median(r["ms"]) for r in processes if r.get("ms")]
    return statistics.median(each) if each else None


def mistake_lines(case):
    """The source of the lines a case marks `# MISTAKE` (the held-out cases mark theirs), as reports quote them."""
    import inspect
    return [text.strip() for text in inspect.getsource(CASES[case]).splitlines() if "# MISTAKE" in text]


def names_mistake(case, finding):
    """Whether a finding's words quote one of the case's `# MISTAKE` lines (by their text, which a trace keeps
    as recorded: their numbers move with any edit above them)."""
    words = f"{finding.get('evidence', '')} {finding.get('fix', '')}"
    return any(f"`{text}`" in words for text in mistake_lines(case))


def report(out, timings=()):
    """The table: each case's gain against the report's top finding and the finding of its mistake (MECHANISM);
    where the run timed the model compiled with the mistake kept, what that recovered (launch_bound's remedy).
    `timings`: raw .jsonl files whose processes give the gains instead of OUT's (the traces stay OUT's)."""
    sys.path.insert(0, ROOT)
    from profiling.profile.report.ranks import summarize_path
    lines = ["| case | mistake ms/step | fix ms/step | gain | top finding: claim (claim / gain) [its line: names a "
             "`# MISTAKE` line] | the mistake's "
             "finding (rank): claim (claim / gain) | compiled, mistake kept: recovered |",
             "|---|--:|--:|--:|---|---|--:|"]
    for case, r in rows(out, timings).items():
        before, after = ms_of(r.get("mistake", ())), ms_of(r.get("fix", ()))
        traces = glob.glob(os.path.join(out, case, "*.json.gz"))
        if before is None or after is None or not traces:
            lines.append(f"| {case} | failed | | | | | |")
            continue
        gain, compiled = before - after, ms_of(r.get("compiled", ()))
        found = summarize_path(traces[0])["findings"]

        def said(f, gain=gain):
            return f"{f['kind']}: {f['ms_per_step']:.1f} ({f['ms_per_step'] / gain:.2f})" if f else "-"
        rank, line = next(((i + 1, f) for i, f in enumerate(found) if f["kind"] == MECHANISM[case]), (None, None))
        top = said(found[0] if found else None) + (" [its line]" if found and names_mistake(case, found[0]) else "")
        lines.append(f"| {case} | {before:.1f} | {after:.1f} | {gain:.1f} | {top} | "
                     + (f"({rank}) {said(line)}" if line else "-")
                     + (f" | {before - compiled:.1f} |" if compiled is not None else " | |"))
    print("\n".join(lines))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="every case: the mistake timed and profiled, the fix timed")
    r.add_argument("out")
    r.add_argument("--cases", nargs="+", choices=list(CASES) + ["heldout"], default=PLANTED,
                   help="the cases (default: the twelve planted ones); heldout: the ten held out")
    r.add_argument("--timeout", type=float, default=150, help="seconds a process may run")
    r.add_argument("--budget", type=float, default=480, help="seconds after which no case starts")
    r.add_argument("--variants", nargs="+", choices=VARIANTS, default=["mistake", "fix"],
                   help="compiled: the mistake kept, the model's forward compiled (torch.compile); batch2: the mistake kept, "
                   "the batch doubled (the cases built on Lm); threads1: the mistake kept, torch.set_num_threads(1)")
    r.add_argument("--no-profile", action="store_true", help="time only")
    r.add_argument("--rounds", type=int, default=1,
                   help="each variant in this many fresh processes, alternated; ms/step: the median of theirs")
    o = sub.add_parser("one", help=argparse.SUPPRESS)
    o.add_argument("case", choices=list(CASES))
    o.add_argument("variant", choices=VARIANTS)
    o.add_argument("out")
    o.add_argument("--profile", action="store_true")
    t = sub.add_parser("report", help="the table of claims against gains, from a run's folder")
    t.add_argument("out")
    t.add_argument("--timings", nargs="+", default=(), help="raw .jsonl files to pool the gains from (every "
                   "process of each case's variants in them), in place of OUT's results.jsonl")
    a = p.parse_args(argv)
    if a.cmd == "run":
        cases = [c for name in a.cases for c in ([f.__name__ for f in HELD_OUT] if name == "heldout" else [name])]
        run(a.out, cases, a.timeout, a.budget, a.variants, not a.no_profile, a.rounds)
    elif a.cmd == "one":
        print(json.dumps(one(a.case, a.variant, a.out, a.profile)))
    else:
        report(a.out, a.timings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
