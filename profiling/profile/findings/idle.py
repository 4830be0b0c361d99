"""Pure: the GPU waiting on the host: host syncs, graph breaks, a host that cannot launch fast enough, and the
host's other work (what its stack samples show it doing). Stdlib only. Rules: profiling/profile/findings/
contract.py's shape; the GPU idle is split among them once (profiling/profile/findings/__init__.py).
"""
import math
import re
import statistics
from collections import Counter

from profiling.profile.findings import lines, waste
from profiling.profile.findings.contract import (
    claim,
    compile_ignored,
    evidence,
    finding,
    idle_ms,
    made_by,
    rule,
    scaled,
    top,
    trainer_is_train_py,
    unknown,
)
from profiling.profile.findings.settings import attribute
from profiling.profile.tables import cuda_calls
from profiling.profile.trace.classify import short_name
from profiling.profile.trace.timeline import COMPILED, LAUNCH_CALLS

STEP_TOLERANCE = 0.03      # profiled vs unprofiled step time (as the summary's check)
FIRE_SHARE = 0.01          # a finding priced from a with_stack trace's recorded syncs is left out under 1% of the
                           # step (the report shows none under it), its gaps left to `unknown`
LONG_GAP_US = 200.0        # idle gaps this long are the host doing something else, not launch latency
FRAGMENT_GAP_US = 2000.0   # idle between fragments is a resume's Python; longer gaps (the loader: 20-55 ms
                           # in the H100 plants) are not the graph break's
LAUNCH_HOST_US = 10.0      # host cost of one kernel launch from Python (~5 us CUDA + the wrapper), for deciding
LAUNCH_SHARE = 0.25        # launch_bound when launches x LAUNCH_HOST_US exceed this share of device busy time
PINNED_MATTERS_BYTES = 1 << 20  # an upload this large a copy is the link's rate, which pinning raises; smaller ones
                                # are latency: a 704-byte pageable copy waits for the queue as any sync does
SYNC_NOISE = ("torch/cuda/__init__.py",)   # the sync debug mode's own switch
GENERATED = re.compile(r"(^|/)[a-z0-9]{2}/c[a-z0-9]{40,}\.py:")  # Inductor's output code in its cache (an
                                                                # Inductor cache inside the project is no own code)
GRAPH = ("CompiledFunction", "## Call CompiledFxGraph")  # a compiled graph running (a Torch-Compiled
                                                      # Region also holds the eager Python between graphs)
ENGINE = "autograd::engine::evaluate_function"  # the backward's functions, run by autograd's engine
UNFUSED_OPS = ("aten::embedding",)  # lookups and their scatter-add: the same work in one graph (as are GEMMs,
                                   # attention and custom operators such as kernels.py's)
FIXED_FILES = ("prepare.py", "kernels.py")  # top-level files the agent never edits (with profiling/)


# ---------------------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------------------

def own_idle(tl, ctx):
    """Whether the GPU idle is the script's own (contract.EVIDENCE's own_idle: no Python stacks, or an unprofiled
    step to scale it to); the evidence worked out once, also for a rule called outside contract.run."""
    if "evidence" not in ctx:
        ctx["evidence"] = evidence(tl, ctx)
    return "own_idle" in ctx["evidence"]


def _in_one_call(g):
    """Whether a gap is mostly the launch call that ends it (a launch of 6.5 ms on an MI250: a first launch's
    code load, or the thread descheduled): the call's own time, not host work a drained queue exposed."""
    return g.launch.get("dur", 0) >= g.us / 2


