"""Pure: findings about work done in a slow form, for causes no narrower rule names. Stdlib only.

- eager_code: kernels launched outside torch.compile in chains of elementwise kernels (the model, the optimizer
  or a part of them left uncompiled): the chain's kernels against one fused pass. A fused optimizer's kernels
  (torch's `fused=True`) are no chain: each is one pass already.
- fp32_intermediate: large float32 tensors (hundreds of MB) written and read by the compiled graph's
  non-GEMM kernels each micro-batch: their traffic against the same tensors in bf16.
- recompute: the backward's GEMMs doing more than twice the forward's FLOPs in a region (activation
  checkpointing: the backward re-runs the forward): the region's forward time, once per share re-run.
- forward_without_backward: the same ratio under 2 (forward GEMMs no backward trains through): the share of the
  forward time without a backward.
- over_bound (over.py): the fallback when no other rule found a cause: kernels far over their bound.

Each rule takes (timeline, context, findings so far) and returns a finding or None (profiling/profile/findings/contract.py).
"""
import re

from profiling.profile.findings.contract import (
    claim,
    compile_ignored,
    device_share,
    finding,
    limited_note,
    rule,
    top,
    trainer_is_train_py,
)
from profiling.profile.findings.settings import attribute
from profiling.profile.tables.regions import PAD_ALIGNMENTS
from profiling.profile.tables.roofline import DTYPE_BYTES, elements
from profiling.profile.trace.classify import short_name
from profiling.profile.trace.timeline import COMPILED

EAGER_CATEGORIES = ("other compute", "optimizer")  # elementwise and reduction work a compiler would fuse
EAGER_MIN_SHARE = 0.005  # of the step: the clean default's eager kernels (a few add_/stack/_foreach_copy_
                         # outside the graphs) cost 0.4 ms of 311 (0.13%) on the H100 plants of issue #26
LARGE_FP32_BYTES = 256e6  # a float32 tensor this large per micro-batch is an activation, not a statistic (the
                          # clean default has none; float32 MLP activations: 537 MB-2.1 GB, logits 8.6 GB)
# recompute: a backward GEMM pass does exactly 2x its forward's FLOPs (the input's gradient and the weight's);
# every region of every H100/H200 fixture without recomputation: 2.00; activation checkpointing: 3.00
RECOMPUTE_RATIO = 2.1
INDEX = re.compile(r"_\d+$")  # a kernel's index within its graph (`_rotary_norm_fwd_0`)
ALIGN = 8  # a matrix dimension not a multiple of this needs padding (Inductor) or slow unaligned GEMM kernels


# torch's fused optimizers (fused=True): each kernel is already one pass over its own tensors, so compiling them
# gains nothing (a clean GPT-2's fused AdamW on the H100: 1.3 ms for 124M parameters, at the bandwidth)
FUSED_OPTIMIZERS = ("aten::_fused_adam", "aten::_fused_sgd", "aten::_fused_adagrad")


def _eager(tl, chain, cat):
    return cat in EAGER_CATEGORIES and bool(chain) and not any(c.startswith((*COMPILED, *FUSED_OPTIMIZERS)) for c in chain)


# the eager parts of a step, by the operators around a kernel (innermost first), and each one's own remedy
EAGER_PARTS = (
    ("gradient clipping", ("aten::_foreach_norm", "aten::linalg_vector_norm", "clip_grad"),
     ("gradient clipping (clip_grad_norm_): clip_grad_norm_(..., foreach=True), or torch.compile one function "
      "that clips and steps the optimizer")),
    ("the optimizer", ("Optimizer.", "optimizer"),
     ("the optimizer's update: fused=True (Adam, AdamW, SGD) or foreach=True, or torch.compile the function "
      "that calls optimizer.step()")),
    ("gradient accumulation", ("AccumulateGrad", "accumulate_grad"),
     ("gradient accumulation's adds into .grad: fewer, larger micro-batches, or compiled autograd "
      "(torch._dynamo.config.compiled_autograd = True)")),
    ("the loss", ("cross_entropy", "nll_loss", "log_softmax", "mse_loss"),
     ("the loss computed outside the compiled model: compute it inside the compiled function (return the loss "
      "from it)")),
)


PART_MIN_SHARE = 0.10  # of the eager time: a part smaller than this is listed in the evidence, not the fix


MODEL = "the model"


def part(chain, cat):
    """The eager part (EAGER_PARTS' name) a kernel's operators belong to, else MODEL."""
    for name, marks, _ in EAGER_PARTS:
        if any(m in c for c in chain for m in marks) or (name == "the optimizer" and cat == "optimizer"):
            return name
    return MODEL


