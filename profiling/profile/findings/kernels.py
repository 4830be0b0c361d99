"""Pure: the findings about kernels running below their rate (profiling/profile/findings/ runs them). Stdlib only.

- fp32_matmul: GEMMs on float32 inputs, against this trace's bf16 GEMM rate (without one: a share of the
  datasheet peak, and the evidence says which).
- slow_device: large bf16 GEMMs far below the device's peak, where the trace tells a slow device from slow
  kernels (the same shapes fast at times, or none fast at all: a braked, throttled or shared GPU).
- attention_fallback: attention operators far below the fused kernels' rate (a masked fallback, the math path).
- math_attention: attention as batched matmuls and a softmax over [T, T] score matrices in a graph (no attention
  operator to judge: a hand-written attention, or a compiled SDPA with its fused backends off).
  Both price and fix the attention the model does (profiling/profile/tables/attention_kind.py): is_causal=True only for a
  causal model; a bidirectional one (BERT, ViT) keeps its full attention (the padding mask as [B, 1, 1, T], or
  none); an unknown one gets both branches, each with its condition, priced as full attention.
- attention_backend: SDPA calls on a fused backend slower than another backend the same trace runs attention on
  (the memory-efficient kernels where cuDNN's run beside them), against that backend's rate; named as the setting
  where a recorded one rules the faster backend out (the backends flags, deterministic algorithms).

Each rule takes (timeline, context, findings so far) and returns a finding or None. Rates are per operator
call: a GEMM may run as several kernels (split-K and its reduction), its FLOPs count once.
"""
import os
from collections import Counter

from profiling.profile.findings import convs, lines
from profiling.profile.findings.contract import (
    ancestors,
    capped,
    claim,
    device_share,
    finding,
    limited_note,
    rule,
    top,
    trainer_is_train_py,
    training,
)
from profiling.profile.findings.settings import attribute
from profiling.profile.findings.waste import ALIGN
from profiling.profile.tables import attention_kind
from profiling.profile.tables.attention_kind import BIDIRECTIONAL, CAUSAL, bias_masks, square_masks
from profiling.profile.tables.roofline import ATTENTION_OP, GEMM_OPS, attention_flops, causal_flag, gemm_flops
from profiling.profile.trace import device_state, hardware
from profiling.profile.trace.classify import short_name
from profiling.profile.trace.timeline import input_types
from profiling.profile.trace.whose import MODEL_FILE

LARGE_GEMM_FLOPS = 1e10    # GEMMs this big run near the device's rate when the device is healthy
SLOW_DEVICE_FRACTION = 0.40  # large bf16 GEMMs below this share of peak: the device is slow (a healthy H100 here:
                             # 0.70, benchmarks/findings/planted/diagnoses_results.md; a shared one 0.30;
                             # braked: 140 of 989, 0.14)
HOST_BOUND_MIN_SHARE = 0.005  # of the step: a precision gain a host-bound step cuts below this is no finding (as
                              # waste.EAGER_MIN_SHARE)
BEST_QUANTILE = 0.9    # a rate "at its best": what the fastest tenth of the calls reach
SPREAD_SHARE = 0.25    # the same shapes lose this share of their time against their own best: the device was
                       # slow at times (h100-plant-shared_gpu: 0.50; the healthy H100 fixtures: 0.04-0.05)
FP8_WORDS = ("e4m3", "e5m2", "fp8", "f8f8", "mxf4", "nvf4", "fp4")  # low-precision GEMM kernels, by name
EXPECTED_GEMM_FRACTION = 0.60  # what large bf16 GEMMs reach on a healthy device, for the gain estimate
ATTENTION_FAST_FRACTION = 0.45  # the fused kernels' rate, of the device's peak, when the trace has none to
                                # measure (fused cuDNN attention on the H100 here: 0.43-0.55 in causal FLOPs)
HEAD_DIM_MAX = 256     # the largest head size fused attention kernels take: a GEMM's inner dimension this small
                       # against a longer sequence is q @ k^T (the MLP's [B, T, 4C] are not: their inner C is 512+)
MATH_MIN_SHARE = 0.01  # of the step (the report's threshold)
BACKEND_MIN_SHARE = 0.01  # attention_backend: a gain below this share of the step is not reported
# SDPA's backends, by the words in the names of the ATen operators that run them (torch.nn.attention.SDPBackend)
SDPA_BACKENDS = (("cudnn", "cudnn"), ("flash", "flash"), ("efficient", "efficient"), ("math", "math"))
# an attention operator of another library (train.py's window attention runs cuDNN's frontend): by its kernels'
# names; cuDNN's first (its kernels are named `..._sdpa_sm90_flash_fprop_...`)
KERNEL_BACKENDS = (("cudnn", "cudnn"), ("fmha_cutlass", "efficient"), ("memeffattention", "efficient"),
                   ("flash", "flash"))
BACKEND_LABELS = {"cudnn": "cuDNN", "flash": "flash", "efficient": "memory-efficient", "math": "math"}
# a backend's flag (torch.backends.cuda.enable_<flag>_sdp), its SDPBackend member, the check that says why not
SDPA_NAMES = {"cudnn": ("cudnn", "CUDNN_ATTENTION", "can_use_cudnn_attention"),
              "flash": ("flash", "FLASH_ATTENTION", "can_use_flash_attention"),
              "efficient": ("mem_efficient", "EFFICIENT_ATTENTION", "can_use_efficient_attention")}


def _gemms(tl, skip=()):
    """[(first kernel, launching op or None, device us, flops or None, [its kernels])] per GEMM operator call
    of every step: a GEMM may run as several kernels (split-K and its reduction), its FLOPs count once."""
    calls = {}
    for k, evs in enumerate(tl.per_step):
        for (e, launch), cat in zip(evs, tl.labels[k]):
            if cat == "GEMM" and id(e) not in skip:
                op = tl.op_of(launch)
                row = calls.setdefault(id(op) if op is not None else id(e), [e, op, 0.0, _flops(op), []])
                row[2] += e["dur"]
                row[4].append(e)
    return list(calls.values())


