"""Pure: the findings of a CPU profile (no device events: the trace's CPU operators are the step). Stdlib only.

A CPU run has no GPU to idle, no launches and no kernels: the GPU rules have no evidence there and do not run
(CPU_SKIPPED says which, in the report's one sentence). What holds on a CPU run, from its operators' self times:

- eager_code: chains of elementwise operators run one by one outside torch.compile (each a pass over memory and
  a dispatch), named in `unknown` ("not priced"), never a finding: the GPU's price (each chain fused into one
  pass as long as its longest operator, waste.eager_code) assumes torch.compile recovers it, and compiling made
  every CPU loop this project timed slower (below), so its fix is unmeasured on a CPU: time the compiled step
  first. Dropout's random masks, where they are DROPOUT_SHARE of the step or more, get a line there
  too: their only remedies (a lower p, fewer dropout layers) change the model, an experiment, not a fix.
- cpu_threads: GEMMs that took far longer than one core needs for their FLOPs (the intra-op threads waiting for
  cores: more threads than free cores, the machine's other processes); priced only as far as the unprofiled
  step can hold that wait, else it is the profiler's own threads competing for the cores (profiler_overhead).
- page_faults: the host's minor page faults in each timed (unprofiled) step, at what one costs on this machine
  (both measured by the Profiler: capture/faults.py): memory handed back to the OS after a step and faulted in
  again in the next (glibc malloc's trim and mmap thresholds); the fix keeps it in the process.
- the input pipeline: INPUT_PIPELINE, a rule of its own (another module), joins CPU_RULES there.
- device_unused: the trace lists a GPU, yet the model's operators ran on the CPU (trace/device_work.beside_gpu):
  the model and its batches were never moved to the device; priced at the compute operators' time less what a
  GPU would still take at GPU_SPEEDUP, ahead of the CPU's own fixes (issue #57).

Host syncs cost nothing on a CPU run (the host is the device: `.item()` waits for no queue), so that rule does not
run either. Each rule has the shape of contract.py; `CpuSteps` is the little of a Timeline they read.
"""
import math
import re
from collections import Counter

from profiling.profile.findings.contract import ancestors, finding, rule, top, unknown
from profiling.profile.findings.waste import EAGER_CATEGORIES, EAGER_MIN_SHARE, FUSED_OPTIMIZERS, part
from profiling.profile.tables.roofline import GEMM_OPS, gemm_flops
from profiling.profile.trace.classify import classify_cpu_op
from profiling.profile.trace.timeline import COMPILED
from profiling.profile.trace.traceio import by_thread, find, outer_names, parents

# One core's float32 GEMM, as a floor no healthy CPU misses: 16x64 @ 64x64 (131 kFLOP) took 3.3 us with 1
# thread and 5.9 us with 2 on this project's shared 2-core machine (torch 2.11, median of 300): 40 GFLOP/s
# plus the call. The floor below is 1 GFLOP/s plus 20 us a call, 6x slower than that at least.
CORE_FLOPS = 1e9
CALL_US = 20.0
WAIT_RATIO = 10.0   # a GEMM over 10x that floor waited for cores (the profiled Lightning MLP's: 300-4000x)
MIN_SHARE = 0.01    # of the step: a wait smaller than this is not worth a finding
SHOWN = 3
# No CPU findings below this step, as on the GPU (report/summary.py's MIN_JUDGED_MS): the CPU profiler costs ~8 us
# an operator it records (CPU_US_PER_OP), so a 0.72 ms step of 24 operators (tests/data/foreign/own-cpu-
# inference-annotated-no-schedule) is a quarter the profiler's own, more than any fusion could save in it.
MIN_STEP_MS = 1.0
SHORT_STEP = ("the step is {:.3f} ms of CPU time, shorter than %g ms: too short to judge (the profiler's ~8 us an "
              "operator is a large part of it)" % MIN_STEP_MS)
