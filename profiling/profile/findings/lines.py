"""Pure: the host's cost placed on the lines of the user's code, and the mechanism a line shows (issue #56).
Stdlib only.

An eager loop whose host launches or syncs too much leaves the GPU idle between its kernels. The effect rules
(launch_bound, host_sync, eager_code) price that idle; this one says which line of the user's code it waits on
and what that line does, from the trace's own events:

- each GPU idle gap goes to one line: the line whose sync the host was blocked in as the GPU went idle, else the
  line whose operator launched the kernel that ends the gap (a backward kernel's line is its forward operator's:
  profiling/profile/tables/eager_lines.py). The line is the innermost frame of the user's code (whose.py).
- what a line does, from the operators the line-record step saw it call, in order (the trace metadata's
  `eager_lines`), the kernels and copies its operators launched in the profiled steps, and its syncs:
    per_parameter_loop  a block of a few operators repeated once per parameter tensor (an EMA or a norm in a
                        Python loop over the parameters, an optimizer with one param group per tensor or with
                        foreach=False): one foreach or fused call over all the tensors does the same work
    python_loop         a block of a few operators repeated LOOP_MIN times or more in a row (per sample, per
                        time step, per head): the same work as one call over a stacked or batched tensor
    host_read           the host reading the GPU's results every step, each read a sync: copies to the host
                        (`.cpu()`, `.numpy()`, `.tolist()`, `.item()`), or a boolean mask's index (`x[mask]`:
                        `aten::nonzero` reads the size of its result): kept on the device, read when needed (not
                        a library call's own read: a GradScaler's step, a clip, a backward)
    host_tensor         operators that run on the host (they launch nothing) and a pageable host-to-device copy
                        of what they made, every step: made once on the device, or kept there (random draws:
                        drawn on the device, every step as now)
  A loop whose body spans several lines (a module called per head in a comprehension) shows as lines entered as
  many times a step, LOOP_MIN or more, between two visits of the first, whose caller (the next frame of the
  user's code outward in the host samples) gathers the loop's results (a comprehension, torch.cat, torch.stack,
  sum): one python_loop for all of them, named at the caller; a stack of layers, each feeding the next, is not.
  A training framework's entry (`trainer.train()`, `.fit(...)`) is no loop of the user's: all the framework runs
  is on that line. A line with none of these is left to the effect rules (whose evidence names the lines the idle
  waits on).
- the price: the GPU idle the line's gaps hold (at the unprofiled run's scale; unscaled where the line's operators
  launch nothing, which the profiler does not slow): the time the step loses waiting on that line's host work,
  which the remedy removes; and where the line's host time (host_ms: from the runtime calls' timestamps, less the
  profiler's cost on its calls) is more than that idle, the idle after it up to the host's next sync, which waits
  on that delay (contract.following); never more than the step's idle. Lines that make the same mistake with the
  same remedy are one finding. On a CPU run (CPU_RULES), with
  no GPU to idle: the line's operators' own time a step, less one pass of the loop's body.
"""
import bisect
import re
from collections import Counter

from profiling.profile.findings.contract import following, framework, idle_ms, rule, scaled, top
from profiling.profile.findings.contract import finding as make
from profiling.profile.findings.cpu import layer_stack
from profiling.profile.trace.eager_ops import top_of
from profiling.profile.trace.timeline import SYNC_CALLS as SYNCS

LOOP_MIN = 16      # a block repeated this many times in a row on one line is a Python loop
MAX_BODY = 16      # operators in a loop's body at most (a stack of layers repeats blocks of 20 and more, and
                   # runs from a library's loop, not a line of the user's)
MIN_SHARE = 0.03   # of the step: a line's idle under this is not a finding of its own
MODULE_OPS = {"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::linear", "aten::matmul", "aten::bmm", "aten::mm",
              "aten::embedding", "aten::batch_norm", "aten::layer_norm"}  # a model's forward: a loop over data, not
                                                                             # over the parameters
SYNC_CALLS = ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero", "aten::cpu")
RANDOM = {"aten::randn", "aten::rand", "aten::randint", "aten::randperm", "aten::normal", "aten::normal_",
          "aten::uniform_", "aten::bernoulli", "aten::bernoulli_", "aten::multinomial", "aten::random_",
          "aten::randn_like", "aten::rand_like", "aten::randint_like", "aten::exponential_"}  # random draws