def _flops(op):
    """A GEMM operator's FLOPs; None for any other operator whose kernel is a GEMM (a convolution's backward:
    the shapes [128, 256, 56, 56] and [128, 64, 56, 56] read as a batched matmul made 11.5 GFLOP of a 1x1
    convolution on the H100 ResNet-50, and a slow_device on a healthy GPU)."""
    return gemm_flops(op) if op is not None and GEMM_OPS.match(str(op.get("name", ""))) else None


def _dims(op):
    """An operator's input shapes as `[262144, 512] x [512, 2048]`."""
    dims = (op.get("args") or {}).get("Input Dims") if op else None
    shown = [d for d in dims if isinstance(d, list) and d][:2] if isinstance(dims, list) else []
    return " x ".join(str(d) for d in shown) or "?"


def _is_fp32(e, op):
    types = input_types(op)
    if types:
        return any(t in ("float", "double") for t in types[:2])
    name = str(e.get("name", "")).lower()
    return "tf32" in name or "sgemm" in name or "f32f32" in name


def _nvml(state):
    """What NVML said of the GPU during the profile, as evidence for slow_device."""
    text = device_state.text(state)
    if not text or "not available" in text:
        return ""
    events = device_state.slowing(state)
    return ("; NVML: clock events active: " + ", ".join(events) if events else
            "; NVML: no clock event slowed the GPU (another process on it?)") + f" ({text.split(': ', 1)[1]})"


@rule("fp32_matmul", needs=("device",))
def fp32_matmul(tl, ctx, found):
    """GEMMs and convolutions on float32 inputs (TF32 or full fp32 kernels), against this trace's half-precision
    rate of each (GEMMs: its bf16 GEMMs; convolutions: its half-precision ones, else convs.CONV_EXPECTED_FRACTION
    of the peak; a convolution its bytes bound keeps half its time: convs.half_ms)."""
    claimed = set(ctx.get("claimed", ()))
    conv_calls = convs.calls(tl, claimed)
    gemms = _gemms(tl, claimed | {id(e) for c in conv_calls for e in c[4]})
    fp32 = [g for g in gemms if _is_fp32(g[0], g[1])]
    fp32_convs = [c for c in conv_calls if _conv_fp32(c)]
    if not fp32 and not fp32_convs:
        return None
    half = _half_format(tl, ctx)
    ms, estimate, basis = _gemm_estimate(gemms, fp32, ctx, half) if fp32 else (0.0, 0.0, "")
    c_ms, c_estimate, c_basis = _conv_estimate(conv_calls, fp32_convs, ctx, half) if fp32_convs else (0.0, 0.0, "")
    parts = [p for _, p in sorted(((ms, basis), (c_ms, c_basis)), key=lambda x: -x[0]) if p]
    kernels, shapes = Counter(), Counter()
    for e, op, g_us, *_ in fp32 + fp32_convs:
        kernels[short_name(str(e.get("name", "")))] += 1
        shapes[_dims(op)] += g_us
    where = lines.device_lines(tl, [e for g in fp32 + fp32_convs for e in g[4]])
    evidence = ("; ".join(parts) + "; shapes " + ", ".join(s for s, _ in top(shapes, 2)) + "; kernel "
                + ", ".join(f"`{k}`" for k, _ in top(kernels, 1)) + (f"; from {where}" if where else "")
                + "; the float32 elementwise work around them is not counted")
    train = training(tl)
    fix = (("run these layers in bf16: inside torch.autocast(dtype=torch.bfloat16), with no .float() on their "
            "inputs") if half == "bf16" else ("run these layers in fp16 (this GPU has no bf16 tensor cores): inside "
                                              "torch.autocast(dtype=torch.float16)" + (" with a torch.amp.GradScaler"
                                                                                        if train else "")))
    if fp32_convs:
        fix += ("; keep the model and its inputs in channels_last (model.to(memory_format=torch.channels_last)), "
                "the layout half-precision convolutions run fastest in")
    events = [e for g in fp32 + fp32_convs for e in g[4]]
    gain = max(0.0, ms - estimate) + max(0.0, c_ms - c_estimate)
    share = device_share(tl, events, ctx, gain / (ms + c_ms) if ms + c_ms else 1.0)  # a host-bound step keeps its
    gain *= share                                                                     # length however fast they run
    if share < 1 and gain < HOST_BOUND_MIN_SHARE * ctx["step"]:
        return None  # the host's pace leaves nothing worth a finding: the kernels stay for later rules
    claim(ctx, events)
    return finding("fp32_matmul", gain, ctx, evidence + limited_note(share),
                   fix + "; the model's math stays, in lower precision")


def _conv_fp32(call):
    """Whether a convolution call runs on float32: its operator's dtypes, else its kernels' names (cuDNN's
    `scudnn`, `<float, ...>` templates)."""
    types = [t for t in input_types(call[6]) if t == "double" or t in hardware.DTYPE_FORMAT]  # tensors' dtypes
    if types:  # the innermost convolution operator's: under autocast, those of the casts
        return types[0] in ("float", "double")
    return any(hardware.compute_format((), str(e.get("name", ""))) in ("fp32", "tf32") for e in call[4])


def _half_format(tl, ctx):
    """bf16, or fp16 on GPUs whose tensor cores have no bf16 (before sm80: V100, T4, RTX 20)."""
    row = hardware.lookup(ctx.get("device"))
    return "fp16" if (tl.meta.get("compute_major") or 8) < 8 or row and row.bf16 is None else "bf16"


def _tf32(g):
    """Whether a float32 GEMM call ran on TF32 tensor cores (its kernel's name: `s1688gemm`, `tf32`)."""
    return hardware.compute_format((), str(g[0].get("name", ""))) == "tf32"


