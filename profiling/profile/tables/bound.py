"""Pure: the least time the step's work could take on this device (its bound), per device event. Stdlib only.

    rate = best_gemm_rate(tl, work, peak_flops)       # FLOP/s this trace's best GEMMs reach
    rate, source = gemm_ceiling(tl, work, peak_flops)  # the same, and where it comes from in words
    bounds = event_bounds(tl, work, rate, bandwidth)  # [[us or None]] parallel to tl.per_step

An event's bound is the longer of its FLOPs at the rate of its own number format and its bytes at the device's
peak bandwidth. The rate of a format (bf16, tf32, fp32...: trace/hardware.py's compute_format, from the call's
dtypes and kernel name) is what this trace's large GEMMs of that format reach, else PRACTICAL_PEAK of the
device's peak for it, never above that peak: a float32 GEMM is not bounded at a bf16 rate. `rate`, the
ceiling of the trace's dominant format, is the one quoted (gemm_ceiling) and the one used for calls whose format
the trace does not tell.
- FLOPs of GEMMs, convolutions and attention, from their operators' recorded shapes (roofline.py; attention counts its
  useful work, so a flash kernel's recomputation is time over its bound, on sequence lengths padded to the
  kernels' tile: ATTENTION_TILE, a padding no edit of the model's code removes);
- bytes of a Triton kernel: every tensor argument once (roofline.py); of a convolution, its tensors once
  (tables/conv.py: a depthwise convolution is bound by them); of an eager operator: each recorded
  input once and an output the size of its largest input. So a chain of eager elementwise kernels is bounded
  kernel by kernel, at the bandwidth: its lost fusion shows in the eager_code finding, not here.
An event with neither (cuBLAS's and cuDNN's own bytes, copies, a trace recorded without shapes) has no bound
(None): its time is taken as needed, so no excess is ever claimed where the trace shows no work. Left out:
launch latency, and the bytes of intermediates a fused kernel keeps on chip (taken as needed).
"""
from profiling.profile.tables.roofline import ATTENTION_OP, DTYPE_BYTES, GEMM_OPS, elements, format_of, tile_padding
from profiling.profile.trace import hardware

LARGE_GEMM_FLOPS = 1e10  # GEMM calls this big set the attainable rate (smaller ones are latency-bound)
BEST_SHARE = 0.25        # the rate the fastest quarter of large-GEMM FLOPs reaches: the trace's own ceiling
                         # (default config, H100: 750-760 TFLOP/s; a bf16 8192^3 matmul alone: 745-790)
PRACTICAL_PEAK = 0.80    # without large GEMMs: this share of the datasheet peak (~798 of 989.5 TFLOP/s
                         # measured on an H100, shared/DESIGN.md)
ATTENTION_TILE = 128     # fused attention kernels tile queries and keys by 64 or 128 (cuDNN's sm90 kernels
                         # here: 64x128 forward, 64x64 backward; flash-attn 2: 128 x 64-128): a sequence
                         # length off the tile computes the padded tile anyway, so the bound counts it


def best_gemm_rate(tl, work, peak_flops):
    """FLOP/s reached by the fastest BEST_SHARE of the large GEMM calls' FLOPs, else PRACTICAL_PEAK x peak."""
    return gemm_ceiling(tl, work, peak_flops)[0]


def gemm_ceiling(tl, work, peak_flops):
    """(the ceiling of the trace's dominant number format, where it comes from, in words): a rate quoted is never
    without its source. peak_flops: the device's bf16 peak (its fallback where the device's name is unknown)."""
    fmt = dominant_format(tl, work)
    return _ceiling(tl, _large_calls(tl, work).get(fmt, []), fmt, peak_flops)


def _large_calls(tl, work):
    """{format: [(rate, flops)]} of the large GEMM calls (GEMM operators: their FLOPs over their device time)."""
    calls = {}
    for evs, cats, done in zip(tl.per_step, tl.labels, work):
        for (e, launch), cat, (flops, _) in zip(evs, cats, done):
            op = tl.op_of(launch)
            if cat == "GEMM" and flops and op is not None and GEMM_OPS.match(str(op.get("name", ""))):
                acc = calls.setdefault(id(op), [0.0, 0.0, format_of(tl, e, op)])
                acc[0], acc[1] = acc[0] + flops, acc[1] + e["dur"]
    out = {}
    for f, us, fmt in calls.values():
        if f >= LARGE_GEMM_FLOPS and us > 0:
            out.setdefault(fmt, []).append((f / us * 1e6, f))
    return out


