"""Pure: the work of a convolution operator from its recorded shapes (record_shapes=True). Stdlib only.

    owner = outermost(tl, op)           # the convolution operator around a kernel (aten::conv2d, ...), or None
    flops, nbytes = work(tl, owner)     # its FLOPs and the bytes it must move, or None where unknown

FLOPs: 2 x (output elements) x (input channels per group) x (kernel elements) for a forward convolution, read
from the input [N, C, *spatial] and the weight [C_out, C_in / groups, *kernel] (depthwise and grouped
convolutions count only their group's channels: the weight's second dimension is already per group); a
transposed convolution: 2 x (input elements) x (the weight's second dimension) x (kernel elements). The output's
spatial size comes from the stride, padding and dilation the operator records (`Concrete Inputs`); older traces
record no scalars, and there it comes from the backward node of the same `Sequence number`, whose input is the
output's gradient. A backward operator counts the forward's FLOPs once per gradient it computes (its
`output_mask`: the input's, the weight's; unrecorded: both). Bytes: every tensor read and written once (input,
weight, output; the backward: the output's gradient, input and weight read, the gradients written), a floor.

An operator's FLOPs are shared among its kernels by device time (roofline.work), the layout transposes cuDNN
runs inside it included.
"""
import re

from profiling.profile.trace.traceio import num