def _gemm_estimate(gemms, fp32, ctx, half):
    """(ms/step of the float32 GEMMs, ms/step in half precision, the evidence's words). A call on TF32 tensor
    cores keeps at least half its time: bf16's peak is twice TF32's (A100: 312 and 156 TFLOP/s), whatever FLOPs
    its shapes count (a batched [1024, 647, 96] x [1024, 96, 30] matmul: counted at 7x what bf16 could gain)."""
    us, flops = sum(g[2] for g in fp32), sum(g[3] or 0.0 for g in fp32)
    known_us = sum(g[2] for g in fp32 if g[3])  # GEMMs whose FLOPs the shapes give
    tf32_us = sum(g[2] for g in fp32 if _tf32(g))
    bf16 = [g for g in gemms if g[3] and not _is_fp32(g[0], g[1])]
    rate = sum(g[3] for g in bf16) / (sum(g[2] for g in bf16) / 1e6) if bf16 else \
        (EXPECTED_GEMM_FRACTION * ctx["peak"] if ctx["peak"] else None)
    ms = us / ctx["n"] / 1e3
    if not rate or not flops:
        estimate, basis = ms / 2, "half its time (" + ("no shapes recorded" if not flops else "no half-precision "
                                                       "GEMM in this trace and no known peak") + " to estimate better)"
    else:
        rest = (us - known_us) / ctx["n"] / 1e3  # those without FLOPs: half their time
        estimate = sum(max(g[3] / rate * 1e6, g[2] / 2 if _tf32(g) else 0.0) for g in fp32 if g[3]) \
            / ctx["n"] / 1e3 + rest / 2
        source = (f"this trace's {half} GEMM rate" if bf16 else f"{100 * EXPECTED_GEMM_FRACTION:.0f}% of the "
                  f"device's datasheet {half} peak (no {half} GEMM in this trace to measure)")
        basis = (f"{estimate:.1f} ms at {source}, {rate / 1e12:.0f} TFLOP/s"
                 + (f", half the time of the {rest:.1f} ms without known FLOPs" if rest >= 0.05 else "")
                 + (f"; {tf32_us / ctx['n'] / 1e3:.1f} ms of it on TF32 tensor cores, which {half} at most halves"
                    if tf32_us else ""))
    now = ""
    if flops:
        fmt = hardware.compute_format(input_types(fp32[0][1]), str(fp32[0][0].get("name", "")))
        shown, note = capped(flops / (known_us / 1e6), hardware.peak_for(ctx.get("device"), fmt))
        now = f" at {shown / 1e12:.0f} TFLOP/s" + ("" if known_us == us else " (those with known FLOPs)") + note
    return ms, estimate, f"{len(fp32) / ctx['n']:g} GEMMs/step on float32 inputs: {ms:.1f} ms/step{now}; in {half}: {basis}"


def _conv_estimate(conv_calls, fp32, ctx, half):
    """(ms/step of the float32 convolutions, ms/step in half precision, the evidence's words)."""
    n = ctx["n"]
    known = [c for c in conv_calls if c[3] and not _conv_fp32(c)]
    rate = sum(c[3] for c in known) / (sum(c[2] for c in known) / 1e6) if known else \
        (convs.CONV_EXPECTED_FRACTION * ctx["peak"] if ctx["peak"] else None)
    bandwidth = hardware.peak_bandwidth(ctx.get("device"))
    ms = sum(c[2] for c in fp32) / n / 1e3
    estimate = sum(convs.half_ms(c, rate, bandwidth, n) for c in fp32)
    flops, known_us = sum(c[3] or 0.0 for c in fp32), sum(c[2] for c in fp32 if c[3])
    now = f" at {flops / (known_us / 1e6) / 1e12:.0f} TFLOP/s" if flops else ""
    source = ("half their time (no shapes recorded to estimate better)" if not flops or not rate else
              f"their FLOPs at {rate / 1e12:.0f} TFLOP/s, " + (f"this trace's {half} convolutions' rate" if known else
                                                              f"{100 * convs.CONV_EXPECTED_FRACTION:.0f}% of the "
                                                              f"device's datasheet {half} peak (what a clean bf16 "
                                                              "ResNet-50 reaches on the H100)")
              + ", half the time of those their bytes bound")
    return ms, estimate, (f"{len(fp32) / n:g} convolutions/step on float32 inputs: {ms:.1f} ms/step{now}; in "
                          f"{half}: {estimate:.1f} ms at {source}")


@rule("slow_device", needs=("device", "peak", "shapes"))
def slow_device(tl, ctx, found):
    """Large half-precision GEMMs far below the device's peak, where the trace tells a slow device from slow
    kernels: the same shapes run at their own best rate at times and far slower at others (a shared or
    intermittently braked GPU: priced over each shape's best), or no GEMM reaches a healthy share of peak at
    all (a braked or throttled GPU: priced at EXPECTED_GEMM_FRACTION). GEMMs some of which reach a healthy
    rate, each shape at a steady one, are slow kernels (their shapes), not a slow device: no finding. Kernels
    an earlier rule priced are not priced again."""
    large = [g for g in _gemms(tl, ctx.get("claimed", ())) if g[3] and g[3] >= LARGE_GEMM_FLOPS and _half(g)
             and not _misaligned(g[1])]
    us, flops = sum(g[2] for g in large), sum(g[3] for g in large)
    if not large or us <= 0 or flops / (us / 1e6) >= SLOW_DEVICE_FRACTION * ctx["peak"]:
        return None
    rate, best = flops / (us / 1e6), _quantile([(g[3] / (g[2] / 1e6), g[2]) for g in large], BEST_QUANTILE)
    ms, n = us / ctx["n"] / 1e3, len(large) / ctx["n"]
    said = (f"{n:g} large half-precision GEMMs/step (>= {LARGE_GEMM_FLOPS:.0e} FLOP each) run at "
            f"{rate / 1e12:.0f} TFLOP/s, {100 * rate / ctx['peak']:.0f}% of the device's "
            f"{ctx['peak'] / 1e12:.0f}")
    if best < SLOW_DEVICE_FRACTION * ctx["peak"]:  # not even the fastest: the device
        expected = flops / (EXPECTED_GEMM_FRACTION * ctx["peak"]) / ctx["n"] * 1e3
        gain = ms - expected
        said += (f"; even their fastest tenth reach only {100 * best / ctx['peak']:.0f}% (a healthy GPU: "
                 f"~{100 * EXPECTED_GEMM_FRACTION:.0f}% or more): {ms:.1f} ms/step where {expected:.1f} "
                 "would do")
    else:
        gain = _below_own_best(large) / ctx["n"] / 1e3
        if gain < SPREAD_SHARE * ms:
            return None  # steady rates, some healthy: slow kernels for their shapes, not a slow device
        said += (f"; the same shapes reach {best / 1e12:.0f} TFLOP/s ({100 * best / ctx['peak']:.0f}%) at "
                 f"their best in this trace and far less at other times: {gain:.1f} ms/step over each shape's "
                 "own best rate (a GPU shared with another process, or a clock brake that came and went)")
    events = [e for g in large for e in g[4]]
    claim(ctx, events)
    return finding("slow_device", max(0.0, gain), ctx, said + "; every other kernel is likely slowed too "
                   "(not counted)" + _nvml(tl.meta.get("device_state")),
                   "check the GPU before editing code: `nvidia-smi -q -d PERFORMANCE` (clocks event reasons: "
                   "power brake, thermal), other processes on it (`nvidia-smi`), one timed 8192^3 bf16 "
                   "matmul")