# A trace without device events whose host side shows a device ran the operators (trace/device_work.py).
UNRECORDED = ("no device events were recorded, yet the trace shows a device's part in this step: {}; so its "
              "operators' times may be the host's dispatch of device work and its waits for the device, not CPU "
              "compute: no CPU rule is run, and the device's work cannot be judged; record the device's activity too "
              "(ProfilerActivity.CUDA on NVIDIA and AMD GPUs; no range profiler replaying each kernel)")

# A GPU runs a model's compute at least this many times faster than the host's cores: Particle Transformer's forward
# on 512 jets took 5,138 ms on the CPU of an A100 machine and 85 ms on the A100, its first call included
# (tests/data/foreign/particle-a100-*: 60x); an A100's 19.5 TFLOP/s of fp32 against ~1-2 TFLOP/s of a 16-core
# AVX-512 host. The gain is priced at this floor.
GPU_SPEEDUP = 10.0
DEVICE_COMPUTE = ("GEMM", "convolution", "attention", "other compute", "optimizer")
DEVICE_OPS = re.compile(r"^aten::(mkldnn_|_mkldnn_|_slow_conv2d_|thnn_conv|addmm|mm|bmm|linear|convolution)")

# The device rules that cannot run on a CPU trace, in words, for the report's one sentence.
CPU_SKIPPED = ("host syncs (on the CPU the host is the device: a sync waits for no queue)",
               "the device waiting and launches", "kernels below their rate and attention backends",
               "device memory and communication")


# The CPU profiler's own cost per operator it records (record_shapes=True, as the capture records): 7.3 and 7.6
# us (21 once, under load), measured on this project's shared 2-core CPU machine with torch 2.11 as a loop of
# 2,000 torch.add on 8 floats, profiled against not (median of 5 runs each). A small model's CPU step records
# thousands of operators (tests/data/cpu-gpt-2steps: 4,671, +17.9 ms profiled = 3.8 us each).
CPU_US_PER_OP = 8.0
# A single-tensor optimizer (foreach=False, or one with no foreach path) updates each parameter tensor with an
# operator or more of its own: AdamW runs ~10 a tensor. On this project's 2-core CPU (torch 2.11, AdamW over the
# 98 parameter tensors of a 24-block width-64 MLP, opt.step() alone, median of 50): 5.33 ms tensor by tensor,
# 3.57 ms foreach, 1.14 ms fused; the whole step 11.9 ms against 5.1 fused.
PER_TENSOR_OPS = 3         # operators a step in the optimizer's update per parameter tensor, at least
# What a fused AdamW update still costs there: 1.14 ms for 98 tensors of 104k elements, 1.04 ms for 50 tensors of
# 798k elements (a 12-block width-256 MLP): 11 us a tensor and 0.6 ns an element fit both.
FUSED_US_PER_TENSOR = 11.0
FUSED_NS_PER_ELEMENT = 0.6
# What the update tensor by tensor costs at most on a healthy host, a cap on its price: 5.33 ms for 980 calls
# (5.4 us a call, above), and a pass over the tensor's elements per call (about 10 a tensor: 10 x 0.6 ns). A host
# whose threads wait for cores stretches every call (a Lightning MLP's 61 calls on 6,922 elements: 31 ms a step).
UNFUSED_US_PER_CALL = 5.4
UNFUSED_NS_PER_ELEMENT = 6.0
FUSABLE = ("Adam", "AdamW", "SGD", "Adagrad")  # fused=True on the CPU as on CUDA (torch >= 2.4)
OPTIMIZER_MARK = "Optimizer.step#"


class CpuSteps:
    """What the CPU rules read: the trace metadata, the index, the operators of the profiled steps with their
    self time and category ([(op, self us, category)]), and their parents (contract.run reads `gaps` and
    `per_step`, which a CPU trace does not have)."""

    def __init__(self, ix, placed, meta):
        self.ix, self.placed, self.meta, self.n = ix, placed, meta, max(1, len(ix.steps))
        self.parent = parents(by_thread(ix.cpu_ops))
        self.gaps, self.per_step, self._memo = [], [], {}

    def chain(self, op):
        """The names of the operators around op and op's own, innermost first."""
        return (str(op.get("name", "")),) + outer_names(op, self.parent, self._memo)


