"""Reading torch.profiler Chrome traces: load and check a file, index its events in one pass, and give each
device event to the step that launched it. Stdlib, and orjson for speed.

Bad input raises UserError with a one-line message (the CLI prints it and exits 2).
"""
import bisect
import gzip
import json
import os
import shutil
import tempfile

import orjson

from profiling.errors import UserError
from profiling.profile.trace.iterations import (  # noqa: F401 (DATALOADER_NEXT, ITERATION_NAME: read from here too)
    COMPILE_MARK,
    compile_spans,
    DATALOADER_NEXT,
    ITERATION_NAME,
    iterations,
    startup,
)

STEP_PREFIX = "ProfilerStep#"
WHOLE_TRACE = "whole trace"  # the one window of a trace without ProfilerStep markers
GRAPH_CALL_PREFIX = "## Call CompiledFxGraph "  # inductor's annotation around one call of a compiled graph
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
AUTOGRAD_OP = "autograd::engine::evaluate_function"  # the autograd engine runs a backward node
MAX_CHAIN = 8           # operators around a launch looked at
LAUNCH_SLACK_US = 1.0   # CPU and GPU clocks agree to better than this
KNOWN_CATS = DEVICE_CATS | LAUNCH_CATS | {"cpu_op", "user_annotation", "gpu_user_annotation", "trace"}
OLD_CATS = {"operator": "cpu_op"}  # torch <= 1.9 named CPU operators `Operator` (Kernel, Runtime: lowered)


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------

def read_json(path):
    """The JSON in a file, gzip or plain; UserError when unreadable or not JSON."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise UserError(f"{path}: not a valid gzip file ({e})") from None
    return parse_json(data, path)


def parse_json(data, path):
    """The JSON in `data` (bytes, already decompressed) read from `path`; UserError when it is not JSON."""
    try:
        return orjson.loads(data)  # 2-3x faster than json on traces; strict (no NaN): json decides then
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path}: not JSON ({reason}); expected a torch.profiler Chrome trace") from None


def exported_events(prof):
    """The events of a finished torch.profiler session (`prof`, already stopped), through a temporary Chrome
    trace file (the only export torch.profiler has)."""
    tmp = tempfile.mkdtemp(prefix="autoresearch-trace-")
    try:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return read_json(path).get("traceEvents") or []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_events(trace, source="trace"):
    """Raise UserError unless `trace` is a dict with a traceEvents list."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise UserError(f"{source}: not a torch.profiler trace (no traceEvents list); "
                        "export one with prof.export_chrome_trace(PATH)")


def check_content(has_work, source="trace"):
    """Raise UserError unless the trace has device events or CPU ops. ProfilerStep markers are not needed: a
    trace without them is read as one window (`index`)."""
    if not has_work:
        raise UserError(f"{source}: no device events and no CPU operators; nothing to summarize")


def check_trace(trace, source="trace"):
    """Raise UserError (one line) unless `trace` is a torch.profiler trace with something to sum."""
    check_events(trace, source)
    has_work = any(isinstance(e, dict) and str(e.get("cat", "")).lower() in DEVICE_CATS | {"cpu_op"}
                   for e in trace["traceEvents"])
    check_content(has_work, source)


def load_trace(path):
    """Read a torch.profiler Chrome trace (gzip or plain JSON) and check it; bad input raises UserError."""
    trace = read_json(path)
    check_trace(trace, source=str(path))
    return trace


# ---------------------------------------------------------------------------------------------------------
# One pass over the events
# ---------------------------------------------------------------------------------------------------------

MODULE_PREFIX = "nn.Module: "