def dominant_format(tl, work):
    """The number format most of the trace's GEMM, convolution and attention FLOPs run in (None: unrecorded)."""
    flops = {}
    for evs, cats, done in zip(tl.per_step, tl.labels, work):
        for (e, launch), (f, _) in zip(evs, done):
            if f:
                fmt = format_of(tl, e, tl.op_of(launch))
                flops[fmt] = flops.get(fmt, 0.0) + f
    known = {k: v for k, v in flops.items() if k}
    return max(known, key=known.get) if known else None


def _ceiling(tl, large, fmt, peak_flops):
    """(rate, basis) of one format: its fastest large GEMMs' rate (BEST_SHARE of their FLOPs), under the device's
    peak for it; else PRACTICAL_PEAK of that peak (of peak_flops where the format or the device is unknown)."""
    device = tl.meta.get("device")
    peak = hardware.peak_for(device, fmt) if fmt else None
    label = f"{fmt} " if fmt else ""
    large, total, seen = sorted(large, reverse=True), sum(f for _, f in large), 0.0
    for rate, f in large:
        seen += f
        if seen >= BEST_SHARE * total:
            if peak and rate > peak:
                return peak, f"{peak / 1e12:.0f} TFLOP/s, the device's {label}peak (its fastest GEMMs' FLOPs exceed it)"
            return rate, (f"{rate / 1e12:.0f} TFLOP/s, the rate of this trace's fastest large {label}GEMMs "
                          f"({100 * BEST_SHARE:.0f}% of their FLOPs)")
    peak = peak or (peak_flops if fmt in (None, "bf16", "fp16") else None)
    if not peak:
        return None, None
    return PRACTICAL_PEAK * peak, (f"{PRACTICAL_PEAK * peak / 1e12:.0f} TFLOP/s, {100 * PRACTICAL_PEAK:.0f}% of the "
                                   f"device's datasheet {label}peak (no large {label}GEMM in this trace to measure)")


def format_rates(tl, work, rate, peak_flops=None):
    """{format: FLOP/s} each format's calls are bounded at (module docstring); None -> `rate`."""
    large = _large_calls(tl, work)
    fmts = {format_of(tl, e, tl.op_of(launch)) for evs, done in zip(tl.per_step, work)
            for (e, launch), (f, _) in zip(evs, done) if f}
    rates = {fmt: _ceiling(tl, large.get(fmt, []), fmt, peak_flops)[0] for fmt in fmts if fmt}
    rates[None] = rate
    return {fmt: r or rate for fmt, r in rates.items()}


def eager_bytes(op):
    """Bytes an eager operator must move: its recorded inputs once, plus an output as large as the largest."""
    args = (op.get("args") or {}) if op else {}
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not str(op.get("name", "") if op else "").startswith("aten::") or not isinstance(dims, list) \
            or not isinstance(types, list):
        return None
    sizes = []
    for shape, dtype in zip(dims, types):
        if isinstance(shape, list) and shape and dtype in DTYPE_BYTES:
            n = elements(shape)
            if n is None:
                return None  # a tensor of unknown size: the bytes are unknown
            sizes.append(n * DTYPE_BYTES[dtype])
    return sum(sizes) + max(sizes) if sizes else None


def _padding(tl, op):
    """The tile padding (roofline.tile_padding) of the attention operator around op; 1.0 where none."""
    while op is not None and not ATTENTION_OP.match(str(op.get("name", ""))):
        op = tl.parent.get(id(op))
    return tile_padding(op, ATTENTION_TILE) if op is not None else 1.0


def event_bounds(tl, work, rate, bandwidth):
    """[[bound us or None]] parallel to tl.per_step (see the module's docstring)."""
    out, rates = [], format_rates(tl, work, rate)
    for evs, cats, done in zip(tl.per_step, tl.labels, work):
        row = []
        for (e, launch), cat, (flops, nbytes) in zip(evs, cats, done):
            if nbytes is None and not flops and cat not in ("GEMM", "attention", "memory"):
                nbytes = eager_bytes(tl.op_of(launch))
            if flops and cat == "attention":
                flops *= _padding(tl, tl.op_of(launch))
            r = rates.get(format_of(tl, e, tl.op_of(launch)), rate) if flops else None
            parts = [flops / r * 1e6 if flops and r else None,
                     nbytes / bandwidth * 1e6 if nbytes and bandwidth else None]
            parts = [p for p in parts if p is not None]
            row.append(min(e["dur"], max(parts)) if parts else None)
        out.append(row)
    return out
