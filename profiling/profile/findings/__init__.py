"""Pure: the causes that cost the most, each with its evidence, an estimated gain and a fix. Stdlib only.

    result = diagnose(timeline, summary)   # {findings: [...], unknown: [...], skipped: [...], ledger: [...]}

`findings`: [{kind, ms_per_step, pct_of_step, evidence, fix}], costliest first (profiler_overhead, which costs
training nothing, last); no two price the same kernels or GPU idle (ledger.py; `ledger`: its notes).
`one_off` (only where a rule found one): waits said once and priced by no step ({kind, step: None, ms, text}:
input.py's loader not yet steady), which the summary adds to irregular.split's one-off rows.
`unknown`: time a rule saw but could not explain, with the evidence that would tell ({rule, missing,
ms_per_step, what}). `skipped`: the rules whose evidence the trace lacks ({rule, missing}).

One module per family of causes, every rule of the same shape (contract.py: what it needs, a skip when that
is missing, a match that returns a finding with evidence, gain and fix):

- input.py: the GPU waiting on the input pipeline (the DataLoader's next batch); on a CPU trace, the training
  thread's own time in it
- lines.py: the line of the user's code the GPU waits on, where its mechanism is recognized (a loop over the
  parameters, a Python loop over samples or heads, tensors made on the host every step), at that line with the
  remedy in its terms (issue #56); before the effect rules, which then name the lines they wait on
- idle.py: the GPU waiting on the host (host syncs, graph breaks, launches, the host's other work)
- calls.py: the host inside CUDA calls (launches that block, allocation churn, synchronizing calls, pageable
  copies)
- kernels.py: kernels below their rate (float32 GEMMs, a slow device, attention fallbacks, attention on a
  slower backend a setting chose)
- convs.py: convolutions (grouped and depthwise ones far over their bound, layout transposes around NCHW
  tensors); their float32 form is priced with the GEMMs' (kernels.fp32_matmul)
- waste.py: work done in a slow form (eager code, float32 intermediates, recomputation, misaligned shapes);
  over.py: kernels far over their bound, the fallback
- unplaced.py: device time no line owns, named by its operator and what the kernel shows (a sorted
  scatter-add the compiler inserted)
- settings.py: the process settings known to cause what a rule measured, named beside its cost
- cpu.py: a CPU profile's (no device events): eager code, threads waiting for cores; the GPU rules named as not
  run, in one sentence (`not_run`)
regression.py and ranks.py (beside this package) add the findings that need another profile or other ranks,
through the same contract.

Costs (`ms_per_step`: what fixing the cause would save, estimated):
- GPU idle is split once, so no two findings claim the same gap (Gap.cause): first the gaps the DataLoader's
  next-batch spans cover (input_bound: a sync after a long wait for data exposes the loader, it is not the
  cause), then those a line's recognized mechanism holds (lines.py), then those that begin while the host is
  blocked in a sync (host_sync), then those between the compiled model's fragments (graph_break),
  then the CUDA calls the host was inside, then the rest (gpu_waits_on_host: long gaps, by what the host was
  doing; launch_bound: the host cannot launch fast enough). When the profiled step is slower than the
  unprofiled one, the profiler's own host cost inflated the idle: idle-based costs are scaled to the
  unprofiled run's idle (unprofiled step - device busy; over 3%, the profiler_overhead finding says so).
- An idle finding's gain is net of the clock: without the idle, a GPU at its power limit clocks down and its
  GEMMs and attention slow (power.py, from the GPU state the live capture records).
- Each millisecond is claimed once (ledger.py): a finding whose kernels a larger finding already prices has
  its gain cut by that share (left out under 1% of the step, said in `ledger`'s notes); the findings never
  sum past the step.
- Kernel time against a rate measured in the same trace where there is one (the bf16 GEMMs, the fused
  attention calls), else a fraction of the device's peak (kernels.py names them).
"""
from profiling.profile.findings import (calls, comm, convs, cpu, idle, kernels, ledger, lines, over, power,
                                       settings, unplaced, waste)
from profiling.profile.findings import input as input_pipeline  # not the builtin's name here
from profiling.profile.findings.contract import run, unknown
from profiling.profile.trace import hardware

# The order rules run in: a rule sees what earlier ones claimed (root causes before what they expose).
RULES = (input_pipeline.input_bound, *lines.RULES, idle.host_sync, idle.graph_break, calls.blocking_launch, calls.alloc_churn, calls.cuda_sync,
         waste.eager_code, unplaced.sort_scatter, kernels.math_attention, convs.slow_convolution,
         kernels.fp32_matmul, waste.fp32_intermediate, kernels.slow_device,
         kernels.attention_fallback, kernels.attention_backend,
         waste.recompute, waste.forward_without_backward, waste.misaligned_shapes,
         convs.conv_layout, comm.exposed_communication, idle.launch_bound, idle.gpu_waits_on_host, over.over_bound)


def diagnose(tl, summary, stacks=False):
    """The findings of one device profile (module docstring). `stacks`: the trace was recorded with torch's
    Python stacks (with_stack), which inflate the host's time and so the GPU idle."""
    ctx = context(tl, summary)
    ctx["stacks"] = stacks
    found, skipped = run(RULES, tl, ctx)
    if "own_idle" not in ctx["evidence"]:
        _unexplained_idle(tl, ctx)
    found, notes = ledger.admit(settings.merge(power.net_of_clock(tl, ctx, found)), ctx)
    overhead, _ = run((idle.profiler_overhead,), tl, ctx)
    return {"findings": [ledger.public(f) for f in found + overhead], "unknown": ctx.get("unknown", []),
            "skipped": skipped, "ledger": notes, "host_lines": lines.host_table(tl),
            **({"one_off": ctx["one_off"]} if ctx.get("one_off") else {})}


