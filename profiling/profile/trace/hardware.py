"""Peak dense throughput per number format and memory bandwidth per GPU, for MFU, rates and the roofline.
Pure; no torch.

    peak_flops("NVIDIA H100 80GB HBM3")          # 9.895e14: dense bf16 tensor FLOP/s (fp16 where no bf16)
    peak_flops("NVIDIA H100 80GB HBM3", "fp8")   # 1.979e15
    peak_bandwidth("AMD Instinct MI300X")         # 5.3e12 bytes/s

An unknown device, or a format the device has no peak for (bf16 on a V100, fp8 on an A100), gets None
(printed `n/a`), never a guess: a wrong peak makes every MFU and every rate judged against it wrong.
"""
import re
from collections import namedtuple

# TFLOP/s, dense (the datasheets' "with sparsity" figures halved): bf16 and fp16 on tensor/matrix cores with
# float32 accumulation (what torch's GEMMs use; GeForce cards run it at half their fp16-accumulate rate), tf32
# on tensor cores, fp32 without them (AMD: its matrix cores, which an fp32 GEMM uses), fp8 and fp4 on tensor
# cores; tbs: memory bandwidth, TB/s. None: the device has no such path.
Peak = namedtuple("Peak", "name bf16 fp16 tf32 fp32 fp8 fp4 tbs source")

# Whole words of torch.cuda.get_device_name() (or a trace's deviceProperties name), checked in order, so the
# more specific names come first. Whole words, so "L4" is not an L40 and "H200" is not a GH200.
PEAKS = (
    # Hopper
    Peak("H100 PCIe", 756.5, 756.5, 378.0, 51.0, 1513.0, None, 2.0, "NVIDIA H100 Tensor Core GPU datasheet"),
    Peak("H100 NVL", 835.5, 835.5, 417.5, 60.0, 1670.5, None, 3.9, "NVIDIA H100 Tensor Core GPU datasheet"),
    Peak("H100", 989.5, 989.5, 494.5, 67.0, 1979.0, None, 3.35,  # "NVIDIA H100 80GB HBM3": upstream's MFU
         "NVIDIA H100 Tensor Core GPU datasheet (SXM)"),
    Peak("H200 NVL", 835.5, 835.5, 417.5, 60.0, 1670.5, None, 4.8, "NVIDIA H200 Tensor Core GPU datasheet"),
    Peak("H200", 989.5, 989.5, 494.5, 67.0, 1979.0, None, 4.8, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    Peak("GH200 144G HBM3e", 989.5, 989.5, 494.5, 67.0, 1979.0, None, 4.9,
         "NVIDIA GH200 Grace Hopper Superchip datasheet (HBM3e)"),
    Peak("GH200", 989.5, 989.5, 494.5, 67.0, 1979.0, None, 4.0,
         "NVIDIA GH200 Grace Hopper Superchip datasheet"),
    # Blackwell: per GPU (the datasheets give 8 GPUs of an HGX B200, 2 of a GB200 superchip)
    Peak("GB200", 2500.0, 2500.0, 1250.0, 90.0, 5000.0, 10000.0, 8.0,
         "NVIDIA GB200 NVL72 datasheet (per superchip, halved)"),
    Peak("B200", 2250.0, 2250.0, 1125.0, 75.0, 4500.0, 9000.0, 8.0, "NVIDIA HGX B200 datasheet (per GPU)"),
    # Ampere
    Peak("A100 80GB PCIe", 312.0, 312.0, 156.0, 19.5, None, None, 1.935,
         "NVIDIA A100 Tensor Core GPU datasheet"),
    Peak("A100-SXM4-80GB", 312.0, 312.0, 156.0, 19.5, None, None, 2.039,
         "NVIDIA A100 Tensor Core GPU datasheet"),
    Peak("A100", 312.0, 312.0, 156.0, 19.5, None, None, 1.555,  # the 40 GB parts
         "NVIDIA A100 Tensor Core GPU datasheet"),
    Peak("A10G", 70.0, 70.0, 35.0, 35.0, None, None, 0.6,  # AWS's part: no NVIDIA datasheet
         "AWS EC2 G5 (A10G) figures, as compared in Baseten's 'NVIDIA A10 vs A10G'"),
    Peak("A10", 125.0, 125.0, 62.5, 31.2, None, None, 0.6, "NVIDIA A10 Tensor Core GPU datasheet"),
    Peak("RTX 3090", 71.0, 71.0, 35.6, 35.6, None, None, 0.936,
         "NVIDIA Ampere GA102 GPU architecture whitepaper"),
    # Ada
    Peak("L40S", 362.05, 362.05, 183.0, 91.6, 733.0, None, 0.864, "NVIDIA L40S datasheet"),
    Peak("L40", 181.05, 181.05, 90.5, 90.5, 362.0, None, 0.864, "NVIDIA L40 datasheet"),
    Peak("L4", 121.0, 121.0, 60.0, 30.3, 242.5, None, 0.3, "NVIDIA L4 Tensor Core GPU datasheet"),
    Peak("RTX 4090", 165.2, 165.2, 82.6, 82.6, 330.3, None, 1.008, "NVIDIA Ada GPU architecture whitepaper"),
    # Turing and Volta: fp16 tensor cores only
    Peak("RTX 2080 Ti", None, 53.8, None, 13.4, None, None, 0.616,
         "NVIDIA Turing GPU architecture whitepaper (reference clocks)"),
    Peak("T4", None, 65.0, None, 8.1, None, None, 0.32, "NVIDIA T4 Tensor Core GPU datasheet"),
    Peak("V100S", None, 130.0, None, 16.4, None, None, 1.134,
         "NVIDIA V100 Tensor Core GPU datasheet (V100S PCIe)"),
    Peak("V100-PCIE", None, 112.0, None, 14.0, None, None, 0.9,
         "NVIDIA V100 Tensor Core GPU datasheet (PCIe)"),
    Peak("V100", None, 125.0, None, 15.7, None, None, 0.9, "NVIDIA V100 Tensor Core GPU datasheet (SXM2)"),
    # AMD Instinct
    Peak("MI300X", 1307.4, 1307.4, 653.7, 163.4, 2614.9, None, 5.3,
         "AMD Instinct MI300X accelerator datasheet"),
    Peak("MI250X", 383.0, 383.0, None, 95.7, None, None, 3.2768, "AMD Instinct MI250X accelerator datasheet"),
    Peak("MI250", 362.1, 362.1, None, 90.5, None, None, 3.2768, "AMD Instinct MI250 accelerator datasheet"),
    Peak("MI210", 181.0, 181.0, None, 45.3, None, None, 1.6384, "AMD Instinct MI210 accelerator datasheet"),
)
FORMATS = ("bf16", "fp16", "tf32", "fp32", "fp8", "fp4")

# torch dtypes as a trace records them (`Input type`) -> the format whose peak a GEMM on them is held to
DTYPE_FORMAT = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8",
                "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8",
                "c10::Float4_e2m1fn_x2": "fp4"}


