"""Pure: device time no line of the model's own code owns, named by the operator that launched it and by what
the kernel itself shows of why it runs. Stdlib only. Rules: profiling/profile/findings/contract.py's shape.

- sort_scatter: scatter-adds (the embedding's backward, index_put_ with accumulate) run by ATen's sort-based
  kernels (a radix sort of the indices, then indexing_backward_kernel) inside a compiled graph, where Inductor
  would emit one atomic scatter-add kernel: Inductor falls back to them under deterministic algorithms. The
  lines table places them at the embedding's line, whose backward they are (lines.INSERTED_BACKWARD).
What no rule names stays in the lines table's `not placed` list, with the operator that launched it.
"""
from collections import Counter

from profiling.profile.findings.contract import finding, rule, top
from profiling.profile.findings.settings import attribute
from profiling.profile.trace.classify import short_name
from profiling.profile.trace.timeline import COMPILED

SCATTER_OPS = ("aten::index_put_", "aten::_index_put_impl_", "aten::embedding_dense_backward",
               "aten::index_add_", "aten::scatter_add_")
SORTED_KERNELS = ("indexing_backward_kernel", "RadixSort", "radix_sort", "embedding_backward_cuda_kernel")
MIN_SHARE = 0.01          # of the step: the report's threshold


@rule("sort_scatter", needs=("device",))
def sort_scatter(tl, ctx, found):
    """Sort-based scatter-add kernels launched by a scatter operator inside a compiled graph: their time is the
    gain (one atomic scatter-add of the same bytes takes a fraction of a ms at this size)."""
    events, ops = [], {}
    for evs in tl.per_step:
        for e, launch in evs:
            if not any(k in str(e.get("name", "")) for k in SORTED_KERNELS):
                continue
            chain = tl.chain(tl.op_of(launch))
            op = next((c for c in reversed(chain) if c.startswith(SCATTER_OPS)), None)
            if op and any(c.startswith(COMPILED) for c in chain):
                events.append(e)
                ops[op] = ops.get(op, 0.0) + e["dur"]
    ms = sum(e["dur"] for e in events) / ctx["n"] / 1e3
    if ms < MIN_SHARE * ctx["step"]:
        return None
    ctx["claimed"].update(id(e) for e in events)
    kernels = Counter()
    for e in events:
        kernels[short_name(str(e.get("name", "")))] += e["dur"]
    evidence = (f"{len(events) / ctx['n']:g} kernels/step of a sorted scatter-add inside the compiled graphs: "
                f"{ms:.1f} ms/step (" + ", ".join(f"`{k}` {t / ctx['n'] / 1e3:.1f} ms" for k, t in top(kernels))
                + "), launched by " + ", ".join(f"{op}" for op, _ in top(ops, 2))
                + " (ATen's deterministic path; Inductor's own scatter-add is one atomic kernel): the backward of "
                "the model's embedding lookups, which the compiler inserted for their lines (the lines table "
                "places it there)")
    return attribute(tl, finding("sort_scatter", ms, ctx, evidence,
                                 "let the compiler emit its atomic scatter-add: torch.use_deterministic_algorithms "
                                 "off (or torch._inductor.config.deterministic off); if you call index_put_ / "
                                 "index_add_ with accumulate yourself, use an embedding's own backward"),
                     "deterministic_kernels")