def _unexplained_idle(tl, ctx):
    """A trace recorded with Python stacks and no unprofiled step: the GPU idle no recorded event explains (no
    DataLoader span, sync or copy claimed it) goes to `unknown`; the stacks slow the host, so it may be the
    profiler's own."""
    left = sum(g.us for g in tl.gaps if g.cause is None) / ctx["n"] / 1e3
    if left <= 0:
        return
    claimed = ctx["idle"] - left
    unknown(ctx, "GPU idle", ["unprofiled"], left,
            "GPU idle in a trace recorded with Python stacks (with_stack=True), which slow the host several-fold: "
            + (f"beside the {claimed:.1f} ms/step the findings tie to recorded events (DataLoader waits, syncs, "
               "copies), " if claimed >= 0.005 else "")
            + "the idle may be the profiler's own cost, so no launch or other idle finding is priced; give the "
            "unprofiled ms/step (--unprofiled-ms, measured without the profiler) to price them")


def diagnose_cpu(ix, placed, summary, meta):
    """The findings of a CPU profile (cpu.py): ix, the trace's index; placed, its profiled steps' operators
    [(op, self us, category)]; summary, the CPU summary so far. As diagnose's result, with `not_run`: the one
    sentence saying which rules ran on this CPU trace and which did not, and why."""
    tl = cpu.CpuSteps(ix, placed, meta)
    unprofiled = meta.get("unprofiled_step_ms")
    ctx = {"step": summary["step_ms"], "n": tl.n, "unprofiled": unprofiled if isinstance(unprofiled, (int, float))
           and unprofiled > 0 else None, "unknown": [], "claimed": set()}
    unrecorded = meta.get("device_unrecorded")
    if unrecorded:  # the operators are a device's dispatch and waits, not CPU compute: no CPU rule applies
        return {"findings": [], "skipped": [], "ledger": [], "not_run": None, "no_findings": cpu.UNRECORDED.format(
            unrecorded), "unknown": [{"rule": "device", "missing": ["device events"], "ms_per_step": round(
                summary["step_ms"], 2), "what": cpu.UNRECORDED.format(unrecorded)}]}
    if summary["step_ms"] < cpu.MIN_STEP_MS:
        return {"findings": [], "unknown": [], "skipped": [], "ledger": [], "not_run": CPU_NOT_RUN,
                "no_findings": cpu.SHORT_STEP.format(summary["step_ms"])}
    ctx["lines"] = summary.get("lines")  # the lines table: a loop's line priced by its operators' time
    found, skipped = run(cpu.CPU_RULES[:1] + lines.CPU_RULES + cpu.CPU_RULES[1:], tl, ctx)
    unused = [f for f in found if f["kind"] == "device_unused"]
    if unused:  # the model belongs on the GPU: the CPU's own fixes (fusing, threads) would change little there
        found = unused + [f for f in found if f["kind"] in ("input_pipeline",)]
    loader = input_pipeline.cpu_input_bound(ix, summary["step_ms"])  # the training thread in the DataLoader
    if loader:  # it prices the thread's time in the loader's spans: no kernel or GPU gap another rule prices
        found = [dict(loader, _kernels={}, _gaps={})] + found
    overhead = [f for f in found if f["kind"] == "profiler_overhead"]
    found, notes = ledger.admit([f for f in found if f["kind"] != "profiler_overhead"], ctx)
    return {"findings": [ledger.public(f) for f in found + overhead], "unknown": ctx["unknown"], "skipped": skipped,
            "ledger": notes, "not_run": CPU_NOT_RUN}


CPU_NOT_RUN = ("on a CPU run the rules that ran are the input pipeline, "
               + ", ".join(cpu.LABELS.get(r.kind, r.kind) for r in cpu.CPU_RULES[:1] + lines.CPU_RULES + cpu.CPU_RULES[1:])
               + "; not run, for want of a GPU's timeline: " + "; ".join(cpu.CPU_SKIPPED))


def context(tl, s):
    """What every rule reads beside the timeline: the step's figures, the idle's scale, the device's peak."""
    step, idle_ms = s["step_ms"], s["idle_ms"]
    busy = step - idle_ms
    unprofiled = tl.meta.get("unprofiled_step_ms")
    scale = 1.0
    if isinstance(unprofiled, (int, float)) and 0 < unprofiled < step:  # never more idle than the script's own
        scale = max(0.0, min(1.0, (unprofiled - busy) / idle_ms)) if idle_ms > 0 else 1.0
    peak = tl.meta.get("peak_flops") or hardware.peak_flops(s.get("device"))
    return {"step": step, "idle": idle_ms, "busy": busy, "unprofiled": unprofiled, "scale": scale, "peak": peak,
            "device": s.get("device"),
            "n": tl.n, "micro_batches": tl.meta.get("micro_batches"), "peak_memory_mb": s.get("peak_memory_mb"),
            "regions": (s.get("regions") or {}).get("rows", []), "unknown": [], "claimed": set()}
