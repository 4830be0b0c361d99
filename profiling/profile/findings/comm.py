"""Pure: communication one rank's trace shows (profiling/profile/findings/ runs it). Stdlib only.

- exposed_communication: collective kernels (NCCL, RCCL, NVLS/multimem, all-to-all) while no compute runs on this
  GPU. From one rank's trace the cause is not in the data: the links' bandwidth, or the other ranks arriving late
  (a collective ends on every rank when the last one joins it, so a slow rank shows as the others' exposed
  communication). The finding says so, first by its size (effect first), and how to tell: every rank's trace in
  one folder (`research profile FOLDER`: profiling/profile/report/ranks.py prices the two apart). The links'
  remedies follow what the collectives carry: DDP's and FSDP's for gradients in a training step's backward,
  tensor parallelism's overlap for activations (a forward-only run: inference never gets training advice).
"""
from collections import Counter

from profiling.profile.findings.contract import claim, finding, rule, training
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
    return finding("exposed_communication", ms, ctx, evidence, FIRST + _links_fix(tl, events))


FIRST = ("profile every rank and read them together (`research profile FOLDER` of all ranks' traces: it tells a "
         "straggler from the links' time); then, for the links: ")
# collectives on gradients (a training step's backward: DDP's buckets, FSDP's reduce-scatter) and on activations
# (tensor and sequence parallelism in the forward, inference included), each with what its user can change
GRADIENTS = ("fewer, larger collectives started during backward (a larger DDP bucket_cap_mb, FSDP's backward "
             "prefetch), gradient sync on the last micro-batch only (no_sync), bf16 gradients (a DDP comm hook)")
ACTIVATIONS = ("these collectives move activations (tensor or sequence parallelism, embedding tables sharded by all-to-all), not gradients: overlap them "
               "with compute (async tensor parallelism: torch._inductor.config._micro_pipeline_tp with "
               "torch.compile, or a framework's comm-compute overlap), fewer ranks per model replica where the "
               "model fits (a smaller tensor-parallel degree), and the ranks of one replica on one node's NVLink")


def _links_fix(tl, events):
    """The links' remedies for what the collectives carry: gradients when most of their time runs in a
    training step's backward (launched from autograd's engine, a DDP reducer hook, a compiled backward),
    activations otherwise (a forward-only run: inference)."""
    if not training(tl):
        return ACTIVATIONS
    ids, backward = {id(e) for e in events}, 0.0
    for evs in tl.per_step:
        for e, launch in evs:
            if id(e) in ids and any("Backward" in c or c.startswith("autograd::engine") or "reducer" in c.lower()
                                    for c in tl.chain(tl.op_of(launch))):
                backward += e["dur"]
    return GRADIENTS if backward >= sum(e["dur"] for e in events) / 2 else (
        ACTIVATIONS + "; for the gradients' share: " + GRADIENTS)