def _misaligned(op):
    """Whether a GEMM's operands have a dimension not a multiple of ALIGN: slow for its shape on any device (HF
    GPT-2's 50257-word head: 121 TFLOP/s on a healthy H200), misaligned_shapes' to price, no sign of the device."""
    dims = (op.get("args") or {}).get("Input Dims") if op else None
    return isinstance(dims, list) and any(isinstance(d, list) and any(isinstance(x, int) and x % ALIGN for x in d)
                                          for d in dims[:3])


def _half(g):
    """Whether a GEMM call runs in bf16 or fp16 (the peak ctx["peak"] is): its recorded dtypes, else its
    kernel's name (no float32 and no fp8 words)."""
    fmt = hardware.gemm_format(input_types(g[1]))
    if fmt:
        return fmt in ("bf16", "fp16")
    name = str(g[0].get("name", "")).lower()
    return not _is_fp32(g[0], g[1]) and not any(w in name for w in FP8_WORDS)


def _quantile(rates, q):
    """The rate below which share q of the time runs ([(rate, us)])."""
    rates, total, acc = sorted(rates), sum(us for _, us in rates), 0.0
    for rate, us in rates:
        acc += us
        if acc >= q * total:
            return rate
    return rates[-1][0]


def _below_own_best(gemms):
    """us the GEMM calls take over what each shape's calls take at that shape's best rate (its BEST_QUANTILE
    of calls): time a shape loses only some of the time is the device's, not the shape's."""
    shapes, lost = {}, 0.0
    for g in gemms:
        shapes.setdefault(_dims(g[1]), []).append(g)
    for calls in shapes.values():
        rates = sorted(g[3] / g[2] for g in calls)
        best = rates[int(BEST_QUANTILE * (len(rates) - 1))]
        lost += sum(max(0.0, g[2] - g[3] / best) for g in calls)
    return lost


def needed_flops(op, kind, force=None):
    """FLOPs of the work an attention call needs: the pairs its own mask leaves (is_causal, a window; unrecorded:
    causal only for a causal model), and for a [T, T] mask not marked causal, what the model's kind says it
    hides (causal: the future; bidirectional or unknown: nothing). force: count the mask as causal (True) or
    full (False) whatever the kind (an unknown model's other branch)."""
    args = op.get("args") or {}
    if square_masks(args.get("Input Dims")) and causal_flag(args.get("Concrete Inputs")) is not True:
        return attention_flops(op, force=kind == CAUSAL if force is None else force)
    return attention_flops(op, causal=kind == CAUSAL)


def _attention_calls(tl, kind):
    """{(op, input dims text): (device us, calls, (flops per call needed, the same were the mask causal) or
    None, input dims, is_causal: True, False or None when unrecorded; a window op counts as causal)} of the
    attention operators that take q, k, v (the math path's kernels count under it). Kernels of compiled
    attention templates (FlexAttention in a Triton kernel) have no such operator: not judged."""
    groups, types = {}, {}
    for k, evs in enumerate(tl.per_step):
        for (e, launch), cat in zip(evs, tl.labels[k]):
            if cat in ("memory", "optimizer"):
                continue
            op = next((o for o in ancestors(tl, tl.op_of(launch)) if ATTENTION_OP.search(str(o.get("name", "")))),
                      None)
            if op is None:
                continue
            args = op.get("args") or {}
            name, dims = str(op["name"]), args.get("Input Dims")
            causal = "window" in name or causal_flag(args.get("Concrete Inputs"))
            flops = needed_flops(op, kind), needed_flops(op, kind, force=True)
            row = groups.setdefault((name, str(dims)), [0.0, set(), flops if flops[0] else None, dims, causal, []])
            row[0] += e["dur"]
            row[1].add(id(op))
            row[5].append(e)
            types.setdefault((name, str(dims)), input_types(op))
    tl._attention_types = types  # the rates quoted are held under the peak of the calls' format
    tl._attention_events = {key: row[5] for key, row in groups.items()}  # attention_fallback claims them
    return {key: (us, len(ids), f, dims, causal) for key, (us, ids, f, dims, causal, _) in groups.items()}


def fused_causal(tl, launch):
    """Whether a kernel belongs to an attention call that is causal (or a window op) off the math path: the
    form attention should take, however fast its kernel runs for these shapes (a fused kernel at head size 64
    runs well under its rate at 128); no finding prices it as slow."""
    op = next((o for o in ancestors(tl, tl.op_of(launch)) if ATTENTION_OP.search(str(o.get("name", "")))), None)
    if op is None or "attention_math" in str(op["name"]):
        return False
    return "window" in str(op["name"]) or causal_flag((op.get("args") or {}).get("Concrete Inputs")) is True


