"""Pure: the GPU waiting on the input pipeline, the DataLoader's next batch. Stdlib only.

A DataLoader with its default `num_workers=0` runs the Dataset's `__getitem__`, its transforms and the collate
in the training thread: torch.profiler records the wait as `enumerate(DataLoader)#_SingleProcessDataLoaderIter.
__next__`. With workers the main thread waits on their queue inside `_MultiProcessingDataLoaderIter.__next__`
(DESIGN.md pitfall 17). Either way the GPU runs dry once its queue is done and idles until the batch arrives and
the host launches again: that idle, not the span's length, is the cost (a span the GPU spends busy on queued
work costs nothing).

- input_bound: the GPU idle gaps the loader's spans cover (Timeline.loader), priced by the idle they cover, and,
  in a live capture, the gaps whose host samples are in torch's DataLoader where no span was recorded. It runs
  first among the idle rules (findings/__init__.py): a sync right after a long `__next__` (the input's
  `.to(device)`, a `.item()` at the step's end) exposes the loader, it does not cause the wait. Its evidence:
  the spans (the trace's own record, whatever its stack policy), the operators recorded inside them (the
  collate's `aten::stack`, conversions), and the live run's host samples inside them (the per-sample work by
  its line). A trace recorded with Python stacks still prices them (they are recorded events), and says that
  the stacks slow the loader's Python too.
  A window whose batches split into fast ones (no wait: the GPU's pace) and slow ones waiting on the workers is
  judged batch by batch (`_pace`): slow ones in one run at the window's start or end, or waits shrinking batch
  by batch, are a pipeline not yet steady (the workers starting, their queue filling): priced at what the fast
  batches wait (the steady state's, ~0 where they keep up: then no finding, the wait said once as a one-off
  row with "profile later in the run"), never as "more workers"; a window from a model's first pass (cold,
  trace/cold.py) holding the workers' first batch and no other is the same start-up, said once, not priced;
  slow ones recurring among fast ones are an uneven loader (batches in bursts), priced at the window's mean as
  before. More workers are never advised past the cores the host has spare (the live capture's
  `cpu_threads.cores`).
- cpu_input_bound: a CPU trace has no GPU idle: the step's own time inside the loader's spans is what the
  training thread spends on its input.
"""
from collections import Counter

from profiling.profile.findings.contract import finding, framework, rule, scaled, top
from profiling.profile.findings.idle import own_idle, own_labels
from profiling.profile.trace.traceio import find, self_times

KIND = "input_bound"
SINGLE = "_SingleProcessDataLoaderIter"    # num_workers=0: the batch is made in the training thread
WORKERS = "_MultiProcessingDataLoaderIter"  # num_workers>0: the main thread waits on the workers' queue
COVERED = 0.5       # a gap is the loader's when its spans (or its host samples) cover this share of it or more;
                    # the rest of such a gap is the batch's copy and the first launch after it arrives
FIRE_SHARE = 0.01   # as the CUDA-call rules: the report shows no finding under 1% of the step
TORCH_DATA = "torch/utils/data/"            # torch's DataLoader, Dataset and collate (sampler.py's labels)
WAITS = ("_try_get_data", "_get_data")      # the main thread waiting on the workers' queue
DATASET_CALLS = ("__getitem__", "__getitems__")  # a Dataset making a sample (its frames are the work)
INNERMOST = 3       # frames the sampler keeps whatever their file (profiling/profile/capture/sampler.py)
SLOW_WAIT = 0.1     # a batch was waited on when its __next__ took this share of the window's fastest step or more
SHRINK = 0.5        # slow waits each at most this share of the one before: the queue filling, not a steady shortfall
MIN_BATCHES = 3     # fewer batches cannot tell a start-up from a steady loader
APART = 3.0         # the waited batches at least this many times the fast ones' longest wait: two groups, not one
IDLE_FRAMES = ("threading.py", "queues.py", "queue.py", "selectors.py", "connection.py", "multiprocessing/",
               "futures/")  # a wait on other threads or processes, no work of its own


# ---------------------------------------------------------------------------------------------------------
# The rule (device traces)
# ---------------------------------------------------------------------------------------------------------