def _compiled(tl):
    """Whether the model is compiled: a device event outside the optimizer ran inside a compiled graph (a
    compiled optimizer step alone leaves the model eager)."""
    return any(cat != "optimizer" and any(c.startswith(COMPILED) for c in tl.chain(tl.op_of(launch)))
               for evs, cats in zip(tl.per_step, tl.labels) for (_, launch), cat in zip(evs[:3000], cats))


@rule("eager_code", needs=("device",))
def eager_code(tl, ctx, found):
    """Eager elementwise chains; each chain would cost about its longest kernel as one fused pass. The fix names
    what is eager in the user's terms: where the model is compiled, its eager parts (clipping, the optimizer,
    gradient accumulation, the loss) and their own remedies; where nothing is, torch.compile, or the setting
    that turned it off (settings.CAUSES "eager_code")."""
    if any(f["kind"] == "graph_break" for f in found):
        return None  # graph_break counts the eager kernels between the compiled fragments
    us, gain, kernels, chains, longest, ops, parts = 0.0, 0.0, 0, 0, 0, {}, {}
    events = []
    for evs, cats in zip(tl.per_step, tl.labels):
        run = []
        for (e, launch), cat in sorted(zip(evs, cats), key=lambda x: x[0][0]["ts"]) + [((None, None), None)]:
            chain = tl.chain(tl.op_of(launch)) if cat in EAGER_CATEGORIES else []
            if e is not None and _eager(tl, chain, cat):
                run.append(e["dur"])
                events.append(e)
                aten = [c for c in chain if c.startswith("aten::")]
                name = aten[-1] if aten else chain[0]
                ops[name] = ops.get(name, 0.0) + e["dur"]
                kind = part(chain, cat)
                parts[kind] = parts.get(kind, 0.0) + e["dur"]
            elif run:
                us, gain, kernels, chains = us + sum(run), gain + sum(run) - max(run), kernels + len(run), chains + 1
                longest, run = max(longest, len(run)), []
    share = device_share(tl, events, ctx, gain / us if us else 1.0)
    ms = gain * share / ctx["n"] / 1e3
    if ms < EAGER_MIN_SHARE * ctx["step"]:
        return None
    claim(ctx, events)
    compiled = _compiled(tl)
    shown = [p for p, t in top(parts) if t >= PART_MIN_SHARE * us]
    evidence = (f"{kernels / ctx['n']:.0f} kernels/step ({us / ctx['n'] / 1e3:.1f} ms) launched by eager PyTorch "
                f"outside torch.compile, mostly in {shown[0]}, in {chains / ctx['n']:.0f} chains of elementwise "
                f"kernels (longest "
                f"{longest}): " + ", ".join(f"{p} {t / ctx['n'] / 1e3:.1f} ms" for p, t in top(parts)) + "; top "
                "operators: " + ", ".join(f"{op} {t / ctx['n'] / 1e3:.1f} ms" for op, t in top(ops))
                + ("; the model is compiled (its graphs are in the trace)" if compiled else
                   "; no compiled graph in the trace") + "; gain: each chain fused into one pass as long as its "
                "longest kernel" + limited_note(share))
    f = finding("eager_code", ms, ctx, evidence, _eager_fix(tl, shown, compiled))
    return f if compiled else attribute(tl, f, "eager_code")


def _eager_fix(tl, parts, compiled, cpu=False):
    """The remedies of the eager parts, largest first. cpu: a CPU run's (train.py compiles on CUDA only)."""
    fixes = []
    for shown in parts:
        own = next((fix for name, _, fix in EAGER_PARTS if name == shown), None)
        if own:
            fixes.append(own)
        elif compiled:
            fixes.append("the model's operators outside its compiled graphs: find what keeps them out (a graph "
                         "break, torch.compiler.disable, a function the compiled module does not call) and compile "
                         "the function they run in")
        else:
            fixes.append("torch.compile the model (or the function these operators run in)"
                         + (", as train.py does by default on CUDA" if trainer_is_train_py(tl.meta) and not cpu
                            else "")
                         + "; keep the graph whole (fullgraph=True finds what breaks it)" + compile_ignored(tl.meta))
    return "; ".join(fixes)


