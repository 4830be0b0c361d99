"""Pure: the host's time inside CUDA runtime and driver calls, per profiled step and by kind, and the evidence the
CUDA-call findings price (profiling/profile/findings/calls.py): the GPU idle each kind of call leaves. Stdlib only.

    s["cuda_calls"] = table(tl)      # per kind: calls/step, host ms/step, of it with the GPU idle, longest, names
    blocking_launches(tl), alloc_churn(tl), sync_calls(tl), pageable_copies(tl)    # evidence for the rules
    drained(tl, calls)               # the GPU idle that syncs or pageable copies leave
    calls_during(tl, start, end)     # the CUDA calls the host was in during a stretch (idle with no host sample)

Counted: the trace's `cuda_runtime`/`cuda_driver` events (traceio.index keeps them by correlation id) that start
inside a profiled step's CPU window (`ProfilerStep#N`). Kinds, by name (KIND_PATTERNS): launch (cudaLaunchKernel,
cuLaunchKernelEx, cudaGraphLaunch...), allocation (cudaMalloc, cudaFree, cudaHostAlloc, cuMemCreate...), copy
(cudaMemcpy*, cuMemcpy*), set (cudaMemset*, cuMemset*), synchronization (the calls that block the host until the
GPU is done: cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cuCtxSynchronize...), other
(cudaEventRecord, cudaGetDevice, cudaStreamWaitEvent: a stream waits there, the host does not).

A call's time is the host's: a long call is no defect by itself (DESIGN.md pitfall 11: in a clean H100 trace the
launch calls take ~140 ms of each step while the GPU never idles; the host waits for room in a full queue). What
prices a call is the GPU idle that comes with it: the idle while the host is inside it, and for a call that
drains the queue (a sync, a synchronous or pageable copy, cudaFree) the idle after it to the end of its step:
with nothing queued, the host's later work shows as GPU idle. The profiler's own synchronize at the window's end
(profiling/profile/capture/window.py: the last CUDA call of the last step, device-wide, made by no operator) is left out
of every figure and named under `excluded`.
"""
import bisect
import re
from collections import Counter

from profiling.profile.trace.timeline import SYNC_SLACK_US
from profiling.profile.trace.traceio import LAUNCH_SLACK_US, corr

KINDS = ("launch", "allocation", "copy", "set", "synchronization", "other")
# CUDA's runtime and driver, and ROCm's HIP runtime (hipLaunchKernel, hipExtModuleLaunchKernel, hipFree...)
KIND_PATTERNS = (
    ("launch", re.compile(r"^(cu(da)?|hip(Ext)?(Module)?)(Launch|GraphLaunch)")),
    ("allocation", re.compile(r"^(cudaMalloc|cudaFree|cudaHostAlloc|cudaHostRegister|cudaHostUnregister|cudaMemPool"
                              r"|cuMemAlloc|cuMemFree|cuMemHost(Alloc|Register|Unregister)|cuMemCreate|cuMemRelease"
                              r"|cuMemMap|cuMemUnmap|cuMemAddress|cuMemSetAccess|cuMemPool"
                              r"|hip(Ext)?Malloc|hipFree|hipHost(Malloc|Free|Register|Unregister)|hipMemPool"
                              r"|hipMem(Create|Release|Map|Unmap|Address|SetAccess))")),
    ("copy", re.compile(r"^(cu(da)?|hip)Mem(cpy|Prefetch)")),
    ("set", re.compile(r"^(cu(da)?|hip)Memset")),
    ("synchronization", re.compile(r"^(cu(da)?|hip)\w*Synchronize$")),
)
DEVICE_SYNCS = ("cudaDeviceSynchronize", "cuCtxSynchronize", "hipDeviceSynchronize")  # torch.cuda.synchronize
# the frees that wait for the device (the stream-ordered *Async ones do not)
FREES = re.compile(r"^(cudaFree|cudaFreeHost|cuMemFree|cuMemFreeHost|hipFree|hipHostFree)(_v2)?$")
FILLS = 0.5          # a gap the host spends at least this share of inside a call is that call's
TOP_NAMES = 3        # call names shown per kind


