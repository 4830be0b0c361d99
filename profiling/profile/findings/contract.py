"""Pure: the one shape every finding rule has, and the evidence it may need. No torch.

A rule is a function `match(tl, ctx, found) -> finding or None`, declared with `@rule(kind, needs=...)`:

- `needs`: the evidence it cannot do without (EVIDENCE names). When a trace lacks one, the rule is skipped
  and the skip is listed (`skipped`: the rule, what was missing); it never guesses a cause in its place.
- `match`: reads the trace's events through the Timeline (profiling/profile/trace/timeline.py) and what the live run
  recorded (`tl.meta`), never train.py's source. It sees the findings earlier rules returned (`found`) and
  the GPU idle they claimed (`Gap.cause`): no two findings claim the same gap.
- kernels: a rule that prices device events declares them with `claim(ctx, events)`: later rules that read
  `ctx["claimed"]` skip them (attention as matmuls is not also float32 GEMMs), and the ledger (ledger.py)
  cuts the gain of a finding whose kernels a larger one prices. `run` attaches what each finding prices
  (`_kernels`; `_gaps`, the gaps its rule gave a cause) for the ledger.
- a finding: {kind, ms_per_step, pct_of_step, evidence, fix}; its `ms_per_step` is what applying its fix
  would save, so a rule that cannot name a fix that recovers the time reports under `unknown` instead
  (`ctx["unknown"]`: the rule, the evidence it lacked, the ms/step it leaves unexplained; `unpriced` where the
  cause is known but no fix measured to pay, as the CPU's eager chains).

Rules run in the explicit order of profiling/profile/findings/__init__.py (root causes before what they
expose), and the findings come out costliest first.
"""

import bisect
import math

from profiling.profile.trace.timeline import COMPILED
from profiling.profile.trace.traceio import has_shapes

# What a rule may need, and how a trace shows it (`evidence()` decides, once per trace).
EVIDENCE = {
    "device": "device (GPU) events: kernels, copies, sets",
    "host_samples": "the live run's Python stack samples of the main thread (profiling/profile/capture/sampler.py)",
    "sync_lines": "the Python lines of the host syncs, from CUDA's sync debug mode (a live capture's)",
    "unprofiled": "the unprofiled step time, measured before the profiled window",
    "own_idle": "GPU idle that is the script's own: an unprofiled step time to scale it to, or a trace recorded "
                "without torch's Python stacks (with_stack slows the host)",
    "shapes": "operator input shapes and dtypes (record_shapes=True)",
    "settings": "the process's settings, recorded by a live capture (profiling/profile/trace/settings.py)",
    "peak": "the device's peak FLOP/s (a known GPU)",
    "bounds": "each kernel's least time (profiling/profile/tables/bound.py: a known GPU's peaks and shapes)",
    "regions": "the model's parameters (the regions table: forward and backward GEMM FLOPs per region)",
    "parameters": "the model's parameter shapes, recorded by a live capture",
    "reference": "another profile to compare with (the best kept run's, --previous, --against)",
    "ranks": "one trace per rank of a several-process run",
}


def rule(kind, needs=("device",)):
    """Declare a rule: its finding's kind and the evidence it needs (EVIDENCE's names)."""
    unknown = set(needs) - set(EVIDENCE)
    if unknown:
        raise ValueError(f"rule {kind}: unknown evidence {sorted(unknown)}; known: {sorted(EVIDENCE)}")

    def wrap(match):
        match.kind, match.needs = kind, tuple(needs)
        return match
    return wrap


def evidence(tl, ctx):
    """The EVIDENCE names this trace has."""
    meta = tl.meta
    have = {"device"}
    host = meta.get("host_samples") or {}
    if host.get("stacks"):
        have.add("host_samples")
    if isinstance(meta.get("syncs"), list):  # an empty list is a record: no sync made from Python
        have.add("sync_lines")
    if isinstance(ctx.get("unprofiled"), (int, float)) and ctx["unprofiled"] > 0:
        have.add("unprofiled")
    if "unprofiled" in have or not ctx.get("stacks"):
        have.add("own_idle")
    if has_shapes(tl.ix.cpu_ops):
        have.add("shapes")
    if isinstance(meta.get("settings"), dict) and meta["settings"]:
        have.add("settings")
    if ctx.get("peak"):
        have.add("peak")
    if getattr(tl, "bounds", None):
        have.add("bounds")
    if ctx.get("regions") and meta.get("parameters"):  # GEMMs are placed in regions by the parameters' shapes
        have.add("regions")
    if meta.get("parameters"):
        have.add("parameters")
    return have


def run(rules, tl, ctx):
    """Each rule in order whose evidence the trace has: (findings, skipped [{rule, missing}])."""
    if "evidence" not in ctx:  # once per trace, whatever the number of runs
        ctx["evidence"] = evidence(tl, ctx)
    have, found, skipped = ctx["evidence"], [], []
    for r in rules:
        missing = [n for n in r.needs if n not in have]
        if missing:
            skipped.append({"rule": r.kind, "missing": missing})
            continue
        ctx["pricing"], before = {}, set(ctx.setdefault("claimed", set()))
        open_gaps = [g for g in tl.gaps if g.cause is None]
        f = r(tl, ctx, found)
        if f:
            f["_kernels"] = _priced(tl, ctx, before)
            f["_gaps"] = {id(g): g.us for g in open_gaps if g.cause is not None}
            found.append(f)
    return found, skipped