@rule("host_sync", needs=("device",))
def host_sync(tl, ctx, found):
    """Host syncs made in the step, costed by the GPU idle that begins while the host waits and the idle of the
    host work after them that the drained queue no longer hides. In a trace whose idle may be the profiler's
    (Python stacks, no unprofiled step), only the recorded part: the syncs' own gaps, at most the host's wait in
    them (`sync_price`)."""
    # a sync made by an operator (.item(), .cpu()), or by a call the host samples place in the agent's code
    # (torch.cuda.synchronize() has no operator around it); neither: the capture's own sync at the window's edge
    python = {id(e): _sync_line(tl, e) for e, chain in tl.syncs if not chain}
    syncs = [(e, chain) for e, chain in tl.syncs if chain or python[id(e)]]
    if not syncs:
        return None
    mine = {id(e) for e, _ in syncs}
    claimed = []
    for g in tl.gaps:
        hit = tl.sync_at(g) if g.cause is None else None  # an earlier rule's gap (a loader wait, a line's loop) stays
        if hit and id(hit[0]) in mine and g.launch["ts"] >= hit[0]["ts"] + hit[0]["dur"] - 50.0:
            g.cause = "host_sync"
            claimed.append(g)
    exposed = _exposed_gaps(tl, syncs) if own_idle(tl, ctx) else []
    ops = {}
    for e, chain in syncs:
        name = ([c for c in chain if c.startswith("aten::")] or [chain[0]])[-1] if chain else str(e["name"])
        ops[name] = ops.get(name, 0) + 1
    per = ctx["n"] / (tl.meta.get("syncs_steps") or ctx["n"])  # sync lines: one untimed step, or (older) the window
    lines = [dict(s, count=s["count"] * per) for s in tl.meta.get("syncs") or ()
             if not s["where"].startswith(SYNC_NOISE + ("torch/",))]
    texts = (tl.meta.get("host_samples") or {}).get("lines") or {}
    lines += [{"where": line.rsplit(" ", 1)[0], "line": texts.get(line, "?"), "count": count}
              for line, count in Counter(python[id(e)] for e, chain in syncs if not chain).items()]
    where = "; ".join(f"{s['where']} `{s['line']}` ({s['count'] / ctx['n']:g}/step)" for s in lines[:3])
    evidence = (f"{len(syncs) / ctx['n']:g} syncs/step: " + ", ".join(f"{op} x{c / ctx['n']:g}" for op, c in top(ops))
                + f"; GPU idle after them {idle_ms(claimed, ctx):.1f} ms/step{scaled(ctx)}"
                + (f"; at {where}" if where else "") + _exposed(tl, exposed, ctx))
    ms, caveat = sync_price(tl, ctx, [e for e, _ in syncs], claimed + exposed)
    if caveat and ms < FIRE_SHARE * ctx["step"]:  # too small to report: its gaps go to the rules after it
        for g in claimed + exposed:
            g.cause = None
        return None
    evidence += caveat
    compiled = sum(1 for _, chain in syncs if any(c.startswith(GRAPH) for c in chain))
    if compiled >= len(syncs) / 2:  # syncs inside compiled graphs: the compiler put them there
        checks_ms, checks = _check_work(tl, ctx)
        evidence += (f"; {compiled / ctx['n']:g}/step made inside compiled graphs (no Python line of yours)"
                     + _per_kernel(tl, syncs, ctx) + checks)
        return attribute(tl, finding("host_sync", ms + checks_ms, ctx, evidence,
                                     "find what the compiler syncs for: Inductor's debug checks (torch._inductor."
                                     "config.nan_asserts, config.triton.debug_sync_kernel), a value read inside the "
                                     "compiled code (.item() captured with capture_scalar_outputs); turn the check "
                                     "off or move the read out of the model"), "compiled_syncs")
    engine = sum(1 for _, chain in syncs if any(c.startswith(ENGINE) for c in chain))
    if engine >= len(syncs) / 2:  # the backward's own syncs: no line of the user's makes them
        evidence += (f"; {engine / ctx['n']:g}/step made by autograd's engine inside the backward's functions "
                     "(no Python line of yours)")
        return attribute(tl, finding("host_sync", ms, ctx, evidence,
                                     "find what makes the backward sync: autograd anomaly detection "
                                     "(torch.autograd.set_detect_anomaly), a backward hook or custom backward "
                                     "that reads a tensor's value; turn it off or keep the value on the GPU"),
                         "backward_syncs")
    # the operators that copy to the GPU from pageable memory (the host waits in them: .to(device) of a tensor
    # not pinned); a sync made inside one of them is that copy's
    uploads = {id(tl.enclosing(c["call"])): c.get("bytes") or 0 for c in cuda_calls.pageable_copies(tl)
               if "HtoD" in c["direction"]}
    uploads.pop(id(None), None)
    sizes = [uploads[id(tl.enclosing(e))] for e, _ in syncs if id(tl.enclosing(e)) in uploads]
    if len(sizes) >= len(syncs) / 2 and sum(sizes) / len(sizes) >= PINNED_MATTERS_BYTES:
        evidence += "; they are copies to the GPU from pageable host memory (the host waits in them)"
        return finding("host_sync", ms, ctx, evidence,
                       "copy the inputs from pinned host memory without waiting: pin_memory=True on the "
                       "DataLoader (or .pin_memory() on the host tensor), then .to(device, non_blocking=True)")
    return finding("host_sync", ms, ctx, evidence,
                    "keep values on the GPU inside the step (no .item(), `if tensor:`, .cpu() or print of a "
                    "tensor); read them once per step after the next step is launched"
                    + (", as train.py's loop does" if trainer_is_train_py(tl.meta) else ""))


def _exposed_gaps(tl, syncs):
    """The gaps a sync exposed (root cause first: it drained the queue that hid the host's work after it): the
    long gaps of its step and the next, every gap of LONG_GAP_US or more of its own step, still unclaimed; each
    is given host_sync as its cause."""
    first_end = {}  # step -> the end of its first sync to end
    for e, _ in syncs:
        j = tl.step_of(e["ts"])
        first_end[j] = min(first_end.get(j, math.inf), e["ts"] + e["dur"])
    exposed = []
    for g in tl.gaps:
        k = tl.step_of(g.launch["ts"])
        if k is None:  # launched outside the steps (in an iteration the window's end cut, left out)
            continue
        after = first_end.get(k, math.inf), first_end.get(k - 1, math.inf)
        if g.cause is None and not _in_one_call(g) and (
                g.us >= LONG_GAP_US and after[0] <= g.start or g.us >= FRAGMENT_GAP_US and min(after) <= g.start):
            g.cause = "host_sync"
            exposed.append(g)
    return exposed


