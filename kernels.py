"""
Fast CUDA ops for train.py, each beside a plain-PyTorch reference with the same arguments. Fixed: the agent
never edits this file (program.md); train.py calls it.

    rotary_norm(x, cos, sin)                        RMSNorm(rotary(x)) of [B, T, H, D] queries or keys
    attention_masks(windows, seq_len, device)       one mask per window size, for attention()
    attention(q, k, v, mask)                        causal (sliding-window) attention on [B, H, T, D]
    head_loss(x, weight, targets, reduction, cap)   cross-entropy of the soft-capped logits x @ weight.T

Each op takes its fast path (Triton, cuDNN) where that applies: CUDA tensors, the library installed, the
shapes, dtypes and mask it was written for. Elsewhere it runs its reference (`*_reference`), and on CUDA
prints one line, once per op and reason, naming the op and why: an edit that changes a shape or a mask gets
a correct, slower run, never a crash. Without CUDA (the CPU preset) the references are the plan: no notice.
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton ships with torch on Linux; without it every op runs its reference
    triton = None
try:  # cuDNN's Python API (nvidia-cudnn-frontend, Linux): sliding-window attention
    import cudnn
except ImportError:
    cudnn = None

FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_noticed = set()


@torch.compiler.assume_constant_result  # runs while torch.compile traces: prints, and no graph break
def notice(op, reason):
    """Say once per (op, reason) that `op` runs its plain-PyTorch reference, and why. Reasons hold only
    what is constant while torch.compile traces (dims, dtypes, flags), never sizes: those may be symbolic."""
    if (op, reason) not in _noticed:
        _noticed.add((op, reason))
        print(f"kernels: {op} runs in plain PyTorch (slower): {reason}", flush=True)
    return True


# ---------------------------------------------------------------------------
# Rotary embedding + RMSNorm of queries and keys
# ---------------------------------------------------------------------------


def rotary_norm_reference(x, cos, sin):
    """RMSNorm (no weights) of x rotated by (cos, sin): the pairs (x1, x2) of its two halves become
    (x1 cos + x2 sin, x2 cos - x1 sin)."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    y = torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)
    return F.rms_norm(y, (y.size(-1),))


def rotary_norm(x, cos, sin):
    """RMSNorm(rotary(x)) of [B, T, H, D] queries or keys, cos and sin [1, T, 1, D / 2]. On CUDA one Triton
    kernel each way: compiled, the rotary's slices and cat took 2.4x the bytes-moved time (26.7 vs 14.1 ms
    per step, issue #9)."""
    if not x.is_cuda:
        return rotary_norm_reference(x, cos, sin)
    problem = _rotary_problem(x, cos, sin)
    if problem:
        notice("rotary_norm", problem)
        return rotary_norm_reference(x, cos, sin)
    return torch.ops.autoresearch.rotary_norm(x.contiguous(), cos.contiguous(), sin.contiguous())


def _rotary_problem(x, cos, sin):
    """Why the rotary kernels cannot take these inputs, or None."""
    if triton is None:
        return "Triton is not installed"
    if x.dim() != 4:
        return f"x is {x.dim()}-d; the kernel takes [B, T, H, D]"
    if x.size(-1) % 2:
        return "x's head dim is odd; the rotation pairs its two halves"
    if cos.dim() != 4 or sin.dim() != 4 or cos.shape != sin.shape or (cos.size(0), cos.size(2)) != (1, 1) \
            or cos.size(1) != x.size(1) or cos.size(3) * 2 != x.size(3):
        return "cos and sin are not [1, T, 1, D / 2] with x's T and D; the kernel reads them so"
    if x.dtype not in FLOATS or cos.dtype not in FLOATS or sin.dtype not in FLOATS:
        return f"dtypes {x.dtype}, {cos.dtype}, {sin.dtype}; the kernel takes bfloat16, float16 or float32"
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return "cos or sin requires grad; the kernel has no gradient for them"
    return None


# ---------------------------------------------------------------------------
# Attention: plain causal on SDPA (cuDNN first), sliding windows on cuDNN's band mask
# ---------------------------------------------------------------------------

# Plain causal attention: cuDNN's fused kernel first, then the others as fallbacks.
CAUSAL_BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                   SDPBackend.MATH]