def claim(ctx, events):
    """Declare the device events a rule prices: later rules skip them (`ctx["claimed"]`), and the ledger
    knows what the finding prices (profiling/profile/findings/ledger.py)."""
    for e in events:
        ctx.setdefault("claimed", set()).add(id(e))
        ctx.setdefault("pricing", {})[id(e)] = e["dur"]


def _priced(tl, ctx, before):
    """{event id: device us} a rule priced: what it declared with claim(), and what it added to
    `ctx["claimed"]` by hand."""
    priced = dict(ctx.get("pricing") or {})
    added = ctx["claimed"] - before - set(priced)
    if added:
        for evs in tl.per_step:
            for e, _ in evs:
                if id(e) in added:
                    priced[id(e)] = e["dur"]
    return priced


def finding(kind, ms, ctx, evidence, fix):
    return {"kind": kind, "ms_per_step": round(ms, 2), "pct_of_step": round(100 * ms / ctx["step"], 1),
            "evidence": evidence, "fix": fix}


def unknown(ctx, kind, missing, ms, what, priced=True, experiment=False):
    """Record time a rule saw but could not explain: the rule, the evidence that would tell, the ms/step.
    priced=False: time the rule explains but whose fix no measurement shows to pay (the CPU's eager chains:
    compiling measured slower there), so no finding prices it (`"unpriced": true`, "not priced:" in the report).
    experiment=True: time the rule explains whose only remedy changes what the model computes (dropout): ms is
    what that remedy could recover at most, an experiment to judge by its loss, never a fix (`"experiment":
    true`, "experiment:" in the report)."""
    flags = {"experiment": True} if experiment else {} if priced else {"unpriced": True}
    ctx.setdefault("unknown", []).append({"rule": kind, "missing": missing, "ms_per_step": round(ms, 2),
                                          "what": what, **flags})


def idle_ms(gaps, ctx):
    """ms/step of GPU idle in these gaps, scaled to the unprofiled run when the profiler inflated it."""
    return sum(g.us for g in gaps) / ctx["n"] / 1e3 * ctx["scale"]


def following(tl, ctx, gaps, need):
    """([gaps], ms/step): where a line's host time is more than the idle it holds (the GPU was still running earlier
    work as it began), the rest of that time delays every launch after it, and the GPU idles later in the step
    for it: the unclaimed gaps after the line's own in each step, up to the host's next sync (which waits for the
    GPU whoever was late), taken in time order until they hold `need` ms/step."""
    if need < 0.05 or not gaps:
        return [], 0.0
    want = need * 1e3 / ctx["scale"] if ctx["scale"] else 0.0
    sync_starts = [e["ts"] for e, _ in tl.syncs]
    last = {}
    for g in gaps:
        last[g.step] = max(last.get(g.step, 0.0), g.end)
    out, seen, got = [], {id(g) for g in gaps}, 0.0
    for k, after in last.items():
        taken = 0.0
        # the rest of this step, then (no sync between) the next step's start; the last profiled step's delay
        # feeds a step after the window, taken as the first's (the steps are alike)
        for step, start in ((k, after), ((k + 1) % ctx["n"], tl.windows[(k + 1) % ctx["n"]][0])):
            i = bisect.bisect_left(sync_starts, start)
            until = sync_starts[i] if i < len(sync_starts) else float("inf")
            for g in sorted((g for g in tl.gaps if g.step == step and g.cause is None and start <= g.start < until
                             and id(g) not in seen), key=lambda g: g.start):
                if taken >= want:
                    break
                if g.us > want - taken:
                    continue  # a gap is claimed whole: one longer than what is left would claim more than is priced
                out.append(g)
                seen.add(id(g))
                taken += g.us
            if taken >= want or until < tl.windows[step][1]:
                break  # enough, or a sync: the host waited for the GPU there, whoever was late
        got += min(taken, want)
    return out, got / ctx["n"] / 1e3 * ctx["scale"]


def scaled(ctx):
    """The evidence's note on that scale, or ""."""
    return "" if round(ctx["scale"], 2) == 1.0 else f" (x{ctx['scale']:.2f}: the unprofiled run's share of the idle)"


def made_by(chain, none="?"):
    """Who launched a kernel or made a CUDA call, readably: the outermost aten operator around it, else the
    compiled graph it ran in, else the innermost operator, else `none` (a direct call such as
    torch.cuda.synchronize())."""
    aten = [c for c in chain if c.startswith("aten::")]
    if aten:
        return aten[-1]
    if any(c.startswith("CompiledFunctionBackward") for c in chain):
        return "the compiled backward"
    if any(c.startswith(COMPILED) for c in chain):
        return "a compiled graph"
    return chain[0] if chain else none