def _fp32_share(op):
    """(float32 bytes, all bytes, the largest float32 shape) of an operator's recorded tensors, when one float32
    tensor is LARGE_FP32_BYTES or more; None otherwise."""
    args = (op.get("args") or {}) if op else {}
    total, fp32, largest = 0, 0, (0, None)
    for shape, dtype in zip(args.get("Input Dims") or [], args.get("Input type") or []):
        if isinstance(shape, list) and shape and dtype in DTYPE_BYTES:
            n = elements(shape)
            if n is None:
                return None  # a tensor of unknown size: the float32 share is unknown
            total += n * DTYPE_BYTES[dtype]
            if dtype == "float":
                fp32 += n * 4
                if n * 4 > largest[0]:  # not max(): an empty tensor ties with the start, (0, shape) vs (0, None)
                    largest = (n * 4, tuple(shape))
    return (fp32, total, largest[1]) if largest[0] >= LARGE_FP32_BYTES else None


@rule("fp32_intermediate", needs=("device", "shapes"))
def fp32_intermediate(tl, ctx, found):
    """Compiled non-GEMM kernels moving large float32 tensors: half of those bytes would do in bf16."""
    us, gain, kernels, shapes, claimed, events = 0.0, 0.0, {}, {}, ctx.get("claimed", ()), []
    for evs, cats in zip(tl.per_step, tl.labels):
        for (e, launch), cat in zip(evs, cats):
            op = tl.op_of(launch)
            share = _fp32_share(op) if cat not in ("GEMM", "attention") and id(e) not in claimed else None
            if not share or not any(c.startswith(COMPILED) for c in tl.chain(op)):
                continue  # eager kernels and copies are eager_code's
            fp32, total, shape = share
            us, gain = us + e["dur"], gain + e["dur"] * fp32 / 2 / total
            events.append(e)
            name = short_name(str(e.get("name", "")))
            kernels[name] = kernels.get(name, 0.0) + e["dur"]
            shapes[shape] = shapes.get(shape, 0.0) + e["dur"]
    ms = gain / ctx["n"] / 1e3
    if ms < EAGER_MIN_SHARE * ctx["step"]:
        return None
    (shape, _), = top(shapes, 1)
    claim(ctx, events)
    evidence = (f"{us / ctx['n'] / 1e3:.1f} ms/step of compiled kernels read or write float32 tensors of "
                f"{LARGE_FP32_BYTES / 1e6:.0f} MB or more (largest {list(shape)}, "
                f"{_mb(shape)} MB): " + ", ".join(f"`{k}` {t / ctx['n'] / 1e3:.1f} ms" for k, t in top(kernels))
                + "; gain: their float32 bytes halved (bf16), at the rate they run now")
    return finding("fp32_intermediate", ms, ctx, evidence,
                   "keep large activations in bf16: no .float() or autocast(enabled=False) around whole layers; "
                   "let float32 live only inside a fused kernel (a reduction), never as a stored tensor")


def _mb(shape):
    n = 4
    for x in shape:
        n *= x
    return f"{n / 1e6:,.0f}"


def _unbalanced(ctx, share_of, what, skip=()):
    """(ms, evidence parts) over the regions where share_of(forward GEMM FLOPs, backward GEMM FLOPs) gives a
    share of the region's forward time done for nothing (`what` says how, in the evidence); regions in `skip`
    are not judged."""
    ms, parts = 0.0, []
    for row in ctx["regions"]:
        if row["region"] in skip:
            continue
        gemm = row.get("gemm_flops") or {}
        fwd, bwd = gemm.get("forward") or 0.0, gemm.get("backward") or 0.0
        share = share_of(fwd, bwd) if fwd else None
        if share and share * (row.get("forward_ms") or 0.0) >= 0.5:  # smaller: a stray GEMM, not a pattern
            ms += share * (row.get("forward_ms") or 0.0)
            parts.append(f"{row['region']} {bwd / fwd:.2f}x ({100 * share:.0f}% of its forward {what}, "
                         f"{share * (row.get('forward_ms') or 0.0):.1f} ms)")
    return ms, parts


