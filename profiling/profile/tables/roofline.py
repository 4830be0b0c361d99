"""Pure: the work each device event does, for the roofline columns of the region and kernel tables. Stdlib only.

- FLOPs of GEMMs: 2 x M x N x K (x batch) from the launching operator's recorded input shapes (`aten::mm`,
  `addmm`, `bmm`, ...; the trace needs record_shapes=True).
- FLOPs of attention: from q [B, H, Tq, D] and k [B, Hk, Tk, D] of the attention operator around the kernels
  (`aten::_scaled_dot_product_*`, `autoresearch::window_attention*`): 4 x B x H x D per attended (query, key)
  pair, the pairs counted exactly for the mask the operator names (full; causal when its `is_causal` input
  is True, or, unrecorded, when the model is causal (profiling/profile/tables/attention_kind.py); train.py's window
  attention: causal over the last `window` keys, its last integer input). A
  backward counts 2.5 x its forward (the useful work: five matrix products against two; the recomputation
  of the scores that flash kernels do is not counted), as MFU conventions do.
- FLOPs and bytes of convolutions: from the outermost convolution operator's recorded shapes (tables/conv.py:
  the input, the weight, stride, padding, groups; depthwise and transposed too), for every kernel it launches,
  whatever its name's category (cuDNN 9 runs some 1x1 convolutions as nvjet GEMMs; the layout transposes).
- Bytes of a Triton kernel (Inductor's fused kernels, train.py's own): every tensor argument once, read or
  written, from the shapes and dtypes the kernel's own CPU operator records. A floor: an argument read and
  written in place moves twice, a broadcast one is read more than once.

No event's FLOPs exceed its time at the device's peak for its number format (hardware.peak_for; the format
from its dtypes and kernel name, `format_of`): a winograd convolution does fewer multiplications than the
convolution it computes, and a count that overstates the work is never quoted as a rate above the peak.

An operator that runs as several kernels (a split-K GEMM and its reduction, cuDNN's attention backward) has
its FLOPs shared among them by device time, so each kernel shows its operator's rate and no FLOP counts
twice. Everything else (elementwise ops of eager PyTorch, cuBLAS's and cuDNN's own bytes) is left out: no
number where the trace does not support one.
"""
import re

from profiling.profile.tables import conv
from profiling.profile.trace import hardware
from profiling.profile.trace import settings as recorded
from profiling.profile.trace.timeline import input_types
from profiling.profile.trace.traceio import num

GEMM_OPS = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|_scaled_mm|_int_mm)$")
ATTENTION_OP = re.compile(r"^(aten|autoresearch)::\w*(scaled_dot_product|attention)\w*$")
BACKWARD_FACTOR = 2.5
DTYPE_BYTES = {
    "c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4, "short int": 2,
    "bool": 1, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}


def gemm_flops(op):
    """2 x M x N x K (x batch) of a GEMM operator from its recorded input shapes, or None."""
    dims = (op.get("args") or {}).get("Input Dims") if op else None
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    a, b = dims[0], dims[1]
    if str(op.get("name", "")) in ("aten::addmm", "aten::baddbmm") and len(dims) >= 3:
        a, b = dims[1], dims[2]
    if not (isinstance(a, list) and isinstance(b, list) and len(a) >= 2 and len(b) >= 2):
        return None
    if not all(num(x) for x in a + b) or a[-1] != b[-2]:
        return None
    batch = 1
    for x in a[:-2]:
        batch *= x
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def _pairs(tq, tk, causal, window):
    """Attended (query, key) pairs: all; causal, queries aligned to the last keys (query i sees keys up to
    i + tk - tq); or causal over the last `window` keys too (0 <= i - j <= window)."""
    if not causal:
        return tq * tk
    w = tk - 1 if window is None else min(window, tk - 1)
    a, b = tk - tq, tk - 1            # the last key each query sees, first and last query
    if b <= w:
        seen = (a + b) * (b - a + 1) // 2
    elif a >= w:
        seen = w * tq
    else:
        seen = (a + w) * (w - a + 1) // 2 + w * (b - w)
    return seen + tq


