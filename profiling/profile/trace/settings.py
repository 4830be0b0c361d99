"""The process's settings as the report reads them: who set each setting that differs from torch's defaults, and
the header line. Pure; the record is made by profiling/profile/capture/settings.py (`snapshot`), whose
docstring lists the canonical names and the record's keys.

    rows = differing(record)            # the settings that differ from torch's defaults, and who set them
    value(record, "deterministic_algorithms")    # one setting's value, as the process had it
    summary(record)                     # the summary's `settings` (`--json`)
    text(summary(record))               # one line for the report's header
"""

# Variables that say where things are or which device is used, not how the work is done: recorded, never
# listed as differing (CUDA_VISIBLE_DEVICES is how one agent gets its GPU; NVIDIA's images set the versions).
ENV_NEUTRAL = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TORCH_CUDA_ARCH_LIST", "TORCH_WARM_POOL")
ENV_NEUTRAL_SUFFIXES = ("_VERSION", "_HOME", "_PATH", "_DIR", "_ROOT")
# What torchrun sets in its workers unless the user did (torch/distributed/run.py, local_elastic_agent.py)
TORCHRUN_ENV = {"env.OMP_NUM_THREADS": "1", "env.TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
# What a training framework sets in the process when it is imported, whatever the user did (its source, as
# of lightning 2.6: lightning/fabric/__init__.py and lightning_fabric/__init__.py set
# PYTORCH_NVML_BASED_CUDA_CHECK=1 on import): {name: (value, {package the record's "frameworks" lists: the
# framework's name})}. Credited to the framework where it was imported, the value is its value and the
# variable was not in the starting environment.
LIGHTNING = {"lightning": "lightning", "lightning_fabric": "lightning", "pytorch_lightning": "lightning"}
FRAMEWORK_ENV = {"env.PYTORCH_NVML_BASED_CUDA_CHECK": ("1", LIGHTNING)}
FRAMEWORK_NAMES = {name for _, packages in FRAMEWORK_ENV.values() for name in packages.values()}
BY_ORDER = ("user", "torchrun", "lightning", "train.py", "profiler")
MAX_SHOWN = 16   # settings on the header line; the rest are in summary.json `settings`

# Views of another setting: listed only where they disagree with it (set_float32_matmul_precision("high")
# also turns cuBLAS TF32 on; the warn-only and NaN-check flags mean nothing while their mode is off).
IMPLIED = {
    "cuda.matmul.allow_tf32": lambda v: v.get("float32_matmul_precision", "highest") != "highest",
    "cuda.matmul.fp32_precision": lambda v: "tf32" if v.get("float32_matmul_precision") == "high" else
    "bf16" if v.get("float32_matmul_precision") == "medium" else "none",
    "deterministic_algorithms.warn_only": lambda v: False if not v.get("deterministic_algorithms") else None,
    "anomaly_mode.check_nan": lambda v: True if not v.get("anomaly_mode") else None,
    "inductor.deterministic": lambda v: True if v.get("deterministic_algorithms") else None,  # set with it
}
INFORMATIONAL = ("gc.frozen_objects",)
# How a setting reads on the header line; a name not here reads `name=value`
LABELS = {
    "deterministic_algorithms": "deterministic algorithms", "deterministic_algorithms.warn_only":
    "deterministic algorithms warn-only", "deterministic.fill_uninitialized_memory":
    "deterministic fill of uninitialized memory", "anomaly_mode": "autograd anomaly mode",
    "anomaly_mode.check_nan": "anomaly mode NaN check", "grad_mode": "grad mode", "inference_mode":
    "inference mode", "float32_matmul_precision": "float32 matmul precision", "default_dtype": "default dtype",
    "autograd.multithreading": "autograd multithreading", "modes.dispatch": "dispatch modes",
    "modes.torch_function": "torch function modes", "autograd.saved_tensors_hooks": "saved-tensors hook", "sync_debug_mode": "sync debug mode",
    "cuda.memory_history": "CUDA memory history recording", "cuda.allocator_backend": "CUDA allocator",
    "cudnn.enabled": "cuDNN", "cudnn.benchmark": "cuDNN benchmark", "cudnn.deterministic": "cuDNN deterministic",
    "cudnn.allow_tf32": "cuDNN TF32", "cuda.matmul.allow_tf32": "cuBLAS TF32", "cuda.matmul.fp32_precision":
    "matmul fp32 precision", "cuda.matmul.allow_fp16_reduced_precision_reduction":
    "fp16 GEMM reduced-precision reduction", "cuda.matmul.allow_bf16_reduced_precision_reduction":
    "bf16 GEMM reduced-precision reduction", "cuda.matmul.allow_fp16_accumulation": "fp16 GEMM accumulation",
    "sdp.flash": "flash SDPA", "sdp.mem_efficient": "memory-efficient SDPA", "sdp.math": "math SDPA",
    "sdp.cudnn": "cuDNN SDPA", "sdp.math_fp16_bf16_reduction": "math SDPA fp16/bf16 reduction",
    "cuda.preferred_blas_library": "preferred BLAS", "cuda.preferred_linalg_library": "preferred linalg",
    "mkldnn.enabled": "oneDNN", "inductor.trace.provenance_tracking_level": "inductor provenance tracking",
    "inductor.cpp.enable_kernel_profile": "inductor C++ kernel profiling", "compiler.cache_key_tag":
    "compile cache tag",
}
GC_WORDS = {("gc.enabled", False): "disabled", ("gc.enabled", True): "enabled", ("gc.frozen", True): "frozen",
            ("gc.frozen", False): "not frozen"}




def value(record, name, missing=None):
    """The process's own value of setting `name` (a canonical name, see the module docstring), before the
    profiler changed it: `value(record, "deterministic_algorithms")` -> True or False; `missing` when the
    record has none (not recorded, not read, or an unset variable: `value(r, "env.CUDA_LAUNCH_BLOCKING")`)."""
    if not _recorded(record):
        return missing
    change = _part(record, "profiler").get(name)
    if isinstance(change, dict):
        return missing if change.get("before") is None else change["before"]
    return record["values"].get(name, missing)


def _recorded(record):
    return isinstance(record, dict) and isinstance(record.get("values"), dict)


def _part(record, key):
    """record[key] where it is a dict (a foreign or damaged record may hold anything), else {}."""
    part = record.get(key)
    return part if isinstance(part, dict) else {}


def differing(record):
    """The settings that differ from torch's defaults, in the order recorded, the profiler's last: rows
    {"name": canonical name, "value": its value, "default": torch's default (None: an unset variable),
     "by": "user" | "torchrun" | "train.py" | "profiler",
     "source": "environment" (a variable set before the process started, or a compiler entry read from
               one) | "process" (set by code in the process) | None (unknown: global modes and flags),
     "during": "compile" | "shape step" ("profiled steps" in older traces) | "process" (from the capture on) for
               the profiler's, else None}.
    "train.py": equal to a choice train.py makes on purpose (record["train.py"]); "torchrun": a variable
    torchrun sets in its workers; a framework's name ("lightning"): a variable it sets on import
    (FRAMEWORK_ENV); "profiler": what the capture itself turns on; "user": anything else (the user's code or
    environment). [] for no record."""
    if not _recorded(record):
        return []
    values = record["values"]
    profiler = {name: change for name, change in _part(record, "profiler").items()
                if isinstance(change, dict) and change.get("value") != change.get("before")}
    own = {name: value(record, name) for name in values}  # the process's own, under the profiler's changes
    rows = [_row(record, name, v) for name, v in own.items() if _differs(record, name, v)]
    for name, change in profiler.items():
        rows.append({"name": name, "value": change.get("value"), "default": _part(record, "defaults").get(
            name, change.get("before")), "by": "profiler", "source": "process", "during": change.get("during")})
    return rows


def _differs(record, name, v):
    values, defaults = record["values"], _part(record, "defaults")
    if v is None and name in _part(record, "profiler"):
        return False  # only the profiler's value is known
    if name in INFORMATIONAL:
        return False
    if name.startswith("env."):
        key = name[4:]
        return key not in ENV_NEUTRAL and not key.endswith(ENV_NEUTRAL_SUFFIXES)
    if name in IMPLIED:
        implied = IMPLIED[name](values)
        if implied is not None:
            return v != implied
    return name in defaults and v != defaults[name]


def _row(record, name, v):
    chosen = _part(record, "train.py")
    if name in chosen and chosen[name] == v:
        by = "train.py"
    elif record.get("launcher") == "torchrun" and TORCHRUN_ENV.get(name) == v:
        by = "torchrun"
    else:
        by = _framework(record, name, v) or "user"
    return {"name": name, "value": v, "default": _part(record, "defaults").get(name), "by": by,
            "source": _part(record, "sources").get(name), "during": None}


def _framework(record, name, v):
    """The framework that set this variable on import (FRAMEWORK_ENV), or None: it was imported, the value is
    its own, and the variable was not in the environment the process started with."""
    value, packages = FRAMEWORK_ENV.get(name, (None, {}))
    imported = record.get("frameworks")
    if v != value or not isinstance(imported, list) or _part(record, "sources").get(name) == "environment":
        return None
    return next((packages[p] for p in imported if p in packages), None)


def summary(record):
    """The summary's `settings`: {"recorded": False} for a trace without a record; else {"recorded": True,
    "differs": differing(record), "all": record}."""
    if not _recorded(record):
        return {"recorded": False}
    return {"recorded": True, "differs": differing(record), "all": record}


def text(s):
    """The report header's line on the settings, from the summary's `settings`; None for no summary."""
    if not isinstance(s, dict):
        return None
    if not s.get("recorded"):
        return "Process settings: not recorded in this trace (an older or foreign capture): torch's modes, " \
               "flags and environment unknown"
    rows = sorted(s.get("differs") or [], key=lambda r: BY_ORDER.index(r["by"]) if r["by"] in BY_ORDER else 0)
    if not rows:
        return "Process settings: all at torch's defaults (modes, backends flags, compiler, environment, gc)"
    groups = {}
    for r in rows[:MAX_SHOWN]:
        groups.setdefault(_who(r), []).append(_phrase(r))
    more = [f"+{len(rows) - MAX_SHOWN} more in summary.json `settings`"] if len(rows) > MAX_SHOWN else []
    return "Process settings that differ from torch's defaults (before the profiled steps; who set each): " + \
        " · ".join([f"{_join(phrases)} ({who})" for who, phrases in groups.items()] + more)


def _who(r):
    if r["by"] == "profiler":
        during = {"profiled steps": "during the profiled steps only",  # older traces
                  "shape step": "during the untimed step after the profiled steps only",
                  "process": "from the capture on"}
        return "profiler, " + during.get(r["during"], f"at {r['during'] or 'capture'}")
    if r["name"].startswith("env."):
        if r["by"] in FRAMEWORK_NAMES:  # set when the framework was imported
            return r["by"] + ", set on its import"
        return r["by"] + (", set in the process" if r["source"] == "process" else ", environment")
    return r["by"]


def _phrase(r):
    name, v = r["name"], r["value"]
    if name.startswith("gc."):
        words = GC_WORDS.get((name, v)) if isinstance(v, bool) else None  # gc.threshold is a list
        return "gc " + (words or f"{name[3:]} {_show(v)}")
    if name.startswith("env."):
        return f"{name[4:]}={v}"
    if name not in LABELS:
        return f"{name}={_show(v)}"
    if isinstance(v, bool):
        return f"{LABELS[name]} {'on' if v else 'off'}"
    return f"{LABELS[name]} {_show(v)}"


def _join(phrases):
    """Phrases joined by commas, `gc disabled` and `gc frozen` as `gc disabled and frozen`."""
    out = []
    for p in phrases:
        if p.startswith("gc ") and out and out[-1].startswith("gc "):
            out[-1] += " and " + p[3:]
        else:
            out.append(p)
    return ", ".join(out)


def _show(v):
    if isinstance(v, list):
        return ",".join(map(str, v)) if v else "none"
    return str(v)
