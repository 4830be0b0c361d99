"""The process's settings, recorded by the live capture before the profiled steps (issue #33): what changes
which kernels run or what the host does. `snapshot` imports torch; profiling/profile/trace/settings.py reads
the record (who set what, the header line).

    record = snapshot(train_py={...})   # plain JSON data for the trace's metadata ("settings")

Canonical names (the keys of `record["values"]`; torch's default after the `=`, as of torch 2.11):

    global modes        deterministic_algorithms=False, deterministic_algorithms.warn_only=False,
                        deterministic.fill_uninitialized_memory=True, anomaly_mode=False,
                        anomaly_mode.check_nan=True, grad_mode=True, inference_mode=False,
                        float32_matmul_precision="highest", default_dtype="torch.float32",
                        autograd.multithreading=True, modes.dispatch=[], modes.torch_function=[],
                        autograd.saved_tensors_hooks=None (save_on_cpu's: "pack_to_cpu")
    CUDA, once it is    sync_debug_mode="default" ("warn", "error"), cuda.memory_history=False
    initialised         (torch.cuda.memory._record_memory_history), cuda.allocator_backend="native"
    torch.backends      cudnn.enabled=True, cudnn.benchmark=False, cudnn.deterministic=False,
                        cudnn.allow_tf32=True, cuda.matmul.allow_tf32=False, cuda.matmul.fp32_precision="none",
                        cuda.matmul.allow_fp16_reduced_precision_reduction=True,
                        cuda.matmul.allow_bf16_reduced_precision_reduction=True,
                        cuda.matmul.allow_fp16_accumulation=False, sdp.flash=True, sdp.mem_efficient=True,
                        sdp.math=True, sdp.cudnn=True, sdp.math_fp16_bf16_reduction=False,
                        cuda.preferred_blas_library="cublas", cuda.preferred_linalg_library="default",
                        mkldnn.enabled=True
    compiler            dynamo.<key>, inductor.<key> (e.g. inductor.trace.provenance_tracking_level),
                        functorch.<key> (e.g. functorch.activation_memory_budget), compiler.<key>
                        (torch.compiler.config): only entries that differ from their config module's default,
                        and only of modules already imported (recording never imports the compiler)
    environment         env.<NAME> for every variable set whose name starts with TORCH_, PYTORCH_,
                        TORCHINDUCTOR_, TORCHDYNAMO_, CUDA_, CUBLAS_, CUBLASLT_, CUDNN_, NCCL_ or TRITON_, and
                        NVIDIA_TF32_OVERRIDE, OMP_NUM_THREADS, MKL_NUM_THREADS, INDUCTOR_PROVENANCE,
                        DISABLE_ADDMM_CUDA_LT (default: unset)
    garbage collector   gc.enabled=True, gc.threshold=[700, 10, 10] (Python 3.10-3.12), gc.frozen=False
                        (gc.freeze() ran), gc.frozen_objects (a count; never "differs")

The record (`snapshot`'s keys, then what the capture and the runner add):

    {"version": 1,
     "values": {name: value},            # every setting read (compiler entries and variables: only those set)
     "defaults": {name: torch's default},  # where one is known
     "sources": {name: "environment" | "process"},  # how a variable or compiler entry got its value, where known
     "launcher": "torchrun" | None,
     "frameworks": ["lightning", ...],   # the training frameworks imported (what they set is theirs)
     "notes": ["what could not be read, and why"],
     "train.py": {name: value},          # train.py's own deliberate choices (profiling/runner.py)
     "profiler": {name: {"value", "before", "during"}}}  # what the profiler itself sets: "compile" or
                                                         # "shape step" (profiling/profile/capture/window.py)
Every read is guarded: another torch version loses that part with a note instead of failing the capture.
"""
import os
import sys

VERSION = 1
ENV_PREFIXES = ("TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "CUDA_", "CUBLAS_", "CUBLASLT_",
                "CUDNN_", "NCCL_", "TRITON_")
ENV_NAMES = ("NVIDIA_TF32_OVERRIDE", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "INDUCTOR_PROVENANCE",
             "DISABLE_ADDMM_CUDA_LT")
MAX_TEXT = 200   # characters kept of a value
# Training frameworks whose import sets variables of their own (profiling/profile/trace/settings.py
# FRAMEWORK_ENV says which): recorded when imported, so a variable they set is named as theirs, not the user's
FRAMEWORKS = ("lightning", "lightning_fabric", "pytorch_lightning", "transformers", "accelerate")
# gc.get_threshold() of a fresh interpreter, by version (others: unknown, so never "differs")
GC_THRESHOLDS = {(3, 10): [700, 10, 10], (3, 11): [700, 10, 10], (3, 12): [700, 10, 10]}
CONFIGS = (("dynamo", "torch._dynamo.config"), ("inductor", "torch._inductor.config"),
           ("functorch", "torch._functorch.config"), ("compiler", "torch.compiler.config"))
