"""Pure: where a step's time goes inside the model -- the region table of the profile. Stdlib only, never torch.

Regions: embedding, convolution (a conv net's convolutions, pooling and, in a model without an MLP, its
activations; a row only where there is some), attention (projections and attention kernels), MLP, norms and
residuals, head and loss, optimizer, data movement, communication (collectives between ranks: a row only
where there are some), and `unattributed` (time no rule below could place: shown, never dropped); then
GPU idle and overlap from the step budget, so the rows add up to the step. The model regions (and
unattributed) are split into forward and backward.

Each device event (CPU profile: each operator's self time) is placed by the first rule that applies:

1. The step budget's own categories: `optimizer` (launched inside the optimizer annotation window but not
   by a closure's forward or backward run in it (closures.py), or named for an optimizer), `memory`
   (memcpy/memset records) and `communication` (NCCL kernels, c10d/gloo collectives) -> optimizer, data
   movement, communication; `attention` kernels (flex/flash/fused attention) -> attention. So these rows
   match the budget.
2. GEMMs (the budget's GEMM kernels, or launched by aten::mm/addmm/bmm/linear/...): by the weight they
   multiply. The launching operator is found by the launch's `External id`; with record_shapes=True it
   has its input shapes. Every matrix operand (not addmm's bias: [768] is also every norm's shape), and the
   product (a weight-gradient GEMM *produces* the weight's shape), is matched, as is or transposed, against
   the parameter shapes the capture records in the trace metadata (`autoresearch.parameters`: name -> shape).
   The matching parameters' module paths give the region (below). Embedding tables are read by index, never
   multiplied, so they count only when no other parameter has the shape: a product with an embedding table
   is a tied output head (head and loss).
3. Names: the ops a Triton kernel fused (Inductor names the kernel after them:
   `triton_per_fused__fused_rms_norm_add_embedding_mul_select_0`), then the launching operator's name and
   those of the operators around it (eager: aten::index_select inside aten::embedding; autograd nodes
   such as ReluBackward0). In this order: convolution (convolution, conv2d, max/avg pooling); attention
   (flex_attention, attention, attn, flash, fmha, sdpa, scaled_dot_product); embedding (embedding, embedding_dense_backward); MLP (relu, gelu, silu, glu,
   mish, threshold_backward; relu squared is relu + pow; a conv net without an MLP: convolution, its
   activations are its conv blocks'); head and loss (log_softmax, nll_loss,
   cross_entropy, tanh: the logit soft-cap); attention again for a plain softmax; norms and residuals
   (rms_norm, layer_norm, any *norm). Generic CUDA kernel names (templates) are not read: they name
   functors, not layers.
4. Parameter-shaped inputs (weight casts `_to_copy`, gradient accumulation `add_`): that parameter's region.
5. Residual arithmetic (add, mul, sub, rsub, lerp, neg in the fused ops or the operator name): norms and
   residuals (the residual adds and the x = a*x + b*x0 mixes); not inside AccumulateGrad (that add_ sums
   a parameter's gradient: rule 4 or unattributed).
6. Otherwise unattributed, listed with the reason (no shapes recorded, no parameter with that shape, a
   parameter of no known region, no rule for the name).

Parameters -> regions, by module path (`blocks.3.mlp.c_fc.weight`), innermost name first; each name whole
with its `_` dropped, then its `_`-separated words from the last (attention_norm is a norm, tok_embeddings an
embedding): embedding (wte, wpe, emb, embed, embeds, embedding...), head and loss (head, unembed,
classifier, pooler), convolution (conv, conv1, Conv2d, stem), attention (attn, attention, qkv, rotary), MLP (mlp,
ffn, ff, fc, experts, moe, feed_forward, intermediate), norms and residuals (ln, bn, bn1, *norm, BatchNorm2d,
resid, residual, lambda, lambdas). A model's own top-level `fc` (torchvision's ResNet) is its classifier; BERT's
`layer.N.output.dense` its MLP's second matrix; a 3-D to 5-D weight no name places, a convolution's. Failing
those, a module named `output` or `output_layer` that holds the parameter itself, outside any numbered block, is
the model's head (Meta's Llama, torchtitan, Megatron; BERT's layer.3.output.dense is not). A path naming none of these (a new layer
type) places nothing: its GEMMs stay unattributed and the parameter is listed.

Padded shapes: Inductor pads a GEMM dimension that is not a multiple of 8 (bf16; 4 in float32) before
multiplying (its pad_mm pass: a [262144, 2049] activation becomes [262144, 2056]), so a GEMM also matches a
parameter whose shape, rounded up to a multiple of 4, 8 or 16, is the GEMM's (`Parameters.padded`).

Roles: a 2-D GEMM a @ b multiplies one weight: second in a forward (x @ W^T) and an input gradient (dY @ W), as
the product in a weight gradient (dY^T @ x, whose inner dimension is the tokens per micro-batch: the most
common row count of the trace's GEMMs). The first of (b, a, product), or (product, b, a) for a weight gradient,
that has a parameter's shape decides, so an activation that happens to have a weight's shape ([768, 768] with 768
tokens per micro-batch) does not.

Shared shapes: when the parameters with a GEMM's shape live in several regions (c_q and c_proj are both
[512, 512], both attention: fine; an MLP of 1x width would share [512, 512] with attention), the time is
split in proportion to the number of those parameters in each region: same-shaped weights do the same
GEMM work per token. Every split is listed (`shared_shapes`), so it can be checked.

Forward and backward: an event is backward when its launch lies inside an
`autograd::engine::evaluate_function` operator on the launching thread (on CUDA the autograd engine runs on
its own thread; the compiled backward graph runs inside CompiledFunctionBackward), or when it is a gradient
GEMM the compiler moved into a compiled forward (`moved_to_backward`: train.py's fused loss has the head's
two gradient GEMMs there), forward otherwise. A kernel fusing forward and backward work (train.py's loss
kernel writes the loss's gradient as it reads the logits) counts where it runs.

Roofline: each row's FLOPs (GEMMs and attention, from shapes) and Triton bytes, and the rates they give
against the device's peaks (profiling/profile/tables/roofline.py).

Limits: without parameter shapes (or record_shapes) GEMMs are unattributed; the q/k RMSNorm and rotary
are fused into one rms_norm kernel and count as norms; value-embedding gates fuse with their embedding.
"""
import itertools
import re
from collections import Counter