def _split_attention(tl, kind):
    """({call: (us, calls, (flops needed, flops were the mask causal) or None, rate, mask)} computing more than
    needed (the math path; a dense mask on a call not known causal), (the other calls' rate in the FLOPs their
    masks leave, or None when they have none))."""
    more, fast = {}, [0.0, 0.0]
    for (name, key), (us, n, flops, dims, causal) in _attention_calls(tl, kind).items():
        mask = square_masks(dims)
        if "attention_math" in name or (mask and causal is not True):
            more[(name, key)] = (us, n, flops, flops[0] * n / (us / 1e6) if flops and us else None, mask)
        elif flops and us:
            fast[0] += flops[0] * n
            fast[1] += us / 1e6
    return more, (fast[0] / fast[1] if fast[1] else None)


@rule("attention_fallback", needs=("device", "peak", "shapes"))
def attention_fallback(tl, ctx, found):
    """Attention that computes more than it needs, whatever the kernel family: the math path (every score of a
    [T, T] matrix, in memory), or a fused kernel given a dense [T, T] mask (it computes every score; a causal
    call or a band skips what the mask hides). Never a call that is causal on a fused kernel: a slow fused
    kernel is the kernel's (over_bound prices it). Priced at the trace's own rate of its other attention calls,
    else ATTENTION_FAST_FRACTION of the device's peak, in the FLOPs of the attention the model does
    (attention_kind: a mask hides the future only in a causal model; an unknown model is priced as one that
    attends both ways, its causal gain said beside)."""
    if not ctx["peak"] or any(f["kind"] == "slow_device" for f in found):
        return None  # on a slow device every kernel is slow: attention is not judged
    kind = attention_kind.of(tl)
    slow, own = _split_attention(tl, kind.kind)
    slow, bias = _without_fused_bias(tl, slow)
    if not slow:
        return None
    fast_rate = own or ATTENTION_FAST_FRACTION * ctx["peak"]
    gain, if_causal, parts, masked = 0.0, 0.0, [], False
    for (name, _), (us, n, flops, rate, mask) in sorted(slow.items(), key=lambda kv: -kv[1][0]):  # _: dims
        ms = us / ctx["n"] / 1e3
        target, causal_target = (f * n / fast_rate / ctx["n"] * 1e3 if flops else ms / 2 for f in flops or (0, 0))
        gain, if_causal = gain + max(0.0, ms - target), if_causal + max(0.0, ms - causal_target)
        masked = masked or bool(mask)
        fmt = hardware.compute_format(getattr(tl, "_attention_types", {}).get((name, _), ()))
        rate, note = capped(rate, hardware.peak_for(ctx.get("device"), fmt))
        parts.append(f"`{name}` {n / ctx['n']:g} calls/step{' with a dense ' + str(mask[0]) + ' mask' if mask else ''}"
                     f": {ms:.1f} ms/step" + (f" at {rate / 1e12:.0f} TFLOP/s{note}" if rate else ""))
    claim(ctx, [e for key in slow for e in getattr(tl, "_attention_events", {}).get(key, ())])
    basis = ("this trace's other attention calls run at" if own else
             f"a fused kernel runs at ~{100 * ATTENTION_FAST_FRACTION:.0f}% of the device's datasheet peak,")
    evidence = ("; ".join(parts[:3]) + f"; {basis} {fast_rate / 1e12:.0f} TFLOP/s (in the FLOPs each call's mask "
                f"leaves); the model's attention is {kind.kind}: {kind.evidence}")
    if masked:
        if kind.kind == CAUSAL:
            evidence += "; the gain holds if the mask hides the future (causal) or keeps a band"
        elif kind.kind != BIDIRECTIONAL and if_causal > gain + 0.05:
            evidence += (f"; priced as full attention (the mask may hide only padding); were the mask causal, "
                         f"is_causal=True would save {if_causal:.1f} ms/step")
        if bias:  # a float mask: a bias the model adds (certain per head), never advised away (pitfall 19)
            per_head, _ = bias
            fix = BIAS_FIX if per_head else (f"if the mask holds only 0 and -inf (padding or causal): {_mask_fix(tl, kind)}; "
                                             f"if it adds a bias to the scores: {BIAS_FIX}")
            return finding("attention_fallback", gain, ctx, evidence + "; the mask is float, " + (
                f"per head ({per_head[0]}): a bias the model adds to the scores (T5's relative positions, ALiBi), "
                "part of what it computes" if per_head else "so it may carry a bias the model adds"), fix)
        return finding("attention_fallback", gain, ctx, evidence, _mask_fix(tl, kind))
    return attribute(tl, finding("attention_fallback", gain, ctx, evidence + "; no mask: the math path ran",
                                 "let SDPA pick its fused kernel: all its backends on (torch.backends.cuda."
                                 "enable_*_sdp), no setting that rules the fused one out (deterministic "
                                 "algorithms), inputs it takes (bf16, contiguous, head size <= 256)"),
                     "math_attention")


# a float mask that is a bias: what keeps it and still runs a fused kernel (SDPA's memory-efficient backend adds an
# arbitrary float attn_mask to the scores, forward and backward; FlexAttention's score_mod computes it in the kernel)
BIAS_FIX = ("keep the mask, it is part of the model's math (never is_causal=True or no mask in its place: that "
            "changes the outputs); let a fused kernel add it: pass it to F.scaled_dot_product_attention as a "
            "contiguous attn_mask of q's dtype (its memory-efficient backend takes a float bias, forward and "
            "backward), or compute it inside FlexAttention's score_mod (flex_attention(q, k, v, score_mod=...))")