@rule(KIND, needs=("device",))
def input_bound(tl, ctx, found):
    """The GPU idle while the host waits for the DataLoader's next batch: the gaps the loader's spans cover
    COVERED or more of, priced by the idle they cover; where no span was recorded, the gaps whose host samples
    are mostly in torch's DataLoader, priced by that share."""
    n, spans = ctx["n"], tl.loader
    picked, covered_us, sampled_us = [], 0.0, 0.0
    for g in tl.gaps:
        if g.cause is not None or g.launch["ts"] < g.start:
            continue  # claimed, or its kernel was queued before the GPU went idle: no wait on the host
        us = tl.loader_overlap(g.start, g.end) if spans else 0.0
        if us >= COVERED * g.us:
            picked.append(g)
            covered_us += us
            continue
        share = _sampled_share(tl, g)
        if not us and share >= COVERED:
            picked.append(g)
            sampled_us += share * g.us
    us = covered_us + sampled_us
    ms = us / n / 1e3 * ctx["scale"]
    workers = _workers(tl, picked)
    first = workers and _first_of_cold(tl, spans)  # one batch, in a model's first pass: said once, any share
    if not picked or ms < FIRE_SHARE * ctx["step"] and not first:
        return None
    for g in picked:
        g.cause = KIND
    evidence = (_spans_text(tl, ctx, workers) + f"; the GPU idle while it waited {ms:.1f} ms/step{scaled(ctx)}"
                f" ({100 * us / n / 1e3 / ctx['idle']:.0f}% of the GPU idle), in {len(picked) / n:g} gaps/step"
                + (f" ({sampled_us / n / 1e3 * ctx['scale']:.1f} ms/step of it where only host samples show the loader)"
                   if sampled_us else ""))
    details = _ops_text(tl, ctx, spans) + _samples_text(tl, picked, spans) + _stacks_text(tl, ctx)
    lines, cores = _work_lines(tl, picked, spans), _cores(tl)
    if first:
        total = us / 1e3
        ctx.setdefault("one_off", []).append({"kind": STARTUP, "step": None, "ms": round(total, 1), "text": (
            f"the DataLoader's first batch, the only one in a window that holds the model's first calls (cold): "
            f"{total:,.1f} ms of GPU idle waiting on it, which includes the workers' start (a process each, its "
            "imports and the Dataset's first items) that no later batch pays; one batch cannot tell that start-up "
            "from workers too few to keep up: " + evidence + "; " + STARTUP_FIX)})
        return None
    pace = _pace(tl, picked, ctx) if workers is not False and not sampled_us else None
    if pace is None:
        return finding(KIND, ms, ctx, evidence + details, fix(workers, framework(tl), lines, cores=cores))
    if pace["uneven"]:
        return finding(KIND, ms, ctx, evidence + "; " + pace["text"] + details,
                       fix(workers, framework(tl), lines, cores=cores))
    if pace["steady_ms"] < FIRE_SHARE * ctx["step"]:  # the steady state waits for nothing: said once, not priced
        total = us / 1e3
        ctx.setdefault("one_off", []).append({"kind": STARTUP, "step": None, "ms": round(total, 1), "text": (
            f"the DataLoader's workers not yet steady, {total:,.1f} ms of GPU idle waiting on it in this window "
            f"({ms:.1f} ms/step), which the steady state does not pay: " + pace["text"] + "; " + evidence
            + "; " + STARTUP_FIX)})
        return None
    return finding(KIND, pace["steady_ms"], ctx, evidence + "; the pipeline was not yet steady: " + pace["text"]
                   + details,
                   STARTUP_FIX + "; if a later window's batches still wait, "
                   + fix(workers, framework(tl), lines, cores=cores))


def _first_of_cold(tl, spans):
    """Whether the window is a model's first pass (trace/cold.py) and holds one batch, the loader's first."""
    return len(spans) == 1 and bool(getattr(tl.ix, "cold", None))


STARTUP = "loader not yet steady"  # the one-off row's kind (summary `one_off`, beside irregular.split's)
STARTUP_FIX = ("profile later in the run, once the workers' queue is full (torch.profiler.schedule(wait=N, ...) past "
               "the first batches of an epoch); persistent_workers=True pays the workers' start-up once, not every "
               "epoch; add workers only where a later window's steps still wait on them, never more than the cores "
               "the host has spare")


