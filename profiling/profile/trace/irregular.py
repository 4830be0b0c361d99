"""Steps unlike the others, and a loop that ended early: what the report must say so its figures are read right.

A checkpoint save, an eval or a logging burst in one of the timed (unprofiled) steps moved the step time the
report checks against from 65 to 119 ms in one run; inside the profiled steps one moved the profiled mean from
90 to 135 ms (issue #41). The rule for an outlier: a step over OUTLIER_RATIO times the median of its steps and
at least OUTLIER_MIN_MS over it, judged among MIN_STEPS steps or more (the median of five steps stays put when
one or two are outliers). Among the profiled steps, a step over NAMED_RATIO (1.3x) the others' median goes too
when what ran only in it names a save, an eval or a log and that work took WORK_SHARE of its extra time
(trace/only_in_step.py; HF's log-and-save step ran 1.45-1.77x on a loaded CPU), or when it ran every operator
of the other like steps and ADDED_MIN_OPS more (work added: a save that held the GIL, which no host sample saw;
`_added`); a step merely noisy names nothing, or its named work explains little of it, runs the same operators
as the others, and stays. Timed outliers are left out of `unprofiled_step_ms` (the Profiler, profiling/api.py,
times them).

Among the profiled steps (`split`, where the summary makes its steps, so every table and finding sees the same
ones), what does not repeat is left out of every per-step figure and reported once, with its duration and kind
(DESIGN.md pitfall 20; issue #48 item 2, #49 item 1): a step that compiles (Dynamo's and Inductor's annotations
inside it), an outlier (an eval, a checkpoint save, a log flush: named by what ran only in it), the first
iteration of a trace without step markers when it is unlike the rest (the run's start-up: a cold first pass),
and compilation outside every step. Where nothing that ran only in a one-off step on the host names it (a
device-only capture records no operator of it; the host samples may miss it), its device work does
(`device_kinds`): an eval's forwards without backward, a cold first call's thousands of extra runtime calls at a
new input size (issue #57 item 2). An eval of 100 batches after one profiled step once made a report of 100.8
ms/step against a median of 26.1, its GEMMs 70.8% of the step; a 1.69 s compile inside a window became a
host_sync of 1,436 ms/step. The check on the profiled steps also compares what they ran (`unlike`): their input
shapes, from each step's own records, and their kernel sets; steps that differ are said `not alike`, each shape
with its steps and their times, never "ok" (issue #56 item 3). Stdlib only.
"""
import math
import statistics
from collections import Counter

from profiling.profile.trace import cold, iterations, only_in_step, traceio

OUTLIER_RATIO = 2.0   # over the median: the saves of issue #41 were 3.5x and 5x; a loaded 2-core host
                      # jitters single CPU steps by 1.5x, so 2x is clearly another kind of step
OUTLIER_MIN_MS = 1.0  # and this much over it: a sub-ms CPU step's scheduler hiccup is no checkpoint save
MIN_STEPS = 3         # fewer steps have no median to speak of
SHOWN = 3             # operators or frames named in the check
CHECK = "profiled steps alike"


def outliers(each):
    """Indices (0-based) of the outlier steps among `each` (ms), and the median; ([], median) when none."""
    if len(each) < MIN_STEPS:
        return [], None
    median = statistics.median(each)
    return [i for i, ms in enumerate(each) if _over(ms, median)], median


def _over(ms, median):
    """Whether a step of `ms` is another kind of step than those of `median`."""
    return ms > OUTLIER_RATIO * median and ms - median >= OUTLIER_MIN_MS


RISE_RATIO = 1.25   # the later timed steps' median over the earlier ones': still warming (timing noise: ~10%)
RISE_MIN_MS = 1.0   # and this much apart, so sub-ms CPU steps' jitter is no trend