def _eager(chain, cat):
    """An elementwise operator run eagerly: its category one a compiler fuses (an optimizer's GEMM, counted as
    optimizer by where it ran, is still a GEMM), outside compiled code and torch's fused optimizers."""
    return cat in EAGER_CATEGORIES and classify_cpu_op(chain[0]) in EAGER_CATEGORIES and not any(
        c.startswith((*COMPILED, *FUSED_OPTIMIZERS)) for c in chain)


# The input that is a layer's weight, by operator (its index in the recorded Input Dims): a GEMM's second operand
# (addmm's third: transformers' Conv1D calls addmm(bias, x, weight)), a convolution's weight.
WEIGHT_ARG = {"aten::linear": 1, "aten::addmm": 2, "aten::mm": 1, "aten::matmul": 1, "aten::conv1d": 1,
              "aten::conv2d": 1, "aten::conv3d": 1, "aten::convolution": 1, "aten::batch_norm": 1,
              "aten::layer_norm": 2, "aten::group_norm": 2, "aten::embedding": 0}
NORMS = ("aten::batch_norm", "aten::layer_norm", "aten::group_norm")  # their weight is one-dimensional
# A hand-written norm's scale, `self.weight * x` (HF T5's RMSNorm, run once per layer norm: 32 a step in t5-small,
# read as a Python loop before): an activation times a one-dimensional operand of a parameter's shape
SCALES = ("aten::mul",)


def layer_stack(tl, key, body, times):
    """Whether a block of operators repeated `times` times a step on the line `key` is a stack of layers, not a
    Python loop over elements: every weight-taking call of the block (WEIGHT_ARG) on that line can have a parameter
    tensor of its own (the model has at least as many parameter tensors of each weight shape as the line uses a
    step), one or more an iteration. nn.Sequential of 24 Linear(64, 64), or GPT-2's 16 Conv1D calls
    (transformers/pytorch_utils.py:119, 4 shapes x 4 layers), repeat a block on one line with a weight of their own
    each time, which no call over the batch replaces; a loop over a batch's samples reuses one module's weight for
    every sample. A block that takes no weight cannot be told so: False."""
    shapes = Counter(tuple(sorted(s)) for s in (tl.meta.get("parameters") or {}).values() if isinstance(s, list))
    placer = getattr(tl.ix, "placer", None) or getattr(tl, "placer", None)  # a CPU run's, a device trace's
    if not shapes or placer is None or not body:
        return False
    cpu_run = hasattr(tl, "placed")  # else a device trace's timeline
    ops = ([op for op, _, _ in tl.placed] if cpu_run else
           [op for op in tl.ix.cpu_ops if tl.step_of(op["ts"]) is not None])
    used, steps = Counter(), set()
    for op in ops:
        name = str(op.get("name", ""))
        at = WEIGHT_ARG.get(name)
        if (at is None and name not in SCALES) or name not in body or (placer.place(op, op)[0] or (None,))[0] != key:
            continue
        if tuple(tl.chain(op)[1:2]) == (name,):
            continue  # the same operator inside itself (autocast's dispatch of aten::addmm): counted once
        dims = (op.get("args") or {}).get("Input Dims") or []
        if at is None:  # a scale: the one-dimensional operand beside an activation, where a parameter has its shape
            # (the forward's: the backward multiplies by it again, on the same line)
            one = [d for d in dims if isinstance(d, list) and len(d) == 1]
            if len(dims) == 2 and len(one) == 1 and any(isinstance(d, list) and len(d) >= 2 for d in dims) \
                    and shapes[tuple(one[0])] and not any("Backward" in c for c in tl.chain(op)):
                used[tuple(one[0])] += 1
                steps.add(None if cpu_run else tl.step_of(op["ts"]))
        elif at < len(dims) and isinstance(dims[at], list) and len(dims[at]) >= (1 if name in NORMS else 2):
            used[tuple(sorted(dims[at]))] += 1
            steps.add(None if cpu_run else tl.step_of(op["ts"]))
    # per step: a CPU run's steps, or the device trace's steps whose operators are here (its timed steps may hold
    # none, their operators joined from untimed ones)
    per_step = {shape: c / (tl.n if cpu_run else max(1, len(steps))) for shape, c in used.items()}
    return bool(per_step) and sum(per_step.values()) >= times and all(
        shapes[shape] >= c for shape, c in per_step.items())


