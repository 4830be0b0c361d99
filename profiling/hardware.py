"""Peak dense bf16 tensor-core throughput per GPU, for MFU. Pure; no torch.

An unknown device gets None (printed `n/a`), never a guess: a wrong peak makes every MFU wrong.
"""
import re

# (whole words of torch.cuda.get_device_name(), peak dense bf16 TFLOP/s from the vendor datasheet).
# Checked in order, so the more specific names come first. Whole words, so "L4" is not an L40 (181 TFLOP/s)
# and "H200" is not a GH200 listed separately.
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.5),   # SXM (e.g. "NVIDIA H100 80GB HBM3"); the figure upstream's MFU uses
    ("H200", 989.5),
    ("GH200", 989.5),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.05),
    ("RTX 4090", 165.2),
    ("L4", 121.0),
)


def peak_flops(device_name):
    """Peak bf16 FLOP/s for a device name, or None when the device is not in the table (or is a CPU)."""
    if not device_name:
        return None
    for key, tflops in PEAK_BF16_TFLOPS:
        if re.search(rf"(?<![\w]){re.escape(key)}(?![\w])", device_name):
            return tflops * 1e12
    return None