from profiling.profile.tables import roofline
from profiling.profile.trace.classify import classify_cpu_op, short_name
from profiling.profile.trace.traceio import (
    MODULE_PREFIX,
    backward_windows,
    by_thread,
    is_backward,
    outer_names,
    parents,
)

MODEL_REGIONS = ("embedding", "convolution", "attention", "MLP", "norms and residuals", "head and loss")
REGIONS = MODEL_REGIONS + ("optimizer", "data movement", "communication", "unattributed")
PAD_ALIGNMENTS = (4, 8, 16)  # Inductor pads a GEMM's misaligned dimension to a multiple of 8 (bf16) or 4 (fp32)
BY_CATEGORY = {"optimizer": "optimizer", "memory": "data movement", "attention": "attention",
               "communication": "communication"}
SOMETIMES = ("communication", "convolution")  # regions with a row only where they have time
NO_PARAMETERS = "no parameter shapes in the trace metadata (autoresearch.parameters): GEMMs are unattributed"
BY_MODULES = ("no parameter shapes in the trace metadata: what no name places is placed by the nn.Module it ran "
              "in (the trace's module scopes)")
MAX_LISTED = 5          # unattributed kernels and parameters listed in the summary

# ---------------------------------------------------------------------------------------------------------
# Rules: module paths and op names -> regions
# ---------------------------------------------------------------------------------------------------------

_PATH_WORDS = (
    ("embedding", {"wte", "wpe", "emb", "embed", "embeds", "embedding", "embeddings"}),
    ("head and loss", {"head", "unembed", "unembedding", "classifier", "pooler"}),
    ("convolution", {"conv", "convs", "convolution", "stem"}),
    ("attention", {"attn", "attention", "qkv", "rotary"}),
    ("MLP", {"mlp", "ffn", "ff", "fc", "experts", "moe", "feedforward", "intermediate"}),
    ("norms and residuals", {"ln", "norm", "resid", "residual", "lambda", "lambdas", "bn"}),
)
_NUMBERED = re.compile(r"^(conv|bn|fc)(\d+)$")  # conv1, bn2, fc1: a layer's kind, numbered
_DIMS = re.compile(r"(?<=[a-z])[123]d$")          # torch's Conv2d, BatchNorm1d: the kind without its dims
_OUTPUT = {"output", "outputlayer"}  # the model's own output layer (Llama's `output`, Megatron's `output_layer`)


def _words(*words):
    return re.compile(r"(?<![a-z0-9])(?:" + "|".join(words) + r")(?![a-z0-9])")


