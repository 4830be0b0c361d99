"""
Autoresearch pretraining script. Single device, single file: this is the file the agent edits.

    uv run train.py              train for TIME_BUDGET seconds, evaluate val_bpb, print the summary
    uv run train.py --profile    profile a few steps, print where each step's time goes, exit
    uv run torchrun --standalone --nproc_per_node=N train.py    the same run on N GPUs (DDP)

On CUDA the defaults are upstream autoresearch's (DEPTH 8, 2^19 tokens per step, 5 minutes). Without a GPU
a small preset runs instead (prepare.py's "cpu" preset and the CPU model size below), so a run takes minutes.
Fixed, never edited: prepare.py (data, evaluation), kernels.py (the fast CUDA ops used below, each with a
plain-PyTorch reference) and profiling/ (flags, run.json, the gate and the profile: profiling/runner.py).
"""

import gc
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from prepare import MAX_SEQ_LEN, TIME_BUDGET, Tokenizer, evaluate_bpb, make_dataloader
from profiling import runner

DEVICE_TYPE = "cuda" if torch.cuda.is_available() else "cpu"
COMPILE = DEVICE_TYPE == "cuda"  # torch.compile on CPU costs minutes of compile for a tiny model
# bf16 on the GPU; float32 on the CPU, where a bf16 matmul without native support runs ~45x slower than float32
DTYPE = torch.bfloat16 if DEVICE_TYPE == "cuda" else torch.float32

# ---------------------------------------------------------------------------
# Hyperparameters (edit these directly, no CLI flags needed)
# ---------------------------------------------------------------------------

# Model architecture
ASPECT_RATIO = 64          # model width = DEPTH * ASPECT_RATIO, rounded up to a multiple of HEAD_DIM
HEAD_DIM = 128             # width of one attention head
WINDOW_PATTERN = "SSSL"    # per-layer attention window: S = half the context, L = full (last layer: L)
N_KV_HEAD_DIVISOR = 1      # kv heads = heads / this (1: plain multi-head attention)

# Optimization
TOTAL_BATCH_SIZE = 2**19   # tokens per optimizer step
EMBEDDING_LR = 0.6         # AdamW, token embedding
VALUE_EMBEDDING_LR = 0.6   # AdamW, value embeddings
UNEMBEDDING_LR = 0.004     # AdamW, lm_head
MATRIX_LR = 0.04           # Muon, block matrices
SCALAR_LR = 0.5            # AdamW, per-layer residual scalars
WEIGHT_DECAY = 0.2         # cautious weight decay on Muon params, decays linearly to 0
ADAM_BETAS = (0.8, 0.95)
WARMUP_RATIO = 0.0         # fraction of the time budget spent warming the LR up
WARMDOWN_RATIO = 0.5       # fraction of the time budget spent decaying the LR to FINAL_LR_FRAC
FINAL_LR_FRAC = 0.0

# Model size
DEPTH = 8                  # transformer layers
DEVICE_BATCH_SIZE = 128    # sequences per forward/backward; lower it if CUDA runs out of memory
if DEVICE_TYPE == "cpu":   # small preset so a CPU run takes minutes (see README)
    DEPTH, DEVICE_BATCH_SIZE, TOTAL_BATCH_SIZE = 2, 4, 8 * MAX_SEQ_LEN

# ---------------------------------------------------------------------------
# GPT model
# ---------------------------------------------------------------------------


@dataclass
class GPTConfig:
    sequence_len: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    window_pattern: str


def norm(x):
    return F.rms_norm(x, (x.size(-1),))  # RMSNorm without learned weights


def has_ve(layer_idx, n_layer):
    """Value embeddings on alternate layers, the last one included."""
    return layer_idx % 2 == (n_layer - 1) % 2


