"""Pure: the findings read from the host's CUDA calls, each only where the GPU idles because of them. Stdlib only.

    found, skipped = contract.run(RULES, tl, ctx)   # ctx: findings.context(tl, summary)

- blocking_launch: launches that wait for their kernel (a blocking launch mode), the GPU idle between kernels;
- alloc_churn: allocations and frees every step (a free waits for the device), the GPU idle in and after them;
- cuda_sync: synchronizing calls and pageable copies no earlier rule tied to a line, the idle after them, and
  the pageable copies' own slowness.
The evidence comes from profiling/profile/tables/cuda_calls.py; a trace whose capture recorded no settings (an older
one, a foreign one) is read the same way: the calls are the evidence. A long call with a busy GPU (the host
waiting for room in a full queue) is back-pressure, never a finding (DESIGN.md pitfall 11).

Each rule claims only GPU idle gaps no earlier rule claimed (`g.cause is None`) and marks those it prices
(g.cause = its kind): run them after host_sync and graph_break (the syncs they tie to a line are theirs) and
before launch_bound and gpu_waits_on_host (which take whatever idle is left), in RULES' order. Each is declared
with the findings contract's `rule(kind, needs)` (profiling/profile/findings/contract.py; NEEDS below).
"""
from bisect import bisect_left, bisect_right
from collections import Counter

from profiling.profile.findings import lines
from profiling.profile.findings.contract import finding, following, idle_ms, made_by, rule, scaled, top
from profiling.profile.findings.idle import own_idle, own_labels, sync_price
from profiling.profile.findings.settings import attribute
from profiling.profile.tables import cuda_calls

FIRE_SHARE = 0.01   # a rule fires when the idle it prices is 1% of the step or more: the report shows no finding
                    # under 1% (render.SHOW_PERCENT), and the clean H100 traces' stray held launches and one-off
                    # allocations stay far under it (tests/profile/test_cuda_calls.py)
HELD_SHARE = 0.5    # launches are blocking when this share of them return after their kernel ends: 79% with
                    # CUDA_LAUNCH_BLOCKING=1 (every launch; memsets return first), at most 3% in the other H100
                    # traces (tiny kernels that outran a slow call on an idle GPU: h100-cudacalls-pageable)
PINNED_GB_S = 25.0  # host<->device rate from pinned memory when the trace has no pinned copy of 1 MB or more to
                    # measure: PCIe 4 x16 (an H100 on PCIe 5 measured 54 GB/s: h100-cudacalls-base); low is modest
MIN_RATE_BYTES = 1 << 20  # pinned copies this large measure the link's rate (small ones are latency)

NEEDS = {   # evidence each rule cannot do without (contract.EVIDENCE's names); host samples only add a line
    "blocking_launch": ("device", "own_idle"),  # device events with their launch calls (correlation ids)
    "alloc_churn": ("device",),   # the allocation/free calls and the GPU idle gaps; with Python stacks and no
                                  # unprofiled step, only the idle while the host was inside them (alloc_churn's doc)
    "cuda_sync": ("device",),   # the sync/copy calls, the copies' device events (`Pageable` in their name); with
                                # Python stacks and no unprofiled step, only what they record (cuda_sync's doc)
}


def _open(gaps):
    """The gaps no earlier rule claimed, each once."""
    return list({id(g): g for g in gaps if g.cause is None}.values())


def _claim(gaps, kind):
    for g in gaps:
        g.cause = kind


# ---------------------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------------------

@rule("blocking_launch", needs=NEEDS["blocking_launch"])
def blocking_launch(tl, ctx, found):
    """Launches that return only after their kernel has run, so the host queues nothing ahead and the GPU idles
    between kernels while the host does its Python: priced by that idle (a queue would hide it)."""
    b = cuda_calls.blocking_launches(tl)
    if not b["queued_per_step"] or b["held_per_step"] < HELD_SHARE * b["queued_per_step"]:
        return None
    gaps = _open(b["gaps"])
    ms = idle_ms(gaps, ctx)
    if ms < FIRE_SHARE * ctx["step"]:
        return None
    _claim(gaps, "blocking_launch")
    names = ", ".join(f"{name} x{count:g}" for name, count in top(b["names"]))
    evidence = (f"{b['held_per_step']:g} of {b['queued_per_step']:g} calls/step that queue GPU work (launches, sets, "
                f"async copies) returned only after their kernel had finished ({names}): the host spent "
                f"{b['ms_per_step']:.1f} ms/step in launch calls, the GPU "
                f"idle between those kernels {ms:.1f} ms/step{scaled(ctx)}; a launch into a busy GPU's queue "
                "returns before its kernel runs")
    return attribute(tl, finding("blocking_launch", ms, ctx, evidence,
                   "make launches asynchronous again: unset CUDA_LAUNCH_BLOCKING (a debugging setting: "
                   "`unset CUDA_LAUNCH_BLOCKING`, or drop it from os.environ before CUDA starts) and run without a "
                   "tool that serializes launches (compute-sanitizer, cuda-gdb)"), "blocking_launches")


