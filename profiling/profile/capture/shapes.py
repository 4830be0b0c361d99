"""Operator input shapes from one untimed step, given to the profiled steps' operators (issue #41). Pure.

torch.profiler's `record_shapes=True` costs the host a few microseconds per operator, and a loop that syncs
every step pays it in its step time: on the H100, a compiled GPT-2 124M loop that reads its loss every step ran
+53% over its unprofiled steps with shapes, stacks and sync lines recorded and +13% without the shapes
(benchmarks/profiler_cost/profiler_cost_results.md). So the profiled steps record no shapes, and one more step
after them is recorded with shapes on and nothing else timed; here each of its operators lends its shapes to
the operators of the profiled steps that stand in the same place: the same thread, the same name, the same
rank among the operators of that name in its step. A training step runs the same operators in the same order
every time; where a step's count of a name differs from the shape step's (a data-dependent branch), that name
gets no shapes in that step and the record says how many operators were left without.

Inductor's Triton launcher wraps every kernel launch in a profiler record of its own while a profiler runs (a
Python dict and a `_RecordFunctionFast` per launch): on the H100 it made a compiled GPT-2 loop +11% slower with
torch.profiler alone, against +0.7% without it. So the profiled steps run without those records
(profiling/profile/capture/detail.py `without_launch_records`), and the shape step, which keeps them, lends each one to
the profiled steps as an operator around the launch of the kernel of its name (`transplant`): the kernel's
Triton arguments (profiling/profile/tables/roofline.py reads their bytes) come back, at no cost to the timed steps.
"""
from bisect import bisect_right
from collections import defaultdict

from profiling.profile.trace.traceio import STEP_PREFIX

RUNTIME = ("cuda_runtime", "cuda_driver")  # the categories of a kernel's launch on the host

ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")  # what record_shapes adds to an op
OWN_IDS = ("External id", "Record function id", "Ev Idx", "Sequence number", "Fwd thread id")  # one event's
TRITON = "triton"  # the kernel_backend of Inductor's launch records


def signatures(events):
    """{(tid, name): [the shape args of each operator, in start order]} of a one-step CPU trace's operators;
    a Triton launch record keeps its kernel arguments too (kernel_backend, kernel_file, ...)."""
    out = defaultdict(list)
    for e in sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e.get("ts", 0)):
        args = e.get("args") or {}
        keep = [k for k in args if k not in OWN_IDS] if args.get("kernel_backend") == TRITON else ARGS
        out[(e.get("tid"), e.get("name"))].append({k: args[k] for k in keep if k in args})
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
    out = {"matched": matched, "unmatched": unmatched}
    lent = launch_records(events, steps, shaped, {name for _, _, name in groups})
    if lent:
        out["launch_records"] = lent
    return out


def launch_records(events, steps, shaped, present):
    """Give each Triton kernel launch of the profiled steps (changed in place: `events` gains operators) the
    launch record the shape step made for it: an operator of the kernel's name around its runtime launch,
    with the record's arguments, and the launch's and kernel's External id pointing at it. By thread, name and
    rank in the step, as the shapes; only for names the profiled steps recorded no operator of (`present`), and
    only where the step launched the kernel as often as the shape step did. Returns the operators added."""
    kernels = {(e.get("args") or {}).get("correlation"): e for e in events
               if e.get("cat") == "kernel" and (e.get("args") or {}).get("correlation") is not None}
    starts, launches = [s for s, _ in steps], defaultdict(list)
    for e in events:
        kernel = kernels.get((e.get("args") or {}).get("correlation")) if e.get("cat") in RUNTIME else None
        if kernel is None or kernel.get("name") in present or "ts" not in e:
            continue
        k = _step_of(starts, steps, e["ts"])
        if k is not None:
            launches[(k, e.get("tid"), kernel.get("name"))].append((e, kernel))
    ids = [x for e in events for x in [(e.get("args") or {}).get("External id")] if isinstance(x, int)]
    next_id, added = max(ids, default=0) + 1, []
    for (_, tid, name), pairs in launches.items():
        lent = shaped.get((tid, name))
        if not lent or len(lent) != len(pairs) or lent[0].get("kernel_backend") != TRITON:
            continue
        for (launch, kernel), args in zip(sorted(pairs, key=lambda p: p[0]["ts"]), lent):
            added.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": launch.get("pid"), "tid": tid,
                          "ts": launch["ts"], "dur": launch.get("dur", 0), "args": dict(args, **{
                              "External id": next_id})})
            launch["args"]["External id"] = kernel["args"]["External id"] = next_id
            next_id += 1
    events.extend(added)
    return len(added)


def _step_of(starts, steps, ts):
    """The index of the step window holding ts, or None."""
    k = bisect_right(starts, ts) - 1
    return k if k >= 0 and ts <= steps[k][1] else None
