"""Pure: a model's first calls inside one window, the cold start a step never pays again. Stdlib only.

    found = first_calls(ix, window, events)  # {"ms", "spans", "calls", "launches", "launch_ms", "ops"} or None

A trace profiled from a model's first call (no warm-up: a profile around `model(inputs)`, the commonest public
trace) holds work no later step repeats: each kernel's first launch loads its module (CUDA's lazy loading: 0.07-1.2
ms a launch against 6-9 us once loaded, in the H200 traces own-h200-cold-*), `cudaFuncGetAttributes` and the
libraries' own set-up (cuBLAS's handles and workspaces inside the first `aten::addmm`, cuDNN's inside the first
convolution), streams and events created. Issue #57: one such window was priced as gpu_waits_on_host 297 ms a step
("cause unknown") where the host spent 125 ms in ~135 first launches and 20 ms in cudaFuncGetAttributes; the same
model warm ran 6.9 ms.

What is cold, each read from the trace's own events inside the window:
- runtime calls only a first call makes (`COLD_CALLS`);
- a kernel's first launch of FIRST_LAUNCH_US or more (its module loading);
- an operator's first call on its input shapes FIRST_OP_RATIO times its later calls' median and FIRST_OP_MIN_US
  over it (a library loaded and set up inside it; cuDNN sets up each new convolution shape: 108-139 ms for one in
  pytorch/examples' imagenet, pub-examples-imagenet-*-cold); an operator called once on its shapes,
  FIRST_OP_MIN_US of its own host time besides its waits for the GPU (an elementwise kernel's first call took
  4.6-12.7 ms of host in own-h200-cold-mlp-first-call-no-steps, autograd's first backward among them).
The GPU idle while the host was in them (`ms`) is the cold start's cost; trace/irregular.py reports it once, and
the timeline leaves those gaps to no finding (Gap.cause COLD).
"""
import re
import statistics
from collections import Counter

from profiling.profile.trace.traceio import merge, self_times

COLD = "cold first call"
COLD_CALLS = re.compile(r"^(cudaFuncGetAttributes|(cu|hip)Module(Load|GetFunction)|cuLibrary(Load|GetKernel)|"
                        r"cuKernelGet|cudaGetDriverEntryPoint|cuGetProcAddress|(cuda|hip)StreamCreate|"
                        r"(cuda|hip)EventCreate|cudaGetDeviceProperties|cuDevicePrimaryCtx|cuCtxCreate|cuInit|"
                        r"hipFuncGetAttributes)")
WAITS = re.compile(r"Synchronize|^(cuda|cu|hip)Memcpy(?!Async)|^(cuda|hip)Memcpy$")  # the host waiting for the GPU
LAUNCH = re.compile(r"^(cuda|cu|hip)(Ext)?(Module)?LaunchKernel")
FIRST_LAUNCH_US = 100.0   # a first launch this long loaded its kernel's module: 71-1,151 us (median of a run's first
                          # launches) against 6-9 us for later launches in own-h200-cold-* (H200, torch 2.11)
FIRST_OP_RATIO = 10.0     # an operator's first call this many times its later calls' median ...
FIRST_OP_MIN_US = 1000.0  # ... and this much over it: a library set up inside it (cuBLAS's first GEMM)
COLD_SHARE = 0.1          # of the window: less GPU idle in first calls than this is no cold start worth a line
SHOWN = 3


def _name(e):
    return str(e.get("name", ""))


def _overlap(spans, a, b):
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)


def _outermost(evs):
    """The events not inside an earlier one of the same thread (sorted by start, longest first)."""
    out, ends = [], {}
    for e in evs:
        key = (e.get("pid"), e.get("tid"))
        if e["ts"] >= ends.get(key, float("-inf")):
            out.append(e)
            ends[key] = e["ts"] + e["dur"]
    return out


