"""profiling.profile.trace.hardware's peaks for any GPU, and the vendor names the trace reader knows (issue #42)."""
import pytest

from profiling.profile.tables import cuda_calls
from profiling.profile.trace import hardware
from profiling.profile.trace.classify import classify_cpu_op, classify_kernel
from profiling.profile.trace.timeline import LAUNCH_CALLS


@pytest.mark.parametrize("name, fmt, tflops", [
    ("NVIDIA H100 80GB HBM3", "fp8", 1979.0), ("NVIDIA H100 80GB HBM3", "tf32", 494.5),
    ("NVIDIA H100 NVL", "bf16", 835.5), ("NVIDIA H200 NVL", "bf16", 835.5), ("NVIDIA B200", "fp4", 9000.0),
    ("NVIDIA GB200", "bf16", 2500.0), ("NVIDIA GH200 144G HBM3e", "bf16", 989.5),
    ("NVIDIA A100-PCIE-40GB", "tf32", 156.0), ("NVIDIA A100-SXM4-40GB", "fp8", None),
    ("NVIDIA A10", "bf16", 125.0), ("NVIDIA L4", "fp8", 242.5), ("NVIDIA L40S", "fp8", 733.0),
    ("NVIDIA GeForce RTX 3090", "bf16", 71.0), ("NVIDIA GeForce RTX 2080 Ti", "bf16", 53.8),  # fp16: no bf16
    ("NVIDIA GeForce RTX 2080 Ti", "tf32", None), ("Tesla T4", "fp16", 65.0),
    ("Tesla V100S-PCIE-32GB", "fp16", 130.0),
    ("Tesla V100-PCIE-16GB", "fp32", 14.0), ("Tesla V100-DGXS-32GB", "bf16", 125.0),
    ("AMD Instinct MI300X", "fp8", 2614.9), ("AMD Instinct MI250X/MI250", "bf16", 383.0),
    ("AMD Instinct MI210", "fp32", 45.3), ("AMD Radeon Graphics", "bf16", None),
])
def test_peaks_per_format(name, fmt, tflops):
    assert hardware.peak_flops(name, fmt) == (None if tflops is None else tflops * 1e12)


def test_every_row_names_its_source_and_whole_words_match():
    assert all(row.source and row.tbs for row in hardware.PEAKS)
    assert hardware.lookup("NVIDIA L40").name == "L40" and hardware.lookup("NVIDIA L4").name == "L4"
    assert hardware.lookup("NVIDIA GH200 480GB").name == "GH200"
    assert hardware.lookup("NVIDIA H200").name == "H200"
    assert hardware.peak_bandwidth("AMD Instinct MI300X") == 5.3e12
    with pytest.raises(ValueError, match="unknown number format 'int8'"):
        hardware.peak_flops("NVIDIA H100 80GB HBM3", "int8")


def test_gemm_format_from_recorded_dtypes():
    assert hardware.gemm_format(("c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float")) == "fp8"
    assert hardware.gemm_format(("c10::BFloat16", "c10::BFloat16")) == "bf16"
    assert hardware.gemm_format(()) is None


@pytest.mark.parametrize("name", ["hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel",
                                  "hipExtLaunchKernel", "cudaLaunchKernel", "cuLaunchKernelEx"])
def test_hip_launches_count_as_launches(name):
    assert LAUNCH_CALLS.match(name) and cuda_calls.kind(name) == "launch"


def test_hip_calls_have_their_cuda_kinds():
    assert [cuda_calls.kind(n) for n in ("hipMalloc", "hipFree", "hipMemcpyWithStream", "hipMemsetAsync",
                                         "hipStreamSynchronize", "hipGraphLaunch")] == \
        ["allocation", "allocation", "copy", "set", "synchronization", "launch"]


@pytest.mark.parametrize("kernel", [
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
    "void c10d::symmetric_memory::multimem_all_reduce_kernel<...>",
    "void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 8>",
    "two_shot_all_reduce_kernel_inplace", "ncclKernel_AllGather_RING_LL_Sum_int8_t", "nvls_allreduce",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>"])
def test_nvls_and_symmetric_memory_collectives_are_communication(kernel):
    assert classify_kernel(kernel) == "communication"


def test_compute_kernels_stay_compute():
    assert classify_kernel("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128") == "GEMM"
    assert classify_kernel("void at::native::reduce_kernel<512, 1>") == "other compute"
    assert classify_cpu_op("symm_mem::one_shot_all_reduce") == "communication"
