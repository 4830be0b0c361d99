"""Kernel and operator names -> readable names and step-budget categories. Pure, no torch.

Categories (the rules, applied in this order; the first that matches wins):

0. `communication`: collectives between ranks. On the GPU, NCCL's and RCCL's kernels
   (`ncclDevKernel_AllReduce_Sum_bf16_RING_LL`, `ncclKernel_...`), NVLS/multimem and symmetric-memory kernels
   (`multimem_all_reduce_kernel`, `one_shot_all_reduce_kernel`, `two_shot_...`); on the CPU, the c10d and gloo
   collectives (`c10d::allreduce_`,
   `gloo:all_reduce`, `record_param_comms`, the functional `_c10d_functional::all_reduce` and its
   `wait_tensor`). DDP's own bucket copies and gradient division (`...reducer::...`) stay compute.
1. `optimizer`: launched inside an optimizer annotation window (decided by the caller, see summary.py; a
   closure's forward and backward inside `optimizer.step(closure)` are not: closures.py),
   or a name that names an optimizer (adam, muon, lamb, lion, sgd, optimizer).
2. `memory`: device memcpy/memset records (`gpu_memcpy`, `gpu_memset`); on CPU, allocation and copy ops.
3. `attention`: flex/flash/fused attention kernels, including Triton kernels that fused an attention op.
4. `convolution`: cuDNN's and MIOpen's convolution kernels on every GPU family (implicit-GEMM `fprop`/`dgrad`/
   `wgrad` and `scudnn` kernels, `implicit_convolve_sgemm`, `wgrad_alg0_engine`, winograd and FFT kernels,
   `conv2d_c1_k1_nhwc`, depthwise kernels, MIOpen's `igemm_fwd/bwd/wrw` and composable-kernel `grouped_conv`),
   Inductor's convolution templates, and the layout transposes cuDNN and MIOpen run around a convolution whose
   tensors are not in the layout its kernel wants (`nchwToNhwcKernel`, `batched_transpose_*`,
   `transpose_NCHW2CNHW`); on the CPU, the convolution operators: NCHW tensors (not channels_last) cost these passes. A kernel of another name that a
   convolution operator launched (cuDNN 9 runs some 1x1 convolutions as cuBLAS's `nvjet` GEMMs) keeps its
   name's category: the roofline prices it from the convolution's shapes all the same (tables/roofline.py).
5. `GEMM`: cuBLAS/cuBLASLt (nvjet, xmma, gemm, splitKreduce), CUTLASS, rocBLAS/hipBLASLt's Tensile kernels
   (Cijk_...: an AMD trace's GEMMs), Triton mm templates; on CPU
   the matmul ops (aten::mm, addmm, bmm, ...).
6. `other compute`: every other kernel we recognise: Triton (fused elementwise, norms, loss), PyTorch's
   own kernels (at::native, cub, ...), cuDNN's batch norm (`bn_fw_tr_1C11_...`, `bn_bw_...`), or names with
   elementwise/reduce/norm/softmax/loss words.
7. `other`: anything else. The report lists these by name, so nothing is hidden.
"""
import functools
import re

CATEGORIES = ("GEMM", "convolution", "attention", "other compute", "optimizer", "memory", "communication", "other")

_OPTIMIZER = re.compile(r"adam|muon|optimizer|(?<![a-z])(lamb|lion|sgd)(?![a-z])", re.IGNORECASE)
# dot_do_o and convert_dq: the helper kernels of cuDNN's SDPA backward (compute_dot_do_o_specialized, ...)
_ATTENTION = re.compile(r"attention|attn|flash|fmha|sdpa|_mha|mha_|dot_do_o|convert_dq", re.IGNORECASE)
# cuDNN (scudnn/hcudnn/s1688cudnn families, xmma/cutlass fprop/dgrad/wgrad implicit GEMMs, the engines of older
# versions, winograd and FFT kernels, cask helpers, depthwise kernels), MIOpen (igemm_*_gtc, naive_conv, composable
# kernel's grouped_conv, its transposes), im2col/col2im of ATen's slow convolution; "conv" not followed by "ert"
# (convert_*). Inductor's pointwise kernels may carry "convolution" in their fused ops' names
# (triton_poi_fused_..._convolution_backward_...): they are elementwise, checked before this.
_CONV = re.compile(r"conv(?!ert)|[shd]cudnn|\d{3,4}cudnn|cudnn_(?:ampere|volta|turing|hopper|maxwell|pascal|sm\d+)_|"
                   r"fprop|dgrad|wgrad|winograd|cask_cudnn|fft2d_|fft3d_|gcgemm|igemm_(?:fwd|bwd|wrw)|miopen|"
                   r"im2col|col2im|vol2col|col2vol|scalePackedTensor|xdlops_bwd_(?:weight|data)", re.IGNORECASE)