def sync_price(tl, ctx, calls, gaps):
    """(ms/step, evidence note) of syncs that leave these gaps: at most the host's wait in them while the GPU ran
    the work they wait for. Without the syncs the host's later work would run beside that GPU work (the queue the
    sync drained), so the gain is the lesser of the idle and that wait: a host slower than its GPU after the sync
    (a tiny model's autograd dispatch) keeps its pace without it. A wait with the GPU idle (a copy waiting on
    another process or stream: 139 ms inside one 704-byte copy of an A100 DLRM) proves nothing. In a trace
    recorded with Python stacks and no unprofiled step the idle is inflated too, but the wait is GPU time the
    stacks do not slow (4,096 `.cpu()` round trips price so, not as unknown)."""
    idle = idle_ms(gaps, ctx)
    f = cuda_calls.facts(tl)
    wait = sum(b - a - f.idle_in(a, b) for a, b in (_on_device_timeline(tl, e) for e in calls)) / ctx["n"] / 1e3
    each = wait * ctx["n"] / max(1, len(calls))  # ms a call
    waited = (f"; the host waited in them {wait:.1f} ms/step while the GPU ran the work they wait for ("
              + (f"{each:.1f} ms" if each >= 1 else f"{1e3 * each:.0f} us") + " a call)")
    if own_idle(tl, ctx):
        return min(idle, wait), "" if wait >= idle else (
            waited + f": without them the host's later work would overlap only that much GPU work, so the gain is "
            f"at most that wait, {wait:.1f} ms/step (the rest of the idle is the host's own pace)")
    return min(idle, wait), (
        waited + "; recorded with Python stacks (with_stack=True), which slow the host's Python, so the idle after "
        f"each sync may be inflated: priced at the lesser of that idle and that wait, {min(idle, wait):.1f} ms/step "
        "(give --unprofiled-ms to price the idle)")


def _on_device_timeline(tl, e):
    """(start, end) of a call within its step's window on the device timeline, where the trace tells what the GPU
    did ((0, 0) outside): a 40 ms pageable copy begun 36 ms before the window's first kernel (a V100 ResNet-50
    profiled from its fifth step) waited on nothing the trace shows."""
    k = tl.step_of(e["ts"])
    if k is None or k >= len(tl.windows):
        return 0.0, 0.0
    start, end = max(e["ts"], tl.windows[k][0]), min(e["ts"] + e["dur"], tl.windows[k][1])
    return (start, end) if end > start else (0.0, 0.0)


def _per_kernel(tl, syncs, ctx):
    """Evidence for syncs the compiled code makes: how many per kernel it launches (a debug setting that syncs
    after every kernel makes about one each; a value read inside the graph, a few per graph)."""
    inside = sum(1 for _, chain in syncs if any(c.startswith(COMPILED) for c in chain))
    kernels = sum(1 for evs in tl.per_step for _, launch in evs
                  if any(c.startswith(COMPILED) for c in tl.chain(tl.op_of(launch))))
    if not kernels or not inside:
        return ""
    ratio = inside / kernels
    return (f"; {ratio:.2f} syncs per kernel the compiled code launches ({inside / ctx['n']:g} syncs, "
            f"{kernels / ctx['n']:g} kernels/step)" + ("; the GPU idles between its kernels" if ratio >= 0.5 else ""))


def _check_work(tl, ctx):
    """(ms/step, evidence) of the device time of the tests whose booleans the compiled code's syncs read
    (Timeline.checks: isnan, isinf, any... called by the compiled code itself): work that goes with the syncs."""
    ops = Counter()
    for e, op in tl.checks:
        ops[op] += e["dur"]
    if not ops:
        return 0.0, ""
    claim(ctx, [e for e, _ in tl.checks])
    ms = sum(ops.values()) / ctx["n"] / 1e3
    return ms, ("; the tests whose result they read, called by the compiled code itself, take "
                + ", ".join(f"{op} {us / ctx['n'] / 1e3:.1f}" for op, us in top(ops)) + f" ms/step of device time "
                f"({ms:.1f} ms/step, counted here: they go with the syncs)")


def _sync_line(tl, e):
    """The agent's line the host samples show blocked in sync call e, or None (no samples, or the profiler's)."""
    line = _line_between(tl, tl.step_of(e["ts"]), e["ts"], e["ts"] + e["dur"])
    return line if line and line in own_labels(tl) and not line.startswith(("profiling/", "prepare.py")) else None


def _exposed(tl, gaps, ctx):
    """Evidence for the idle a sync exposed later in its step: the host work the drained queue no longer hid."""
    if not gaps:
        return ""
    lines = {}
    for g in gaps:
        line = _host_line(tl, g) or "no host sample"
        lines[line] = lines.get(line, 0.0) + g.us
    texts = (tl.meta.get("host_samples") or {}).get("lines") or {}
    host = ", ".join(f"{line}" + (f" `{texts[line]}`" if line in texts else "") for line, _ in top(lines, 2))
    return (f"; with the queue drained, the host's later work in the step showed as GPU idle too: "
            f"{idle_ms(gaps, ctx):.1f} ms/step, the host then in {host} (counted here, the root cause)")