def trainer_is_train_py(meta):
    """Whether the trace is of this repository's train.py (its runner says so; older traces of it carry
    `micro_batches`, which the public API never writes): only then may a fix name train.py's own knobs."""
    trainer = meta.get("trainer")
    return trainer == "train.py" if trainer is not None else "micro_batches" in meta


def training(tl):
    """Whether the trace shows training: a backward (autograd's evaluate_function nodes, a compiled backward) or
    an optimizer step. An inference run (a forward, generation) gets no training advice: no GradScaler, no
    gradient buckets, no activation checkpointing (memoized on the timeline)."""
    known = getattr(tl, "_training", None)
    if known is None:
        known = bool(getattr(tl.ix, "optimizer", None)) or any(
            "Backward" in str(op.get("name", "")) or str(op.get("name", "")).startswith("autograd::engine")
            for op in tl.ix.cpu_ops)
        tl._training = known
    return known


def capped(rate, peak):
    """A rate quoted in words, never above the device's peak for its number format (a rate above it means the
    FLOPs counted overstate the work): (rate, note)."""
    if peak and rate and rate > peak:
        return peak, " (capped at the device's peak for this format: the FLOPs counted overstate the work)"
    return rate, ""


def ancestors(tl, op):
    """An operator and those around it, innermost first."""
    while op is not None:
        yield op
        op = tl.parent.get(id(op))


def top(counts, k=3):
    """The k largest (key, value) pairs of a dict."""
    return sorted(counts.items(), key=lambda kv: -kv[1])[:k]


def device_share(tl, events, ctx, fraction=1.0):
    """The share of a gain on these device events the step would keep (limited_share), the gain `fraction` of their
    time: before a sync, at most what the host waited in it (Timeline.device_limited)."""
    (limited, limits), us, hidden, alone_by = tl.device_limited, 0.0, 0.0, {}
    for e in events:
        alone, group = limited.get(id(e), (e["dur"], None))
        us, hidden = us + e["dur"], hidden + e["dur"] - alone
        alone_by[group] = alone_by.get(group, 0.0) + alone
    fraction = max(fraction, 1e-9)
    lost = sum(min(a, limits.get(g, math.inf) / fraction) for g, a in alone_by.items())
    return limited_share(lost, hidden, us, ctx)


def limited_share(lost, hidden, us, ctx):
    """The share of `us` of device time the step would lose were it gone (Timeline.device_limited): `lost`, the part
    no other stream's work hid (`hidden`) while the device was the step's limit; the rest of the unhidden part was
    followed by the GPU waiting for the host (its launches, or the host past what it waited in a sync), so it is
    lost only as far as that idle is the profiler's:
    where the unprofiled step shows the profiler made most of the idle (ctx's scale), the host keeps up without it
    (Lightning's compiled GPT-2 on the H100: 38% idle profiled, 5% unprofiled; its eager loss compiled saved 6.5 ms
    of the 5.2 claimed)."""
    waited = us - hidden - lost
    return (lost + waited * (1.0 - ctx.get("scale", 1.0))) / us if us else 0.0


LIMITED_NOTE_BELOW = 0.95  # a share of device time the step would lose worth saying: under 95% of it


def limited_note(share):
    """The evidence's words on the share of the kernels' time the step would lose (Timeline.device_limited)."""
    if share >= LIMITED_NOTE_BELOW:
        return ""
    return (f"; the gain counts the {100 * share:.0f}% of their time the step would lose (the rest ran beside other "
            "streams' work, or the GPU next waited for the host's launches: shorter kernels would only lengthen that "
            "wait)")


TRAINERS = (("transformers", ("transformers",), ("transformers/trainer",)),
            ("lightning", ("lightning", "pytorch_lightning"),
             ("lightning/pytorch/loops/", "lightning/pytorch/trainer/", "pytorch_lightning/loops/",
              "pytorch_lightning/trainer/")))


def framework(tl):
    """"transformers", "lightning" or None: the trainer whose settings the fix names (the live capture's record,
    else the host samples' frames of that trainer's own loop: a GPT-2 of transformers trained in a plain loop
    has transformers' model frames, not its Trainer's, and a plain DataLoader to fix; issue #57 item 4)."""
    recorded = str(tl.meta.get("framework") or "")
    frames = {str(f) for s in (tl.meta.get("host_samples") or {}).get("stacks") or () for f in s}
    for name, packages, loops in TRAINERS:
        if recorded.startswith(packages) or any(f.startswith(loops) for f in frames):
            return name
    return None


def compile_ignored(meta):
    """The note for a trace without compiled graphs whose model's Module.compile() was called (api.py's
    `compile_ignored`), or ""."""
    names = meta.get("compile_ignored")
    return (f"; Module.compile() was called on {', '.join(names[:3])}, yet nothing ran compiled: Dynamo skips a "
            "module whose forward is torch's own, so use model = torch.compile(model), or compile a module of your "
            "own class (pytorch/pytorch#150915)") if names else ""