def kind(name):
    """The kind of a CUDA runtime/driver call, by its name (KIND_PATTERNS; else "other")."""
    return next((k for k, pattern in KIND_PATTERNS if pattern.match(name)), "other")


def _r(x, digits=4):
    return round(float(x), digits)


# ---------------------------------------------------------------------------------------------------------
# One pass over the calls, shared by the table and the evidence
# ---------------------------------------------------------------------------------------------------------

class Facts:
    """The calls of the profiled steps and what the GPU did meanwhile, computed once per timeline (`facts`).

    calls: [(call, kind, step)] by start (starts: their start times); idle: the GPU idle (us) while the host was
    inside each call; device: correlation -> the device event a call made (the last to end); gaps: the timeline's
    GPU idle gaps by start; excluded: the profiler's own final sync, or None; outside: calls outside every step."""

    def __init__(self, tl):
        self.tl, self.n = tl, tl.n
        steps, kinds, k = tl.ix.steps, {}, 0
        self.calls, self.outside = [], 0
        for e in sorted(tl.ix.launches.values(), key=_start):  # steps are sorted and disjoint: walk them along
            ts = e["ts"]
            while k < len(steps) and steps[k][1] < ts:
                k += 1
            if k == len(steps) or ts < steps[k][0]:
                self.outside += 1
                continue
            name = e.get("name", "")
            if name not in kinds:
                kinds[name] = kind(str(name))
            self.calls.append((e, kinds[name], k))
        self.excluded = _profiler_sync(tl, self.calls)
        if self.excluded is not None:
            self.calls = [c for c in self.calls if c[0] is not self.excluded]
        self.starts = [e["ts"] for e, _, _ in self.calls]
        self.device = {}
        for evs in tl.per_step:
            for e, _ in evs:
                c = e["args"]["correlation"]  # traceio.attribute placed it by this id
                if c not in self.device or e["ts"] + e["dur"] > self.device[c]["ts"] + self.device[c]["dur"]:
                    self.device[c] = e
        self.gaps = sorted(tl.gaps, key=lambda g: g.start)
        self.gap_starts = [g.start for g in self.gaps]
        self.idle = [self.idle_in(e["ts"], e["ts"] + e["dur"]) for e, _, _ in self.calls]
        self.longest = max((e["dur"] for e, _, _ in self.calls), default=0.0)

    def idle_in(self, start, end):
        """GPU idle (us) inside [start, end]: gaps are disjoint and sorted, so those that reach past `start`
        are the last ones that begin before `end`."""
        us, j = 0.0, bisect.bisect_right(self.gap_starts, end) - 1
        while j >= 0 and self.gaps[j].end > start:
            us += min(end, self.gaps[j].end) - max(start, self.gaps[j].start)
            j -= 1
        return us

    def claimed(self, calls):
        """The gaps calls [(call, step, drains)] leave, each once, by start: those that begin while the host is
        inside a call (SYNC_SLACK_US either side) or that it fills for FILLS or more; for a call that drains the
        queue, also every later gap of its step on the device timeline: with nothing queued, the host's later work
        in the step shows as GPU idle (as findings.host_sync counts a sync's). The calls' windows are merged
        first, so thousands of syncs a step (Inductor's nan_asserts) cost no more than their gaps."""
        spans, picked = [], set()
        for e, k, drains in calls:
            lo, end = e["ts"] - SYNC_SLACK_US, e["ts"] + e["dur"]
            spans.append((lo, max(end + SYNC_SLACK_US, self.tl.windows[k][1]) if drains else end + SYNC_SLACK_US))
            i = bisect.bisect_left(self.gap_starts, lo)
            if i > 0 and self.gaps[i - 1].end > e["ts"]:
                g = self.gaps[i - 1]
                if min(end, g.end) - max(e["ts"], g.start) >= FILLS * g.us:
                    picked.add(i - 1)
        spans.sort()
        reach = None  # the end of the merged window so far: every gap starting before it is taken once
        for lo, hi in spans:
            i = bisect.bisect_left(self.gap_starts, lo if reach is None else max(lo, reach))
            while i < len(self.gaps) and self.gaps[i].start < hi:
                picked.add(i)
                i += 1
            reach = hi if reach is None else max(reach, hi)
        return [self.gaps[i] for i in sorted(picked)]


