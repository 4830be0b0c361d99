"""Pure: a profile summary (profiling.profile.report.summary) -> the Markdown report the agent reads, or JSON.

The report, in the order the agent needs it: failed checks first (one `CHECK FAILED:` line each; a CPU step
time that the profiler's cost per operator explains is a `note:` instead), a header line (device, torch,
steps profiled, tokens/step and samples/step), the GPU's state and the settings that differ from torch's
defaults (profiling/profile/trace/settings.py: who set each), then 0. the findings (the few causes that cost the
most, each with its evidence and fix: profiling/profile/findings/), 1. the step budget (parts that add up to
the step; MFU; peak memory; tokens/s and samples/s; GPU memory at the peak by category and the largest
micro-batch predicted to fit: profiling/profile/tables/gpu_memory.py), where the step goes in the model (regions,
forward and backward; see profiling/profile/tables/regions.py) and by source line (profiling/profile/tables/lines.py), 2. the
top kernels, 3. the checks, 4. what changed since the previous profile. A profile of several ranks
(profiling/profile/report/ranks.py) adds, after the findings, a row per rank and the skew between them; the other
sections are rank 0's.
Tables are GitHub Markdown (tabulate, tablefmt="github"); every number is per step.
"""
import json

from tabulate import tabulate

from profiling.profile.report.summary import diff, noise_ms
from profiling.profile.trace.allocator import NO_CACHING
from profiling.profile.trace import device_state, irregular, settings
from profiling.profile.trace.traceio import num

PART_LABELS = {
    "GEMM": "GEMM",
    "convolution": "convolution (cuDNN/MIOpen kernels, layout transposes)",
    "attention": "attention",
    "other compute": "other compute (fused elementwise, norms, loss)",
    "optimizer": "optimizer",
    "memory": "memory (copy/set)",
    "communication": "communication (collectives, overlapped or not)",
    "idle": "GPU idle (waiting on the CPU)",
    "outside ops": "outside operators (Python, data, waiting)",
    "overlap": "overlap (concurrent kernels, counted once)",
}
REGION_LABELS = {
    "attention": "attention (projections, attention kernels)",
    "data movement": "data movement (copies, sets)",
    "GPU idle": "GPU idle (waiting on the CPU)",
    "outside ops": "outside operators (Python, data, waiting)",
    "overlap": "overlap (concurrent kernels, counted once)",
}
NOT_MEASURED = "not measured"
MODEL_REGIONS = ("embedding", "convolution", "attention", "MLP", "norms and residuals", "head and loss")
SHOW_PERCENT = 1.0      # findings below this share of the step stay in the JSON only
MAX_FINDINGS = 4        # at most this many in the Markdown (about 3 lines each)
ROOF_HEADERS = ["TFLOP/s (% of peak)", "GB/s (% of peak)"]
BOUND_HEADER = "bound ms"
ROOF_NOTE = ("TFLOP/s: GEMM and attention FLOPs (from shapes) over the region's whole time; GB/s: the tensor bytes "
             "of its Triton kernels (each argument once: a floor) over their own time; rules: profiling/profile/tables/roofline.py")
MAX_LINES = 8           # source lines shown (summary.json `lines` keeps more)
LINE_TEXT = 70          # characters of source text shown per row
WHERE_PARTS = 2         # a location's path keeps its last parts (`.../gpt2/modeling_gpt2.py:698`); a file:line
                        # is never cut (the row names the line to edit)
WHERE_RANGES = 3        # line ranges shown of a fused row's file, then a count of the rest
WHERE_FILES = 2         # files shown of a row fused across files, then a count of the rest
ROOF_MISSING = ("TFLOP/s and GB/s: `-` throughout: this trace recorded no input shapes (record_shapes=False), so no "
                "FLOPs or bytes; profile with shapes (torch.profiler's record_shapes=True, or profiling.Profiler "
                "around the loop, which records them) and read it again with `research profile TRACE`")
CPU_NOTE = ("CPU profile: this trace has no GPU timeline (no device events); the times below are CPU operator "
            "self times per step.")


def to_json(summary):
    """The summary as indented JSON; json.loads gives back an equal dict."""
    return json.dumps(summary, indent=2, allow_nan=False)


def _failed(check, summary):
    """A failed check's line at the top: CHECK FAILED, then what it means for the figures below and what to do
    (one indented line each); or a note where the failure is explained (the CPU profiler's cost per operator:
    summary._check_step_time)."""
    if check.get("explained"):
        return f"note: {check['name']}: {check['detail']}; {check['explained']}"
    if check.get("result"):  # the loop's own, no fault of the profile's: steps not alike (trace/irregular.py)
        return f"note: {check['name']}: {check['result']}: {check['detail']}"
    means, do = _step_time_advice(check, summary) if check["name"] == STEP_CHECK else next(
        (v for k, v in CHECK_ADVICE.items() if check["name"].endswith(k)), (None, None))
    return "\n".join([f"CHECK FAILED: {check['name']}: {check['detail']}"]
                     + ([f"  means: {means}", f"  do: {do}"] if means else []))


STEP_CHECK = "profiled vs unprofiled step time"
CHECK_ADVICE = {  # the end of a check's name: (what it means for the figures below, what to do); README's table
    "per step": ("the profiled steps did not run the same work, so the per-step figures below average unlike "
                 "steps", "a step that ran something once (an eval, a save, a compile) is named on a `one-off` "
                 "line; a loop whose work changes from step to step needs more profiled steps (--active-steps)"),
    "bogus timestamps": ("those device events are left out of every figure below", "record again if there are many"),
    "without a launch": ("the trace lost records: the figures below miss their time", "profile fewer or shorter "
                         "steps"),
    "without a device event": ("the trace lost records: the figures below miss their time", "profile fewer or "
                               "shorter steps"),
    "cover device time": ("that much device time is in no category: the step budget's `other` row holds it",
                          "read the top kernels section for what it is"),
}


