"""The profiled window: a few training steps under torch.profiler, then the untimed steps that record what the
timed ones must not pay for (shapes, lines, memory), exported as one Chrome trace with the run's metadata.

The window only captures; profiling/profile/report/folder.py summarizes the exported trace and writes the
report, exactly as `research profile TRACE` does later on any machine.
"""
import contextlib
import gc
import json
import os
import re
import shutil
import sys
import tempfile
import time
import warnings

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from profiling.errors import UserError
from profiling.profile.capture import cupti, eager_record, nvml, provenance, settings, shapes
from profiling.profile.capture.detail import DetailStep, SyncRecorder, without_launch_records
from profiling.profile.capture.memory import MemoryStep, record_missing
from profiling.profile.capture.sampler import StackSampler
from profiling.profile.trace import join
from profiling.profile.trace import settings as recorded

# The window's warm-up grows while its steps run under SETTLE_SHARE of the unprofiled step: the pause that opens
# it (settings, the profiler's start) lets a DataLoader's workers refill their queue, and an H100 ResNet-18 with 2
# workers then profiled 42 ms steps against ~95 steady (benchmarks/findings/live/host_side_results.md); at most SETTLE_STEPS
# more steps and SETTLE_S seconds from the window's opening.
SETTLE_SHARE = 0.7
SETTLE_STEPS = 20
SETTLE_S = 30.0
# torch.profiler warns, whenever a schedule is given, that it keeps only the last cycle's events: with
# repeat=1 there is one cycle, so the warning says nothing here.
CYCLE_WARNING = "Warning: Profiler clears events at the end of each cycle"
# kineto (torch.profiler's C++ side) asks CUDA for its devices when a trace ends, even when only the CPU
# was profiled; on a machine without a GPU it logs this ERROR line, which tells a new user that a normal
# CPU run failed (torch 2.11: "ERROR:<time> <pid>:<tid> DeviceProperties.cpp:48] gpuGetDeviceCount
# failed with code 35"). Only this line is dropped, only without CUDA, only while the trace ends.
NO_GPU_LINE = re.compile(rb"^ERROR:.*\] gpuGetDeviceCount failed with code \d+\s*$")


def capture(step_fn, warmup, active, metadata, memory=False, parameters=()):
    """Run `warmup + active` calls of step_fn under the profiler, then one more that records the lines of the
    eager operators (unless AUTORESEARCH_EAGER_LINES=0) and, with `memory`, one more for GPU memory; return (the
    trace as a dict, the perf_counter time when the last profiled step was done). The function form of Window."""
    window = Window(warmup, active, metadata, memory, parameters)
    trace = None
    while trace is None:
        step_fn()
        trace = window.step()
    return trace, window.t_end


