"""The untimed step after the profiled ones (issue #41): what costs the timed steps most to record and needs no
timing. Operator input shapes (a CPU-only profile with record_shapes; profiling/profile/capture/shapes.py lends them to the
profiled steps' operators) and the Python lines of the host syncs (CUDA's sync debug mode). Recorded in the
profiled steps, they slowed a loop that syncs every step: on GPT-2's (H100) leaving out the shapes took 15-40
points and the sync mode 23 off a +31-53% excess (benchmarks/profiler_cost/profiler_cost_results.md).
Imports torch (capture.py's helper)."""
import contextlib
import linecache
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from profiling.profile.capture import shapes
from profiling.profile.capture.sampler import frame_label
from profiling.profile.trace.traceio import exported_events


class DetailStep:
    """One untimed step after the window, recorded for what costs the timed steps most and needs no timing
    (benchmarks/profiler_cost/profiler_cost_results.md): operator input shapes (a CPU-only profile with record_shapes, lent
    to the profiled steps' operators by profiling/profile/capture/shapes.py) and the Python lines of host syncs (CUDA's
    sync debug mode, SyncRecorder). begin() before the step, end() after it: {"shapes": signatures}, or with
    `operators` (device-only timed steps) {"events": the step's every event, CPU and CUDA}, for the join."""

    def __init__(self, syncs, sync, operators=False):
        self.syncs, self.sync, self.watch, self.prof = syncs, sync, None, None
        self.operators = operators  # device-only timed steps: all of this step's events, for the join

    def begin(self):
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.operators else [])
        self.prof = profile(activities=activities, record_shapes=True)
        self.prof.__enter__()
        self.watch = contextlib.ExitStack()
        self.watch.enter_context(self.syncs.watch(True))

    def end(self):
        self.watch.close()
        self.sync()
        self.prof.__exit__(None, None, None)
        events = exported_events(self.prof)
        return {"events": events} if self.operators else {"shapes": shapes.signatures(events)}

    def abandon(self):
        if self.watch is not None:
            self.watch.close()
        if self.prof is not None:
            self.prof.__exit__(None, None, None)


@contextlib.contextmanager
def without_launch_records():
    """Inductor's Triton launcher without its profiler record around every launch, for the profiled steps:
    it costs the host a Python dict and a `_RecordFunctionFast` per kernel (a compiled GPT-2 loop on the H100:
    +11% with torch.profiler alone, +0.7% without it; benchmarks/profiler_cost/profiler_cost_results.md). Only that module
    sees the profiler as off: the compiled graph's call annotation and CUDA's launch records stay, and the
    shape step, which keeps the records, lends them back (profiling/profile/capture/shapes.py). A torch without that
    module's `autograd_profiler` keeps its records."""
    try:
        from torch._inductor.runtime import triton_heuristics
        saved = triton_heuristics.autograd_profiler
    except (ImportError, AttributeError):
        yield
        return
    triton_heuristics.autograd_profiler = _ProfilerOff
    try:
        yield
    finally:
        triton_heuristics.autograd_profiler = saved


class _ProfilerOff:
    """What Inductor's launcher reads of torch.autograd.profiler: off."""
    _is_profiler_enabled = False


class SyncRecorder:
    """The Python lines that synchronize the host with the GPU, from CUDA's sync debug mode ("warn"): a
    warning at each synchronizing call (`.item()`, `if tensor:`, `.cpu()`, `.nonzero()`), located at the
    Python line that made it. Other warnings pass through."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.counts = {}

    @contextlib.contextmanager
    def watch(self, on):
        if not (on and self.cuda):
            yield
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mode = torch.cuda.get_sync_debug_mode()  # the user's, put back after the step
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(mode)
        for w in caught:
            if "synchronizing" in str(w.message):
                key = (w.filename, w.lineno)
                self.counts[key] = self.counts.get(key, 0) + 1
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def result(self, root):
        """[{where: "train.py:412", line: its text, count}] over the active steps, most first."""
        rows = [{"where": frame_label(f, n, "", root).strip(), "line": linecache.getline(f, n).strip()[:100],
                 "count": c} for (f, n), c in self.counts.items()]
        return sorted(rows, key=lambda r: -r["count"])