def _step_time_advice(c, s):
    """(means, do) for a failed step-time check: which figures below still hold, and how to get a sound one."""
    u, step, cpu = s.get("unprofiled_step_ms"), s["step_ms"], s.get("kind") == "cpu"
    load = c.get("load") or {}
    busy = (f" (load average {load['load_average']:g} on {load['cores']} cores as the window opened)"
            if num(load.get("load_average")) and load.get("cores") else "")
    again = f"profile again when the machine is otherwise idle{busy}"
    if not num(u) or u <= 0 or u >= step:  # the profiled steps ran faster: the reference is not one
        return (f"the unprofiled step{f' ({_ms(u)} ms)' if num(u) and u > 0 else ''} is no reference for "
                "these steps: the machine's load or the loop changed between them (other jobs on the host, cold "
                "or warm-up steps timed); the figures below are the profiled steps' own and hold for them",
                again + "; in your own loop, more warm-up steps before the window (warmup_steps)")
    below = ("the header shows the unprofiled step; the operator times below are the profiled ones, each with the "
             "profiler's cost in it" if cpu else "the header, step budget and MFU show the unprofiled step (the GPU "
             "idle cut to fit it); the kernel times are as profiled, which profiling does not change")
    return (f"the profiled step took {_ms(step - u)} ms more (the profiler's cost, or the machine's load "
            f"changing between them): {below}",
            "compare runs by the unprofiled figure; " + again
            + ("" if cpu else "; on a launch-bound loop a `profiler_overhead` finding prices the profiler's share"))


def to_markdown(summary, previous=None, top=10):
    """The report as Markdown. `previous`: an earlier summary to compare with (section 4), or None."""
    cpu = summary.get("kind") == "cpu"
    lines = [_failed(c, summary) for c in summary.get("checks", []) if not c["ok"]]
    if cpu:
        lines.append(CPU_NOTE)
    lines += [f"note: {note}" for note in summary.get("notes") or ()]
    lines += [f"one-off, not per step: {r['text']}" for r in summary.get("one_off") or ()]  # irregular.split
    if lines:
        lines.append("")
    view = _unprofiled_view(summary)
    title = _title(summary, view, cpu)
    state = device_state.text(summary.get("device_state"))
    known = settings.text(summary.get("settings"))
    lines += [title, _header(summary)] + [x for x in (state, known, _recorded(summary)) if x] + [""]
    if "findings" in summary:
        lines += _findings(view) + [""]
    lines += _ranks(view)
    lines += _budget(view) + _regions(view) + _lines(view) + _host_lines(view) + _cuda_calls(view) + [""] \
        + _kernels(view, top) + [""] \
        + _checks(summary)
    if previous is not None:
        lines += [""] + _changes(diff(previous, summary), noise_ms(previous, summary))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------------

def _title(s, view, cpu):
    """`# Profile: N ms/step`: the unprofiled step where profiling lengthened it (its check failed), as the
    README says; on a CPU the title alone (its operator times stay the profiled ones), and there wherever the
    unprofiled step is the shorter, its check passed or not: the CPU profiler's ~8 us an operator is the step's
    own cost only under the profiler (a deep MLP, 4,821 operators a step recorded: 19.3 ms profiled, 7.6-9.3 unprofiled,
    its check passing, since the profiler explains the difference)."""
    u, step = s.get("unprofiled_step_ms"), s["step_ms"]
    if cpu and num(u) and 0 < u < step:
        return (f"# Profile: {_ms(u)} ms/step (CPU, unprofiled; profiled {_ms(step)}: the operator times below "
                "are the profiled ones)")
    timed = s.get("unprofiled_steps") or 0
    alike = next((c for c in s.get("checks") or () if c.get("name") == irregular.CHECK), {})
    if num(u) and u > 0 and timed > s.get("steps", 0) and (alike.get("varies") or alike.get("result") ==
                                                            irregular.NOT_ALIKE):
        # sizes that change between steps: the loop's mean step is the many timed steps', not the few profiled
        return (f"# Profile: {_ms(u)} ms/step" + (" (CPU, " if cpu else " (") + f"unprofiled: the mean of {timed} "
                f"timed steps, whose sizes vary; the {s['steps']} profiled steps' own {_ms(step)}: the tables below)")
    title = f"# Profile: {_ms(view['step_ms'])} ms/step" + (" (CPU)" if cpu else "")
    if view is not s:
        title += f" (unprofiled; profiled {_ms(step)}: see the note under the step budget)"
    return title


def _unprofiled_view(s):
    """The summary as the unprofiled step saw it, when profiling distorted the step (its check failed with the
    profiled step longer): the step is the unprofiled one, the GPU idle the rest of it after the kernels'
    time (which profiling does not change), MFU and tokens/s scaled; else the summary itself."""
    u, step = s.get("unprofiled_step_ms"), s["step_ms"]
    check = next((c for c in s.get("checks", []) if c["name"].startswith("profiled vs unprofiled")), None)
    if s.get("kind") == "cpu" or not check or check["ok"] or not isinstance(u, (int, float)) or not 0 < u < step:
        return s
    idle = max(0.0, u - (step - s["idle_ms"]))
    v = dict(s, step_ms=u, idle_ms=idle, idle_percent=100 * idle / u, categories=dict(s["categories"], idle=idle),
             distorted={"profiled_step_ms": step, "profiled_idle_ms": s["idle_ms"]})
    for key in ("mfu_percent", "tokens_per_second", "samples_per_s"):
        v[key] = s[key] * step / u if s.get(key) else s.get(key)
    if s.get("regions"):
        rows = [dict(r, ms_per_step=idle) if r["region"] == "GPU idle" else r for r in s["regions"]["rows"]]
        v["regions"] = dict(s["regions"], rows=rows)
    if s.get("bound"):
        v["bound"] = dict(s["bound"], measured_ms=u)
    return v