class Window:
    """The profiled window of a training loop that calls `step()` after each of its steps: `warmup` steps
    under torch.profiler unrecorded, `active` recorded (no input shapes; on CUDA with `ops="device"` the device
    only: kernels, copies and their launches, each step's edge marked by a CUDA event record), then one more
    that records the operators' input shapes and the Python lines of the host syncs (`DetailStep`: both slowed
    the recorded steps when recorded in them; for device-only steps it records every operator, joined to them
    by profiling/profile/trace/join.py), then one that records the lines of the eager
    operators (`eager_record.Recorder`; none with AUTORESEARCH_EAGER_LINES=0), then with `memory` (CUDA only)
    one more with the allocator's history recorded (`capture/memory.py` MemoryStep: the metadata's `gpu_memory`;
    without CUDA the metadata says why there is none, and no step is added). `parameters`: the model's
    tensors, for that step's tags. `step()` returns the exported trace as a dict after the last of them,
    else None. Created just before the first of these steps.

    The device is synchronized at the window's edges only: nothing launched before it runs inside it, and
    everything launched in it is recorded. Inside, steps run back to back as in training (no extra syncs);
    the summary gives each kernel to the step that launched it. During the active steps the capture also
    records what the trace cannot show (profiling/profile/findings/ reads it): the main thread's Python stack
    every few ms (profiling/profile/capture/sampler.py), the
    graph breaks TorchDynamo met while compiling, and the source lines of the compiled kernels when
    profiling.profile.capture.provenance.start() ran before compilation (profiling/profile/tables/lines.py reads them).
    Before anything else it records the process's settings (profiling/profile/capture/settings.py), unless
    metadata["settings"] holds a record already, and adds what the profiler itself changes.
    """

    def __init__(self, warmup, active, metadata, memory=False, parameters=(), steady_ms=None, ops="device"):
        if active < 1 or warmup < 0:
            raise UserError(f"cannot profile {active} active steps after {warmup} warm-up steps; "
                            "use at least 1 active step and 0 or more warm-up steps")
        if ops not in join.OPS:
            raise UserError(f"ops={ops!r} is not a capture mode; use one of {', '.join(map(repr, join.OPS))}")
        self.warmup, self.active, self.metadata = warmup, active, metadata
        self.steady_ms, self.settled, self.t_step, self.t_open = steady_ms, 0, None, time.perf_counter()
        self.cuda = cuda = torch.cuda.is_available()
        # the device only where the loop has tensors on it: a CPU-only loop on a machine with CUDA gets its
        # operators recorded (device-only, its window held no work at all: found on an H200)
        self.device_only = cuda and ops == "device" and torch.cuda.memory_allocated() > 0
        self.marks, self.mark = [], torch.cuda.Event() if self.device_only else None  # step edges (join.add_steps)
        if self.mark is not None:
            self.mark.record()  # created now, outside the window: each step's record is then one runtime call
        self.before = metadata.get("settings") or settings.snapshot()  # before the profiler's sync debug mode
        self.cupti = cupti.Hold() if cuda else None  # CUPTI kept through the capture's sessions, then released
        self.sync = torch.cuda.synchronize if cuda else (lambda: None)
        self.sampler, self.syncs, self.state = StackSampler(paced=self.device_only), SyncRecorder(cuda), None
        self.i, self.t_end, self.trace, self.recorder = 0, None, None, None
        self.after = [("details", lambda: DetailStep(self.syncs, self.sync, operators=self.device_only))]
        if eager_record.enabled():
            self.after.append(("eager_lines", lambda: eager_record.Recorder(self.sync)))
        if memory and cuda:
            self.after.append(("gpu_memory", lambda: MemoryStep(parameters)))
        self.missing = {"gpu_memory": record_missing()} if memory and not cuda else {}
        self.tmp = tempfile.mkdtemp(prefix="autoresearch-trace-")
        self.path = os.path.join(self.tmp, "trace.json")
        activities = ([] if self.device_only else [ProfilerActivity.CPU]) + ([ProfilerActivity.CUDA] if cuda else [])
        self.prof = profile(activities=activities, record_shapes=False,  # shapes: DetailStep, untimed
                            schedule=self._action,  # schedule(wait=0, warmup, active, repeat=1), but warmup
                            # may grow while the steps settle (_settle)
                            on_trace_ready=lambda p: p.export_chrome_trace(self.path))
        gc.collect()  # the garbage of what ran before (a collection inside the window would be its cost)
        self.sync()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=CYCLE_WARNING, category=UserWarning)
            try:
                self.prof.start()
            except BaseException:
                self._release()
                raise
        self.launches = contextlib.ExitStack()  # Inductor's launch records: from the shape step, untimed (once
        self.launches.enter_context(without_launch_records())  # the profiler runs: a failed start changes nothing)
        # The sampler's thread starts here, in the profiler's warm-up step, and warms its label caches there:
        # started with the first recorded step, its start (0.2-2.3 ms on a loaded 2-core host) and its first
        # walks of the stack (0.9 ms on Lightning's) made that step 1.5-1.9x the others' median (issue #49).
        self.sampler.start()
        self._before_step()

    def _action(self, step):
        """torch.profiler's action for `step` (its schedule): warm-up, then `active` recorded, then nothing."""
        if step < self.warmup:
            return ProfilerAction.WARMUP
        if step < self.warmup + self.active - 1:
            return ProfilerAction.RECORD
        return ProfilerAction.RECORD_AND_SAVE if step == self.warmup + self.active - 1 else ProfilerAction.NONE

    def _settle(self):
        """At the end of the last warm-up step: one more warm-up step while the steps run under SETTLE_SHARE of
        the unprofiled step (the pause that opened the window let a DataLoader's workers prefetch batches, which
        the first steps then use up), at most SETTLE_STEPS more and SETTLE_S seconds."""
        ms = 1e3 * (time.perf_counter() - self.t_step) if self.t_step is not None else None
        if (ms is not None and self.steady_ms and ms < SETTLE_SHARE * self.steady_ms and self.settled < SETTLE_STEPS
                and time.perf_counter() - self.t_open < SETTLE_S):
            self.warmup += 1
            self.settled += 1
            self.metadata["window_settle_steps"] = self.settled

    def _before_step(self):
        """What starts with step i (self.i): the recording of the active steps."""
        self.t_step = time.perf_counter()
        i = self.i
        if i == self.warmup:
            self.state = {"start": nvml.read(_uuid())} if self.cuda else None
        if i >= self.warmup:
            self.sampler.step(i - self.warmup)
            self._mark()

    def _mark(self):
        """A step's edge in a device-only trace: the host's clock, then a CUDA event record (join.add_steps)."""
        if self.mark is not None:
            self.marks.append(time.perf_counter() * 1e6)
            self.mark.record()

    def step(self):
        """After each step: the trace once the window is done (then nothing more to call), else None."""
        if self.recorder is not None:  # an untimed step after the window is done: its record
            record = self._guarded(lambda: self._quiet(self.recorder.end))
            if self.key == "details":
                self._details(record)
            else:
                self.trace["autoresearch"][self.key] = record
            return self._next_after()
        if self.i == self.warmup - 1:
            self._settle()
        last = self.i == self.warmup + self.active - 1
        if last:
            self._mark()  # the last step's end
            self.sampler.stop()
            self.sync()  # the last step's kernels finish before the profiler stops recording
            self.t_end = time.perf_counter()
            if self.state:
                self.state["end"] = nvml.read(_uuid())
        self.i += 1
        if not last:
            self.prof.step()
            self._before_step()
            return None
        self._quiet(self._export)  # after the last active step: stop recording, export the trace
        return self._next_after()

    def _next_after(self):
        """Begin the next untimed step after the window (None), or the trace when there is none left."""
        if not self.after:
            self.recorder = None
            self._release()
            return self.trace
        self.key, make = self.after.pop(0)
        self.recorder = make()
        failed = self._guarded(self.recorder.begin)
        if failed is not None:  # this record is lost, said in the metadata; the next one may still run
            if self.key == "details":
                self._details(failed)
            else:
                self.trace["autoresearch"][self.key] = failed
            return self._next_after()
        return None

    def _details(self, record):
        """The shape step's record into the trace: its shapes given to the profiled steps' operators, its sync
        lines as the metadata's `syncs` (counted over `syncs_steps` = 1 step); or, when it failed, why not."""
        meta = self.trace["autoresearch"]
        if "missing" in record:
            meta["shapes"] = record
            if self.device_only:
                meta["operators"] = {"missing": record["missing"]}
            return
        if "events" in record:  # device-only timed steps: the detail step's operators, shapes and all
            try:
                meta["operators"], meta["shapes"] = join.join(self.trace["traceEvents"], record["events"]), \
                    {"joined": True}
            except Exception as e:  # noqa: BLE001 (the profile stands without operators; the run goes on)
                meta["operators"] = meta["shapes"] = {"missing": f"the operators' join failed: {type(e).__name__}: "
                                                                f"{e}"[:300]}
        else:
            meta["shapes"] = shapes.transplant(self.trace["traceEvents"], record["shapes"])
        if meta["shapes"].get("matched") or meta["shapes"].get("joined"):
            self.trace["record_shapes"] = 1
        meta.update(syncs=self.syncs.result(self.sampler.root), syncs_steps=1)

    def _guarded(self, fn):
        """fn()'s result, or, when it raises, a record saying why: the profile is saved already, so an untimed
        record after it (its code depends on private torch APIs) must never stop the training it rides on."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 (any failure of a record is reported, never raised)
            with contextlib.suppress(Exception):
                self.recorder.abandon()
            return {"missing": f"{self.key} failed and was left out: {type(e).__name__}: {e}"[:300]}

    def _export(self):
        try:
            self.prof.step()
            self.prof.stop()
        finally:
            self.launches.close()
        self.trace = self._recorded(self.active)

    def _recorded(self, steps, missing=None):
        """The exported trace of the first `steps` active steps (None if there is none), with the capture's
        metadata; `missing`: records of the steps after the window that were not made, and why."""
        try:
            with open(self.path, encoding="utf-8") as f:
                trace = json.load(f) if steps > 0 else None
        except FileNotFoundError:
            trace = None
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if trace is None:
            return None
        samples = self.sampler.result()
        if self.device_only:  # no ProfilerStep annotations in a CUDA-only trace: the steps from their marks
            join.add_steps(trace.setdefault("traceEvents", []), self.marks[:steps + 1], self.warmup)
        if steps < self.active:  # the step the loop was in when it ended is no step: its marker goes
            trace["traceEvents"] = [e for e in trace.get("traceEvents") or []
                                    if e.get("name") != f"ProfilerStep#{self.warmup + steps}"]
            samples["samples"] = [s for s in samples["samples"] if s[0] < steps]
        trace["autoresearch"] = dict(self.metadata, host_samples=samples, capture_ops=self.ops_mode(),
                                     syncs=None, dynamo=dynamo_record(),
                                     provenance=provenance.result(), device_state=self.state,
                                     settings=dict(self.before,
                                                   profiler=own_settings(self.before, self.cuda, self.cupti)),
                                     **self.missing, **(missing or {}))
        return trace

    def ops_mode(self):
        """What the timed steps recorded: "device" (operators joined from the detail step) or "full"."""
        return "device" if self.device_only else "full"

    def _quiet(self, fn):
        """fn(), with kineto's no-GPU error line dropped on a machine without CUDA (see NO_GPU_LINE)."""
        with stderr_without(NO_GPU_LINE) if not self.cuda else contextlib.nullcontext():
            return fn()

    def end_early(self, how, cut=False):
        """Stop a window the loop left before its end, in whatever state (nothing left running: torch.profiler,
        the sampler thread, the sync debug mode, the line tracer, the memory history), and return what it
        recorded: the trace of its complete active steps, with the records it could not make marked missing
        and `ended_early` in its metadata (profiling/profile/trace/irregular.py words it); None when no active step
        was complete. how: why the loop ended, in words ("an exception (RuntimeError)"). cut: leave out what
        ran after the last complete step (the loop had stopped: what the program did next is no step)."""
        pending = [_record_name(key) for key, _ in self.after]
        self.after = []
        if self.trace is not None:  # in a record step after the window: the profile itself is whole
            if self.recorder is not None:
                pending.insert(0, _record_name(self.key))
                with contextlib.suppress(Exception):
                    self.recorder.abandon()
                self.recorder = None
            trace, steps = self.trace, self.active
        else:
            steps = max(0, self.i - self.warmup)
            self.sampler.stop()
            with contextlib.suppress(Exception):  # a device left broken by the user's error must not stop this
                self.sync()
            self.launches.close()
            self._quiet(self.prof.stop)  # exports the steps recorded so far (torch.profiler does, mid-window)
            missing = {key: {"missing": f"the loop ended before its step ({how})"} for key in pending}
            trace = self._recorded(steps, missing) if steps else None
            if trace is not None and cut:
                cut_after_steps(trace)
            pending = list(missing)
            shutil.rmtree(self.tmp, ignore_errors=True)
        if trace is not None:
            for key in pending:
                trace["autoresearch"][key] = {"missing": f"the loop ended before its step ({how})"}
            trace["autoresearch"]["ended_early"] = {"how": how, "active_steps": steps, "of": self.active,
                                                   "missing": pending}
        self.trace = None
        self._release()
        return trace

    def _release(self):
        """After the capture's last profiler session: CUPTI released (capture/cupti.py)."""
        if self.cupti is not None:
            self.cupti.release()

    def abandon(self):
        """Stop a window the loop left before its end: nothing recorded, nothing left running."""
        self.end_early("abandoned")


