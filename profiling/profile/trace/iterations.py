"""The steps of a trace without ProfilerStep markers (profiled without a schedule): the iterations of its loop,
from what repeats; one call's inner loop as that one call; else one window less the run's start-up. Stdlib.

What marks one iteration, most telling first (`MARKERS`): the optimizer's step ends one (torch.profiler annotates
Optimizer.step), unless each DataLoader batch is followed by the same two or more steps (several optimizers: a
GAN's); a DataLoader's __next__ begins one; a forward root (with_stack/with_modules: the outermost
nn.Module scope) or a call of a compiled region (`Torch-Compiled Region: N/M`, `## Call CompiledFxGraph`: a
compiled model records neither modules nor, with a hand-written update, an optimizer; the region called least
often, so micro-batches are not steps) begins one; last, the operators themselves: the one that begins every
repetition of the same sequence on the busiest thread, which holds nearly all of that thread's operators (a CPU
loop; on a GPU only where that operator is a loss's backward node, as in pytorch/examples' word_language_model,
a loop with no optimizer, DataLoader or module scope whose autograd thread begins each backward with
NllLossBackward0: an inference's layers, and a backward's, repeat too, and are no iterations).

Whether the first iteration (the run's start-up: CUDA's initialisation, first allocations, compilation) is like
the others is not decided here: irregular.split leaves out every step that does not repeat.
"""
import re
from collections import Counter

ITERATION_NAME = "iteration#"
OPTIMIZERS, LOADER = "the optimizer's step", "the DataLoader's next batch"
# the autograd node that begins a backward where the loss is a loss function's (NllLossBackward0 after
# cross_entropy, MseLossBackward0, BinaryCrossEntropyBackward0): once per backward, where a layer's nodes repeat
LOSS_ROOT = re.compile(r"autograd::engine::evaluate_function: \w*(Loss|CrossEntropy)\w*Backward")
OPTIMIZER_STEP = "Optimizer.step#"
DATALOADER_NEXT = "enumerate(DataLoader)#"
COMPILED_REGION = "Torch-Compiled Region"  # Dynamo's record_function around each call of a compiled frame
GRAPH_CALL = "## Call CompiledFxGraph "    # Inductor's annotation around one call of a compiled graph
# Dynamo's and Inductor's compile-time annotations: torch <= 2.6 `_compile.compile_inner (dynamo_timed)`, 2.7+
# `entire_frame_compile_data: fn_name=_compile.compile_inner, compile_id=0/0` and one `..._data: compile_id=` per
# pass (torch 2.11, tests/data/cpu-compile-in-window.json.gz); with_stack's frames of Dynamo's compile
COMPILE_MARK = re.compile(r"compile_inner|\(dynamo_timed\)|compile_id=\d|compile_fx|_dynamo/convert_frame\.py")
# torch 2.7+ records each compile phase as a short `..._data: compile_id=N/M` mark, not as a span: one compile is
# the extent of its id's marks (0.1 ms marks from 20 ms to 73.6 s in tests/data/cpu-compile-in-window.json.gz)
COMPILE_ID = re.compile(r"compile_id=([0-9/]+)")
SEQUENCE_COVERS = 0.9  # share of the thread's operators the repeated sequence must hold: a model's layers repeat
                       # too (86 "iterations" in the 2 steps of tests/data/cpu-gpt-2steps), but not its whole step
MAX_CANDIDATES = 30   # operators tried as the loop's first (the most frequent ones)
STARTUP_CALL_US = 50_000  # a runtime call this long is no step's work: CUDA's initialisation (cudaFree(0),
# cudaDeviceGetStreamPriorityRange: 25-30 s in HTA's A100 benchmarks), a kernel module's first load inside its
# first launch (1,337 ms in a Particle Transformer's first cuDNN convolution, A100)
NOT_STARTUP = ("Synchronize", "Memcpy", "EventQuery", "StreamWait")  # long because they wait: the run's, kept


def _name(e):
    return str(e.get("name", ""))


def markers(ix):
    """(kind, marks, at_end) in the order tried."""
    return ((OPTIMIZERS, _steps(ix), True),
            (LOADER, ix.loader, False),
            ("the model's forward", ix.modules, False),
            ("a compiled region's call", _least([m for m in ix.cpu_ops if _name(m).startswith(COMPILED_REGION)])
             or _least(ix.graph_calls), False))