def rising(each):
    """Whether step times still rise through `each` (ms): the median of its last half over RISE_RATIO x that of
    its first half (a DataLoader's prefetched batches running out; the queue drained, the steady state is
    slower)."""
    if len(each) < 4:
        return False
    half = len(each) // 2
    first, last = sorted(each[:half])[(half - 1) // 2], sorted(each[-half:])[(half - 1) // 2]
    return last > RISE_RATIO * first and last - first > RISE_MIN_MS


PERIODIC_SHARE = 1 / 3   # slow steps this common are the loop's own pattern, not one-offs: a DataLoader's 2
                         # workers on an H100 ResNet-18 gave steps of 211, 44, 214, 32, 208, 30, ... ms


def left_out(each):
    """(the indices of the timed steps `timed` leaves out, their median): the outliers; where slow steps are
    PERIODIC_SHARE of the timed ones or more (the loop's pattern, kept), those of them over OUTLIER_RATIO x the
    other slow steps' median. A checkpoint save of 775 ms among a loaded host's 0.3-13 ms steps of a 1 ms loop
    (three slow of seven) was kept as a pattern once, and the unprofiled step read 113 ms."""
    out, median = outliers(each)
    if len(out) >= 2 and len(out) >= PERIODIC_SHARE * len(each):
        out = [i for i in out if _over(each[i], statistics.median(each[j] for j in out if j != i))]
    return out, median


def timed(each):
    """(the mean ms of the timed steps, those `left_out` names left out, [{"step": 1-based, "ms", "median_ms"}]
    of those): slow steps PERIODIC_SHARE of the timed ones or more are the loop's pattern and stay in the mean."""
    out, median = left_out(each)
    kept = [ms for i, ms in enumerate(each) if i not in out]
    rows = [{"step": i + 1, "ms": round(each[i], 3), "median_ms": round(median, 3)} for i in out]
    return sum(kept) / len(kept), rows


# The Profiler times the steps after the window too, until the mean of the timed steps is known within MEAN_ERROR
# of it (its standard error): a loop of 32 to 512 tokens a step (issue #56) timed steps of 30 to 150 ms, whose
# five-step means missed the loop's by up to a fifth. Where the steps after ran at another pace than those before
# (`drifted`), the timing goes on too: no side alone is the loop's pace (on a shared 2-core host, five steps of a 9
# ms loop timed at 13.3 ms before the window, 8.4 after it, and the loop's 400 around them 11.3; taking the side
# after alone missed the loop's mean by 26% there, by 29% and 32% in two more of nine processes)
MEAN_ERROR = 0.03
DRIFT = 0.1   # the steps after the window this far from those before, and beyond their own noise: the pace changed


def mean_error(each):
    """The standard error of the timed steps' mean over that mean, the outliers `timed` leaves out left out; 0.0
    for fewer than MIN_STEPS."""
    out, _ = left_out(each)
    kept = [ms for i, ms in enumerate(each) if i not in out]
    if len(kept) < MIN_STEPS or sum(kept) <= 0:
        return 0.0
    return statistics.stdev(kept) / len(kept) ** 0.5 / statistics.fmean(kept)


def drifted(before, after):
    """Whether the steps timed after the window ran at another pace than those before it: their means (outliers
    left out) DRIFT apart or more, and more than four standard errors of their difference, both sides' taken
    from the spread of the steps after (the larger sample: five random lengths before the window are no measure
    of their own spread); never for fewer than MIN_STEPS on either side."""
    if len(before) < MIN_STEPS or len(after) < MIN_STEPS:
        return False
    a, b = timed(before)[0], timed(after)[0]
    spread = mean_error(after) * len(after) ** 0.5  # the steps' standard deviation over their mean
    se = ((spread * a) ** 2 / len(before) + (spread * b) ** 2 / len(after)) ** 0.5
    return abs(b - a) > max(DRIFT * (a + b) / 2, 4 * se)  # 3: five of 32-512 tokens read as a change (3.15)


def notes(meta):
    """The header's notes: timed steps left out, the steps timed after the window where more than a round ran
    or the pace changed, a loop that ended before the profile was done."""
    out = []
    rows = [r for r in meta.get("timed_outliers") or () if isinstance(r, dict) and not meta.get("steps_vary")]
    each = meta.get("timed_step_ms_each") or ()
    for r in rows:
        out.append(f"timed step {r.get('step')} of {len(each) or '?'} took {r.get('ms'):.1f} ms against a median "
                   f"of {r.get('median_ms'):.1f} ms (a checkpoint save, an eval, a logging burst?): left out of "
                   "the unprofiled step time")
    after = meta.get("timed_after")
    if isinstance(after, dict) and isinstance(after.get("after"), int) and after.get("before_ms") and (
            after.get("more", after["after"] > after.get("before", 0)) or after.get("drifted")
            or after.get("left_out") or (after.get("error") or 0) > MEAN_ERROR):
        before, n, gone = after.get("before"), after["after"], after.get("left_out") or 0
        a, b = after["before_ms"], after.get("after_ms")
        drift = after.get("drifted") and b
        why = (f": the pace changed between them ({a:.1f} ms/step before, {b:.1f} after: the steps before still "
               "warming up, or the machine's load), timed on" if drift else
               ", as their spread asked (inputs whose size changes between steps, a noisy host)"
               if after.get("more", n > before) else "")
        out.append(f"unprofiled step: {before} steps timed before the window and {n} after it{why}"
                   + (f" ({gone} left out before them: they ran on batches a DataLoader's workers had prefetched "
                      "while the trace was written)" if gone else "")
                   + f"; the mean of all {before + n}"
                   + f", known within ±{100 * (after.get('error') or 0):.0f}% (its standard error)")
    settling = [r for r in meta.get("settling") or () if isinstance(r, list) and r]
    if settling:
        out.append(f"the step time still rose through the first {len(settling)} round(s) of timed steps ("
                   + "; ".join(", ".join(f"{x:.1f}" for x in r) + " ms" for r in settling)
                   + "): taken as warm-up (a DataLoader's prefetched batches running out, a cache warming), the "
                   "unprofiled step timed after them")
    extra = meta.get("window_settle_steps")
    if isinstance(extra, int) and extra > 0:
        out.append(f"the profiled steps began {extra} step(s) late: the steps after the pause that opened the window "
                   "ran under 70% of the unprofiled step (batches a DataLoader's workers prefetched meanwhile, or a "
                   "host running ahead of the emptied GPU queue), so they were left unrecorded until the step time "
                   "came back")
    out += [n for key in ("notes_loader_waits", "notes_same_work", "notes_named_kept") for n in meta.get(key) or ()
            if isinstance(n, str)]
    ended = meta.get("ended_early")
    if isinstance(ended, dict):
        missing = ", ".join(ended.get("missing") or ()) or "nothing else"
        out.append(f"the loop ended after {ended.get('active_steps')} of {ended.get('of')} profiled steps "
                   f"({ended.get('how')}); missing: {missing}")
    return out


def profiled_check(each, ix, meta=None):
    """The check on the profiled steps, after `split`: `_times_check`'s, and where their input shapes or kernel
    sets differ (`unlike`) or their sizes change by design (`steps_vary`), not ok with the result NOT_ALIKE, said
    first: the loop's own steps, no fault of the profile's (a note at the report's top, never "ok")."""
    c = _times_check(each, ix, meta)
    found = getattr(ix, "unlike", None)
    if found:  # their times' spread in place of "none over 2x the median", which read as alike
        times = (f"the like steps took {_ms(min(each))} to {_ms(max(each))} ({max(each) / min(each):.1f}x)"
                 if not c.get("outliers") and not c.get("varies") and min(each, default=0) > 0 else c["detail"])
        c = dict(c, unlike=found, detail=f"{found['text']}; {times}")
    if found or c.get("varies"):
        c.update(ok=False, result=NOT_ALIKE)
    return c


def _times_check(each, ix, meta=None):
    """The check on the profiled steps' times: the one-off steps `split` left out (each named with its kind and
    what ran only in it); steps that ran the same operators at sizes that change (`steps_vary`); else whether the
    like steps are alike."""
    steps = [r for r in ix.one_off if r.get("step")]
    if steps:  # ok: the profile itself is sound (a failed check opens the report as a fault of the profiler's);
        return {"name": CHECK, "ok": True, "outliers": len(steps),  # the one-off is the run's, on a line of its own
                "detail": "; ".join(r["text"] for r in steps)}
    vary = (meta or {}).get("steps_vary")
    if isinstance(vary, dict) and vary.get("low_ms"):
        return {"name": CHECK, "ok": True, "varies": True,
                "detail": f"not alike by design: the steps ran the same operators in {_ms(vary['low_ms'])} to "
                          f"{_ms(vary['high_ms'])} ({vary['high_ms'] / vary['low_ms']:.1f}x): inputs whose size "
                          "changes between steps; every per-step figure is their mean, and a price per step is "
                          "that of a mean step"}
    out, median = outliers(each)
    if median is None:
        return {"name": CHECK, "ok": True,
                "detail": f"{len(each)} step{'s' * (len(each) != 1)}: too few to judge"}
    if out:
        return {"name": CHECK, "ok": True, "detail": f"{len(out)} of {len(each)} steps over {OUTLIER_RATIO:g}x the "
                f"median ({median:.2f} ms), kept: too many of them to leave out"}
    return {"name": CHECK, "ok": True, "detail": f"none over {OUTLIER_RATIO:g}x the median ({median:.2f} ms) of "
            f"{len(each)} steps"}


# ---------------------------------------------------------------------------------------------------------
# One-off steps and spans: left out of every per-step figure, reported once (issue #48 item 2, #49 item 1)
# ---------------------------------------------------------------------------------------------------------

COLD, UNNAMED = "cold first pass", "unnamed"  # with only_in_step's COMPILE, SAVE, EVAL, LOG
COLD_CALL = "cold first call"  # a step in the window whose host did first-time work (`device_kinds`)
COMPILE = only_in_step.COMPILE
WIDEN = ("profile more steps: profiling.Profiler(active_steps=N) or torch.profiler.schedule(active=N), N of 5 or "
         "more, or a window that starts after the run's first steps")


def one_offs(each, work, compile_ms, host=None):
    """{index: why} of the steps that do not repeat: a step that compiles ("compile"), one over OUTLIER_RATIO
    times the median of the steps with work ("outlier", among MIN_STEPS or more); with `host` (the CPU windows'
    ms of a trace without step markers, whose first iteration holds whatever ran before its loop), the first
    iteration when over OUTLIER_RATIO times the others' median in either measure ("first": the run's start-up,
    on the host before any kernel: 1,022 ms against 24 in param's RTX 2080 Ti loop, its GPU window 27.6).
    {} when every step would go (then none is like the others: they are kept, and the report says so)."""
    why = {k: COMPILE for k, ms in enumerate(compile_ms) if ms > 0}
    judged = [k for k in range(len(each)) if work[k] and k not in why]
    while True:  # again without them: two outliers in four steps lift the median of all four past the second
        out, _ = outliers([each[k] for k in judged])
        if not out:
            break
        why.update({judged[i]: "outlier" for i in out})
        judged = [k for k in judged if k not in why]
    if len(judged) >= MIN_STEPS:  # a step that launched nothing and outlasts the others: a stall of its own (a
        median = statistics.median(each[k] for k in judged)  # compile whose frames a device-only capture did
        why.update({k: "outlier" for k in range(len(each)) if not work[k] and k not in why  # not record)
                    and each[k] > OUTLIER_RATIO * median and each[k] - median >= OUTLIER_MIN_MS})
    if host and judged[:1] == [0] and len(judged) > 1:
        for ms in (each, host):
            median = statistics.median(ms[k] for k in judged[1:])
            if ms[0] > OUTLIER_RATIO * median and ms[0] - median >= OUTLIER_MIN_MS:
                why[0] = "first" if ms is each else "first on the host"
                break
    return {} if len(why) >= len(each) else why


def split(ix, meta):
    """Leaves `ix` with its like steps only and `ix.one_off` with the rest, reported once; returns (per_step,
    windows, attributed, meta): the device events per like step and their windows on the GPU timeline
    (traceio.attribute, step_windows; None on a CPU trace), what attribution left out, and the metadata with the
    host samples renumbered to the like steps. Every table and finding then sees the same like steps."""
    per_step = windows = attributed = cut = None
    if ix.device:
        per_step, attributed = traceio.attribute(ix)
        last = _last_iteration(ix, per_step)
        if last == EMPTY:  # the loop's last `__next__` (StopIteration): no iteration of its own
            ix.steps = ix.steps[:-2] + [(ix.steps[-2][0], ix.steps[-1][1], ix.steps[-2][2])]
        elif last == CUT:  # an iteration the window's end cut: no step, said once below
            cut = (len(per_step[-1]), statistics.median(map(len, per_step[:-1])),
                   sum(e.get("dur", 0.0) for e, _ in per_step[-1]) / 1e3)
            ix.steps = ix.steps[:-1]
        if last:
            ix.iterations = dict(ix.iterations, count=len(ix.steps))
            per_step = per_step[:-1]
        windows = traceio.step_windows(per_step, ix.steps, host=bool(ix.whole or ix.iterations), device=ix.device)
        each, work = [(b - a) / 1e3 for a, b in windows], [bool(evs) for evs in per_step]
    else:
        each = [(b - a) / 1e3 for a, b, _ in ix.steps]
        work = [bool(ops) for ops in only_in_step.by_step(ix.steps, ix.cpu_ops)]
    spans = iterations.compile_spans(ix.compiles)
    # a compile stalls the host in its step's CPU window, and the GPU, once the work queued before it has run,
    # until the first kernel after it: in the GPU window that holds the compile's end (a step's GPU window runs to
    # the next step's first kernel; the host ran 1.7 steps ahead in tests/data/h100-compiled-gpt-5steps)
    inside = [sum(_overlap(spans, (a, b))) / 1e3 for a, b, _ in ix.steps]
    if windows is not None:
        inside = [max(ms, sum(e - s for s, e in spans if a <= e < b) / 1e3) for ms, (a, b) in zip(inside, windows)]
    ix.one_off = _outside_rows(ix, spans)
    if cut:
        n, median, ms = cut
        ix.one_off.append({"kind": CUT, "step": None, "ms": round(ms, 3), "text": (
            f"the window's last iteration, cut by its end ({n} device events against the others' median of "
            f"{median:g}, {ms:.2f} ms of device time: a batch arriving, or the last batch begun): left out of "
            "every per-step figure")})
    ix.cold = cold.first_calls(ix, windows[0], [e for e, _ in per_step[0]]) if ix.whole and windows else None
    if ix.cold:  # one window from a model's first call: its cold start, said once, priced in no finding
        ix.cold["once"] = iterations.ran_once(ix)  # and nothing but that first iteration: no steady pace in it
        ix.one_off.append({"kind": COLD, "step": None, "ms": ix.cold["ms"], "text": cold.text(ix.cold)})
    host = [(b - a) / 1e3 for a, b, _ in ix.steps]
    why = {} if ix.whole or len(ix.steps) < 2 else one_offs(each, work, inside, ix.iterations and host)
    _keep_loader_waits(ix, why, each, windows or [st[:2] for st in ix.steps], meta)
    _keep_same_work(ix, why, each, per_step, meta)
    _keep_host_time(ix, why, each, per_step, windows, meta)
    labels = [] if ix.whole else _named(ix, meta, each, work, why,  # what ran only in each step, when it was read
                                        windows or [st[:2] for st in ix.steps])
    keep = [k for k in range(len(ix.steps)) if k not in why]
    ix.device_named = device_kinds(ix, per_step, why, keep)
    # a new shape's first step: judged (named `first`: `cold` is the module trace/cold.py, read above)
    first = [k for k, (kind, _) in ix.device_named.items() if kind == COLD_CALL]
    ix.unlike = None if ix.whole else unlike(ix, per_step, each, [k for k in sorted(keep + first) if work[k]], meta)
    if not why:
        return per_step, windows, attributed, meta
    labels = labels or only_in_step.per_step(ix, meta)
    for k, reason in sorted(why.items()):
        ms = host if reason == "first on the host" else each  # the measure that found it, for it and the median
        ix.one_off.append(_row(ix, labels, k, reason, ms, statistics.median(ms[i] for i in keep), inside[k],
                               len(keep)))
    gone = [ix.steps[k][:2] for k in why]
    ix.steps = [ix.steps[k] for k in keep]
    _drop_events(ix, gone, per_step, why)
    if per_step is not None:
        attributed["one_off"] = sum(len(per_step[k]) for k in why)
        per_step, windows = [per_step[k] for k in keep], [windows[k] for k in keep]
    return per_step, windows, attributed, _renumbered(meta, keep)


def _last_iteration(ix, per_step):
    """EMPTY where a trace's last iteration read from a marker that begins one (a DataLoader's `__next__`, a
    forward) launched nothing: the loop's final `__next__`, which raised StopIteration (0.2 ms after a ViT eval's
    6 batches of 150-290 ms, own-h200-nomarkers-vit-inference-eval-loader), merged into the iteration before it;
    CUT where it launched under FRAGMENT of the others' median count: an iteration just begun when the window
    ended (a batch's copies and a fill: 3 device events against 398 in pub-examples-dcgan-fake-warm; the ViT
    eval's last batch, 10 against 385), left out; else None."""
    if not (ix.iterations and not ix.iterations.get("one_call") and len(ix.steps) > 2 and per_step
            and all(per_step[:-1])):
        return None
    if not per_step[-1]:
        return EMPTY
    return CUT if len(per_step[-1]) < FRAGMENT * statistics.median(map(len, per_step[:-1])) else None


EMPTY, CUT = "empty", "cut by the window's end"
FRAGMENT = 0.1  # of the other iterations' device events (median): a last iteration this small was cut


NAMED_RATIO = 1.3   # over the others' median: a step whose own work names a save, an eval or a log goes from here,
                    # under OUTLIER_RATIO: HF's log-and-save step ran 1.45-1.77x on a loaded 2-core CPU and stayed in
                    # the mean, lifting it 10-12% (benchmarks/findings/live/new_user_cpu_results.md)
WORK_SHARE = 0.5    # of its time over that median, the named work took at least this much (HF's save: 0.7-1.4 of
                    # it): a noisy step's one chance sample of a logging frame is no log-and-save step


ADDED = "work added"
ADDED_MIN_OPS = 10  # operators more than the like steps ran, at least: HF's save step ran 86 more (its state dict
                    # detached, `aten::detach` x29); a logging step a few (those stay, under the 1.3x anyway)


def _op_counts(ix):
    """[Counter of operator names] per step."""
    starts, out = [a for a, _, _ in ix.steps], [Counter() for _ in ix.steps]
    for e in ix.cpu_ops:
        k = traceio.find(ix.steps, starts, e.get("ts"))
        if k is not None:
            out[k][str(e.get("name", ""))] += 1
    return out


def _added(ops, k, others):
    """The operators step k ran more than the like steps (a Counter), when it ran every operator each of them ran
    and ADDED_MIN_OPS more than the most any ran, and at least two of them ran the very same operators (the loop's
    usual step: a loop whose work grows step by step, L-BFGS's, has none); else None. Work added to that step
    (a save holding the GIL, which the sampler cannot see: HF's safetensors write), not a step the host stalled
    (the same operators)."""
    if len(others) < 2 or any(ops[i] - ops[k] for i in others):
        return None
    if max(Counter(frozenset(ops[i].items()) for i in others).values()) < 2:
        return None
    most = max(others, key=lambda i: sum(ops[i].values()))
    extra = ops[k] - ops[most]
    return extra if sum(extra.values()) >= ADDED_MIN_OPS else None


def _named(ix, meta, each, work, why, windows):
    """Adds to `why` ("named") each step over NAMED_RATIO x the median of the other like steps whose own work
    (only_in_step: what ran only in it) names a save, an eval or a log and took WORK_SHARE of its extra time;
    the slowest first, MIN_STEPS like steps always left: a step kept for that is said in the metadata's notes.
    Or, when nothing it ran names its work or measures it, whose operators are every operator of the other like
    steps and more (`_added`: ix.added, its kind ADDED). A step whose extra time is mostly its wait for the
    DataLoader stays, whatever else it ran (`_loader_wait`: pytorch/examples' imagenet logs with 4 `.item()` the
    iteration whose batch took 30 ms of its 52; 4 workers instead of 2 then saved 12 ms an iteration). Returns what
    ran in each step ([] when no step was slow enough to read it)."""
    per, ops = [], None
    ix.added = {}
    judged = [k for k in range(len(each)) if work[k] and k not in why and k not in getattr(ix, "same_work", ())]
    for k in sorted(judged, key=lambda k: -each[k]):
        rest = [each[i] for i in range(len(each)) if work[i] and i not in why and i != k]
        median = statistics.median(rest) if rest else None
        if median is None or each[k] <= NAMED_RATIO * median or each[k] - median < OUTLIER_MIN_MS:
            continue
        per = per or only_in_step.per_step(ix, meta)
        only = only_in_step.only_labels(per, k)
        kind = only_in_step.kind_of(only)
        named = only_in_step.named_ms(ix, meta, per, k, only_in_step.telling(only, kind)) if kind else 0.0
        if named < WORK_SHARE * (each[k] - median):
            ops = ops or _op_counts(ix)
            extra = _added(ops, k, [i for i in range(len(each)) if work[i] and i not in why and i != k])
            if extra is None:
                continue
            kind = kind or ADDED
            ix.added[k] = extra
        wait = _loader_wait(ix, windows[k], meta)
        if wait >= LOADER_SHARE * (each[k] - median):
            meta.setdefault("notes_loader_waits", []).append(_kept_for_loader(k, each[k], median, wait))
            continue
        if len(each) - len(why) - 1 < MIN_STEPS:
            meta.setdefault("notes_named_kept", []).append(
                f"profiled step {k + 1} ran {_kind_words(kind)} ({_ms(each[k])} against a median of {_ms(median)}"
                f"{_ran(only, kind, ix.added.get(k))}) but stays in the per-step figures: leaving it out would "
                f"leave {len(each) - len(why) - 1} like steps, too few; {WIDEN}")
            continue
        why[k] = "named"
    return per


LOADER_SHARE = 0.5   # of a slow step's extra time spent waiting on the DataLoader: the input pipeline's, not once


def _keep_loader_waits(ix, why, each, windows, meta):
    """Keep, as the step's own cost, an outlier step whose extra time is mostly its wait for the DataLoader's next
    batch: with workers the batches arrive unevenly (an H100 ResNet-18 with 2 workers: one step in two waits
    ~180 ms), and that wait is what the input pipeline costs every step on average; said in the metadata's notes.
    windows: each step's window on the measure that found it (the GPU timeline's: the wait that delays step k's
    next kernels is in the host's next step)."""
    outs = [k for k, reason in why.items() if reason == "outlier"]
    if not outs:
        return
    like = [each[k] for k in range(len(each)) if k not in why]
    median = statistics.median(like) if like else 0.0
    for k in outs:
        wait = _loader_wait(ix, windows[k], meta)
        if wait >= LOADER_SHARE * (each[k] - median):
            del why[k]
            meta.setdefault("notes_loader_waits", []).append(_kept_for_loader(k, each[k], median, wait))


def _loader_wait(ix, window, meta):
    """ms of a step's window spent waiting for the DataLoader's next batch."""
    a, b = window
    spans = [(max(a, m["ts"]), min(b, m["ts"] + m.get("dur", 0))) for m in ix.loader
             if m["ts"] < b and m["ts"] + m.get("dur", 0) > a]
    wait = sum(e - s for s, e in spans) / 1e3
    if meta.get("capture_ops") == "device" and spans:  # the loader's annotation is a copy, placed by the launches
        wait -= _launching(ix, spans) / 1e3
    return wait


def _kept_for_loader(k, ms, median, wait):
    return (f"profiled step {k + 1} took {ms:.1f} ms against a median of {median:.1f} ms, {wait:.1f} ms of it "
            "waiting for the DataLoader's next batch: kept in the per-step figures, not left out as a one-off; the "
            "input pipeline's finding judges the wait (batches that arrive unevenly cost every step on average, a "
            "pipeline not yet steady is said once)")


HOST_SHARE = 0.9   # of a slow iteration's extra time, the GPU idle (the host's time between iterations) at least


def _keep_host_time(ix, why, each, per_step, windows, meta):
    """Keep, in a trace without markers (iterations read from what repeats), an outlier iteration that ran the like
    iterations' device work exactly (the same kernels, by name and count) and whose extra time is HOST_SHARE GPU idle:
    the host's work between iterations (post-processing, a log line, a metric) is the loop's own, whatever it was
    (the first iteration aside: it holds what ran before the loop, and its first calls)
    (#57: 10 forwards without markers lost 4 of 9 as one-offs, the report at 267.5 ms a forward where the mean was
    ~436). Said in the metadata's notes."""
    if not ix.iterations or per_step is None:
        return
    outs = [k for k, reason in why.items() if reason == "outlier"]
    like = [k for k in range(len(each)) if k not in why]
    if not outs or len(like) < 2:
        return
    kernels = [Counter(str(e.get("name", "")) for e, _ in evs) for evs in per_step]
    usual, seen = Counter(frozenset(kernels[k].items()) for k in like).most_common(1)[0]
    median = statistics.median(each[k] for k in like)
    kept = []
    for k in outs:  # the first iteration holds what ran before the loop and its first calls: a cold first pass
        if k == 0 or seen < 2 or frozenset(kernels[k].items()) != usual:
            continue
        busy = traceio.union_length([(e["ts"], e["ts"] + e["dur"]) for e, _ in per_step[k]]) / 1e3
        idle = each[k] - busy
        like_idle = statistics.median(each[i] - traceio.union_length(
            [(e["ts"], e["ts"] + e["dur"]) for e, _ in per_step[i]]) / 1e3 for i in like)
        if idle - like_idle >= HOST_SHARE * (each[k] - median):
            del why[k]
            kept.append(k)
    if kept:
        meta.setdefault("notes_same_work", []).append(
            f"iteration{'s' * (len(kept) > 1)} {', '.join(str(k + 1) for k in kept)} took "
            f"{', '.join(_ms(each[k]) for k in kept)} against a median of {_ms(median)}, running the same kernels as "
            "the others, the GPU waiting on the host for the rest: the host's work between iterations is the loop's "
            "own, kept in every per-step figure")


UNJOINED_LAUNCHES = 10  # launches without an operator inside a copied loader annotation: work it was stretched over


def _launching(ix, spans):
    """The µs of the loader's `spans` (a device-only capture's copies of the untimed step's annotation) during
    which the host was launching kernels the untimed step never did, UNJOINED_LAUNCHES or more (from the first of
    them to the last): no wait for a batch but work the copy was stretched over (Lightning's validation loop at a
    step's start became a 158.7 ms `__next__` in captures before the join kept its pace; issue #57)."""
    out = 0.0
    for s, e in spans:
        ts = sorted(c["ts"] for c in ix.launches.values() if s <= c["ts"] < e
                    and (c.get("args") or {}).get("External id") is None)
        if len(ts) >= UNJOINED_LAUNCHES:
            out += ts[-1] - ts[0]
    return out


# the typical operator of a slow step grew at least as the step's growth to this power (half of it on a log
# scale): fixed-size operators (an optimizer's) and per-call costs keep part of every operator's time constant
# (a small encoder's 512-token steps: 8.9-9.2x the 32-token ones, the median operator 4.4-4.6x; a tiny MLP's
# stalled step 2.86x, its median operator 1.02x)
GREW_POWER = 0.5


def _keep_same_work(ix, why, each, per_step, meta):
    """Keep, as the loop's own work, an outlier step that ran the operators (kernels, on a GPU timeline) of the
    like steps, no more and no fewer than ADDED_MIN_OPS apart, and whose typical operator (the median over the
    names) took longer with it (GREW_POWER): the same work on larger inputs (a sequence length or a batch that
    changes between steps; issue #56: a loop of 32 to 512 tokens lost both 512-token steps as "unnamed" one-offs and
    reported 53 ms/step against a mean of 217; there the median operator grew 2.8-3.5x with steps 2.9-5.4x). A
    step that stalled took longer in a few operators while most kept their time (a tiny MLP's step of 51.6 ms
    against 18.1 and 15.2: its median operator 1.02x). Said in the metadata's notes; `steps_vary` tells the
    checks that the steps' times spread by design."""
    outs = [k for k, reason in why.items() if reason == "outlier"]
    like = [k for k in range(len(each)) if k not in why]
    ix.same_work = set()
    if not like or not outs and len(like) < MIN_STEPS:
        return
    if per_step is not None:
        counts = [Counter(str(e.get("name", "")) for e, _ in evs) for evs in per_step]
        times = [{} for _ in per_step]
        for k, evs in enumerate(per_step):
            for e, _ in evs:
                name = str(e.get("name", ""))
                times[k][name] = times[k].get(name, 0.0) + float(e.get("dur") or 0)
    else:
        counts, times = _op_counts(ix), only_in_step.by_step(ix.steps, ix.cpu_ops)
    ref = sorted(like, key=lambda k: sum(counts[k].values()))[len(like) // 2]  # the like step of median count
    step_median = statistics.median(each[k] for k in like)
    kept = []
    for k in outs:
        same = (sum(counts[k].values()) and sum((counts[k] - counts[ref]).values()) < ADDED_MIN_OPS
                and sum((counts[ref] - counts[k]).values()) < ADDED_MIN_OPS)
        names = [n for n in times[k] if all(times[i].get(n) for i in like)]
        if not same or not names:
            continue
        grew = statistics.median(times[k][n] / statistics.median(times[i][n] for i in like) for n in names)
        if grew >= (each[k] / step_median) ** GREW_POWER or _larger_inputs(ix, per_step, ref, k, meta):
            del why[k]
            kept.append(k)
    ix.same_work = set(kept)  # like steps: `_named` does not judge them again
    if not kept:
        kept = _spread(ix, like, each, counts, times)
    if kept:
        low, high = min(each), max(each)
        meta["steps_vary"] = {"steps": [k + 1 for k in kept], "low_ms": round(low, 3), "high_ms": round(high, 3)}
        meta.setdefault("notes_same_work", []).append(
            f"profiled step{'s' * (len(kept) > 1)} {', '.join(str(k + 1) for k in kept)} took "
            f"{', '.join(_ms(each[k]) for k in kept)} against a median of {_ms(step_median)}, running the same "
            "operators as the other steps, most of them longer in proportion: the same work on larger inputs (a "
            "sequence length or a batch that changes between steps) or on a host that ran it all slower; kept in "
            f"every per-step figure, which is the mean of steps from {_ms(low)} to {_ms(high)}")


def _larger_inputs(ix, per_step, ref, k, meta):
    """Whether step k's own record shows it ran on inputs SIZE_RATIO or more larger than step ref's (`_shapes`):
    the same operators on a longer sequence, whose typical operator may not grow with it where per-call costs
    dominate (a tiny model's 256-token steps, ~4x its 32-token ones, in a plain CPU capture with record_shapes:
    both left out as "unnamed" one-offs in most runs, its median operator under 2x)."""
    shapes = _shapes(ix, per_step, [ref, k], meta)
    sizes = shapes and shapes.get("sizes")
    return bool(sizes) and sizes[0] > 0 and sizes[1] >= SIZE_RATIO * sizes[0]


def _spread(ix, like, each, counts, times):
    """[the slowest like step] where the like steps themselves spread OUTLIER_RATIO or more (none an outlier of
    their median) running the same operators, the slowest one's typical operator grown against the fastest's as
    `_keep_same_work` asks, while the optimizer's update, whose work is the parameters' and no input's, kept its
    time (grew less than that): sizes that change every step (issue #56: a loop of 32 to 512 tokens on the CPU,
    profiled steps of 49.6 to 146.8 ms, whose one 487-token timed step, 140.5 ms against a median of 54.7, was left
    out of the unprofiled step as an outlier). A host whose threads waited for cores slows every operator, the
    update's too (a Lightning MLP's steps of 51 to 554 ms, tests/data/cpu-lightning-sequential); a trace with no
    optimizer annotation cannot tell the two: []."""
    if len(like) < MIN_STEPS or not ix.optimizer:
        return []
    lo, hi = min(like, key=lambda k: each[k]), max(like, key=lambda k: each[k])
    if each[hi] < OUTLIER_RATIO * each[lo] or not sum(counts[hi].values()) or (
            sum((counts[hi] - counts[lo]).values()) >= ADDED_MIN_OPS
            or sum((counts[lo] - counts[hi]).values()) >= ADDED_MIN_OPS):
        return []
    names = [n for n in times[hi] if times[lo].get(n)]
    grew = statistics.median(times[hi][n] / times[lo][n] for n in names) if names else 0.0
    update = [sum(_overlap(ix.optimizer, ix.steps[k][:2])) for k in (lo, hi)]
    bar = (each[hi] / each[lo]) ** GREW_POWER
    return [hi] if grew >= bar and 0 < update[0] and update[1] < bar * update[0] else []


# ---------------------------------------------------------------------------------------------------------
# Steps not alike (issue #56 item 3): input shapes or kernel sets that change between the steps. A Conv1d net
# given a new input length every step with cudnn.benchmark on ran steps of 7.7 to 1,031 ms, 58 of its 90 kernels
# not in every step (cuDNN's autotuner trying engines for each new length), and the check said "ok": its times
# were within 2x of their median
# ---------------------------------------------------------------------------------------------------------

NOT_ALIKE = "not alike"  # the check's result for such steps: the loop's, not a fault of the profile
SHAPES_SHOWN = 5         # shapes listed in the check, in window order
SIZE_RATIO = 1.1         # sizes this close are alike: a recommender's jagged sparse features, 16.31-16.42 M values
                         # a step (foreign/hta-sampled-rank1: steps of 608 and 623 ms)


def unlike(ix, per_step, each, steps, meta):
    """What makes the steps `steps` (indices: the like steps and a new shape's cold first call, those with work)
    unlike each other, or None: {"shapes": `_shapes`'s, "kernels": [names not in every step, names in any],
    "text"}. Kernels on a GPU timeline, operators on the CPU; shapes only from records of each step's own
    (`_shapes`), their sizes SIZE_RATIO apart or more; kernel sets that differ by ADDED_MIN_OPS names or more
    alone, or by any beside shapes that differ (cuDNN's kernels chosen for each size)."""
    if len(steps) < 2:
        return None
    if per_step is not None:
        names = [{str(e.get("name", "")) for e, _ in per_step[k] if e.get("cat") == "kernel"} for k in steps]
    else:
        ops = _op_counts(ix)
        names = [set(ops[k]) for k in steps]
    union = set().union(*names)
    varied = len(union - set.intersection(*names))
    shapes = _shapes(ix, per_step, steps, meta)
    if shapes and shapes["spread"] and shapes["spread"] < SIZE_RATIO:
        shapes = None
    if not shapes and varied < ADDED_MIN_OPS:  # a log's few operators in one step: the "per step" check's
        return None
    what = "kernels" if per_step is not None else "operators"
    parts = [_shapes_text(shapes, steps, each)] if shapes else []
    if varied:
        parts.append(f"{what} differ: {varied} of the {len(union)} {what} the steps ran are not in every step")
    if shapes:  # the summary keeps each step's shape in words, not the keys that told them apart
        shapes = {"what": shapes["what"], "steps": [k + 1 for k in steps], "labels": shapes["labels"],
                  "spread": shapes["spread"] and round(shapes["spread"], 2)}
    return {"shapes": shapes, "kernels": [varied, len(union)], "text": "; ".join(parts)}


def _shapes(ix, per_step, steps, meta):
    """{"what": the record that shows it, "labels": each step's shape in words, "keys": each step's, "sizes": each
    step's size (elements, bytes or blocks), "spread": the largest over the smallest or None} where the steps' input shapes differ; None where they do not or no record
    of each step's own shows them: the operators' input dims where the steps recorded their own (profiling's
    captures lend one untimed step's shapes to every profiled step: `shapes` in the metadata, or operators copied
    to a device-only capture), else the bytes copied to the device (the batch), else the grids of the kernels
    every step launched."""
    own = not meta.get("shapes") and meta.get("capture_ops") != "device"
    return ((own and _input_dims(ix, steps))
            or (per_step is not None and (_copies(per_step, steps) or _grids(per_step, steps))) or None)


def _input_dims(ix, steps):
    """`_shapes` from the operators' recorded input dims: the first operator, in the first step's order, whose
    dims differ between steps that ran it as often."""
    starts, dims = [a for a, _, _ in ix.steps], [{} for _ in ix.steps]
    for e in sorted(ix.cpu_ops, key=lambda e: e.get("ts", 0)):
        d = (e.get("args") or {}).get("Input Dims")
        k = traceio.find(ix.steps, starts, e.get("ts")) if d and any(d) else None
        if k is not None:
            dims[k].setdefault(str(e.get("name", "")), []).append([x for x in d if x])
    per = [dims[k] for k in steps]
    names = [n for n in per[0] if all(len(p.get(n, ())) == len(per[0][n]) for p in per)]
    for n in names:
        i = next((i for i in range(len(per[0][n])) if len({str(p[n][i]) for p in per}) > 1), None)
        if i is not None:
            size = [_elements(p[n][i]) for p in per]
            return {"what": f"`{n}`'s inputs", "labels": [str(p[n][i]) for p in per],
                    "keys": [str([p[m] for m in names]) for p in per], "sizes": size,
                    "spread": max(size) / min(size) if min(size) else None}
    return None


def _elements(dims):
    """The elements of the tensors an operator's input dims describe, all together (a tensor list's too)."""
    if all(isinstance(x, int) for x in dims):
        return math.prod(dims)
    return sum(_elements(x) for x in dims if isinstance(x, list))


def _copies(per_step, steps):
    """`_shapes` from the bytes each step copied from the host to the device (a new batch's size)."""
    sizes = [tuple(sorted(int((e.get("args") or {}).get("bytes") or 0) for e, _ in per_step[k]
                          if "htod" in str(e.get("name", "")).lower())) for k in steps]
    if len(set(sizes)) < 2:
        return None
    total = [sum(x) for x in sizes]
    return {"what": "the bytes copied to the device", "labels": [_bytes(x) for x in total],
            "keys": sizes, "sizes": total, "spread": max(total) / min(total) if min(total) else None}


def _bytes(n):
    return f"{n / 1e6:,.3g} MB" if n >= 1e5 else f"{n / 1e3:.3g} kB" if n >= 100 else f"{n} bytes"


def _grids(per_step, steps):
    """`_shapes` from the grids of the kernels every step launched as often: the same kernels on inputs of other
    sizes (a grid's blocks follow the elements a kernel works on)."""
    grids = [{} for _ in steps]
    for g, k in zip(grids, steps):
        for e, _ in per_step[k]:
            grid = (e.get("args") or {}).get("grid")
            if e.get("cat") == "kernel" and isinstance(grid, list):
                g.setdefault(str(e.get("name", "")), []).append(math.prod(grid))
    names = [n for n in grids[0] if all(len(g.get(n, ())) == len(grids[0][n]) for g in grids)]
    changed = [n for n in names if len({tuple(g[n]) for g in grids}) > 1]
    if not changed:
        return None
    blocks = [sum(sum(g[n]) for n in changed) for g in grids]
    return {"what": f"the grids of {len(changed)} of the {len(names)} kernels every step launched (their blocks)",
            "keys": [tuple(tuple(g[n]) for n in changed) for g in grids], "labels": [f"{b:,}" for b in blocks],
            "sizes": blocks, "spread": max(blocks) / min(blocks) if min(blocks) else None}


def _shapes_text(shapes, steps, each):
    """The shapes in words: each with its steps and their ms, in window order; a shape's first step in the window
    against its repeats where some shape repeats."""
    groups = {}
    for key, label, k in zip(shapes["keys"], shapes["labels"], steps):
        groups.setdefault(key, (label, []))[1].append(k)
    rows = [f"{label} in step{'s' * (len(ks) > 1)} {', '.join(str(k + 1) for k in ks)} "
            f"({', '.join(_ms(each[k]) for k in ks)})" for label, ks in groups.values()]
    more = len(rows) - SHAPES_SHOWN
    text = (f"shapes differ ({len(groups)} shapes in {len(steps)} steps): {shapes['what']}: "
            + "; ".join(rows[:SHAPES_SHOWN]) + (f"; {more} more" if more > 0 else ""))
    if shapes.get("spread"):
        text += f"; the largest {shapes['spread']:.1f}x the smallest"
    repeated = [ks for _, ks in groups.values() if len(ks) > 1]
    if repeated:
        first = statistics.mean(each[ks[0]] for ks in repeated)
        again = statistics.mean(each[k] for ks in repeated for k in ks[1:])
        text += f"; a shape's first step in the window took {_ms(first)} on average, its repeats {_ms(again)}"
    return text


# ---------------------------------------------------------------------------------------------------------
# What a one-off step's device work shows (issue #57 item 2): a device-only capture records no operator of the
# work only one step ran (the untimed step did not run it), and the host sampler, every 2 ms or less often, may
# see none of its frames (HF's eval in benchmarks/findings/live/uneven_steps.py: 4 samples, all in the
# collate): the kernels and runtime calls it launched still say what it was
# ---------------------------------------------------------------------------------------------------------

BACKWARD_WORDS = ("backward", "bwd", "wgrad", "dgrad", "bprop")  # kernel or operator names of a backward pass


# what a first-time runtime call is for (lower-case words in its name), said beside the calls
FIRST_TIME = ((("peekatlasterror", "getlasterror"), "a library trying kernels: cuDNN's engines at an input size it "
               "had not seen"),
              (("malloc",), "the allocator growing"),
              (("funcgetattributes", "moduleload", "libraryload", "modulegetfunction", "funcsetattribute"),
               "first launches and module loads"),
              (("streamcreate", "devicegetattribute", "getdeviceproperties", "eventcreate"), "the runtime's set-up"))


def device_kinds(ix, per_step, why, keep):
    """{k: (kind, evidence in words)} of the one-off steps `why` whose device work names them: an eval (EVAL) when
    the kernels it launched beyond a like step's number ADDED_MIN_OPS or more and none of them is one the like
    steps launched only in their backward pass (a forward without backward: model.eval() under no_grad), while
    the like steps do run one; a cold first call (COLD_CALL) when its kernels are the like steps' (fewer than
    ADDED_MIN_OPS apart) but it made ADDED_MIN_OPS or more runtime calls that launch nothing beyond any like step
    (cuDNN trying its engines for an input size it has not seen: 1,970 `cudaPeekAtLastError` against 32; first
    launches' `cudaFuncGetAttributes`, module loads, `cudaMalloc` as the allocator grows). {} on a CPU trace."""
    if per_step is None or not keep or not why:
        return {}
    kernels = [Counter(str(e.get("name", "")) for e, _ in evs if e.get("cat") == "kernel") for evs in per_step]
    ref = sorted(keep, key=lambda i: sum(kernels[i].values()))[len(keep) // 2]
    backward = _backward_only(ix, [per_step[i] for i in keep])
    calls = _idle_calls(ix)
    out = {}
    for k in why:
        extra = kernels[k] - kernels[ref]
        n = sum(extra.values())
        if n >= ADDED_MIN_OPS and sum((_in_optimizer(ix, per_step[k]) - _in_optimizer(ix, per_step[ref])).values()
                                      ) >= n / 2:
            continue  # the optimizer's first step making its state (AdamW's exp_avg, momentum buffers): no eval
        if n >= ADDED_MIN_OPS and backward and not any(name in backward for name in extra):
            top = ", ".join(f"`{name[:60]}` x{c}" for name, c in extra.most_common(2))
            out[k] = (only_in_step.EVAL, f"its device work shows a forward without backward: {n:,} kernels more than "
                      f"a like step ({top}), none of the {len(backward)} the like steps launch only in their "
                      "backward pass")
            continue
        if n >= ADDED_MIN_OPS or sum((kernels[ref] - kernels[k]).values()) >= ADDED_MIN_OPS:
            continue
        most = Counter()
        for i in keep:
            most |= calls[i]
        more = calls[k] - most
        if sum(more.values()) >= ADDED_MIN_OPS:
            top = ", ".join(f"`{name}` x{c:,}" for name, c in more.most_common(SHOWN))
            causes = list(dict.fromkeys(cause for name, _ in more.most_common(SHOWN) for words, cause in FIRST_TIME
                                        if any(w in name.lower() for w in words)))
            out[k] = (COLD_CALL, f"it launched the like steps' kernels but made {sum(more.values()):,} runtime "
                      f"calls more than any of them ({top}): first-time work"
                      + (f" ({', '.join(causes)})" if causes else ""))
    return out


def _in_optimizer(ix, evs):
    """Counter of the kernel names in `evs` (a per_step row) launched inside the optimizer's step."""
    starts = [a for a, _ in ix.optimizer]
    return Counter(str(e.get("name", "")) for e, launch in evs if e.get("cat") == "kernel"
                   and traceio.find(ix.optimizer, starts, launch["ts"]) is not None)


def _backward_only(ix, steps):
    """The kernel names the like steps (their per_step rows) launched only under backward operators (their
    External id's operator, else the kernel's own name, holds BACKWARD_WORDS)."""
    ops = {}
    for op in ix.cpu_ops:
        ext = (op.get("args") or {}).get("External id")
        if ext is not None:
            ops[ext] = str(op.get("name", "")).lower()
    seen = {}
    for evs in steps:
        for e, launch in evs:
            if e.get("cat") != "kernel":
                continue
            name = str(e.get("name", ""))
            ext = (e.get("args") or {}).get("External id", (launch.get("args") or {}).get("External id"))
            words = ops.get(ext) or name.lower()
            back = any(w in words for w in BACKWARD_WORDS) or words.startswith("autograd::engine")
            seen[name] = seen.get(name, True) and back
    return {name for name, back in seen.items() if back}


def _idle_calls(ix):
    """[Counter of the runtime calls that launched no device event] per step."""
    launched = {traceio.corr(e) for e in ix.device}
    starts, out = [a for a, _, _ in ix.steps], [Counter() for _ in ix.steps]
    for e in ix.runtime:
        if traceio.corr(e) in launched:
            continue
        k = traceio.find(ix.steps, starts, e.get("ts"))
        if k is not None:
            out[k][str(e.get("name", ""))] += 1
    return out


def _overlap(spans, window):
    a, b = window
    return [min(e, b) - max(s, a) for s, e in spans if e > a and s < b]


def _outside_rows(ix, spans):
    """One row for the compilation outside every step (before the first iteration, in a one window's start-up)."""
    steps = [(a, b) for a, b, _ in ix.steps]
    ms = sum(e - s for s, e in spans) / 1e3 - sum(sum(_overlap(spans, w)) for w in steps) / 1e3
    if ms < OUTLIER_MIN_MS:
        return []
    where = "in the run's start-up, before the window" if ix.whole else "before or between the steps"
    return [{"kind": COMPILE, "step": None, "ms": round(ms, 3),
             "text": f"compilation {where}: {_ms(ms)} (Dynamo's and Inductor's annotations), in no step"}]


def _ms(x):
    """Milliseconds to three significant digits at least (0.0312 ms, 26.1 ms, 1,436.2 ms)."""
    return f"{x:,.1f} ms" if x >= 10 else f"{x:.3g} ms"


def _row(ix, per, k, reason, each, median, compile_ms, like):
    """A one-off step's row: its kind, time against the like steps' median, what ran only in it (per:
    only_in_step.per_step's), and what its device work shows (`device_kinds`)."""
    only = only_in_step.only_labels(per, k)
    extra = getattr(ix, "added", {}).get(k)
    seen = getattr(ix, "device_named", {}).get(k)
    if seen and seen[0] == COLD_CALL and k == 0:  # the first step: the run's start-up, as before
        seen = (COLD, seen[1])
    kind = COMPILE if compile_ms > 0 else only_in_step.kind_of(only) or (seen and seen[0]) or (
        ADDED if extra else COLD if k == 0 else UNNAMED)
    what = "iteration" if ix.iterations else "profiled step"
    ran = _ran(only, kind, extra) + (f"; {seen[1]}" if seen and seen[0] == kind else "")
    spent = f", {_ms(compile_ms)} of it compiling" if compile_ms > 0 else ""
    where = " on the host" if reason == "first on the host" else ""
    text = (f"{what} {k + 1} of {len(each)} (`{ix.steps[k][2]}`), {_kind_words(kind)}: {_ms(each[k])}{where}{spent} "
            f"against a median of {_ms(median)} of the {like} like step{'s' * (like != 1)}{ran}; left out of "
            "every per-step figure")
    return {"kind": kind, "step": ix.steps[k][2], "position": k + 1, "of": len(each), "ms": round(each[k], 3),
            "median_ms": round(median, 3), "compile_ms": round(compile_ms, 3) or None, "why": reason,
            "only": only[:SHOWN], "text": text}


def _ran(only, kind, extra=None):
    """`; only it ran ...` and, for work added, `; it ran every operator of the like steps and N more (...)`."""
    out = f"; only it ran {', '.join(f'`{x}`' for x in _shown(only, kind))}" if only else ""
    if extra:
        top = ", ".join(f"`{name}` x{c}" for name, c in extra.most_common(SHOWN))
        out += f"; it ran every operator of the like steps and {sum(extra.values())} more ({top})"
    return out


def _kind_words(kind):
    return {UNNAMED: "unnamed (nothing that ran only in it says what it was)",
            ADDED: "work added to it (a checkpoint save, a log: nothing it ran names which)",
            COLD: "a cold first pass (first calls: allocations, lazy loads, autotuning)",
            COLD_CALL: "a cold first call (first-time work on the host, never the loop's per-step cost)",
            only_in_step.EVAL: "an eval"}.get(kind, f"a {kind}")


def _shown(only, kind):
    """The labels named in the line: those that gave the kind first, then the heaviest."""
    return list(dict.fromkeys(only_in_step.telling(only, kind) + only))[:SHOWN]


def _drop_events(ix, gone, per_step, why):
    """The host and device events of the one-off steps out of the index."""
    def kept(events):
        return [e for e in events if not any(a <= e.get("ts", 0) < b for a, b in gone)]
    for attr in ("cpu_ops", "graph_calls", "modules", "runtime", "optimizer_marks", "loader", "python",
                 "annotations", "compiles"):
        setattr(ix, attr, kept(getattr(ix, attr)))
    ix.launches = {c: e for c, e in ix.launches.items() if not any(a <= e["ts"] < b for a, b in gone)}
    if per_step is not None:
        dropped = {id(e) for k in why for e, _ in per_step[k]}
        ix.device = [e for e in ix.device if id(e) not in dropped]
    ix.optimizer = traceio.merge((m["ts"], m["ts"] + m["dur"]) for m in ix.optimizer_marks)


def _renumbered(meta, keep):
    """The metadata with the host samples of the like steps only, numbered as the like steps."""
    host = meta.get("host_samples")
    if not isinstance(host, dict) or not host.get("samples"):
        return meta
    new = {old: i for i, old in enumerate(keep)}
    rows = [(new[step], us, sid) for step, us, sid in host["samples"] if step in new]
    return dict(meta, host_samples=dict(host, samples=rows))


def few_note(ix):
    """The note when too few like steps are left to judge another unlike one, else None."""
    steps = [r for r in ix.one_off if r.get("step")]
    if not steps or len(ix.steps) >= MIN_STEPS:
        return None
    n = len(ix.steps)
    return (f"{n} like step{'s' * (n != 1)} left after the one-off{'s' * (len(steps) > 1)}: the per-step figures "
            f"rest on {'it' if n == 1 else 'them'}, too few to tell another unlike one; {WIDEN}")