def _start(e):
    return e["ts"]


def facts(tl):
    """The Facts of a timeline, made on first use and kept on it."""
    f = getattr(tl, "_cuda_facts", None)
    if f is None:
        f = tl._cuda_facts = Facts(tl)
    return f


def _profiler_sync(tl, calls):
    """The capture's own synchronize (capture.py syncs before its last prof.step()): a device-wide sync in the
    last step, made by no operator, after which its thread makes no other CUDA call in the step; else None."""
    last = [(e, k) for e, _, k in calls if k == tl.n - 1]
    syncs = [e for e, _ in last if str(e.get("name", "")) in DEVICE_SYNCS]
    if not syncs:
        return None
    e = syncs[-1]
    thread = (e.get("pid"), e.get("tid"))
    later = any(c["ts"] > e["ts"] and (c.get("pid"), c.get("tid")) == thread for c, _ in last)
    return None if later or tl.enclosing(e) is not None else e


# ---------------------------------------------------------------------------------------------------------
# The table: per kind, per step
# ---------------------------------------------------------------------------------------------------------

def table(tl):
    """summary["cuda_calls"]: the host's time inside CUDA calls per profiled step, by kind (plain data), or None
    for a trace with no CUDA call inside its steps.

    {steps, host_step_ms (the CPU step window, less the profiler's own sync), calls_per_step, ms_per_step, kinds: [{kind, calls_per_step,
    ms_per_step, gpu_idle_ms (of ms_per_step, the GPU idle meanwhile; the rest with a busy GPU), longest_ms,
    longest, names: [{name, calls_per_step, ms_per_step}], + for copies host_memory: {pageable, pinned, device}
    calls/step}], excluded: [{name, ms, reason}], outside_steps (calls left out: outside every step)}"""
    f = facts(tl)
    if not f.calls:
        return None
    rows = {}
    for (e, kd, _), idle in zip(f.calls, f.idle):
        r = rows.get(kd)
        if r is None:
            r = rows[kd] = {"calls": 0, "us": 0.0, "idle": 0.0, "longest": e, "names": {}, "memory": Counter()}
        dur, name = e["dur"], e.get("name", "")
        r["calls"] += 1
        r["us"] += dur
        r["idle"] += idle
        if dur > r["longest"]["dur"]:
            r["longest"] = e
        acc = r["names"].get(name)
        if acc is None:
            acc = r["names"][name] = [0, 0.0]
        acc[0] += 1
        acc[1] += dur
        if kd == "copy":
            r["memory"][_host_memory(f.device.get(corr(e)))] += 1
    n = f.n
    kinds = [_row(kd, rows[kd], n) for kd in KINDS if kd in rows]
    excluded = [] if f.excluded is None else [{
        "name": str(f.excluded.get("name", "")), "ms": _r(f.excluded["dur"] / 1e3),
        "reason": "the profiler's own synchronize at the window's end (the last call of the last step)"}]
    held = sum(s[1] - s[0] for s in tl.ix.steps) - (f.excluded["dur"] if f.excluded is not None else 0.0)
    return {"steps": n, "host_step_ms": _r(held / len(tl.ix.steps) / 1e3),
            "calls_per_step": _r(len(f.calls) / n), "ms_per_step": _r(sum(e["dur"] for e, _, _ in f.calls) / n / 1e3),
            "kinds": kinds, "excluded": excluded, "outside_steps": f.outside}


