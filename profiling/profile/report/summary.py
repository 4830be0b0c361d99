"""Pure: a torch.profiler Chrome trace -> a per-step summary (plain data). Stdlib only, never torch.

    trace = load_trace("trace.json.gz")      # gzip or plain; bad input -> UserError (one line)
    s = summarize(trace)                     # dict: steps, step_ms, idle_ms, categories, kernels, checks
    d = diff(previous_summary, s)            # what moved since the previous profile

How the numbers are made (so they add up and can be trusted):

- Steps are the `ProfilerStep#N` CPU windows. Each device event (kernel, memcpy, memset) belongs to the
  step whose CPU window contains its launch (the cuda_runtime/cuda_driver event with the same
  `correlation`), whatever thread launched it. Device events launched before the profiled steps (warm-up
  work still running, whose launch was never recorded: correlation below every recorded launch) or
  outside every step window are not counted; they are reported in the checks.
- Step time is measured on the GPU timeline: a step runs from its first device event to the next step's
  first device event (the last step: to its last device event). So steps tile the timeline, and the gap
  while the GPU waits is idle of the step before it.
  `step_ms` is the mean over the profiled steps.
- Per step: categories = the summed device time of its events by category (classify.py has the rules;
  events launched inside an annotation window whose name starts with "optimizer"/"Optimizer." -- torch's
  own `Optimizer.step#...` and `Optimizer.zero_grad#...` or a `record_function("optimizer")` -- count as
  optimizer, less the model's forward and backward run inside `optimizer.step(closure)` (Lightning, LBFGS:
  closures.py)); idle = step time minus the union of its busy intervals; `overlap` (zero or negative) removes
  time counted twice when kernels ran concurrently. categories + idle + overlap = step, exactly.
- A trace without ProfilerStep markers (profiled without a schedule) is read as the iterations of its loop where a
  marker repeats (the optimizer's step, the DataLoader's next batch, a forward root, a compiled region's call, on
  the CPU the operators' own sequence: trace/iterations.py; `iterations` and a note say so), as one call where
  the repeats are the inner loop of one annotation (`iterations.one_call`), else as one step: the whole span of
  its host events, so every launch falls inside it (`window` says "whole trace"), less the run's start-up where
  the trace holds one (runtime calls of 50 ms or more, or compilation, before most of the work:
  iterations.startup; `startup` and a note say so).
- Steps that do not repeat are left out of every figure, table and finding and reported once (`one_off`:
  [{kind (compile, cold first pass, cold first call, eval, checkpoint save, log flush, unnamed), step, position,
  of, ms, median_ms, compile_ms, why, only, text}]; compilation outside every step has step None): a step that
  compiles, one over twice the like steps' median, a first iteration unlike the rest (trace/irregular.py's
  split, right after the steps are made); then the waits a finding said once and priced in no step (step None:
  a DataLoader not yet steady, kind "loader not yet steady", findings/input.py).
- A trace without device events is a CPU profile: the same summary over CPU operators' self time
  (kind "cpu"); step time is the ProfilerStep window; idle becomes "outside ops" (Python, data, waiting).

The summary (plain JSON data; `render.to_json` writes it as is):
    version, kind ("cuda" or "cpu"), device, torch, commit, tokens_per_step, tokens_per_second,
    samples_per_step, samples_per_s, mfu_percent,
    peak_memory_mb, unprofiled_step_ms                header; None where unknown (never 0 MB)
    peak_memory_source                                "allocator" (max_memory_allocated), None: unknown
    memory_in_use_mb                                  where the peak is unknown on a GPU: NVML's device-wide
                                                      use at the profiled steps' edges (a sample, not a peak)
    caching_allocator                                 False: PYTORCH_NO_CUDA_MEMORY_CACHING turned it off (its
                                                      statistics and snapshot read nothing); None: CPU or not
                                                      recorded
    gpu_memory                                        GPU memory at the memory step's peak
                                                      (profiling/profile/trace/allocator.py): {peak_allocated_mb,
                                                      reserved_mb, reserved_unallocated_mb, device_mb, other_mb,
                                                      categories: {name: mb}, lines: [{where, mb}], events,
                                                      allocator_peak_mb, note?, micro_batch (measured at),
                                                      fits: {max_micro_batch,
                                                      recommended_micro_batch (a divisor of the sequences per
                                                      step where micro_batches is known), margin_percent,
                                                      sequences_per_step?, grad_accum_steps?, per_sequence_mb,
                                                      fixed_mb, fragmentation_percent, basis} or None}; or
                                                      {missing: why}; None when not recorded
    settings                                          the process's settings (profiling/profile/trace/settings.py):
                                                      {recorded: false}, or {recorded: true, differs: [{name,
                                                      value, default, by, source, during}], all: the record}
    steps, step_ms, step_ms_each                      profiled steps; mean and per-step ms
    window, notes                                     "steps" (the ProfilerStep windows) or "whole trace" (a trace
                                                      without markers, read as one step); notes: lines the report
                                                      shows at its top
    no_findings                                       why there are no findings (a step under MIN_JUDGED_MS), when so
    idle_ms, idle_percent, device_ms                  per step (device_ms: None for a CPU profile)
    categories                                        part -> ms/step: GEMM, attention, other compute,
                                                      optimizer, memory, communication (only where there
                                                      are collectives), other, idle ("outside ops" on
                                                      CPU), overlap; they sum to step_ms
    other_kernels                                     names of the kernels in "other"
    kernels, kernels_total                            [{name, raw_name, category, ms_per_step,
                                                      pct_of_step, calls_per_step, + the roofline fields}],
                                                      ms/step descending (CPU profile: operators by self
                                                      time, no roofline fields)
    not_counted                                       device events left out, by reason
    checks                                            [{name, ok, detail, explained?, load?}]: `explained`,
                                                      on a failed CPU step-time check, says the profiler's
                                                      cost per operator accounts for the excess; `load`,
                                                      on a failed step-time check, the host's {load_average,
                                                      cores} as the window opened (where recorded)
    findings                                          the causes that cost the most (profiling/profile/findings/):
                                                      [{kind, ms_per_step, pct_of_step, evidence, fix}]
    regions                                           where the step goes in the model (profiling/profile/tables/regions.py):
                                                      rows [{region, forward_ms, backward_ms, ms_per_step,
                                                      pct_of_step, + the roofline fields}] that sum to
                                                      step_ms, attributed_percent, unattributed,
                                                      shared_shapes, unplaced_parameters,
                                                      moved_to_backward_ms (backward GEMMs run in a
                                                      compiled forward, counted as backward)
    roofline fields (device profiles; profiling/profile/tables/roofline.py): flops and bytes per step, tflops_per_s and
    percent_of_peak (FLOPs over the row's time), gb_per_s and percent_of_bandwidth (bytes over the time of
    the kernels whose bytes are known); None where unknown
    lines                                             the step by source line (profiling/profile/tables/lines.py): rows
                                                      [{where, lines: [{file, line, text}], fused, forward_ms,
                                                      backward_ms, ms_per_step, pct_of_step, kernels,
                                                      top_kernel}], rows_total, placed_percent, placed_ms,
                                                      unplaced_ms, unplaced [{reason, name, ms_per_step}],
                                                      files, graphs, notes (lines a cached compile recorded
                                                      that the running code lacks); or `missing` (why there
                                                      is no table)
    recorded                                          how the trace was recorded (`recorded`): by (live capture
                                                      or torch.profiler), stacks, host_samples, shapes, memory,
                                                      modules, flops, unprofiled ("trace", "given" or None)
    host_lines                                        the host side by line of the user's code (device profiles
                                                      with a line record; profiling/profile/findings/lines.py
                                                      `host_table`): rows [{file, line, text, launches, syncs,
                                                      host_ms, idle_ms, mechanism}], rows_total, idle_ms,
                                                      idle_total_ms; None without a line record
    cuda_calls                                        the host's time inside CUDA runtime/driver calls per step,
                                                      by kind (profiling/profile/tables/cuda_calls.py `table`); device
                                                      profiles only, None when the steps made no call

The capture adds its measurements to the trace as a top-level key (`prof.add_metadata_json(META_KEY,
json.dumps(meta))`); every field is optional and None means unknown:

    "autoresearch": {
        "version": 1,
        "unprofiled_step_ms": 88.5,      # mean ms/step measured just before profiling, same process
        "tokens_per_step": 131072,       # tokens processed per optimizer step
        "samples_per_step": 256,         # samples (images, sequences) per optimizer step, for samples/s
        "device": "NVIDIA H100 80GB HBM3",
        "torch": "2.11.0+cu130",
        "commit": "6efc013",             # git commit of train.py (add "-dirty" when modified)
        "peak_memory_mb": 45060.2,       # torch.cuda.max_memory_allocated() / 2**20 over the run
        "mfu_percent": 36.1,             # from the unprofiled step time
        "flops_per_step": 3.2e14,        # model FLOPs per step (used for MFU when mfu_percent is absent)
        "peak_flops": 9.895e14,          # device peak FLOP/s (bf16 dense), None when unknown
        "warmup_steps": 2, "active_steps": 5,
        "parameters": {"blocks.0.mlp.c_fc.weight": [2048, 512], ...}, # name -> shape: the region table
        "micro_batches": 2,              # forward/backward passes per optimizer step
        "micro_batch": 128,              # sequences per forward/backward (what fits)
        "gpu_memory": {...},             # the memory step's record (profiling/profile/trace/allocator.py), or
                                         # {"missing": why}
        "host_samples": {...},           # the main thread's Python stack every 2 ms (profiling/profile/capture/sampler.py)
        "syncs": [{"where": "train.py:702", "line": "...", "count": 2}],  # CUDA sync debug mode's warnings
        "syncs_steps": 1,                # the steps those counts are over (the untimed detail step; older
                                         # traces: absent, the profiled steps)
        "shapes": {"matched", "unmatched"},  # operators given the detail step's input shapes ({"joined": True}
                                         # where the operators themselves came from it)
        "capture_ops": "device",         # what the timed steps recorded: "device" (CUDA: kernels and launches
                                         # only) or "full" (every operator; always on the CPU)
        "operators": {"steps", "launches", "of", "device_us", "unjoined_us", "unjoined_kernels"},  # the join
                                         # of the detail step's operators (profiling/profile/trace/join.py)
        "dynamo": {"graph_breaks": [{"reason", "count"}], "resumes": {...}, "unique_graphs": 8},
        "provenance": {"frames", "stacks", "graphs": [...]}  # source lines of the compiled kernels
                                         # (profiling/profile/capture/provenance.py), None when not recorded
        "settings": {"values", "defaults", ...},  # torch's modes, flags, compiler settings, environment
                                         # and gc before the profiled steps (profiling/profile/trace/settings.py)
    }
"""
from collections import Counter, defaultdict