def _steps(ix):
    return [m for m in ix.optimizer_marks if _name(m).startswith(OPTIMIZER_STEP)]


def _steps_per_batch(ix):
    """k where every DataLoader batch in the trace is followed, before the next batch (or the trace's end), by the
    same k >= 2 optimizer steps: several optimizers updated per batch (a GAN's discriminator and generator,
    pytorch/examples' dcgan), whose steps would split each iteration in k; else None. Fewer steps than batches
    (gradient accumulation) is the optimizer's step ending an iteration as usual."""
    batches = sorted(m["ts"] for m in _outermost(ix.loader))
    steps = sorted(m["ts"] for m in _outermost(_steps(ix)))
    if not batches or not steps:
        return None  # (steps before the first batch end an iteration the window began inside of)
    counts = [sum(a <= t < b for t in steps) for a, b in zip(batches, batches[1:] + [float("inf")])]
    if len(counts) > 1 and counts[-1] == 0:  # the loop's last `__next__` (its StopIteration), or a trim's cut
        counts.pop()
    return counts[0] if counts[0] >= 2 and len(set(counts)) == 1 else None


def _least(marks):
    """The marks of the name that repeats least often (twice or more): a step calls a compiled model once per
    micro-batch, and each frame a graph break splits off once more."""
    counts = Counter(_name(m) for m in _outermost(marks))
    names = [n for n, c in counts.items() if c >= 2]
    if not names:
        return []
    name = min(names, key=lambda n: (counts[n], n))
    return [m for m in marks if _name(m) == name]


def iterations(ix, lo, hi):
    """([(start, end, "iteration#k")], record) of a trace without ProfilerStep markers whose loop shows in a
    marker that repeats at least twice; [(start, end, name)] of one call when the repeats all run inside one
    annotation the trace holds once (a `record_function("generate")` around a decode loop: the call is the
    step, record["one_call"]); None when nothing repeats."""
    several = _steps_per_batch(ix)
    for kind, marks, at_end in markers(ix) + (("the operators' sequence", None, False),):
        if several and kind != LOADER:
            continue  # each batch updates several optimizers (a GAN's D and G, each model called more than once
            # a batch): only the batch is the iteration
        times = _sequence(ix) if marks is None else _repeats(marks)
        if not times or marks is None and ix.device and not LOSS_ROOT.match(str(times[0])):
            continue  # on a GPU, only a loss's backward node marks a loop (an inference's or a backward's layers
            # repeat too)
        name, times = times
        call = None if at_end else _one_call(ix.annotations, times)
        if call is not None:
            return [(call["ts"], call["ts"] + call["dur"], _name(call))], {
                "by": kind, "marker": name, "count": 1, "one_call": _name(call), "inner": len(times)}
        edges = [lo] + [end for _, end in times] if at_end else [start for start, _ in times] + [hi]
        steps = [(a, b, f"{ITERATION_NAME}{k}") for k, (a, b) in enumerate(zip(edges, edges[1:])) if b > a]
        if steps:
            return steps, {"by": kind, "marker": name, "count": len(steps)}
    return None


def ran_once(ix):
    """What shows that a trace with no repeating marker holds one iteration of its loop: the kind of the first
    marker (MARKERS' order) recorded exactly once (one optimizer step, one DataLoader batch, one forward root),
    or None where none was recorded (a loop with no optimizer, no DataLoader and no module scopes)."""
    return next((kind for kind, marks, _ in markers(ix) if len(_outermost(marks)) == 1), None)


def _repeats(marks):
    """(name, sorted (start, end)) of the outermost mark that repeats most, or None."""
    marks = _outermost(marks)
    if not marks:
        return None
    name, count = Counter(m.get("name") for m in marks).most_common(1)[0]
    if count < 2:
        return None
    return name, sorted((m["ts"], m["ts"] + m["dur"]) for m in marks if m.get("name") == name)