_NAME_RULES = (
    ("convolution", _words("convolution", "convolution_backward", "cudnn_convolution", "conv1d", "conv2d",
                           "conv3d", "conv_depthwise2d", "slow_conv2d_forward", r"max_pool\w*", r"avg_pool\w*",
                           r"adaptive_\w*pool\w*")),
    ("attention", _words("flex_attention", "attention", "attn", "flash", "fmha", "sdpa", "scaled_dot_product")),
    ("embedding", _words("embedding")),
    ("MLP", _words("relu", "gelu", "silu", "swiglu", "geglu", "glu", "mish", "threshold_backward")),
    ("head and loss", _words("log_softmax", "nll_loss", "cross_entropy", "tanh")),
    ("attention", _words("(?<!log_)softmax")),
    ("norms and residuals", _words("[a-z0-9]*norm")),
)
_RESIDUAL = _words("add", "mul", "sub", "rsub", "lerp", "neg")
_GRAD_ACCUMULATION = _words("accumulate_grad")
_TRITON = re.compile(r"^triton_(?:poi|per|red|tem|for)_fused_(.*?)(?:_\d+)?$")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_NON_WORD = re.compile(r"[^a-z0-9]+")


def path_region(name):
    """The region of a parameter from its module path, innermost name first; None when none is named.

    Within a name, the whole name (`feed_forward` as feedforward) and then its words from the last: the last
    word says what a compound is (attention_norm and post_attention_layernorm are norms, lm_head a head).
    """
    parts = name.lower().split(".")
    if parts[:1] == ["fc"] and len(parts) == 2:
        return "head and loss"  # a model's own top-level fc (torchvision's ResNet): its classifier
    for part in reversed(parts):
        for word in [part.replace("_", "")] + part.split("_")[::-1]:
            region = _word_region(word)
            if region:
                return region
    if len(parts) >= 2 and parts[-2].replace("_", "") in _OUTPUT and not any(p.isdigit() for p in parts[:-2]):
        return "head and loss"
    if "output" in parts[:-1] and "dense" in parts and any(p.isdigit() for p in parts):
        return "MLP"  # BERT's and HF ViT's layer.N.output.dense: the feed-forward's second matrix
    return None


def _word_region(word):
    numbered = _NUMBERED.match(word)
    word = numbered.group(1) if numbered else _DIMS.sub("", word)  # conv1 -> conv; conv2d, batchnorm2d
    for region, words in _PATH_WORDS:
        if word in words:
            return region
    return "norms and residuals" if word.endswith("norm") else None


def normalize(name):
    """An op or kernel name as lowercase words joined by `_` (camelCase split): ReluBackward0 -> relu_backward0."""
    return _NON_WORD.sub("_", _CAMEL.sub(r"\1_\2", name).lower()).strip("_")


def name_region(text):
    """The region a (normalized) name names, by the ordered rules of the module docstring; or None."""
    for region, pattern in _NAME_RULES:
        if pattern.search(text):
            return region
    return None


def triton_ops(kernel):
    """The fused-op part of an Inductor Triton kernel name, or None for other kernels."""
    m = _TRITON.match(kernel)
    return m.group(1) if m else None


# ---------------------------------------------------------------------------------------------------------
# Parameter shapes
# ---------------------------------------------------------------------------------------------------------

