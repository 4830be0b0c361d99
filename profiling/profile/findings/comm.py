"""Pure: communication one rank's trace shows (profiling/profile/findings/ runs it). Stdlib only.

- exposed_communication: collective kernels (NCCL, RCCL, NVLS/multimem, all-to-all) while no compute runs on this
  GPU. From one rank's trace the cause is not in the data: the links' bandwidth, or the other ranks arriving late
  (a collective ends on every rank when the last one joins it, so a slow rank shows as the others' exposed
  communication). The finding says so, first by its size (effect first), and how to tell: every rank's trace in
  one folder (`research profile FOLDER`: profiling/profile/report/ranks.py prices the two apart).
"""
from collections import Counter

from profiling.profile.findings.contract import claim, finding, rule
from profiling.profile.trace.traceio import merge, union_length

MIN_SHARE = 0.05  # of the step: exposed communication below this is left to the budget table


@rule("exposed_communication", needs=("device",))
def exposed_communication(tl, ctx, found):
    """Collectives not hidden behind compute, per step, from this rank's trace alone."""
    comm_us = exposed_us = 0.0
    events = []
    for evs, cats in zip(tl.per_step, tl.labels):
        comm = [(e["ts"], e["ts"] + e["dur"]) for (e, _), c in zip(evs, cats) if c == "communication"]
        if not comm:
            continue
        work = [(e["ts"], e["ts"] + e["dur"]) for (e, _), c in zip(evs, cats) if c != "communication"]
        events += [e for (e, _), c in zip(evs, cats) if c == "communication"]
        comm_us += union_length(comm)
        exposed_us += union_length(merge(comm + work)) - union_length(work)
    ms = exposed_us / ctx["n"] / 1e3
    if ms < MIN_SHARE * ctx["step"]:
        return None
    claim(ctx, events)
    names = Counter()
    for e in events:
        names[e["name"]] += e["dur"]
    top = names.most_common(3)
    evidence = (f"collectives run {comm_us / ctx['n'] / 1e3:.1f} ms/step on this GPU, {ms:.1f} ms/step of it "
                "with no compute beside it (" + ", ".join(f"`{n[:60]}` {t / ctx['n'] / 1e3:.1f} ms"
                                                          for n, t in top) + "); cause unknown from one rank's "
                "trace: the links' bandwidth, or other ranks joining the collectives late (a slower rank shows "
                "here as waiting)")
    return finding("exposed_communication", ms, ctx, evidence,
                   "profile every rank and read them together (`research profile FOLDER` of all ranks' traces: it "
                   "tells a straggler from the links' time); then, for the links: fewer, larger collectives "
                   "started during backward (a larger DDP bucket_cap_mb, FSDP's backward prefetch), gradient sync "
                   "on the last micro-batch only (no_sync), bf16 gradients (a DDP comm hook)")
