"""The public profiling API: profile any training loop, the way torch.profiler's users already write it.

    import profiling

    prof = profiling.Profiler(model, tokens_per_step=batch * seq_len)   # before the first compiled call
    for batch in loader:
        train_step(batch)
        prof.step()                  # after every step; free once the profile is done
        if prof.done:
            break                    # or keep training: step() does nothing more
    print(prof.report)               # the Markdown report; prof.summary: the --json content; prof.folder

    result = profiling.profile_steps(lambda: train_step(next(batches)), model, tokens_per_step=...)
    print(result.report)             # the function form: it calls the step function itself

`Profiler` also works as a context manager (`with profiling.Profiler(...) as prof:`), which closes the profile
at its exit however the block ends. train.py's `--profile` goes through this same class.

What it guarantees about the run it measures (DESIGN.md pitfall 14, STYLE.md habit 17), whatever way the loop
ends -- done, stopped early (step() no longer called, close() or not), an exception, KeyboardInterrupt, the
interpreter exiting, the `with` block left by an exception, the Profiler dropped:
    - nothing it started runs on: torch.profiler, the stack-sampler thread, CUDA's sync debug mode, the line
      tracer (sys.settrace), the allocator's history, Inductor's launch-record switch, CUPTI's hooks on every
      launch (released after the capture's last session, TEARDOWN_CUPTI=1 left set where the user had not
      set it: profiling/profile/capture/cupti.py); a loop that stops stepping inside the window and goes on
      with something else (its function returned, or it left the loop that called step()) is closed by a
      watchdog on the main thread at its next bytecode, without what ran after the last step; a slow step (a
      save, an eval) never closes it (profiling/profile/capture/watchdog.py); an atexit hook (registered when
      the window opens, through weakref.finalize: it holds the window, never the Profiler) closes a window
      nobody closed;
    - the run ends as it would without the profiler: the same exception, traceback and exit code (0; 1; a
      KeyboardInterrupt as Python ends it: creating a Profiler imports nothing that an exit hook imports, as
      the report's tabulate, which changes that code), never a crash; close() and the exit hooks never raise:
      a failure of their own is one line on stderr;
    - what was recorded is kept once one profiled step was complete: the report of the steps recorded, noting
      what is missing and why, in `prof.report` and its folder, however the loop ended (close(), the `with`
      block's end, an exception, the watchdog; issue #55); only the trace, quick (`research profile <trace>`
      makes the report), on a KeyboardInterrupt, at exit, when the Profiler is dropped, and in a
      several-process run that did not end normally, said in one stderr line; a loop that ended before the
      profiled steps warns and writes nothing;
    - the settings it changed are put back when its steps end (provenance.start()'s compiler settings; the
      sync debug mode after each profiled step), all but TEARDOWN_CUPTI=1 (above, and in the report's settings
      line);
    - an out_dir it could not write fails at construction, before any step.
Timed steps are timed one by one (CUDA events, no extra sync); a step over twice their median is left out of
the unprofiled step time and named in the report (profiling/profile/trace/irregular.py), as is one among the
profiled steps. The report compares itself with profiles/latest only when that one is of the same script and
model (profiling/profile/report/folder.py's run_identity).

What the steps are, in order (the defaults: 3 + 5 + 1 + 5 + 1 + 1 + 5 = 21 steps at the least; each trains the
model as usual):
    warmup_steps            untimed: compilation, autotuning, the allocator settling
    timed_steps             unprofiled, timed between two device syncs: the step time the report checks the
                            profiled one against (or give `unprofiled_step_ms` and set timed_steps=0); their
                            page faults counted too (on a CPU run with many, one's cost timed: ~15 ms)
    profiler_warmup_steps   under torch.profiler, not recorded (its own start-up)
    active_steps            the profiled window: kernels, operators, the host's Python stack every 2 ms, the
                            process's settings
    1 more                  operator input shapes and the Python lines of host syncs (recording them in the
                            profiled steps slowed them: benchmarks/profiler_cost/profiler_cost_results.md)
    1 more                  records the lines of the eager operators (off with AUTORESEARCH_EAGER_LINES=0)
    1 more                  CUDA only (off with memory=False): GPU memory at the step's peak by category, and
                            with micro_batch the largest micro-batch predicted to fit
                            (profiling/profile/capture/memory.py, gpu_memory.py)
    timed_steps more        unprofiled, timed as before the window; more of them, one round at a time, while
                            the mean is not known within 3% (inputs whose size changes every step, a noisy
                            host) or the steps after the window ran at another pace than those before it
                            (still warming up, a burst of the host's load): up to max_timed_steps (200) in all
                            and 30 s; the mean is of every timed step.
                            Never in a several-process run; max_timed_steps=timed_steps: none. The report is
                            written after them; a loop that ends meanwhile gets it with the steps timed so far

Lines of compiled code: the compiler records which source lines each kernel came from only for graphs
compiled after the Profiler was created; create it before the first call of a torch.compile'd function (the
report says when it was not). Without torch.compile everything works the same, from the operators' lines.

Every argument is checked on creation: a bad one raises ValueError naming it. Importing `profiling` does not
import torch; creating a Profiler does.
"""
import atexit
import contextlib
import functools
import marshal
import os
import pickle
import sys
import tempfile
import threading
import time
import warnings
import weakref
from typing import NamedTuple