def first_calls(ix, window, events):
    """The cold start inside `window` (start, end): {"ms": GPU idle (ms) while the host was in first calls,
    "spans": merged (start, end) of those calls, "calls": {runtime call: ms}, "launches": count of slow first
    launches, "launch_ms", "ops": {operator: ms over its later calls}}; None when it is under COLD_SHARE of the
    window. `events`: the window's device events (their busy time is not idle)."""
    a, b = window
    inside = lambda e: a <= e["ts"] <= b  # noqa: E731
    spans, calls, ops = [], Counter(), Counter()
    launched, slow, launch_us = {}, 0, 0.0
    kernel = {}
    for e in events:
        c = (e.get("args") or {}).get("correlation")
        if c is not None:
            kernel.setdefault(c, _name(e))
    for e in sorted((e for e in ix.runtime if inside(e)), key=lambda e: e["ts"]):
        name = _name(e)
        if COLD_CALLS.match(name):
            spans.append((e["ts"], e["ts"] + e["dur"]))
            calls[name] += e["dur"] / 1e3
        elif LAUNCH.match(name):
            k = kernel.get((e.get("args") or {}).get("correlation"), name)
            if k not in launched and e["dur"] >= FIRST_LAUNCH_US:
                spans.append((e["ts"], e["ts"] + e["dur"]))
                slow, launch_us = slow + 1, launch_us + e["dur"]
            launched.setdefault(k, e)
    by_call, own, found_ops = {}, {}, []
    for e, us, _ in self_times([e for e in ix.cpu_ops if inside(e)]):
        by_call.setdefault((_name(e), str((e.get("args") or {}).get("Input Dims"))), []).append(e)
        own[id(e)] = us
    waits = sorted((e["ts"], e["ts"] + e["dur"]) for e in ix.runtime if inside(e) and WAITS.search(_name(e)))
    for (name, _), evs in by_call.items():  # by operator and shapes: cuDNN sets up each new convolution shape
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        outer = _outermost(evs)  # aten::div inside aten::div is one call
        first = outer[0]
        # its waits for the GPU are no set-up (a sync, a blocking copy: SGLang's 463 ms `aten::copy_` is all
        # wait); the rest is (cudnn.benchmark's first call on a shape builds and times its candidates: 879 ms of
        # host in one `convolution_backward` of pytorch/examples' dcgan, a few syncs among them)
        wait = _overlap(waits, first["ts"], first["ts"] + first["dur"])
        if len(outer) >= 2:
            later = statistics.median(e["dur"] for e in outer[1:])
            extra = first["dur"] - wait - later if first["dur"] - wait >= FIRST_OP_RATIO * later else 0.0
        else:  # called once: its own host time
            extra = sum(own[id(e)] for e in evs) - wait
        if extra >= FIRST_OP_MIN_US:
            spans.append((first["ts"], first["ts"] + first["dur"]))
            found_ops.append((first["ts"], first["ts"] + first["dur"], name, extra / 1e3))
    kept = []  # the innermost of nested first calls (aten::addmm, not the aten::linear around it)
    for lo, hi, name, ms in sorted(found_ops, key=lambda x: x[1] - x[0]):
        if not any(lo <= c and d <= hi for c, d, _, _ in kept):
            kept.append((lo, hi, name, ms))
    for _, _, name, ms in kept:
        ops[name] += ms
    spans = merge(spans)
    busy = merge((e["ts"], e["ts"] + e["dur"]) for e in events)
    cold = sum(_overlap(spans, s, t) for s, t in spans) - sum(_overlap(busy, s, t) for s, t in spans)
    ms = max(0.0, cold) / 1e3
    if ms < COLD_SHARE * (b - a) / 1e3:
        return None
    return {"ms": round(ms, 3), "spans": spans, "calls": {k: round(v, 3) for k, v in calls.most_common()},
            "launches": slow, "launch_ms": round(launch_us / 1e3, 3),
            "ops": {k: round(v, 3) for k, v in ops.most_common()}}


def text(found):
    """The one-off line's words for a cold start."""
    parts = []
    if found["launches"]:
        n = found["launches"]
        parts.append(f"{n} first kernel launch{'es' * (n != 1)} ({found['launch_ms']:,.1f} ms: "
                     f"{'each loads its' if n != 1 else 'it loads its'} module)")
    parts += [f"`{k}` {v:,.1f} ms" for k, v in list(found["calls"].items())[:SHOWN]]
    parts += [f"the first `{k}` {v:,.1f} ms over its later calls" for k, v in list(found["ops"].items())[:SHOWN]]
    once = (f"; and it holds one iteration of the loop ({found['once']} recorded once), the first: its host ran "
            "at a first pass's pace throughout, so none of its GPU idle is priced as a step's"
            if found.get("once") else "")
    return (f"the window holds the model's first calls, cold: the GPU waited {found['ms']:,.1f} ms while the host was "
            "in them (" + "; ".join(parts) + "); no later step pays them, so that idle is left out of every finding"
            + once + "; profile after a warm-up to see the steady state (torch.profiler.schedule(wait=1, warmup=1, "
            "active=3), or one call of the model before the profile)")