from profiling.errors import UserError
from profiling.profile import findings
from profiling.profile.findings.cpu import CPU_US_PER_OP
from profiling.profile.report import kernel_match
from profiling.profile.tables import (
    attention_kind,
    bound,
    closures,
    cuda_calls,
    gpu_memory,
    lines,
    regions,
    roofline,
)
from profiling.profile.trace import allocator, device_state, device_work, hardware, irregular, settings
from profiling.profile.trace.classify import CATEGORIES, classify_cpu_op, classify_kernel, unique_names
from profiling.profile.trace.timeline import Timeline
from profiling.profile.trace.traceio import (
    WHOLE_TRACE,
    check_content,
    check_events,
    check_trace,
    corr,
    find,
    has_shapes,
    index,
    load_trace,
    num,
    read_json,
    self_times,
    union_length,
)

__all__ = ["META_KEY", "check_trace", "diff", "load_summary", "load_trace", "summarize"]

VERSION = 1
META_KEY = "autoresearch"
STEP_TOLERANCE = 0.03   # profiled vs unprofiled step time
# The CPU profiler's own cost per operator it records (findings/cpu.py CPU_US_PER_OP): a CPU excess within the
# step's operators x this is the profiler's fixed cost, not a distortion of the program.
# The main thread's loss per host stack sample over the sampler's own time (profiling/profile/capture/sampler.py's
# MAIN_PAYS, measured: median 1.8x). On the CPU the sampler runs every 2 ms: train.py's CPU step of ~500 ms
# lost 19-28 ms of sampler time a step, x this 38-55 ms, on top of its 6,303 operators x CPU_US_PER_OP.
SAMPLER_MAIN_PAYS = 2.0
# Operators a periodic step (logging, a metric) may add to or lack from the others' count and still be the same
# step: the Hugging Face Trainer's logging step ran 16 more on the CPU (tests/data/cpu-hf-gpt2-logging: the
# loss's mean and the gradient norm), Lightning's CSVLogger step 4 more (cpu-lightning-sequential); 4x the larger.
PERIODIC_OPS = 64
OTHER_LIMIT = 0.01      # at most this share of device time may stay uncategorised
MIN_KNOWN_PERCENT = 50  # the step's bound is stated only where this share of device time has a known work
LAUNCH_WORDS = ("launch", "memcpy", "memset")  # runtime calls that must produce a device event
# No findings below this step time: a launch costs ~5 us of host time, the profiler a few us per event and the
# clocks ~1 us, so a step under 1 ms is mostly these fixed costs and a handful of kernels (one 0.045 ms trace
# had a float32 GEMM "worth" 44% of it): its gaps and rates say more about the profiler than about the program.
MIN_JUDGED_MS = 1.0
TRAIN_PY_DEPTH_POWERS = (3, 2)  # train.py's weights grow as DEPTH^3, its activations as DEPTH^2 (gpu_memory.max_depth)


