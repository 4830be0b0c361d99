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
- a GPU in `deviceProperties` while no CUDA runtime call at all was recorded: the profiler ran without CUDA
  activity on a machine with a GPU, so where the operators ran cannot be told. Where runtime calls were
  recorded but none launched (a model left on the CPU of a GPU machine), the operators are the CPU's.
"""
import re
from collections import Counter

RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
# Runtime calls that put work on a device: kernel launches, graph launches, copies and sets.
LAUNCHING = re.compile(r"^(cuda|cu|hip)(Ext)?(Module)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch|"
                       r"Memcpy|Memset)", re.IGNORECASE)
ACCELERATOR_CATS = ("mtia_", "cuda_profiler_range")  # categories only an accelerator's runtime writes
COLLECTIVE_PREFIXES = ("nccl:", "rccl:")             # torch's record_function names for NCCL's collectives
SHOWN = 2


def _gpus(trace):
    """The accelerators' names in deviceProperties (torch writes one entry per visible device)."""
    props = trace.get("deviceProperties")
    return [str(d.get("name")) for d in props if isinstance(d, dict) and d.get("name")] if isinstance(props, list) \
        else []


def unrecorded(trace):
    """A sentence naming the evidence that an accelerator ran this trace's operators though no device event was
    recorded (module docstring), or None where there is none: the operators are the CPU's own work."""
    launches, special, collectives, runtime = Counter(), Counter(), Counter(), 0
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
    said = []
    if launches:
        said.append(", ".join(f"{c:,} `{n}`" for n, c in launches.most_common(SHOWN)) + " (the host launched "
                    "device work)")
    said += [f"{c:,} `{cat}` events" for cat, c in special.most_common(SHOWN)]
    if collectives:
        said.append(", ".join(f"{c:,} `{n}`" for n, c in collectives.most_common(SHOWN)) + " (NCCL runs on GPUs)")
    gpus = _gpus(trace)
    if gpus and not runtime and not said:
        said.append(f"a {gpus[0]} in deviceProperties and no CUDA runtime call recorded (the profiler ran without "
                    "CUDA activity)")
    return "; ".join(said) or None