def attention_flops(op, causal=True, force=None):
    """FLOPs of one attention operator call, or None when its q and k shapes are not recorded.

    causal: whether the call is causal when its is_causal input is not recorded (profiling/profile/
    attention_kind.py says from the model; a bidirectional or unknown model: False). force: True or False
    counts the pairs of that mask whatever the call says (the work a [T, T] mask needs: causal when it hides
    the future)."""
    sizes = _qk(op)
    if sizes is None:
        return None
    b, h, tq, d, tk = sizes
    args, name = op.get("args") or {}, str(op.get("name", ""))
    concrete = args.get("Concrete Inputs") or []
    window = None
    if "window" in name:
        ints = [int(c) for c in concrete if isinstance(c, str) and c.isdigit()]
        window = ints[-1] if ints else None
    flag = causal_flag(concrete)
    if force is not None and "window" not in name:
        flag = force
    pairs = _pairs(tq, tk, "window" in name or (causal if flag is None else flag), window)
    forward = 4.0 * b * h * d * pairs
    return forward * BACKWARD_FACTOR if "backward" in name else forward


def _qk(op):
    """(B, H, Tq, D, Tk) of an attention operator from its recorded q and k shapes, or None."""
    args = (op.get("args") or {}) if op else {}
    dims, name = args.get("Input Dims"), str(op.get("name", "")) if op else ""
    at = 1 if "backward" in name else 0   # backward operators take the output's gradient first, then q, k, v
    if not isinstance(dims, list) or len(dims) < at + 2:
        return None
    q, k = dims[at], dims[at + 1]
    if not (isinstance(q, list) and isinstance(k, list) and len(q) == 4 and len(k) == 4):
        return None
    (b, h, tq, d), (b2, _, tk, d2) = q, k
    if name.startswith(("aten::_flash_attention", "aten::_efficient_attention")):  # ATen's kernels: [B, T, H, D]
        (b, tq, h, d), (b2, tk, _, d2) = q, k
    if (b, d) != (b2, d2) or not all(num(x) and x > 0 for x in (b, h, tq, d, tk)):
        return None
    return b, h, tq, d, tk