def load_summary(path):
    """A summary from a file holding either a summary (JSON, as `research profile --json` writes) or a trace."""
    data = read_json(path)
    if isinstance(data, dict) and "step_ms" in data and "kernels" in data:
        return data
    check_trace(data, source=str(path))
    return summarize(data)


# ---------------------------------------------------------------------------------------------------------
# Device (GPU) profile
# ---------------------------------------------------------------------------------------------------------

def _device_tables(ix, per_step, windows):
    """Per-step means: categories (with idle and overlap), busy; per-kernel totals; each event's category."""
    n, opt_starts = len(per_step), [w[0] for w in ix.optimizer]
    cats = dict.fromkeys(CATEGORIES, 0.0)
    rows, busy, counts, labels = {}, 0.0, [], []
    for evs in per_step:
        counts.append(len(evs))
        labels.append([])
        busy += union_length([(e["ts"], e["ts"] + e["dur"]) for e, _ in evs])
        for e, launch in evs:
            in_opt = find(ix.optimizer, opt_starts, launch["ts"]) is not None
            cat = classify_kernel(str(e.get("name", "")), str(e.get("cat", "")).lower(), in_opt)
            labels[-1].append(cat)
            cats[cat] += e["dur"]
            row = rows.setdefault((str(e.get("name", "")), cat), [0.0, 0])
            row[0] += e["dur"]
            row[1] += 1
    step_us = sum(end - start for start, end in windows)
    device_us = sum(cats.values())
    cats = {k: v / n / 1e3 for k, v in cats.items()}
    cats["idle"] = (step_us - busy) / n / 1e3
    cats["overlap"] = (busy - device_us) / n / 1e3
    return cats, rows, counts, labels


def _kernel_rows(rows, n, step_ms, readable=True):
    """The kernel (or CPU op) table: unique readable names, by ms/step descending."""
    order = sorted(rows, key=lambda key: (-rows[key][0], key))
    raws = list(dict.fromkeys(raw for raw, _ in order))
    names = unique_names(raws) if readable else {raw: raw for raw in raws}
    split = {raw for raw in raws if sum(1 for r, _ in order if r == raw) > 1}
    table = []
    for raw, cat in order:
        total, calls = rows[(raw, cat)]
        ms = total / n / 1e3
        table.append({
            "name": names[raw] + (f" ({cat})" if raw in split else ""), "raw_name": raw, "category": cat,
            "ms_per_step": _r(ms), "pct_of_step": _r(100 * ms / step_ms if step_ms else 0.0),
            "calls_per_step": _r(calls / n),
        })
    return table


def _kernel_work(kernels, tl, work, n, peaks):
    """Adds the roofline fields (profiling/profile/tables/roofline.py) to each kernel row, from each event's work."""
    sums = {}
    for evs, cats, done in zip(tl.per_step, tl.labels, work):
        for (e, _), cat, (flops, nbytes) in zip(evs, cats, done):
            acc = sums.setdefault((str(e.get("name", "")), cat), [None, None, 0.0])
            if flops:
                acc[0] = (acc[0] or 0.0) + flops
            if nbytes:
                acc[1], acc[2] = (acc[1] or 0.0) + nbytes, acc[2] + e["dur"]
    for k in kernels:
        flops, nbytes, bytes_us = sums.get((k["raw_name"], k["category"]), (None, None, 0.0))
        k.update(roofline.rates(flops and flops / n, k["ms_per_step"] * 1e3, nbytes and nbytes / n, bytes_us / n,
                                *peaks))


def recorded(trace, ix, unprofiled_given=False, operators=None):
    """How the trace was recorded, from torch's own flags at its top level (2.x writes `with_stack`,
    `record_shapes`, `profile_memory`, `with_modules`, `with_flops` when on) or, for older traces, the events
    those options leave; by whom (this profiler's live capture leaves its META_KEY); and where the unprofiled
    step time comes from. Python stacks recorded by torch (with_stack) slow the host several-fold, so GPU
    idle in such a trace is not the script's own without an unprofiled figure to scale it to."""
    cats, memory, modules = set(), False, False
    for e in trace["traceEvents"]:
        if isinstance(e, dict):
            cat, name = e.get("cat"), str(e.get("name", ""))
            cats.add(cat)
            memory = memory or name == "[memory]"
            modules = modules or (cat == "python_function" and name.startswith("nn.Module:"))
    meta = trace.get(META_KEY)
    live = isinstance(meta, dict) and bool(meta)
    unprofiled = (meta or {}).get("unprofiled_step_ms") if live else None
    return {
        "by": "live capture" if live else "torch.profiler",
        "stacks": bool(trace.get("with_stack")) or "python_function" in cats,
        "host_samples": live and bool((meta.get("host_samples") or {}).get("stacks")),
        "shapes": bool(trace.get("record_shapes")) or has_shapes(ix.cpu_ops),
        "memory": bool(trace.get("profile_memory")) or memory,
        "modules": bool(trace.get("with_modules")) or modules,
        "flops": bool(trace.get("with_flops")) or any("flops" in (op.get("args") or {}) for op in ix.cpu_ops[:2000]),
        "unprofiled": "given" if unprofiled_given else (("around" if (meta or {}).get("timed_after") else "trace")
                                                         if num(unprofiled) and unprofiled > 0 else None),
        "ops": _ops_joined(dict(meta, operators=operators or meta.get("operators")), ix.one_off) if live else None,
    }