from profiling.errors import UserError
from profiling.profile.capture import faults
from profiling.profile.trace import whose
from profiling.profile.trace.join import OPS

PROFILER_WARMUP = 1   # torch.profiler's own start-up step, not recorded
# The steps after the window are timed too, before the report (one round at least; more until irregular's
# MEAN_ERROR and DRIFT are met), up to this many timed steps in all (max_timed_steps' default) and this long
MORE_STEPS = 200
MORE_S = 30.0
# Timed steps whose time still rises are warm-up (a DataLoader with workers fills its prefetch queue at start
# and drains it in the first steps: an H100 ResNet-18 with 2 workers timed 28, 29, 92, 101, 93 ms, its steady
# state ~100 ms): the timing starts again after them, at most this many times.
SETTLE_ROUNDS = 3

_guards = set()       # weakref.finalize of each open window's Profiler: what interpreter exit must close
_exiting = []         # non-empty once the interpreter exits (a window then closes as "the program exited")


class ProfileResult(NamedTuple):
    report: str       # the Markdown report (None on ranks other than 0 of a several-process run)
    summary: dict     # the numbers of the report (`research profile --json`), None on other ranks
    folder: str       # where report.md, summary.json and the trace were written
    seconds_after: float  # spent after the profiled window: the line-record step, export, summary, report