@rule("recompute", needs=("device", "regions"))
def recompute(tl, ctx, found):
    """Regions whose backward GEMMs do more than twice their forward's FLOPs: the backward re-runs part of the
    forward; that share of the region's forward time is the gain."""
    ms, parts = _unbalanced(ctx, lambda f, b: min(1.0, (b - 2 * f) / f) if b > RECOMPUTE_RATIO * f else None,
                            "re-run")
    if parts:
        evidence = ("the backward's GEMMs do more than twice the forward's FLOPs (2.00x when nothing is recomputed: "
                    "one GEMM for the input's gradient, one for the weight's): " + ", ".join(parts)
                    + "; gain: the re-run share of each region's forward time (the norms' and residuals' "
                    "recomputation not counted)")
    else:  # the GEMMs are not re-run, other forward work may be: operators of the forward in the backward graph
        rerun = _forward_in_backward(tl)
        ms = sum(rerun.values()) / ctx["n"] / 1e3
        evidence = ("operators of the compiled forward run again inside the compiled backward: "
                    + ", ".join(f"{op} {us / ctx['n'] / 1e3:.1f} ms" for op, us in top(rerun))
                    + "; gain: at least their time (elementwise work re-run inside the backward's fused kernels cannot "
                    "be told from the gradient's in the trace: not counted)")
    if ms < EAGER_MIN_SHARE * ctx["step"]:
        return None
    memory = ctx.get("peak_memory_mb")
    evidence += f"; peak memory {memory:,.0f} MB" if memory else ""
    return attribute(tl, finding("recompute", ms, ctx, evidence,
                                 "remove activation checkpointing (torch.utils.checkpoint, checkpoint_sequential) or "
                                 "the manual recomputation in these regions, unless memory requires it (then "
                                 "checkpoint fewer blocks, or a smaller micro-batch with more gradient "
                                 "accumulation steps instead)"), "recompute")


def _forward_in_backward(tl):
    """{operator or kernel: device us} of the non-GEMM work the compiled backward runs that the compiled forward
    also runs: operators (attention, custom ops) and hand-written kernels by name. Inductor's own fused kernels
    are named per graph, so a re-run fusion is not seen."""
    fwd, bwd, checks = set(), {}, {id(e) for e, _ in tl.checks}
    for evs, cats in zip(tl.per_step, tl.labels):
        for (e, launch), cat in zip(evs, cats):
            if cat in ("GEMM", "memory", "optimizer") or str(e.get("name", "")).startswith("triton_"):
                continue  # Inductor's kernels are named per graph: not matched (docstring)
            if id(e) in checks:
                continue  # a test for the host in both graphs (nan_asserts): no forward work, host_sync's
            chain = tl.chain(tl.op_of(launch))
            ops = [c for c in chain if "::" in c and not c.startswith("autograd::")]
            name = ops[-1] if ops else INDEX.sub("", str(e.get("name", "")))
            if name.startswith("triton_") or not chain:
                continue
            if any(c.startswith("CompiledFunctionBackward") for c in chain):
                bwd[name] = bwd.get(name, 0.0) + e["dur"]
            elif any(c.startswith(COMPILED) for c in chain):
                fwd.add(name)
    return {name: us for name, us in bwd.items() if name in fwd}