MASK_INDEX = ("aten::nonzero", "aten::masked_select")  # a boolean mask's index: its result's size read on the host
# a library call that reads the GPU on its own (GradScaler's step reads found_inf, a clip with error_if_nonfinite
# its norm, a backward's hooks): no read of the line's own to keep on the device; the effect rules (host_sync,
# cuda_sync) name what it costs
LIBRARY_READS = re.compile(r"\.step\(|clip_grad|\.backward\(")
VIEWS = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::empty", "aten::empty_strided", "aten::view",
         "aten::select", "aten::slice", "aten::detach", "aten::alias", "aten::lift_fresh", "aten::contiguous",
         "aten::unbind", "aten::as_strided", "aten::reshape", "aten::clone", "aten::_has_compatible_shallow_copy_type")


class Line:
    """One line of the user's code: the operators it called in the recorded step (in order), the device events its
    operators launched in the profiled steps (by the line's own operator that launched them), the pageable copies
    among them, and the GPU idle gaps that wait on it."""

    __slots__ = ("calls", "copies", "gaps", "host_us", "key", "launched", "ops", "reads", "synced", "text", "visits",
                 "wall_us")

    def __init__(self, key, text):
        self.key, self.text = key, text
        self.ops, self.gaps = [], []
        self.launched, self.copies, self.visits = Counter(), 0, []  # visits: (first, last) record index of each
                                                                      # run of the step's operators on this line
        self.reads = 0  # its copies from the device to the host, in the profiled steps
        self.synced = Counter()  # its runtime sync calls in the profiled steps, by the operator they ran in
        self.host_us = 0.0  # the host's time in the line's operators (the outermost ones, a backward's too)
        self.wall_us, self.calls = 0.0, 0  # the host's time on the way to the line's runtime calls, and those calls
                                           # (host_wall), in the profiled steps

    @property
    def label(self):
        return f"{self.key[0]}:{self.key[1]}"


def lines_of(tl):
    """{(file, line): Line} of a device trace with a line record, or {} (memoized on the timeline)."""
    if getattr(tl, "_host_lines", None) is not None:
        return tl._host_lines
    placer = getattr(tl, "placer", None)
    eager = placer.eager if placer is not None else None
    out = {}
    if eager is not None:
        out = recorded(tl.meta, eager)
        memo = {}
        for evs in tl.per_step:
            for e, launch in evs:
                op = tl.op_of(launch)
                line = _line(tl, placer, op, launch, out)
                if line is not None:
                    outer = top_of(op, tl.parent, memo)[0]  # the line's own call (None: a backward's)
                    line.launched[str(outer.get("name", "")) if outer else "backward"] += 1
                    name = str(e.get("name", ""))
                    line.copies += "HtoD" in name and "Pageable" in name  # `Memcpy HtoD (Pageable -> Device)`
                    line.reads += "DtoH" in name
        for sync, chain in tl.syncs:
            line = _line(tl, placer, tl.enclosing(sync), sync, out)
            if line is not None and chain:
                line.synced[chain[0]] += 1
        for op in tl.ix.cpu_ops:  # the outermost operators of the profiled steps, on any thread
            if tl.parent.get(id(op)) is None and tl.step_of(op["ts"]) is not None:
                line = _line(tl, placer, op, op, out)
                if line is not None:
                    line.host_us += op["dur"]
        for g in tl.gaps:
            sync = tl.sync_at(g)
            at = sync[0] if sync else g.launch
            line = _line(tl, placer, tl.enclosing(at) if sync else tl.op_of(at), at, out)
            if line is not None:
                line.gaps.append(g)
        _host_wall(tl, placer, out)
    tl._host_lines = out
    return out