def lookup(device_name):
    """The PEAKS row of a device name, or None."""
    if not device_name:
        return None
    for row in PEAKS:
        if re.search(rf"(?<![\w]){re.escape(row.name)}(?![\w])", device_name):
            return row
    return None


def peak_flops(device_name, fmt="bf16"):
    """Peak dense FLOP/s of a device in a number format (FORMATS), or None when the device is not in the table
    (or is a CPU) or has no such path. The default, bf16, falls back to fp16 on GPUs without bf16 (V100, T4,
    RTX 20): the half-precision peak MFU is measured against."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown number format {fmt!r}; known: {', '.join(FORMATS)}")
    row = lookup(device_name)
    value = getattr(row, fmt) if row else None
    if value is None and row and fmt == "bf16":
        value = row.fp16
    return value * 1e12 if value else None


def peak_bandwidth(device_name):
    """Peak memory bandwidth in bytes/s for a device name, or None when the device is not in the table."""
    row = lookup(device_name)
    return row.tbs * 1e12 if row else None


def gemm_format(types):
    """The number format a GEMM's recorded input dtypes run in ("bf16", "fp8", ...), or None if unrecorded."""
    formats = [DTYPE_FORMAT[t] for t in types[:2] if t in DTYPE_FORMAT]
    return formats[0] if formats else None


# kernel-name words of a float32 GEMM or convolution: on tensor cores as TF32 (`tf32`, cuDNN's `xmma_..._tf32f32`),
# or without them (`sgemm`, `scudnn`, `f32f32` with no tf32); checked in this order
_TF32_WORDS = ("tf32", "s1688")  # s1688: Ampere's TF32 tensor-op MMA (cutlass_80_tensorop_s1688gemm_*, ampere_s1688*)
_FP32_WORDS = ("sgemm", "scudnn", "f32f32", "convolve_sgemm", "<float")  # <float: cuDNN's templates


def compute_format(types, kernel="", tf32=None):
    """The number format whose peak a GEMM, convolution or attention call runs against: its recorded input dtypes
    (bf16, fp16, fp8, fp4; float32 as "tf32" on tensor cores or "fp32" without), else its kernel's name; None
    where neither tells. tf32: whether the process allows TF32 for this call (the settings record), None where
    unknown (then the kernel's name decides, and a float32 call named neither way counts as fp32)."""
    fmt = gemm_format(types)
    low = kernel.lower()
    if fmt is None and not any(w in low for w in _TF32_WORDS + _FP32_WORDS):
        return None
    if fmt not in (None, "fp32"):
        return fmt
    if any(w in low for w in _TF32_WORDS):
        return "tf32"
    if any(w in low for w in _FP32_WORDS):
        return "fp32"
    return "tf32" if tf32 else "fp32"


def peak_for(device_name, fmt):
    """Peak FLOP/s of a device in a number format, tf32 falling back to fp32 where the device has no TF32 (before
    Ampere); None where unknown. The ceiling every rate quoted for a call of that format is held under."""
    if fmt is None:
        return None
    value = peak_flops(device_name, fmt)
    return value if value or fmt != "tf32" else peak_flops(device_name, "fp32")