def _header(s):
    parts = [s.get("device") or "unknown device", f"torch {s.get('torch') or 'unknown'}",
             "1 window, no step markers" if s.get("window") == "whole trace"
             else f"{s['steps']} step{'s' * (s['steps'] != 1)} profiled"] + _per_step(s)
    if s.get("commit"):
        parts.append(f"commit {s['commit']}")
    if "ranks" in s:
        parts.append(f"rank {s['report_rank']} of {s['world_size']} (every section but Ranks is rank "
                     f"{s['report_rank']}'s)")
    return " · ".join(parts)


def _per_step(s):
    """What one step processes: tokens, samples, both; `tokens/step unknown` when neither was given."""
    given = [f"{s[key]:,} {what}/step" for key, what in (("tokens_per_step", "tokens"),
                                                          ("samples_per_step", "samples")) if isinstance(s.get(key), int)]
    return given or ["tokens/step unknown"]


def _throughput(s):
    """tokens/s and samples/s, those known."""
    rates = [f"{_rate_text(s['tokens_per_second'])} tokens/s"] if s.get("tokens_per_second") else []
    return rates + ([f"{_rate_text(s['samples_per_s'])} samples/s"] if s.get("samples_per_s") else [])


def _rate_text(x):
    """A rate in units chosen by its size: `1.23M`, `6,281`, `98.1`, `0.42` (never `0.001M`)."""
    if x >= 1e6:
        return f"{x / 1e6:,.2f}M"
    return f"{x:,.0f}" if x >= 1e3 else f"{x:.3g}" if x < 1 else f"{x:,.1f}"


RECORDED = (("stacks", "Python stacks (with_stack)"),
            ("host_samples", "host stacks sampled every 2 ms (less often where that took over 2% of the time)"),
            ("shapes", "shapes"), ("memory", "memory"), ("modules", "modules"), ("flops", "FLOPs"))


def _recorded(s):
    """How the trace was recorded (summary.recorded), and what that means for the step and its idle. A live
    capture's options are always the same; another trace's missing ones are listed (the rules they feed)."""
    how = s.get("recorded")
    if not how:
        return ""
    live = how["by"] == "live capture"
    on = [text for key, text in RECORDED if how.get(key)]
    off = [text for key, text in RECORDED if not how.get(key) and key != "host_samples"]
    line = (f"Recorded by {'this profiler (live capture)' if live else how['by']}"
            + (": " + ", ".join(on) if on else "") + (("; without " if on else " without ") + ", ".join(off)
                                                       if off and not live else "") + "; unprofiled step: "
            + {"trace": "measured before the profiled steps", "around": "measured before and after the profiled steps",
               "given": "given (--unprofiled-ms)"}.get(
                how.get("unprofiled"), "none, so the profiled step could not be checked (give it: --unprofiled-ms)"))
    if how.get("stacks") and not how.get("unprofiled") and s.get("kind") != "cpu":
        line += "; Python stacks slow the host, so GPU idle is not priced"
    return line + _ops_text(how.get("ops"), s)


def _ops_text(ops, s):
    """What the timed steps recorded (issue #50) and what the window cost against the unprofiled step."""
    if not ops:
        return ""
    if "missing" in ops:
        text = f"; timed steps: device only, no operators joined ({ops['missing']})"
    else:
        text = f"; timed steps: device only, operators joined from one untimed step ({100 * ops['joined']:.1f}% " \
               + ("of the like steps' device time, which every table reads" if "joined_all" in ops else
                  "of device time")
        text += (f"; the rest, kernels the untimed step did not launch (data-dependent control flow, a step "
                 f"unlike the others), left without operators: "
                 f"{', '.join(f'`{k[:60]}`' for k in ops['unjoined_kernels'])}"
                 + (f": {_ms(ops['unjoined_ms'])}/step in the step budget and the kernel table but in no "
                    "operator, region or line row" if ops.get("unjoined_ms") else "")
                 if ops["joined"] < 0.995 and ops["unjoined_kernels"] else "")
        offs = [r for r in ops.get("one_off") or () if r["joined"] < 0.995]
        if offs:
            text += (f"; {100 * ops['joined_all']:.1f}% of all: "
                     + ", ".join(f"profiled step {r['position']} ({r['kind']}), {100 * r['joined']:.0f}% joined"
                                 for r in offs)
                     + f", ran kernels the untimed step did not launch; left out of every table as a "
                       f"one-off, {'it costs' if len(offs) == 1 else 'they cost'} the tables nothing")
        if ops.get("donor_unused"):
            text += (f"; the untimed step ran work no profiled step did ({100 * ops['donor_unused']:.0f}% of its "
                     "device time: an eval, a save or a branch after the window), lent to none")
        text += ")"
    u = s.get("unprofiled_step_ms")
    if num(u) and u > 0:
        text += f"; the window's cost: {100 * (s['step_ms'] / u - 1):+.1f}% over the unprofiled step"
    return text


