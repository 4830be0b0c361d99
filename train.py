"""
Autoresearch pretraining script. Single device, single file: this is the file the agent edits.

    uv run train.py              train for TIME_BUDGET seconds, evaluate val_bpb, print the summary
    uv run train.py --profile    profile a few steps, print where each step's time goes, exit

On CUDA the defaults are upstream autoresearch's (DEPTH 8, 2^19 tokens per step, 5 minutes). Without a GPU
a small preset runs instead (prepare.py's "cpu" preset and the CPU model size below), so a run takes minutes.
"""

import argparse
import gc
import math
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton ships with torch on Linux; without it every op below runs in plain PyTorch
    triton = None
try:  # cuDNN's Python API (nvidia-cudnn-frontend, Linux): sliding-window attention
    import cudnn
except ImportError:
    cudnn = None

import prepare
from prepare import MAX_SEQ_LEN, TIME_BUDGET, Tokenizer, evaluate_bpb, make_dataloader
from profiling import gate, hardware, memory, provenance, runfile

DEVICE_TYPE = "cuda" if torch.cuda.is_available() else "cpu"
COMPILE = DEVICE_TYPE == "cuda"  # torch.compile on CPU costs minutes of compile for a tiny model

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
    DEPTH, DEVICE_BATCH_SIZE, TOTAL_BATCH_SIZE = 2, 8, 8 * MAX_SEQ_LEN

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


def apply_rotary(x, cos, sin):
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


def rotary_norm(x, cos, sin):
    """RMSNorm(rotary(x)) of [B, T, H, D] queries or keys. On CUDA one Triton kernel each way: compiled, the
    rotary's slices and cat took 2.4x the bytes-moved time (26.7 vs 14.1 ms per step, issue #9)."""
    if triton is None or not x.is_cuda:
        return norm(apply_rotary(x, cos, sin))
    return torch.ops.autoresearch.rotary_norm(x.contiguous(), cos.contiguous(), sin.contiguous())


def window_mask(window):
    """Key j is visible to query i when 0 <= i - j <= window (window >= sequence length: plain causal)."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)
    return mask_mod


def build_attention_masks(windows, seq_len, device):
    """One mask per window size: None for a window that covers the sequence (plain causal), the window
    itself on CUDA (cuDNN's band mask), else a dense boolean mask."""
    masks = {}
    for w in set(windows):
        if w >= seq_len:
            masks[w] = None
        elif device.type == "cuda":
            if cudnn is None:
                raise RuntimeError("sliding-window attention on CUDA needs cuDNN's Python API: "
                                   "install nvidia-cudnn-frontend (uv sync installs it on Linux)")
            masks[w] = w
        else:
            i = torch.arange(seq_len, device=device)
            masks[w] = window_mask(w)(None, None, i[:, None], i[None, :])
    return masks


# Plain causal attention: cuDNN's fused kernel first, then the others as fallbacks.
CAUSAL_BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                   SDPBackend.MATH]