# layout transposes run for a convolution whose tensors are not in its kernel's layout (cuDNN: NCHW <-> NHWC;
# MIOpen: batched_transpose_*, transpose_NCHW2CNHW)
LAYOUT_TRANSPOSE = re.compile(r"nchwToNhwc|nhwcToNchw|nchw2nhwc|nhwc2nchw|batched_transpose|transpose_(?:NCHW|CNHW|"
                              r"NHWC)", re.IGNORECASE)
_BATCH_NORM = re.compile(r"(?:^|::)bn_(?:fw|bw)|batch_?norm", re.IGNORECASE)
_GEMM = re.compile(r"gemm|gemv|nvjet|cutlass|cublas|xmma|wgmma|hmma|splitkreduce|matmul|"
                   r"^(ampere|volta|turing|hopper|sm\d+)_|^Cijk_", re.IGNORECASE)
_TRITON_MM = {"mm", "addmm", "bmm", "baddbmm", "scaled"}
_OTHER_COMPUTE = re.compile(r"^triton_|at::|c10::|cub::|thrust::|at_cuda_detail|elementwise|reduce|norm|"
                            r"softmax|loss|cross_entropy|embedding|index|gather|scatter|copy|fill|cat_|sort", re.IGNORECASE)
_CPU_GEMM = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|_scaled_mm|mkldnn_(?!conv)\w*|linear)",
                       re.IGNORECASE)
_CPU_CONV = re.compile(r"^aten::(\w*conv\w*|_?convolution\w*|\w*_convolution\w*)$", re.IGNORECASE)
# NCCL's and RCCL's kernels; NVLink SHARP (NVLS) and multimem collectives; torch's symmetric-memory kernels
# (one_shot_all_reduce_kernel, two_shot_all_reduce_kernel, multimem_all_reduce_kernel, symm_mem ops); custom
# all-reduce kernels of inference engines (vLLM's cross_device_reduce_1stage)
_COMM_KERNEL = re.compile(r"^(nccl|rccl)|multimem|nvls|symm_mem|one_shot_all_reduce|two_shot_all_reduce|"
                          r"cross_device_reduce|all_?reduce_kernel|all_?gather_kernel|reduce_?scatter_kernel",
                          re.IGNORECASE)