def _findings(s, shown=MAX_FINDINGS):
    """Section 0: the findings worth an edit (1% of the step or more), costliest first; then the caveat."""
    step = s["step_ms"]
    found = [f for f in s["findings"] if f["kind"] != "profiler_overhead"]
    big = [f for f in found if f["ms_per_step"] >= SHOW_PERCENT / 100 * step][:shown]
    lines = ["## 0. Findings (start here: the tables below are their evidence)"]
    for i, f in enumerate(big, 1):
        lines += [f"{i}. **{f['kind']}**: ~{_ms(f['ms_per_step'])} ms/step to gain "
                  f"({100 * f['ms_per_step'] / step:.1f}% of the step)",
                  f"   evidence: {f['evidence']}", f"   fix: {f['fix']}"]
    if s.get("no_findings"):
        lines.append(f"No findings: {s['no_findings']}")
    elif not big:
        idle = "outside operators" if s.get("kind") == "cpu" else "GPU idle"
        tried = any(u.get("experiment") and u["ms_per_step"] >= SHOW_PERCENT / 100 * step
                    for u in s.get("unknown") or ())
        lines.append(f"No rule found a cause costing {SHOW_PERCENT:g}% of the step or more "
                     + ("with a fix that keeps what the model computes; an experiment that changes it is below "
                        if tried else "") + f"({idle} {s['idle_percent']:.1f}%)" + _unexplained(s.get("bound")))
    if len(found) > len(big):
        lines.append(f"({len(found) - len(big)} smaller in summary.json `findings`)")
    lines += [f"note: {f['evidence']}" for f in s["findings"] if f["kind"] == "profiler_overhead"]
    lines += [f"note: {s['not_run'][0].upper()}{s['not_run'][1:]}."] if s.get("not_run") else []
    lines += [f"note: {note}" for note in s.get("ledger") or ()]  # what the ledger cut (findings/ledger.py)
    return lines + _unknown(s)


_UNKNOWN_LABEL = {(False, False): "unexplained", (False, True): "not priced",
                  (True, False): "experiment (it changes what the model computes)"}


def _unknown(s):
    """What rules saw and could not explain, with the evidence that would tell ("not priced": a cause named whose
    fix no measurement shows to pay; "experiment": a cause whose only remedy changes the model, at what that
    remedy could recover); the rules this trace could not run."""
    step = s["step_ms"]
    lines = [_UNKNOWN_LABEL[bool(u.get("experiment")), bool(u.get("unpriced"))]
             + f": {u['what']} (~{_ms(u['ms_per_step'])} ms/step, {u['rule']}"
             + (f"; would need: {', '.join(u['missing'])})" if u.get("missing") and not u.get("experiment") else ")")
             for u in s.get("unknown") or () if u["ms_per_step"] >= SHOW_PERCENT / 100 * step]
    skipped = [f"{x['rule']} ({', '.join(x['missing'])})" for x in s.get("skipped") or ()]
    if skipped:
        lines.append("not checked, this trace lacks their evidence: " + "; ".join(skipped))
    return lines


def _budget(s):
    step = s["step_ms"]
    rows = []
    for name, ms in s["categories"].items():
        if name == "other" and round(ms, 2) == 0 or name == "overlap" and abs(ms) < 1e-3 * step:
            continue  # overlap under 0.1% of the step is timestamp noise
        label = _cell(PART_LABELS.get(name, name))
        if name == "other" and s.get("other_kernels"):
            label = "other: " + _names(s["other_kernels"])
        rows.append([label, _ms(ms), _pct(ms, step)])
    rows.append(["**step**", f"**{_ms(step)}**", "**100.0**"])
    basis = " (the trace's GEMM and attention FLOPs; no model FLOPs given)" if s.get("mfu_basis") == "trace" else ""
    extras = [f"MFU {_num(s.get('mfu_percent'), '.1f')}%{basis}" if s.get("mfu_percent") is not None else "MFU n/a",
              _peak_memory(s)]
    extras += _throughput(s)
    distorted = s.get("distorted")
    note = [f"note: profiled {_ms(distorted['profiled_step_ms'])} ms/step with {_ms(distorted['profiled_idle_ms'])} "
            "ms of GPU idle: the profiler's host cost; above, the unprofiled step and the idle left after the "
            "kernels' time, which profiling does not change"] if distorted else []
    return ["## 1. Step budget", _table(["part", "ms/step", "% of step"], rows), "", " · ".join(extras)] \
        + _bound_line(s.get("bound")) + note + _gpu_memory(s)


def _peak_memory(s):
    """`peak memory 45,060 MB`; never 0 MB on a GPU run, and never a sample between steps called a peak:
    `peak memory unknown (...) · memory in use between steps 1,699 MB (NVML, device-wide; not a peak)`."""
    mb, off = s.get("peak_memory_mb"), s.get("caching_allocator") is False
    why = (f"the caching allocator is off ({NO_CACHING}=1)" if off else "")
    if mb:
        return f"peak memory {_num(mb, ',.0f')} MB" + (f" ({why}; the allocator's statistics)" if off else "")
    if s.get("kind") != "cuda":
        return "peak memory n/a"
    text = "peak memory unknown" + (f" ({why}: the allocator's statistics read 0)" if off else "")
    if s.get("memory_in_use_mb"):
        text += (f" · memory in use at the profiled steps' edges {_num(s['memory_in_use_mb'], ',.0f')} MB "
                 "(NVML, device-wide; a sample between steps, not a peak)")
    return text


MEMORY_LABELS = {"optimizer_state": "optimizer state", "activations": "activations (saved for backward)",
                 "other_persistent": "other persistent (buffers, caches)"}