@rule("per_tensor_optimizer", needs=("parameters",))
def per_tensor_optimizer(tl, ctx, found):
    """The optimizer's step updates the parameters tensor by tensor (issue #56: a mechanism, not an effect): in its
    own windows (the `Optimizer.step#` annotations less any closure they run: Lightning's, L-BFGS's), an in-place
    operator called a whole multiple of the parameter tensors a step, PER_TENSOR_OPS calls a tensor or more, and no
    foreach or fused operator. Priced as those windows' time (the Python loop over the tensors is the update's cost
    too: AdamW over 98 tensors, 5.6 ms profiled and 5.3 unprofiled, its calls' own time 3.2), scaled as the
    unprofiled step is to the profiled one, less what a fused update still costs."""
    marks = [m for m in tl.ix.optimizer_marks if str(m.get("name", "")).startswith(OPTIMIZER_MARK)]
    shapes = tl.meta.get("parameters") or {}
    tensors = len(shapes)
    windows = tl.ix.optimizer  # sorted, disjoint: the closures cut out (tables/closures.py)
    if not marks or not tensors or not windows:
        return None
    starts = [a for a, _ in windows]
    inside = [op for op in tl.ix.cpu_ops if find(windows, starts, op["ts"]) is not None]
    ids = {id(op) for op in inside}
    outer = [op for op in inside if id(tl.parent.get(id(op))) not in ids]  # the update's own calls, not their parts
    n = tl.n
    per_step = len(outer) / n
    calls = Counter(str(op.get("name", "")) for op in outer)
    ctx["optimizer_calls"] = {name: c / n for name, c in calls.items()}  # lines' CPU rules: the update's own loop
    per_tensor = [name for name, c in calls.items() if name.endswith("_") and c % (n * tensors) == 0]
    if (per_step < PER_TENSOR_OPS * tensors or not per_tensor
            or any(str(op.get("name", "")).startswith(("aten::_foreach_", "aten::_fused_")) for op in inside)):
        return None
    region = sum(b - a for a, b in windows) / n / 1e3
    unprofiled = ctx.get("unprofiled")
    scale = min(1.0, unprofiled / ctx["step"]) if unprofiled else 1.0  # the profiler's own share of the step out
    elements = sum(math.prod(shape) for shape in shapes.values() if isinstance(shape, list))
    fused = tensors * FUSED_US_PER_TENSOR / 1e3 + elements * FUSED_NS_PER_ELEMENT / 1e6
    healthy = per_step * UNFUSED_US_PER_CALL / 1e3 + elements * UNFUSED_NS_PER_ELEMENT / 1e6
    ms = min(region * scale, healthy) - fused
    if ms < MIN_SHARE * ctx["step"]:
        return None
    label = str(marks[0].get("name", ""))
    cls = label[len(OPTIMIZER_MARK):].split(".")[0] or "the optimizer"
    evidence = (f"`{label}` took {region:.1f} ms/step for {per_step:.0f} operator calls over {tensors} parameter "
                f"tensors ({per_step / tensors:.1f} a tensor, e.g. `{per_tensor[0]}` x{calls[per_tensor[0]] / n:.0f}; "
                "none a foreach or fused one): the update runs tensor by tensor, a Python loop and a few calls each; "
                "priced as its time" + (f" at the unprofiled step's scale (x{scale:.2f})" if scale < 1 else "")
                + (f", at most what its calls take on a healthy host ({healthy:.1f} ms)" if healthy < region * scale
                   else "")
                + f" less what a fused update still costs ({tensors} tensors of {elements:,} elements: {fused:.1f} ms)")
    fix = (f"{cls}(..., fused=True): one update over all the tensors (or foreach=True)" if cls in FUSABLE else
           f"{cls}(..., foreach=True) where it takes it, else an optimizer with a fused update (Adam, AdamW, SGD)")
    return finding("per_tensor_optimizer", ms, ctx, evidence, fix)