def _one_call(annotations, times):
    """The one user annotation around every repeat, when the trace holds it once (the repeats are its inner
    loop), else None."""
    first, last = times[0][0], times[-1][1]
    around = [a for a in annotations if a["ts"] <= first and a["ts"] + a["dur"] >= last]
    if not around:
        return None
    counts = Counter(_name(a) for a in annotations)
    inner = min(around, key=lambda a: a["dur"])
    return inner if counts[_name(inner)] == 1 else None


def _sequence(ix):
    """(name, sorted (start, end)) of the operator that begins each repetition of the same operator sequence on
    the busiest thread (a CPU loop of plain operators), or None when the operators do not repeat."""
    threads = Counter((e.get("pid"), e.get("tid")) for e in ix.cpu_ops)
    if not threads:
        return None
    key = threads.most_common(1)[0][0]
    tops = _outermost([e for e in ix.cpu_ops if (e.get("pid"), e.get("tid")) == key])
    names = [_name(e) for e in tops]
    counts = Counter(names)
    best = None
    for name, count in counts.most_common(MAX_CANDIDATES):
        if count < 2:
            break
        at = [i for i, n in enumerate(names) if n == name]
        bodies = Counter(tuple(names[a:b]) for a, b in zip(at, at[1:]))
        body, alike = bodies.most_common(1)[0]  # every repetition alike but one (the first: start-up)
        if alike >= len(at) - 2 and len(body) * len(at) >= SEQUENCE_COVERS * len(names) and (
                best is None or len(at) > len(best[1])):
            best = (name, at, body)
    if best is None:
        return None
    name, at, body = best
    first = names[0]  # the loop's first operator: the trace's first one where it is in the repeated body
    shift = (len(body) - body.index(first)) % len(body) if first in body else 0
    starts = [i - shift for i in at if i - shift >= 0]
    ends = starts[1:] + [len(tops)]
    return name, [(tops[a]["ts"], tops[b - 1]["ts"] + tops[b - 1]["dur"]) for a, b in zip(starts, ends) if b > a]


def compile_spans(marks):
    """Sorted, disjoint (start, end) of compilation: each compile id's marks' extent (torch 2.7+), the outermost
    spans of the others (`(dynamo_timed)` spans, Dynamo's frames)."""
    by_id, spans = {}, []
    for m in _outermost(marks):
        found = COMPILE_ID.search(_name(m))
        span = (m["ts"], m["ts"] + m["dur"])
        if found:
            a, b = by_id.get(found.group(1), span)
            by_id[found.group(1)] = (min(a, span[0]), max(b, span[1]))
        else:
            spans.append(span)
    merged = []
    for a, b in sorted(spans + list(by_id.values())):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def startup(runtime, work, lo, hi, compiles=()):
    """The start-up a one-window trace holds: {"end", "ms", "calls", "compile_ms"} where runtime calls of
    STARTUP_CALL_US or more (not waits) or compilation (`compiles`: compile_spans) come before most of the work
    (device events, else CPU operators), the window then beginning after the last of them; None when there is
    none, or when less than half of the work would be left."""
    long = [e for e in runtime if e.get("dur", 0) >= STARTUP_CALL_US
            and not any(w in _name(e) for w in NOT_STARTUP)]
    ends = sorted([e["ts"] + e["dur"] for e in long] + [b for _, b in compiles], reverse=True)
    for end in ends:
        after = sum(1 for d in work if isinstance(d.get("ts"), (int, float)) and d["ts"] >= end)
        if end < hi and work and after >= len(work) / 2:
            names = Counter()
            for e in long:
                if e["ts"] + e["dur"] <= end:
                    names[_name(e)] += e["dur"] / 1e3
            spent = sum(b - a for a, b in compiles if b <= end) / 1e3
            return {"end": end, "ms": round((end - lo) / 1e3, 3), "calls": {k: round(v, 3) for k, v in names.items()},
                    "compile_ms": round(spent, 3)}
    return None


def _outermost(marks):
    """The marks not inside another mark of the same thread (a forward root, not its submodules)."""
    out, ends = [], {}
    for m in sorted(marks, key=lambda m: (m.get("ts", 0), -m.get("dur", 0))):
        tid = m.get("tid")
        if m.get("ts", 0) >= ends.get(tid, float("-inf")):
            out.append(m)
            ends[tid] = m["ts"] + m.get("dur", 0)
    return out