def _without_fused_bias(tl, slow):
    """(the slow calls less those on a fused kernel whose mask is a per-head bias: such a kernel computes every
    score by design, nothing to recover without changing the model's math; (per-head float masks, other batched
    float masks) of the rest, or None when neither is there)."""
    keep, per_head, other = {}, [], []
    for key, row in slow.items():
        op = next((o for o in tl.ix.cpu_ops if str(o.get("name", "")) == key[0] and
                   str((o.get("args") or {}).get("Input Dims")) == key[1]), None)
        heads, floats = bias_masks((op or {}).get("args"))
        if heads and "attention_math" not in key[0]:
            continue
        per_head, other = per_head + heads, other + floats
        keep[key] = row
    return keep, ((per_head, other) if per_head or other else None)


# what a library that builds the attention mask itself lets its user change (attention_kind.builder)
LIBRARY_REMEDIES = {
    "transformers": "under torch.compile it passes SDPA this dense mask whenever an attention_mask is given "
                    "(it cannot check the mask for padding while tracing): for batches without padding pass no "
                    "attention_mask, or load the model with attn_implementation=\"flash_attention_2\" or "
                    "\"flex_attention\"",
}
# why a library's mask sends SDPA to its math path (math_attention), and what its user can change; measured on the
# H100 with BERT-base (transformers 5.17, torch 2.11, compiled): 59.5 ms/step, 38.6 with no mask, 40.8 with the
# mask made contiguous (benchmarks/findings/live/any_model_results.md); transformers 5.24 skips the all-true
# mask when no attention_mask is given, also under torch.compile
# (masking_utils._ignore_bidirectional_mask_sdpa)
LIBRARY_MATH_REMEDIES = {
    "transformers": "under torch.compile some versions keep this mask even when no sequence is padded, expanded to "
                    "[B, 1, T, T] with a stride-0 last dimension, and every fused CUDA kernel of SDPA refuses a mask "
                    "that is not contiguous in its last dimension (torch warns: \"All fused kernels require the last "
                    "dimension of the input to have stride 1\"), so SDPA runs its math path in float32: give SDPA "
                    "no mask for batches without padding and a contiguous one otherwise (an attention function "
                    "registered with transformers' AttentionInterface that passes attn_mask=None, or "
                    "attn_mask.contiguous()), or a transformers version that skips the all-true mask",
}
BOTH_WAYS = ("keep its full attention (never is_causal=True: this model attends both ways); pass only the padding, "
             "as a [B, 1, 1, T] boolean mask, or no mask when no sequence is padded, so that SDPA can run its "
             "flash or memory-efficient kernel")


def _mask_fix(tl, kind):
    """The fix for a dense [T, T] mask, in what the model does (attention_kind) and, where a library builds the
    mask, in that library's own terms."""
    if kind.kind == CAUSAL:
        fix = "pass is_causal=True instead of a causal mask" + (
            ", or the sliding window as train.py's window attention (a band)" if trainer_is_train_py(tl.meta)
            else ", or a band/window attention kernel for a sliding window (FlexAttention, flash-attn's "
            "window_size)") + ": a dense attn_mask makes the kernel compute every score"
    elif kind.kind == BIDIRECTIONAL:
        fix = BOTH_WAYS
    else:
        fix = ("whether the model is causal is not in the trace: if the mask hides the future (a causal model), "
               "pass is_causal=True instead of it; if it hides only padding (a model that attends both ways: "
               "BERT, ViT), " + BOTH_WAYS.split("; ", 1)[1])
    if kind.builder:
        library, where = kind.builder
        fix = (f"the mask is built by {library}, in {where}: " + LIBRARY_REMEDIES.get(
            library, "see its documentation for an attention implementation that takes no dense mask")
            + f" (in the model's terms: {fix})")
    return fix


def _square(d):
    """(X, T) of a batched [.., T, T] tensor shape (a score matrix: rank 3 or more), else None."""
    if isinstance(d, list) and len(d) >= 3 and all(isinstance(x, int) for x in d) and d[-1] == d[-2]:
        x = 1
        for n in d[:-2]:
            x *= n
        return x, d[-1]
    return None


def _score_gemm(dims):
    """(X, T, d) when a batched GEMM's inputs are attention's: q @ k^T ([X, T, d] x [X, d, T], d <= HEAD_DIM_MAX
    < T) or a product with a [X, T, T] score matrix; else None."""
    shapes = [d for d in (dims or [])[:2] if isinstance(d, list) and len(d) == 3 and all(isinstance(x, int) for x in d)]
    if len(shapes) < 2:
        return None
    (x, m, k), (_, k2, n) = shapes
    if m == n and k == k2 and k <= HEAD_DIM_MAX < m:
        return x, m, k
    sq = next((_square(d) for d in shapes if _square(d)), None)
    other = next((d for d in shapes if not _square(d)), None)
    if sq and other and sq[1] >= 2 * min(other[1:]) and min(other[1:]) <= HEAD_DIM_MAX:
        return sq[0], sq[1], min(other[1:])
    return None


def _math_attention(tl):
    """(events, GEMM FLOPs) of attention computed as matmuls and a softmax in a graph: the batched GEMMs with
    attention's shapes, and the kernels reading a score matrix of theirs ([X, T, T] or [B, H, T, T], B x H = X),
    outside the optimizer and outside any attention operator (attention_fallback's)."""
    ops, scores = {}, set()
    for k, evs in enumerate(tl.per_step):
        for (e, launch), cat in zip(evs, tl.labels[k]):
            op = tl.op_of(launch) if cat not in ("optimizer", "memory") else None
            dims = (op.get("args") or {}).get("Input Dims") if op is not None else None
            if not isinstance(dims, list) or not any(isinstance(d, list) and len(d) >= 3 for d in dims):
                continue  # score matrices and batched GEMMs are 3-D or more
            if not any(ATTENTION_OP.search(str(o.get("name", ""))) for o in ancestors(tl, op)):
                ops[id(e)] = (e, cat, dims)
    for e, cat, dims in ops.values():
        g = _score_gemm(dims) if cat == "GEMM" else None
        if g:
            scores.add(g[:2])
    events, flops = [], 0.0
    for e, cat, dims in ops.values():
        g = _score_gemm(dims) if cat == "GEMM" else None
        if g and g[:2] in scores:
            events.append(e)
            flops += 2.0 * g[0] * g[1] * g[1] * g[2]
        elif cat != "GEMM" and any(_square(d) in scores for d in dims or ()):
            events.append(e)
    return events, flops