@rule("graph_break", needs=("device", "own_idle"))
def graph_break(tl, ctx, found):
    """More compiled regions per micro-batch than one: the eager elementwise kernels a single graph would fuse
    away, and the idle between the fragments."""
    counts = [len(r) for r in tl.regions]
    if not counts or not max(counts):
        return None
    frames = {f for r in tl.regions for _, f in r}
    mb = ctx["micro_batches"] or max(counts) // len(frames)  # old traces: each fragment runs once a micro-batch
    per_mb = max(counts) / max(1, mb)
    if per_mb <= 1:
        return None
    eager_us, eager_ops, idle, eager, claimed = 0.0, {}, [], [], ctx["claimed"]
    for k, evs in enumerate(tl.per_step):
        for (e, launch), cat in zip(evs, tl.labels[k]):
            if cat != "other compute":
                continue  # GEMMs and attention kernels run as long in one graph: only the fusion is lost
            chain = tl.chain(tl.op_of(launch))
            op = made_by(chain) if chain and not any(c.startswith(COMPILED) for c in chain) else None
            if op and op.startswith("aten::") and not op.startswith(UNFUSED_OPS) and id(e) not in claimed:
                eager_us += e["dur"]
                eager_ops[op] = eager_ops.get(op, 0.0) + e["dur"]
                eager.append(e)
    for g in tl.gaps:
        if g.cause is None and g.us < FRAGMENT_GAP_US and _between_fragments(tl, g):
            g.cause = "graph_break"
            idle.append(g)
    claim(ctx, eager)
    eager = eager_us / ctx["n"] / 1e3
    dynamo = tl.meta.get("dynamo") or {}
    reasons = "; ".join(f"{r['reason']} x{r['count']}" for r in dynamo.get("graph_breaks", [])[:2])
    resumes = ", ".join(name.replace("torch_dynamo_resume_in_", "").replace("_at_", " at line ")
                        for name in list(dynamo.get("resumes", {}))[:3])
    lines = _break_lines(tl.meta.get("provenance"))
    evidence = (f"{per_mb:g} compiled regions per micro-batch (1 expected); eager elementwise kernels between them "
                f"{eager:.1f} ms/step (" + ", ".join(f"{op} {us / ctx['n'] / 1e3:.1f} ms" for op, us in top(eager_ops))
                + f"), GPU idle between them {idle_ms(idle, ctx):.1f} ms/step"
                + (f"; dynamo: {reasons}" if reasons else "")
                + (f"; breaks at {', '.join(lines[:3])}" if lines else f"; resumes in {resumes}" if resumes else "")
                + "; gain: those kernels fused away (GEMMs, attention, lookups and custom operators run the same in "
                "one graph), and the idle")
    return finding("graph_break", eager + idle_ms(idle, ctx), ctx, evidence, _break_fix(lines, reasons))


def _break_fix(lines, reasons):
    """The edit: the explicit `graph_break()` call itself where the evidence names one (deleting it changes no
    result: it only splits the graph), else what usually breaks a graph."""
    explicit = [line for line in lines if "graph_break(" in line]
    if explicit or "graph_break()" in reasons:
        where = f" at {explicit[0].split(' `')[0]}" if explicit else ""
        return (f"delete the explicit `torch._dynamo.graph_break()` call{where}: it splits the graph on purpose, and "
                "the model computes the same without it")
    return ("keep the model one graph: no data-dependent Python branch, .item(), print, torch.compiler.disable or "
            "non-torch call inside forward (check such things once per step, outside the model)")


def _break_lines(record):
    """`train.py:439 `if x.isnan().any():`` per graph break the compile recorded (profiling/profile/capture/provenance.py: the
    innermost frame of the project's own files), most frequent first; [] when the trace has no such record."""
    record = record if isinstance(record, dict) else {}
    frames, stacks, out = record.get("frames") or [], record.get("stacks") or [], []
    for sid, count in sorted(record.get("breaks") or [], key=lambda b: -b[1]):
        own = [frames[i] for i in (stacks[sid] if 0 <= sid < len(stacks) else []) if 0 <= i < len(frames)]
        own = [f for f in own if f[4]]
        if own:
            out.append(f"{own[0][0]}:{own[0][1]} `{own[0][3]}`" + (f" x{count}" if count > 1 else ""))
    return out


def _between_fragments(tl, g):
    """True when the kernel ending gap g was launched by the main thread outside compiled code (model ops
    run eagerly between two fragments), not by a copy."""
    if "memcpy" in str(g.after.get("cat", "")).lower() or "Memcpy" in str(g.after.get("name", "")):
        return False
    chain = tl.chain(tl.op_of(g.launch))
    return bool(chain) and not any(c.startswith(COMPILED) for c in chain)


# ---------------------------------------------------------------------------------------------------------
# The host: what the GPU waits for
# ---------------------------------------------------------------------------------------------------------

def _host_line(tl, gap):
    """What the host did during a gap: the most sampled line of the project's own files (else the innermost
    frame) among the live run's samples inside it, or None without samples."""
    return _line_between(tl, gap.step, gap.start, gap.end)


def _line_between(tl, k, start, end):
    host = tl.meta.get("host_samples") or {}
    stacks, own = host.get("stacks") or [], own_labels(tl)
    counts = {}
    for sid in tl.samples_between(k, start, end):
        if 0 <= sid < len(stacks) and stacks[sid]:
            label = next((f for f in stacks[sid] if f in own), stacks[sid][0])
            counts[label] = counts.get(label, 0) + 1
    return max(counts, key=counts.get) if counts else None