class Profiler:
    """Profile a few steps of a training loop that calls `step()` after each one (see the module's docstring).

    model: the nn.Module being trained, several (a list, or a dict of name -> module), or None (then the
        report has no regions of the model, and says so). Its parameters' names and shapes place the GEMMs.
    tokens_per_step: tokens one optimizer step processes (for tokens/s), or None.
    samples_per_step: samples (images, sequences) one optimizer step processes (for samples/s), or None.
    flops_per_token: model FLOPs per token (for MFU), or None: then MFU is computed from the FLOPs the trace
        shows (GEMMs and attention, from their recorded shapes).
    warmup_steps, timed_steps, profiler_warmup_steps, active_steps: the schedule above.
    max_timed_steps: the timed steps at most, those after the window included (the schedule above).
    unprofiled_step_ms: a step time you measured yourself, instead of the timed steps.
    out_dir: where each profile's folder goes (default: $AUTORESEARCH_PROFILE_DIR, else ./profiles).
    reference: a profile's summary.json to look for a regression against, or None.
    metadata: more JSON-able facts for the trace's metadata (e.g. {"commit": "abc123"}).
    micro_batch: sequences per forward/backward (for what fits), or None.
    memory: the GPU-memory step after the window (None: on with CUDA; never without it).
    code_roots: folders of your own code besides the script's folder (profiling/profile/trace/whose.py), or None.
    ops: what the timed steps record on CUDA: "device" (default: kernels, copies and their launches; operators,
        shapes and annotations joined from the untimed step after them, at a fraction of torch.profiler's host
        cost) or "full" (every operator recorded inside the timed steps, as torch.profiler records them).
    top: rows of the kernel table. ranks: an object with rank, world_size, first, barrier(), from_first(obj)
        for a several-process run (default: torch.distributed's world when it is initialized).
    """

    _own_loop = False  # True where profile_steps drives the loop (_OwnLoop): then no watchdog

    def __init__(self, model=None, *, tokens_per_step=None, flops_per_token=None, warmup_steps=3, timed_steps=5,
                 profiler_warmup_steps=PROFILER_WARMUP, active_steps=5, unprofiled_step_ms=None, out_dir=None,
                 reference=None, metadata=None, top=10, ranks=None, micro_batch=None, memory=None,
                 samples_per_step=None, code_roots=None, ops="device", max_timed_steps=MORE_STEPS):
        self.parameters = _parameters(model)
        check_arguments(tokens_per_step=tokens_per_step, flops_per_token=flops_per_token,
                        warmup_steps=warmup_steps, timed_steps=timed_steps,
                        profiler_warmup_steps=profiler_warmup_steps, active_steps=active_steps,
                        unprofiled_step_ms=unprofiled_step_ms, out_dir=out_dir, reference=reference,
                        metadata=metadata, top=top, micro_batch=micro_batch, memory=memory,
                        samples_per_step=samples_per_step, code_roots=code_roots, ops=ops,
                        max_timed_steps=max_timed_steps)
        self.samples_per_step, self.ops, self.max_timed = samples_per_step, ops, max_timed_steps

        from profiling.profile.report import folder
        if out_dir is None:
            _check_out_dir(folder.profile_dir())

        import torch

        from profiling.profile.capture import provenance, watchdog
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.warmup, self.timed, self.profiler_warmup = warmup_steps, timed_steps, profiler_warmup_steps
        self.active, self.unprofiled_ms, self.top = active_steps, unprofiled_step_ms, top
        self.out_dir = os.fspath(out_dir) if out_dir is not None else None
        self.reference = os.fspath(reference) if isinstance(reference, os.PathLike) else reference
        self.metadata = dict(metadata or {})
        self.ranks = ranks if ranks is not None else _dist_ranks(torch)
        self.compiled_before = 0 if provenance.started() or not provenance.enabled() else _graphs_compiled()
        self._started_provenance = not provenance.started()  # then its settings are ours to put back
        provenance.start()  # before the first compile: the lines of compiled kernels
        self.cuda = torch.cuda.is_available()
        self.micro_batch, self.memory_asked = micro_batch, memory is not False  # without CUDA: said, not run
        self.memory = self.memory_asked and self.cuda
        self.model = model
        self.steps, self.done, self.result, self._window, self._guard = 0, False, None, None, None
        self._each, self._held = [], None  # the timed steps' ms; the window's trace while more are timed after it
        self._loader = False  # whether a DataLoader's workers fed the window (`_after`)
        self._settling = 0  # timing rounds restarted because the step time was still rising
        # wait for the steady state (SETTLE_ROUNDS, the window's _settle) on CUDA only: a CPU step's time swings
        # by 1.5x on a loaded 2-core host, which read as still rising would outrun a loop of fixed length
        self.settle = self.cuda
        self._pace, self._watchdog, self._watch_frames = watchdog.Pace(), None, True
        if warmup_steps == 0 and timed_steps:  # the timed steps begin with the next step
            self._start_timing()
        if warmup_steps + timed_steps == 0:  # the window begins with the next step
            self._open()

    # the results, once done
    report = property(lambda self: self.result.report if self.result else None)
    summary = property(lambda self: self.result.summary if self.result else None)
    folder = property(lambda self: self.result.folder if self.result else None)

    @property
    def total_steps(self):
        """Steps the profile takes at the least: the line-record and memory steps and one round of timed steps
        after the window included (more where the timed steps do not yet pin their mean down)."""
        from profiling.profile.capture import eager_record
        return (self.warmup + self.timed + self.profiler_warmup + self.active + 1 + int(eager_record.enabled())
                + int(self.memory) + self.timed * self._times_after())

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        """Close the profile however the block ends; the block's own exception goes on unchanged."""
        if not self.done:
            self._end(None if kind is None else _cause(kind, value))
        return False

    def step(self):
        """Call after each training step: it moves the profile on (timing, recording, and after the last
        step writing the report). Nothing once done."""
        if self.done:
            return
        pace = self._pace
        pace.busy += 1  # first: the watchdog reads nothing while this step() runs
        try:
            pace.stepped(sys._getframe(1), measured=self.steps >= self.warmup)  # the watchdog's facts
            self._advance()
        finally:
            pace.returned()
            pace.busy -= 1

    def _advance(self):
        self.steps += 1
        start = self.warmup  # the timed steps begin after the warm-up
        if self.steps == start and self.timed:
            self._start_timing()
        elif start < self.steps <= start + self.timed:
            self._marks.append(self._mark())
            self._faults.append(faults.count())
        if self.steps == start + self.timed:
            if self.timed and self._stop_timing() and self.settle and self._settling < SETTLE_ROUNDS:
                self._settling += 1  # still rising: these were warm-up steps; time as many more
                self.warmup += self.timed
                self._start_timing()
                return
            self._open()
        elif self._held is not None:
            self._marks.append(self._mark())
            if self._timed_enough():
                self._finish(*self._release())
        elif self._window is not None:
            trace = self._window.step()
            if trace is not None:
                if self._time_more():
                    self._hold(trace, self._window.t_end)
                else:
                    self._finish(trace, self._window.t_end)

    def close(self):
        """End a profile the loop left unfinished; the context manager's exit calls it. What the profiled
        steps recorded is saved with a note of what is missing (a report once one active step was recorded); a loop
        that ended before them warns how many steps the profile needed. Never raises: a failure of its own is
        one line on stderr."""
        if not self.done:
            self._pace.busy += 1
            try:
                self._end(None)
            finally:
                self._pace.busy -= 1

    def watch_loop_frames(self, on):
        """Whether the watchdog closes the window when the loop's frame returns or leaves its loop (on by
        default; off where a framework's own events end the profile and its loop's function returns each
        epoch: then nothing but those events, the Profiler's collection and exit closes it)."""
        self._watch_frames = on
        if self._watchdog is not None:
            self._watchdog.watch_frames = on

    def _stopped(self, reason):
        """The watchdog's close (profiling/profile/capture/watchdog.py), on the loop's thread: the loop
        stopped stepping inside the window without close() (its function returned, or it left its loop). The
        report is written, without what was recorded after the last step, inside whatever the program does
        next. False: not here (inside a backward pass), the watchdog asks again."""
        if self.done or (self._window is None and self._held is None):
            return None
        if _in_backward():  # autograd's engine has the profiler's records of its own open: after it
            return False
        self._pace.busy += 1
        try:
            self._end("stopped", how=f"the loop stopped stepping after step {self.steps} ({reason})")
        finally:
            self._pace.busy -= 1

    def _end(self, cause, how=None):
        """Stop everything the profile runs and keep what it recorded: the report of the profiled steps
        recorded, noting what is missing and why, however the loop ended (issue #55). cause: None when the loop
        simply stopped (close(), a `with` block's end), else how it ended, in words: an exception, or
        "stopped" with `how` (the watchdog's). Only the trace is written (quick) on a KeyboardInterrupt, which
        asks to stop now, and on any cause in a several-process run, where the report's collectives could wait
        on a rank that has gone."""
        window, self._window = self._window, None
        holding = self._held is not None  # the window's trace, while the steps after it were timed
        self._unguard()
        steps = self.steps
        if cause is None:
            raised = sys.exc_info()[1]  # close() from an except block (Lightning's on_exception): its error
            how = f"{_cause(type(raised), raised)} in step {steps + 1}" if raised is not None else \
                f"the loop stopped after step {steps}"
        how = how or f"{cause} in step {steps + 1}"
        try:
            if holding:  # with the steps timed so far
                trace, t_end = self._release()
            else:
                trace = window.end_early(how, cut=cause == "stopped") if window is not None else None
                t_end = time.perf_counter()
            if trace is None:
                if window is not None and cause is not None:
                    _say(f"{how}: stopped before any profiled step was recorded; nothing saved")
            elif cause is None or (cause != "KeyboardInterrupt" and self.ranks is None):
                self._finish(trace, t_end)
            else:
                _keep_trace(trace, self.out_dir, self.ranks, how)
        except Exception as e:  # noqa: BLE001 (the profiler must never change how the run ends)
            _say(f"could not save what it recorded ({type(e).__name__}: {e})")
        finally:
            self.done = True
            _restore(self._started_provenance)
        if self.result is None and cause is None:
            warnings.warn(f"profiling: the loop ended after {steps} steps, before the profile was done: it "
                          f"takes {self.total_steps} (warmup_steps {self.warmup} + timed_steps {self.timed} + "
                          f"profiler_warmup_steps {self.profiler_warmup} + active_steps {self.active} + the "
                          "shape, line-record and memory steps + timed_steps again); run more steps or lower those",
                          stacklevel=3)
        elif self.result is not None and cause is None and holding:
            pass  # nothing is missing: the report's notes say how many steps were timed after the window
        elif self.result is not None and cause is None:
            _say(f"the loop ended after {steps} steps, before the profile was done: {self.folder} holds what "
                 "was recorded (its report says what is missing)")
        elif self.result is not None:
            _say(f"{how}: the report of the profiled steps recorded is in "
                 f"{os.path.join(self.folder, 'report.md')} (it says what is missing)")

    def _open(self):
        """Open the profiled window, guarded: closed by the watchdog when the loop stops stepping, at
        interpreter exit, or when the Profiler is dropped, if the loop never closes it."""
        from profiling.profile.capture import watchdog
        self._window = self._open_window()
        self._watchdog = None if self._own_loop else watchdog.Watchdog(self._pace, self._stopped, self._watch_frames)
        self._guard = weakref.finalize(self, _left, functools.partial(_keep, self._window, self.out_dir, self.ranks),
                                       "before the profile was done", self._started_provenance, self._watchdog,
                                       threading.get_ident())
        _guards.add(self._guard)
        _hook_exit()
        if self._watchdog is not None:
            self._watchdog.start()

    def _unguard(self):
        """The window is closed here: its guard and its watchdog are no longer needed."""
        if self._guard is not None:
            self._guard.detach()
            _guards.discard(self._guard)
            self._guard = None
        if self._watchdog is not None:
            self._watchdog.stop()

    def _mark(self):
        """A timed step's boundary, without a sync: a CUDA event (read after the last), else the clock."""
        if self.cuda:
            import torch
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _start_timing(self):
        self._sync()
        self._marks = [self._mark()]
        self._faults = [faults.count()]

    def _stop_timing(self):
        """The unprofiled step time from the timed steps, outliers left out (profiling/profile/trace/irregular.py);
        True when the step time was still rising through them (a DataLoader's prefetched batches running out,
        DESIGN.md pitfall 17): not yet the steady state."""
        from profiling.profile.trace import irregular
        self._sync()
        marks = self._marks
        if self.cuda:
            each = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
        else:
            each = [1e3 * (b - a) for a, b in zip(marks, marks[1:])]
        self._each = each
        self.unprofiled_ms, self.timed_outliers = irregular.timed(each)
        self.metadata["timed_step_ms_each"] = [round(x, 4) for x in each]
        self.metadata.pop("timed_outliers", None)
        if self.timed_outliers:
            self.metadata["timed_outliers"] = self.timed_outliers
        self._page_faults()
        rising = irregular.rising(each)
        if rising and self.settle:  # timed again after them (CUDA only): said in the report
            self.metadata.setdefault("settling", []).append([round(x, 2) for x in each])
        return rising

    def _page_faults(self):
        """The host's page faults in each timed step, and what one costs here where they are many (a CPU run:
        capture/faults.py; findings/cpu.py's page_faults prices them)."""
        import torch
        self.metadata.pop("page_fault_us", None)
        counts = self._faults
        each = None if None in counts else [b - a for a, b in zip(counts, counts[1:])]
        self.metadata.update(faults.timed_meta(each, self.cuda, torch.get_num_threads()))

    def _time_more(self):
        """Whether the steps after the window are timed too, before the report (`_timed_enough` says how many):
        wherever steps were timed before it, in one process (several ranks' windows end together)."""
        return self._times_after() and bool(self._each)

    def _times_after(self):
        """Whether this Profiler times steps after its window at all (the schedule's last round)."""
        alone = self.ranks is None or self.ranks.world_size == 1
        return alone and 0 < self.timed < self.max_timed

    def _hold(self, trace, t_end):
        """Keep the window's trace while the steps after it are timed (`_time_more`); the guard now keeps the
        trace (written as it is if the Profiler is dropped or the program exits first), the watchdog watches on."""
        self._window = None
        self._loader = any("_MultiProcessingDataLoaderIter" in str(e.get("name", "")) for e in trace["traceEvents"])
        trace = _pack(trace)
        self._held, self._minimum = (trace, t_end, time.perf_counter()), None
        if self._guard is not None:
            self._guard.detach()
            _guards.discard(self._guard)
        self._guard = weakref.finalize(self, _left, functools.partial(_keep_trace, trace, self.out_dir, self.ranks),
                                       "while it timed the steps after the profiled ones", self._started_provenance,
                                       self._watchdog, threading.get_ident())
        _guards.add(self._guard)
        self._start_timing()

    def _timed_enough(self):
        """Whether the timing after the window is done, asked once a round of timed steps (timed_steps of them):
        one round at least, then until the mean of every timed step is known within irregular.MEAN_ERROR and the
        steps after the window ran at the pace of those before it (irregular.drifted: else no short sample is
        the loop's pace, a burst of the host's load over one side or steps before still warming up: the timing
        goes on, and the longer side weighs more), or max_timed_steps are timed, or MORE_S spent."""
        from profiling.profile.trace import irregular
        n, spent = len(self._marks) - 1, time.perf_counter() - self._held[2]
        if spent >= MORE_S or len(self._each) + n >= self.max_timed:
            return True
        if n % self.timed:
            return False
        self._minimum = self._minimum or n  # the steps every loop is timed for after the window
        after = self._after()[1]
        return (irregular.mean_error(self._each + after) <= irregular.MEAN_ERROR
                and not irregular.drifted(self._each, after))

    def _after(self):
        """(steps left out, [ms]) of the steps timed after the window: where a DataLoader's workers fed the window,
        the first ones that ran under window.SETTLE_SHARE of the steps timed before it, until one came back to that
        pace (the pause for the trace's export let the workers fill their queue, which those steps used up),
        SETTLE_STEPS of them at most."""
        from profiling.profile.capture import window
        self._sync()
        marks = self._marks
        if self.cuda:
            each = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
        else:
            each = [1e3 * (b - a) for a, b in zip(marks, marks[1:])]
        bar = window.SETTLE_SHARE * sum(self._each) / len(self._each)
        k = next((i for i, ms in enumerate(each) if ms >= bar), 0)  # none back at the pace before: none left out
        k = k if self._loader and k <= window.SETTLE_STEPS else 0
        return k, each[k:]

    def _release(self):
        """(the held trace, t_end) with every timed step in its unprofiled step time; t_end moved on by the
        timing, so that `seconds_after` counts the report's own work only."""
        from profiling.profile.trace import irregular
        trace, t_end, began = self._held
        self._held = None
        trace = _unpack(trace)
        try:
            left_out, after = self._after()
        except Exception:  # noqa: BLE001 (a device error after the window: the report keeps the steps before it)
            left_out, after = 0, []
        drift = bool(after) and irregular.drifted(self._each, after)
        each = self._each + after
        meta = trace["autoresearch"]
        meta["unprofiled_step_ms"], outliers = irregular.timed(each)
        meta["timed_step_ms_each"] = [round(x, 4) for x in each]
        meta.pop("timed_outliers", None)
        if outliers:
            meta["timed_outliers"] = outliers
        more = self._minimum is not None and len(self._marks) - 1 > self._minimum  # beyond what every loop gets
        meta["timed_after"] = {"before": len(self._each), "after": len(after), "left_out": left_out, "more": more,
                               "error": round(irregular.mean_error(each), 4),
                               "before_ms": round(irregular.timed(self._each)[0], 4),
                               "after_ms": round(irregular.timed(after)[0], 4) if after else None,
                               "drifted": drift}
        return trace, t_end + time.perf_counter() - began

    def _sync(self):
        if self.cuda:
            import torch
            torch.cuda.synchronize()

    def _open_window(self):
        from profiling.profile.capture import window
        return window.Window(self.profiler_warmup, self.active, self._metadata(), self.memory_asked,
                             _tensors(self.model) if self.memory else (),
                             steady_ms=self.unprofiled_ms if self.settle else None, ops=self.ops)

    def _metadata(self):
        import torch

        from profiling.profile.capture import settings
        from profiling.profile.trace import hardware
        device = torch.cuda.get_device_name() if self.cuda else "cpu"
        n = self.ranks.world_size if self.ranks else 1
        meta = dict(device=device, torch=str(torch.__version__), peak_flops=hardware.peak_flops(device) if self.cuda
                    else None, unprofiled_step_ms=self.unprofiled_ms,
                    peak_memory_mb=torch.cuda.max_memory_allocated() / 1024**2 if self.cuda else None,
                    parameters=self.parameters, compiled_before_profiler=self.compiled_before,
                    script=_script(), code_roots=whose.current().roots)
        ignored = _compile_ignored(self.model)
        if ignored:
            meta["compile_ignored"] = ignored
        # the threads against the cores: a CPU run's (findings/cpu.py), and any run's cores that DataLoader workers
        # may use (findings/input.py never advises more workers than they leave spare)
        meta["cpu_threads"] = _cpu_threads(torch)
        if self.micro_batch:
            meta["micro_batch"] = self.micro_batch
        if self.tokens_per_step:
            meta["tokens_per_step"] = self.tokens_per_step // n  # a rank's trace: its share
        if self.samples_per_step:
            meta["samples_per_step"] = self.samples_per_step // n
        if self.flops_per_token and self.tokens_per_step:
            meta["flops_per_step"] = self.flops_per_token * self.tokens_per_step / n
        meta.update(self.metadata)
        if "settings" not in meta:
            meta["settings"] = settings.snapshot()
        if n > 1:
            meta.update(rank=self.ranks.rank, world_size=n)
        return meta

    def _finish(self, trace, t_end):
        from profiling.profile.report.folder import profile_dir, save
        self._window = None
        self._unguard()
        reference = (self.reference, f"the profile {self.reference}") if isinstance(self.reference, str) \
            else self.reference  # train.py's: (path, "the best kept run, ...")
        try:
            report, folder, summary = save(trace, self.ranks, reference, self.top, self.out_dir)
            self.result = ProfileResult(report, summary, folder, time.perf_counter() - t_end)
        except UserError as e:  # a trace the report cannot read (a CPU-only loop under a CUDA capture recorded no
            # work: found on an H200): said, and the loop goes on; save() wrote the trace before reading it
            _say(f"no report: {e}; the trace is in the newest folder under {self.out_dir or profile_dir()}")
        finally:
            self.done = True
            _restore(self._started_provenance)