def window_mask(window):
    """Key j is visible to query i when 0 <= i - j <= window (window >= sequence length: plain causal)."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)
    return mask_mod


def dense_mask(window, seq_len, device):
    """[T, T] boolean mask of window_mask(window)."""
    i = torch.arange(seq_len, device=device)
    return window_mask(window)(None, None, i[:, None], i[None, :])


def attention_masks(windows, seq_len, device):
    """One mask per window size: None for a window that covers the sequence (plain causal), the window
    itself on CUDA (cuDNN's band mask), else a dense boolean mask."""
    masks = {}
    for w in set(windows):
        if w >= seq_len:
            masks[w] = None
        elif device.type == "cuda":
            masks[w] = w
        else:
            masks[w] = dense_mask(w, seq_len, device)
    return masks


def attention_reference(q, k, v, mask):
    """Causal attention on [B, H, T, D] (kv heads may be fewer): mask None (plain causal), a window size
    (an int) or a dense mask (boolean: True where a key is visible; or float, added to the scores)."""
    gqa = q.size(1) != k.size(1)
    if isinstance(mask, int):
        mask = dense_mask(mask, q.size(2), q.device)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def attention(q, k, v, mask):
    """Causal sliding-window attention on [B, H, T, D] tensors; mask from attention_masks().

    The windows run on cuDNN's band mask: forward + backward 5.2 ms per S layer against FlexAttention's
    6.6 on an H100 (benchmarks/train_speed/attention_variants.py, issue #9)."""
    gqa = q.size(1) != k.size(1)
    if mask is None:
        with sdpa_kernel(CAUSAL_BACKENDS, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if isinstance(mask, bool) or not isinstance(mask, (int, torch.Tensor)):
        raise TypeError(f"attention: mask must be None, a window size (int) or a mask tensor, got "
                        f"{type(mask).__name__}")
    if isinstance(mask, int) and q.is_cuda:
        problem = _window_problem(q, k, v, mask)
        if problem is None:
            return torch.ops.autoresearch.window_attention(q, k, v, mask)[0]
        notice("attention", problem)
    elif isinstance(mask, torch.Tensor) and q.is_cuda:
        notice("attention", "a dense mask tensor runs on SDPA's masked kernels; a window size (an int, as "
                            "attention_masks() gives on CUDA) runs on cuDNN's band mask")
    return attention_reference(q, k, v, mask)


def _window_problem(q, k, v, window):
    """Why cuDNN's band-mask attention cannot take these inputs, or None."""
    if cudnn is None:
        return "cuDNN's Python API is not installed (nvidia-cudnn-frontend; uv sync installs it on Linux)"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or k.shape != v.shape:
        return "q, k, v are not all [B, H, T, D], or k and v differ; the kernel takes that"
    B, H, T, D = q.shape
    if k.size(0) != B or k.size(2) != T or k.size(3) != D or H % k.size(1):
        return "q and k differ in B, T or D, or the kv heads do not divide the heads"
    if not (q.dtype == k.dtype == v.dtype and q.dtype in (torch.bfloat16, torch.float16)):
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}; cuDNN's attention takes bfloat16 or float16"
    if D % 8 or D > 128:
        return "head dim over 128 or not a multiple of 8; cuDNN's attention here takes those only"
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        return "the head dim is not contiguous (stride(-1) != 1)"
    if window < 0:
        return "the window is negative"
    return None


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

LOSS_MAX_VOCAB = 2**16  # the kernel holds a row of logits whole in one program; larger rows: not measured


def head_loss_reference(x, weight, targets, reduction="mean", cap=15.0):
    """Cross-entropy of cap * tanh(x @ weight.T / cap) in float32 (cap None: no soft cap); targets of -1
    are not counted."""
    logits = F.linear(x, weight).float()
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction=reduction)


def head_loss(x, weight, targets, reduction="mean", cap=15.0):
    """[N, C] hidden states, [V, C] head weight, [N] targets -> the mean loss over counted targets (not -1),
    or with reduction="none" the [N] float32 per-token losses (0 where the target is -1).

    On CUDA the loss is one Triton kernel that reads each row of logits once and writes, in its place, the
    loss's gradient; the backward scales the head's two GEMMs by the upstream gradient. The float32
    capped logits are never stored, and the logits never sit beside their gradient (the compiled
    definition: 17.8 vs 14.2 ms per micro-batch, benchmarks/train_speed/loss_kernel.py)."""
    if not x.is_cuda:
        return head_loss_reference(x, weight, targets, reduction, cap)
    grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    problem = _loss_problem(x, weight, targets, reduction, cap, grad)
    if problem:
        notice("head_loss", problem)
        return head_loss_reference(x, weight, targets, reduction, cap)
    if reduction == "mean" and grad:
        return FusedHeadLoss.apply(x, weight, targets.contiguous(), cap)
    losses = torch.ops.autoresearch.softcap_ce_(F.linear(x, weight), targets.contiguous(), cap, False)
    return losses if reduction == "none" else losses.sum() / (targets != -1).sum()


def _loss_problem(x, weight, targets, reduction, cap, grad):
    """Why the loss kernel cannot take these inputs, or None."""
    if triton is None:
        return "Triton is not installed"
    if x.dim() != 2 or weight.dim() != 2 or targets.dim() != 1 or targets.size(0) != x.size(0):
        return (f"x, weight, targets are {x.dim()}-d, {weight.dim()}-d, {targets.dim()}-d (or N differs); "
                "the kernel takes [N, C], [V, C], [N]")
    if x.dtype not in FLOATS or weight.dtype not in FLOATS or targets.dtype != torch.int64:
        return f"dtypes {x.dtype}, {weight.dtype}, {targets.dtype}; the kernel takes floats and int64 targets"
    if weight.size(0) > LOSS_MAX_VOCAB:
        return f"vocabulary over {LOSS_MAX_VOCAB}; the kernel holds a row of logits whole"
    if cap is None:
        return "cap None (no soft cap); the kernel soft-caps"
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0:
        return "cap is not a positive number; the kernel soft-caps by one"
    if reduction not in ("mean", "none"):
        return f"reduction '{reduction}'; the kernel does 'mean' and 'none'"
    if reduction == "none" and grad:
        return "reduction 'none' with gradients; the kernel's per-token losses have no backward"
    return None


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