def attend(q, k, v, mask):
    """Causal sliding-window attention on [B, H, T, D] tensors (mask None: plain causal).

    The windows run on cuDNN's band mask: forward + backward 5.2 ms per S layer against FlexAttention's
    6.6 on an H100 (benchmarks/attention_variants.py, issue #9)."""
    gqa = q.size(1) != k.size(1)
    if mask is None:
        with sdpa_kernel(CAUSAL_BACKENDS, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if isinstance(mask, int):
        return torch.ops.autoresearch.window_attention(q, k, v, mask)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


if cudnn is not None:
    _CUDNN_UIDS = dict(q=1, k=2, v=3, o=4, stats=5, do=6, dq=7, dk=8, dv=9)
    _cudnn_graphs, _cudnn_handles = {}, {}

    def _cudnn_attention(backward, window, **t):
        """cuDNN's attention forward (or backward) with the band mask 0 <= i - j <= window, on [B, H, T, D]
        tensors of any strides: outputs take their inputs' strides, so no layout copies. One graph is built
        per configuration of shapes and strides, then reused."""
        device = t["q"].device
        if device not in _cudnn_handles:
            _cudnn_handles[device] = cudnn.create_handle()
        handle = _cudnn_handles[device]
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
        key = (backward, window, device) + tuple((n, x.shape, x.stride(), x.dtype) for n, x in t.items())
        if key not in _cudnn_graphs:
            io = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF}[t["q"].dtype]
            dtype = lambda n: cudnn.data_type.FLOAT if n == "stats" else io  # noqa: E731
            g = cudnn.pygraph(handle=handle, io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT)
            outputs = ("dq", "dk", "dv") if backward else ("o", "stats")
            x = {n: g.tensor(name=n, dim=list(a.shape), stride=list(a.stride()), data_type=dtype(n),
                             uid=_CUDNN_UIDS[n]) for n, a in t.items() if n not in outputs}
            band = dict(attn_scale=t["q"].size(-1) ** -0.5, diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT,
                        diagonal_band_left_bound=window + 1, diagonal_band_right_bound=0)  # left: counts i
            if backward:
                made = g.sdpa_backward(name="attention_backward", q=x["q"], k=x["k"], v=x["v"], o=x["o"],
                                       dO=x["do"], stats=x["stats"], **band)
            else:
                made = g.sdpa(name="attention", q=x["q"], k=x["k"], v=x["v"], generate_stats=True, **band)
            for n, out in zip(outputs, made):
                out.set_uid(_CUDNN_UIDS[n]).set_output(True).set_data_type(dtype(n))
                out.set_dim(list(t[n].shape)).set_stride(list(t[n].stride()))
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
            _cudnn_graphs[key] = g, g.get_workspace_size()
        g, workspace = _cudnn_graphs[key]
        workspace = torch.empty(max(workspace, 1), device=device, dtype=torch.uint8)
        g.execute({_CUDNN_UIDS[n]: a for n, a in t.items()}, workspace, handle=handle)

    def _window_outputs(q):
        B, H, T, _ = q.shape
        return torch.empty_like(q), q.new_empty((B, H, T, 1), dtype=torch.float32)

    @torch.library.custom_op("autoresearch::window_attention", mutates_args=())
    def _window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal attention over the last `window` keys: the output (q's strides) and the log-sum-exps."""
        o, stats = _window_outputs(q)
        _cudnn_attention(False, window, q=q, k=k, v=v, o=o, stats=stats)
        return o, stats

    @torch.library.custom_op("autoresearch::window_attention_backward", mutates_args=())
    def _window_attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   o: torch.Tensor, stats: torch.Tensor,
                                   window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        do = do if do.stride() == o.stride() else torch.empty_like(o).copy_(do)  # cuDNN: dO laid out as O
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _cudnn_attention(True, window, q=q, k=k, v=v, o=o, stats=stats, do=do, dq=dq, dk=dk, dv=dv)
        return dq, dk, dv

    _window_attention.register_fake(lambda q, k, v, window: _window_outputs(q))
    _window_attention_backward.register_fake(
        lambda do, q, k, v, o, stats, window: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)))

    def _window_attention_setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3], *output)
        ctx.window = inputs[3]

    def _window_attention_grad(ctx, do, dstats):
        return *_window_attention_backward(do, *ctx.saved_tensors, ctx.window), None

    _window_attention.register_autograd(_window_attention_grad, setup_context=_window_attention_setup)


# ---------------------------------------------------------------------------
# Head and loss: logits = x @ W.T, soft-capped cap * tanh(logits / cap), cross-entropy, in float32
# ---------------------------------------------------------------------------

SOFTCAP = 15.0  # logit soft cap


