"""What an out-of-memory failure adds when a run fit the same micro-batch before (issue #43): the kept runs
of the memory (experiments.json) and the last profile whose memory step measured this model at this
micro-batch, and what is held at the failure, by category and, where the allocator's history is recorded
(memory_capture.record_history: AUTORESEARCH_MEMORY_HISTORY=1), by line. profiling/profile/oom.py compares them.
Reads files and torch's allocator; never raises (an explanation must not hide the failure it explains).

    before = fitted_before(settings, dataset, micro_batch, parameters_mb)   # None: no run fit this
    now = held_now(model, optimizer)                                        # {categories, lines | None}
"""
import json
import os

import torch

from profiling.errors import UserError
from profiling.profile import capture, gpu_memory, memory_capture, oom, provenance


def _summary(folder):
    try:
        with open(os.path.join(folder, "summary.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError, TypeError):
        return None


def candidates(settings, dataset, memory_path=None, profile_root=None):
    """(source, folder, summary) of the kept runs of these settings and dataset whose profile is still on
    disk, newest first, then the last profile (profiles/latest): where a fitting run may be measured."""
    from profiling.research import experiments, history
    out = []
    try:
        records = experiments.load(memory_path or experiments.default_path())["experiments"]
    except (UserError, OSError, ValueError, KeyError):
        records = []
    for r in reversed(records):
        if r.get("status") == "keep" and r.get("profile") and history.same_group(r, settings, dataset):
            out.append((f"the kept run, experiment {r['id']} ({r.get('commit')})", r["profile"], None))
    root = profile_root or capture.profile_dir()
    out.append(("the last profile of this model", os.path.join(root, "latest"), None))
    return [(source, folder, _summary(folder)) for source, folder, _ in out]


def fitted_before(settings, dataset, micro_batch, parameters_mb, memory_path=None, profile_root=None):
    """oom.kept_fit over `candidates`: a run that fit this micro-batch with this model, or None."""
    try:
        return oom.kept_fit(candidates(settings, dataset, memory_path, profile_root), micro_batch, parameters_mb)
    except Exception:  # noqa: BLE001 (a broken file must not hide the out-of-memory error)
        return None


def _storages(tensors):
    """{data_ptr: nbytes} of the distinct CUDA storages among `tensors`."""
    out = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            s = t.untyped_storage()
            out.setdefault(s.data_ptr(), s.nbytes())
    return out


def held_now(model, optimizer=None):
    """What is held at the failure: {categories: parameters, gradients, optimizer_state (MB, measured from the
    tensors)}, lines: [{where, mb}] of the other blocks (gpu_memory.held_lines, frames mapped like the time
    lines), or None with `lines_missing` when the allocator's history is not recorded."""
    params = list(model.parameters()) if model is not None else []
    kinds = {"parameters": _storages(params), "gradients": _storages(p.grad for p in params),
             "optimizer_state": _storages(t for state in (optimizer.state.values() if optimizer else ())
                                          for t in state.values())}
    now = {"categories": {k: round(sum(v.values()) / gpu_memory.MB, 1) for k, v in kinds.items()}, "lines": None}
    if not torch.cuda.is_available():
        return now
    try:
        exclude = [(p, p + n) for v in kinds.values() for p, n in v.items()]
        now["lines"] = gpu_memory.held_lines(torch.cuda.memory._snapshot(), exclude,
                                             gpu_memory.placed(provenance.placement()),
                                             device=torch.cuda.current_device())
    except Exception as e:  # noqa: BLE001 (private torch APIs)
        now["lines_missing"] = f"the allocator's snapshot failed ({type(e).__name__}: {str(e)[:100]})"
    if now["lines"] is None and "lines_missing" not in now and memory_capture.history_recorded():
        now["lines_missing"] = "the allocator's history named no line for the blocks held"
    return now