def _pace(tl, picked, ctx):
    """The loader's waits batch by batch, where its spans split into fast batches (under SLOW_WAIT of the window's
    fastest step: the GPU's pace) and slow ones: {uneven, steady_ms, text}, or None where they do not split (every
    batch waited alike: a steady shortfall) or there are too few to tell. Not yet steady (`uneven` False): the slow
    batches are one run at the window's start or end, or each waits SHRINK or less of the one before and the last
    batch is fast; steady_ms is the GPU idle the fast batches cover, per step (scaled), the steady state's price.
    Uneven: slow batches among fast ones, as batches that come in bursts; the window's mean is the price."""
    spans = tl.loader
    fastest = min((b - a for a, b in tl.windows), default=0.0) / 1e3
    if len(spans) < MIN_BATCHES or fastest <= 0:
        return None
    waits = [(b - a) / 1e3 for a, b, _ in spans]
    slow = [i for i, w in enumerate(waits) if w >= SLOW_WAIT * fastest]
    fast = [i for i in range(len(waits)) if i not in set(slow)]
    if not slow or not fast or min(waits[i] for i in slow) < APART * max(waits[i] for i in fast):
        return None  # one cluster the line cuts (dcgan's 1.6-3.0 ms, every batch alike) is no split
    # the pattern is read with the batches the window recorded after its last step too (the next iteration's,
    # cut by the window's end: pytorch/examples' imagenet, 2 workers, waits 30, 0.1, 5, 0.1 in the steps and 21
    # after them: batches in bursts, not a queue filling)
    end = tl.windows[-1][1] if tl.windows else float("inf")
    after = [m["dur"] / 1e3 for m in getattr(getattr(tl, "ix", None), "loader", ()) if m["ts"] >= end and m.get("dur")]
    every = waits + after
    late = [i for i, w in enumerate(every) if w >= SLOW_WAIT * fastest]
    run = late == list(range(late[0], late[-1] + 1))
    edge = run and (late[0] == 0 or late[-1] == len(every) - 1)
    shrinking = len(late) > 1 and late[-1] < len(every) - 1 and all(
        every[j] <= SHRINK * every[i] for i, j in zip(late, late[1:]))
    listed = ", ".join(f"{w:.1f}" if w >= 0.1 else f"{w:.2f}" for w in waits) + (
        " (after the last step: " + ", ".join(f"{w:.1f}" if w >= 0.1 else f"{w:.2f}" for w in after) + ")"
        if after else "")
    ms_each = [_idle_under(a, b, picked) for a, b, _ in spans]
    fast_ms = sum(ms_each[i] for i in fast) / len(fast) * len(spans) / tl.n * ctx["scale"]
    where = ("the first" if late[0] == 0 else "the last") if edge else ""
    if edge or shrinking:
        n_fast = len(every) - len(late)
        how = (f"{where} {len(late)} of {len(every)} batches waited, the other {n_fast} came without a wait"
               if edge else f"the waits shrank batch by batch while {n_fast} of {len(every)} batches came without "
               "a wait")
        return {"uneven": False, "steady_ms": fast_ms, "text": (
            f"its next-batch waits, batch by batch, {listed} ms: {how} (under "
            f"{100 * SLOW_WAIT:.0f}% of the fastest step, {fastest:.1f} ms), as while the workers start or their "
            f"queue fills; at the fast batches' pace the loader costs "
            + (f"{fast_ms:.1f} ms/step" if fast_ms >= 0.05 else "~0 ms/step"))}
    return {"uneven": True, "steady_ms": None, "text": (
        f"uneven: its next-batch waits, batch by batch, {listed} ms: {len(late)} of {len(every)} batches waited, "
        f"among others that came without a wait (batches that come in bursts, as workers that finish together); "
        f"priced at the window's mean, what the loader costs while the pattern holds")}


def _idle_under(a, b, gaps):
    """ms of the loader's priced GPU idle under one span [a, b]."""
    return sum(max(0.0, min(b, g.end) - max(a, g.start)) for g in gaps) / 1e3


def _cores(tl):
    """The CPU cores this process may run on, as the live capture recorded them (api._cpu_threads), else None."""
    cores = (tl.meta.get("cpu_threads") or {}).get("cores")
    return cores if isinstance(cores, int) and cores > 0 else None


def _sampled_share(tl, g):
    """The share of a gap's host samples that are in torch's DataLoader (0 without samples)."""
    stacks = (tl.meta.get("host_samples") or {}).get("stacks") or []
    if not stacks:
        return 0.0
    ids = [sid for sid in tl.samples_between(g.step, g.start, g.end) if 0 <= sid < len(stacks)]
    loading = sum(any(str(f).startswith(TORCH_DATA) for f in stacks[sid]) for sid in ids)
    return loading / len(ids) if ids else 0.0


def _workers(tl, gaps):
    """True when the batches come from worker processes, False when they are made in the training thread,
    None when neither the spans' iterator nor the host samples tell."""
    names = Counter(str(m.get("name", "")) for _, _, m in tl.loader)
    if names:
        name = names.most_common(1)[0][0]
        return True if WORKERS in name else False if SINGLE in name else None
    stacks = (tl.meta.get("host_samples") or {}).get("stacks") or []
    frames = [f for g in gaps for sid in tl.samples_between(g.step, g.start, g.end) if 0 <= sid < len(stacks)
              for f in stacks[sid]]
    if any(_function(str(f)) in WAITS for f in frames):
        return True
    return False if any("_utils/fetch.py" in str(f) or "_utils/collate.py" in str(f) for f in frames) else None