def _gpu_memory(s):
    """The memory step's record (profiling/profile/trace/allocator.py): the allocated peak by category, the
    reserve around it, the lines holding the most, and what fits. GPU profiles only."""
    g = s.get("gpu_memory")
    if not g or s.get("kind") == "cpu":
        return []
    if "missing" in g:
        return ["", f"GPU memory at the peak: not recorded ({g['missing']})"]
    total = g["peak_allocated_mb"]
    rows = [[MEMORY_LABELS.get(k, k), f"{mb:,.0f}", f"{100 * mb / total:.1f}" if total else "-"]
            for k, mb in g["categories"].items()]
    rows.append(["**allocated at the peak**", f"**{total:,.0f}**", "**100.0**"])
    extras = [f"reserved but unallocated {g['reserved_unallocated_mb']:,.0f} MB (reserved {g['reserved_mb']:,.0f})"]
    if g.get("other_mb") is not None:
        extras.append(f"outside PyTorch (CUDA context, other processes) {g['other_mb']:,.0f} MB")
    extras.append(f"device {g['device_mb']:,.0f} MB" if g.get("device_mb") else "device total unknown")
    lines = ["", "### GPU memory at the peak", _table(["category", "MB", "% of allocated"], rows), "",
             " · ".join(extras)]
    if g.get("lines"):
        lines.append("held at the peak, by line: " + ", ".join(f"`{_cell(r['where'])}` {r['mb']:,.0f} MB"
                                                               for r in g["lines"][:5]))
    f = g.get("fits")
    lines.append(f"largest micro-batch predicted to fit: {f['max_micro_batch']} (recommended "
                 f"{f['recommended_micro_batch']}, {f['margin_percent']}% margin" + _accumulation(f)
                 + (f"; at today's micro-batch, DEPTH up to about {f['max_depth']}" if f.get("max_depth") else "")
                 + f"; {f['basis']}; model: profiling/profile/tables/gpu_memory.py `fits`)" if f else
                 "largest micro-batch predicted to fit: unknown (needs the micro-batch and the device's total)")
    if g.get("note"):
        lines.append(f"note: {g['note']}")
    return lines


def _accumulation(f):
    """`, a divisor of the 256 sequences per step: gradient accumulation 2`, where the step is known."""
    if not f.get("grad_accum_steps"):
        return ""
    return (f", a divisor of the {f['sequences_per_step']:,} sequences per step: gradient accumulation "
            f"{f['grad_accum_steps']}")


def _ranks(s):
    """The ranks of a multi-rank profile (profiling/profile/report/ranks.py): one step-budget row each, and the skew."""
    if "ranks" not in s:
        return []
    rows = [[str(r["rank"]), _ms(r["step_ms"]), _ms(r["compute_ms"]), _ms(r["comm_ms"]), _ms(r["exposed_comm_ms"]),
             _pct(r["exposed_comm_ms"], r["step_ms"]), _ms(r["idle_ms"]), _ms(r["work_ms"])] for r in s["ranks"]]
    head = ["rank", "step ms", "compute", "communication", "exposed comm", "exposed %", "idle", "work"]
    idle = "outside every operator and collective" if s.get("kind") == "cpu" else "no kernel runs"
    lines = [f"## Ranks ({s['world_size']}): the step on each rank", _table(head, rows), "",
             "per step: compute: some non-communication " + ("operator" if s.get("kind") == "cpu" else "kernel")
             + " runs; communication: a collective runs (" + ("gloo/c10d collectives on their threads"
             if s.get("kind") == "cpu" else "NCCL kernels") + "); exposed comm: a collective runs and no compute; "
             f"idle: {idle}; compute + exposed + idle = step; work = step - exposed comm (what a rank does "
             "besides waiting on the collectives)"]
    k = s.get("skew")
    if k and len(s["ranks"]) > 1:
        grew = ", ".join(f"{g['part']} +{_ms(g['ms'])}" for g in k["grew"][:3]) or "nothing by category"
        ops = ", ".join(f"`{_code(o['name'])}` +{_ms(o['ms'])}" for o in k["ops"])
        lines.append(f"skew: step rank {k['slowest']} (slowest) - rank {k['fastest']} (fastest) = "
                     f"{_ms(k['step_spread_ms'])} ms (collectives make the steps equal); work rank {k['straggler']} "
                     f"(most) - rank {k['least_work']} (least) = {_ms(k['work_spread_ms'])} ms; grew on rank "
                     f"{k['straggler']}, ms/step: {grew}" + (f"; operators: {ops}" if ops else ""))
    return lines + [""]


def _unexplained(b):
    """What the findings' silence leaves: the step over its bound, which no rule explains."""
    if b and b.get("ms") is None and b.get("known_percent") is not None:
        return (f"; the step's bound cannot be judged ({_share(b['known_percent'])}% of device time has a known "
                "work, FLOPs or bytes from recorded input shapes): compare the regions and lines below with the last good "
                "run's profile (--previous) to see what grew.")
    if not b or not b.get("ms"):
        return "; see where the step goes below."
    return (f"; the step is {b['measured_ms'] / b['ms']:.2f}x its bound ({_ms(b['ms'])} ms, section 1): compare "
            "the regions and lines below with the last good run's profile (--previous) to see what grew.")


def _bound_line(b):
    """The step's bound against its measured time (profiling/profile/tables/bound.py), one line; none without one."""
    if b and b.get("ms") is None and b.get("known_percent") is not None:
        return [f"bound: not judged, {_share(b['known_percent'])}% of device time has a known work (FLOPs or bytes "
                "from recorded input shapes; rules: profiling/profile/tables/bound.py)"]
    if not b or not b.get("ms"):
        return []
    rate = f"{b['gemm_tflops_per_s']:.0f} TFLOP/s" if b.get("gemm_tflops_per_s") else "n/a"
    return [f"bound {_ms(b['ms'])} ms, measured {_ms(b['measured_ms'])} ms ({b['measured_ms'] / b['ms']:.2f}x): the "
            f"least time of the step's work: FLOPs at this trace's best GEMM rate ({rate}) and bytes at the peak "
            f"bandwidth, kernel by kernel, GPU idle 0 ({_share(b['known_percent'])}% of device time has a known "
            "work; rules: profiling/profile/tables/bound.py)"]