def own_labels(tl):
    """Frame labels of the project's own files (samplers before "own" was kept: top-level files)."""
    host = tl.meta.get("host_samples") or {}
    if "own" in host:
        return {f for f in host["own"] if not GENERATED.search(f)}
    return {f for stack in host.get("stacks") or () for f in stack
            if ("/" not in f.split(":")[0] or f.startswith((".bench/", "profiling/"))) and not GENERATED.search(f)}


def _open_gaps(tl):
    return [g for g in tl.gaps if g.cause is None]


def _launch_heavy(tl, ctx):
    events = sum(len(evs) for evs in tl.per_step) / ctx["n"]
    return events * LAUNCH_HOST_US / 1e3 >= LAUNCH_SHARE * ctx["busy"], events


@rule("launch_bound", needs=("device", "own_idle"))
def launch_bound(tl, ctx, found):
    """The host cannot launch kernels as fast as the GPU runs them: many short kernels, idle between them."""
    heavy, events = _launch_heavy(tl, ctx)
    if not heavy or not events:  # no device event counted (none with a launch): nothing launched too slowly
        return None
    long_us = sum(g.us for g in _open_gaps(tl) if g.us >= LONG_GAP_US) / ctx["n"]
    many = events * LONG_GAP_US >= long_us  # launches enough that the long gaps are at most LONG_GAP_US a kernel
    gaps = [g for g in _open_gaps(tl) if g.us < LONG_GAP_US or _launching(tl, g, many)]
    if not gaps:
        return None
    for g in gaps:
        g.cause = "launch_bound"
    durs = [e["dur"] for evs in tl.per_step for e, _ in evs]
    launch_ms = sum(e["dur"] for e in tl.ix.launches.values() if LAUNCH_CALLS.match(str(e.get("name", "")))
                    and tl.step_of(e["ts"]) is not None)  # the steps' own: not a start-up launch before them
    mb = ctx["micro_batches"]
    where = lines.idle_lines(tl, gaps)
    evidence = (f"{events:.0f} device events/step" + (f" ({mb} micro-batches of {events / mb:.0f})" if mb else "")
                + f", median {statistics.median(durs):.1f} us; host launch calls {launch_ms / ctx['n'] / 1e3:.1f} "
                f"ms/step; GPU idle between kernels {idle_ms(gaps, ctx):.1f} ms/step{scaled(ctx)}"
                + (f"; it waits on the launches of {where}: kernels too small for the host to keep ahead of them, no "
                   "one mistake on those lines recognized" if where else ""))
    ms = idle_ms(gaps, ctx)
    graphs = _graphs_fit(tl) and not any(f.get("kind") in HOST_WORK for f in found)
    if not tl.ix.graph_calls:
        saves, fewer, each = _compile_saves(tl, ctx, gaps)
        evidence += (f"; compiled, the model would launch ~{fewer:.0f} fewer kernels a step (about a third of its "
                     f"{fewer / FUSED_SHARE:.0f} eager elementwise and copy kernels: more where they are long "
                     "chains of pointwise ops, fewer beside convolutions with BatchNorm), each "
                     f"{each:.0f} us of the host's time: ~{saves:.1f} ms/step"
                     + ("" if graphs else ", the price here") + "; the rest of the idle waits on launches compiled "
                     "code still makes (matmuls, convolutions, its fused kernels)"
                     + ("" if graphs else ", which only fewer steps per sample amortize"))
        ms = ms if graphs else min(ms, saves)
    if graphs:
        evidence += ("; the steps alike (the same device events each: the same shapes) and no CUDA graph launched: "
                     "CUDA graphs would replay the launches as one call, the idle between them gone, the price here "
                     "(on six public models in eager bf16 on H200s, seven runs, mode=\"reduce-overhead\" recovered 0.83-1.74x "
                     "this idle: the launches and what compiling fuses)")
    fix = f"fewer, larger kernels: {_fewer_kernels(tl)}" + ("" if not mb or mb <= 2 else f" ({mb} micro-batches now)")
    if graphs:
        fix = ("CUDA graphs: torch.compile the model with mode=\"reduce-overhead\" (each step's launches replayed as "
               "one; it needs the same shapes every step and no host sync such as .item() inside the model, and "
               "holds the graphs' memory); else " + fix)
    return finding("launch_bound", ms, ctx, evidence, fix)


# Host work of the loop's own that an earlier finding names (a loop over parameters or samples, syncs, tensors
# built on the host, a starved loader): graphs replay launches, not that, and the step stays paced by it, so the
# idle is not graphs' to claim; that finding's fix first, then profile again. Not a graph break: graphs replay
# each compiled fragment (HF GPT-2 compiled with its break, 19.3 -> 7.9 ms/step with mode="reduce-overhead")
HOST_WORK = ("input_bound", "per_parameter_loop", "python_loop", "host_read", "host_tensor", "host_sync",
             "blocking_launch", "alloc_churn", "cuda_sync")