def _in_backward():
    """Whether the thread is inside a backward pass (autograd's engine calls Python: hooks, a Function's
    backward), where stopping torch.profiler leaves the engine's open records unmatched (torch warns)."""
    try:
        import torch
        return torch._C._current_graph_task_id() != -1
    except Exception:  # noqa: BLE001 (another torch: no such check, close as anywhere else)
        return False


def _hook_exit():
    """Register the exit hook once, when the first window opens: after torch's own (atexit runs last first),
    so it runs before them."""
    if not _exiting and not getattr(_hook_exit, "done", False):
        atexit.register(_at_exit)
        _hook_exit.done = True


def _at_exit():
    """The interpreter is exiting with a window still open (the loop stopped or raised, nothing closed it):
    torch.profiler left running then ends the process with a segmentation fault (DESIGN.md pitfall 14)."""
    from profiling.profile.capture import watchdog
    _exiting.append(True)
    for guard in list(_guards):
        guard()
    watchdog.run_later()  # what a finalizer on another thread left for the loop's thread


def _left(keep, what, started_provenance, dog, thread):
    """A Profiler whose window is open (or whose trace is held while the steps after it are timed) is dropped or
    outlived by the interpreter: stop it and keep the trace, `keep(how)` (`_keep` or `_keep_trace` bound to it),
    on `thread`, the loop's."""
    if not _exiting and threading.get_ident() != thread:
        # the collector freed it on another thread (wherever an allocation ran the collector: the stack
        # sampler's, say), where torch.profiler cannot be stopped (its state is its thread's) nor the sampler
        # joined: before, the trace was lost and the half-stopped profiler crashed the process at exit
        from profiling.profile.capture import watchdog
        watchdog.later(thread, functools.partial(_left, keep, what, started_provenance, dog, thread))
        return
    if dog is not None:
        dog.stop()
    _guards.difference_update([g for g in list(_guards) if not g.alive])
    if _exiting:
        error = getattr(sys, "last_value", None)  # an uncaught exception, already printed
        cause = "the program exited" + (f" on {_cause(type(error), error)}" if error is not None else "")
    else:
        cause = "the Profiler was dropped"
    try:
        keep(f"{cause} {what}")
    except Exception as e:  # noqa: BLE001 (never change how the run ends)
        _say(f"could not save what it recorded ({type(e).__name__}: {e})")
    finally:
        _restore(started_provenance)