# Why no CPU finding prices torch.compile: compiling made every CPU loop this project timed slower (an HF GPT-2 with
# dropout +4 to +6 ms/step, a loop whose sequence length changes every step +23, a tiny HF BERT +15 to +20 after
# 40-70 s of compile; benchmarks/findings/live/new_user_fixes_cpu_results.md, a 2-core host, torch 2.11). The
# report speaks of the user's run only (issue #56 item 4): it says the gain is unmeasured, not our anecdote.
COMPILE_UNMEASURED = "the compiled step timed on this host against this one"
# Dropout's random masks on the CPU: aten::bernoulli_ under aten::dropout (native_dropout where torch fuses it),
# then a multiply, and the multiply's backward (autograd's node of the same sequence number). The HF GPT-2 of
# new_user_fixes_cpu: 23-33 of a ~105 ms step (dropout 0.1 against 0.0, fresh processes). A share worth saying:
DROPOUT_SHARE = 0.10
DROPOUT_OPS = ("aten::dropout", "aten::native_dropout", "aten::feature_dropout", "aten::alpha_dropout",
               "aten::feature_alpha_dropout", "aten::bernoulli_", "aten::bernoulli")
DROPOUT_BACKWARD = ("NativeDropoutBackward", "aten::native_dropout_backward")
DROPOUT_MISSING = "an experiment, not a fix: a lower p or fewer dropout layers change what the model computes"
SDPA_MATH = "aten::_scaled_dot_product_attention_math"  # SDPA's unfused path: on a CPU, wherever dropout_p > 0


@rule("eager_code", needs=())
def eager_code(tl, ctx, found):
    """Eager elementwise chains on the CPU, by thread and time, named in `unknown`, never a priced finding: on a
    GPU each would cost about its longest operator as one fused pass (waste.eager_code), but torch.compile
    measured slower on every CPU loop this project timed (above), so a fix that recovers that time on this CPU is
    unknown. The optimizer's chains are left to per_tensor_optimizer where it found the update tensor
    by tensor; dropout's random masks, where they are a large share of the step, get a line of their own."""
    skip_optimizer = any(f["kind"] == "per_tensor_optimizer" for f in found)
    loops, placer = ctx.get("loop_lines") or set(), getattr(tl.ix, "placer", None)  # a loop's line is priced whole
    runs, ops, parts, compiled = {}, {}, {}, False
    for op, us, cat in sorted(tl.placed, key=lambda x: x[0]["ts"]):
        chain = tl.chain(op)
        compiled = compiled or any(c.startswith(COMPILED) for c in chain)
        run = runs.setdefault(op.get("tid"), [[]])
        if loops and placer is not None and (placer.place(op, op)[0] or (None,))[0] in loops:
            continue
        if _eager(chain, cat) and not (skip_optimizer and part(chain, cat) == "the optimizer"):
            run[-1].append(us)
            ops[chain[0]] = ops.get(chain[0], 0.0) + us
            name = part(chain, cat)
            parts[name] = parts.get(name, 0.0) + us
        elif run[-1]:
            run.append([])
    _dropout(tl, ctx)
    chains = [c for per in runs.values() for c in per if c]
    n = tl.n
    gain = sum(sum(c) - max(c) for c in chains) / n / 1e3  # a lone operator gains nothing
    if gain < EAGER_MIN_SHARE * ctx["step"]:
        return None
    us = sum(sum(c) for c in chains)
    what = (f"{sum(map(len, chains)) / n:.0f} operators/step ({us / n / 1e3:.1f} ms of self time) run one by one by "
            f"eager PyTorch in {len(chains) / n:.0f} chains of elementwise operators (longest {max(map(len, chains))}"
            "): " + ", ".join(f"{p} {t / n / 1e3:.1f} ms" for p, t in top(parts))
            + "; top operators: " + ", ".join(f"{op} {t / n / 1e3:.1f} ms" for op, t in top(ops))
            + ("; the model is compiled, these ran outside its graphs" if compiled else "; no compiled graph in the "
               "trace") + f"; on a GPU, each chain fused into one pass would save ~{gain:.1f} ms/step, but whether "
            "torch.compile recovers any of it on a CPU is unmeasured here (its compiled code has a cost of its own "
            "per call, and a compile's time): time the compiled step against this one before keeping it")
    unknown(ctx, "eager_code", [COMPILE_UNMEASURED], us / n / 1e3, what, priced=False)
    return None