def _host_wall(tl, placer, out):
    """Each line's host time in the profiled steps, from the runtime calls' own timestamps (a device-only capture
    records them in its timed steps): the time from one call's end to the next call's end goes to the next call's
    line (the host was on its way there: its Python, its operators, the call), less the time it waited in a sync
    call or for the input pipeline (a gap an earlier rule claimed for it), which no change of that line's host
    work shortens."""
    calls = sorted((e for e in tl.ix.launches.values() if tl.step_of(e["ts"]) is not None), key=lambda e: e["ts"])
    waits = sorted((g.start, g.end) for g in tl.gaps if g.cause is not None)
    starts = [a for a, _ in waits]
    last = None
    for e in calls:
        end = e["ts"] + e["dur"]
        if last is not None and end > last:
            span = end - last - (e["dur"] if str(e.get("name", "")) in SYNCS else 0.0)
            i = max(0, bisect.bisect_left(starts, last) - 1)
            while i < len(waits) and waits[i][0] < end:
                span -= max(0.0, min(end, waits[i][1]) - max(last, waits[i][0]))
                i += 1
            line = _line(tl, placer, tl.op_of(e), e, out) if span > 0 else None
            if line is not None:
                line.wall_us += span
                line.calls += 1
        last = end if last is None else max(last, end)


ENTRY = re.compile(r"\.(train|fit|validate|test|predict)\(|Trainer\(")  # a training framework's entry point


def _framework_entry(tl, line):
    """Whether the line is a training framework's entry (`trainer.train()`, `trainer.fit(...)`) in a trace of that
    framework's loop: everything the framework runs (its optimizer step, its clipping, its copies) is on that line,
    so no loop of the user's is there to name."""
    return bool(ENTRY.search(line.text)) and framework(tl) is not None


def recorded(meta, eager):
    """{(file, line): Line} with the operators each line called in the line-record step, in order, and its visits."""
    out, previous = {}, None
    for at, (name, i) in enumerate((meta.get("eager_lines") or {}).get("ops") or ()):
        if isinstance(i, int) and 0 <= i < len(eager.lines):
            key = eager.lines[i]
            line = out.setdefault(key, Line(key, eager.text.get(key, "")))
            line.ops.append(str(name))
            if key == previous:
                line.visits[-1] = (line.visits[-1][0], at)
            else:
                line.visits.append((at, at))
            previous = key
    return out


def line_of(tl, op, anchor):
    """The Line of the user's code that called this operator (lines_of's), or None."""
    placer, by_line = getattr(tl, "placer", None), lines_of(tl)
    return _line(tl, placer, op, anchor, by_line) if placer is not None and by_line else None


def _line(tl, placer, op, anchor, out):
    if op is None:
        return None
    lines, _, eager = placer.place(op, anchor)
    if not lines or not eager:
        return None
    key = lines[0]
    return out.setdefault(key, Line(key, placer.eager.text.get(key, "")))


