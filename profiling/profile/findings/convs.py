"""Pure: the findings about convolutions (profiling/profile/findings/ runs them). Stdlib only.

A convolution call is the outermost convolution operator around its kernels (tables/conv.py): cuDNN's and
MIOpen's kernels, the GEMMs cuDNN runs for it, the layout transposes inside it, counted once.

- slow_convolution: grouped and depthwise convolutions (ConvNeXt's 7x7 depthwise, MobileNet's) far over their
  bound: ATen's own depthwise kernels, or cuDNN's without an algorithm search, in NCHW. Their time over what a
  clean conv net's convolutions reach against their bound is the gain; the fix is the search
  (cudnn.benchmark), channels_last and half precision, none of which changes what the model computes.
- conv_layout: cuDNN's and MIOpen's layout transposes (nchwToNhwc, batched_transpose) around convolutions whose
  tensors are NCHW: their time is the gain of channels_last (a floor: NHWC kernels are also faster).
fp32_matmul (kernels.py) prices float32 convolutions with its GEMMs, through `calls` and `half_ms` here.
"""
from collections import Counter

from profiling.profile.findings.contract import claim, finding, rule, top
from profiling.profile.tables import conv
from profiling.profile.trace import settings as recorded
from profiling.profile.trace.classify import LAYOUT_TRANSPOSE, short_name

# what the convolutions of a clean conv net take against their bound: the H100 ResNet-50 fixture (compiled,
# channels_last, bf16, batch 128; tests/data/h100-any-resnet50-compiled-api): 1.76x in aggregate, the slowest
# tenth of its convolutions' time at 7.8x (a 3-channel stem, 7x7 maps)
CONV_HEALTHY_RATIO = 1.76
CONV_OVER_RATIO = 8.0      # a grouped convolution over this many times its bound is slow for its form
CONV_EXPECTED_FRACTION = 0.32  # half-precision convolutions' rate of the device's peak in that clean run (316
                               # TFLOP/s of 989.5): the price of a float32 convolution brought to bf16/fp16
MIN_SHARE = 0.01           # of the step (the report's threshold)


def calls(tl, skip=()):
    """[(first kernel, convolution operator, device us, FLOPs or None, [its kernels], bytes or None, the innermost
    convolution operator: its dtypes are what ran)] per convolution call of every step, its kernels not in `skip`
    (claimed by an earlier rule)."""
    rows = {}
    for evs, cats in zip(tl.per_step, tl.labels):
        for (e, launch), cat in zip(evs, cats):
            if cat in ("memory", "optimizer", "communication") or id(e) in skip:
                continue
            op = conv.outermost(tl, tl.op_of(launch))
            if op is None:
                continue
            row = rows.get(id(op))
            if row is None:
                inner = conv.innermost(tl, tl.op_of(launch))
                flops, nbytes = conv.work(tl, op, inner)
                row = rows[id(op)] = [e, op, 0.0, flops, [], nbytes, inner]
            row[2] += e["dur"]
            row[4].append(e)
    return [tuple(r) for r in rows.values()]


def events(tl):
    """ids of every device event a convolution call launched (GEMM rules leave them to convolution pricing)."""
    return {id(e) for c in calls(tl) for e in c[4]}


def half_ms(call, rate, bandwidth, n):
    """ms/step one float32 convolution call would take in half precision: its FLOPs at `rate`, and no less than
    half its time where its bytes, not its FLOPs, bound it (half the bytes, at the rate it moves them now)."""
    _, _, us, flops, _, nbytes, _ = call
    if not flops or not rate:
        return us / 2 / n / 1e3
    compute = flops / rate * 1e6
    memory_bound = nbytes and bandwidth and flops / nbytes < rate / bandwidth
    return max(compute, us / 2 if memory_bound else 0.0) / n / 1e3


def grouped(op):
    """Whether a convolution is grouped or depthwise: its weight's input channels fewer than its input's."""
    dims = list((op.get("args") or {}).get("Input Dims") or []) + [None] * 3
    name = str(op.get("name", ""))
    x, w = (dims[1], dims[2]) if name in conv.BACKWARD else (dims[:2] + [None, None])[:2]
    if name == "aten::cudnn_convolution_backward":
        x = dims[0]
    return isinstance(x, list) and isinstance(w, list) and len(x) >= 3 and len(w) >= 3 and w[1] < x[1] \
        and "transpose" not in name


def _benchmark(tl):
    """The recorded torch.backends.cudnn.benchmark, or None without a settings record."""
    record = tl.meta.get("settings")
    return recorded.value(record, "cudnn.benchmark") if isinstance(record, dict) else None