def _graphs_fit(tl):
    """Whether CUDA graphs (torch.compile's mode="reduce-overhead") could replay this loop's launches: on a GPU,
    no graph launched already, the profiled steps alike (the same number of device events each, a step the trace
    cut off left out; no sizes that change by design: a graph replays one shape), and no collective among them (a
    DDP or FSDP step's communication runs in hooks outside the compiled graphs: not measured, not claimed).
    Measured on H200s (compile_price_results.md), six public models in eager bf16 at small batches: eager ->
    reduce-overhead 18.6 -> 4.9 ms/step (ResNet-50), 33.1 -> 7.9 (GPT-2), 23.7 -> 5.4 (ViT-S), 22.5 -> 7.8
    (BERT), 22.4 -> 5.2 (MobileNetV3-S), 72.5 -> 10.1 (T5-small), where compiling in the default mode recovered
    -0.5, 13.8, 5.0, 4.8, -2.7 and 39.8."""
    if tl.meta.get("steps_vary") or len({len(evs) for evs in tl.per_step if evs}) != 1:
        return False
    if any(cat == "communication" for cats in tl.labels for cat in cats):
        return False
    return not any("GraphLaunch" in str(e.get("name", "")) for e in tl.ix.runtime)


FUSIBLE = ("other compute", "memory")  # kernels torch.compile fuses into its own (elementwise, casts, copies)
FUSED_SHARE = 0.34  # of an eager model's FUSIBLE kernels its compiled graphs no longer launch: GPT-2 small's size
                    # on the H200, 776 -> 515 of its model line's; each launch compiled cost the host 36 us against 38
                    # eager, so compiling saves launches, not time per launch. Measured on nine H200 loops, what
                    # compiling recovered is 0.36x (median) of their fusible kernels at their host time per launch,
                    # from below 0 (BatchNorm conv nets) to 0.84 (HF GPT-2's pointwise GELU) and 1.19 (a host-built
                    # mask Dynamo folds away): the price is known to about 2x (compile_price_results.md)


def _kept_compiled(chain):
    """Whether a kernel is one compiled code launches as well: BatchNorm's, which Inductor emits as reductions of
    its own (ResNet-50's BatchNorm kernels grew 525 -> 560 compiled, and its compiled step was no faster)."""
    return any("batch_norm" in c for c in chain)


def _compile_saves(tl, ctx, gaps):
    """(ms/step, kernels/step fewer, us each): what torch.compile of the model saves the host in a launch-bound
    eager loop: the FUSIBLE kernels of the model's part that the lines these gaps wait on launch (BatchNorm's
    left out: compiled code launches as many), FUSED_SHARE of them, at those lines' host time per launch (their
    allocation calls' time left out: compiling keeps those); without a line record, the whole step's launches at
    the step's host time each."""
    waited, fusible, kernels, alloc = set(), Counter(), Counter(), Counter()
    for g in gaps:
        line = lines.line_of(tl, tl.op_of(g.launch), g.launch)
        waited.add(line.key if line is not None else None)
    for evs, cats in zip(tl.per_step, tl.labels):
        for (e, launch), cat in zip(evs, cats):
            op = tl.op_of(launch)
            line = lines.line_of(tl, op, launch)
            key = line.key if line is not None else None
            if key not in waited:
                continue
            kernels[key] += 1
            chain = tl.chain(op)
            eager = not any(c.startswith(COMPILED) for c in chain)
            if cat in FUSIBLE and eager and waste.part(chain, cat) == waste.MODEL and not _kept_compiled(chain):
                fusible[key] += 1
    for e in tl.ix.launches.values():
        if cuda_calls.kind(str(e.get("name", ""))) == "allocation" and tl.step_of(e["ts"]) is not None:
            line = lines.line_of(tl, tl.op_of(e), e)
            alloc[line.key if line is not None else None] += e["dur"]
    by_line, n = lines.lines_of(tl), ctx["n"]
    saves = fewer = 0.0
    for key, count in kernels.items():
        host = (lines.host_ms(tl, ctx, [by_line[key]]) if key is not None else  # no line: the step's share
                ctx["step"] * count / max(1, sum(len(evs) for evs in tl.per_step)))
        each = max(0.0, host - alloc[key] / n / 1e3) / (count / n)
        saves, fewer = saves + FUSED_SHARE * fusible[key] / n * each, fewer + FUSED_SHARE * fusible[key] / n
    return saves, fewer, 1e3 * saves / fewer if fewer else 0.0


def _fewer_kernels(tl):
    """The remedies for a host that launches too many small kernels, in this loop's terms: compiling first where
    nothing is (it changes nothing the model computes), a larger micro-batch (fewer steps per sample; it changes
    the optimization, so it is an experiment, not a fix)."""
    bigger = ("raise DEVICE_BATCH_SIZE (fewer micro-batches per step)" if trainer_is_train_py(tl.meta) else
              "a larger micro-batch (fewer, longer kernels per sample; in training it changes the optimization: an "
              "experiment)")
    if tl.ix.graph_calls:
        return f"{bigger}, keep the model compiled (torch.compile fuses the small ones)"
    return ("torch.compile the model (it fuses the small ones; no compiled graph is in this trace)"
            + compile_ignored(tl.meta) + f"; then {bigger}")