def head_loss(x, weight, targets, reduction="mean", cap=SOFTCAP):
    """[N, C] hidden states, [V, C] head weight, [N] targets -> the mean loss over counted targets (not -1),
    or with reduction="none" the [N] float32 per-token losses (0 where the target is -1).

    On CUDA the loss is one Triton kernel that reads each row of logits once and writes, in its place, the
    loss's gradient; the backward scales the head's two GEMMs by the upstream gradient. The float32
    capped logits are never stored, and the logits never sit beside their gradient (the compiled
    definition: 17.8 vs 14.2 ms per micro-batch, benchmarks/loss_kernel.py)."""
    if triton is None or not x.is_cuda:
        return F.cross_entropy(cap * torch.tanh(F.linear(x, weight).float() / cap), targets, ignore_index=-1,
                               reduction=reduction)
    if reduction == "mean" and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return FusedHeadLoss.apply(x, weight, targets.contiguous(), cap)
    losses = torch.ops.autoresearch.softcap_ce_(F.linear(x, weight), targets.contiguous(), cap, False)
    return losses if reduction == "none" else losses.sum() / (targets != -1).sum()


if triton is not None:
    CE_WARPS = 8  # warps per row of logits (loss_kernel.py on an H100: 15.27 ms vs 15.61 with 4)

    @triton.jit
    def _tanh(x):
        return 2 / (1 + tl.exp(-2 * x)) - 1

    @triton.jit
    def _softcap_cross_entropy_kernel(logits, targets, losses, V: tl.constexpr, cap: tl.constexpr,
                                      WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr):
        """One row of logits per program, held whole (BLOCK >= V): read once, written once."""
        row = tl.program_id(0).to(tl.int64)
        logits += row * V
        cols = tl.arange(0, BLOCK)
        t = _tanh(tl.load(logits + cols, mask=cols < V, other=0.0).to(tl.float32) / cap)
        z = tl.where(cols < V, cap * t, float("-inf"))
        z_max = tl.max(z, 0)
        e = tl.exp(z - z_max)
        total = tl.sum(e, 0)
        target = tl.load(targets + row)
        z_target = tl.sum(tl.where(cols == target, z, 0.0), 0)
        tl.store(losses + row, tl.where(target >= 0, z_max + tl.log(total) - z_target, 0.0))
        if WRITE_GRAD:  # d loss / d logits = (softmax(z) - one-hot) * (1 - tanh^2), 0 for an ignored row
            g = tl.where(target >= 0, 1.0, 0.0) * (1 - t * t)
            dz = e * (1 / total) - tl.where(cols == target, 1.0, 0.0)
            tl.store(logits + cols, (g * dz).to(logits.dtype.element_ty), mask=cols < V)

    @torch.library.triton_op("autoresearch::softcap_ce_", mutates_args={"logits"})
    def _softcap_ce(logits: torch.Tensor, targets: torch.Tensor, cap: float, write_grad: bool) -> torch.Tensor:
        """Per-token losses of contiguous [N, V] logits; with write_grad, the logits become the gradient."""
        N, V = logits.shape
        losses = torch.empty(N, device=logits.device, dtype=torch.float32)
        torch.library.wrap_triton(_softcap_cross_entropy_kernel)[(N,)](
            logits, targets, losses, V, cap, write_grad, BLOCK=triton.next_power_of_2(V), num_warps=CE_WARPS)
        return losses

    ROTARY_ROWS = 16  # rows (one head of one token each) per program

    # Store addresses are computed from integers only (`_rows`), and tensor arguments come first:
    # torch.compile's analysis of which arguments a Triton kernel writes follows a stored-to address back
    # through helper calls (one that reached a helper taking x's pointer marked x as written) and numbers
    # the arguments as if the tensors led; torch 2.11 then copied x before every backward call (5.7 ms per
    # step on an H100, issue #9; tests/test_kernels.py checks the analysis).

    @triton.jit
    def _rows(n_rows, HALF: tl.constexpr, HALF_P2: tl.constexpr, ROWS: tl.constexpr):
        """This program's rows, the columns of a half row, the mask and the offsets in a contiguous tensor."""
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, HALF_P2)[None, :]
        mask = (rows[:, None] < n_rows) & (cols < HALF)
        return rows, cols, mask, rows[:, None].to(tl.int64) * (2 * HALF) + cols

    @triton.jit
    def _rotate(x, cos, sin, at, rows, mask, H: tl.constexpr, T: tl.constexpr, HALF: tl.constexpr,
                HALF_P2: tl.constexpr):
        """The row pairs (x1, x2) at `at` rotated to (x1 c + x2 s, x2 c - x1 s) in float32, c, s, and the
        RMSNorm's reciprocal root mean square of the rotated rows."""
        x1 = tl.load(x + at, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x + at + HALF, mask=mask, other=0.0).to(tl.float32)
        t = ((rows // H) % T)[:, None] * HALF + tl.arange(0, HALF_P2)[None, :]
        c = tl.load(cos + t, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin + t, mask=mask, other=0.0).to(tl.float32)
        r1, r2 = x1 * c + x2 * s, x2 * c - x1 * s
        rstd = tl.rsqrt((tl.sum(r1 * r1, 1) + tl.sum(r2 * r2, 1)) / (2 * HALF) + 1.1920928955078125e-07)[:, None]
        return r1, r2, c, s, rstd

    @triton.jit
    def _rotary_norm_fwd(x, cos, sin, y, n_rows, H: tl.constexpr, T: tl.constexpr, HALF: tl.constexpr,
                         HALF_P2: tl.constexpr, ROWS: tl.constexpr):
        rows, cols, mask, at = _rows(n_rows, HALF, HALF_P2, ROWS)
        r1, r2, c, s, rstd = _rotate(x, cos, sin, at, rows, mask, H, T, HALF, HALF_P2)
        tl.store(y + at, (r1 * rstd).to(y.dtype.element_ty), mask=mask)
        tl.store(y + at + HALF, (r2 * rstd).to(y.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotary_norm_bwd(dy, x, cos, sin, dx, dy_b, dy_t, dy_h, n_rows, H: tl.constexpr, T: tl.constexpr,
                         HALF: tl.constexpr, HALF_P2: tl.constexpr, ROWS: tl.constexpr):
        rows, cols, mask, at = _rows(n_rows, HALF, HALF_P2, ROWS)
        r1, r2, c, s, rstd = _rotate(x, cos, sin, at, rows, mask, H, T, HALF, HALF_P2)
        y1, y2 = r1 * rstd, r2 * rstd
        # dy comes from the attention's backward in its own layout: [B, T, H, D] strides, D contiguous
        r = rows.to(tl.int64)
        dy_at = ((r // (T * H)) * dy_b + ((r // H) % T) * dy_t + (r % H) * dy_h)[:, None] + cols
        dy1 = tl.load(dy + dy_at, mask=mask, other=0.0).to(tl.float32)
        dy2 = tl.load(dy + dy_at + HALF, mask=mask, other=0.0).to(tl.float32)
        dot = ((tl.sum(dy1 * y1, 1) + tl.sum(dy2 * y2, 1)) / (2 * HALF))[:, None]
        dr1, dr2 = rstd * (dy1 - y1 * dot), rstd * (dy2 - y2 * dot)  # RMSNorm backward
        tl.store(dx + at, (dr1 * c - dr2 * s).to(dx.dtype.element_ty), mask=mask)  # the rotation, transposed
        tl.store(dx + at + HALF, (dr1 * s + dr2 * c).to(dx.dtype.element_ty), mask=mask)

    def _rotary_norm_launch(kernel, x, *args):
        B, T, H, D = x.shape
        n_rows = B * T * H
        torch.library.wrap_triton(kernel)[(triton.cdiv(n_rows, ROTARY_ROWS),)](
            *args, n_rows, H, T, D // 2, triton.next_power_of_2(D // 2), ROWS=ROTARY_ROWS)

    @torch.library.triton_op("autoresearch::rotary_norm", mutates_args=())
    def _rotary_norm(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        _rotary_norm_launch(_rotary_norm_fwd, x, x, cos, sin, y)
        return y

    @torch.library.triton_op("autoresearch::rotary_norm_backward", mutates_args=())
    def _rotary_norm_backward(dy: torch.Tensor, x: torch.Tensor, cos: torch.Tensor,
                              sin: torch.Tensor) -> torch.Tensor:
        dy = dy if dy.stride(-1) == 1 else dy.contiguous()
        dx = torch.empty_like(x)
        _rotary_norm_launch(_rotary_norm_bwd, x, dy, x, cos, sin, dx, *dy.stride()[:3])
        return dx

    def _rotary_norm_setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def _rotary_norm_grad(ctx, dy):
        return _rotary_norm_backward(dy, *ctx.saved_tensors), None, None

    _rotary_norm.register_autograd(_rotary_norm_grad, setup_context=_rotary_norm_setup)

    class FusedHeadLoss(torch.autograd.Function):
        """The mean loss; the logits buffer becomes the gradient of the summed loss, kept for backward."""
        @staticmethod
        @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.bfloat16)
        def forward(ctx, x, weight, targets, cap):
            grad = x @ weight.t()  # the logits, until the kernel turns them into their gradient
            losses = torch.ops.autoresearch.softcap_ce_(grad, targets, cap, True)
            count = (targets != -1).sum()
            ctx.save_for_backward(x, weight, grad, count)
            return losses.sum() / count

        @staticmethod
        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, dloss):
            x, weight, grad, count = ctx.saved_tensors
            scale = dloss / count  # training: 1 / (2 x 262,144), a power of two: exact in bf16
            return (grad @ weight) * scale, (grad.t() @ x) * scale, None, None


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
        q, k = rotary_norm(q, cos, sin), rotary_norm(k, cos, sin)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
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
        return freqs.cos().bfloat16()[None, :, None, :], freqs.sin().bfloat16()[None, :, None, :]

    def setup_attention(self):
        self.masks = build_attention_masks(self.window_sizes, self.config.sequence_len, self.cos.device)

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
        self.wte.to(torch.bfloat16)  # embeddings are stored in bf16
        self.value_embeds.to(torch.bfloat16)

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
        return head_loss(x.view(-1, x.size(-1)), self.lm_head.weight, targets.view(-1), reduction)


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
    """Polar Express: push every singular value of each matrix in the stack G towards 1 (bf16)."""
    X = G.bfloat16()
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


def make_train_step(model, optimizer, loader, grad_accum_steps, autocast):
    """train_step(step, progress) -> loss tensor of the last micro-batch: one optimizer step, no host sync."""
    forward = torch.compile(model, dynamic=False) if COMPILE else model
    batch = next(loader)

    def train_step(step, progress):
        nonlocal batch
        for _ in range(grad_accum_steps):
            x, y, _epoch = batch
            with autocast:
                loss = forward(x, y)
            (loss / grad_accum_steps).backward()
            batch = next(loader)  # the next batch is prepared while the GPU works
        set_schedules(optimizer, step, progress)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        return loss.detach()

    return train_step, forward


def check_batch_sizes():
    tokens = DEVICE_BATCH_SIZE * MAX_SEQ_LEN
    if TOTAL_BATCH_SIZE % tokens:
        raise ValueError(f"TOTAL_BATCH_SIZE ({TOTAL_BATCH_SIZE}) is not a multiple of DEVICE_BATCH_SIZE x "
                         f"MAX_SEQ_LEN ({DEVICE_BATCH_SIZE} x {MAX_SEQ_LEN} = {tokens}); change one of them")
    return TOTAL_BATCH_SIZE // tokens


def hyperparameters():
    """Every UPPER_CASE knob of this file (numbers, strings, tuples of numbers), recorded in run.json."""
    def knob(v):
        numbers = isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v)
        return isinstance(v, (int, float, str)) or numbers
    imported = ("MAX_SEQ_LEN", "TIME_BUDGET")
    return {k: v for k, v in globals().items() if k.isupper() and k not in imported and knob(v)}


def git_commit():
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", __file__], capture_output=True,
                               text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def sample_curve(points, fractions):
    """The smoothed loss at the first step that reached each fraction of the budget (reached ones only)."""
    out, j = [], 0
    for f in fractions:
        while j < len(points) and points[j][0] < f - 1e-9:
            j += 1
        if j == len(points):
            break
        out.append(round(points[j][1], 6))
    return {"fractions": fractions[:len(out)], "loss": out}


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

EXCLUDED_STEPS = 10  # the first steps (compilation) are not counted against the time budget
PROFILE_AT = 5       # profile from this step on: compiled, with a few unprofiled steps timed before it


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, instead of the usage text and the error
        self.exit(2, f"train.py: error: {message} (see --help)\n")


def parse_args(argv):
    p = ArgumentParser(description="Train the GPT for TIME_BUDGET seconds and report val_bpb. "
                                "Every run also profiles a few steps after compilation (outside the budget).")
    p.add_argument("--profile", action="store_true",
                   help="only profile: warm up, profile, print the report, exit (no TIME_BUDGET spent)")
    p.add_argument("--warmup-steps", type=int, default=2, metavar="W", help="profiler warm-up steps (default 2)")
    p.add_argument("--active-steps", type=positive_int, default=5, metavar="A",
                   help="profiled steps (default 5)")
    p.add_argument("--no-profile", action="store_true", help="skip the profile of a normal training run")
    p.add_argument("--no-gate", action="store_true",
                   help="never abort early (default: abort a run clearly worse than the best kept one)")
    p.add_argument("--run-file", default="run.json", help="where to write the run summary (default run.json)")
    args = p.parse_args(argv)
    if args.warmup_steps < 0:
        p.error("--warmup-steps must be 0 or more")
    if args.profile and args.no_profile:
        p.error("--profile and --no-profile contradict each other; pick one")
    return args


def main(argv=None):
    args = parse_args(argv)
    t_start = time.time()
    torch.manual_seed(42)
    if DEVICE_TYPE == "cuda":
        torch.set_float32_matmul_precision("high")
    device_name = torch.cuda.get_device_name() if DEVICE_TYPE == "cuda" else "cpu"
    peak_flops = hardware.peak_flops(device_name) if DEVICE_TYPE == "cuda" else None
    run = dict(device=device_name, torch=torch.__version__, commit=git_commit(), dataset="unknown",
               settings=prepare.settings(), hyperparameters=hyperparameters(), loss_curve=None, profile=None)
    summary = dict.fromkeys(runfile.SUMMARY_FIELDS)
    summary["depth"] = DEPTH

    def write(status, error=None):
        summary["total_seconds"] = round(time.time() - t_start, 1)
        if DEVICE_TYPE == "cuda":
            summary["peak_vram_mb"] = round(torch.cuda.max_memory_allocated() / 1024**2, 1)
        record = runfile.make_run(status, summary, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), error=error, **run)
        runfile.write_run(args.run_file, record)

    def finish(status, error=None, code=0, extra=()):
        write(status, error)
        print(runfile.format_summary(summary, status, extra))
        return code

    if not args.profile:  # until the run ends, run.json says it did not: a killed run is logged as a crash
        write("crash", "did not finish: killed, timed out, or crashed before writing its summary")
    try:
        grad_accum_steps = check_batch_sizes()
        run["dataset"] = prepare.ensure_data()
    except (ValueError, prepare.PrepareError) as e:
        print(f"error: {e}", file=sys.stderr)
        return finish("crash", error=str(e), code=2)
    try:
        return run_training(args, run, summary, finish, grad_accum_steps, peak_flops)
    except Exception as e:  # a bug in an edit: the traceback for the agent, run.json for the memory
        traceback.print_exc()
        return finish("crash", error=f"{type(e).__name__}: {e}"[:500], code=1)


def run_training(args, run, summary, finish, grad_accum_steps, peak_flops):
    """Set up the model and data, train, evaluate; returns the exit code through `finish`."""
    device, device_name = torch.device(DEVICE_TYPE), run["device"]
    autocast = torch.autocast(device_type=DEVICE_TYPE, dtype=torch.bfloat16)

    print(f"Device: {device_name} | torch {torch.__version__} | dataset: {run['dataset']}")
    print("Settings: " + ", ".join(f"{k}={v}" for k, v in run["settings"].items()))
    reference, why_off = (None, "off (--no-gate)") if args.no_gate or args.profile else \
        gate.find_reference(memory.default_path(), run["settings"], run["dataset"])
    abort_gate = gate.Gate(reference) if reference else None
    run["gate"] = {"status": abort_gate.describe() if abort_gate else why_off, "decisions": []}
    if not args.profile:
        print(f"Early-abort gate: {run['gate']['status']}")
    print(f"Model: DEPTH={DEPTH} DEVICE_BATCH_SIZE={DEVICE_BATCH_SIZE} TOTAL_BATCH_SIZE={TOTAL_BATCH_SIZE} "
          f"(gradient accumulation {grad_accum_steps})")
    tokenizer = Tokenizer.from_directory()
    model = build_model(tokenizer.get_vocab_size(), device)
    num_params = sum(p.numel() for p in model.parameters())
    flops_per_token = model.flops_per_token()
    summary["num_params_M"] = round(num_params / 1e6, 1)
    print(f"Parameters: {num_params / 1e6:.1f}M | FLOPs per token: {flops_per_token:.3e}")
    optimizer = make_optimizer(model)
    loader = make_dataloader(tokenizer, DEVICE_BATCH_SIZE, MAX_SEQ_LEN, "train", device=device)
    train_step, forward = make_train_step(model, optimizer, loader, grad_accum_steps, autocast)

    def profiler(first_step, step_times):
        """Profile W + A steps from first_step on; print the report. Returns the steps it ran."""
        from profiling import capture  # the only module that drives torch.profiler
        steps = iter(range(first_step, first_step + args.warmup_steps + args.active_steps))
        meta = dict(device=device_name, torch=torch.__version__, commit=run["commit"],
                    tokens_per_step=TOTAL_BATCH_SIZE, micro_batches=grad_accum_steps, flops_per_step=flops_per_token * TOTAL_BATCH_SIZE,
                    peak_flops=peak_flops, unprofiled_step_ms=1000 * sum(step_times) / len(step_times),
                    peak_memory_mb=torch.cuda.max_memory_allocated() / 1024**2 if DEVICE_TYPE == "cuda" else None,
                    parameters={name: list(p.shape) for name, p in model.named_parameters()})
        report, run["profile"], seconds = capture.profile_training(
            lambda: train_step(next(steps), 0.0), args.warmup_steps, args.active_steps, meta)
        print(f"\n{report}\n(profile files: {run['profile']}; export, summary and report took {seconds:.1f} s)")
        return args.warmup_steps + args.active_steps

    if not args.no_profile:  # before compiling: the report's "Lines of train.py" (profiling/provenance.py)
        provenance.start()
    try:
        train(train_step, flops_per_token, peak_flops, summary, run, abort_gate,
              profiler=None if args.no_profile else profiler, profile_only=args.profile)
        if args.profile:
            return 0
        model.eval()
        with autocast:
            summary["val_bpb"] = evaluate_bpb(forward, tokenizer, DEVICE_BATCH_SIZE)
    except Diverged as e:
        print(f"\nFAIL: {e}")  # NaN or exploding loss
        return finish("fail", error=str(e), code=1)
    except EarlyAbort as e:
        d = e.decision
        print(f"\nEarly abort at {100 * d['fraction']:.0f}% of the budget: loss {d['loss']} is {d['ratio']}x the "
              f"reference {d['reference_loss']} (threshold {d['threshold']}x)")
        extra = [(f"gate_{k}", d[k]) for k in ("fraction", "loss", "reference_loss", "ratio", "threshold")]
        return finish("early_abort", code=gate.EXIT_CODE, extra=extra)
    except torch.OutOfMemoryError:
        msg = f"CUDA out of memory at DEVICE_BATCH_SIZE={DEVICE_BATCH_SIZE}: lower DEVICE_BATCH_SIZE"
        print(f"FAIL: {msg}", file=sys.stderr)
        return finish("crash", error=msg, code=1)
    return finish("ok")


class StepClock:
    """Seconds per step without a host sync per step. A mark is taken right after each step is launched:
    on CUDA an event (the GPU's own time between step ends), on the CPU the host time (steps run
    synchronously there, so the step is done when its launch returns)."""

    def __init__(self):
        self.cuda = DEVICE_TYPE == "cuda"
        self.restart()

    def restart(self):
        self.last = self.mark()
        if self.cuda:
            self.last.synchronize()

    def mark(self):
        if not self.cuda:
            return time.time()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed(self, mark):
        """Seconds from the previous mark to this one (waits for it)."""
        if self.cuda:
            mark.synchronize()
            dt = self.last.elapsed_time(mark) / 1000
        else:
            dt = mark - self.last
        self.last = mark
        return dt


class Diverged(Exception):
    """NaN or exploding training loss."""


class EarlyAbort(Exception):
    """The early-abort gate found this run clearly worse than the reference run."""

    def __init__(self, decision):
        super().__init__(f"early abort: {decision}")
        self.decision = decision


def train(train_step, flops_per_token, peak_flops, summary, run, abort_gate=None, profiler=None,
          profile_only=False):
    """The training loop. Fills `summary` and run["loss_curve"]; raises Diverged or EarlyAbort.

    Step n's loss is read (a host sync) only after step n + 1 is launched, so the GPU always has queued work
    and never waits for Python. At step PROFILE_AT the profiler (if any) runs its steps; they train the
    model like any other step and, like compilation, are not counted against the time budget.
    """
    t_train, smooth, step, points, step_times = 0.0, 0.0, 0, [], []
    progress, excluded, pending = 0.0, EXCLUDED_STEPS, None
    clock = StepClock()

    def finish_step(done, loss, mark):
        """Wait for step `done` and account for it."""
        nonlocal t_train, progress, smooth
        loss = loss.item()  # waits for the GPU to finish step `done`
        dt = clock.elapsed(mark)
        step_times.append(dt)
        if not math.isfinite(loss) or loss > 100:
            raise Diverged(f"loss {loss} at step {done}")
        if done >= excluded:
            t_train += dt
            progress = min(t_train / TIME_BUDGET, 1.0)
        smooth = 0.9 * smooth + 0.1 * loss
        smooth_debiased = smooth / (1 - 0.9 ** len(step_times))
        if done >= excluded:
            points.append((progress, smooth_debiased))
        tok_per_s = TOTAL_BATCH_SIZE / dt
        mfu = f"{100 * flops_per_token * tok_per_s / peak_flops:.1f}%" if peak_flops else "n/a"
        print(f"\rstep {done:05d} ({100 * progress:.1f}%) | loss: {smooth_debiased:.6f} | "
              f"lrm: {lr_multiplier(progress):.2f} | dt: {dt * 1000:.0f}ms | tok/sec: {tok_per_s:,.0f} | "
              f"mfu: {mfu} | remaining: {max(0.0, TIME_BUDGET - t_train):.0f}s    ", end="", flush=True)
        decision = abort_gate.check(progress, smooth_debiased) if abort_gate and done >= excluded else None
        if decision:
            run["gate"]["decisions"].append(decision)
            if decision["abort"]:
                raise EarlyAbort(decision)

    def account():
        counted = max(1, step - excluded)
        summary.update(training_seconds=round(t_train, 1), num_steps=step,
                       total_tokens_M=round(step * TOTAL_BATCH_SIZE / 1e6, 1))
        if peak_flops and t_train > 0:
            summary["mfu_percent"] = round(100 * flops_per_token * TOTAL_BATCH_SIZE * counted / t_train / peak_flops, 2)
        run["loss_curve"] = sample_curve(points, runfile.curve_fractions())

    while True:
        if profiler is not None and step == PROFILE_AT:
            finish_step(*pending)
            pending = None
            print()
            ran = profiler(step, step_times[2:] or step_times)  # steps 0-1 compile and warm up
            step, excluded = step + ran, max(EXCLUDED_STEPS, step + ran)
            clock.restart()
            if profile_only:
                return None
        loss = train_step(step, progress)
        mark = clock.mark()
        if pending is not None:
            try:
                finish_step(*pending)
            except EarlyAbort:
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
