"""Peak dense bf16 tensor-core throughput and memory bandwidth per GPU, for MFU and the roofline. Pure; no torch.

An unknown device gets None (printed `n/a`), never a guess: a wrong peak makes every MFU wrong.
"""
import re

# (whole words of torch.cuda.get_device_name(), peak dense bf16 TFLOP/s, peak memory bandwidth TB/s), from the
# vendor datasheets. Checked in order, so the more specific names come first. Whole words, so "L4" is not an
# L40 (181 TFLOP/s) and "H200" is not a GH200 listed separately.
PEAKS = (
    ("H100 PCIe", 756.0, 2.0),
    ("H100 NVL", 835.0, 3.9),
    ("H100", 989.5, 3.35),   # SXM (e.g. "NVIDIA H100 80GB HBM3"); the figure upstream's MFU uses
    ("H200", 989.5, 4.8),
    ("GH200", 989.5, 4.0),
    ("B200", 2250.0, 8.0),
    ("A100 80GB PCIe", 312.0, 1.935),
    ("A100-SXM4-80GB", 312.0, 2.039),
    ("A100", 312.0, 1.555),  # the 40 GB parts
    ("L40S", 362.05, 0.864),
    ("RTX 4090", 165.2, 1.008),
    ("L4", 121.0, 0.3),
)


def _lookup(device_name):
    if not device_name:
        return None
    for row in PEAKS:
        if re.search(rf"(?<![\w]){re.escape(row[0])}(?![\w])", device_name):
            return row
    return None


def peak_flops(device_name):
    """Peak bf16 FLOP/s for a device name, or None when the device is not in the table (or is a CPU)."""
    row = _lookup(device_name)
    return row[1] * 1e12 if row else None


def peak_bandwidth(device_name):
    """Peak memory bandwidth in bytes/s for a device name, or None when the device is not in the table."""
    row = _lookup(device_name)
    return row[2] * 1e12 if row else None