# Device-side events: placed by the launch that made them (its correlation id), not by their own time
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "ac2g")


def cut_after_steps(trace):
    """Leave out of a trace the events that began after its last ProfilerStep ended (a stopped loop's
    window: the operators the program ran after it, up to the watchdog's close), and the device work those
    launched; the device work of the steps themselves stays, however late it ran. The span of the whole
    trace ends with the last step."""
    events = trace.get("traceEvents") or []
    ends = [e["ts"] + e.get("dur", 0) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
            and e.get("cat") == "user_annotation" and isinstance(e.get("ts"), (int, float))]
    if not ends:
        return
    end = max(ends)
    late = [e for e in events if isinstance(e.get("ts"), (int, float)) and e["ts"] > end
            and e.get("ph") != "M" and e.get("cat") not in DEVICE_CATS]
    gone = {(e.get("args") or {}).get("correlation") for e in late} - {None}
    dropped = {id(e) for e in late}
    kept = []
    for e in events:
        if id(e) in dropped:
            continue
        if e.get("cat") in DEVICE_CATS and ((e.get("args") or {}).get("correlation") in gone
                                            or (e.get("cat") == "ac2g" and e.get("id") in gone)):
            continue
        if e.get("cat") == "Trace" and isinstance(e.get("ts"), (int, float)) and "dur" in e:
            e["dur"] = max(0, min(e["dur"], end - e["ts"]))
        kept.append(e)
    trace["traceEvents"] = kept