def _regions(s):
    """The region table (section 1, second part): where the step goes in the model, forward and backward."""
    table = s.get("regions")
    if not table:
        return []
    step, body, fwd, bwd = s["step_ms"], [], 0.0, 0.0
    roof, bounded = "flops" in table["rows"][0], "bound_ms" in table["rows"][0]
    for row in table["rows"]:
        if row["region"] == "overlap" and abs(row["ms_per_step"]) < 1e-3 * step:
            continue  # as in the budget: timestamp noise
        split = row["forward_ms"] is not None
        fwd, bwd = fwd + (row["forward_ms"] or 0.0), bwd + (row["backward_ms"] or 0.0)
        if table.get("unmeasured") and row["region"] in MODEL_REGIONS and not row["ms_per_step"]:
            body.append([_cell(REGION_LABELS.get(row["region"], row["region"]))] + [NOT_MEASURED] * 4
                        + (["-", "-"] if roof else []) + (["-"] if bounded else []))
            continue
        body.append([_cell(REGION_LABELS.get(row["region"], row["region"])),
                     _ms(row["forward_ms"]) if split else "", _ms(row["backward_ms"]) if split else "",
                     _ms(row["ms_per_step"]), _pct(row["ms_per_step"], step)]
                    + ([_tflops(row), _bandwidth(row)] if roof else [])
                    + ([_ms(row["bound_ms"])] if bounded else []))
    bound = (s.get("bound") or {}).get("ms")
    body.append(["**step**", f"**{_ms(fwd)}**", f"**{_ms(bwd)}**", f"**{_ms(step)}**", "**100.0**"]
                + (["", ""] if roof else []) + ([f"**{_ms(bound)}**" if bound else ""] if bounded else []))
    what = "device time" if s.get("kind") != "cpu" else "operator time"
    basis = f"{table['parameters']} parameter shapes" if table["parameters"] else "no parameter shapes"
    placed = f"{_share(table['attributed_percent'])}% of {what} placed in a named region ({basis}; rules: " \
             "profiling/profile/tables/regions.py)"
    head = ["region", "forward ms", "backward ms", "ms/step", "% of step"] + (ROOF_HEADERS if roof else []) \
        + ([BOUND_HEADER] if bounded else [])
    lines = ["", "### Where the step goes in the model", _table(head, body), "", placed]
    if table.get("unmeasured"):
        u = table["unmeasured"]
        lines.append(f"not measured: {_ms(u['ms_per_step'])} ms/step of GEMMs are in no model region ({u['why']}): "
                     f"the model's regions read low by that much, and one without other work is `{NOT_MEASURED}`")
    if roof:
        measured = any(r.get("flops") or r.get("gb_per_s") is not None for r in table["rows"])
        lines.append(ROOF_NOTE if measured else ROOF_MISSING)
    return lines + _region_notes(table, step)


def _tflops(row, unit=""):
    """`446 (45%)`: achieved TFLOP/s and % of the device's peak; `-` for no FLOPs counted."""
    if not row.get("flops"):
        return "-"
    pct = row.get("percent_of_peak")
    return f"{row['tflops_per_s']:,.0f}{unit}" + (f" ({pct:.0f}%)" if pct is not None else "")


def _bandwidth(row, unit=""):
    """`2,434 (73%)`: achieved GB/s of the kernels whose bytes are known and % of the device's bandwidth."""
    if row.get("gb_per_s") is None:
        return "-"
    pct = row.get("percent_of_bandwidth")
    return f"{row['gb_per_s']:,.0f}{unit}" + (f" ({pct:.0f}%)" if pct is not None else "")


def _rate(k):
    """A kernel's achieved rate: TFLOP/s where its FLOPs are known, else GB/s where its bytes are; or `-`."""
    return _tflops(k, " TFLOP/s") if k.get("flops") else _bandwidth(k, " GB/s")


def _lines(s, shown=MAX_LINES):
    """Section 1b: the step by source line (profiling/profile/tables/lines.py), a fused kernel's lines shown together."""
    table = s.get("lines")
    if not table:
        return []
    files = list(table.get("files") or {})
    title = "### Lines of " + ", ".join(files[:3]) + (" and others" if len(files) > 3 else "") if files \
        else "### Source lines"
    if table.get("missing"):
        return ["", title, f"not available: {table['missing']}"] + [f"note: {n}" for n in table.get("notes") or []]
    step = s["step_ms"]
    rows = [[_cell(_where(r)), f"`{_code(_line_text(r))}`", _ms(r["forward_ms"]), _ms(r["backward_ms"]),
             _ms(r["ms_per_step"]), _pct(r["ms_per_step"], step)] for r in table["rows"][:shown]]
    head = ["line", "code", "forward ms", "backward ms", "ms/step", "% of step"]
    what = "operator time" if s.get("kind") == "cpu" else "device time"
    out = ["", f"{title} (top {len(rows)} of {table['rows_total']} by ms/step)",
           _table(head, rows) if rows else "(none)", "",
           f"{_share(table['placed_percent'])}% of {what} placed on source lines ({_ms(table['placed_ms'])} "
           f"ms/step, {table['graphs']} compiled graphs); a fused kernel counts once, against all its lines"]
    if len(table.get("files") or {}) > 1:
        out.append("by file: " + ", ".join(f"{f} {_ms(ms)} ms" for f, ms in table["files"].items()))
    return out + _eager_note(table.get("eager")) + _unplaced_lines(table) + [f"note: {n}" for n in
                                                                             table.get("notes") or []]


def _host_lines(s):
    """Section 1b': the host side by line: what each line launches and syncs, its operators' host time, and the
    GPU idle that waited on it (profiling/profile/findings/lines.py `host_table`)."""
    table = s.get("host_lines")
    if not table or not table["rows"]:
        return []
    rows = [[_cell(f"{r['file']}:{r['line']}"), f"`{_code(r['text'])}`", f"{r['launches']:g}", f"{r['syncs']:g}",
             _ms(r["host_ms"]), _ms(r["idle_ms"]), r["mechanism"] or ""] for r in table["rows"]]
    head = ["line", "code", "launches/step", "syncs/step", "host ms/step", "GPU idle waiting on it ms/step",
            "mechanism"]
    return ["", f"### The host by line (top {len(rows)} of {table['rows_total']} by the GPU idle that waits on them)",
            _table(head, rows), "",
            f"{_ms(table['idle_ms'])} of the step's {_ms(table['idle_total_ms'])} ms of GPU idle waits on a line of "
            "yours (in the profiled steps, not scaled to the unprofiled run); host ms: its operators' own time, a "
            "backward's on its forward's line"]