def tile_padding(op, tile):
    """How much more work a kernel tiling queries and keys by `tile` does than the call's sequence lengths
    need: (Tq and Tk rounded up to the tile) over (Tq x Tk); 1.0 where unknown. At T=197 (ViT-B/16) and
    128-wide tiles: 256^2 / 197^2 = 1.69, work no edit of the model's own code removes."""
    sizes = _qk(op)
    if sizes is None:
        return 1.0
    _, _, tq, _, tk = sizes
    return (-(-tq // tile) * tile) * (-(-tk // tile) * tile) / (tq * tk)


def causal_flag(concrete):
    """The is_causal input of an SDPA operator from its Concrete Inputs (its position differs by variant), or
    None when they hold no flag."""
    flags = [c for c in concrete or () if c in ("True", "False")]
    if not flags:
        return None
    # forward variants: (..., [compute_log_sumexp,] [dropout_p,] is_causal, ...): the flag after dropout_p;
    # backward variants end in (..., dropout_p, is_causal, [scale]); both: the first flag after a float
    floats = [i for i, c in enumerate(concrete) if re.fullmatch(r"-?\d*\.\d*(e-?\d+)?", c or "")]
    after = [c for c in concrete[floats[0] + 1:] if c in ("True", "False")] if floats else flags
    return (after or flags)[0] == "True"


def tensor_bytes(op):
    """Bytes of a Triton kernel's tensor arguments (each once), from its own CPU operator; None otherwise."""
    args = (op.get("args") or {}) if op else {}
    dims, types = args.get("Input Dims"), args.get("Input type")
    if args.get("kernel_backend") != "triton" or not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0
    for shape, dtype in zip(dims, types):
        if isinstance(shape, list) and shape and dtype in DTYPE_BYTES:
            n = elements(shape)
            if n is None:
                return None  # a tensor of unknown size: the bytes are unknown, not the others' sum
            total += n * DTYPE_BYTES[dtype]
    return total or None


def elements(shape):
    """The number of elements of a recorded shape, or None where a dimension is not a number (null, symbolic)."""
    if not isinstance(shape, list) or not all(num(x) for x in shape):
        return None
    n = 1
    for x in shape:
        n *= x
    return n


def _flops_of(tl, op, category, causal=True):
    """(operator owning the FLOPs, its FLOPs, its bytes or None) for a device event launched by `op`; None when
    its FLOPs are unknown."""
    owner = conv.outermost(tl, op) if category not in ("memory", "optimizer", "communication", "attention") \
        and op is not None else None
    if owner is not None:
        flops, nbytes = conv.work(tl, owner, conv.innermost(tl, op))
        return (owner, flops, nbytes) if flops else None
    if category == "GEMM" and op is not None and GEMM_OPS.match(str(op.get("name", ""))):
        owner, flops = op, gemm_flops(op)
    elif category == "attention":
        owner = op
        while owner is not None and not ATTENTION_OP.match(str(owner.get("name", ""))):
            owner = tl.parent.get(id(owner))
        flops = attention_flops(owner, causal) if owner is not None else None
    else:
        return None
    return (owner, flops, None) if flops else None


def work(tl, causal=True):
    """[[(flops or None, bytes or None)]] parallel to tl.per_step: what each device event does. An operator's
    FLOPs (and a convolution's bytes) are shared among its kernels by device time. causal: whether an attention
    call whose is_causal input is not recorded is causal (the model's kind, profiling/profile/tables/
    attention_kind.py)."""
    found, us = [], {}   # per event: (owner, FLOPs) or None, bytes; device us per owning operator
    for evs, cats in zip(tl.per_step, tl.labels):
        row = []
        for (e, launch), cat in zip(evs, cats):
            op = tl.op_of(launch)
            owned = _flops_of(tl, op, cat, causal)
            if owned:
                us[id(owned[0])] = us.get(id(owned[0]), 0.0) + e["dur"]
            row.append((owned, tensor_bytes(op)))
        found.append(row)
    device = tl.meta.get("device")
    return [[_share(owned, e, us, nbytes, _peak(tl, device, e, launch, owned))
             for (e, launch), (owned, nbytes) in zip(evs, row)] for evs, row in zip(tl.per_step, found)]


def _peak(tl, device, e, launch, owned):
    """The device's peak FLOP/s for an event's number format, or None (no FLOPs, or a format or device not known)."""
    return hardware.peak_for(device, format_of(tl, e, tl.op_of(launch))) if owned and device else None


def _share(owned, e, us, nbytes, peak):
    """(flops, bytes) of one event: its share by device time of its owner's FLOPs (and a convolution's bytes),
    the FLOPs no more than its time at `peak`."""
    if not owned or not us[id(owned[0])]:
        return None, nbytes
    share = e["dur"] / us[id(owned[0])]
    flops = owned[1] * share
    return (min(flops, peak * e["dur"] / 1e6) if peak else flops), owned[2] * share if owned[2] else nbytes


def format_of(tl, e, op):
    """The number format of a GEMM, convolution or attention event (hardware.compute_format), or None."""
    return hardware.compute_format(input_types(op), str(e.get("name", "")), _tf32(tl, op))


def _tf32(tl, op):
    """Whether the process let this float32 call run as TF32: cuDNN's flag for a convolution (torch's default:
    on), cuBLAS's for a GEMM (default: off); None without a settings record."""
    record = tl.meta.get("settings")
    if not isinstance(record, dict):
        return None
    name = str(op.get("name", "") if op else "")
    return recorded.value(record, "cudnn.allow_tf32" if "conv" in name else "cuda.matmul.allow_tf32")


def rates(flops, us, nbytes=None, bytes_us=None, peak_flops=None, peak_bandwidth=None):
    """The roofline fields of a table row: FLOPs over the row's whole device time (us); bytes over the time of
    the kernels whose bytes are known (bytes_us). Rates are None where the work or the time is unknown."""
    out = {"flops": flops, "tflops_per_s": None, "percent_of_peak": None,
           "bytes": nbytes, "gb_per_s": None, "percent_of_bandwidth": None}
    if flops is not None and us and us > 0:
        rate = flops / (us / 1e6)
        out["tflops_per_s"] = round(rate / 1e12, 1)
        out["percent_of_peak"] = round(100 * rate / peak_flops, 1) if peak_flops else None
    if nbytes and bytes_us and bytes_us > 0:
        rate = nbytes / (bytes_us / 1e6)
        out["gb_per_s"] = round(rate / 1e9, 1)
        out["percent_of_bandwidth"] = round(100 * rate / peak_bandwidth, 1) if peak_bandwidth else None
    return out