SYNC_MODES = {0: "default", 1: "warn", 2: "error"}
# (name, torch's default, reader of torch): the global modes and torch.backends flags
MODES = (
    ("deterministic_algorithms", False, lambda t: t.are_deterministic_algorithms_enabled()),
    ("deterministic_algorithms.warn_only", False, lambda t: t.is_deterministic_algorithms_warn_only_enabled()),
    ("deterministic.fill_uninitialized_memory", True, lambda t: t.utils.deterministic.fill_uninitialized_memory),
    ("anomaly_mode", False, lambda t: t.is_anomaly_enabled()),
    ("anomaly_mode.check_nan", True, lambda t: t.is_anomaly_check_nan_enabled()),
    ("grad_mode", True, lambda t: t.is_grad_enabled()),
    ("inference_mode", False, lambda t: t.is_inference_mode_enabled()),
    ("float32_matmul_precision", "highest", lambda t: t.get_float32_matmul_precision()),
    ("default_dtype", "torch.float32", lambda t: str(t.get_default_dtype())),
    ("autograd.multithreading", True, lambda t: t.autograd.is_multithreading_enabled()),
    ("modes.dispatch", [], lambda t: _types(t.utils._python_dispatch._get_current_dispatch_mode_stack())),
    ("modes.torch_function", [], lambda t: _types(t.overrides._get_current_function_mode_stack())),
    ("autograd.saved_tensors_hooks", None, lambda t: _saved_hooks(t)),
    ("cudnn.enabled", True, lambda t: t.backends.cudnn.enabled),
    ("cudnn.benchmark", False, lambda t: t.backends.cudnn.benchmark),
    ("cudnn.deterministic", False, lambda t: t.backends.cudnn.deterministic),
    ("cudnn.allow_tf32", True, lambda t: t.backends.cudnn.allow_tf32),
    ("cuda.matmul.allow_tf32", False, lambda t: t.backends.cuda.matmul.allow_tf32),
    ("cuda.matmul.fp32_precision", "none", lambda t: t.backends.cuda.matmul.fp32_precision),
    ("cuda.matmul.allow_fp16_reduced_precision_reduction", True,
     lambda t: t.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
    ("cuda.matmul.allow_bf16_reduced_precision_reduction", True,
     lambda t: t.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
    ("cuda.matmul.allow_fp16_accumulation", False, lambda t: t.backends.cuda.matmul.allow_fp16_accumulation),
    ("sdp.flash", True, lambda t: t.backends.cuda.flash_sdp_enabled()),
    ("sdp.mem_efficient", True, lambda t: t.backends.cuda.mem_efficient_sdp_enabled()),
    ("sdp.math", True, lambda t: t.backends.cuda.math_sdp_enabled()),
    ("sdp.cudnn", True, lambda t: t.backends.cuda.cudnn_sdp_enabled()),
    ("sdp.math_fp16_bf16_reduction", False, lambda t: t.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()),
    ("cuda.preferred_blas_library", "cublas", lambda t: _enum(t.backends.cuda.preferred_blas_library())),
    ("cuda.preferred_linalg_library", "default", lambda t: _enum(t.backends.cuda.preferred_linalg_library())),
    ("mkldnn.enabled", True, lambda t: t.backends.mkldnn.enabled),
)
# Read only once CUDA is initialised: asking earlier would initialise it (or fail without a driver)
CUDA_MODES = (
    ("sync_debug_mode", "default", lambda t: SYNC_MODES.get(t.cuda.get_sync_debug_mode(), "?")),
    ("cuda.memory_history", False, lambda t: bool(t._C._cuda_isHistoryEnabled())),
    ("cuda.allocator_backend", "native", lambda t: t.cuda.get_allocator_backend()),
)

# ---------------------------------------------------------------------------------------------------------
# Recording (the live capture; imports torch)
# ---------------------------------------------------------------------------------------------------------

def snapshot(train_py=None, environ=None):
    """The process's settings now, as plain JSON data (the module docstring has the keys). `train_py`: the
    settings train.py chooses on purpose ({name: value}), so the view can say who set them. `environ`: the
    environment to read (tests); default os.environ. Never raises."""
    import torch  # only here: the view below is plain data

    values, defaults, sources, notes = {}, {}, {}, []
    cuda = _safe(lambda: torch.cuda.is_initialized(), False)
    for name, default, read in MODES + (CUDA_MODES if cuda else ()):
        try:
            values[name] = _plain(read(torch))
            defaults[name] = default
        except Exception as e:  # another torch version, or a mode torch refuses to report
            notes.append(f"{name} not read: {_why(e)}")
    env = os.environ if environ is None else environ
    _compiler(values, defaults, sources, notes)
    _environment(env, values, sources)
    _gc(values, defaults)
    record = {"version": VERSION, "values": values, "defaults": defaults, "sources": sources,
              "launcher": "torchrun" if "TORCHELASTIC_RUN_ID" in env else None, "notes": notes,
              "frameworks": [name for name in FRAMEWORKS if name in sys.modules]}
    if train_py:
        record["train.py"] = dict(train_py)
    return record


def _compiler(values, defaults, sources, notes):
    """The compiler's config entries that differ from their defaults, of config modules already imported
    (importing them would import the compiler); torch/utils/_config_module.py keeps each entry's default."""
    for prefix, module_name in CONFIGS:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        try:
            unset = sys.modules["torch.utils._config_module"]._UNSET_SENTINEL
            entries = list(module._config.items())
        except Exception as e:  # another torch's config modules
            notes.append(f"{prefix} config not read: {_why(e)}")
            continue
        failed = 0
        for key, entry in entries:
            try:
                _entry(f"{prefix}.{key}", module, key, entry, unset, (values, defaults, sources))
            except Exception:
                failed += 1
        if failed:
            notes.append(f"{prefix} config: {failed} entries not read")


def _entry(name, module, key, entry, unset, out):
    """One config entry into (values, defaults, sources), if it differs from its default."""
    if entry.alias is not None or module._is_default(key):
        return  # an alias reads another module's entry (and could import it)
    value = getattr(module, key)
    if _same(value, entry.default):
        return
    values, defaults, sources = out
    values[name], defaults[name] = _plain(value), _plain(entry.default)
    sources[name] = "process" if entry.user_override is not unset else "environment"


def _environment(environ, values, sources):
    """The variables torch, CUDA, its libraries and the allocator read, where set; their source where the
    process's starting environment (/proc/self/environ) can tell: "environment" if set before it started,
    "process" if code in it set or changed one."""
    start = _starting_environment() if environ is os.environ else None
    for key in sorted(environ):
        if key.startswith(ENV_PREFIXES) or key in ENV_NAMES:
            name = f"env.{key}"
            values[name] = str(environ[key])[:MAX_TEXT]
            if start is not None:
                sources[name] = "environment" if start.get(key) == environ[key] else "process"


def _starting_environment():
    """The environment the process was started with (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/environ", "rb") as f:
            pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
        return {os.fsdecode(k): os.fsdecode(v) for k, v in pairs}
    except OSError:
        return None


def _gc(values, defaults):
    import gc

    values["gc.enabled"], defaults["gc.enabled"] = gc.isenabled(), True
    values["gc.threshold"] = list(gc.get_threshold())
    if sys.version_info[:2] in GC_THRESHOLDS:
        defaults["gc.threshold"] = GC_THRESHOLDS[sys.version_info[:2]]
    frozen = gc.get_freeze_count()
    values["gc.frozen"], defaults["gc.frozen"] = frozen > 0, False
    values["gc.frozen_objects"] = frozen


def _safe(fn, fallback):
    try:
        return fn()
    except Exception:
        return fallback


def _same(a, b):
    try:
        return bool(a == b)
    except Exception:
        return False


def _why(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}".rstrip(": ")


def _types(stack):
    return [type(m).__name__ for m in stack]


def _saved_hooks(t):
    """The pack hook autograd applies to every tensor it saves (`save_on_cpu`'s `pack_to_cpu`), or None."""
    hooks = t._C._autograd._top_saved_tensors_default_hooks(False)
    return getattr(hooks[0], "__qualname__", repr(hooks[0])).rsplit(".", 1)[-1] if hooks else None


def _enum(x):
    """`_BlasBackend.Cublas` -> "cublas"."""
    return str(x).rsplit(".", 1)[-1].lower()


def _plain(v):
    """A JSON-able copy of a setting's value: numbers, strings, lists and dicts as they are, others by repr."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v if not isinstance(v, str) else v[:MAX_TEXT]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(str(_plain(x)) for x in v)
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return repr(v)[:MAX_TEXT]