def _cuda_calls(s):
    """Section 1c: the host's time inside CUDA runtime/driver calls per step, by kind (profiling/profile/tables/cuda_calls.py)."""
    table = s.get("cuda_calls")
    if not table:
        return []
    rows = [[r["kind"], _calls(round(r["calls_per_step"], 1)), _ms(r["ms_per_step"]), _ms(r["gpu_idle_ms"]),
             _ms(r["longest_ms"]), _call_names(r)] for r in table["kinds"]]
    head = ["kind", "calls/step", "host ms/step", "of it, GPU idle ms", "longest ms", "top calls (calls/step)"]
    excluded = "".join(f"; left out: `{x['name']}` {_ms(x['ms'])} ms, {x['reason']}" for x in table["excluded"])
    return ["", "### Host time inside CUDA calls", _table(head, rows), "",
            (f"note: the host's time inside CUDA runtime/driver calls per step ({_ms(table['ms_per_step'])} of a "
             f"{_ms(table['host_step_ms'])} ms host step); `GPU idle`: the part of it while the GPU had nothing to "
             "run. Long launch calls with a busy GPU are back-pressure (the host waits for room in a full queue), "
             f"not a defect; the findings price only the idle (rules: profiling/profile/findings/calls.py){excluded}")]


def _call_names(row):
    """`cuLaunchKernel` x500, `cuLaunchKernelEx` x477; for copies also the host memory (pageable, pinned)."""
    text = ", ".join(f"`{_code(x['name'])}` x{_calls(round(x['calls_per_step'], 1))}" for x in row["names"])
    memory = row.get("host_memory") or {}
    if memory:
        text += "; " + ", ".join(f"{m} x{_calls(round(c, 1))}" for m, c in memory.items())
    return text

def _eager_note(eager):
    """How the rows marked `eager` (work outside the compiled graphs) got their lines."""
    if not eager:
        return []
    return [f"eager rows: work outside the compiled graphs, placed by the lines of one more step recorded after "
            f"the profiled ones ({eager['ops_per_step']} operators a step; {eager['steps_matching']} of "
            f"{eager['steps']} profiled steps called the same sequence); a backward kernel on its forward "
            "operator's line"]


def _unplaced_lines(table):
    """One line: the time not placed on a line, by reason, the largest operators of each."""
    if not table.get("unplaced"):
        return []
    by_reason = {}
    for u in table["unplaced"]:
        by_reason.setdefault(u["reason"], []).append(f"`{_code(u['name'])}` {_ms(u['ms_per_step'])} ms")
    reasons = "; ".join(f"{_cell(reason)}: " + ", ".join(names) for reason, names in by_reason.items())
    return [f"not placed: {_ms(table['unplaced_ms'])} ms/step; {reasons}"]


def _where(row):
    """`train.py:427`, `.../gpt2/modeling_gpt2.py:698`, or `train.py:426-427,431, fused`: every file:line shown
    whole, a long path shortened from the left; a long group keeps its first ranges and counts the rest."""
    groups = [g.rsplit(":", 1) if ":" in g else (g, "") for g in str(row["where"]).split("; ")]
    parts = []
    for path, ranges in groups[:WHERE_FILES]:
        runs = [r for r in ranges.split(",") if r]
        text = short_path(path) + (":" + ",".join(runs[:WHERE_RANGES]) if runs else "")
        rest = sum(_run_lines(r) for r in runs[WHERE_RANGES:])
        parts.append(text + (f" +{rest} line{'s' * (rest != 1)}" if rest else ""))
    if len(groups) > WHERE_FILES:
        more = sum(_run_lines(r) for _, ranges in groups[WHERE_FILES:] for r in ranges.split(",") if r)
        parts.append(f"+{more} line{'s' * (more != 1)} in {len(groups) - WHERE_FILES} more "
                     f"file{'s' * (len(groups) - WHERE_FILES != 1)}")
    eager = row.get("eager_ms") and row["eager_ms"] >= row["ms_per_step"] / 2  # mostly outside compiled graphs
    return "; ".join(parts) + (", fused" if row["fused"] else "") + (", eager" if eager else "")


def short_path(path, keep=WHERE_PARTS):
    """A path shortened from the left to its last `keep` parts: `.../gpt2/modeling_gpt2.py`."""
    parts = str(path).replace("\\", "/").split("/")
    return path if len(parts) <= keep + 1 else ".../" + "/".join(parts[-keep:])


def _run_lines(run):
    """The number of lines of one range of a location: `426-427` is 2, `431` is 1."""
    a, _, b = run.partition("-")
    try:
        return int(b) - int(a) + 1 if b else 1
    except ValueError:
        return 1


def _line_text(row, width=LINE_TEXT):
    text = " · ".join(x["text"] for x in row["lines"] if x["text"])
    return text if len(text) <= width else text[:width - 3] + "..."


def _region_notes(table, step):
    """One line per note, shape split (over 0.1% of the step), the unplaced parameters, and each reason for
    unattributed time."""
    lines = [f"note: {n}" for n in table.get("notes", [])]
    if (table.get("moved_to_backward_ms") or 0.0) >= 1e-3 * step:
        lines.append(f"backward work run inside the compiled forward (gradient GEMMs the compiler moved there): "
                     f"{_ms(table['moved_to_backward_ms'])} ms/step, counted as backward")
    lines += [f"shared shape {_shape(x['shape'])}: {_ms(x['ms_per_step'])} ms/step split by parameter count, "
              + ", ".join(f"{r} {c}" for r, c in x["parameters"].items())
              for x in table.get("shared_shapes", [])[:3] if x["ms_per_step"] >= 1e-3 * step]
    if table.get("unplaced_parameters"):
        lines.append(f"parameters of no known region ({table['unplaced_parameters_total']}): "
                     + _names(table["unplaced_parameters"]))
    by_reason = {}
    for u in table.get("unattributed", []):
        by_reason.setdefault(u["reason"], []).append(f"`{_code(u['name'])}` {_ms(u['ms_per_step'])} ms")
    lines += [f"unattributed ({_cell(reason)}): " + ", ".join(names) for reason, names in by_reason.items()]
    return lines