class Parameters:
    """Parameter shapes from the trace metadata: shape (as is, and transposed for matrices) -> parameters."""

    def __init__(self, parameters):
        self.region = {}
        self.by_shape = {}
        self.padded = {}  # a matrix's shape padded as Inductor pads a misaligned GEMM -> parameters
        for name, shape in (parameters or {}).items():
            if not (isinstance(shape, list) and shape and all(isinstance(x, int) for x in shape)):
                continue
            # a kernel-shaped weight (3-D to 5-D) of no named region: a convolution's (VGG's features.0.weight)
            self.region[name] = path_region(name) or ("convolution" if 3 <= len(shape) <= 5 else None)
            for key in {tuple(shape), tuple(reversed(shape)) if len(shape) == 2 else tuple(shape)}:
                self.by_shape.setdefault(key, []).append(name)
        for name in _linear_chains(parameters or {}, self.region):
            self.region[name] = "MLP"
        for name in self.region:
            shape = parameters[name]
            for align in PAD_ALIGNMENTS if len(shape) == 2 else ():
                padded = tuple(-(-x // align) * align for x in shape)
                for key in {padded, padded[::-1]} - self.by_shape.keys():
                    self.padded.setdefault(key, []).append(name)
        for key, names in self.padded.items():
            self.by_shape[key] = list(dict.fromkeys(names))

    def __bool__(self):
        return bool(self.region)

    def unplaced(self):
        return [name for name, region in self.region.items() if region is None]

    def matching(self, shapes):
        """The parameters having one of `shapes` (each once), in metadata order."""
        found = {}
        for shape in shapes:
            for name in self.by_shape.get(shape, ()):
                found[name] = True
        return list(found)

    def counts(self, names, gemm=False):
        """{region: number of these parameters in it}; a parameter of no known region counts as unattributed.

        For a GEMM, embedding tables count only when nothing else matched (then: a tied head).
        """
        regions = [self.region[n] for n in names]
        if gemm:
            others = [r for r in regions if r != "embedding"]
            regions = others or ["head and loss"] * len(regions)
        counts = {}
        for r in regions:
            counts[r or "unattributed"] = counts.get(r or "unattributed", 0) + 1
        return counts


_INDEXED = re.compile(r"^(.*)\.(\d+)\.(weight|bias)$")  # a numbered layer's parameter: `net.0.weight`


def _linear_chains(parameters, region):
    """The parameters of numbered Linear layers in one container that no name places (`net.0.weight`,
    `net.2.weight`: an nn.Sequential of Linear layers and activations), where two or more chain (each one's input
    width the previous one's output width): an MLP, whatever the container is called."""
    layers = {}
    for name, shape in parameters.items():
        m = _INDEXED.match(name)
        if m and region.get(name) is None and m.group(3) == "weight" and isinstance(shape, list) and len(shape) == 2:
            layers.setdefault(m.group(1), []).append((int(m.group(2)), shape))
    out = []
    for container, found in layers.items():
        found.sort()
        keep = set()
        for (i, a), (j, b) in itertools.pairwise(found):
            if a[0] == b[1]:  # Linear weights are [out, in]: this one's output feeds the next
                keep |= {i, j}
        out += [f"{container}.{i}.{kind}" for i in sorted(keep) for kind in ("weight", "bias")
                if f"{container}.{i}.{kind}" in parameters and region.get(f"{container}.{i}.{kind}") is None]
    return out


def _shapes(dims, gemm):
    """The tensor shapes among an operator's `Input Dims`; for a GEMM only its matrices and the product of the
    first two chained ones (a weight-gradient GEMM's output has the weight's shape and need not be listed).
    A GEMM's 1-D inputs (addmm's and linear's bias) are not what it multiplies, and their shape ([768]) is
    every norm's too: matched, they put a third of GPT-2's forward GEMMs in norms and residuals."""
    if not isinstance(dims, list):
        return []
    shapes = [tuple(d) for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    if not gemm:
        return shapes
    shapes = [s for s in shapes if len(s) >= 2]
    for a, b in itertools.pairwise(list(shapes)):
        if a[-1] == b[-2]:
            shapes.append(a[:-1] + b[-1:])
            break
    return shapes


# ---------------------------------------------------------------------------------------------------------
# Placing one event
# ---------------------------------------------------------------------------------------------------------

class Placer:
    """Places events by the rules of the module docstring; results cached by what they depend on."""

    def __init__(self, params, modules=None, tokens=None, activations=None, no_shapes=None):
        self.params = params
        self.no_shapes = no_shapes or "GEMM: no input shapes recorded (record_shapes=False)"  # why, for a GEMM
        self.modules = modules  # Modules: the last rule, for what nothing else placed
        self.tokens = tokens    # the rows of a forward GEMM's activation (tokens per micro-batch), or None
        self.activations = activations or "MLP"  # the region of activation functions (activation_region)
        self.cache = {}

    def place(self, kernel, category, op, outer=()):
        """(((region, share), ...), reason for any unattributed share or None, shared-shape record or None).

        `kernel`: the device event's (or CPU operator's) name; `category`: its step-budget category; `op`:
        the operator that launched it (None if unknown); `outer`: the names of the operators around that one.
        """
        op = op or {}
        dims = (op.get("args") or {}).get("Input Dims")
        names = ((str(op["name"]),) if "name" in op else ()) + outer
        key = (kernel, category, names, str(dims))
        if key not in self.cache:
            self.cache[key] = self._place(kernel, category, names, dims)
        placed = self.cache[key]
        if self.modules and placed[0] == UNATTRIBUTED and op:
            region = self.modules.region(op)
            if region:
                return ((region, 1.0),), None, None
        return placed

    def _place(self, kernel, category, names, dims):
        if category in BY_CATEGORY:
            return ((BY_CATEGORY[category], 1.0),), None, None
        gemm = category == "GEMM" or bool(names) and classify_cpu_op(names[0]) == "GEMM"
        reason = None
        if gemm:
            placed = self._by_shape(dims, gemm=True)
            if placed[0]:
                return placed
            reason = placed[1]
        fused = triton_ops(kernel)
        texts = ([normalize(fused)] if fused else []) + [normalize(n) for n in names]
        for text in texts:
            region = name_region(text)
            if region:
                return ((self.activations if region == "MLP" else region, 1.0),), None, None
        accumulating = any(_GRAD_ACCUMULATION.search(t) for t in texts)  # a parameter's .grad, not a residual
        if not gemm and self.params and dims:
            placed = self._by_shape(dims, gemm=False, activations=not accumulating)
            if placed[0]:
                return placed
        if not accumulating and any(_RESIDUAL.search(t) for t in texts[:2 if fused else 1]):
            return (("norms and residuals", 1.0),), None, None
        return UNATTRIBUTED, reason or "no rule for its name or shapes", None

    def _by_shape(self, dims, gemm, activations=False):
        """Placement by parameter shapes: (shares or None, reason, shared-shape record or None). `activations`:
        the operator may work on activations, so a 2-D shape with the tokens per micro-batch as a dimension
        ([T, C] or [C, T]) is no parameter's evidence (with T == C it has every square weight's shape)."""
        if not self.params:
            return None, "GEMM: no parameter shapes in the trace metadata", None
        if not isinstance(dims, list):
            return None, self.no_shapes, None
        shapes = _shapes(dims, gemm)
        if activations and self.tokens:
            shapes = [x for x in shapes if not (len(x) == 2 and self.tokens in x)]
        names = self.params.matching(shapes)
        for role in _roles(shapes, self.tokens) if gemm else ():
            names = self.params.matching([role])
            if names:
                shapes = [role]
                break
        if not names:
            return None, "GEMM: no parameter has its shapes " + " x ".join(map(_fmt, shapes[:3])), None
        counts = self.params.counts(names, gemm=gemm)
        total = sum(counts.values())
        shares = tuple((r, c / total) for r, c in counts.items())
        unknown = [n for n in names if self.params.region[n] is None]
        reason = "parameter of no known region: " + ", ".join(unknown[:3]) if unknown else None
        shared = None
        if len(counts) > 1:
            shape = next(s for s in shapes if s in self.params.by_shape)
            shared = (shape, tuple(counts.items()))
        return shares, reason, shared


def _roles(shapes, tokens):
    """A 2-D GEMM's matrices in the order they are likely the weight, so a coincidence of sizes (tokens per
    micro-batch equal to the hidden size: x [768, 768] has an attention weight's shape) cannot place it. a @ b:
    forward (x @ W^T) and input gradient (dY @ W) multiply the weight second; a weight gradient (dY^T @ x)
    sums over the tokens (inner dimension = tokens) and produces the weight's shape. [] when not 2-D."""
    mats = [s for s in shapes if len(s) == 2]
    if len(mats) < 2 or mats[0][1] != mats[1][0]:
        return []
    a, b = mats[0], mats[1]
    product = (a[0], b[1])
    return [product, b, a] if tokens and a[1] == tokens else [b, a, product]


def tokens_of(cpu_ops):
    """The most common row count of the GEMMs' first matrix: the tokens per micro-batch of every forward and
    input-gradient GEMM (x [tokens, C] @ W^T); None when no 2-D GEMM is recorded."""
    rows = Counter()
    for op in cpu_ops:
        if roofline.GEMM_OPS.match(str(op.get("name", ""))):
            dims = (op.get("args") or {}).get("Input Dims")
            mats = [d for d in dims if isinstance(d, list) and len(d) == 2] if isinstance(dims, list) else []
            if mats and isinstance(mats[0][0], int):
                rows[mats[0][0]] += 1
    return rows.most_common(1)[0][0] if rows else None


def activation_region(params, modules, cpu_ops):
    """Where activation functions (relu, gelu, ...) go: MLP in a model with one; a conv net's (convolutions,
    no MLP; by its parameters, module scopes or operators) are part of its convolution blocks."""
    known = set(params.region.values()) | {path_region(p) for p in set((modules.path if modules else {}).values())}
    conv = "convolution" in known or any("convolution" in str(op.get("name", "")) for op in cpu_ops[:5000])
    return "convolution" if conv and "MLP" not in known else "MLP"


UNATTRIBUTED = (("unattributed", 1.0),)


class Modules:
    """The region of the nn.Module an operator ran in, from torch's module scopes (`nn.Module: <Class>_<k>`
    python_function events, recorded with with_stack=True or with_modules=True): the rule for what nothing
    else placed, so a plain trace without parameter metadata still has regions. A forward operator's
    modules are the scopes around it on its thread; a backward one runs on the autograd thread outside every
    scope, so it takes the modules of the forward operator with its autograd `Sequence number`. Class names
    read as module paths do (path_region, innermost first): CausalSelfAttention -> attention, MLP -> MLP,
    RMSNorm -> norms; a Linear or a Block names no region, so the module around it decides."""

    def __init__(self, scopes, cpu_ops, parent):
        self.parent, self.path, self.forward = parent, {}, {}
        by_tid = {}
        for e in scopes:
            name = str(e.get("name", ""))[len(MODULE_PREFIX):]
            by_tid.setdefault(e.get("tid"), []).append((e["ts"], 0, e["ts"] + e["dur"], name.rsplit("_", 1)[0]))
        for op in cpu_ops:
            if op.get("tid") in by_tid:
                by_tid[op["tid"]].append((op["ts"], 1, op["ts"], op))
            seq = (op.get("args") or {}).get("Sequence number")
            if seq is not None and not _is_backward_op(op) and (seq not in self.forward
                                                                or op["ts"] < self.forward[seq]["ts"]):
                self.forward[seq] = op
        for items in by_tid.values():  # one sweep per thread: the scopes open at each operator, outermost first
            stack = []
            for ts, is_op, end, what in sorted(items, key=lambda x: (x[0], x[1])):
                while stack and stack[-1][0] < ts:
                    stack.pop()
                if is_op:
                    self.path[id(what)] = ".".join(normalize(name) for _, name in stack)
                else:
                    stack.append((end, what))

    def __bool__(self):
        return bool(self.path)

    def region(self, op):
        """The region of the modules op (or, for backward work, its forward operator) ran in; or None."""
        path = self.path.get(id(op))
        if not path:
            forward = self._forward_of(op)
            path = self.path.get(id(forward)) if forward else None
        return path_region(path) if path else None

    def _forward_of(self, op):
        seen = 0
        while op is not None and seen < 64:
            if _is_backward_op(op):
                seq = (op.get("args") or {}).get("Sequence number")
                if seq is not None:
                    return self.forward.get(seq)
            op, seen = self.parent.get(id(op)), seen + 1
        return None


def _is_backward_op(op):
    """An autograd node's evaluation (`autograd::engine::evaluate_function: MmBackward0`) or the node itself."""
    name = str(op.get("name", ""))
    return name.startswith("autograd::engine::evaluate_function") or _BACKWARD_NODE.search(name) is not None


_BACKWARD_NODE = re.compile(r"Backward\d*$")


def _fmt(shape):
    return "[" + ", ".join(map(str, shape)) + "]"


# ---------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------

class Totals:
    """Summed time (us, all steps) by (region, phase), with the work done (FLOPs; bytes and the time of the
    kernels whose bytes are known), what was unattributed and which shapes were split."""

    def __init__(self, work=False):
        self.work = work   # whether FLOPs and bytes are counted (device profiles)
        self.us, self.flops, self.bytes, self.bytes_us, self.bound, self.gemm_flops = {}, {}, {}, {}, {}, {}
        self.unplaced = {}
        self.shared = {}

    def add(self, us, placed, backward, name, flops=None, nbytes=None, bound=None, gemm=False):
        shares, reason, shared = placed
        phase = "backward" if backward else "forward"
        for region, f in shares:
            key = (region, phase if region in MODEL_REGIONS or region == "unattributed" else None)
            self.us[key] = self.us.get(key, 0.0) + us * f
            self.bound[key] = self.bound.get(key, 0.0) + (us if bound is None else bound) * f
            if flops:
                self.flops[key] = self.flops.get(key, 0.0) + flops * f
                if gemm:
                    self.gemm_flops[key] = self.gemm_flops.get(key, 0.0) + flops * f
            if nbytes:
                self.bytes[key] = self.bytes.get(key, 0.0) + nbytes * f
                self.bytes_us[key] = self.bytes_us.get(key, 0.0) + us * f
            if region == "unattributed":
                self.unplaced[(name, reason)] = self.unplaced.get((name, reason), 0.0) + us * f
        if shared:
            self.shared[shared] = self.shared.get(shared, 0.0) + us


def device_table(tl, categories, meta, budget, work=None, peaks=(None, None), moved=None, bounds=None):
    """The region table of a device profile.

    tl: the trace's Timeline (profiling/profile/trace/timeline.py: device events per step, operators by External id and by
    thread); categories: the step-budget category of each event, nested as tl.per_step; budget: the
    summary's step_ms and categories; work: each event's (FLOPs, bytes), nested as tl.per_step
    (profiling/profile/tables/roofline.py), or None; peaks: the device's peak FLOP/s and bytes/s (None where unknown);
    moved: `moved_to_backward`'s result, when the caller has it; bounds: each event's bound in us or None
    (profiling/profile/tables/bound.py), nested as tl.per_step, or None.
    """
    params, modules = Parameters(meta.get("parameters")), Modules(tl.ix.modules, tl.ix.cpu_ops, tl.parent)
    placer = Placer(params, modules, tokens_of(tl.ix.cpu_ops), activation_region(params, modules, tl.ix.cpu_ops),
                    _no_shapes(meta))
    windows = backward_windows(tl.threads)
    totals = Totals(work=work is not None)
    moved = moved_to_backward(tl, placer.params) if moved is None else moved
    moved_us = 0.0
    for k, (evs, cats) in enumerate(zip(tl.per_step, categories)):
        for i, ((e, launch), cat) in enumerate(zip(evs, cats)):
            op = tl.op_of(launch)  # by External id, else the operator around the launch (torch 1.9's traces)
            name = str(e.get("name", ""))
            placed = placer.place(name, cat, op, outer_names(op, tl.parent, tl.memo) if op else ())
            backward = is_backward(launch, windows) or id(e) in moved
            moved_us += e["dur"] if id(e) in moved else 0.0
            flops, nbytes = work[k][i] if work else (None, None)
            totals.add(e["dur"], placed, backward, name, flops, nbytes, bounds[k][i] if bounds else None,
                       gemm=cat == "GEMM")
    table = _table(totals, len(tl.per_step), budget, "GPU idle", budget["categories"]["idle"], placer.params, peaks,
                   bounds is not None, placer.modules)
    table["moved_to_backward_ms"] = _r(moved_us / max(1, len(tl.per_step)) / 1e3)
    return _unmeasured(table, meta)


def moved_to_backward(tl, params):
    """ids of the device events that are backward work run inside a compiled forward.

    AOTAutograd's partitioner may move backward work into the forward graph when that saves memory: train.py's
    fused loss computes the head's gradient GEMMs there, since their outputs are smaller than the logits'
    gradient they need. By thread and time such GEMMs look like forward work; by shapes they are not. Inside
    one call of a compiled forward (`CompiledFunction`):
    1. a weight-gradient GEMM: its product has a parameter's shape and neither operand has one (a forward GEMM
       always multiplies by a parameter);
    2. an input-gradient GEMM of a parameter with a weight-gradient GEMM of rule 1 in the same call: it
       multiplies by that parameter, its other operand has the shape of the first GEMM on that parameter's
       output, and differs from that GEMM's input (a square weight cannot be told apart: left forward).
    """
    if not params:
        return set()
    scopes = {}
    for evs, cats in zip(tl.per_step, tl.labels):
        for (e, launch), cat in zip(evs, cats):
            if cat != "GEMM":
                continue
            op = tl.ops.get((launch.get("args") or {}).get("External id"))
            mats = _operands(op)
            scope = _compiled_call(tl, op) if mats else None
            if scope is not None:
                scopes.setdefault(scope, []).append((launch["ts"], e, mats))
    moved = set()
    for gemms in scopes.values():
        gemms.sort(key=lambda g: g[0])
        grads, first, inputs = set(), {}, []
        for _, e, (a, b, product) in gemms:
            pa, pb, pp = (_param_key(params, x) for x in (a, b, product))
            if pp and not pa and not pb:
                grads.add(pp)
                moved.add(id(e))
            elif bool(pa) != bool(pb):
                key, other = (pa, b) if pa else (pb, a)
                seen = first.setdefault(key, (other, product))
                if seen[0] != other and seen[1] == other:
                    inputs.append((key, e))
        moved.update(id(e) for key, e in inputs if key in grads)
    return moved


def _operands(op):
    """(a, b, a @ b) shapes of a GEMM operator's two matrices, each as (rows, cols); None when not recorded."""
    dims = (op.get("args") or {}).get("Input Dims") if op else None
    if not isinstance(dims, list):
        return None
    mats = [tuple(d) for d in dims if isinstance(d, list) and len(d) == 2 and all(isinstance(x, int) for x in d)]
    if str(op.get("name", "")) == "aten::addmm":
        mats = mats[1:]
    if len(mats) < 2 or mats[0][1] != mats[1][0]:
        return None
    return mats[0], mats[1], (mats[0][0], mats[1][1])


def _param_key(params, shape):
    names = params.by_shape.get(shape)
    return tuple(sorted(names)) if names else None


def _compiled_call(tl, op):
    """The `CompiledFunction` operator (one call of a compiled forward) around op, as an id; None outside."""
    while op is not None:
        if op.get("name") == "CompiledFunction":
            return id(op)
        op = tl.parent.get(id(op))
    return None


def cpu_table(ix, placed_ops, meta, budget):
    """The region table of a CPU profile: placed_ops is [(operator, self time in us, budget category)]."""
    threads = by_thread(ix.cpu_ops)
    parent, windows = parents(threads), backward_windows(threads)
    params, modules, memo = Parameters(meta.get("parameters")), Modules(ix.modules, ix.cpu_ops, parent), {}
    placer = Placer(params, modules, tokens_of(ix.cpu_ops), activation_region(params, modules, ix.cpu_ops),
                    _no_shapes(meta))
    totals = Totals()
    for op, self_us, cat in placed_ops:
        name = str(op.get("name", ""))
        placed = placer.place(name, cat, op, outer_names(op, parent, memo))
        totals.add(self_us, placed, is_backward(op, windows), name)
    gap = budget["categories"]["outside ops"]
    return _unmeasured(_table(totals, len(ix.steps), budget, "outside ops", gap, placer.params,
                              modules=placer.modules), meta)


def _no_shapes(meta):
    """Why GEMMs have no input shapes, when the capture's shape step did not run (the loop ended before it: the
    metadata's `shapes` says so); None for the usual reason (a trace recorded without record_shapes)."""
    record = meta.get("shapes")
    if isinstance(record, dict) and record.get("missing"):
        return f"GEMM: no input shapes, the shape step after the profiled ones did not run: {record['missing']}"
    return None


def _unmeasured(table, meta):
    """`unmeasured`: {why, ms_per_step} where the GEMMs were left unplaced because the shape step did not run, so
    a model region's row reads low or 0 without being measured so (the report says `not measured`)."""
    why = _no_shapes(meta)
    ms = sum(u["ms_per_step"] for u in table["unattributed"] if u["reason"] == why) if why else 0.0
    if ms:
        table["unmeasured"] = {"why": why.removeprefix("GEMM: "), "ms_per_step": _r(ms)}
    return table


def _table(totals, n, budget, gap_name, gap_ms, params, peaks=(None, None), bounded=False, modules=None):
    step = budget["step_ms"]
    rows = []
    for region in REGIONS:
        keys = [(region, p) for p in ("forward", "backward", None)]
        if region in SOMETIMES and not any(key in totals.us for key in keys):
            continue
        fwd, bwd, other = (totals.us.get(key, 0.0) / n / 1e3 for key in keys)
        split = region in MODEL_REGIONS or region == "unattributed"
        row = _row(region, fwd + bwd + other, step, fwd if split else None, bwd if split else None)
        if totals.work:
            flops, nbytes, bytes_us = (sum(d.get(key, 0.0) for key in keys) / n
                                       for d in (totals.flops, totals.bytes, totals.bytes_us))
            row.update(roofline.rates(flops, (fwd + bwd + other) * 1e3, nbytes or None, bytes_us, *peaks))
            gemm = [totals.gemm_flops.get(key, 0.0) / n for key in keys[:2]]
            if split and any(gemm):
                row["gemm_flops"] = {"forward": gemm[0], "backward": gemm[1]}
        if bounded:
            row["bound_ms"] = _r(sum(totals.bound.get(key, 0.0) for key in keys) / n / 1e3)
        rows.append(row)
    device = sum(r["ms_per_step"] for r in rows)
    rows += [_row(gap_name, gap_ms, step), _row("overlap", budget["categories"]["overlap"], step)]
    if totals.work:
        for row in rows[-2:]:
            row.update(roofline.rates(None, None))
    if bounded:  # the GPU waiting does no work: its bound is 0; overlap is counted once, as in the step
        rows[-2]["bound_ms"], rows[-1]["bound_ms"] = 0.0, rows[-1]["ms_per_step"]
    unplaced = sorted(totals.unplaced.items(), key=lambda kv: -kv[1])
    unknown = params.unplaced()
    lost = next(r for r in rows if r["region"] == "unattributed")["ms_per_step"]
    return {
        "parameters": len(params.region),
        "rows": rows,
        "attributed_percent": _r(100 * (1 - lost / device) if device else 0.0),
        "unattributed": [{"name": short_name(name), "raw_name": name, "reason": reason,
                          "ms_per_step": _r(us / n / 1e3)} for (name, reason), us in unplaced[:MAX_LISTED]],
        "shared_shapes": [{"shape": list(shape), "parameters": dict(counts), "ms_per_step": _r(us / n / 1e3)}
                          for (shape, counts), us in sorted(totals.shared.items(), key=lambda kv: -kv[1])],
        "unplaced_parameters": unknown[:MAX_LISTED], "unplaced_parameters_total": len(unknown),
        "notes": [] if params else [BY_MODULES if modules else NO_PARAMETERS],
    }


def _row(region, ms, step, forward=None, backward=None):
    return {"region": region, "forward_ms": _r(forward), "backward_ms": _r(backward), "ms_per_step": _r(ms),
            "pct_of_step": _r(100 * ms / step if step else 0.0)}


def _r(x):
    return None if x is None else round(float(x), 4)


def by_region(summary):
    """{region: ms/step} of a summary's region table; empty when it has none (an older summary)."""
    table = summary.get("regions") or {}
    return {r["region"]: r["ms_per_step"] for r in table.get("rows", [])}