@rule("math_attention", needs=("device", "peak", "shapes"))
def math_attention(tl, ctx, found):
    """Attention computed as matmuls and a softmax over the whole [T, T] score matrix (a math path, by hand or
    a compiled SDPA with its fused backends off), against the FLOPs of the attention the model does
    (attention_kind: causal halves them; bidirectional or unknown: all of them) at the fused kernels' rate."""
    events, flops = _math_attention(tl)
    us = sum(e["dur"] for e in events)
    if not events or not flops or us / ctx["n"] / 1e3 < MATH_MIN_SHARE * ctx["step"]:
        return None
    kind = attention_kind.of(tl)
    fast = _split_attention(tl, kind.kind)[1]
    rate = fast or ATTENTION_FAST_FRACTION * ctx["peak"]
    ms = us / ctx["n"] / 1e3
    target = flops / rate / ctx["n"] * 1e3 / (2 if kind.kind == CAUSAL else 1)  # causal: half the score matrix
    ctx.setdefault("claimed", set()).update(id(e) for e in events)
    names = Counter()
    for e in events:
        names[short_name(str(e.get("name", "")))] += e["dur"]
    work = {CAUSAL: "causal attention's FLOPs"}.get(kind.kind, "full attention's FLOPs")
    evidence = (f"{len(events) / ctx['n']:g} kernels/step do attention as batched matmuls and a softmax over "
                f"[T, T] score matrices: {ms:.1f} ms/step (" + ", ".join(f"`{k}` {t / ctx['n'] / 1e3:.1f} ms"
                                                              for k, t in top(names)) +
                f"); the model's attention is {kind.kind} ({kind.evidence}); {work} at the fused kernels' "
                f"{rate / 1e12:.0f} TFLOP/s" + (" (this trace's fused attention calls)" if fast else
                                                 f" ({100 * ATTENTION_FAST_FRACTION:.0f}% of the device's datasheet "
                                                 "peak: no fused attention call in this trace to measure)")
                + f" take {target:.1f} ms" + (f" (were it causal: {target / 2:.1f} ms)" if kind.kind not in
                                              (CAUSAL, BIDIRECTIONAL) else ""))
    launched = lines.device_shares(tl, events, k=3)  # the user's lines that launched them (a backward's: its forward's)
    if launched:
        evidence += "; launched at " + ", ".join(f"{f}:{n} ({100 * share:.0f}%) `{text}`"
                                                 for (f, n), share, text in launched)
    if kind.kind == CAUSAL:
        fix = ("use F.scaled_dot_product_attention(q, k, v, is_causal=True)" + (
            " (or train.py's window attention)" if trainer_is_train_py(tl.meta) else "")
            + " with the fused backends on, not matmul + softmax")
    elif _bias_in(tl):  # a per-head float mask: a bias the model adds (pitfall 19), so no "no mask" option
        fix = ("use F.scaled_dot_product_attention(q, k, v, attn_mask=bias) with the fused backends on, not matmul "
               "+ softmax: the per-head float mask is a bias the model adds to the scores (T5's relative position "
               "bias, ALiBi), part of what it computes: keep it, as a contiguous attn_mask of q's dtype (SDPA's "
               "memory-efficient backend adds it, forward and backward), or in FlexAttention's score_mod; never "
               "is_causal=True or no mask in its place")
    elif kind.kind == BIDIRECTIONAL:
        fix = ("use F.scaled_dot_product_attention(q, k, v) with the fused backends on, not matmul + softmax; "
               + BOTH_WAYS)
    else:
        fix = ("use F.scaled_dot_product_attention with the fused backends on, not matmul + softmax, computing what "
               "the model computes (the trace does not say whether it is causal): is_causal=True only if the "
               "scores of future keys are masked now; otherwise the padding mask as [B, 1, 1, T], or none")
    if kind.kind != CAUSAL and not _bias_in(tl):  # pitfall 19: a bias added to the scores is the model's
        fix += ("; a bias the model adds to the scores (T5's relative position bias, ALiBi) stays: pass it as SDPA's "
                "float attn_mask (its memory-efficient backend adds it), never drop it")
    if launched and not any(os.path.basename(f).startswith(MODEL_FILE) for (f, _), _, _ in launched):
        # the user's own lines: an installed model's (transformers' modeling_*.py) are evidence, not a place to edit
        fix = f"at {', '.join(f'{f}:{n}' for (f, n), _, _ in sorted(launched))}: {fix}"
    if kind.builder:  # a library builds the mask: its frame and its own remedy first, in the model's terms after
        library, where = kind.builder
        fix = (f"the attention mask is built by {library}, in {where}: " + LIBRARY_MATH_REMEDIES.get(
            library, "a mask SDPA's fused kernels refuse sends it to its math path; see the library's "
            "documentation for an attention implementation that takes no dense mask") + f" (in the model's terms: "
            f"{fix})")
    return attribute(tl, finding("math_attention", max(0.0, ms - target), ctx, evidence, fix), "math_attention")


def _bias_in(tl):
    """Whether an attention call of the trace passes a per-head float mask: a bias the model adds (bias_masks)."""
    return any(bias_masks(op.get("args"))[0] for op in tl.ix.cpu_ops if ATTENTION_OP.search(str(op.get("name", ""))))


def _backend(ops, kernels):
    """The attention backend of one call: from its ATen operators' names (SDPA's backends), else from its
    kernels' names (device us by name), else "other"."""
    for name in ops:
        if name.startswith("aten::"):
            for word, backend in SDPA_BACKENDS:
                if word in name:
                    return backend
    votes = Counter()
    for name, us in kernels.items():
        low = name.lower()
        backend = next((b for word, b in KERNEL_BACKENDS if word in low), None)
        if backend:
            votes[backend] += us
    return votes.most_common(1)[0][0] if votes else "other"