def _row(kd, r, n):
    names = sorted(r["names"].items(), key=lambda kv: (-kv[1][1], str(kv[0])))[:TOP_NAMES]
    row = {"kind": kd, "calls_per_step": _r(r["calls"] / n), "ms_per_step": _r(r["us"] / n / 1e3),
           "gpu_idle_ms": _r(r["idle"] / n / 1e3), "longest_ms": _r(r["longest"]["dur"] / 1e3),
           "longest": str(r["longest"].get("name", "")),
           "names": [{"name": str(name), "calls_per_step": _r(c / n), "ms_per_step": _r(us / n / 1e3)}
                     for name, (c, us) in names]}
    if kd == "copy":
        row["host_memory"] = {m: _r(r["memory"][m] / n) for m in ("pageable", "pinned", "device") if r["memory"][m]}
    return row


def _host_memory(ev):
    """pageable, pinned or device: the host memory a copy's device event names (`Memcpy HtoD (Pageable ->
    Device)`), or "unknown" without one."""
    name = str((ev or {}).get("name", ""))
    return "pageable" if "Pageable" in name else "pinned" if "Pinned" in name else \
        "device" if "Device -> Device" in name else "unknown"


def calls_during(tl, start, end):
    """{call name: us} of the host's time inside CUDA calls during [start, end] (all threads): what the host
    was doing in a stretch of GPU idle that no Python sample explains."""
    f = facts(tl)
    out = {}
    for i in range(bisect.bisect_left(f.starts, start - f.longest), bisect.bisect_right(f.starts, end)):
        e = f.calls[i][0]
        us = min(end, e["ts"] + e["dur"]) - max(start, e["ts"])
        if us > 0:
            name = str(e.get("name", ""))
            out[name] = out.get(name, 0.0) + us
    return out


# ---------------------------------------------------------------------------------------------------------
# Evidence for the findings: the GPU idle each kind of call leaves (pure: the rules claim the gaps)
# ---------------------------------------------------------------------------------------------------------

def idle_ms(gaps, n):
    """ms/step of GPU idle in these gaps, each counted once."""
    return sum({id(g): g.us for g in gaps}.values()) / max(1, n) / 1e3


def blocking_launches(tl):
    """Launch calls that returned only after their kernel had finished: the host was held in the call for the
    kernel's whole run (a synchronous launch: CUDA_LAUNCH_BLOCKING=1, a debugging mode), so it queued nothing
    ahead, and the GPU idles after each such kernel until the host has launched the next. Back-pressure is the
    other long launch: into a full queue, it returns long before its kernel runs, the GPU busy meanwhile. Sets
    and async copies (not pageable ones: pageable_copies) are looked at too: a blocking mode holds them as well.

    {calls_per_step, ms_per_step: host ms in launch calls, idle_inside_ms: of it with the GPU idle, busy_ms: with
    the GPU busy (back-pressure), queued_per_step: launches, sets and async copies with a device event,
    held_per_step: those held, held_ms: host ms/step in them, names: {name: held calls/step}, gaps: [Gap] the
    idle right after each held kernel, idle_ms: theirs per step}"""
    f = facts(tl)
    after = {id(g.before): g for g in f.gaps}
    calls = queued = held = 0
    us = inside_us = held_us = 0.0
    names, gaps = Counter(), []
    for (e, kd, _), inside in zip(f.calls, f.idle):
        if kd == "launch":
            calls, us, inside_us = calls + 1, us + e["dur"], inside_us + inside
        elif kd not in ("set", "copy") or "Async" not in str(e.get("name", "")):
            continue
        ev = f.device.get(corr(e))
        if ev is None or _host_memory(ev) == "pageable":
            continue
        queued += 1
        if ev["ts"] + ev["dur"] > e["ts"] + e["dur"] + LAUNCH_SLACK_US:
            continue
        held, held_us = held + 1, held_us + e["dur"]
        names[str(e.get("name", ""))] += 1
        if id(ev) in after:
            gaps.append(after[id(ev)])
    n = f.n
    return {"calls_per_step": calls / n, "ms_per_step": us / n / 1e3, "idle_inside_ms": inside_us / n / 1e3,
            "busy_ms": (us - inside_us) / n / 1e3, "queued_per_step": queued / n, "held_per_step": held / n,
            "held_ms": held_us / n / 1e3, "names": {k: v / n for k, v in names.most_common()}, "gaps": gaps,
            "idle_ms": idle_ms(gaps, n)}