def _launching(tl, g, many):
    """Whether the host spent a long gap launching, not in one long call (a 6.5 ms hipLaunchKernel on an MI250: a
    first launch's code load, one call, not many launches): with the live run's host samples, none inside it
    shows the project's own code (a 2 ms sampler misses most gaps under a few ms: those are taken as launch work);
    in a trace without them, where the step launches `many` kernels (launch_bound) and the host was not inside
    CUDA calls for half the gap (a blocking copy, an allocation: an `.item()` waiting 9.5 ms of an 18.6 ms gap in
    an HTA V100 DLRM; cudaMalloc 48 ms of an AlexNet's first pass). The host's Python between operators records
    nothing, so silence in a gap is no sign (sampled, a launch-bound H100 run's silent gaps of 0.25-4 ms were
    torch's own code); a step of one kernel and 58.6 ms of idle (an HTA trace) is no launch work either."""
    if _in_one_call(g):
        return False
    if (tl.meta.get("host_samples") or {}).get("stacks"):
        return not _train_line(tl, _host_line(tl, g))
    return many and 2 * sum(cuda_calls.calls_during(tl, g.start, g.end).values()) < g.us


def _train_line(tl, label):
    """True for a line of the project's own files other than the fixed ones (FIXED_FILES, profiling/)."""
    return label in own_labels(tl) and not label.split(":")[0].endswith(FIXED_FILES) and "profiling/" not in label


@rule("gpu_waits_on_host", needs=("device", "own_idle"))
def gpu_waits_on_host(tl, ctx, found):
    """Long GPU idle gaps no sync explains: where they fall in the step and what the host was doing. With
    host samples, the gaps a sample shows are the finding (its line is the fix) and the rest go to `unknown`.
    Without any (an older or foreign trace), the idle is still measured: the finding is the effect, its cause
    unknown, with how to record it (effect first: a large idle is never left to an `unexplained` line)."""
    gaps = [g for g in _open_gaps(tl) if g.us >= LONG_GAP_US]
    if not gaps:
        return None
    if not (tl.meta.get("host_samples") or {}).get("stacks"):
        for g in gaps:
            g.cause = "gpu_waits_on_host"
        return _cause_unknown(tl, ctx, gaps)
    by_line, places, unsampled = {}, {}, []
    for g in gaps:
        g.cause = "gpu_waits_on_host"
        line = _host_line(tl, g)
        if line is None:
            unsampled.append(g)
            continue
        by_line[line] = by_line.get(line, 0.0) + g.us
        place = (short_name(str(g.before.get("name", ""))), short_name(str(g.after.get("name", ""))),
                 made_by(tl.chain(tl.op_of(g.launch))))
        places[place] = places.get(place, 0.0) + g.us
    if unsampled:
        _unsampled_idle(tl, ctx, unsampled)
    if not by_line:
        return None
    sampled = [g for g in gaps if g not in unsampled]
    texts = (tl.meta.get("host_samples") or {}).get("lines") or {}
    total = sum(by_line.values())
    host = ", ".join(f"{line} ({100 * us / total:.0f}%)" + (f" `{texts[line]}`" if line in texts else "")
                     for line, us in top(by_line, 2))
    (before, after, op), _ = top(places, 1)[0]
    evidence = (f"{len(sampled) / ctx['n']:g} gaps/step of {LONG_GAP_US / 1e3:g} ms or more, GPU idle "
                f"{idle_ms(sampled, ctx):.1f} ms/step{scaled(ctx)}; mostly after `{before}`, before `{after}` "
                f"(launched by {op}); the host meanwhile: {host}")
    main = top(by_line, 1)[0][0]
    synced = any(f["kind"] in ("host_sync", "graph_break") for f in found)
    fix = (("the GPU waits for the next batch: " + ("the host syncs above leave no queued GPU work to hide the "
            "loader behind; fix them first" if synced else "the loader is slower than the GPU; make it cheaper "
            "or prepare batches ahead")) if _in_loader(tl, sampled) else
           _host_fix(tl, main, texts.get(main, "")))
    return finding("gpu_waits_on_host", idle_ms(sampled, ctx), ctx, evidence, fix)


OPTIMIZER_STEP = re.compile(r"\b\w*(opt|optim|optimizer|scaler)\w*\.step\(")  # scaler: AMP's GradScaler


def _host_fix(tl, main, text):
    """The remedy for host work sampled at one line: that line's own code, unless the line only hands the work to
    a library whose cost has its own remedy (autograd's backward, the optimizer's update, a forward's operator
    launches, a trainer's loop): "make loss.backward() cheaper" is no edit anyone can make."""
    if ".backward(" in text:
        return (f"the host work at {main} is autograd launching the backward's kernels, not that line's own code: "
                f"fewer, larger kernels shorten it: {_fewer_kernels(tl)}")
    if OPTIMIZER_STEP.search(text):
        return (f"the host work at {main} is the optimizer's update: fused=True (Adam, AdamW, SGD) or foreach=True "
                "runs it over all the tensors at once")
    if text.lstrip().startswith("def forward("):
        return (f"the host work at {main} is the forward launching its operators: fewer, larger kernels shorten it: "
                f"{_fewer_kernels(tl)}")
    if lines.ENTRY.search(text):
        return (f"the host work is inside the training framework's loop run from {main}: the host samples' inner "
                "frames say which part; move work out of its per-step hooks and callbacks")
    return f"make the host work at {main} cheaper or move it out of the step"