class Index:
    """What the summary needs from a trace, found in one pass (see `index`)."""

    def __init__(self):
        self.steps = []        # (start, end, name), sorted by start
        self.optimizer = []    # (start, end) of optimizer annotation windows, merged
        self.optimizer_marks = []  # the optimizer annotations themselves (closures.own_windows cuts closures out)
        self.launches = {}     # correlation -> launch event
        self.device = []       # device events
        self.cpu_ops = []
        self.graph_calls = []  # `## Call CompiledFxGraph <key> ##` annotations (profiling/profile/tables/lines.py)
        self.modules = []      # `nn.Module: <Class>_<k>` scopes (with_stack/with_modules; profiling/profile/tables/regions.py)
        self.runtime = []      # every CUDA/HIP runtime and driver call (`startup`)
        self.startup = None    # one window: the run's start-up left out of it (`startup`)
        self.compiles = []     # Dynamo's and Inductor's compile annotations and frames (COMPILE_MARK)
        self.annotations = []  # the user's own record_function annotations (`iterations`: one call's loop)
        self.python = []       # with_stack's Python frames (irregular.py: what ran only in a one-off step)
        self.one_off = []      # the steps and spans that do not repeat, left out of the steps (irregular.split)
        self.loader = []       # the DataLoader's `enumerate(DataLoader)#...__next__` spans, operators or annotations
        self.span = None       # (start, end) of the recorded window
        self.whole = False     # no ProfilerStep markers: `steps` is one window over the whole trace
        self.iterations = None  # no ProfilerStep markers, but iterations from what repeats (`iterations`)


def has_shapes(cpu_ops, first=2000):
    """Whether the trace recorded operator input shapes (record_shapes=True): its first operators show it."""
    return any((op.get("args") or {}).get("Input Dims") for op in cpu_ops[:first])


def num(x):
    """True for an int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def corr(e):
    """The CUPTI correlation id linking a launch to its device events, or None."""
    args = e.get("args")
    return args.get("correlation") if isinstance(args, dict) else None


def index(events):
    """One pass over the events: steps, optimizer windows, launches by correlation, device events, CPU ops."""
    ix, lo, hi = Index(), None, None
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        if cat not in KNOWN_CATS:
            cat = str(cat).lower()
            cat = OLD_CATS.get(cat, cat)
        if not isinstance(name, str):
            name = str(name)
        if cat in DEVICE_CATS:
            ix.device.append(e)
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not (num(ts) and num(dur)) or cat.startswith("gpu_"):
            continue
        if cat == "trace":
            ix.span = (ts, ts + dur)
            continue
        lo, hi = (ts, ts + dur) if lo is None else (min(lo, ts), max(hi, ts + dur))
        if name.startswith(DATALOADER_NEXT):  # whatever its category (an operator in older traces)
            ix.loader.append(e)
        if cat in LAUNCH_CATS:
            ix.runtime.append(e)
        if cat in LAUNCH_CATS and corr(e) is not None:
            ix.launches[corr(e)] = e
        elif name.startswith(STEP_PREFIX):
            ix.steps.append((ts, ts + dur, name))
        elif name.lower().startswith("optimizer"):
            ix.optimizer_marks.append(e)
        elif name.startswith(GRAPH_CALL_PREFIX):  # a user_annotation, or a cpu_op in a trace without shapes
            ix.graph_calls.append(e)
        elif cat == "cpu_op":
            ix.cpu_ops.append(e)
        elif COMPILE_MARK.search(name):
            ix.compiles.append(e)
        elif cat == "python_function":
            (ix.modules if name.startswith(MODULE_PREFIX) else ix.python).append(e)
        elif cat == "user_annotation" and not name.startswith(DATALOADER_NEXT):
            ix.annotations.append(e)
    ix.steps.sort()
    if not ix.steps and lo is not None and (ix.device or ix.cpu_ops):  # no markers (a trace made without a
        found = iterations(ix, lo, hi)                                  # schedule): what repeats, else one window
        if found:
            ix.steps, ix.iterations = found
        else:  # the host's whole span, one step, after the run's start-up where the trace holds it
            ix.startup = startup(ix.runtime, ix.device or ix.cpu_ops, lo, hi, compile_spans(ix.compiles))
            ix.steps, ix.whole = [(ix.startup["end"] if ix.startup else lo, hi, WHOLE_TRACE)], True
    ix.optimizer = merge((m["ts"], m["ts"] + m["dur"]) for m in ix.optimizer_marks)
    if ix.span is None and lo is not None:  # no recorded window: allow the GPU to lag by the CPU span
        ix.span = (lo, hi + max(hi - lo, 1e6))
    return ix


def merge(intervals):
    """Sorted, disjoint (start, end) intervals covering the same time."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def union_length(intervals):
    """Total time covered by (start, end) intervals, overlaps counted once."""
    return sum(end - start for start, end in merge(intervals))