# ---------------------------------------------------------------------------------------------------------
# Evidence text
# ---------------------------------------------------------------------------------------------------------

def _spans_text(tl, ctx, workers):
    """`the DataLoader's next batch (`enumerate(DataLoader)#...__next__`, num_workers=0: ...) 68.7 ms/step (47%
    of the step)`, or the sampled loader's where no span was recorded."""
    n = ctx["n"]
    if not tl.loader:
        return "the host samples inside the GPU idle are in torch's DataLoader (no DataLoader span in this trace)"
    name = Counter(str(m.get("name", "")) for _, _, m in tl.loader).most_common(1)[0][0]
    ms = sum(b - a for a, b, _ in tl.loader) / n / 1e3
    how = (": the main thread waits on the workers' queue" if workers else
           ", num_workers=0: the Dataset's __getitem__, its transforms and the collate run in the training thread"
           if workers is False else "")
    return (f"the DataLoader's next batch (`{name}`{how}) took {ms:.1f} ms/step of the host "
            f"({100 * ms / ctx['step']:.0f}% of the step, {len(tl.loader) / n:g} calls/step)")


def _ops_text(tl, ctx, spans):
    """The operators recorded inside the spans on their thread (the collate's stack, conversions), by self time,
    and how much of the spans they fill: the rest is Python outside any operator."""
    ops, inside = Counter(), 0.0
    for a, b, m in spans:
        key = (m.get("pid"), m.get("tid"))
        evs = [e for e in tl.threads.get(key, ()) if e is not m and a <= e["ts"] and e["ts"] + e["dur"] <= b]
        for e, self_us, _ in self_times(evs):
            ops[str(e.get("name", ""))] += self_us
            inside += self_us
    total = sum(b - a for a, b, _ in spans)
    if not ops or not total:
        return ""
    n = ctx["n"]
    return (f"; inside it, operators {inside / n / 1e3:.1f} ms/step ("
            + ", ".join(f"{name} {us / n / 1e3:.1f}" for name, us in top(ops)) + f"), the other "
            f"{100 * (1 - inside / total):.0f}% Python outside any operator (decoding, augmenting, the Dataset's code)")


def _work(frames, own):
    """The per-sample work a loader sample shows, or None for a wait on the workers' queue: the innermost own
    frame inside the loader (innermost of torch's DataLoader frames, or of the Dataset's __getitem__ where the
    sampler dropped torch's frames), else the innermost frame there that is no wait (a library's decode, the
    collate). Own frames further out are the loop that asked for the batch, not its work."""
    frames = [str(f) for f in frames]
    if not frames or any(w in frames[0] for w in IDLE_FRAMES) or any(_function(f) in WAITS for f in frames[:3]):
        return None
    j = next((i for i, f in enumerate(frames) if f.startswith(TORCH_DATA)), None)
    if j is None:
        d = next((i for i, f in enumerate(frames) if _function(f) in DATASET_CALLS), None)
        j = d + 1 if d is not None else INNERMOST
    inner = frames[:j] or frames[:1]
    mine = next((f for f in inner if f in own and not f.startswith("profiling/")), None)
    return mine or next((f for f in inner if not any(w in f for w in IDLE_FRAMES)), None)


def _function(label):
    """The function of a sampler label `file:line function`."""
    return label.rsplit(" ", 1)[-1]


def _work_lines(tl, gaps, spans):
    """[(label, share)] of the per-sample work the host samples show inside the loader's spans (else inside the
    loader's gaps), most sampled first; [] without samples."""
    host = tl.meta.get("host_samples") or {}
    stacks = host.get("stacks") or []
    if not stacks:
        return []
    own = own_labels(tl)
    where = [(tl.step_of(a), a, b) for a, b, _ in spans] or [(g.step, g.start, g.end) for g in gaps]
    ids = [sid for k, a, b in where if k is not None for sid in tl.samples_between(k, a, b) if 0 <= sid < len(stacks)]
    counts = Counter(_work(stacks[sid], own) for sid in ids)
    waits = counts.pop(None, 0)
    total = sum(counts.values()) + waits
    return [(label, c / total) for label, c in counts.most_common(2)] if total else []


def _samples_text(tl, gaps, spans):
    lines = _work_lines(tl, gaps, spans)
    if not lines:
        return ""
    texts = (tl.meta.get("host_samples") or {}).get("lines") or {}
    return "; the host samples inside it: " + ", ".join(
        f"{label} ({100 * share:.0f}%)" + (f" `{texts[label]}`" if label in texts else "") for label, share in lines)


