"""Pure: the least time the step's work could take on this device (its bound), per device event. Stdlib only.

    rate = best_gemm_rate(tl, work, peak_flops)       # FLOP/s this trace's best GEMMs reach
    bounds = event_bounds(tl, work, rate, bandwidth)  # [[us or None]] parallel to tl.per_step

An event's bound is the longer of its FLOPs at `rate` and its bytes at the device's peak bandwidth:
- FLOPs of GEMMs and attention, from their operators' recorded shapes (roofline.py; attention counts its
  useful work, so a flash kernel's recomputation is time over its bound);
- bytes of a Triton kernel: every tensor argument once (roofline.py); of an eager operator: each recorded
  input once and an output the size of its largest input. So a chain of eager elementwise kernels is bounded
  kernel by kernel, at the bandwidth: its lost fusion shows in the eager_code finding, not here.
An event with neither (cuBLAS's and cuDNN's own bytes, copies, a trace recorded without shapes) has no bound
(None): its time is taken as needed, so no excess is ever claimed where the trace shows no work. Left out:
launch latency, and the bytes of intermediates a fused kernel keeps on chip (taken as needed).
"""
from profiling.profile.roofline import DTYPE_BYTES, GEMM_OPS, elements

LARGE_GEMM_FLOPS = 1e10  # GEMM calls this big set the attainable rate (smaller ones are latency-bound)
BEST_SHARE = 0.25        # the rate the fastest quarter of large-GEMM FLOPs reaches: the trace's own ceiling
                         # (default config, H100: 750-760 TFLOP/s; a bf16 8192^3 matmul alone: 745-790)
PRACTICAL_PEAK = 0.80    # without large GEMMs: this share of the datasheet peak (~798 of 989.5 TFLOP/s
                         # measured on an H100, shared/DESIGN.md)


def best_gemm_rate(tl, work, peak_flops):
    """FLOP/s reached by the fastest BEST_SHARE of the large GEMM calls' FLOPs, else PRACTICAL_PEAK x peak."""
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
            return rate * 1e6
    return PRACTICAL_PEAK * peak_flops if peak_flops else None


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


def event_bounds(tl, work, rate, bandwidth):
    """[[bound us or None]] parallel to tl.per_step (see the module's docstring)."""
    out = []
    for evs, cats, done in zip(tl.per_step, tl.labels, work):
        row = []
        for (e, launch), cat, (flops, nbytes) in zip(evs, cats, done):
            if nbytes is None and not flops and cat not in ("GEMM", "attention", "memory"):
                nbytes = eager_bytes(tl.op_of(launch))
            parts = [flops / rate * 1e6 if flops and rate else None,
                     nbytes / bandwidth * 1e6 if nbytes and bandwidth else None]
            parts = [p for p in parts if p is not None]
            row.append(min(e["dur"], max(parts)) if parts else None)
        out.append(row)
    return out