SOFTCAP = 15.0  # logit soft cap


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        kv_dim = self.n_kv_head * self.head_dim
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_k = nn.Linear(config.n_embd, kv_dim, bias=False)
        self.c_v = nn.Linear(config.n_embd, kv_dim, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.ve_gate_channels = 32
        self.ve_gate = (nn.Linear(self.ve_gate_channels, self.n_kv_head, bias=False)
                        if has_ve(layer_idx, config.n_layer) else None)

    def forward(self, x, ve, cos_sin, mask):
        B, T, C = x.size()
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:  # ResFormer value residual, gated per head
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., :self.ve_gate_channels]))
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_kv_head, self.head_dim)
        cos, sin = cos_sin
        q, k = kernels.rotary_norm(q, cos, sin), kernels.rotary_norm(k, cos, sin)  # RMSNorm(rotary(.))
        y = kernels.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp = MLP(config)

    def forward(self, x, ve, cos_sin, mask):
        x = x + self.attn(norm(x), ve, cos_sin, mask)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        L, V, C = config.n_layer, config.vocab_size, config.n_embd
        kv_dim = config.n_kv_head * (C // config.n_head)
        self.wte = nn.Embedding(V, C)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(L)])
        self.lm_head = nn.Linear(C, V, bias=False)
        self.resid_lambdas = nn.Parameter(torch.ones(L))
        self.x0_lambdas = nn.Parameter(torch.full((L,), 0.1))
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(V, kv_dim) for i in range(L) if has_ve(i, L)})
        self.window_sizes = self._window_sizes()
        self.masks = {}  # window -> attention mask, filled by setup_attention()
        cos, sin = self._rotary(config.sequence_len, C // config.n_head)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _window_sizes(self):
        pattern, T = self.config.window_pattern.upper(), self.config.sequence_len
        assert pattern and set(pattern) <= set("SL"), f"WINDOW_PATTERN must use S and L only, got {pattern!r}"
        sizes = [T if pattern[i % len(pattern)] == "L" else T // 2 for i in range(self.config.n_layer)]
        sizes[-1] = T  # the last layer always sees the full context
        return sizes

    def _rotary(self, seq_len, head_dim, base=10000):
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
        return freqs.cos().to(DTYPE)[None, :, None, :], freqs.sin().to(DTYPE)[None, :, None, :]

    def setup_attention(self):
        self.masks = kernels.attention_masks(self.window_sizes, self.config.sequence_len, self.cos.device)

    @torch.no_grad()
    def init_weights(self):
        s = 3**0.5 * self.config.n_embd**-0.5  # uniform(-s, s) has the std of N(0, 1/width)
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                nn.init.uniform_(lin.weight, -s, s)
            nn.init.zeros_(block.attn.c_proj.weight)
            nn.init.zeros_(block.mlp.c_proj.weight)
            if block.attn.ve_gate is not None:
                nn.init.zeros_(block.attn.ve_gate.weight)
        for ve in self.value_embeds.values():
            nn.init.uniform_(ve.weight, -s, s)
        self.resid_lambdas.fill_(1.0)
        self.x0_lambdas.fill_(0.1)
        self.wte.to(DTYPE)  # embeddings are stored in bf16 (on the GPU)
        self.value_embeds.to(DTYPE)

    def flops_per_token(self):
        """6 x non-embedding parameters, plus 12 x heads x head_dim x window per layer for attention."""
        embedding = [self.wte.weight, self.resid_lambdas, self.x0_lambdas]
        embedding += [ve.weight for ve in self.value_embeds.values()]
        n = sum(p.numel() for p in self.parameters()) - sum(p.numel() for p in embedding)
        h, d, T = self.config.n_head, self.config.n_embd // self.config.n_head, self.config.sequence_len
        return 6 * n + sum(12 * h * d * min(w, T) for w in self.window_sizes)

    def forward(self, idx, targets=None, reduction="mean"):
        T = idx.size(1)
        cos_sin = self.cos[:, :T], self.sin[:, :T]
        x = x0 = norm(self.wte(idx))
        for i, block in enumerate(self.blocks):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            x = block(x, ve, cos_sin, self.masks[self.window_sizes[i]])
        x = norm(x)
        if targets is None:
            return SOFTCAP * torch.tanh(self.lm_head(x).float() / SOFTCAP)
        return kernels.head_loss(x.view(-1, x.size(-1)), self.lm_head.weight, targets.view(-1), reduction,
                                 cap=SOFTCAP)


# ---------------------------------------------------------------------------
# Optimizer: Muon for the block matrices, AdamW for everything else
# ---------------------------------------------------------------------------

maybe_compile = torch.compile(dynamic=False, fullgraph=True) if COMPILE else (lambda f: f)

POLAR_EXPRESS_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def orthogonalize(G):
    """Polar Express: push every singular value of each matrix in the stack G towards 1 (bf16 on the GPU)."""
    X = G.to(DTYPE)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02 + 1e-6)
    tall = X.size(-2) > X.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        X = X.mT
    for a, b, c in POLAR_EXPRESS_COEFFS:
        A = X @ X.mT
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.mT if tall else X


@maybe_compile
def muon_update(grads, params, momentum_buf, variance_buf, momentum, lr, wd, beta2, red_dim: int):
    """One Muon step on a stack of same-shape matrices, in place on `params`."""
    momentum_buf.lerp_(grads, 1 - momentum)
    g = orthogonalize(grads.lerp_(momentum_buf, momentum))  # Nesterov
    # NorMuon: normalise per row (or column) by a running second moment, keeping the update's norm
    v_mean = g.float().square().mean(dim=red_dim, keepdim=True)
    n = g.size(red_dim)
    v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * n).sqrt()
    variance_buf.lerp_(v_mean, 1 - beta2)
    step = variance_buf.clamp_min(1e-10).rsqrt()
    v_norm_new = (v_mean * n * step.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    g = g.float() * (step * (v_norm / v_norm_new.clamp_min(1e-10)))
    # cautious weight decay: decay only where the update and the weight agree in sign
    mask = (g * params) >= 0
    params.sub_(lr * g + lr * wd * params * mask)


@maybe_compile
def adamw_update(p, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, wd):
    p.mul_(1 - lr * wd)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.lerp_(grad.square(), 1 - beta2)
    denom = (exp_avg_sq / (1 - beta2**step)).sqrt() + eps
    p.add_(exp_avg / denom * (-lr / (1 - beta1**step)))


class MuonAdamW(torch.optim.Optimizer):
    """Param groups of kind "muon" (same-shape matrices, stacked) or "adamw"."""

    def __init__(self, groups):
        super().__init__(groups, defaults={})
        for group in self.param_groups:
            group["initial_lr"] = group["lr"]
        # hyperparameters go in as 0-d CPU tensors, so changing them never recompiles the fused steps
        self._scalars = {}

    def _t(self, key, value):
        t = self._scalars.setdefault(key, torch.zeros((), dtype=torch.float32))
        t.fill_(value)
        return t

    @torch.no_grad()
    def step(self):
        for i, group in enumerate(self.param_groups):
            if group["kind"] == "muon":
                self._muon(i, group)
            else:
                self._adamw(i, group)

    def _adamw(self, i, group):
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            state = self.state[p]
            if not state:  # moments in the parameter's dtype (bf16 for the embeddings), as upstream
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            adamw_update(p, p.grad, state["exp_avg"], state["exp_avg_sq"],
                         self._t((i, "step"), state["step"]), self._t((i, "lr"), group["lr"]),
                         self._t((i, "b1"), beta1), self._t((i, "b2"), beta2),
                         self._t((i, "eps"), group["eps"]), self._t((i, "wd"), group["weight_decay"]))

    def _muon(self, i, group):
        params = group["params"]
        rows, cols = params[0].shape
        state = self.state[params[0]]
        grads = torch.stack([p.grad for p in params])
        stacked = torch.stack(params)
        red_dim = -1 if rows >= cols else -2
        if not state:
            state["momentum_buf"] = torch.zeros_like(grads)
            state["variance_buf"] = torch.zeros_like(grads[..., :1] if red_dim == -1 else grads[..., :1, :])
        lr = group["lr"] * max(1.0, rows / cols) ** 0.5
        muon_update(grads, stacked, state["momentum_buf"], state["variance_buf"],
                    self._t((i, "momentum"), group["momentum"]), self._t((i, "lr"), lr),
                    self._t((i, "wd"), group["weight_decay"]), self._t((i, "b2"), group["beta2"]), red_dim)
        torch._foreach_copy_(params, list(stacked.unbind(0)))


def make_optimizer(model):
    C = model.config.n_embd
    scale = (C / 768) ** -0.5  # AdamW LRs were tuned at width 768
    adamw = dict(kind="adamw", betas=ADAM_BETAS, eps=1e-10, weight_decay=0.0)
    groups = [
        dict(adamw, params=[model.wte.weight], lr=EMBEDDING_LR * scale),
        dict(adamw, params=list(model.value_embeds.parameters()), lr=VALUE_EMBEDDING_LR * scale),
        dict(adamw, params=[model.lm_head.weight], lr=UNEMBEDDING_LR * scale),
        dict(adamw, params=[model.resid_lambdas], lr=SCALAR_LR * 0.01),
        dict(adamw, params=[model.x0_lambdas], lr=SCALAR_LR, betas=(0.96, ADAM_BETAS[1])),
    ]
    by_shape = {}
    for p in model.blocks.parameters():
        by_shape.setdefault(tuple(p.shape), []).append(p)
    for shape in sorted(by_shape):
        groups.append(dict(kind="muon", params=by_shape[shape], lr=MATRIX_LR, momentum=0.95, beta2=0.95,
                           weight_decay=WEIGHT_DECAY))
    return MuonAdamW([g for g in groups if g["params"]])


# ---------------------------------------------------------------------------
# Schedules (progress = training time / TIME_BUDGET)
# ---------------------------------------------------------------------------


def lr_multiplier(progress):
    if progress < WARMUP_RATIO:
        return progress / WARMUP_RATIO
    if progress < 1.0 - WARMDOWN_RATIO:
        return 1.0
    cooldown = max(0.0, (1.0 - progress) / WARMDOWN_RATIO)
    return cooldown + (1 - cooldown) * FINAL_LR_FRAC


def muon_momentum(step):
    frac = min(step / 300, 1.0)
    return (1 - frac) * 0.85 + frac * 0.95


def set_schedules(optimizer, step, progress):
    lrm = lr_multiplier(progress)
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * lrm
        if group["kind"] == "muon":
            group["momentum"] = muon_momentum(step)
            group["weight_decay"] = WEIGHT_DECAY * (1 - progress)
    return lrm


# ---------------------------------------------------------------------------
# Setup and the training step
# ---------------------------------------------------------------------------


def build_model(vocab_size, device):
    width = -(-DEPTH * ASPECT_RATIO // HEAD_DIM) * HEAD_DIM
    n_head = width // HEAD_DIM
    config = GPTConfig(sequence_len=MAX_SEQ_LEN, vocab_size=vocab_size, n_layer=DEPTH, n_head=n_head,
                       n_kv_head=n_head // N_KV_HEAD_DIVISOR, n_embd=width, window_pattern=WINDOW_PATTERN)
    with torch.device(device):
        model = GPT(config)
    model.init_weights()
    model.setup_attention()
    return model


def make_train_step(model, optimizer, loader, grad_accum_steps, autocast, ranks):
    """train_step(step, progress) -> loss tensor of the last micro-batch: one optimizer step, no host sync."""
    ddp = ranks.distribute(model)  # DistributedDataParallel under torchrun, else the model itself
    forward = torch.compile(ddp, dynamic=False) if COMPILE else ddp
    batch = next(loader)

    def train_step(step, progress):
        nonlocal batch
        for i in range(grad_accum_steps):
            x, y, _epoch = batch
            with autocast, ranks.grad_sync(ddp, last=i == grad_accum_steps - 1):
                loss = forward(x, y)
                (loss / grad_accum_steps).backward()
            batch = next(loader)  # the next batch is prepared while the GPU works
        set_schedules(optimizer, step, progress)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        return loss.detach()

    return train_step, forward


def check_batch_sizes(ranks):
    """Micro-batches per step on each rank (TOTAL_BATCH_SIZE is the tokens per step over all ranks)."""
    tokens = DEVICE_BATCH_SIZE * MAX_SEQ_LEN * ranks
    if TOTAL_BATCH_SIZE % tokens:
        on = f" x {ranks} ranks" if ranks > 1 else ""
        raise runner.ConfigError(
            f"TOTAL_BATCH_SIZE ({TOTAL_BATCH_SIZE}) is not a multiple of DEVICE_BATCH_SIZE x MAX_SEQ_LEN{on} "
            f"({DEVICE_BATCH_SIZE} x {MAX_SEQ_LEN}{on} = {tokens}); change one of them")
    return TOTAL_BATCH_SIZE // tokens


# ---------------------------------------------------------------------------
# Main: train for TIME_BUDGET seconds, evaluate, summarize. The flags, run.json, the printed summary block,
# the early-abort gate and the profile are profiling/runner.py's (fixed).
# ---------------------------------------------------------------------------

EXCLUDED_STEPS = 10  # the first steps (compilation) are not counted against the time budget
PROFILE_AT = 5       # profile from this step on, once the unprofiled steps timed before it are steady (compiled,
                     # warmed up; at EXCLUDED_STEPS whatever they are): their time is the report's reference


def main(argv=None):
    run = runner.Run(argv, __file__, DEVICE_TYPE, hyperparameters=runner.knobs(globals()))
    return run.execute(lambda: train_and_evaluate(run))


def train_and_evaluate(run):
    """Set up the model and data, train, evaluate: fills run.summary (the runner prints it and exits)."""
    grad_accum_steps = check_batch_sizes(run.ranks.world_size)
    run.start()  # prepares the data if none is; prints the device, settings and early-abort gate lines
    torch.manual_seed(42)
    if DEVICE_TYPE == "cuda":
        torch.set_float32_matmul_precision("high")
    device = torch.device(DEVICE_TYPE)
    autocast = torch.autocast(device_type=DEVICE_TYPE, dtype=torch.bfloat16, enabled=DTYPE == torch.bfloat16)
    print(f"Model: DEPTH={DEPTH} DEVICE_BATCH_SIZE={DEVICE_BATCH_SIZE} TOTAL_BATCH_SIZE={TOTAL_BATCH_SIZE} "
          f"(gradient accumulation {grad_accum_steps})")
    tokenizer = Tokenizer.from_directory()
    model = build_model(tokenizer.get_vocab_size(), device)
    flops_per_token = model.flops_per_token()
    optimizer = make_optimizer(model)
    run.describe_model(model, flops_per_token, TOTAL_BATCH_SIZE, grad_accum_steps, optimizer)
    loader = make_dataloader(tokenizer, DEVICE_BATCH_SIZE, MAX_SEQ_LEN, "train", device=device)
    train_step, forward = make_train_step(model, optimizer, loader, grad_accum_steps, autocast, run.ranks)
    train(run, train_step, flops_per_token)
    if run.profile_only:
        return
    model.eval()
    with autocast:
        run.summary["val_bpb"] = evaluate_bpb(forward, tokenizer, DEVICE_BATCH_SIZE)


def train(run, train_step, flops_per_token):
    """The training loop. Fills run.summary's training numbers; raises runner.Diverged or runner.EarlyAbort.

    Step n's loss is read (a host sync) only after step n + 1 is launched, so the GPU always has queued work
    and never waits for Python. At step PROFILE_AT the profiler (unless --no-profile) runs its steps; they
    train the model like any other step and, like compilation, are not counted against the time budget.
    """
    t_train, smooth, step, progress, excluded, pending = 0.0, 0.0, 0, 0.0, EXCLUDED_STEPS, None
    clock = runner.StepClock(DEVICE_TYPE == "cuda")

    def finish_step(done, loss, mark):
        """Wait for step `done` and account for it."""
        nonlocal t_train, progress, smooth
        loss = loss.item()  # waits for the GPU to finish step `done`
        loss, dt = run.ranks.agree(loss, clock.elapsed(mark))  # under torchrun: the ranks' mean loss, slowest time
        if not math.isfinite(loss) or loss > 100:
            raise runner.Diverged(f"loss {loss} at step {done}")
        if done >= excluded:
            t_train += dt
            progress = min(t_train / TIME_BUDGET, 1.0)
        smooth = 0.9 * smooth + 0.1 * loss
        smooth_debiased = smooth / (1 - 0.9 ** len(clock.times))
        tok_per_s, remaining = TOTAL_BATCH_SIZE / dt, max(0.0, TIME_BUDGET - t_train)
        print(f"\rstep {done:05d} ({100 * progress:.1f}%) | loss: {smooth_debiased:.6f} | "
              f"lrm: {lr_multiplier(progress):.2f} | dt: {dt * 1000:.0f}ms | tok/sec: {tok_per_s:,.0f} | "
              f"mfu: {run.mfu(flops_per_token * tok_per_s)} | remaining: {remaining:.0f}s    ",
              end="", flush=True)
        if done >= excluded:
            run.track(progress, smooth_debiased)  # the loss curve; the early-abort gate may stop the run here

    def account():
        counted = max(1, step - excluded)
        run.summary.update(training_seconds=round(t_train, 1), num_steps=step,
                           total_tokens_M=round(step * TOTAL_BATCH_SIZE / 1e6, 1))
        if run.peak_flops and t_train > 0:
            run.summary["mfu_percent"] = round(
                100 * flops_per_token * TOTAL_BATCH_SIZE * counted / t_train / run.peak_flops, 2)
        run.record["loss_curve"] = run.loss_curve()

    while True:
        if run.profile_due(step, clock.times, PROFILE_AT, EXCLUDED_STEPS):
            finish_step(*pending)
            pending = None
            print()
            ran = run.profile(train_step, step, clock)  # the steady steps' time is the reference
            step, excluded = step + ran, max(EXCLUDED_STEPS, step + ran)
            clock.restart()
            if run.profile_only:
                return
        loss = train_step(step, progress)
        mark = clock.mark()
        if pending is not None:
            try:
                finish_step(*pending)
            except runner.EarlyAbort:
                step += 1  # the step launched before the abort has trained too
                account()
                raise
        pending = (step, loss, mark)
        if step == 0:  # Python's GC causes ~500ms stalls: collect once, then freeze what is alive
            gc.collect()
            gc.freeze()
            gc.disable()
        elif (step + 1) % 5000 == 0:
            gc.collect()
        step += 1
        if step > excluded and t_train >= TIME_BUDGET:
            break
    finish_step(*pending)
    print()
    account()


if __name__ == "__main__":
    sys.exit(main())