def _backend_calls(tl, kind):
    """{(backend, "forward" | "backward"): {us, flops, calls, ops, kernels, sdpa, events}} of the attention calls
    (the outermost attention operator around a kernel: its FLOPs in what its mask leaves, its direction), without
    those with a dense mask that is not causal (attention_fallback's) and those whose FLOPs are unknown. `sdpa`:
    run by SDPA's ATen operators (what the backends flags choose among)."""
    calls = {}
    for k, evs in enumerate(tl.per_step):
        for (e, launch), cat in zip(evs, tl.labels[k]):
            if cat in ("memory", "optimizer"):
                continue
            ops = [o for o in ancestors(tl, tl.op_of(launch)) if ATTENTION_OP.search(str(o.get("name", "")))]
            if not ops:
                continue
            call = calls.setdefault(id(ops[-1]), {"op": ops[-1], "names": [str(o["name"]) for o in ops],
                                                  "us": 0.0, "kernels": Counter(), "events": []})
            call["us"] += e["dur"]
            call["events"].append(e)
            if cat == "attention":
                call["kernels"][short_name(str(e.get("name", "")))] += e["dur"]
    groups = {}
    for call in calls.values():
        op, names = call["op"], call["names"]
        args = op.get("args") or {}
        flops = attention_flops(op, kind == CAUSAL)
        mask = square_masks(args.get("Input Dims"))
        if not flops or mask and causal_flag(args.get("Concrete Inputs")) is not True:
            continue
        direction = "backward" if "backward" in names[-1] else "forward"
        g = groups.setdefault((_backend(names, call["kernels"]), direction),
                              {"us": 0.0, "flops": 0.0, "calls": 0, "ops": Counter(), "kernels": Counter(),
                               "sdpa": False, "events": []})
        g["us"] += call["us"]
        g["flops"] += flops
        g["calls"] += 1
        g["ops"][names[-1]] += call["us"]
        g["kernels"].update(call["kernels"])
        g["sdpa"] = g["sdpa"] or any(n.startswith("aten::") for n in names)
        g["events"] += call["events"]
    return groups


def _rate(groups, backend, direction=None):
    us = sum(g["us"] for (b, d), g in groups.items() if b == backend and direction in (None, d))
    flops = sum(g["flops"] for (b, d), g in groups.items() if b == backend and direction in (None, d))
    return flops / (us / 1e6) if us > 0 and flops > 0 else None


@rule("attention_backend", needs=("device", "shapes"))
def attention_backend(tl, ctx, found):
    """SDPA calls on a fused backend slower than another backend this trace runs attention on (cuDNN's window
    calls beside SDPA's memory-efficient kernels): their FLOPs (what each call's mask leaves) at the faster
    backend's rate, per direction. Named as the setting where a recorded one rules the faster backend out
    (settings.CAUSES "attention_backend": the backends flags, cuDNN off, deterministic algorithms); else the fix
    lists what may (those, SDPA's priority order, the inputs) and how to tell."""
    if any(f["kind"] == "slow_device" for f in found):
        return None  # on a slow device every kernel is slow: attention is not judged
    groups = _backend_calls(tl, attention_kind.of(tl).kind)
    rates = {b: _rate(groups, b) for b, _ in groups if b not in ("math", "other")}
    rates = {b: r for b, r in rates.items() if r}
    if len(rates) < 2:
        return None  # one backend (or none): nothing in the trace to compare with
    fast = max(rates, key=rates.get)
    slow = {key: g for key, g in groups.items() if key[0] in rates and key[0] != fast and g["sdpa"]}
    gain, target, parts = 0.0, 0.0, []
    for (backend, direction), g in sorted(slow.items(), key=lambda kv: -kv[1]["us"]):
        rate = _rate(groups, fast, direction) or rates[fast]
        ms, ms_fast = g["us"] / ctx["n"] / 1e3, g["flops"] / rate / ctx["n"] * 1e3
        gain, target = gain + max(0.0, ms - ms_fast), target + ms_fast
        (op, _), = top(g["ops"], 1)
        parts.append(f"`{op}` {g['calls'] / ctx['n']:g} calls/step on SDPA's {BACKEND_LABELS[backend]} backend ("
                     + ", ".join(f"`{k}`" for k, _ in top(g["kernels"], 1)) + f"): {ms:.1f} ms/step at "
                     f"{g['flops'] / (g['us'] / 1e6) / 1e12:.0f} TFLOP/s")
    if not slow or gain < BACKEND_MIN_SHARE * ctx["step"]:
        return None
    ctx.setdefault("claimed", set()).update(id(e) for g in slow.values() for e in g["events"])
    refs = Counter()
    for (b, _), g in groups.items():
        refs.update(g["ops"] if b == fast else {})
    fast_rates = ", ".join(f"{r / 1e12:.0f} TFLOP/s {d}" for d in ("forward", "backward")
                           for r in [_rate(groups, fast, d)] if r)
    shown = ", ".join(f"`{op}`" for op, _ in top(refs, 2))
    evidence = ("; ".join(parts) + f"; this trace's {BACKEND_LABELS[fast]} attention calls ({shown}) run at "
                f"{fast_rates} (FLOPs as each call's mask leaves them): the same work at those rates takes "
                f"{target:.1f} ms/step")
    flag, member, check = SDPA_NAMES[fast]
    off = (", torch.backends.cudnn.enabled, no torch.use_deterministic_algorithms(True) (cuDNN's attention has no "
           "deterministic backward)") if fast == "cudnn" else ""
    fix = (f"let SDPA run its {BACKEND_LABELS[fast]} backend for these calls: torch.backends.cuda.enable_{flag}_sdp"
           f"(True){off}; torch.nn.attention.sdpa_kernel([SDPBackend.{member}, ...], set_priority=True) around the "
           f"call tries it first; if it still runs another, its inputs rule it out (dtype, head size, an attn_mask, "
           f"strides): torch.backends.cuda.{check}(params, debug=True) says why")
    return attribute(tl, finding("attention_backend", gain, ctx, evidence, fix), "attention_backend")
