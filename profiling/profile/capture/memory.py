"""One more untimed step with the CUDA allocator's history recorded: GPU memory at its peak, by category (#35).

The step trains as usual; around it the capture records the allocator's history
(`torch.cuda.memory._record_memory_history`, Python frames only) and tags the storages of known tensors, each
with how many allocations had been made when it was tagged (profiling/profile/trace/allocator.py matches a tag
only to the block live then):
    parameters        the model's (given to the Profiler) at the start, and the optimizer's param_groups
    gradients         every param's .grad just before optimizer.step() (torch's global step pre-hook: any
                      torch.optim.Optimizer, without the Profiler being told of it)
    optimizer_state   the optimizer's state tensors just after its step (its post-hook)
    activations       tensors saved for backward (a saved_tensors_hooks pack hook that returns its tensor as is;
                      only when no such hook is active already: the user's own hooks are left alone, and then
                      activations count as temporaries, said in the record's note)
Then it takes the snapshot, stops the history, reduces the snapshot at once (allocator.reduce) and drops it:
no pickle is written or read. Without CUDA nothing is recorded: `record_missing()` says why.

Cost: one step with the history on (a few µs per allocation), a stats read per saved tensor, and the reduction
(tens of ms for ~10^4 events). The timed steps are untouched.

With the caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) every tensor is its own cudaMalloc, outside
the allocator's blocks: the snapshot holds nothing, so the record says why it is missing (never a table of 0
MB), with the allocator's own peak where its statistics still count (`allocator_peak_mb`, None at 0).

A run may record the allocator's history from its start (`record_history`: train.py's runner does under
AUTORESEARCH_MEMORY_HISTORY=1), so an out-of-memory failure's snapshot names the line of every block held
(profiling/profile/report/oom.py); the memory step then starts a fresh trace and leaves the history on.
`held_now(model, optimizer)` is what such a failure holds: parameters, gradients and optimizer state measured
from the tensors, and the other blocks by line where the history is recorded.
"""
import os

import torch

from profiling.profile.capture import provenance
from profiling.profile.trace import allocator

MAX_ENTRIES = 100_000
_history = False   # record_history() ran: the history stays on around the memory step


def record_missing():
    return {"missing": "no CUDA device: GPU memory is recorded on CUDA only"}


def caching_off(environ=None):
    """Whether PyTorch's caching allocator is off in this process (PYTORCH_NO_CUDA_MEMORY_CACHING, read
    once by torch when CUDA starts; any value but empty or 0 turns it off)."""
    return allocator.uncached((os.environ if environ is None else environ).get(allocator.NO_CACHING))


def allocator_peak_mb():
    """torch.cuda.max_memory_allocated in MB, None where it reads 0 (no CUDA memory allocated, or the
    allocator's statistics do not count: the caching allocator off): never a 0 MB peak."""
    peak = torch.cuda.max_memory_allocated() / allocator.MB if torch.cuda.is_available() else 0
    return round(peak, 1) if peak > 0 else None


def record_history():
    """Record the allocator's history (the Python line of every allocation) for the rest of the run."""
    global _history
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    _history = True


def history_recorded():
    return _history


def _history_off():
    if not _history:
        torch.cuda.memory._record_memory_history(enabled=None)


def _allocations():
    """Allocations the CUDA allocator has made in this process so far (its cumulative counter)."""
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0)


def _storage(t):
    """(data_ptr, nbytes) of a CUDA tensor's storage, None for anything else."""
    try:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            s = t.untyped_storage()
            return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError):  # no storage (a subclass, a fake)
        pass
    return None


class MemoryStep:
    """begin() before the step, end() after it (the record), or abandon(). parameters: the model's tensors."""

    def __init__(self, parameters=()):
        self.parameters = list(parameters)
        self.tags = {c: [] for c in allocator.TAGGED}
        self.handles, self.saved, self.note = [], None, None

    def _tag(self, category, tensors):
        seq = _allocations() - self.start
        for t in tensors:
            where = _storage(t)
            if where:
                self.tags[category].append((*where, seq))

    def _pre_step(self, optimizer, args, kwargs):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self._tag("parameters", params)
        self._tag("gradients", [p.grad for p in params if p.grad is not None])

    def _post_step(self, optimizer, args, kwargs):
        self._tag("optimizer_state", [v for state in optimizer.state.values() for v in state.values()])

    def _pack(self, t):
        where = _storage(t)
        if where:
            self.tags["activations"].append((*where, _allocations() - self.start))
        return t

    def begin(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.start = _allocations()
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python",
                                                 **({"clear_history": True} if _history else {}))
        self.tags["parameters"] = [(*w, None) for w in map(_storage, self.parameters) if w]
        self.handles = [register_optimizer_step_pre_hook(self._pre_step),
                        register_optimizer_step_post_hook(self._post_step)]
        if torch._C._autograd._top_saved_tensors_default_hooks(True) is None:
            self.saved = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
            self.saved.__enter__()
        else:
            self.note = "saved-tensor hooks of the program's own were active: activations counted as temporaries"

    def _stop(self):
        if self.saved is not None:
            self.saved.__exit__(None, None, None)
            self.saved = None
        for h in self.handles:
            h.remove()
        self.handles = []

    def end(self):
        self._stop()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        _history_off()
        made = _allocations() - self.start
        free, total = torch.cuda.mem_get_info()
        other = max(0, total - free - torch.cuda.memory_reserved())
        record = allocator.reduce(snapshot, self.tags, device=torch.cuda.current_device(), device_total=total,
                                   other=other, allocations=made,
                                   where=allocator.placed(provenance.placement()))
        del snapshot
        if not record["peak_allocated_mb"]:  # the allocator saw no block: never a table of 0 MB
            return allocator.unmeasured(caching_off(), allocator_peak_mb())
        record["allocator_peak_mb"] = allocator_peak_mb()
        if self.note:
            record["note"] = "; ".join(x for x in (record.get("note"), self.note) if x)
        return record

    def abandon(self):
        self._stop()
        _history_off()


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
    tensors)}, lines: [{where, mb}] of the other blocks (allocator.held_lines, frames mapped like the time
    lines), or None with `lines_missing` when the allocator's history is not recorded."""
    params = list(model.parameters()) if model is not None else []
    kinds = {"parameters": _storages(params), "gradients": _storages(p.grad for p in params),
             "optimizer_state": _storages(t for state in (optimizer.state.values() if optimizer else ())
                                          for t in state.values())}
    now = {"categories": {k: round(sum(v.values()) / allocator.MB, 1) for k, v in kinds.items()},
           "lines": None}
    if not torch.cuda.is_available():
        return now
    try:
        exclude = [(p, p + n) for v in kinds.values() for p, n in v.items()]
        now["lines"] = allocator.held_lines(torch.cuda.memory._snapshot(), exclude,
                                             allocator.placed(provenance.placement()),
                                             device=torch.cuda.current_device())
    except Exception as e:  # noqa: BLE001 (private torch APIs)
        now["lines_missing"] = f"the allocator's snapshot failed ({type(e).__name__}: {str(e)[:100]})"
    if now["lines"] is None and "lines_missing" not in now and history_recorded():
        now["lines_missing"] = "the allocator's history named no line for the blocks held"
    return now