def _cause_unknown(tl, ctx, gaps):
    """The GPU idle in long gaps of a trace without host samples: where the gaps fall, the CUDA calls the host
    was in meanwhile, the cause unknown and how to see it."""
    places, calls = Counter(), Counter()
    for g in gaps:
        places[(short_name(str(g.before.get("name", ""))), short_name(str(g.after.get("name", ""))),
                made_by(tl.chain(tl.op_of(g.launch))))] += g.us
        calls.update(cuda_calls.calls_during(tl, g.start, g.end))
    ms = idle_ms(gaps, ctx)
    (before, after, op), _ = places.most_common(1)[0]
    inside = ("; the host was inside CUDA calls for " + ", ".join(
        f"{name} {us / ctx['n'] / 1e3:.1f} ms/step" for name, us in top(calls, 2)) + " of it" if calls else "")
    late = sum(g.us for g in gaps if g.launch["ts"] > g.start)  # the next work launched only after the GPU went idle
    waiting = ("the GPU waiting for the host to launch" if 2 * late >= sum(g.us for g in gaps) else
               "most of it with the next work already launched (the GPU waiting on a dependency: another stream, an "
               "event, a copy the host is inside)")
    evidence = (f"cause unknown: {len(gaps) / ctx['n']:g} gaps/step of {LONG_GAP_US / 1e3:g} ms or more, GPU "
                f"idle {ms:.1f} ms/step ({100 * ms / ctx['step']:.0f}% of the step){scaled(ctx)}, {waiting}; mostly "
                f"after `{before}`, before `{after}` (launched by {op}){inside}; what the host did meanwhile is not "
                "in this trace (no host samples)")
    run = "train.py --profile" if trainer_is_train_py(tl.meta) else "`research profile` of its trace"
    return finding("gpu_waits_on_host", ms, ctx, evidence,
                   "find what the host does between those kernels: profile again with this profiler "
                   f"(profiling.Profiler around the loop, then {run}: it samples the host's Python "
                   "stacks every 2 ms and names the line the GPU waits on), or with torch.profiler's "
                   "with_stack=True (it slows the host: give --unprofiled-ms); a data loader, a .item(), "
                   "logging or checkpointing inside the step are the usual causes")


LOADER_FRAMES = ("torch/utils/data/", "prepare.py")  # torch's DataLoader; this repository's loader


def _in_loader(tl, gaps):
    """Whether most host samples inside these gaps are in a data loader's code (any script's DataLoader,
    or this repository's prepare.py)."""
    stacks = (tl.meta.get("host_samples") or {}).get("stacks") or []
    ids = [sid for g in gaps for sid in tl.samples_between(g.step, g.start, g.end) if 0 <= sid < len(stacks)]
    loading = sum(any(str(f).startswith(LOADER_FRAMES) or "dataloader" in str(f).lower() for f in stacks[sid])
                  for sid in ids)
    return bool(ids) and loading >= len(ids) / 2


def _unsampled_idle(tl, ctx, gaps):
    """GPU idle no host sample covers: `unknown`, naming the CUDA calls the host was in meanwhile."""
    calls = {}
    for g in gaps:
        for name, us in cuda_calls.calls_during(tl, g.start, g.end).items():
            calls[name] = calls.get(name, 0.0) + us
    inside = ("; the host was inside CUDA calls: " + ", ".join(
        f"{name} {us / ctx['n'] / 1e3:.1f} ms/step" for name, us in top(calls, 2))) if calls else ""
    sampled = bool((tl.meta.get("host_samples") or {}).get("stacks"))
    unknown(ctx, "gpu_waits_on_host", [] if sampled else ["host_samples"], idle_ms(gaps, ctx),
            f"{len(gaps) / ctx['n']:g} GPU idle gaps/step of {LONG_GAP_US / 1e3:g} ms or more"
            f"{scaled(ctx)} with no host sample inside{inside}: what the host did is not in this trace")


@rule("profiler_overhead", needs=("device", "unprofiled"))
def profiler_overhead(tl, ctx, found):
    """The profiled step differs from the unprofiled one by more than 3%: which figures are inflated."""
    u = ctx["unprofiled"]
    if not isinstance(u, (int, float)) or u <= 0 or abs(ctx["step"] / u - 1) <= STEP_TOLERANCE:
        return None
    change = 100 * (ctx["step"] / u - 1)
    if change < 0:
        evidence = (f"profiled {ctx['step']:.1f} ms/step vs {u:.1f} unprofiled ({change:+.1f}%): the unprofiled "
                    "steps were slower (a recompile or warm-up in them?); the profiled figures stand")
        unknown(ctx, "profiler_overhead", [], u - ctx["step"],
                "the unprofiled steps took longer than the profiled ones: time this trace did not record (a "
                "recompile or warm-up in them, or work that ran faster under the profiler); the findings price "
                "the profiled steps only")
    else:
        corrected = max(0.0, u - ctx["busy"])
        evidence = (f"profiled {ctx['step']:.1f} ms/step vs {u:.1f} unprofiled ({change:+.1f}%): the profiler's "
                    f"host cost inflates the step and the GPU idle ({ctx['idle']:.1f} ms/step), not kernel times; "
                    f"corrected idle = unprofiled - device busy = {corrected:.1f} ms/step; idle-based findings "
                    f"above are scaled by {ctx['scale']:.2f}")
    return {"kind": "profiler_overhead", "ms_per_step": 0.0, "pct_of_step": 0.0, "evidence": evidence,
            "fix": "nothing to change for this: judge speed by the unprofiled step time"}