def _dropout(tl, ctx):
    """Dropout's random masks and their backward, where they are DROPOUT_SHARE of the step or more: an
    experiment line in `unknown` (its ms/step and share: what p=0 could recover of them), never a finding: its
    only remedies change what the model computes. Attention's dropout inside SDPA is said apart: on a CPU the
    fused attention kernel takes no dropout, so SDPA runs its math path (the scores materialized) wherever
    dropout_p > 0, and p=0 there swaps that path for the fused kernel too (HF GPT-2 with attn_pdrop 0.1:
    the masks priced 51.1 ms/step, dropout off recovered 65 of a 162 ms step in one process;
    new_user_fixes_cpu_results.md)."""
    seqs, fwd, bwd, n = set(), 0.0, 0.0, tl.n
    math_us, math_calls = 0.0, set()
    for op, us, _ in tl.placed:
        chain = tl.chain(op)
        masks = any(c.startswith(DROPOUT_OPS) for c in chain)
        if masks:
            fwd += us
            seq = (op.get("args") or {}).get("Sequence number")
            if seq is not None:
                seqs.add(seq)
        if SDPA_MATH in chain:
            math_us += 0.0 if masks else us
            if masks:
                math_calls.add(id(next(o for o in ancestors(tl, op) if o.get("name") == SDPA_MATH)))
    for op, us, _ in tl.placed:
        if _dropout_backward(tl, op, seqs):
            bwd += us
    ms = (fwd + bwd) / n / 1e3
    if ms < DROPOUT_SHARE * ctx["step"]:
        return
    attention = (f"; {len(math_calls) / n:g} attention calls a step ran SDPA's math path "
                 f"(`{SDPA_MATH}`, {math_us / n / 1e3:.1f} ms/step besides the masks) because their dropout_p > 0: "
                 "on a CPU the fused attention kernel takes no dropout, so attention's p=0 also swaps that path for "
                 "it, a gain beyond this price") if math_calls else ""
    unknown(ctx, "dropout", [DROPOUT_MISSING], ms,
            f"dropout's random masks (`aten::bernoulli_` under `aten::dropout`) and their backward take "
            f"{ms:.1f} ms/step, {100 * ms / ctx['step']:.0f}% of the step (forward {fwd / n / 1e3:.1f}, backward "
            f"{bwd / n / 1e3:.1f}){attention}; no change that keeps what the model computes is known to recover "
            "them on a CPU: dropout 0 (or fewer dropout layers) is an experiment for the research memory, kept if "
            "its validation loss at equal steps holds, not a fix", experiment=True)


def _dropout_backward(tl, op, seqs):
    """Whether op runs in dropout's backward: under a dropout backward node, or under the autograd node whose
    sequence number a dropout's forward operator recorded (the multiply by the mask's MulBackward0)."""
    return any(str(node.get("name", "")).startswith(DROPOUT_BACKWARD) or (
        str(node.get("name", "")).startswith("autograd::engine::evaluate_function")
        and (node.get("args") or {}).get("Sequence number") in seqs) for node in ancestors(tl, op))


