"""Pure: the process settings known to cause a mechanism the trace shows, so a finding names the setting and
how to undo it. Stdlib only.

A setting is never a finding by itself: a rule that measured a mechanism's cost in the trace (syncs in the
backward, launches that block, allocation churn, attention in its math form, recomputation, slow GEMMs)
hands it to `attribute()`, which

- names the setting, when the live capture recorded one the user set that is known to cause the mechanism:
  kind `setting`, the setting and what it does first, the trace's evidence of the cost after it, the fix
  how to undo it (the setting alone explains the cost, CAUSES says why);
- or, for a `suspect` mechanism (more than one cause fits the same time, e.g. GEMMs over their bound), keeps
  the rule's kind and states both explanations and how to tell them apart: undo the setting and compare;
- or, with no settings record in the trace (an older or foreign one), keeps the rule's finding and adds
  which settings would also explain it: the trace cannot tell.

Names are profiling/profile/trace/settings.py's canonical names; rows come from its `differing()`.
"""
from profiling.profile.trace import settings as recorded

# mechanism -> ((setting, is it the cause for this value, what it does, how to undo it), ...)
CAUSES = {
    "backward_syncs": (
        ("anomaly_mode", lambda v: v is True,
         "autograd anomaly detection checks every backward function's outputs for NaN, a host sync each",
         "turn it off: remove torch.autograd.set_detect_anomaly(True) / detect_anomaly() (it is for debugging)"),),
    "compiled_syncs": (
        ("inductor.nan_asserts", lambda v: v is True,
         "Inductor checks every kernel's outputs for NaN inside the compiled graphs, a host sync each",
         "remove torch._inductor.config.nan_asserts = True (it is for debugging)"),
        ("inductor.triton.debug_sync_kernel", lambda v: v is True,
         "Inductor synchronizes the device after every kernel the compiled graphs launch (a debugging aid to "
         "locate a failing kernel): the GPU idles while the host returns from each sync and launches the next",
         "set torch._inductor.config.triton.debug_sync_kernel = False (the default; it is for locating a CUDA "
         "error)"),
        ("dynamo.capture_scalar_outputs", lambda v: v is True,
         "values read with .item() are captured into the compiled graph, each a host sync",
         "read the value outside the compiled model, once per step"),),
    "blocking_launches": (
        ("env.CUDA_LAUNCH_BLOCKING", lambda v: str(v).strip() not in ("", "0"),
         "every kernel launch waits for its kernel to finish",
         "unset CUDA_LAUNCH_BLOCKING (remove it from os.environ or the shell; it is for debugging)"),),
    "alloc_churn": (
        ("env.PYTORCH_NO_CUDA_MEMORY_CACHING", lambda v: str(v).strip() not in ("", "0"),
         "the caching allocator is off: every tensor is a cudaMalloc and a cudaFree, which waits for the GPU",
         "unset PYTORCH_NO_CUDA_MEMORY_CACHING (remove it from os.environ or the shell)"),
        ("env.PYTORCH_CUDA_ALLOC_CONF", lambda v: any(k in str(v) for k in ("garbage_collection_threshold",
                                                                         "max_split_size_mb")),
         "the caching allocator is told to give cached blocks back (a garbage-collection threshold) or to split "
         "large ones no more", "remove garbage_collection_threshold / max_split_size_mb from "
         "PYTORCH_CUDA_ALLOC_CONF (expandable_segments:True is the setting that fights fragmentation)"),),
    "eager_code": (
        ("env.TORCHDYNAMO_DISABLE", lambda v: str(v).strip() not in ("", "0"),
         ("it turns torch.compile off for the whole process: every torch.compile call in the code returns the "
          "function unchanged, so the model runs eagerly"),
         ("unset TORCHDYNAMO_DISABLE (remove it from os.environ or the shell): the code's torch.compile then "
          "applies")),
        ("dynamo.disable", lambda v: v is True,
         "torch._dynamo.config.disable turns torch.compile off for the whole process",
         "remove torch._dynamo.config.disable = True: the code's torch.compile then applies"),),
    "math_attention": tuple(
        (f"sdp.{b}", lambda v: v is False, "the fused attention backends are off: attention runs as matmuls and "
         "a softmax over the whole [T, T] score matrix", f"torch.backends.cuda.enable_{b}_sdp(True)")
        for b in ("flash", "cudnn", "mem_efficient")),
    "recompute": (
        ("functorch.activation_memory_budget", lambda v: isinstance(v, (int, float)) and v < 1,
         "the compiler's partitioner recomputes forward work in the backward to stay under this share of the "
         "activations' memory",
         "set torch._functorch.config.activation_memory_budget back to 1.0 (the default); if memory is short, "
         "use a smaller micro-batch with more gradient accumulation steps instead"),),
    "deterministic_kernels": (
        ("deterministic_algorithms", lambda v: v is True,
         "torch.use_deterministic_algorithms(True) swaps kernels with atomic adds (scatter, index and embedding "
         "backwards) for slower sort-based ones, and fills new tensors with NaN",
         "remove torch.use_deterministic_algorithms(True) (and CUBLAS_WORKSPACE_CONFIG if set for it), or keep it "
         "only for the runs that need bitwise reproducibility"),),
    "attention_backend": (
        ("deterministic_algorithms", lambda v: v is True, "cuDNN's fused attention has no deterministic backward: "
         "SDPA runs another, slower backend", "remove torch.use_deterministic_algorithms(True)"),
        ("cudnn.enabled", lambda v: v is False, "cuDNN is off, its fused attention with it: SDPA runs another, "
         "slower backend", "remove torch.backends.cudnn.enabled = False"),) + tuple(
        (f"sdp.{b}", lambda v: v is False, f"SDPA's {b} backend is off",
         f"torch.backends.cuda.enable_{b}_sdp(True) (or remove the enable_{b}_sdp(False) call)")
        for b in ("cudnn", "flash")),
    "slow_gemms": (
        ("env.CUBLAS_WORKSPACE_CONFIG", lambda v: True,
         "cuBLAS's workspace is fixed by this variable; a small one rules out its faster GEMM kernels",
         "unset CUBLAS_WORKSPACE_CONFIG (a reproducibility setting) and compare"),
        ("env.CUBLASLT_WORKSPACE_SIZE", lambda v: True, "cuBLASLt's workspace is fixed by this variable",
         "unset CUBLASLT_WORKSPACE_SIZE and compare"),
        ("cuda.preferred_blas_library", lambda v: v not in (None, "cublas", "default"),
         "GEMMs run through another BLAS library", "torch.backends.cuda.preferred_blas_library('cublas')"),
        ("cuda.matmul.allow_bf16_reduced_precision_reduction", lambda v: v is False,
         "bf16 GEMMs may not reduce in bf16 (slower split-K kernels)",
         "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True (the default)"),
        ("deterministic_algorithms", lambda v: v is True, "deterministic algorithms restrict cuBLAS's kernels",
         "remove torch.use_deterministic_algorithms(True) and compare"),),
}
SUSPECT = ("slow_gemms",)  # mechanisms with other causes that fit the same time (shapes, a slow device)