@rule("alloc_churn", needs=NEEDS["alloc_churn"])
def alloc_churn(tl, ctx, found):
    """Allocation and free calls in every profiled step: the caching allocator gives memory back and asks again
    (torch.cuda.empty_cache(), caching off); a free waits for the device, so the GPU idles in and after it."""
    if tl.ix.whole:
        return None  # one window, one pass: its allocations cannot be told from a first batch's (no churn seen)
    a = cuda_calls.alloc_churn(tl)
    if not a["calls"] or a["steps_with"] < ctx["n"]:
        return None  # a one-off allocation (a first batch, a pinned buffer) is no churn
    own = own_idle(tl, ctx)
    gaps = _open(a["gaps"]) if own else [g for g in _open(a["gaps"]) if _inside(g, a["calls"])]
    # the idle while the host was inside the calls is the driver's time, which the profiler does not lengthen:
    # not scaled to the unprofiled run as launch-paced idle is
    raw = sum(g.us for g in gaps) / ctx["n"] / 1e3
    inside = min(a["idle_inside_ms"], raw)
    ms = inside + (raw - inside) * ctx["scale"] if own else min(idle_ms(gaps, ctx), a["idle_inside_ms"])
    if ms < FIRE_SHARE * ctx["step"]:
        return None
    # an allocation's host time while the GPU was still busy with earlier work is lost too: the launches after it
    # wait that much longer, and the GPU idles there for it (a free's time with the GPU busy is its wait for the
    # device, which the idle after it already prices)
    later, extra = following(tl, ctx, gaps, a["busy_inside_ms"]) if own else ([], 0.0)
    _claim(gaps + later, "alloc_churn")
    idle = ms
    ms += extra
    names = ", ".join(f"{name} x{count:g}" for name, count in top(a["names"]))
    made = ", ".join(f"{made_by(chain, 'no operator')} x{count:g}" for chain, count in a["chains"][:2])
    line = _sampled_line(tl, [(e["ts"], e["ts"] + e["dur"], k) for e, k in a["calls"]])
    split = own and inside and round(ctx["scale"], 2) != 1.0
    evidence = (f"{a['calls_per_step']:g} allocation/free calls in every profiled step ({names}), "
                f"{a['ms_per_step']:.1f} ms/step of host time; GPU idle {'in and after' if own else 'in'} them "
                f"{idle:.1f} ms/step" + (f", {inside:.1f} of it while the host was inside them (not scaled: the profiler "
                                         f"does not lengthen these calls), the rest{scaled(ctx)}" if split else scaled(ctx))
                + (f"; the allocations' host time while the GPU was busy delays the launches after them: {extra:.1f} "
                   "ms/step more idle later in the step" if extra >= 0.05 else "")
                + f"; made by {made}" + (f"; at {line}" if line else "")
                + ("" if own else "; recorded with Python stacks (with_stack=True) and no unprofiled step: priced at "
                   "the GPU idle while the host was inside the calls (the stacks do not slow a free), not after them"))
    if _autotuning(tl, a):
        return finding("alloc_churn", ms, ctx, evidence + (
            "; cuDNN benchmark is on and the allocations are the convolutions' own: cudnn.benchmark times every "
            "algorithm (each with a workspace of its own) for each input shape it has not seen, so a new shape every "
            "step searches every step"), "torch.backends.cudnn.benchmark = False where the input shapes change "
            "from step to step (or bucket them: pad to a few fixed sizes, so the search runs once a size)")
    return attribute(tl, finding("alloc_churn", ms, ctx, evidence,
                   "let the caching allocator keep its memory: no torch.cuda.empty_cache() (or other memory "
                   "release) inside the training loop, PYTORCH_NO_CUDA_MEMORY_CACHING unset; if memory is short, "
                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True instead of emptying the cache"), "alloc_churn")


def _autotuning(tl, a):
    """Whether the churn is cuDNN's autotuner: cudnn.benchmark on (the live capture's settings) and most of the
    allocation calls made inside convolutions."""
    values = (tl.meta.get("settings") or {}).get("values") or {}
    if values.get("cudnn.benchmark") is not True:
        return False
    conv = sum(count for chain, count in a["chains"] if "conv" in made_by(chain, "").lower())
    return 2 * conv > sum(count for _, count in a["chains"])


@rule("cuda_sync", needs=NEEDS["cuda_sync"])
def cuda_sync(tl, ctx, found):
    """Synchronizing calls (torch.cuda.synchronize(), a non-Async copy) and pageable copies that no earlier rule
    explained: the GPU idle from the call to the end of its step (the queue drained), and for pageable copies
    their own time over what pinned memory would take. Where host_sync has spoken, the syncs are its (it tied
    them to a line or an operator and priced what they exposed): only the pageable copies are left here. In a
    trace whose idle may be the profiler's (Python stacks, no unprofiled step), what is recorded still counts:
    the copies' device time, and the syncs' own gaps at most the host's wait in them (idle.sync_price)."""
    own = own_idle(tl, ctx)
    synced = any(g.cause == "host_sync" for g in tl.gaps)  # host_sync's, named as a setting or not
    syncs, copies = [] if synced else cuda_calls.sync_calls(tl), cuda_calls.pageable_copies(tl)
    # those of a line a line rule named (a tensor made on the host, a result read there): its fix removes them
    syncs, copies = ([c for c in calls if not lines.named_line(tl, c["call"])] for calls in (syncs, copies))
    gaps = _open(cuda_calls.drained(tl, syncs + copies) if own else cuda_calls.drained(tl, syncs, to_step_end=False))
    slow = _pageable_excess(tl, copies) / ctx["n"] / 1e3
    waits = [c["call"] for c in (syncs + copies if own else syncs)]  # a pageable copy's call waits as a sync does
    idle, caveat = sync_price(tl, ctx, waits, gaps) if syncs or own else (0.0, "")
    ms = idle + slow
    if not gaps and not slow or ms < FIRE_SHARE * ctx["step"]:
        return None
    _claim(_priced_gaps(gaps, idle, ctx), "cuda_sync")
    parts = [_calls_text(tl, calls, ctx) for calls in (syncs, copies) if calls]
    evidence = ("; ".join(parts) + (f"; GPU idle after them to the end of their step {idle_ms(gaps, ctx):.1f} "
                                    f"ms/step{scaled(ctx)} (the queue drained)" + caveat if own else
                                    (f"; GPU idle in the syncs' own gaps {idle_ms(gaps, ctx):.1f} ms/step" + caveat
                                     if syncs else ""))
                + (f"; the pageable copies take {slow:.1f} ms/step more than pinned memory would" if slow else "")
                + ("; recorded with Python stacks (with_stack=True) and no unprofiled step: the copies' device time is "
                   "priced, not the idle after them (it may be the profiler's own)" if copies and not own else ""))
    fixes = []
    if copies and _pinning_matters(copies, slow, ctx):
        fixes.append("copy from pinned host memory (pin_memory=True on the host tensor or the DataLoader, then "
                     ".to(device, non_blocking=True)): a pageable copy blocks the host and runs slower")
    if syncs or not fixes:
        fixes.append("take the synchronizing call out of the step (torch.cuda.synchronize(), .item(), .cpu(), a "
                     "blocking copy), or make it once per step after the next step is launched")
    return finding("cuda_sync", ms, ctx, evidence, "; ".join(fixes))


def _priced_gaps(gaps, ms, ctx):
    """The gaps a price of `ms` ms/step covers, earliest first: where the syncs are priced at the host's wait in
    them, the rest of their drained idle is the host's own pace (its dispatch after the sync), left open for the
    rules that price that (launch_bound, gpu_waits_on_host), not claimed and priced by no one."""
    out, left = [], ms * ctx["n"] * 1e3 / ctx["scale"] if ctx["scale"] else 0.0
    for g in sorted(gaps, key=lambda g: g.start):
        if left <= 0:
            break
        out.append(g)
        left -= g.us
    return out


def _pinning_matters(copies, slow, ctx):
    """Whether pinned memory would change these pageable copies: they take FIRE_SHARE of the step more than pinned
    copies would, or move MIN_RATE_BYTES or more a copy (a link's rate, not its latency). Copies of a few bytes
    (`.item()`'s DtoH, a 704-byte index) wait for the queue ahead as any sync does: pinning saves nothing there."""
    sizes = [c["bytes"] for c in copies if isinstance(c.get("bytes"), (int, float))]
    return slow >= FIRE_SHARE * ctx["step"] or bool(sizes) and sum(sizes) / len(sizes) >= MIN_RATE_BYTES


def _inside(gap, calls):
    """Whether a gap begins while the host is inside one of these calls [(call, step)]."""
    return any(e["ts"] <= gap.start <= e["ts"] + e["dur"] for e, _ in calls)


RULES = (blocking_launch, alloc_churn, cuda_sync)


# ---------------------------------------------------------------------------------------------------------
# Evidence text
# ---------------------------------------------------------------------------------------------------------

def _calls_text(tl, calls, ctx):
    """`2 synchronizing calls/step (cudaDeviceSynchronize x2) made by no operator at train.py:412 `...``."""
    pageable = "direction" in calls[0]
    n = ctx["n"]
    names = Counter(c["direction"] if pageable else c["name"] for c in calls)
    made = Counter(made_by(c["chain"], "no operator") for c in calls)
    sizes = [c["bytes"] for c in calls if pageable and isinstance(c.get("bytes"), (int, float))]
    line = _sampled_line(tl, [(c["call"]["ts"], c["call"]["ts"] + c["call"]["dur"], c["step"]) for c in calls])
    return (f"{len(calls) / n:g} {'pageable copies' if pageable else 'synchronizing calls'}/step ("
            + ", ".join(f"{name} x{count / n:g}" for name, count in top(names)) + ")"
            + (f" of {sum(sizes) / len(sizes) / 2**20:.1f} MB on average" if sizes else "")
            + ", made by " + ", ".join(f"{m} x{count / n:g}" for m, count in top(made, 2))
            + (f" at {line}" if line else ""))


def _sampled_line(tl, spans):
    """The project's own line most sampled while the host was inside these calls ((start, end, step) each):
    `train.py:412 `torch.cuda.synchronize()``, or None without host samples."""
    host = tl.meta.get("host_samples") or {}
    stacks, samples = host.get("stacks") or [], host.get("samples") or ()
    if not stacks or not samples:
        return None
    own = own_labels(tl)
    times = sorted((tl.ix.steps[k][0] + us, sid) for k, us, sid in samples if 0 <= k < len(tl.ix.steps))
    at = [t for t, _ in times]
    counts = Counter()
    for start, end, _ in spans:
        for _, sid in times[bisect_left(at, start):bisect_right(at, end)]:
            frames = stacks[sid] if 0 <= sid < len(stacks) else ()
            label = next((f for f in frames if f in own and not f.startswith("profiling/")), None)
            if label:
                counts[label] += 1
    if not counts:
        return None
    label = counts.most_common(1)[0][0]
    text = (host.get("lines") or {}).get(label)
    return f"{label} `{text}`" if text else label


def _pageable_excess(tl, copies):
    """us of device time the pageable copies take over what pinned memory would: their bytes at the rate of
    this trace's pinned copies of MIN_RATE_BYTES or more, else at PINNED_GB_S."""
    pinned = [e for e in cuda_calls.facts(tl).device.values() if "Pinned" in str(e.get("name", ""))
              and isinstance((e.get("args") or {}).get("bytes"), (int, float)) and e["args"]["bytes"] >= MIN_RATE_BYTES]
    rate = (sum(e["args"]["bytes"] for e in pinned) / sum(e["dur"] for e in pinned) if pinned
            else PINNED_GB_S * 1e3)  # bytes per us
    return sum(max(0.0, c["device_us"] - c["bytes"] / rate) for c in copies
               if isinstance(c.get("bytes"), (int, float)))
