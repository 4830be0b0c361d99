"""Pure: the optimizer's own time, without the model's forward and backward run inside
`optimizer.step(closure)`. Stdlib only, never torch.

Work launched inside an optimizer annotation (`Optimizer.step#SGD.step`) counts as optimizer. But Lightning's
automatic optimization, LBFGS and any loop calling `optimizer.step(closure)` run the model's forward and
backward inside that window: read as the window, a Lightning step was 89-92% "optimizer" (issue #41).

The rule, from what torch records (seen in Lightning 2.6, LBFGS and SGD traces, tests/data/cpu-closure-*):
- backward: the autograd engine's `autograd::engine::evaluate_function: ...` operators (on the CPU on the
  calling thread, on CUDA on the engine's own thread);
- forward: an operator carrying a `Sequence number`. The dispatcher records one only while grad mode is on,
  and torch's optimizers step under no_grad (their closure runs under enable_grad), so inside the window
  only the closure's operators carry one. Read on the annotation's own thread only.
A closure call runs from a forward operator to the end of the backward that follows it (what lies between,
a loss's `item()` or logging, comes with it); the next forward after a backward starts the next call (LBFGS
calls its closure several times per step, between its own work). A forward with no backward after it is not
a closure call: an optimizer that forgets no_grad records Sequence numbers too.
Only an optimizer window that holds backward work is cut; nested optimizer annotations (Lightning's
`Optimizer.zero_grad#` inside its closure) stay optimizer whole.
"""
import bisect

from profiling.profile.trace.traceio import AUTOGRAD_OP, find, merge

NOTE = ("forward and backward ran inside optimizer.step(closure): counted as the model's forward and "
        "backward; optimizer is the optimizer's own work (profiling/profile/tables/closures.py)")
EDGE_US = 1e-3  # trace timestamps are whole nanoseconds: a piece of window ends this much before a call


def own_windows(marks, cpu_ops):
    """Sorted, disjoint (start, end) windows of the optimizer's own work: the optimizer annotations `marks`
    (their events, unmerged) less the closure calls inside them (module docstring)."""
    backward = sorted(op["ts"] for op in cpu_ops if _is_autograd(op))
    held = [m for m in marks if _holds(backward, _window(m))]
    if not held:  # no closure anywhere (the common case): the annotations as they are
        return merge(_window(m) for m in marks)
    spans = merge(_window(m) for m in held)
    firsts = [start for start, _ in spans]
    ops = sorted((op for op in cpu_ops if (_is_autograd(op) or _is_forward(op))
                  and find(spans, firsts, op["ts"]) is not None), key=lambda op: op["ts"])
    starts = [op["ts"] for op in ops]
    cut = {id(m) for m in held}
    own = [_window(m) for m in marks if id(m) not in cut]
    for m in held:
        window = _window(m)
        own += _subtract(window, closure_calls(_inside(ops, starts, window), (m.get("pid"), m.get("tid"))))
    return merge(own)


def closure_calls(ops, thread):
    """[(start, end)] of the closure calls among an optimizer window's operators (time order): each from a
    forward operator on `thread` to the end of the backward after it."""
    calls, start, end = [], None, None
    for op in ops:
        if _is_autograd(op):
            start = op["ts"] if start is None else start
            end = max(end or 0.0, op["ts"] + op["dur"])
        elif (op.get("pid"), op.get("tid")) != thread:
            continue
        elif end is not None:  # a forward after a backward: the next call
            calls.append((start, end))
            start, end = op["ts"], None
        elif start is None:
            start = op["ts"]
    return calls + [(start, end)] if end is not None else calls


def _is_autograd(op):
    return str(op.get("name", "")).startswith(AUTOGRAD_OP)


def _is_forward(op):
    return "Sequence number" in (op.get("args") or {})


def _window(mark):
    return mark["ts"], mark["ts"] + mark["dur"]


def _holds(sorted_ts, window):
    i = bisect.bisect_left(sorted_ts, window[0])
    return i < len(sorted_ts) and sorted_ts[i] <= window[1]


def _inside(ops, starts, window):
    return ops[bisect.bisect_left(starts, window[0]):bisect.bisect_right(starts, window[1])]


def _subtract(window, cuts):
    """`window` less the `cuts` intervals: the sorted pieces left. A piece ends just before a cut, so the
    cut's first operator (at its very start) is not read as the optimizer's: windows are searched ends included."""
    pieces, at = [], window[0]
    for start, end in merge(cuts):
        if start - EDGE_US > at:
            pieces.append((at, min(start - EDGE_US, window[1])))
        at = max(at, end)
    return pieces + [(at, window[1])] if at < window[1] else pieces