def _record_name(key):
    """The metadata key of an after-window step's record (the detail step's is its shapes)."""
    return "shapes" if key == "details" else key


def own_settings(record, cuda, hold=None):
    """The settings the profiler itself changes (profiling/profile/trace/settings.py's `profiler` entries):
    provenance.start()'s compiler settings, CUDA's sync debug mode, "warn" during the untimed shape step
    after the profiled steps (DetailStep, SyncRecorder), and TEARDOWN_CUPTI=1 from the capture on where `hold`
    (capture/cupti.py's Hold) sets it."""
    changed = provenance.changes()
    if cuda:
        changed["sync_debug_mode"] = {"value": "warn", "during": "shape step",
                                      "before": recorded.value(record, "sync_debug_mode", "default")}
    if hold is not None and hold.sets:
        changed["env." + cupti.VAR] = {"value": "1", "during": "process", "before": None}
    return changed


def _uuid():
    """The current CUDA device's UUID, as NVML names it (CUDA_VISIBLE_DEVICES renumbers devices, not UUIDs)."""
    try:
        return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    except (AttributeError, RuntimeError):
        return None


@contextlib.contextmanager
def stderr_without(pattern):
    """Run the block with file descriptor 2 (where C++ code writes too, not only Python) sent to a temporary
    file, then write its lines back to stderr, all but those `pattern` (bytes) matches. For short blocks:
    what the block writes shows when it ends."""
    if sys.stderr is not None:
        sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp if not pattern.search(line)]
            if kept:
                with open(2, "wb", closefd=False) as err:
                    err.writelines(kept)


def dynamo_record():
    """The graph breaks TorchDynamo met so far in this process (compilation happens before profiling):
    {"graph_breaks": [{reason, count}], "resumes": {resume function: count}, "unique_graphs": n}; None when
    nothing was compiled."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    counters = utils.counters
    reasons = {}
    for group in ("graph_break", "unimplemented"):
        for reason, n in counters.get(group, {}).items():
            first = str(reason).strip().splitlines()[0][:200] if str(reason).strip() else "?"
            reasons[first] = reasons.get(first, 0) + n
    return {"graph_breaks": [{"reason": r, "count": n} for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])],
            "resumes": dict(counters.get("resumes", {})),
            "unique_graphs": counters.get("stats", {}).get("unique_graphs")}