_COMM_OP = re.compile(r"^(gloo:|nccl:|c10d::|_?c10d_functional::|symm_mem::|record_param_comms$)")
_CPU_MEMORY = re.compile(r"^aten::(copy_|to|_to_copy|empty\w*|zero_|zeros\w*|ones\w*|fill_|clone|"
                         r"contiguous|new_\w+|full\w*|resize_)$", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def classify_kernel(raw, device_cat="kernel", in_optimizer=False):
    """The category of one device event: its raw kernel name, its trace `cat`, and where it was launched."""
    if is_communication(raw, device=True):
        return "communication"
    if in_optimizer or _OPTIMIZER.search(raw):
        return "optimizer"
    if device_cat in ("gpu_memcpy", "gpu_memset", "memcpy", "memset"):
        return "memory"
    if _ATTENTION.search(raw):
        return "attention"
    if is_convolution(raw):
        return "convolution"
    if _GEMM.search(raw) or _is_triton_mm(raw):
        return "GEMM"
    if _OTHER_COMPUTE.search(raw) or _BATCH_NORM.search(raw):
        return "other compute"
    return "other"


@functools.lru_cache(maxsize=4096)
def classify_cpu_op(name, in_optimizer=False):
    """The category of one CPU operator (the CPU-profile twin of classify_kernel)."""
    if is_communication(name):
        return "communication"
    if in_optimizer or _OPTIMIZER.search(name):
        return "optimizer"
    if _CPU_MEMORY.match(name):
        return "memory"
    if _ATTENTION.search(name):
        return "attention"
    if _CPU_CONV.match(name):
        return "convolution"
    if _CPU_GEMM.match(name):
        return "GEMM"
    return "other compute"


def is_convolution(raw):
    """True for a convolution kernel or the layout transpose around one, by name (module docstring, rule 4)."""
    if raw.startswith("triton_") and not raw.startswith("triton_tem_"):
        return False  # Inductor's fused elementwise kernels (their names list the ops they fuse)
    return bool(_CONV.search(raw) or LAYOUT_TRANSPOSE.search(raw)) and not _BATCH_NORM.search(raw)


def is_communication(name, device=False):
    """True for a collective: an NCCL kernel (device=True), or a c10d/gloo/NCCL operator or annotation on the CPU."""
    return bool((_COMM_KERNEL if device else _COMM_OP).search(name))


def _is_triton_mm(raw):
    return raw.startswith("triton_tem_") and bool(_TRITON_MM & set(raw.split("_")))


# ---------------------------------------------------------------------------------------------------------
# Readable names
# ---------------------------------------------------------------------------------------------------------

MAX_NAME = 72
_TRITON = re.compile(r"^triton_(poi|per|red|tem|for)_fused_(.*?)(?:_(\d+))?$")
# Ops in Inductor kernel names that say nothing about the work: views and dtype casts.
_NOISE_OPS = ("_unsafe_view", "_to_copy", "unsafe_view", "as_strided", "lift_fresh", "scalar_tensor",
              "unsqueeze", "transpose", "permute", "squeeze", "reshape", "expand", "select", "detach",
              "arange", "alias", "clone", "slice", "view", "t")
_KEEP_AFTER = r"(?!(?:backward|forward|data|scatter|default)(?:_|$))"
_NOISE = [re.compile("_" + re.escape(op) + r"(?=_" + _KEEP_AFTER + r"|$)") for op in _NOISE_OPS]
_ARCH = re.compile(r"(?:(?<=_)|^)sm\d{2,3}[a-z]?_")
_WRAPPERS = {"Kernel", "Kernel2", "device_kernel"}  # CUTLASS: the template argument is the kernel
_GENERIC = _WRAPPERS | {"kernel", "multi_tensor_apply_kernel",
            "vectorized_elementwise_kernel", "unrolled_elementwise_kernel", "elementwise_kernel",
            "reduce_kernel", "index_elementwise_kernel", "elementwise_kernel_with_index"}
_HINTS = (re.compile(r"\w*(?:Functor|functor)\w*"),
          re.compile(r"\blaunch_\w+|\bcutlass_\w+|\w+Sm\d+\w*|\w+_kernel_impl|\w+Op\b"))


def short_name(raw):
    """A readable kernel name: no `void`, templates, arguments, namespaces or arch noise.

    Different raw names may shorten to the same name; `unique_names` disambiguates them.
    """
    raw = raw.strip()
    m = _TRITON.match(raw)
    if m:
        name = _short_triton(*m.groups())
    elif raw.startswith("void ") or "<" in raw or "::" in raw:
        name = _short_cpp(raw)
    else:
        name = raw
    name = _ARCH.sub("", name).lstrip("_") or raw
    if len(name) > MAX_NAME:
        name = name[:MAX_NAME - 1] + "…"
    return name


def inductor_kernel(raw):
    """(kind, ops, index) of an Inductor kernel name `triton_{kind}_fused_{ops}_{index}`, the ops without the
    views and casts of _NOISE_OPS (kept when there is nothing else), index None when absent; None for any
    other name."""
    m = _TRITON.match(raw.strip())
    return None if m is None else (m[1], _strip_noise(m[2]), m[3])


def _strip_noise(ops):
    s = "_" + ops
    for pat in _NOISE:
        s = pat.sub("", s)
    return s.replace("__fused_", "_").replace("__", "_").strip("_") or ops.replace("__", "_").strip("_")


def _short_triton(kind, ops, idx):
    name = f"triton_{kind}_fused_{_strip_noise(ops)}"
    tail = f"_{idx}" if idx else ""
    if len(name) + len(tail) > MAX_NAME:
        name = name[:MAX_NAME - len(tail) - 1] + "…"
    return name + tail


def _short_cpp(raw):
    s = raw.removeprefix("void ")
    base, args = _split_templates(s)
    parts = [p for p in base.split("::") if p.strip()]
    name = parts[-1].strip() if parts else s
    if name in _GENERIC and args:
        hint = next((m.group(0) for pat in _HINTS for m in [pat.search(args)] if m), None)
        if hint:
            name = hint if name in _WRAPPERS else f"{name}[{hint}]"
    return name


def _split_templates(s):
    """(the name with every <...>, (...) and {...} group removed, the text of the first <...> group)."""
    base, first, depth, start = [], None, 0, 0
    opening, closing = "<({", ">)}"
    for i, ch in enumerate(s):
        if ch in opening:
            if depth == 0:
                start = i
            depth += 1
        elif ch in closing and depth > 0:
            depth -= 1
            if depth == 0 and ch == ">" and first is None:
                first = s[start + 1:i]
        elif depth == 0:
            base.append(ch)
    return "".join(base), first or ""


def unique_names(raws):
    """Map each raw name to a readable name; two different raw names never get the same one.

    `raws` is ordered (most time first): the first of a clash keeps `#1`, the next `#2`, and so on.
    """
    shorts = {raw: short_name(raw) for raw in raws}
    clashes = {}
    for raw in raws:
        clashes.setdefault(shorts[raw], []).append(raw)
    names, used = {}, set()
    for raw in raws:
        group = clashes[shorts[raw]]
        name = shorts[raw] if len(group) == 1 else f"{shorts[raw]} #{group.index(raw) + 1}"
        while name in used:  # a raw name that already looks like "x #2"
            name += "'"
        used.add(name)
        names[raw] = name
    return names