def _waits(tl):
    """[(op, us, floor us)] of the GEMM calls that took over WAIT_RATIO x one core's floor for their FLOPs, of
    the GEMMs (name and shapes) that waited in most of their calls: one slow call among fast ones of the same
    shape is a first call's set-up (the BLAS's thread pool, its kernels loading), not threads waiting."""
    groups = {}
    for op, us, cat in tl.placed:
        if cat == "GEMM" and GEMM_OPS.match(str(op.get("name", ""))):
            flops = gemm_flops(op)
            if flops:
                key = (op.get("name"), str((op.get("args") or {}).get("Input Dims")))
                groups.setdefault(key, []).append((op, us, CALL_US + flops / CORE_FLOPS * 1e6))
    out = []
    for calls in groups.values():
        slow = [c for c in calls if c[1] > WAIT_RATIO * c[2]]
        if 2 * len(slow) > len(calls):
            out += slow
    return out


@rule("cpu_threads", needs=("shapes",))
def cpu_threads(tl, ctx, found):
    """GEMMs that waited for cores; the wait the unprofiled step can hold is the run's own (a finding naming
    the threads), the rest the profiler's (a profiler_overhead note)."""
    waits = _waits(tl)
    n, step = tl.n, ctx["step"]
    waited = sum(us - floor for _, us, floor in waits) / n / 1e3
    if waited < MIN_SHARE * step:
        return None
    unprofiled = ctx.get("unprofiled")
    own = waited if not unprofiled else max(0.0, min(waited, unprofiled - (step - waited)))
    slowest = max(waits, key=lambda w: w[1] / w[2])
    dims = " x ".join(str(d) for d in (slowest[0].get("args") or {}).get("Input Dims") or () if d)
    threads = tl.meta.get("cpu_threads") or {}
    load = threads.get("load_average")
    setting = (f"; the process ran {threads['intra_op']} intra-op threads on {threads.get('cores') or '?'} cores"
               + (f" (load average {load:.1f} as the window opened)" if load is not None else "")
               if threads.get("intra_op") else "; the trace does not record the thread count (a live capture does)")
    calls = len(waits) / n
    floors = sum(f for *_, f in waits) / n / 1e3
    evidence = (f"{calls:.3g} GEMM call{'s' * (calls != 1)}/step took {waited + floors:.1f} ms/step where one "
                f"core needs at most {floors:.2f} ms for their FLOPs (at "
                f"{CORE_FLOPS / 1e9:g} GFLOP/s + {CALL_US:g} us a call), e.g. `{slowest[0].get('name')}` {dims} "
                f"{slowest[1] / 1e3:.1f} ms: the intra-op threads waited for cores" + setting)
    if own < MIN_SHARE * step:
        return finding("profiler_overhead", waited, ctx, evidence + (
            f"; the unprofiled step ({unprofiled:.2f} ms) cannot hold that wait: the profiler's own threads (its "
            "stack sampler) competed for the cores, so this profile's times are inflated; profile when the "
            "machine is otherwise idle"), "none needed for training; for a truer profile, fewer threads or an idle "
            "machine")
    return finding("cpu_threads", own, ctx, evidence + (f"; priced at what the unprofiled step ({unprofiled:.2f} ms) "
                                                        "can hold" if unprofiled and own < waited else ""),
                   "give the intra-op threads cores of their own: torch.set_num_threads(k) (or OMP_NUM_THREADS=k) "
                   "with k at most the cores no other process uses (1 on a busy shared machine); a model this "
                   "small gains little from more threads")


# glibc takes these from the environment at start-up: no chunk mapped on its own (M_MMAP_MAX 0: chunks of any size
# come from the heap, where freed ones are reused; a threshold, 32 MiB at most, leaves larger ones mapped anew each
# time), and the heap's free top kept up to 1 GiB (M_TRIM_THRESHOLD). train.py on this project's 2-core CPU:
# ~170,000 faults and 450-550 ms a step by default, ~170,000 and ~550 with 32 MiB thresholds (its logits' chunks are
# larger), ~0 and ~250 with these; the HF GPT-2 of new_user_fixes_cpu.py on an H200 machine's CPU: ~11,000 faults
# a step priced 16.0 ms, these recovered 25.2 (the 32 MiB thresholds 14.2; issue #56, run 8 of its results).
TRIM_THRESHOLD = 1 << 30
FAULTS_FIX = (f"keep freed memory in the process: start it with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_="
              f"{TRIM_THRESHOLD} in its environment (glibc: every chunk from its heap, reused, up to 1 GiB of it kept "
              "free; or preload jemalloc or tcmalloc); the model computes the same")