def loop(names):
    """(body, times): the block of at most MAX_BODY operator names repeated the most times in a row in `names`, the
    block that covers the most operators so; (None, 0) where none repeats LOOP_MIN times."""
    best, n = (None, 0), len(names)
    for p in range(1, min(MAX_BODY, n // LOOP_MIN) + 1):
        run, start = 0, 0
        for i in range(n - p):
            if names[i] == names[i + p]:
                run += 1
                times = run // p + 1
                if times >= LOOP_MIN and times * p > best[1] * len(best[0] or ()):
                    best = (tuple(names[start:start + p]), times)
            else:
                run, start = 0, i + 1
    return best


def mechanism(line, tensors, n, cpu=False):
    """(kind, what it does in words, the remedy) for a line, or None. cpu: a CPU run's (no launches, no syncs)."""
    body, times = loop(line.ops)
    launching = {o for o in body or () if o in line.launched}
    if launching and not cpu and sum(line.launched[o] for o in launching) / n < times * len(launching) / 4:
        body = None  # the line-record step saw the block repeated, the profiled steps' launches do not (a loop
                     # launches a kernel or more per launching operator an iteration): not the loop's own work,
                     # as an eval's batches run through the line while that step was recorded
    # the recorded step's sync operators that copied from the device (one on a host tensor, as a single-tensor
    # AdamW's step count or an index in a host loop, launches nothing and waits for nothing); counted from the
    # operators: the trace's sync calls miss a copy that found the GPU done
    host = not cpu and not (set(body or ()) & set(line.launched))
    syncs = sum(o in SYNC_CALLS and o in line.launched for o in line.ops)
    launches = sum(line.launched.values()) / n
    backward = line.launched.get("backward", 0) / n
    launched = "" if cpu else f", {launches:.0f} kernel launches a step" + (
        f" ({backward:.0f} of them its backward)" if backward else "")
    if body:
        ops = ", ".join(f"`{b}`" for b in dict.fromkeys(body))
        calls = f"{len(line.ops)} operator calls a step, a block of {len(body)} ({ops}) {times} times in a row"
        synced = (f"; {syncs} of them host syncs (each waits for the GPU to finish all it was given)"
                  if syncs >= 1 else "")
        if tensors and times % tensors == 0 and times >= tensors and not set(body) & MODULE_OPS:
            each = "once per parameter tensor" if times == tensors else f"{times // tensors}x per parameter tensor"
            if any(o.startswith("aten::_foreach_") for o in body):
                return ("per_parameter_loop", f"{calls}: a foreach update run {each} ({tensors} tensors), that is "
                        "one param group per tensor" + synced,
                        "group the parameters: one param group per distinct setting (lr, weight decay), not one per "
                        "tensor, so the optimizer's foreach or fused update runs over each group at once")
            return ("per_parameter_loop", f"{calls}: {each} ({tensors} tensors){launched}" + synced,
                    _per_parameter_fix(line.text, body))
        return ("python_loop", f"{calls}: a Python loop" + (
            ", on the host (its operators launch no kernel)" if host else "") + launched + synced,
            _loop_fix(body, syncs, host))
    read = None if cpu else _host_read(line, n)
    if read is not None:
        return read
    made = [o for o in dict.fromkeys(line.ops) if o not in line.launched and o not in VIEWS]
    if line.copies and made:
        drawn = [o for o in made if o in RANDOM]
        return ("host_tensor", f"{', '.join(f'`{o}`' for o in (drawn or made)[:3])} run on the host (they launch no "
                f"kernel) and {line.copies / n:.0f} pageable host-to-device cop{'y' if line.copies == n else 'ies'} "
                "a step take what they made to the GPU, every step", RANDOM_FIX if drawn else
                "make it on the device, once: a tensor that is the same every step as a buffer built at init "
                "(register_buffer) or cached; data indexed per step kept on the GPU and indexed there "
                "(device=... where it is created)")
    return None


RANDOM_FIX = ("draw it on the device, every step as now: torch.randn(..., device=x.device) or torch.randn_like(x) "
              "(rand, randint, normal_ alike): drawn once and kept, the same values would repeat every step, "
              "which changes what the model learns; the GPU's generator draws other values than the CPU's, from "
              "the same distribution")


def _host_read(line, n):
    """The host_read mechanism of a line that reads the GPU's results on the host every step (module docstring),
    or None: a boolean mask's index (its size read by `aten::nonzero`, a sync) or copies to the host."""
    if LIBRARY_READS.search(line.text):
        return None
    masked = sum(line.synced[o] for o in MASK_INDEX)
    if masked >= n:
        return ("host_read", f"a boolean mask indexes a tensor (`x[mask]`): the size of its result is read on the "
                f"host, {masked / n:.0f} sync{'s' if masked > n else ''} a step (`aten::nonzero`, each waits for "
                "all the GPU was given), and the rows gathered (their gradient scattered back in the backward)",
                "keep the shapes fixed: a loss that skips padding by its ignore_index (F.cross_entropy(..., "
                "ignore_index=-100)) or by weights ((loss * mask).sum() / mask.sum()), elsewhere "
                "torch.where(mask, x, 0): the same values, no size for the host to read")
    if line.reads < n:
        return None
    scalar = any(o in ("aten::item", "aten::_local_scalar_dense") for o in line.ops)
    return ("host_read", f"{line.reads / n:.0f} cop{'y' if line.reads == n else 'ies'} from the GPU to the host a "
            "step (" + ("`.item()`" if scalar else "`.cpu()`, `.numpy()`, `.tolist()`") + "): each waits for all "
            "the GPU was given, and the host's work on what it read runs while the GPU has nothing queued",
            "keep it on the device and read it when it is needed: " + (
                "accumulate the values in a GPU tensor (total += loss.detach()) and call .item() at the log step"
                if scalar else "accumulate into a GPU tensor (a running sum; counts by index_put_(..., "
                "accumulate=True) or scatter_add_) and copy it to the host once, where it is read (a log step, the "
                "epoch's end)"))


def recognize(tl, line, by_line, tensors, n):
    """mechanism() of a line of a device trace, but no python_loop where the repeats are a stack of layers
    (`stacked`)."""
    found = mechanism(line, tensors, n)
    return None if found and found[0] == "python_loop" and stacked(tl, line, by_line) else found


def stacked(tl, line, by_line):
    """Whether the block a line repeats is a stack of layers, not a loop over data: each weight-taking call has a
    parameter of its own (cpu.layer_stack), or the line runs once per visit as often as such a line of the same
    module does (a ResNet block's ReLU beside its convolutions: torchvision's Bottleneck, run once per block by
    nn.Sequential, puts each of its lines 16 times in a step; a loop over a batch's samples repeats its block
    within one visit of its line)."""
    body, times = loop(line.ops)
    if layer_stack(tl, line.key, body, times):
        return True
    visits = len(line.visits)
    return visits >= times and any(
        other is not line and len(other.visits) == visits and other.key[0] == line.key[0]
        and layer_stack(tl, other.key, *loop(other.ops)) for other in by_line.values())


def _launches_nothing(line):
    """Whether the line's loop body runs on the host only (its operators launched no kernel in the profiled steps)."""
    body, _ = loop(line.ops)
    return body is not None and not set(body) & set(line.launched)


def _per_parameter_fix(text, body=()):
    if "clip_grad" in text:
        return "clip_grad_norm_(..., foreach=True): one norm over all the gradients"
    if any(o.startswith(("aten::clamp", "aten::clip")) for o in body):
        if "grad" in text:  # the gradients clipped by value, not the weights (a WGAN critic's clipping)
            return ("torch.nn.utils.clip_grad_value_(model.parameters(), clip_value): one clamp over all the "
                    "gradients (foreach), the same values")
        return ("torch._foreach_clamp_min_(params, low) and torch._foreach_clamp_max_(params, high) under "
                "torch.no_grad(): one clamp over all the tensors, the same values")
    if ".step(" in text:
        return "the optimizer with fused=True (Adam, AdamW, SGD) or foreach=True: one update over all the tensors"
    return ("one call over all the tensors instead of a Python loop over them: torch._foreach_* on the tensor lists "
            "(an EMA: torch._foreach_lerp_(ema_params, params, 1 - decay); a norm: "
            "torch.nn.utils.get_total_norm(grads))")


def _loop_fix(body, syncs, host):
    if any("lstm_cell" in b or "gru_cell" in b or "rnn_" in b for b in body):
        return "nn.LSTM / nn.GRU over the whole sequence (one cuDNN call) instead of the cell in a Python loop"
    if syncs >= 1:
        return ("compute it over the whole tensor on the device (e.g. (pred == y).sum()) and read the result once, "
                "not an .item() per element")
    if host:
        return ("keep the data on the GPU and index it there with a tensor of indices (one gather), not row by row "
                "on the host")
    return ("vectorize the loop: one call over the stacked or batched tensor (the batch dimension, all heads at "
            "once, a loss with reduction over the batch) instead of one call per element")


def _line_rule(kind):
    """The rule of one mechanism: the line of the user's code holding the most GPU idle among those whose mechanism
    is `kind` (module docstring), its gaps claimed. Each mechanism a rule of its own (its kind the finding's)."""

    @rule(kind, needs=("device", "own_idle"))
    def match(tl, ctx, found):
        by_line = lines_of(tl)
        tensors, n = len(tl.meta.get("parameters") or ()), tl.n
        for line in sorted(by_line.values(), key=lambda line: -sum(g.us for g in line.gaps if g.cause is None)):
            if idle_ms([g for g in line.gaps if g.cause is None], ctx) < MIN_SHARE * ctx["step"]:
                return None
            body = loop_body(tl, line, by_line)
            if body is not None:
                lines, caller, text = body
                recognized = ("python_loop", (
                    f"with {', '.join(o.label.split(':')[1] for o in lines[1:])} a loop body of {len(lines)} lines "
                    f"run {len(line.visits)} times a step, called from {caller} `{text}`, "
                    f"{sum(len(o.ops) for o in lines)} operator calls and "
                    f"{sum(sum(o.launched.values()) for o in lines) / n:.0f} kernel launches a step"),
                    f"at {caller}: one call over all the loop's iterations instead of one per element (all heads in "
                    "one matmul with their weights concatenated; the whole batch at once), not a module called in a "
                    "Python comprehension")
            elif _framework_entry(tl, line):
                continue
            else:
                lines, recognized = [line], recognize(tl, line, by_line, tensors, n)
                if recognized is not None:
                    same = _same_mistake(tl, line, recognized, by_line, tensors, n)
                    lines += same
                    recognized = (recognized[0], recognized[1] + "".join(
                        f"; the same at {o.label} `{o.text}`" for o in same),
                        f"at {', '.join(o.label for o in lines)}: {recognized[2]}")
            if recognized is None or recognized[0] != kind:
                continue
            _, what, fix = recognized
            gaps = [g for other in lines for g in other.gaps if g.cause is None]
            # the profiler lengthens launches, not host operators that launch none: their idle is not scaled
            raw = body is None and (kind == "host_tensor" or kind == "python_loop" and _launches_nothing(line))
            own = idle_ms(gaps, dict(ctx, scale=1.0) if raw else ctx)
            host = host_ms(tl, ctx, lines)
            later, extra = following(tl, ctx, gaps, host - own)
            ms = own + extra
            for g in gaps + later:
                g.cause = kind
            tl._named_lines = getattr(tl, "_named_lines", set()) | {o.key for o in lines}
            whose = "these lines'" if body else "this line's"
            evidence = (f"{line.label} `{line.text}`: {what}; the GPU waited on {whose} host work {own:.1f} ms/step "
                        f"({len(gaps) / n:.0f} idle gaps)" + (
                            ", not scaled: the profiler lengthens launches, not operators that launch none"
                            if raw and round(ctx["scale"], 2) != 1.0 else "" if raw else scaled(ctx))
                        + (f"; the host spent {host:.1f} ms/step there (its own calls' profiling cost taken out), "
                           f"and the step's later idle waits on that delay too: {extra:.1f} ms/step more of it "
                           "(the GPU would run the queued work there instead)" if extra >= 0.05 else ""))
            if kind == "host_tensor":
                evidence, fix = evidence + _pool_text(tl), fix + _pool_fix(tl)
            return make(kind, ms, ctx, evidence, fix)
        return None
    match.__name__ = kind
    return match


def _same_mistake(tl, line, recognized, by_line, tensors, n):
    """The other lines of the user's code that make the same mistake with the same remedy as `line` (a batch's
    images and its labels each gathered row by row on the host), which one edit fixes with it: one finding."""
    out = []
    for other in by_line.values():
        if other is line or not any(g.cause is None for g in other.gaps) or _framework_entry(tl, other):
            continue
        theirs = recognize(tl, other, by_line, tensors, n) if loop_body(tl, other, by_line) is None else None
        if theirs and theirs[0] == recognized[0] and theirs[2] == recognized[2]:
            out.append(other)
    return sorted(out, key=lambda o: o.key)


def named_line(tl, call):
    """Whether a runtime call (a sync, a copy) was made on a line that a finding of this module named: its fix
    removes the call, so no later rule prices it again."""
    named = getattr(tl, "_named_lines", None)
    line = line_of(tl, tl.enclosing(call), call) if named else None
    return line is not None and line.key in named


def host_ms(tl, ctx, lines):
    """The host's time a step on these lines (lines_of's wall time), less what the profiler added to their runtime
    calls: the profiled step's excess over the unprofiled one, shared over the step's runtime calls (a device-only
    capture lengthens each call, not the host's Python or operators)."""
    calls = sum(1 for e in tl.ix.launches.values() if tl.step_of(e["ts"]) is not None) / ctx["n"]
    unprofiled = ctx.get("unprofiled")
    each = max(0.0, ctx["step"] - unprofiled) / calls if unprofiled and calls else 0.0
    return max(0.0, sum(o.wall_us for o in lines) / ctx["n"] / 1e3 - each * sum(o.calls for o in lines) / ctx["n"])


def _pool(tl):
    """torch's intra-op threads in the profiled process (the live capture's cpu_threads), or None."""
    threads = (tl.meta.get("cpu_threads") or {}).get("intra_op")
    return threads if isinstance(threads, int) and threads > 1 else None


def _pool_text(tl):
    threads = _pool(tl)
    return (f"; torch runs these host operators on its intra-op pool, {threads} threads here "
            "(torch.get_num_threads()), which wake for each and keep spinning after it, competing with the thread "
            "that launches the GPU's work: the step may lose more than the idle priced here") if threads else ""


def _pool_fix(tl):
    return ("; until then, torch.set_num_threads(1) keeps that pool from competing with the launching thread (it "
            "changes nothing the model computes)") if _pool(tl) else ""


per_parameter_loop, python_loop, host_read, host_tensor = (_line_rule(k) for k in (
    "per_parameter_loop", "python_loop", "host_read", "host_tensor"))
RULES = (per_parameter_loop, python_loop, host_read, host_tensor)


GATHERS = ("torch.cat(", "torch.stack(", "sum(", " for ")  # a caller that gathers a loop's results


def loop_body(tl, line, by_line):
    """([the line, the other lines of its loop body], the caller's label, its text), or None: the lines entered as
    many times a step as this one (LOOP_MIN or more), each between two of its visits, whose caller (the next frame
    of the user's code outward in the host samples) gathers the results of a loop (a comprehension, torch.cat,
    torch.stack, sum): heads or samples run one by one; a stack of layers, each feeding the next, is no such loop."""
    visits = line.visits
    if len(visits) < LOOP_MIN:
        return None
    lo, hi = visits[0][0], visits[1][0]
    lines = [line] + [o for o in by_line.values() if o is not line and len(o.visits) == len(visits)
                      and any(lo < a < hi for a, _ in o.visits)]
    caller = _caller(tl, {o.label for o in lines})
    if caller is None:
        return None
    text = ((tl.meta.get("host_samples") or {}).get("lines") or {}).get(caller, "")
    if not any(g in text for g in GATHERS):
        return None
    return sorted(lines, key=lambda o: o.visits[0][0]), caller.rsplit(" ", 1)[0], text


def _caller(tl, labels):
    """The most sampled frame of the user's code just outside any of these lines ('file:line function'), or None."""
    host = tl.meta.get("host_samples") or {}
    own, counts = set(host.get("own") or ()), Counter()
    for stack in host.get("stacks") or ():
        at = [i for i, f in enumerate(stack) if f.rsplit(" ", 1)[0] in labels]
        if at:
            outer = next((f for f in stack[at[0] + 1:] if f in own and f.rsplit(" ", 1)[0] not in labels), None)
            if outer:
                counts[outer] += 1
    return counts.most_common(1)[0][0] if counts else None


HOST_ROWS = 8  # lines the host-side view shows, most GPU idle first


def host_table(tl):
    """The host side of the step by line of the user's code (summary `host_lines`; #56 item 1), or None without
    a line record: the lines the GPU waited on most, each with its kernel launches a step (its backward's on its
    forward line), its host syncs a step (the recorded step's sync operators that launched a copy, or the
    runtime's sync calls made inside its operators where they are more), the host's time in its operators
    (forward and backward) and the GPU idle that waited on it, in the profiled steps (not scaled to the
    unprofiled run). {rows: [{file, line, text, launches, syncs, host_ms, idle_ms, mechanism}],
    rows_total, idle_ms: the idle placed on a line, of idle_total_ms}."""
    by_line = lines_of(tl)
    if not by_line:
        return None
    n, tensors = tl.n, len(tl.meta.get("parameters") or ())

    def row(line):
        recognized = None if _framework_entry(tl, line) else recognize(tl, line, by_line, tensors, n)
        return {"file": line.key[0], "line": line.key[1], "text": line.text,
                "launches": round(sum(line.launched.values()) / n, 1),
                "syncs": max(sum(o in SYNC_CALLS and o in line.launched for o in line.ops),
                             round(sum(line.synced.values()) / n, 1)),
                "host_ms": round(line.host_us / n / 1e3, 2), "idle_ms": round(sum(g.us for g in line.gaps) / n / 1e3, 2),
                "mechanism": recognized[0] if recognized else None}
    ranked = sorted(by_line.values(), key=lambda line: (-sum(g.us for g in line.gaps), -line.host_us))
    shown = [line for line in ranked if line.gaps or line.launched][:HOST_ROWS]
    return {"rows": [row(line) for line in shown], "rows_total": len(by_line),
            "idle_ms": round(sum(g.us for line in by_line.values() for g in line.gaps) / n / 1e3, 2),
            "idle_total_ms": round(sum(g.us for g in tl.gaps) / n / 1e3, 2)}


def idle_lines(tl, gaps, k=2):
    """'file:line (share%) `text`' of the lines the GPU idle in these gaps waited on most, or ''."""
    by_line = lines_of(tl)
    if not by_line:
        return ""
    ids = {id(g) for g in gaps}
    us = {line: sum(g.us for g in line.gaps if id(g) in ids) for line in by_line.values()}
    total = sum(g.us for g in gaps) or 1.0
    return ", ".join(f"{line.label} ({100 * v / total:.0f}%) `{line.text}`" for line, v in top(us, k) if v > 0)


def device_lines(tl, events, k=2):
    """'file:line (share%) `text`' of the lines whose operators launched most of these device events' time (a
    backward kernel on its forward operator's line), or ''."""
    return ", ".join(f"{f}:{n} ({100 * share:.0f}%) `{text}`" for (f, n), share, text in device_shares(tl, events, k))


def device_shares(tl, events, k=2):
    """[((file, line), share of the events' time, the line's text)] of device_lines, most first."""
    placer = getattr(tl, "placer", None)
    if placer is None:
        return []
    launches = getattr(tl, "_launch_of", None)
    if launches is None:
        launches = tl._launch_of = {id(e): launch for evs in tl.per_step for e, launch in evs}
    us, texts = Counter(), {}
    for e in events:
        launch = launches.get(id(e))
        if launch is None:
            continue
        lines, _, _ = placer.place(tl.op_of(launch), launch)
        if lines:
            key = lines[0]
            us[key] += e["dur"]
            texts[key] = placer.prov.text.get(key, "")
    total = sum(e["dur"] for e in events) or 1.0
    return [(key, v / total, texts[key]) for key, v in us.most_common(k)]


def _cpu_rule(kind):
    """On a CPU run (no GPU to idle): the line of the user's code whose recorded operators are a loop of `kind`,
    priced as its operators' own time a step (forward and backward, the lines table's) at the unprofiled step's
    scale, less one pass of the loop's body (what one call over all of it still costs, at the least)."""

    @rule(kind, needs=())
    def match(tl, ctx, found):
        placer = getattr(tl.ix, "placer", None)
        if placer is None or placer.eager is None:
            return None
        by_line = recorded(tl.meta, placer.eager)
        tensors = len(tl.meta.get("parameters") or ())
        update = ctx.get("optimizer_calls") or {}  # per_tensor_optimizer's: the optimizer's own calls a step
        scale = min(1.0, ctx["unprofiled"] / ctx["step"]) if ctx.get("unprofiled") else 1.0
        for row in (ctx.get("lines") or {}).get("rows") or ():
            if len(row.get("lines") or ()) != 1 or row["ms_per_step"] < MIN_SHARE * ctx["step"]:
                continue
            key = (row["lines"][0]["file"], row["lines"][0]["line"])
            line = by_line.get(key)
            recognized = mechanism(line, tensors, tl.n, cpu=True) if line and not _framework_entry(tl, line) else None
            if not recognized or recognized[0] != kind:
                continue
            body, times = loop(line.ops)
            if body and all(body.count(o) * times <= update.get(o, 0) for o in body):
                continue  # the optimizer's own loop over its tensors (its `.step(` line, or a line that runs the
                          # whole step), which per_tensor_optimizer prices: not a loop of this line's own
            if kind == "python_loop" and layer_stack(tl, key, body, times):
                continue  # a stack of layers, each with weights of its own (cpu.layer_stack): no loop to vectorize
            ms = row["ms_per_step"] * scale * (1 - 1 / times)
            ctx.setdefault("loop_lines", set()).add(key)
            evidence = (f"{line.label} `{line.text}`: {recognized[1]}; its operators took {row['ms_per_step']:.1f} "
                        f"ms/step (forward {row['forward_ms']:.1f}, backward {row['backward_ms']:.1f})"
                        + (f", x{scale:.2f} at the unprofiled step's scale" if scale < 1 else "")
                        + f"; one pass over all of it costs at least one of the {times}")
            return make(kind, ms, ctx, evidence, f"at {line.label}: {recognized[2]}")
        return None
    match.__name__ = kind
    return match


CPU_RULES = (_cpu_rule("per_parameter_loop"), _cpu_rule("python_loop"))