def _joined_per_step(ix, meta):
    """A device-only capture's join record, made before the join kept it step by step: each step's device time and
    the part of it whose launch has no operator (no External id), read from the trace before irregular.split
    takes the one-offs out (so `_ops_joined` can say the like steps' share). `meta` changed in place."""
    record = meta.get("operators")
    if (meta.get("capture_ops") != "device" or not isinstance(record, dict) or "missing" in record
            or record.get("per_step") or ix.whole or len(ix.steps) != record.get("steps")):
        return
    device = defaultdict(float)
    for e in ix.device:
        device[corr(e)] += float(e.get("dur") or 0)
    starts, per = [a for a, _, _ in ix.steps], [[0.0, 0.0] for _ in ix.steps]
    for c, launch in ix.launches.items():
        k = find(ix.steps, starts, launch.get("ts"))
        if k is not None and device.get(c):
            per[k][0] += device[c]
            if (launch.get("args") or {}).get("External id") is None:
                per[k][1] += device[c]
    meta["operators"] = dict(record, per_step=[[round(d, 1), round(u, 1)] for d, u in per])


DONOR_UNUSED = 0.1  # of the untimed step's device time paired in no timed step: it was unlike them (said)


def _ops_joined(meta, one_off=()):
    """How a live capture's timed steps got their operators (issue #50): None when recorded in them ("full",
    or a capture before the choice existed), else {"joined": share of device time whose launch found its
    operator in the untimed step, "unjoined_kernels"} or {"missing": why there are none}. Where the join
    recorded each step's share and irregular.split left steps out as one-offs (issue #57 item 1: an eval's
    forwards, which the untimed step did not run, left 47% of a window's device time unjoined), "joined" is
    that of the like steps, which every table reads, with "joined_all" (every profiled step), "unjoined_ms"
    (per like step: kernels in the budget and kernel tables but in no operator, region or line row) and
    "one_off": [{position, kind, joined}] of the steps left out; "donor_unused": the share of the untimed
    step's device time no timed step ran, over DONOR_UNUSED (an eval or a save after the window)."""
    if meta.get("capture_ops") != "device":
        return None
    record = meta.get("operators") or {"missing": "the untimed operator step did not run"}
    if "missing" in record:
        return {"missing": record["missing"]}
    device = record.get("device_us") or 0.0
    out = {"joined": 1.0 - record.get("unjoined_us", 0.0) / device if device else 1.0,
           "unjoined_kernels": record.get("unjoined_kernels") or []}
    lent, unused = record.get("donor_us") or 0.0, record.get("donor_unused_us") or 0.0
    if lent and unused / lent > DONOR_UNUSED:
        out["donor_unused"] = unused / lent
    per = record.get("per_step")
    steps = [r for r in one_off if r.get("position")]
    if not per or any(r.get("of") != len(per) for r in steps):
        return out
    gone = {r["position"] for r in steps}
    like = [p for i, p in enumerate(per, 1) if i not in gone]
    like_us = sum(d for d, _ in like)
    if not like or not like_us:
        return out
    out["joined_all"] = out["joined"]
    out["joined"] = 1.0 - sum(u for _, u in like) / like_us
    out["unjoined_ms"] = sum(u for _, u in like) / len(like) / 1e3
    out["one_off"] = [{"position": r["position"], "kind": r.get("kind"),
                       "joined": 1.0 - per[r["position"] - 1][1] / per[r["position"] - 1][0]
                       if per[r["position"] - 1][0] else 1.0} for r in steps]
    return out


