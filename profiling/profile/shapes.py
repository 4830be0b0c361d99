"""Operator input shapes from one untimed step, given to the profiled steps' operators (issue #41). Pure.

torch.profiler's `record_shapes=True` costs the host a few microseconds per operator, and a loop that syncs
every step pays it in its step time: on the H100, a compiled GPT-2 124M loop that reads its loss every step ran
+53% over its unprofiled steps with shapes, stacks and sync lines recorded and +13% without the shapes
(benchmarks/profiler_cost_results.md). So the profiled steps record no shapes, and one more step after them is
recorded with shapes on and nothing else timed; here each of its operators lends its shapes to the operators of
the profiled steps that stand in the same place: the same thread, the same name, the same rank among the
operators of that name in its step. A training step runs the same operators in the same order every time; where
a step's count of a name differs from the shape step's (a data-dependent branch), that name gets no shapes in
that step and the record says how many operators were left without.
"""
from bisect import bisect_right
from collections import defaultdict

from profiling.profile.traceio import STEP_PREFIX

ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")  # what record_shapes adds to an op


def signatures(events):
    """{(tid, name): [the shape args of each operator, in start order]} of a one-step CPU trace's operators."""
    out = defaultdict(list)
    for e in sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e.get("ts", 0)):
        args = e.get("args") or {}
        out[(e.get("tid"), e.get("name"))].append({k: args[k] for k in ARGS if k in args})
    return out


def transplant(events, shaped):
    """Give the profiled steps' operators (`events`, changed in place) the shapes of `shaped`
    (signatures of the shape step); return {"matched": operators given shapes, "unmatched": left without}."""
    steps = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                   if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(STEP_PREFIX))
    groups = defaultdict(list)  # (step, tid, name) -> its operators in start order
    starts = [s for s, _ in steps]
    for e in events:
        if e.get("cat") != "cpu_op" or "ts" not in e:
            continue
        k = _step_of(starts, steps, e["ts"])
        if k is not None:
            groups[(k, e.get("tid"), e.get("name"))].append(e)
    matched = unmatched = 0
    for (_, tid, name), ops in groups.items():
        lent = shaped.get((tid, name))
        if lent is None or len(lent) != len(ops):
            unmatched += len(ops)
            continue
        for op, args in zip(sorted(ops, key=lambda e: e["ts"]), lent):
            op.setdefault("args", {}).update(args)
        matched += len(ops)
    return {"matched": matched, "unmatched": unmatched}


def _step_of(starts, steps, ts):
    """The index of the step window holding ts, or None."""
    k = bisect_right(starts, ts) - 1
    return k if k >= 0 and ts <= steps[k][1] else None
