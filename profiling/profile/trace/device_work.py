"""Pure: whether a trace without device events still shows that an accelerator ran its operators. Stdlib only.

    unrecorded(trace)  # a sentence naming that evidence, or None where the operators are the CPU's own work

A trace with no kernel or memcpy events is read as a CPU run (its operators' self times are the step). That holds
only where nothing says a device ran them: a GPU run whose kernels CUPTI did not record (activities without
CUDA, a range profiler replaying each kernel, a crash before the flush) keeps its host side, the dispatch and
the waits, and there the CPU rules would price a GPU model's launches and `.item()` waits as fusible CPU compute
(five public traces in tests/data/foreign did). The evidence, each read from the trace's own events:

- runtime calls that launch or copy (cudaLaunchKernel, cuLaunchKernel, hipLaunchKernel, cudaMemcpyAsync,
  cudaGraphLaunch): the host launched device work, whatever the device events' fate;
- an accelerator runtime's own categories (MTIA's `mtia_runtime`, `mtia_ccp_events`);
- CUPTI's range profiler (`cuda_profiler_range`), which replays each kernel inside its launch;
- NCCL collectives (`nccl:all_reduce`, ...): NCCL runs on GPUs only (gloo is the CPU's);
- operators only a GPU runs (`aten::cudnn_convolution`, `aten::cudnn_batch_norm`, `aten::miopen_*`, the flash,
  memory-efficient and cuDNN attention kernels' operators): a CUDA model recorded with
  `activities=[ProfilerActivity.CPU]` shows them on the host timeline and nothing else of its GPU (issue #57);
- a GPU in `deviceProperties` while no CUDA runtime call at all was recorded: the profiler ran without CUDA
  activity on a machine with a GPU, so where the operators ran cannot be told. Where runtime calls were
  recorded but none launched (a model left on the CPU of a GPU machine), the operators are the CPU's.

    beside_gpu(trace)  # the GPU a CPU run left unused, when the trace lists one: the model ran on the CPU

A CPU run of a trace whose deviceProperties list a GPU, with the CPU's own operators (`mkldnn_convolution`, the
CPU's attention) or CUDA activity recorded that launched nothing, is a model and batch left on the CPU: its GPU
went unused, and that, not the CPU rules' fixes, is the first thing to change (issue #57: a model that ran on the
CPU in a trace listing a V100 was not told so).
"""
import re
from collections import Counter

RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
# Runtime calls that put work on a device: kernel launches, graph launches, copies and sets.
LAUNCHING = re.compile(r"^(cuda|cu|hip)(Ext)?(Module)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch|"
                       r"Memcpy|Memset)", re.IGNORECASE)
ACCELERATOR_CATS = ("mtia_", "cuda_profiler_range")  # categories only an accelerator's runtime writes
COLLECTIVE_PREFIXES = ("nccl:", "rccl:")             # torch's record_function names for NCCL's collectives
# ATen operators only a GPU build dispatches to (their CPU twins are named otherwise: mkldnn_convolution,
# native_batch_norm, _scaled_dot_product_flash_attention_for_cpu)
GPU_ONLY_OPS = re.compile(r"^aten::(_?cudnn_|miopen_|_flash_attention_|_efficient_attention_|"
                          r"_scaled_dot_product_(flash_attention|efficient_attention|cudnn_attention)(_backward)?$)")
# ATen operators only the CPU dispatches to: a model that ran there
CPU_ONLY_OPS = re.compile(r"^aten::(mkldnn_|_mkldnn_|_slow_conv2d_|thnn_conv|"
                          r"_scaled_dot_product_flash_attention_for_cpu)")
SHOWN = 2


def _gpus(trace):
    """The accelerators' names in deviceProperties (torch writes one entry per visible device)."""
    props = trace.get("deviceProperties")
    return [str(d.get("name")) for d in props if isinstance(d, dict) and d.get("name")] if isinstance(props, list) \
        else []


def unrecorded(trace):
    """A sentence naming the evidence that an accelerator ran this trace's operators though no device event was
    recorded (module docstring), or None where there is none: the operators are the CPU's own work."""
    launches, special, collectives, gpu_ops, runtime, cpu_own = Counter(), Counter(), Counter(), Counter(), 0, False
    for e in trace.get("traceEvents") or ():
        if not isinstance(e, dict):
            continue
        cat, name = str(e.get("cat", "")).lower(), str(e.get("name", ""))
        if cat in RUNTIME_CATS:
            runtime += 1
            if LAUNCHING.match(name):
                launches[name] += 1
        elif cat.startswith(ACCELERATOR_CATS):
            special[cat] += 1
        elif name.lower().startswith(COLLECTIVE_PREFIXES):
            collectives[name] += 1
        elif cat == "cpu_op" and GPU_ONLY_OPS.match(name):
            gpu_ops[name] += 1
        elif cat == "cpu_op" and CPU_ONLY_OPS.match(name):
            cpu_own = True
    said = []
    if gpu_ops:  # a CUDA model recorded with CPU activity only
        said.append("this CUDA model's operators ran with CPU activity only: "
                    + ", ".join(f"{c:,} `{n}`" for n, c in gpu_ops.most_common(SHOWN))
                    + " (operators only a GPU runs) and no kernel")
    if launches:
        said.append(", ".join(f"{c:,} `{n}`" for n, c in launches.most_common(SHOWN)) + " (the host launched "
                    "device work)")
    said += [f"{c:,} `{cat}` events" for cat, c in special.most_common(SHOWN)]
    if collectives:
        said.append(", ".join(f"{c:,} `{n}`" for n, c in collectives.most_common(SHOWN)) + " (NCCL runs on GPUs)")
    gpus = _gpus(trace)
    if gpus and not runtime and not said and not cpu_own:  # the CPU's own operators: they ran there
        said.append(f"a {gpus[0]} in deviceProperties and no CUDA runtime call recorded (the profiler ran without "
                    "CUDA activity)")
    return "; ".join(said) or None


def beside_gpu(trace):
    """The GPU's name when this trace's operators ran on the CPU while its deviceProperties list a GPU (a model and
    batch never moved to the device), else None. Called on a trace without device events where `unrecorded` found
    no device's part: CUDA activity recorded that launched nothing, or the CPU's own operators
    (`CPU_ONLY_OPS`)."""
    gpus = _gpus(trace)
    if not gpus:
        return None
    events = [e for e in trace.get("traceEvents") or () if isinstance(e, dict)]
    runtime = any(str(e.get("cat", "")).lower() in RUNTIME_CATS for e in events)
    cpu_own = any(e.get("cat") == "cpu_op" and CPU_ONLY_OPS.match(str(e.get("name", ""))) for e in events)
    return gpus[0] if runtime or cpu_own else None