@rule("page_faults", needs=())
def page_faults(tl, ctx, found):
    """The timed steps' page faults (their median a step) at the cost of one measured on this host: the time
    the step spends faulting in memory its previous step gave back."""
    each, us = tl.meta.get("timed_step_faults_each"), tl.meta.get("page_fault_us")
    if not each or not isinstance(us, (int, float)) or us <= 0:
        return None
    per_step = sorted(each)[len(each) // 2]
    ms = per_step * us / 1e3
    unprofiled = ctx.get("unprofiled") or ctx["step"]
    if ms < MIN_SHARE * unprofiled:
        return None
    ms = min(ms, unprofiled / 2)  # a bound, never reached by a loop measured: the step does work besides
    evidence = (f"the {len(each)} timed (unprofiled) steps took {per_step:,} minor page faults each (median; "
                f"{min(each):,}-{max(each):,}), {us:.2f} us a fault on this host (fresh pages written against the same "
                f"pages again): {ms:.1f} ms/step of faulting in memory that the step before handed back to the OS: "
                "glibc's malloc unmaps its large chunks and trims its heap once they are free, and the next step maps "
                "and zeroes them again (a dataset read through np.memmap faults too, and no allocator setting removes "
                "those)")
    return finding("page_faults", ms, ctx, evidence, FAULTS_FIX)


@rule("device_unused", needs=())
def device_unused(tl, ctx, found):
    """The model ran on the CPU of a machine whose GPU the trace lists (meta["gpu_unused"]): its compute operators'
    time, less the GPU_SPEEDUP share a GPU would still take, is the gain of moving the model and batch there."""
    gpu = tl.meta.get("gpu_unused")
    if not gpu:
        return None
    compute, ops = 0.0, Counter()
    loads = sorted((m["ts"], m["ts"] + m["dur"]) for m in tl.ix.loader)  # the DataLoader's work stays on the host
    starts = [a for a, _ in loads]
    for op, us, cat in tl.placed:
        if cat in DEVICE_COMPUTE and find(loads, starts, op["ts"]) is None:
            compute += us
            name = str(op.get("name", ""))
            if DEVICE_OPS.match(name):
                ops[name] += us
    gain = compute * (1 - 1 / GPU_SPEEDUP) / tl.n / 1e3
    if gain < MIN_SHARE * ctx["step"]:
        return None
    evidence = (f"{gpu} is listed in the trace's deviceProperties, yet no kernel ran and the model's operators "
                f"ran on the CPU: {compute / tl.n / 1e3:.1f} ms/step of compute operators"
                + (" (" + ", ".join(f"`{n}` {t / tl.n / 1e3:.1f} ms" for n, t in top(ops)) + ")" if ops else "")
                + f"; gain: that compute at {GPU_SPEEDUP:g}x a CPU's speed, the floor a GPU runs it at")
    return finding("device_unused", gain, ctx, evidence,
                   "a GPU is listed but the model's operators ran on the CPU: move the model and each batch to the "
                   "device (model.to('cuda'); x, y = x.to('cuda', non_blocking=True), y.to(...)), then profile again "
                   "with ProfilerActivity.CUDA")


# The input pipeline's CPU rule (the training thread in the DataLoader's next batch) is input.py's
# cpu_input_bound, which findings.diagnose_cpu runs before these.
CPU_RULES = (per_tensor_optimizer, eager_code, cpu_threads, page_faults, device_unused)
LABELS = {"per_tensor_optimizer": "an optimizer updating tensor by tensor",
          "per_parameter_loop": "a loop over the parameters", "python_loop": "a Python loop on one line",
          "eager_code": "eager elementwise chains (named, not priced) and dropout (an experiment)",
          "cpu_threads": "threads waiting for cores", "page_faults": "memory faulted in again every step",
          "input_pipeline": "the input pipeline", "device_unused": "a GPU left unused"}