@rule("slow_convolution", needs=("device", "bounds", "shapes"))
def slow_convolution(tl, ctx, found):
    """Grouped and depthwise convolutions over CONV_OVER_RATIO times their bound: their time over
    CONV_HEALTHY_RATIO times it is the gain."""
    bounds = {id(e): b for evs, bs in zip(tl.per_step, tl.bounds) for (e, _), b in zip(evs, bs)}
    slow, names, shapes, us_all, bound_all = [], Counter(), Counter(), 0.0, 0.0
    for call in calls(tl, ctx.get("claimed", ())):
        first, op, us, _, evs, _, _ = call
        b = sum(bounds.get(id(e)) or 0.0 for e in evs)
        if not b or not grouped(op) or us < CONV_OVER_RATIO * b:
            continue
        slow.append(call)
        us_all, bound_all = us_all + us, bound_all + b
        direction = "backward" if str(op["name"]) in conv.BACKWARD else "forward"
        dims = (op.get("args") or {}).get("Input Dims") or []
        shapes[f"{direction} " + " x ".join(str(d) for d in dims[:3] if isinstance(d, list) and d)] += us
        for e in evs:
            names[short_name(str(e.get("name", "")))] += e["dur"]
    ms = (us_all - CONV_HEALTHY_RATIO * bound_all) / ctx["n"] / 1e3
    if not slow or ms < MIN_SHARE * ctx["step"]:
        return None
    claim(ctx, [e for c in slow for e in c[4]])
    n = ctx["n"]
    benchmark = _benchmark(tl)
    evidence = (f"{len(slow) / n:g} grouped or depthwise convolution calls/step take {us_all / n / 1e3:.1f} ms, "
                f"{us_all / bound_all:.0f}x their bound (their FLOPs and bytes at this device's rates; a clean conv "
                f"net's convolutions: {CONV_HEALTHY_RATIO:g}x): " + ", ".join(f"{s} {t / n / 1e3:.1f} ms"
                                                                          for s, t in top(shapes, 2))
                + "; kernels " + ", ".join(f"`{k}` {t / n / 1e3:.1f} ms" for k, t in top(names, 2))
                + f"; gain: their time over {CONV_HEALTHY_RATIO:g}x their bound; cudnn.benchmark: "
                + {True: "on", False: "off (cuDNN takes its heuristic's algorithm, no search)"}.get(
                    benchmark, "not recorded in this trace"))
    # in the order they recovered on the H100 ConvNeXt-T in float32
    # (benchmarks/findings/live/host_side_results.md): bf16 with channels_last 63.2 of 100.8 ms, bf16 alone
    # 54.8, cudnn.benchmark 3.3, channels_last alone 0.6
    fix = ("run these convolutions in bf16 under torch.autocast with the model and its inputs in channels_last "
           "(model.to(memory_format=torch.channels_last), inputs too), where cuDNN's depthwise kernels are fast; "
           "then let cuDNN search its algorithms for these shapes: torch.backends.cudnn.benchmark = True before the "
           "loop (" + ("off in this run" if benchmark is False else "check it is on") + "; fixed input shapes keep "
           "the search to the first step); all keep the model's math (bf16: its precision)")
    return finding("slow_convolution", ms, ctx, evidence, fix)


@rule("conv_layout", needs=("device",))
def conv_layout(tl, ctx, found):
    """Layout transposes cuDNN and MIOpen run around convolutions on NCHW tensors: their time is the gain."""
    evs, names = [], Counter()
    claimed = ctx.get("claimed", ())
    for step in tl.per_step:
        for e, _ in step:
            name = str(e.get("name", ""))
            if id(e) not in claimed and LAYOUT_TRANSPOSE.search(name):
                evs.append(e)
                names[short_name(name)] += e["dur"]
    ms = sum(e["dur"] for e in evs) / ctx["n"] / 1e3
    if ms < MIN_SHARE * ctx["step"]:
        return None
    claim(ctx, evs)
    evidence = (f"{len(evs) / ctx['n']:g} layout transposes/step ({ms:.1f} ms): " + ", ".join(
        f"`{k}` {t / ctx['n'] / 1e3:.1f} ms" for k, t in top(names, 2)) + "; the convolution library converts "
                "NCHW tensors to the NHWC layout its fast kernels take, and back; gain: their time (a floor: the "
                "NHWC kernels themselves may also run faster)")
    return finding("conv_layout", ms, ctx, evidence,
                   "keep the model and its inputs in channels_last: model.to(memory_format=torch.channels_last) "
                   "and x.to(memory_format=torch.channels_last) for each batch; the layout changes, not the math")