def find(windows, starts, t):
    """Index of the window (start, end, ...) containing time t, or None."""
    i = bisect.bisect_right(starts, t) - 1
    return i if i >= 0 and t <= windows[i][1] else None


def self_times(ops):
    """[(op, self_us, top_level)] with self time = duration minus direct children, per thread."""
    by_thread = {}
    for e in ops:
        if num(e.get("ts")) and num(e.get("dur")):
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    result = []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [event, children_us]
        for e in evs:
            while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= e["ts"]:
                result.append(_closed(stack.pop(), not stack))
            if stack:
                stack[-1][1] += e["dur"]
            stack.append([e, 0.0])
        while stack:
            result.append(_closed(stack.pop(), not stack))
    return result


def _closed(entry, top_level):
    e, children = entry
    return e, max(0.0, e["dur"] - children), top_level


# ---------------------------------------------------------------------------------------------------------
# Device events -> the steps that launched them
# ---------------------------------------------------------------------------------------------------------

def bogus(e, launch, span):
    """Why a device event's timestamps cannot be true (pytorch/pytorch#192021), or None."""
    ts, dur = e.get("ts"), e.get("dur")
    if not (num(ts) and num(dur)):
        return "no timestamp"
    if ts <= 0:
        return "zero timestamp"
    if dur <= 0:
        return "end before start" if dur < 0 else "zero duration"
    if launch is not None and ts < launch["ts"] - LAUNCH_SLACK_US:
        return "starts before its launch"
    if span is not None and not span[0] <= ts <= span[1]:
        return "starts outside the trace span"
    if span is not None and dur > span[1] - span[0]:
        return "longer than the whole trace"
    return None


def attribute(ix):
    """Device events per step, by launch; plus what was not counted and why."""
    starts = [s[0] for s in ix.steps]
    first_launch = min((c for c in ix.launches if num(c)), default=None)
    per_step = [[] for _ in ix.steps]
    out = {"bogus": [], "unlaunched": [], "before": 0, "outside": 0, "seen": set()}
    for e in ix.device:
        c = corr(e)
        launch = ix.launches.get(c)
        reason = bogus(e, launch, ix.span)
        out["seen"].add(c)
        if reason:
            out["bogus"].append((e, reason))
        elif launch is None:
            early = first_launch is not None and num(c) and c < first_launch
            if early:
                out["before"] += 1
            else:
                out["unlaunched"].append(e)
        else:
            k = find(ix.steps, starts, launch["ts"])
            if k is None:
                out["outside"] += 1
            else:
                per_step[k].append((e, launch))
    return per_step, out


HOST_EDGE_US = 1000.0  # host work beyond the GPU's span that a marker-less window takes in: the profiler's own exit
                       # and a last launch's return take tens of us (29 us after a Particle Transformer's last kernel)


