"""Pure: the record of eager operators and their lines, from one more recorded step (issue #33). Stdlib only.

Inductor's provenance places the kernels of compiled graphs (profiling/profile/tables/lines.py). The rest is eager: an
uncompiled model or part of it (an attention left out of torch.compile), the optimizer's eager operators, copies,
and the autograd engine's backward of all these. Naming their lines needs the Python stack at each operator, and
recording stacks during the profiled steps inflates the host (DESIGN.md pitfall 12). So the capture runs one more
step, untimed, after the profiled ones, with the lines of own code (whose.py) marked in a second, short
profile (profiling/profile/capture/eager_record.py), and `reduce` keeps of it a small record, the trace metadata's
`eager_lines`. The capture calls `reduce` in the training process, so it lives in this lowest stage; placing
the operators of the profiled steps by it is a table (profiling/profile/tables/eager_lines.py). The record:

    {"version": 1,
     "tid": the main thread's id (the trace's tid),
     "lines": [[file, line, text], ...],   # file as provenance names it (profiling/profile/trace/whose.py)
     "ops": [[name, line index], ...],     # the step's top-level eager operators on the main thread, in call
                                           # order; line -1: no own line (whose.py) around it
     "backward": [line index, ...],        # the lines that ran the autograd engine (`loss.backward()`)
     "seconds": wall seconds of that step and its reduction}

Top-level: the outermost operator (`ns::op`, or an autograd.Function's forward) on the main thread, not inside a
compiled graph's call (`CompiledFunction`, `## Call CompiledFxGraph`) nor the autograd engine.
"""
import bisect

from profiling.profile.trace.traceio import AUTOGRAD_OP, by_thread, parents

VERSION = 1
SPAN = "autoresearch line "     # the capture's annotation around the operators one Python line calls
COMPILED = ("CompiledFunction", "## Call CompiledFxGraph")  # compiled code's operators (and its backward)
ACCUMULATE = "AccumulateGrad"


def _is_op(e, name):
    """An operator (`ns::op`, or a Python autograd.Function's forward, which carries a sequence number), not
    an annotation (a compiled region, a step, the capture's own)."""
    return ("::" in name or seq(e) is not None) and not name.startswith(AUTOGRAD_OP)


def top_of(op, parent, memo=None):
    """(the top-level eager operator of op, None), or (None, "compiled" or "backward"): the innermost compiled
    or autograd-engine operator around op decides. memo: a dict kept between calls on one tree."""
    memo = {} if memo is None else memo
    chain, e = [], op
    while e is not None and id(e) not in memo:
        chain.append(e)
        e = parent.get(id(e))
    result = (None, None) if e is None else memo[id(e)]
    for x in reversed(chain):  # outermost first: the outermost operator is the top, the innermost marker wins
        name = str(x.get("name", ""))
        if name.startswith(AUTOGRAD_OP):
            result = (None, "backward")
        elif name.startswith(COMPILED):
            result = (None, "compiled")
        elif result == (None, None) and _is_op(x, name):
            result = (x, None)
        memo[id(x)] = result
    return result


def node_of(op, parent):
    """The autograd engine's operator (`evaluate_function: ...`) around op, innermost; or None."""
    e = op
    while e is not None and not str(e.get("name", "")).startswith(AUTOGRAD_OP):
        e = parent.get(id(e))
    return e


def tops(ops, parent, start=None, end=None, memo=None):
    """The top-level eager operators among `ops` (one thread's, sorted), optionally within [start, end]."""
    memo = {} if memo is None else memo
    if start is not None:
        ops = ops[bisect.bisect_left(ops, start, key=lambda e: e["ts"]):
                  bisect.bisect_right(ops, end, key=lambda e: e["ts"])]
    return [op for op in ops if top_of(op, parent, memo)[0] is op]


def seq(op):
    s = (op.get("args") or {}).get("Sequence number")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


# ---------------------------------------------------------------------------------------------------------
# The record, from the extra step's trace (the capture calls this at once; it needs no torch)
# ---------------------------------------------------------------------------------------------------------

def reduce(events, lines, tid):
    """The `eager_lines` record from the extra step's trace events. lines: [[file, line, text]], indexed by the
    SPAN annotations' numbers; tid: the main thread's id as the trace writes it."""
    ops = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "cpu_op"
           and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    threads = by_thread(ops)
    main = next((evs for (_, t), evs in threads.items() if t == tid), [])
    is_span = [str(e.get("name", "")).startswith(SPAN) for e in main]
    # the annotations are cut where lines change, not where operators end: out of the tree, looked up by time
    spans = [(e["ts"], e["ts"] + e["dur"], int(e["name"][len(SPAN):])) for e, s in zip(main, is_span)
             if s and e["name"][len(SPAN):].isdigit()]
    main = [e for e, s in zip(main, is_span) if not s]
    starts = [s for s, _, _ in spans]

    def line_at(ts):
        i = bisect.bisect_right(starts, ts) - 1
        return spans[i][2] if i >= 0 and ts <= spans[i][1] else -1

    parent = parents({0: main})
    record = [[str(op.get("name")), line_at(op["ts"])] for op in tops(main, parent)]
    engine = sorted({line_at(e["ts"]) for evs in threads.values() for e in evs
                     if str(e.get("name", "")).startswith(AUTOGRAD_OP)} - {-1})
    return {"version": VERSION, "tid": tid, "lines": lines, "ops": record, "backward": engine}