def _misaligned(parameters):
    """{parameter: shape} of the matrices with a dimension of 64 or more not a multiple of ALIGN, and the
    dimensions their GEMMs may show (as is, or padded as Inductor pads them)."""
    bad = {name: shape for name, shape in (parameters or {}).items()
           if isinstance(shape, list) and len(shape) == 2 and all(isinstance(x, int) for x in shape)
           and any(x >= 64 and x % ALIGN for x in shape)}
    dims = {-(-x // a) * a for shape in bad.values() for x in shape if x >= 64 and x % ALIGN
            for a in (1,) + PAD_ALIGNMENTS}
    return bad, dims


def _on_dims(op, dims):
    shapes = (op.get("args") or {}).get("Input Dims") if op else None
    return isinstance(shapes, list) and any(isinstance(s, list) and dims.intersection(s) for s in shapes)


@rule("misaligned_shapes", needs=("device", "parameters", "bounds", "shapes"))
def misaligned_shapes(tl, ctx, found):
    """Kernels on the shapes of parameters whose dimensions are not multiples of ALIGN: their time over their
    bound (the same kinds of kernels on aligned shapes, for comparison, in the evidence)."""
    bounds = getattr(tl, "bounds", None)
    bad, dims = _misaligned(tl.meta.get("parameters"))
    if not bounds or not bad:
        return None
    acc, kernels, events = {}, {}, []  # (category, on misaligned shapes) -> [us, bound us]; kernel name -> us
    for evs, cats, bs in zip(tl.per_step, tl.labels, bounds):
        for (e, launch), cat, b in zip(evs, cats, bs):
            if not b or cat not in ("GEMM", "other compute"):
                continue
            hit = _on_dims(tl.op_of(launch), dims)
            row = acc.setdefault((cat, hit), [0.0, 0.0])
            row[0], row[1] = row[0] + e["dur"], row[1] + b
            if hit:
                kernels[str(e.get("name", ""))] = kernels.get(str(e.get("name", "")), 0.0) + e["dur"]
                events.append(e)
    gain, parts = 0.0, []
    for cat in ("GEMM", "other compute"):
        (us, b), (ref_us, ref_b) = acc.get((cat, True), (0.0, 0.0)), acc.get((cat, False), (0.0, 0.0))
        if us:
            gain += us - b
            parts.append(f"{cat} {us / ctx['n'] / 1e3:.1f} ms at {us / b:.2f}x its bound"
                         + (f" (on aligned shapes {ref_us / ref_b:.2f}x)" if ref_b else ""))
    ms = gain / ctx["n"] / 1e3
    if ms < EAGER_MIN_SHARE * ctx["step"]:
        return None
    claim(ctx, events)
    names = list(bad)
    shown = ", ".join(f"{n} {bad[n]}" for n in names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    evidence = (f"{len(names)} parameters have a dimension not a multiple of {ALIGN}: {shown}; the kernels on "
                "their shapes (as is, or padded by Inductor): " + "; ".join(parts) + "; top: "
                + ", ".join(f"`{short_name(k)}` {t / ctx['n'] / 1e3:.1f} ms" for k, t in top(kernels))
                + "; gain: those kernels brought to their bound (the extra passes Inductor adds to pad them count "
                "as needed work)")
    return finding("misaligned_shapes", ms, ctx, evidence, _aligned_fix(bad))


VOCAB_NAMES = ("embed", "wte", "tok", "vocab", "lm_head", "head", "logits", "classifier")  # a vocabulary's matrices


def _aligned_fix(bad):
    """The edit for misaligned parameters, and whether it keeps the model's math: a vocabulary padded with rows
    whose logits are masked computes the same loss; a hidden width rounded is another model."""
    vocab = sorted({x for name, shape in bad.items() if any(w in name.lower() for w in VOCAB_NAMES)
                    for x in shape if x >= 64 and x % ALIGN})
    widths = [name for name, shape in bad.items() if not any(w in name.lower() for w in VOCAB_NAMES)]
    parts = []
    if vocab:
        v = vocab[-1]
        parts.append(f"pad the vocabulary {v} to {-(-v // 64) * 64} (a multiple of 64) and mask the padded rows' "
                     "logits to -inf before the softmax / cross-entropy (or slice them off, logits[..., :vocab]): "
                     "the loss and the model's outputs stay exactly the same")
    if widths:
        parts.append(f"round the width behind {', '.join(widths[:2])} (a hidden size, a head count x head size) "
                     f"to a multiple of 64 (at least of {ALIGN}): that changes the model (its parameter count), so "
                     "compare its loss, not only its speed")
    return "; ".join(parts)


@rule("forward_without_backward", needs=("device", "regions"))
def forward_without_backward(tl, ctx, found):
    """Regions whose backward GEMMs do less than twice their forward's FLOPs: part of the forward has no
    backward (a forward under no_grad in the step, an output the loss never uses, a frozen weight). Attention
    on SDPA's math path is trained through plain matmul and softmax backward nodes, which the attention
    region's backward FLOPs do not count: where the trace shows that path with its softmax backward, attention
    is left out (T5-small on the H100: 13.7 ms of its forward were read as untrained)."""
    skip = ("attention",) if _math_path_trained(tl) else ()
    ms, parts = _unbalanced(ctx, lambda f, b: (2 * f - b) / (2 * f) if b < f * 4 / RECOMPUTE_RATIO else None,
                            "without a backward", skip)
    if ms < EAGER_MIN_SHARE * ctx["step"]:
        return None
    evidence = ("the backward's GEMMs do less than twice the forward's FLOPs (2.00x when every forward GEMM is "
                "trained through): " + ", ".join(parts) + "; gain: that share of each region's forward time")
    return finding("forward_without_backward", ms, ctx, evidence,
                   "find the forward work in the step that no loss trains through: a second forward under "
                   "torch.no_grad (a train-loss or metric pass: do it once per eval, not per step), a layer whose "
                   "output is unused; frozen weights by design are fine")


# SDPA's math path and the softmax backward node its autograd records (SafeSoftmaxBackward0 in torch 2.11)
MATH_PATH = "_scaled_dot_product_attention_math"
SOFTMAX_BACKWARD = ("SafeSoftmaxBackward", "SoftmaxBackward", "aten::_softmax_backward_data")


def _math_path_trained(tl):
    """Whether the trace runs attention on SDPA's math path and records a softmax backward (its autograd)."""
    names = {str(op.get("name", "")) for op in tl.ix.cpu_ops}
    return any(MATH_PATH in n for n in names) and any(b in n for n in names for b in SOFTMAX_BACKWARD)