def _keep(window, out_dir, ranks, how):
    """Stop the window and write what it recorded, the trace only (no summary: this runs at exit or in a
    finalizer), with one line on stderr saying where."""
    trace = window.end_early(how)
    if trace is None:
        _say(f"{how}: stopped before any profiled step was recorded; nothing saved")
        return
    _keep_trace(trace, out_dir, ranks, how)


def _keep_trace(trace, out_dir, ranks, how):
    """Write a trace that ended early, alone (`research profile` makes its report later), and say where."""
    from profiling.profile.report import folder
    trace = _unpack(trace)
    path = folder.save_trace(trace, ranks, out_dir)
    n = (trace["autoresearch"].get("ended_early") or {}).get("active_steps")  # None: every profiled step
    steps = "profiled steps" if n is None else f"{n} profiled step{'s' * (n != 1)}"
    _say(f"{how}: the {steps} recorded {'is' if n == 1 else 'are'} in {path}; `research profile {path}` reads "
         f"{'it' if n == 1 else 'them'}")


def _pack(trace):
    """The trace held while the steps after the window are timed, as bytes: its hundreds of thousands of objects
    out of the garbage collector's walks, which slowed a CPU loop's timed steps by a fifth (103.6 against 85.5
    ms), and the collector left as the loop has it (freezing every object instead made those steps faster than
    the loop's own: 74.6 against 78-94 ms). pickle where marshal cannot write a value of it (a str subclass,
    say); the trace as it is where neither can."""
    try:
        return marshal.dumps(trace)
    except ValueError:
        try:
            return _Pickled(pickle.dumps(trace, pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 (held as it is: slower timed steps, nothing lost)
            return trace


class _Pickled(bytes):
    """A trace `_pack` pickled."""


def _unpack(trace):
    if isinstance(trace, _Pickled):
        return pickle.loads(trace)
    return marshal.loads(trace) if isinstance(trace, bytes) else trace


def _say(text):
    """One line on stderr, the profiler's only voice on the way out."""
    with contextlib.suppress(Exception):
        print(f"profiling: {text}", file=sys.stderr, flush=True)


def _restore(started_provenance):
    """Put back the settings the Profiler changed (profiling/profile/capture/provenance.py), if it changed them."""
    if started_provenance:
        from profiling.profile.capture import provenance
        with contextlib.suppress(Exception):
            provenance.stop()


def _cause(kind, error=None):
    """An exception in words, for the notes: `an exception (ValueError: a bad batch, at train.py:82)`,
    `KeyboardInterrupt`; the line: the innermost frame of the user's own code in its traceback (else the
    innermost frame), where the trace's reader cannot see it."""
    if kind is KeyboardInterrupt:
        return "KeyboardInterrupt"
    what = getattr(kind, "__name__", kind)
    text = str(error).strip().splitlines()[0][:80] if error is not None and str(error).strip() else ""
    where = _raised_at(getattr(error, "__traceback__", None))
    return f"an exception ({what}" + (f": {text}" if text else "") + (f", at {where}" if where else "") + ")"


def _raised_at(tb):
    """`file.py:line` of the innermost frame of the user's code in a traceback, else its innermost; None."""
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    if not frames:
        return None
    code = whose.current()
    own = [f for f in frames if code.kind(f[0], f[2]) == whose.USER] or frames
    path, line, _ = own[-1]
    return f"{code.name(path)}:{line}"


def _cpu_threads(torch):
    """{intra_op, inter_op, cores (this process may run on), load_average (1 min)} as the window opens; a part
    the platform cannot tell is None."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(), "cores": cores,
            "load_average": load}


def check_arguments(tokens_per_step=None, flops_per_token=None, warmup_steps=3, timed_steps=5,
                    profiler_warmup_steps=PROFILER_WARMUP, active_steps=5, unprofiled_step_ms=None,
                    out_dir=None, reference=None, metadata=None, top=10, micro_batch=None, memory=None,
                    samples_per_step=None, code_roots=None, ranks=None, ops="device", max_timed_steps=MORE_STEPS):
    """A one-line ValueError naming the first bad argument of Profiler (all but the model) and what it takes;
    the callbacks (profiling/callbacks.py) check their options so when they are made, before any training.
    An out_dir given is checked for writing; code_roots are set (profiling/profile/trace/whose.py)."""
    _check_count("tokens_per_step", tokens_per_step, minimum=1, optional=True)
    _check_count("samples_per_step", samples_per_step, minimum=1, optional=True)
    _check_count("micro_batch", micro_batch, minimum=1, optional=True)
    if memory not in (None, True, False):
        raise ValueError(f"memory must be True, False or None, not {memory!r}")
    _check_number("flops_per_token", flops_per_token)
    for name, value, minimum in (("warmup_steps", warmup_steps, 0), ("timed_steps", timed_steps, 0),
                                 ("profiler_warmup_steps", profiler_warmup_steps, 0),
                                 ("active_steps", active_steps, 1), ("top", top, 1)):
        _check_count(name, value, minimum)
    _check_number("unprofiled_step_ms", unprofiled_step_ms)
    if ops not in OPS:
        raise ValueError(f"ops must be \"device\" (operators joined from an untimed step) or \"full\" "
                         f"(operators recorded in the timed steps), not {ops!r}")
    _check_count("max_timed_steps", max_timed_steps, 0)
    if max_timed_steps < timed_steps:
        raise ValueError(f"max_timed_steps must be at least timed_steps ({timed_steps}), not {max_timed_steps}: it "
                         "bounds the timed steps, those after the window included")
    if timed_steps == 0 and unprofiled_step_ms is None:
        raise ValueError("timed_steps=0 needs unprofiled_step_ms (the step time measured without the "
                         "profiler); give it, or time at least one step")
    if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
        raise ValueError(f"out_dir must be a folder path, not {type(out_dir).__name__}")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a dict, not {type(metadata).__name__}")
    if reference is not None and not isinstance(reference, (str, os.PathLike, tuple)):
        raise ValueError(f"reference must be a profile's summary.json path or None, not {reference!r}")
    if isinstance(reference, (str, os.PathLike)) and not os.path.isfile(reference):
        raise ValueError(f"reference {reference!r} is not a file; give a profile's summary.json")
    if ranks is not None and not all(hasattr(ranks, a) for a in ("rank", "world_size", "barrier")):
        raise ValueError(f"ranks must have rank, world_size, first, barrier() and from_first(), "
                         f"not {ranks!r}")
    whose.use(code_roots)  # whose lines the report names; ValueError for anything but folders
    if out_dir is not None:
        _check_out_dir(out_dir)


def _check_out_dir(path):
    """ValueError unless `path` is a folder this process can write, or one it can create: said now, not after
    the profiled steps."""
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ValueError(f"out_dir {os.fspath(path)!r} cannot be a folder: {probe!r} is a file; give a "
                         "folder path")
    try:
        tempfile.TemporaryFile(dir=probe).close()
    except OSError as e:
        raise ValueError(f"out_dir {os.fspath(path)!r} cannot be written ({e.strerror} in {probe!r}); give a "
                         "folder you can write") from None


def profile_steps(step_fn, model=None, **options):
    """Call `step_fn()` (one training step) as many times as a Profiler needs and return its ProfileResult;
    options: Profiler's."""
    if not callable(step_fn):
        raise ValueError(f"step_fn must be a function that runs one training step, not {type(step_fn).__name__}")
    prof = _OwnLoop(model, **options)
    with prof:
        while not prof.done:
            step_fn()
            prof.step()
    return prof.result


class _OwnLoop(Profiler):
    """profile_steps' Profiler: it drives the loop itself, which cannot stop stepping, so no watchdog watches it
    (a slow step on a loaded host, 2.1 s after 47 ms ones, is no stopped loop)."""
    _own_loop = True


def _parameters(model):
    """{name: shape} of every parameter of the model(s), None for no model; ValueError for anything else."""
    if model is None:
        return None
    if isinstance(model, dict):
        models = list(model.items())
    elif isinstance(model, (list, tuple)):
        models = [(f"{i}", m) for i, m in enumerate(model)] if len(model) > 1 else [("", m) for m in model]
    else:
        models = [("", model)]
    out = {}
    for prefix, m in models:
        named = getattr(m, "named_parameters", None)
        if not callable(named):
            raise ValueError(f"model must be a torch.nn.Module (or a list or dict of them, or None), not "
                             f"{type(m).__name__}")
        for name, p in named():
            for wrapper in ("_orig_mod.", "module."):  # torch.compile's and DDP's wrappers
                name = name.replace(wrapper, "")
            out[f"{prefix}.{name}" if prefix else name] = list(p.shape)
    return out


def _models(model):
    """The model(s) as a list (checked by _parameters)."""
    return [] if model is None else list(model.values()) if isinstance(model, dict) else \
        list(model) if isinstance(model, (list, tuple)) else [model]


def _tensors(model):
    """The parameters of the model(s), for the memory step's tags."""
    return [p for m in _models(model) for p in m.parameters()]


def _compile_ignored(model):
    """The modules of the model(s) that Module.compile() was called on whose forward is torch's own (an
    nn.Sequential, an nn.Linear): Dynamo skips both that forward and Module._call_impl, so on torch 2.11 the call
    compiles nothing, and says nothing (pytorch/pytorch#150915). ["name (Class)"]; the findings say so only
    where the trace then holds no compiled graph."""
    out = []
    for m in _models(model):
        for name, mod in m.named_modules():
            forward = getattr(type(mod), "forward", None)
            if getattr(mod, "_compiled_call_impl", None) is not None and \
                    str(getattr(forward, "__module__", "")).startswith("torch."):
                out.append(f"{name or 'the model'} ({type(mod).__name__})")
    return out


def _check_count(name, value, minimum, optional=False):
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer of at least {minimum}, not {value!r}")


def _check_number(name, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a positive number or None, not {value!r}")


def _script():
    """The path of the script that runs (what a later profile must share to be compared with), or None."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.abspath(path) if path else None


def _graphs_compiled():
    """Graphs torch.compile made in this process so far (their kernels have no source-line record)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters.get("stats", {}).get("unique_graphs", 0)) if utils else 0


class _DistRanks:
    """torch.distributed's default group, as the capture needs it."""

    def __init__(self, dist):
        self.dist, self.rank, self.world_size = dist, dist.get_rank(), dist.get_world_size()
        self.first = self.rank == 0

    def barrier(self):
        self.dist.barrier()

    def from_first(self, obj):
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]


def _dist_ranks(torch):
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return _DistRanks(dist)
    return None
