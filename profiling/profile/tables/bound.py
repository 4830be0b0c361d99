"""Pure: the least time the step's work could take on this device (its bound), per device event. Stdlib only.

    rate = best_gemm_rate(tl, work, peak_flops)       # FLOP/s this trace's best GEMMs reach
    rate, source = gemm_ceiling(tl, work, peak_flops)  # the same, and where it comes from in words
    bounds = event_bounds(tl, work, rate, bandwidth)  # [[us or None]] parallel to tl.per_step

An event's bound is the longer of its FLOPs at `rate` and its bytes at the device's peak bandwidth:
- FLOPs of GEMMs and attention, from their operators' recorded shapes (roofline.py; attention counts its
  useful work, so a flash kernel's recomputation is time over its bound, on sequence lengths padded to the
  kernels' tile: ATTENTION_TILE, a padding no edit of the model's code removes);
- bytes of a Triton kernel: every tensor argument once (roofline.py); of an eager operator: each recorded
  input once and an output the size of its largest input. So a chain of eager elementwise kernels is bounded
  kernel by kernel, at the bandwidth: its lost fusion shows in the eager_code finding, not here.
An event with neither (cuBLAS's and cuDNN's own bytes, copies, a trace recorded without shapes) has no bound
(None): its time is taken as needed, so no excess is ever claimed where the trace shows no work. Left out:
launch latency, and the bytes of intermediates a fused kernel keeps on chip (taken as needed).
"""
from profiling.profile.tables.roofline import ATTENTION_OP, DTYPE_BYTES, GEMM_OPS, elements, tile_padding

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
    """(best_gemm_rate, where it comes from, in words): a rate quoted is never without its source."""
    calls = {}
    for evs, cats, done in zip(tl.per_step, tl.labels, work):
        for (e, launch), cat, (flops, _) in zip(evs, cats, done):
            op = tl.op_of(launch)
            if cat == "GEMM" and flops and op is not None and GEMM_OPS.match(str(op.get("name", ""))):
                acc = calls.setdefault(id(op), [0.0, 0.0])
                acc[0], acc[1] = acc[0] + flops, acc[1] + e["dur"]
    large = sorted(((f / us, f) for f, us in calls.values() if f >= LARGE_GEMM_FLOPS and us > 0), reverse=True)
    total, seen = sum(f for _, f in large), 0.0
    for rate, f in large:
        seen += f
        if seen >= BEST_SHARE * total:
            return rate * 1e6, (f"{rate / 1e6:.0f} TFLOP/s, the rate of this trace's fastest large GEMMs "
                                f"({100 * BEST_SHARE:.0f}% of their FLOPs)")
    if not peak_flops:
        return None, None
    return PRACTICAL_PEAK * peak_flops, (f"{PRACTICAL_PEAK * peak_flops / 1e12:.0f} TFLOP/s, "
                                         f"{100 * PRACTICAL_PEAK:.0f}% of the device's datasheet peak (no large "
                                         "GEMM in this trace to measure)")


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
    out = []
    for evs, cats, done in zip(tl.per_step, tl.labels, work):
        row = []
        for (e, launch), cat, (flops, nbytes) in zip(evs, cats, done):
            if nbytes is None and not flops and cat not in ("GEMM", "attention", "memory"):
                nbytes = eager_bytes(tl.op_of(launch))
            if flops and cat == "attention":
                flops *= _padding(tl, tl.op_of(launch))
            parts = [flops / rate * 1e6 if flops and rate else None,
                     nbytes / bandwidth * 1e6 if nbytes and bandwidth else None]
            parts = [p for p in parts if p is not None]
            row.append(min(e["dur"], max(parts)) if parts else None)
        out.append(row)
    return out