def step_windows(per_step, steps, host=False, device=()):
    """(start, end) of each step on the device timeline: from its first device event to the next step's first
    (the last step: to its last device event), so steps tile the timeline. `steps`: the CPU step windows.
    `host` (a trace without ProfilerStep markers, whose steps were read from what it holds): the first window
    also begins where the host's first step does and the last ends where the host's last step ends, when they
    lie outside the GPU's span, so the host's work before the first kernel and after the last (a DataLoader's
    first batch, a tokenizer, a save, a log) is the steps' as well (issue #57: 2,690 and 8,666 ms of host
    activity were read as 22.9 and 67 ms windows, their DataLoader waits of 780 and 5,099 ms left out); less any
    part of that host time the GPU spent on `device` work no step launched (a trace whose markers were stripped
    starts with the profiler's synchronize waiting for the work queued before it)."""
    windows = _device_windows(per_step, steps)
    if host and windows and per_step[0] and per_step[-1]:
        start, end = steps[0][0], steps[-1][1]
        for e in device:  # the GPU busy there with work no step launched (queued before the trace's first launch,
            a, b = e.get("ts"), e.get("dur")  # the profiler's own synchronize waiting for it) is no idle of a step
            if num(a) and num(b) and b > 0:
                if start < a + b <= windows[0][0]:
                    start = a + b
                if windows[-1][1] <= a < end:
                    end = a
        first, launch = min(per_step[0], key=lambda p: p[0]["ts"])
        queued = first["ts"] - launch["ts"] > HOST_EDGE_US  # the first kernel waited in a queue: the GPU was busy
        if start < windows[0][0] - HOST_EDGE_US and not queued:  # with work launched before the trace (the host
            windows[0] = (start, windows[0][1])                 # 258 ms ahead of an H100's GPU, markers stripped)
        if end > windows[-1][1] + HOST_EDGE_US:
            windows[-1] = (windows[-1][0], end)
    return windows


def _device_windows(per_step, steps):
    """step_windows on the device timeline alone."""
    firsts = [min(e["ts"] for e, _ in evs) if evs else None for evs in per_step]
    windows = []
    for k, evs in enumerate(per_step):
        cpu_len = steps[k][1] - steps[k][0]
        if not evs:
            windows.append((0.0, cpu_len))
            continue
        last_end = max(e["ts"] + e["dur"] for e, _ in evs)
        following = firsts[k + 1] if k + 1 < len(per_step) else None
        # the last step ends with its last device event: its CPU window also holds the final synchronize,
        # which waits for queued work and would inflate the step (a 330 ms step read as 569 ms on an H200)
        end = max(following, last_end) if following is not None else last_end
        windows.append((firsts[k], end))
    return windows


# ---------------------------------------------------------------------------------------------------------
# Operators around a launch; forward or backward (profiling/profile/tables/regions.py)
# ---------------------------------------------------------------------------------------------------------

def by_thread(ops):
    """Operators (with timestamps, as `index` keeps them) per (pid, tid), sorted by start, outer first."""
    threads = {}
    for e in ops:
        threads.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for evs in threads.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    return threads


def parents(threads):
    """id(operator) -> the operator directly around it on its thread."""
    parent = {}
    for evs in threads.values():
        stack = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                parent[id(e)] = stack[-1]
            stack.append(e)
    return parent


def outer_names(op, parent, memo):
    """The names of the operators around `op`, innermost first (at most MAX_CHAIN); memo: a dict to reuse."""
    around = parent.get(id(op))
    if around is None:
        return ()
    key = id(around)
    if key not in memo:
        memo[key] = ((str(around.get("name", "")),) + outer_names(around, parent, memo))[:MAX_CHAIN]
    return memo[key]


def backward_windows(threads):
    """(pid, tid) -> (starts, merged windows) of the autograd engine's work on that thread."""
    windows = {}
    for key, evs in threads.items():
        spans = merge([(e["ts"], e["ts"] + e["dur"]) for e in evs if str(e.get("name", "")).startswith(AUTOGRAD_OP)])
        if spans:
            windows[key] = ([s for s, _ in spans], spans)
    return windows


def is_backward(e, windows):
    """True when event e (a launch or an operator) lies inside the autograd engine's work on its thread."""
    found = windows.get((e.get("pid"), e.get("tid")))
    if not found:
        return False
    i = bisect.bisect_right(found[0], e["ts"]) - 1
    return i >= 0 and e["ts"] <= found[1][i][1]