def _kernels(s, top):
    what = "CPU ops (self time)" if s.get("kind") == "cpu" else "kernels"
    shown = s["kernels"][:top]
    roof = bool(shown) and "flops" in shown[0]
    rows = [[str(i), f"`{_code(k['name'])}`", k["category"], _ms(k["ms_per_step"]),
             f"{k['pct_of_step']:.1f}", _calls(k["calls_per_step"])] + ([_rate(k)] if roof else [])
            for i, k in enumerate(shown, 1)]
    head = ["#", "op" if s.get("kind") == "cpu" else "kernel", "category", "ms/step", "% of step", "calls/step"] \
        + (["achieved (% of peak)"] if roof else [])
    title = f"## 2. Top {len(shown)} {what} per step (of {s.get('kernels_total', len(s['kernels']))})"
    return [title, _table(head, rows) if rows else "(none)"]


def _checks(s):
    rows = [[_cell(c["name"]), _result(c), _cell("; ".join(filter(None, (c["detail"], c.get("explained")))))]
            for c in s.get("checks", [])]
    return ["## 3. Checks", _table(["check", "result", "detail"], rows)]


def _result(c):
    """A check's result word: its own (steps `not alike`), else ok, explained or FAILED."""
    return c.get("result") or ("ok" if c["ok"] else "explained" if c.get("explained") else "FAILED")


def memory_line(change):
    """`GPU memory at the peak: A -> B MB (+C MB): activations +x, ...` from summary.memory_change."""
    peak = change["peak_allocated_mb"]
    moved = [f"{c['name']} {c['change_mb']:+,.0f}" for c in change["categories"] if abs(c["change_mb"]) >= 1]
    grew = f" ({peak['current'] - peak['previous']:+,.0f} MB)" if None not in peak.values() else ""
    def mb(x):
        return "?" if x is None else f"{x:,.0f}"
    return (f"GPU memory at the peak: {mb(peak['previous'])} -> {mb(peak['current'])} MB{grew}"
            + (": " + ", ".join(moved) if moved else ": no category moved by 1 MB"))


def _changes(d, noise=None):
    """Section 4. `noise`: the CPU's noise floor in ms/step (summary.noise_ms): a change within it is called
    noise, and rows that moved less are left out."""
    step = d["step_ms"]
    title = f"## 4. Changes since the previous profile ({d['previous_commit'] or '?'} -> " \
            f"{d['current_commit'] or '?'})"
    moved = f"({step['change_ms']:+.2f} ms{_signed_pct(step['change_pct'])})"
    line = f"step: {_ms(step['previous'])} -> {_ms(step['current'])} ms/step {moved}"
    if noise is not None:
        line += (f": within this machine's noise (±{_ms(noise)} ms/step: half the widest spread of either "
                 "profile's steps, profiled or timed), so not a change" if abs(step["change_ms"]) <= noise
                 else f", beyond this machine's noise (±{_ms(noise)} ms/step)")
    lines = [title, line]
    if d.get("gpu_memory"):
        lines.append(memory_line(d["gpu_memory"]))
    lines += [f"note: {n}" for n in d.get("notes", [])]
    floor = max(noise or 0.0, 0.005)  # under 0.01 ms/step once rounded: no move

    def kept(rows):
        return [r for r in rows if abs(r["change_ms"]) > floor]
    rows = [[_cell(f"category: {c['name']}"), _ms(c["previous"]), _ms(c["current"]), f"{c['change_ms']:+.2f}"]
            for c in kept(d["categories"][:5])]
    rows += [[_cell(f"region: {r['name']}"), _ms(r["previous"]), _ms(r["current"]), f"{r['change_ms']:+.2f}"]
             for r in kept(d.get("regions", [])[:5])]
    rows += [[f"kernel: `{_code(k['name'])}`", _ms(k["previous"]), _ms(k["current"]), f"{k['change_ms']:+.2f}"]
             for k in kept(d["kernels"])]
    if rows:
        lines += ["", _table(["what", "before ms/step", "now ms/step", "change ms/step"], rows)]
    elif noise:
        lines.append(f"no category, region or operator moved by more than the noise (±{_ms(noise)} ms/step)")
    else:
        lines.append("no category or kernel moved by 0.01 ms/step or more")
    return lines


# ---------------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------------

def _table(headers, rows):
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _ms(x):
    if x is None:
        return "n/a"
    return f"{x:.2f}" if abs(x) >= 0.1 or x == 0 else f"{x:.3f}"


def _pct(ms, step):
    return f"{100 * ms / step:.1f}" if step else "n/a"


def _signed_pct(p):
    return "" if p is None else f", {p:+.1f}%"


def _share(pct):
    """A percentage with one decimal that never rounds a shortfall up to 100.0."""
    text = f"{pct:.1f}"
    return ">99.9" if text == "100.0" and pct < 100 else text


def _shape(shape):
    return "[" + ", ".join(map(str, shape)) + "]"


def _num(x, fmt):
    return format(x, fmt)


def _calls(x):
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def _cell(text):
    """Text safe inside a Markdown table cell: one line, pipes escaped."""
    return str(text).replace("\n", " ").replace("|", "\\|")


def _code(text):
    """Text safe inside a `code span` inside a table cell."""
    return _cell(text).replace("`", "'")


def _names(names, limit=3):
    shown = ", ".join(f"`{_code(n)}`" for n in names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")