def _summarize_device(ix, meta, how, per_step, windows, out):
    """The device summary of the like steps: their device events (`per_step`), their windows on the GPU
    timeline, and what attribution left out (`out`), as irregular.split made them."""
    if not ix.launches and not out.get("one_off"):
        raise UserError("trace has device events but no CUDA runtime/driver launch events; record with "
                        "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    n = len(per_step)
    cats, rows, counts, labels = _device_tables(ix, per_step, windows)
    each = [(end - start) / 1e3 for start, end in windows]
    step_ms = sum(each) / n
    kernels = _kernel_rows(rows, n, step_ms)
    tl = Timeline(ix, per_step, windows, labels, meta)
    work = roofline.work(tl, attention_kind.of(tl).kind == attention_kind.CAUSAL)
    moved = regions.moved_to_backward(tl, regions.Parameters(meta.get("parameters")))
    peaks = (meta.get("peak_flops") or hardware.peak_flops(meta.get("device")), hardware.peak_bandwidth(meta.get("device")))
    _kernel_work(kernels, tl, work, n, peaks)
    rate, tl.bound_basis = bound.gemm_ceiling(tl, work, peaks[0])
    bounds = bound.event_bounds(tl, work, rate, peaks[1]) if peaks[1] else None
    s = _header("cuda", meta, n, step_ms, each)
    counted = sum(f for done in work for f, _ in done if f) / n
    if s["mfu_percent"] is None and peaks[0] and counted and step_ms > 0:  # no model FLOPs given: the trace's
        s.update(mfu_percent=_r(100 * counted / (step_ms / 1e3) / peaks[0]), mfu_basis="trace")
    s.update(idle_ms=_r(cats["idle"]), idle_percent=_r(100 * cats["idle"] / step_ms if step_ms else 0.0),
             device_ms=_r(sum(cats[c] for c in CATEGORIES)), categories=_categories(cats),
             other_kernels=[k["name"] for k in kernels if k["category"] == "other"],
             kernels=kernels, kernels_total=len(kernels),
             not_counted={"launched_before_steps": out["before"], "launched_outside_steps": out["outside"],
                          "bogus_timestamps": len(out["bogus"])},
             regions=regions.device_table(tl, labels, meta, {"step_ms": step_ms, "categories": cats}, work, peaks,
                                          moved, bounds),
             lines=lines.device_table(tl, ix.graph_calls, meta, step_ms, moved))
    s["bound"] = _step_bound(tl, bounds, rate, s)
    s["cuda_calls"] = cuda_calls.table(tl)
    tl.bounds = bounds
    if step_ms >= MIN_JUDGED_MS:
        s.update(findings.diagnose(tl, s, stacks=how["stacks"]))
    else:
        s.update(findings=[], unknown=[], skipped=[],
                 no_findings=f"the step is {_ms_text(step_ms)} of device timeline, shorter than {MIN_JUDGED_MS:g} ms: "
                             "too short to judge (launch and profiler costs dominate it)")
    s["checks"] = [
        _check_counts(counts, "device events"),
        _check_step_time(step_ms, meta),
        _check_bogus(out["bogus"]),
        _check_unlaunched(out),
        _check_launches(ix, out["seen"]),
        _check_coverage(cats, s["other_kernels"]),
    ]
    return s


# ---------------------------------------------------------------------------------------------------------
# CPU profile (no device events)
# ---------------------------------------------------------------------------------------------------------

def _step_bound(tl, bounds, rate, s):
    """The step's bound (profiling/profile/tables/bound.py): the region rows' bounds summed, and what it rests on;
    `ms` None (and no region bounds) where less than MIN_KNOWN_PERCENT of device time has a known work."""
    if bounds is None:
        return None
    known = sum(e["dur"] for evs, row in zip(tl.per_step, bounds) for (e, _), b in zip(evs, row) if b is not None)
    device = sum(e["dur"] for evs in tl.per_step for e, _ in evs)
    known_percent = _r(100 * known / device) if device else None
    rows = s["regions"]["rows"]
    if not known_percent or known_percent < MIN_KNOWN_PERCENT:  # a bound of mostly "taken as needed" is the
        for r in rows:                                           # measured time again: not a bound at all
            r.pop("bound_ms", None)
        return {"ms": None, "measured_ms": s["step_ms"], "gemm_tflops_per_s": None, "known_percent": known_percent}
    return {"ms": _r(sum(r.get("bound_ms") or 0.0 for r in rows)), "measured_ms": s["step_ms"],
            "gemm_tflops_per_s": _r(rate / 1e12) if rate else None, "known_percent": known_percent}


def _summarize_cpu(ix, meta):
    starts, opt_starts = [s[0] for s in ix.steps], [w[0] for w in ix.optimizer]
    n = len(ix.steps)
    cats, rows, counts, names = dict.fromkeys(CATEGORIES, 0.0), {}, [0] * n, [Counter() for _ in range(n)]
    tops, placed = [[] for _ in range(n)], []
    for e, self_us, top in self_times(ix.cpu_ops):
        k = find(ix.steps, starts, e["ts"])
        if k is None:
            continue
        cat = classify_cpu_op(str(e.get("name", "")), find(ix.optimizer, opt_starts, e["ts"]) is not None)
        cats[cat] += self_us
        placed.append((e, self_us, cat))
        row = rows.setdefault((str(e.get("name", "")), cat), [0.0, 0])
        row[0] += self_us
        row[1] += 1
        counts[k] += 1
        names[k][str(e.get("name", ""))] += 1
        if top:
            tops[k].append((e["ts"], e["ts"] + e["dur"]))
    each = [(end - start) / 1e3 for start, end, _ in ix.steps]
    step_ms = sum(each) / n
    busy = sum(union_length(t) for t in tops) / n / 1e3
    ops_ms = sum(cats.values()) / n / 1e3
    cats = {k: v / n / 1e3 for k, v in cats.items()}
    cats["outside ops"], cats["overlap"] = step_ms - busy, busy - ops_ms
    s = _header("cpu", meta, n, step_ms, each)
    s.update(idle_ms=_r(cats["outside ops"]),
             idle_percent=_r(100 * cats["outside ops"] / step_ms if step_ms else 0.0),
             device_ms=None, categories=_categories(cats), other_kernels=[],
             kernels=_kernel_rows(rows, n, step_ms, readable=False), kernels_total=len(rows),
             not_counted={}, regions=regions.cpu_table(ix, placed, meta, {"step_ms": step_ms, "categories": cats}),
             lines=lines.cpu_table(ix, placed, meta, step_ms))
    s["checks"] = [_check_counts(counts, "CPU ops", names), _check_step_time(step_ms, meta, round(sum(counts) / n))]
    s.update(findings.diagnose_cpu(ix, placed, s, meta))
    return s


# ---------------------------------------------------------------------------------------------------------
# Header, checks, entry points
# ---------------------------------------------------------------------------------------------------------

def _r(x):
    return None if x is None else round(float(x), 4)


def _ms_text(ms):
    """Milliseconds for a note: microseconds where the milliseconds would round to zero."""
    return f"{ms:,.3f} ms" if ms >= 1e-3 or not ms else f"{ms * 1e3:.3g} us"


def _categories(cats):
    """The budget's parts, rounded; `communication` and `convolution` only where there is some (a single-process
    run has no collectives, a model without convolutions none of theirs)."""
    return {k: _r(v) for k, v in cats.items() if k not in ("communication", "convolution") or v}


def _metadata(trace):
    meta = trace.get(META_KEY)
    meta = dict(meta) if isinstance(meta, dict) else {}
    props = trace.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        meta.setdefault("device", props[0].get("name"))
        meta.setdefault("compute_major", props[0].get("computeMajor"))  # below 8: no bf16 tensor cores
        meta.setdefault("sms", props[0].get("numSms"))  # SMs (AMD: compute units): the blocks a grid needs to fill it
    return meta


def _header(kind, meta, n, step_ms, each):
    tokens, samples = meta.get("tokens_per_step"), meta.get("samples_per_step")
    mfu = meta.get("mfu_percent")
    flops, peak = meta.get("flops_per_step"), meta.get("peak_flops")
    if mfu is None and num(flops) and num(peak) and peak > 0 and step_ms > 0:
        mfu = 100 * flops / (step_ms / 1e3) / peak
    memory = _peak_memory(kind, meta)
    return {
        "version": VERSION, "kind": kind, "device": meta.get("device") or ("CPU" if kind == "cpu" else None),
        "torch": meta.get("torch"), "commit": meta.get("commit"), "tokens_per_step": tokens,
        "tokens_per_second": _r(tokens / (step_ms / 1e3)) if num(tokens) and step_ms > 0 else None,
        "samples_per_step": samples if num(samples) else None,
        "samples_per_s": _r(samples / (step_ms / 1e3)) if num(samples) and step_ms > 0 else None,
        "mfu_percent": _r(mfu) if num(mfu) else None, **memory, "gpu_memory": _gpu_memory(meta),
        "unprofiled_step_ms": meta.get("unprofiled_step_ms"),
        "unprofiled_steps": len(meta.get("timed_step_ms_each") or ()) or None,  # the timed steps behind it
        "device_state": meta.get("device_state"), "settings": settings.summary(meta.get("settings")),
        "steps": n, "step_ms": _r(step_ms), "step_ms_each": [_r(x) for x in each],
    }


def _peak_memory(kind, meta):
    """The header's memory figures, each only from a source that measures what it names: the peak from the
    allocator's statistics (max_memory_allocated), None where they read 0 (never 0 MB for a run that launched
    kernels); NVML's device-wide use at the profiled steps' edges is a sample between steps, never a peak, and
    is named as such. `caching_allocator` False where PYTORCH_NO_CUDA_MEMORY_CACHING turned it off (the
    settings record), which is why the statistics read 0."""
    peak = meta.get("peak_memory_mb")
    out = {"peak_memory_mb": peak if num(peak) and peak > 0 else None, "peak_memory_source": None,
           "memory_in_use_mb": None, "caching_allocator": None}
    if out["peak_memory_mb"]:
        out["peak_memory_source"] = "allocator"
    if kind != "cuda":
        return out
    env = settings.value(meta.get("settings"), "env." + allocator.NO_CACHING)
    out["caching_allocator"] = not allocator.uncached(env) if meta.get("settings") else None
    if not out["peak_memory_mb"]:
        out["memory_in_use_mb"] = device_state.memory_mb(meta.get("device_state"))
    return out


def _gpu_memory(meta):
    """The memory step's record (profiling/profile/trace/allocator.py) with `fits` where the micro-batch is known;
    None when the trace has none."""
    record = meta.get("gpu_memory")
    if not isinstance(record, dict):
        return None
    if "missing" in record:
        return dict(record)
    batch, per_step = meta.get("micro_batch"), meta.get("micro_batches")
    sequences = batch * per_step if num(batch) and num(per_step) else None  # this rank's, per step
    fits = gpu_memory.fits(record, batch, sequences)  # recommended: a micro-batch train.py accepts
    if fits and num(meta.get("depth")):  # train.py: the depth (it widens with it)
        fits["max_depth"] = gpu_memory.max_depth(record, batch, meta["depth"], *TRAIN_PY_DEPTH_POWERS)
    return dict(record, micro_batch=batch, fits=fits)


def _check(name, ok, detail):
    return {"name": name, "ok": bool(ok), "detail": detail}


def _check_counts(counts, what, names=None):
    """The same number of events in every profiled step. On the CPU (`names`: each step's operator names
    counted) a minority of steps with up to PERIODIC_OPS more or fewer operators is a periodic step (logging
    every n steps, a metric): said with the operators only they ran, not a failure; so is work added to the same
    step, or the loop's own work growing step by step (`_added_work`)."""
    if len(set(counts)) <= 1:
        return _check(f"{what} per step", True, f"{counts[0] if counts else 0} in each of {len(counts)} steps")
    failed = _check(f"{what} per step", False, "differ across steps: " + ", ".join(map(str, counts)))
    if names is None:
        return failed
    usual = min(Counter(counts).items(), key=lambda kv: (-kv[1], kv[0]))[0]  # ties: the smaller count
    odd = [k for k, c in enumerate(counts) if c != usual]
    if len(odd) > len(counts) // 2 or any(abs(counts[k] - usual) > PERIODIC_OPS for k in odd):
        added = None if any(n is None for n in names) else _added_work(counts, names, usual, odd)
        return _check(f"{what} per step", True, added) if added else failed
    base = names[counts.index(usual)]
    parts = []
    for k in odd:
        extra = (names[k] - base) or (base - names[k])
        ops = ", ".join(f"`{name}` x{c}" for name, c in extra.most_common(3))
        parts.append(f"step {k + 1}: {counts[k]} ({counts[k] - usual:+d}" + (f": {ops}" if ops else "") + ")")
    return _check(f"{what} per step", True, f"{usual} in {len(counts) - len(odd)} of {len(counts)} steps; "
                  + "; ".join(parts) + f": a periodic step (logging, a metric), within {PERIODIC_OPS} operators")


def _ops(counter):
    return ", ".join(f"`{name}` x{c}" for name, c in counter.most_common(3))


def _added_work(counts, names, usual, odd):
    """Steps that differ only by work added to the same step, in words; None when they differ otherwise. A
    minority of steps that ran every operator of the usual one and more: a checkpoint save or a log added to it
    (the Hugging Face Trainer's save at step 10: 2,006 against 1,920, `aten::detach` x29 more). Or counts that
    grow (shrink) step by step, each step's operators all in the next's (the previous's): the loop's own work
    growing, as L-BFGS's two-loop recursion over its growing history (5,101, 5,501, ... 6,701: `aten::dot`
    +50 a step). The same loop without the profiler runs the same operators: no fault of the profile."""
    base = names[counts.index(usual)]
    if odd and len(odd) <= len(counts) // 2 and all(not base - names[k] for k in odd):
        parts = [f"step {k + 1}: {counts[k]} ({counts[k] - usual:+d}: {_ops(names[k] - base)})" for k in odd]
        return (f"{usual} in {len(counts) - len(odd)} of {len(counts)} steps; " + "; ".join(parts) + ": every "
                "operator of the others and these more: work added to that step (a checkpoint save, a log)")
    pairs = list(zip(names, names[1:]))
    for sign, word in ((1, "grew"), (-1, "shrank")):
        if all(sign * (b - a) > 0 for a, b in zip(counts, counts[1:])) and \
                all(not (a - b if sign > 0 else b - a) for a, b in pairs):
            first, last = (names[0], names[-1]) if sign > 0 else (names[-1], names[0])
            return (f"{word} step by step: {', '.join(map(str, counts))}, each step's operators all in the "
                    f"{'next' if sign > 0 else 'previous'} one's ({_ops(last - first)} more over the window): the "
                    "loop's own work changing (an optimizer's growing history, L-BFGS's), not a step unlike the others")
    return None


def _check_step_time(step_ms, meta, cpu_ops=None):
    """Profiled against unprofiled step time. On the CPU (`cpu_ops`: operators per step) the limit is the timed
    steps' own spread where the trace records them (`_check_cpu_spread`), else an excess the profiler's fixed
    cost per operator accounts for is `explained`: that check cannot hold there."""
    ref = meta.get("unprofiled_step_ms")
    name = "profiled vs unprofiled step time"
    if not num(ref) or ref <= 0:
        return _check(name, True, f"not measured (no {META_KEY}.unprofiled_step_ms in the trace; give your own "
                      "with --unprofiled-ms)")
    change = step_ms / ref - 1
    timed = [x for x in meta.get("timed_step_ms_each") or () if num(x) and x > 0]
    if (cpu_ops is not None or meta.get("steps_vary")) and len(timed) >= 2:
        sampler = _sampler_ms(meta) if cpu_ops is not None else 0.0
        return _with_load(_check_cpu_spread(name, step_ms, ref, timed, cpu_ops or 0, sampler,
                                            keep_all=bool(meta.get("steps_vary"))), meta)
    c = _check(name, abs(change) <= STEP_TOLERANCE, f"{step_ms:.2f} ms profiled vs {ref:.2f} ms "
               f"unprofiled ({100 * change:+.1f}%, limit ±{100 * STEP_TOLERANCE:.0f}%)")
    excess = step_ms - ref
    if not c["ok"] and cpu_ops and 0 < excess <= cpu_ops * CPU_US_PER_OP / 1e3:
        c["explained"] = (f"{cpu_ops:,} operators/step x {1e3 * excess / cpu_ops:.1f} us = the {excess:.2f} ms "
                          f"excess, within the CPU profiler's fixed cost per operator (~{CPU_US_PER_OP:g} us "
                          "measured): on the CPU this check cannot hold")
    return _with_load(c, meta)


def _with_load(c, meta):
    """The check with the host's load as the window opened (a CPU capture records it), for a failure's advice."""
    threads = meta.get("cpu_threads") or {}
    if not c["ok"] and num(threads.get("load_average")) and threads.get("cores"):
        c["load"] = {"load_average": threads["load_average"], "cores": threads["cores"]}
    return c


def _sampler_ms(meta):
    """The ms per profiled step the host sampler cost the main thread: its own time over the steps it sampled,
    x SAMPLER_MAIN_PAYS; 0 where the trace has no samples."""
    h = meta.get("host_samples") or {}
    steps = {x[0] for x in h.get("samples") or () if isinstance(x, list) and x}
    own = h.get("own_ms")
    return SAMPLER_MAIN_PAYS * own / len(steps) if num(own) and own > 0 and steps else 0.0


def _check_cpu_spread(name, step_ms, ref, timed, cpu_ops, sampler_ms=0.0, keep_all=False):
    """The CPU's step-time check: a CPU step drifts with the machine's load (a shared 2-core host: the same
    loop's timed steps 41-576 ms, tests/data/cpu-hf-gpt2-logging), so the profiled step is held to the range
    of the timed (unprofiled) steps, outliers left out as the unprofiled step leaves them (irregular.left_out),
    STEP_TOLERANCE either side, plus the profiler's fixed cost per operator and the host sampler's measured
    cost (`sampler_ms`) above it.
    `timed_ms`: that range, for the changes' noise floor.
    keep_all: steps whose sizes change by design (any device): every timed step is in the range."""
    out, _ = ([], None) if keep_all else irregular.left_out(timed)
    kept = [ms for i, ms in enumerate(timed) if i not in out]
    low, high = min(kept), max(kept)
    cost = cpu_ops * CPU_US_PER_OP / 1e3 + sampler_ms
    floor, ceiling = low * (1 - STEP_TOLERANCE), high * (1 + STEP_TOLERANCE) + cost
    ok = floor <= step_ms <= ceiling
    sampler = f" and the host sampler's {sampler_ms:.2f} ms/step" if sampler_ms else ""
    detail = (f"{step_ms:.2f} ms profiled vs {ref:.2f} ms unprofiled ({100 * (step_ms / ref - 1):+.1f}%); the "
              f"{len(kept)} timed steps themselves took {low:.2f}-{high:.2f} ms, so the limit is {floor:.2f}-"
              f"{ceiling:.2f} ms (their range ±{100 * STEP_TOLERANCE:.0f}%"
              + (f", plus the CPU profiler's ~{CPU_US_PER_OP:g} us x {cpu_ops:,} operators/step{sampler} above it)"
                 if cpu_ops else "; the steps' sizes change, so their range, not their mean, is the reference)"))
    if not ok:
        detail += ("; the profiled steps ran outside what the unprofiled ones vary by: the profiler or the "
                   "machine's load changed the step (profile when the machine is otherwise idle)")
    c = dict(_check(name, ok, detail), timed_ms=[_r(low), _r(high)])
    if step_ms < floor:  # the profiler only adds time: a faster profiled step is the machine's or the loop's
        c["explained"] = (f"the profiled steps ran faster than every timed step ({step_ms:.2f} ms against "
                          f"{low:.2f}-{high:.2f} ms): the profiler only adds time, so the machine's load or the "
                          "loop itself changed between them, not the profile: the figures below are the profiled "
                          "steps' own; profile again on an otherwise idle machine to compare them with the loop's")
    return c


def _check_bogus(bogus):
    if not bogus:
        return _check("bogus timestamps", True, "none")
    e, reason = bogus[0]
    return _check("bogus timestamps", False, f"{len(bogus)} device events ignored, e.g. "
                  f"{str(e.get('name', ''))[:60]!r}: {reason} (pytorch/pytorch#192021)")


def _check_unlaunched(out):
    skipped = f"not counted: {out['before']} launched before the profiled steps"
    if out["outside"]:
        skipped += f", {out['outside']} launched outside every ProfilerStep window"
    if out.get("one_off"):
        skipped += f", {out['one_off']} in one-off steps (reported once, on their own line)"
    if not out["unlaunched"]:
        return _check("device events without a launch", True, f"none; {skipped}")
    example = str(out["unlaunched"][0].get("name", ""))[:60]
    return _check("device events without a launch", False,
                  f"{len(out['unlaunched'])} (launch records dropped), e.g. {example!r}; {skipped}")


def _check_launches(ix, seen):
    starts = [s[0] for s in ix.steps]
    missing = [e for c, e in ix.launches.items() if c not in seen
               and any(w in str(e.get("name", "")).lower() for w in LAUNCH_WORDS)
               and find(ix.steps, starts, e["ts"]) is not None]
    if not missing:
        return _check("launches without a device event", True, "none")
    return _check("launches without a device event", False, f"{len(missing)} device records dropped, e.g. "
                  f"{missing[0].get('name')} at correlation {corr(missing[0])}")


def _check_coverage(cats, other_names):
    device = sum(cats[c] for c in CATEGORIES)
    share = cats["other"] / device if device else 0.0
    detail = f"{100 * (1 - share):.1f}% of device time in named categories"
    if other_names:
        detail += "; other: " + ", ".join(other_names[:5]) + (" ..." if len(other_names) > 5 else "")
    return _check("categories cover device time", share <= OTHER_LIMIT, detail)


def summarize(trace, top=None, unprofiled_ms=None):
    """The per-step summary of a torch.profiler trace (plain data; see the module docstring).

    `top` keeps only the first `top` kernel rows (`kernels_total` still counts all of them). `unprofiled_ms`:
    the user's own unprofiled ms/step (`research profile --unprofiled-ms`), in place of the trace's.
    """
    check_events(trace)
    ix = index(trace["traceEvents"])
    check_content(bool(ix.device or ix.cpu_ops))
    meta = _metadata(trace)
    _joined_per_step(ix, meta)
    *attributed, meta = irregular.split(ix, meta)  # the like steps only, from here on: the one-offs go
    merged, ix.optimizer = ix.optimizer, closures.own_windows(ix.optimizer_marks, ix.cpu_ops)
    given = unprofiled_ms is not None
    if given:
        meta["unprofiled_step_ms"] = unprofiled_ms
    elif meta.get("steps_vary"):  # sizes that change by design: every timed step is the loop's, none an outlier
        timed = [x for x in meta.get("timed_step_ms_each") or () if num(x) and x > 0]
        if timed:
            meta["unprofiled_step_ms"] = sum(timed) / len(timed)
    how = recorded(trace, ix, given, meta.get("operators"))
    if not ix.device:  # a device that ran the operators without its events recorded: no CPU rule applies
        meta["device_unrecorded"] = device_work.unrecorded(trace)
        meta["gpu_unused"] = None if meta["device_unrecorded"] else device_work.beside_gpu(trace)
    s = _summarize_device(ix, meta, how, *attributed) if ix.device else _summarize_cpu(ix, meta)
    s["recorded"] = how
    s["window"] = WHOLE_TRACE if ix.whole else "steps"
    s["notes"] = [f"the trace has no ProfilerStep markers: it is read as one window of {_ms_text(s['step_ms'])}"
                  ] if ix.whole else []
    s["notes"] += _window_notes(ix)
    if ix.startup:
        s["startup"] = ix.startup
    if ix.iterations:
        s["iterations"] = ix.iterations
    s["one_off"] = ix.one_off + s.get("one_off", [])  # the steps left out, then waits a rule said once (findings)
    if ix.optimizer != merged:
        s["regions"]["notes"].append(closures.NOTE)
    s["notes"] += irregular.notes(meta)  # timed steps left out, a loop that ended early
    s["notes"] += [n for n in (irregular.few_note(ix),) if n]
    if not ix.whole:
        s["checks"].append(irregular.profiled_check(s["step_ms_each"], ix, meta))
    if top is not None:
        s["kernels"] = s["kernels"][:max(0, top)]
    return s


def _window_notes(ix):
    """What the window is: the start-up left out of one window, the iterations read from what repeats, the one
    call whose inner loop repeats."""
    notes = []
    if ix.startup:
        spent = ix.startup.get("compile_ms")
        calls = [f"{name} ({_ms_text(ms)})" for name, ms in ix.startup["calls"].items()]
        calls += [f"compilation ({_ms_text(spent)})"] if spent else []
        notes.append(f"the run's start-up is left out: the window begins {_ms_text(ix.startup['ms'])} into the "
                     "trace, after " + ", ".join(calls) + " (CUDA's initialisation, a module's first load, "
                     "compiling: no step pays them)")
    it = ix.iterations
    if it and it.get("one_call"):
        notes.append(f"the trace has no ProfilerStep markers: it is one call, `{it['one_call']}`, read as one step; "
                     f"its inner loop repeats {it['by']} (`{it['marker']}`) {it['inner']} times")
    elif it:
        notes.append(f"the trace has no ProfilerStep markers: its steps are {it['count']} iterations of its loop, "
                     f"from what repeats ({it['by']}, `{it['marker']}`)")
    return notes


def _change(before, now):
    before, now = before or 0.0, now or 0.0
    return {"previous": _r(before), "current": _r(now), "change_ms": _r(now - before),
            "change_pct": _r(100 * (now - before) / before) if before else None}


def memory_change(previous, current):
    """GPU memory at the peak, before and now, by category (the memory steps' records), largest change first;
    None unless both profiles have one."""
    before, now = (x.get("gpu_memory") or {} for x in (previous, current))
    if not before.get("categories") or not now.get("categories"):
        return None
    names = list(dict.fromkeys(list(before["categories"]) + list(now["categories"])))
    cats = [dict(name=c, previous=before["categories"].get(c) or 0.0, current=now["categories"].get(c) or 0.0)
            for c in names]
    for c in cats:
        c["change_mb"] = round(c["current"] - c["previous"], 1)
    return {"peak_allocated_mb": {"previous": before.get("peak_allocated_mb"), "current": now.get("peak_allocated_mb")},
            "categories": sorted(cats, key=lambda c: -abs(c["change_mb"]))}


def noise_ms(previous, current):
    """The noise floor of a change between two CPU profiles, ms/step: half the widest range among each profile's
    profiled steps and its timed (unprofiled) steps (the step-time check's `timed_ms`); a CPU step drifts with the
    machine's load (one loop's timed steps 41-576 ms on a shared 2-core host), a GPU's does not. None unless
    both are CPU profiles."""
    if previous.get("kind") != "cpu" or current.get("kind") != "cpu":
        return None
    ranges = []
    for s in (previous, current):
        each = [x for x in s.get("step_ms_each") or () if isinstance(x, (int, float))]
        ranges += [(min(each), max(each))] if len(each) > 1 else []
        ranges += [tuple(c["timed_ms"]) for c in s.get("checks") or () if c.get("timed_ms")]
    return max(((high - low) / 2 for low, high in ranges), default=0.0)


def diff(previous, current, top=5):
    """What changed between two summaries: step time, and the categories, regions and kernels that moved most.

    Kernels are matched by category and name modulo the compile's numbering, never by their display name;
    kernels that share a key are compared as one group (profiling/profile/report/kernel_match.py). Plain data.
    """
    notes = []
    for key in ("kind", "device"):
        if previous.get(key) != current.get(key):
            notes.append(f"{key} differs: {previous.get(key)} -> {current.get(key)}; not comparable")
    if previous.get("kernels_total", 0) > len(previous.get("kernels", [])):
        notes.append("previous summary lists only its top kernels; others show as new")
    names = list(dict.fromkeys(list(previous.get("categories", {})) + list(current.get("categories", {}))))
    cats = [dict(name=c, **_change(previous["categories"].get(c), current["categories"].get(c)))
            for c in names]
    kernels = [dict(k, **_change(k["previous"], k["current"]))
               for k in kernel_match.match(previous.get("kernels", []), current.get("kernels", []))]
    renamed = sum(k["match"] == "renamed" for k in kernels)
    if renamed:
        notes.append(f"{renamed} kernel{'s' * (renamed > 1)} renamed by the recompile (another number, view "
                     "or cast), matched by op list (profiling/profile/report/kernel_match.py)")
    before, now = regions.by_region(previous), regions.by_region(current)
    moved = [dict(name=r, **_change(before.get(r), now.get(r))) for r in now if before]

    def by_size(row):
        return -abs(row["change_ms"])

    return {
        "previous_commit": previous.get("commit"), "current_commit": current.get("commit"),
        "step_ms": _change(previous.get("step_ms"), current.get("step_ms")),
        "gpu_memory": memory_change(previous, current),
        "categories": sorted(cats, key=by_size),
        "kernels": sorted(kernels, key=by_size)[:top],
        "regions": sorted(moved, key=by_size),
        "notes": notes,
    }