def alloc_churn(tl):
    """The allocation and free calls of the profiled steps (cudaMalloc, cudaFree, cudaHostAlloc, cuMemCreate...):
    how many per step and in how many steps, the host's time in them, who made them, and the GPU idle they leave
    (Facts.claimed; a free waits for the device, so the idle after it to the end of its step counts too).

    {calls_per_step, ms_per_step, steps_with: how many steps made any, names: {name: calls/step}, chains:
    [(operator chain, calls/step)] most first (() where no operator was around: torch.cuda.empty_cache() and the
    like), calls: [(call, step)], gaps: [Gap], idle_ms: their GPU idle per step, idle_inside_ms: the GPU idle
    while the host was inside them, busy_inside_ms: the host's time in the calls that are not frees while the GPU
    was busy (its own work there, which delays the launches after it; a free's is its wait for the device)}"""
    f = facts(tl)
    calls = [(e, k, inside) for (e, kd, k), inside in zip(f.calls, f.idle) if kd == "allocation"]
    gaps = f.claimed((e, k, bool(FREES.match(str(e.get("name", ""))))) for e, k, _ in calls)
    n = f.n
    names = Counter(str(e.get("name", "")) for e, _, _ in calls)
    chains = Counter(tl.chain(tl.enclosing(e)) for e, _, _ in calls)
    return {"calls_per_step": len(calls) / n, "ms_per_step": sum(e["dur"] for e, _, _ in calls) / n / 1e3,
            "steps_with": len({k for _, k, _ in calls}), "names": {k: v / n for k, v in names.most_common()},
            "chains": [(c, v / n) for c, v in chains.most_common()], "calls": [(e, k) for e, k, _ in calls],
            "gaps": gaps, "idle_ms": idle_ms(gaps, n), "idle_inside_ms": sum(i for _, _, i in calls) / n / 1e3,
            "busy_inside_ms": sum(e["dur"] - i for e, _, i in calls if not FREES.match(str(e.get("name", ""))))
            / n / 1e3}


def sync_calls(tl):
    """The calls that block the host until the GPU is done: the synchronization kind, and copies that are not
    `Async` (cudaMemcpy, cuMemcpyDtoH_v2); the profiler's own final sync left out. [{call, name, step, chain:
    the operators around it, innermost first (() for torch.cuda.synchronize() and the like)}] by time; the GPU
    idle they leave: drained(tl, calls)."""
    return _each(tl, lambda e, kd: kd == "synchronization" or kd == "copy" and "Async" not in str(e.get("name", "")))


def pageable_copies(tl):
    """Copies between the GPU and pageable host memory (their device event says `Pageable`): the driver stages
    them through a pinned buffer and the host waits in the call, so they drain the queue as a sync does.
    [{call, name, step, chain, direction: the device event's name, bytes, device_us}] by time."""
    f = facts(tl)
    out = _each(tl, lambda e, kd: kd == "copy" and _host_memory(f.device.get(corr(e))) == "pageable")
    for c in out:
        ev = f.device[corr(c["call"])]
        c.update(direction=str(ev.get("name", "")), bytes=(ev.get("args") or {}).get("bytes"), device_us=ev["dur"])
    return out


def _each(tl, select):
    f = facts(tl)
    return [{"call": e, "name": str(e.get("name", "")), "step": k, "chain": tl.chain(tl.enclosing(e))}
            for e, kd, k in f.calls if select(e, kd)]


def drained(tl, calls, to_step_end=True):
    """The GPU idle gaps that calls of sync_calls / pageable_copies leave (Facts.claimed: the queue drained),
    each once, by start. `to_step_end` False: only the gaps that begin while the host is inside a call (or that
    it fills), not the host's later work in the step (a trace whose host time the profiler inflated)."""
    return facts(tl).claimed((c["call"], c["step"], to_step_end) for c in calls)