def causes(tl, mechanism):
    """[(row, what, undo)] of the settings the user set (settings.differing: by "user") that CAUSES names for
    `mechanism`; None when the trace has no settings record (the trace cannot tell)."""
    record = tl.meta.get("settings")
    if not isinstance(record, dict) or not isinstance(record.get("values"), dict):
        return None
    rows = {r["name"]: r for r in recorded.differing(record) if r["by"] == "user"}
    return [(rows[name], what, undo) for name, bad, what, undo in CAUSES[mechanism]
            if name in rows and bad(rows[name]["value"])]


def attribute(tl, found, mechanism):
    """The finding `found` (a rule's, for `mechanism`), naming the setting that causes it where one is
    recorded (module docstring); `found` itself when nothing is to add."""
    hits = causes(tl, mechanism)
    if hits is None:
        names = sorted({name.removeprefix("env.") for name, *_ in CAUSES[mechanism]})
        return dict(found, evidence=found["evidence"] + "; a process setting would also explain it ("
                    + ", ".join(names) + "): this trace has no settings record to tell (a live --profile "
                    "records them)")
    if not hits:
        return found
    whats = list(dict.fromkeys(what for _, what, _ in hits))  # several flags of one cause: said once
    named = ", ".join(f"{_phrase(row)} ({_who(row)})" for row, _, _ in hits) + ": " + "; ".join(whats)
    undo = "; ".join(dict.fromkeys(undo for _, _, undo in hits))
    if mechanism in SUSPECT:
        return dict(found, evidence=f"{found['evidence']}; set in this run: {named}; undo it and compare to tell "
                    "whether it is the cause", fix=f"first {undo}; if the time stays: {found['fix']}")
    return dict(found, kind="setting", evidence=f"{named}; its cost in this trace: {found['evidence']}", fix=undo,
                _names=tuple(row["name"] for row, _, _ in hits), _rule=found["kind"])


def merge(found):
    """One `setting` finding per setting: a setting that explains several mechanisms (deterministic algorithms:
    a sorted scatter-add and a slower attention backend) is one edit with one gain, their sum."""
    out, by = [], {}
    for f in found:
        names = f.pop("_names", None)
        if names is None:
            out.append(f)
        elif names in by:
            first = by[names]
            first["evidence"] += " and: " + f["evidence"].split("; its cost in this trace: ", 1)[-1]
            first["ms_per_step"] = round(first["ms_per_step"] + f["ms_per_step"], 2)
            for key in ("_kernels", "_gaps"):  # one edit prices what both mechanisms priced (ledger.py)
                first[key] = {**(first.get(key) or {}), **(f.get(key) or {})}
            first["pct_of_step"] = round(first["pct_of_step"] + f["pct_of_step"], 1)
        else:
            by[names] = f
            out.append(f)
    return out


def _phrase(row):
    name = row["name"]
    return f"{name[4:]}={row['value']}" if name.startswith("env.") else f"{name}={row['value']}"


def _who(row):
    source = {"environment": ", in the environment", "process": ", set in the process"}.get(row.get("source"), "")
    return row["by"] + source