DTYPE_BYTES = {
    "c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}
# operator name -> positions of (stride, padding, dilation, transposed, groups) in its arguments; transposed as a
# bool where the operator fixes it. Backward operators: the output's gradient first, the input, the weight.
FORWARD = {
    "aten::conv1d": (3, 4, 5, False, 6), "aten::conv2d": (3, 4, 5, False, 6), "aten::conv3d": (3, 4, 5, False, 6),
    "aten::convolution": (3, 4, 5, 6, 8), "aten::_convolution": (3, 4, 5, 6, 8),
    "aten::convolution_overrideable": (3, 4, 5, 6, 8),
    "aten::conv_transpose1d": (3, 4, 7, True, 6), "aten::conv_transpose2d": (3, 4, 7, True, 6),
    "aten::conv_transpose3d": (3, 4, 7, True, 6),
    "aten::cudnn_convolution": (3, 2, 4, False, 5), "aten::mkldnn_convolution": (4, 3, 5, False, 6),
    "aten::miopen_convolution": (4, 3, 5, False, 6), "aten::miopen_depthwise_convolution": (4, 3, 5, False, 6),
    "aten::_conv_depthwise2d": (4, 5, 6, False, None),
}
# name -> (index of the output's gradient, of the input, of the weight, of transposed, of output_mask)
BACKWARD = {
    "aten::convolution_backward": (0, 1, 2, 7, 10),
    "aten::cudnn_convolution_backward": (1, 0, 2, False, 10),   # torch 1.x: (self, grad_output, weight, ...)
    "aten::convolution_backward_overrideable": (0, 1, 2, 7, 10),
}
CONV_OP = re.compile(r"^aten::\w*conv\w*$|^aten::\w*convolution\w*$")
BACKWARD_NODE = re.compile(r"Convolution\w*Backward|ConvolutionBackward")


def outermost(tl, op):
    """The outermost convolution operator among op and those around it, or None: its FLOPs are the call's whole
    work (aten::conv2d around aten::convolution around aten::cudnn_convolution count once)."""
    return _around(tl, op)[0]


def innermost(tl, op):
    """The innermost convolution operator around a kernel, or None: its dtypes are those the kernel ran in (under
    autocast, aten::conv2d takes float32 and aten::cudnn_convolution the casts, in bf16 or fp16)."""
    return _around(tl, op)[1]


def _around(tl, op):
    outer = inner = None
    while op is not None:
        if CONV_OP.match(str(op.get("name", ""))):
            outer, inner = op, inner or op
        op = tl.parent.get(id(op))
    return (outer, inner) if outer is not None and _known(outer) else (None, None)


def _known(op):
    name = str(op.get("name", ""))
    return name in FORWARD or name in BACKWARD


def work(tl, op, inner=None):
    """(FLOPs, bytes) of a convolution operator, either None where its shapes do not tell; its bytes in the dtype
    of `inner` (the innermost convolution operator: what ran) where given."""
    name = str(op.get("name", ""))
    args = op.get("args") or {}
    dims, types = args.get("Input Dims"), (inner or op).get("args", {}).get("Input type") or args.get("Input type") or []
    concrete = args.get("Concrete Inputs") or []
    if not isinstance(dims, list):
        return None, None
    size = DTYPE_BYTES.get(types[0] if types else None)
    if name in BACKWARD:
        return _backward(name, dims, concrete, size)
    stride, padding, dilation, transposed, groups = FORWARD[name]
    x, w = (dims + [None, None])[:2]
    if not _shape(x) or not _shape(w) or len(x) != len(w):
        return None, None
    transposed = transposed if isinstance(transposed, bool) else _at(concrete, transposed) == "True"
    if transposed:
        out = None  # its output's size needs output_padding too: only its FLOPs, from the input
        flops = 2.0 * _prod(x) * _prod(w[1:])
    else:
        same = _at(concrete, padding) == "same"  # stride 1 only (torch refuses others): the input's size
        spatial = list(x[2:]) if same else _out_spatial(x, w, [_ints(_at(concrete, i))
                                                               for i in (stride, padding, dilation)])
        spatial = spatial or _from_backward(tl, op, x, w)
        if spatial is None:
            return None, None
        out = [x[0], w[0]] + spatial
        flops = 2.0 * _prod(out) * _prod(w[1:])
    nbytes = size * (_prod(x) + _prod(w) + (_prod(out) if out else _prod(x))) if size else None
    return flops, nbytes


def _backward(name, dims, concrete, size):
    g_at, x_at, w_at, t_at, mask_at = BACKWARD[name]
    g, x, w = (dims[i] if i < len(dims) else None for i in (g_at, x_at, w_at))
    if not (_shape(g) and _shape(x) and _shape(w)):
        return None, None
    transposed = t_at if isinstance(t_at, bool) else _at(concrete, t_at) == "True"
    mask = re.findall(r"True|False", _at(concrete, mask_at) or "")
    grads = sum(1 for m in mask[:2] if m == "True") if mask else 2
    if grads == 0:
        return None, None  # only the bias's gradient: a reduction, not a convolution
    once = 2.0 * _prod(x if transposed else g) * _prod(w[1:])
    nbytes = size * (_prod(g) + _prod(x) + _prod(w) + (mask[:1] == ["True"] or not mask) * _prod(x)
                     + (mask[1:2] == ["True"] or not mask) * _prod(w)) if size else None
    return once * grads, nbytes


def _out_spatial(x, w, params):
    """The output's spatial size from the input's, the kernel's and (stride, padding, dilation), or None."""
    stride, padding, dilation = params
    k = len(x) - 2
    if stride is None or padding is None:
        return None
    dilation = dilation or [1]
    stride, padding, dilation = ([v[0]] * k if len(v) == 1 else v for v in (stride, padding, dilation))
    if not len(stride) == len(padding) == len(dilation) == k:
        return None
    out = [(i + 2 * p - d * (kk - 1) - 1) // s + 1
           for i, kk, s, p, d in zip(x[2:], w[2:], stride, padding, dilation)]
    return out if all(o > 0 for o in out) else None


def _from_backward(tl, op, x, w):
    """The output's spatial size from the backward node of the same Sequence number (its first input is the
    output's gradient), for traces that record no scalars; None without one."""
    seq = (op.get("args") or {}).get("Sequence number")
    if seq is None:
        return None
    grads = getattr(tl, "_conv_grads", None)
    if grads is None:
        grads = {}
        for o in tl.ix.cpu_ops:
            a = o.get("args") or {}
            if BACKWARD_NODE.search(str(o.get("name", ""))) and "Sequence number" in a:
                d = a.get("Input Dims")
                if isinstance(d, list) and d and _shape(d[0]):
                    grads[a["Sequence number"]] = d[0]
        tl._conv_grads = grads
    g = grads.get(seq)
    return list(g[2:]) if g and len(g) == len(x) and g[0] == x[0] and g[1] == w[0] else None


def _shape(d):
    return isinstance(d, list) and len(d) >= 3 and all(num(v) and v > 0 for v in d)


def _prod(xs):
    n = 1
    for v in xs:
        n *= v
    return n


def _at(concrete, i):
    return concrete[i] if isinstance(i, int) and i < len(concrete) and isinstance(concrete[i], str) else None


def _ints(text):
    """[ints] of a recorded list ("[2, 2]") or int ("1"), [0] for "valid"; None for anything else."""
    if text is None:
        return None
    if text.strip() == "valid":
        return [0]
    found = re.findall(r"-?\d+", text)
    return [int(v) for v in found] if found and re.fullmatch(r"\[?[\d,\s-]+\]?", text.strip()) else None