def _stacks_text(tl, ctx):
    if own_idle(tl, ctx):
        return ""
    return ("; recorded with Python stacks (with_stack=True), which slow the host's Python, the Dataset's and the "
            "collate's too: the idle may be inflated (give --unprofiled-ms to scale it)")


# ---------------------------------------------------------------------------------------------------------
# The fix, in the user's terms
# ---------------------------------------------------------------------------------------------------------

def fix(workers, framework, lines, device=True, cores=None):
    """The remedy: worker processes where the batch is made in the training thread; where workers already load,
    more of them or cheaper per-sample work. Either keeps the batches the model sees. `device` False: a CPU run
    (no pinned memory, no copy to overlap). `cores`: the cores the process may run on, where recorded: workers
    are never advised past them less the training thread's (more compete with it and slow the step)."""
    work = (f" (here {lines[0][0]}, {100 * lines[0][1]:.0f}% of the samples)" if lines else "")
    cheaper = ("make the per-sample work cheaper" + work + " (decode once and cache, smaller stored images)"
               + (" or move it to the GPU (batched transforms on CUDA tensors, e.g. torchvision.transforms.v2 after "
                  ".to(device))" if device else ""))
    if framework == "transformers":
        knobs = ("TrainingArguments(dataloader_num_workers=N, dataloader_persistent_workers=True, "
                 "dataloader_prefetch_factor=2" + (", dataloader_pin_memory=True)" if device else ")"))
    else:
        knobs = ("DataLoader(..., num_workers=N, persistent_workers=True, prefetch_factor=2"
                 + (", pin_memory=True)" if device else ")")
                 + (" in the train_dataloader() your LightningModule or DataModule returns"
                    if framework == "lightning" else "") + (", then .to(device, non_blocking=True)" if device else ""))
    ahead = "ahead of the GPU" if device else "beside the training step, on cores its operators leave free"
    spare = cores - 1 if cores else None  # the training thread keeps one
    if spare is not None and spare < 2:
        return (f"this process may run on {cores} core{'s' if cores > 1 else ''}, none spare for "
                + ("more workers (they would compete with the training thread)" if workers else "worker processes")
                + f": {cheaper}")
    cap = (f"N at most {spare} (this process may run on {cores} cores, one the training thread's; workers past the "
           "spare cores compete with it and slow the step), fewer where other processes use them" if spare else
           "N no more than the CPU cores you can spare (the host's cores less the training thread's; workers past "
           "them compete with it and slow the step)")
    if workers:
        return (f"the workers cannot keep up (the main thread waits on their queue): more of them, {knobs} with "
                f"{cap}; if the cores are already busy, {cheaper}")
    return (f"load batches in worker processes, {ahead}: {knobs}, "
            + (cap if spare else "N about the CPU cores you can spare (4-8 is typical, never more than the host's "
               "cores less one for the training thread)")
            + f"; if the workers then cannot keep up, {cheaper}")


# ---------------------------------------------------------------------------------------------------------
# CPU traces: the training thread's own time in the loader
# ---------------------------------------------------------------------------------------------------------

def cpu_input_bound(ix, step_ms):
    """The finding of a CPU trace (no GPU idle): the step's time inside the DataLoader's next-batch spans on the
    training thread, what workers would take off it (on cores the compute does not use), or None under
    FIRE_SHARE of the step or without spans."""
    starts = [s[0] for s in ix.steps]
    marks = [m for m in ix.loader if find(ix.steps, starts, m["ts"]) is not None]
    n = len(ix.steps)
    if not marks or not n or step_ms <= 0:
        return None
    ms = sum(m["dur"] for m in marks) / n / 1e3
    if ms < FIRE_SHARE * step_ms:
        return None
    name = Counter(str(m.get("name", "")) for m in marks).most_common(1)[0][0]
    workers = True if WORKERS in name else False if SINGLE in name else None
    ctx = {"step": step_ms}
    evidence = (f"a CPU trace, no GPU to idle: the training thread spent {ms:.1f} ms/step "
                f"({100 * ms / step_ms:.0f}% of the step) in the DataLoader's next batch (`{name}`, "
                f"{len(marks) / n:g} calls/step)"
                + (", waiting on the workers' queue" if workers else
                   ", making it itself (num_workers=0)" if workers is False else "")
                + ("; gain: that wait, with workers that keep up" if workers else
                   "; gain: that time, where workers run on cores the model's operators leave free"))
    return finding(KIND, ms, ctx, evidence, fix(workers, None, [], device=False))
