"""The source lines of the eager operators, recorded in one more, untimed step after the profiled ones (issue #33).

torch.profiler's own stacks (`with_stack=True`) are no use here: they inflate the host in the timed steps
(DESIGN.md pitfall 12), and a `python_function` event names its function's first line, not the line that
called the operator. So the capture runs one more step of training with a line tracer (`sys.settrace`, own
files only) that wraps the operators each Python line calls in a profiler annotation
(`autoresearch line N`), under a second, short, CPU-only profile; eager_ops.reduce keeps of that trace only
the step's top-level eager operators and their lines (the trace metadata's `eager_lines`, which
profiling/profile/tables/lines.py reads). The timed trace is untouched.

Own files: the user's code and installed model code as profiling/profile/trace/whose.py decides (the script's folder
and Profiler(code_roots=...); a `forward` of an installed package, a transformers `modeling_*.py`), never this
package (profiling/): the line of train.py that called the optimizer, not the optimizer's code. The tracer's
methods call no other Python code than whose.Code.kind (only C methods, attribute reads and string operations)
and TorchDynamo is told to skip them all: a trace function runs inside
compiled regions too, where Dynamo's eval-frame hook would try to compile any Python frame (seen: a graph
break and a warning on `_RecordFunctionFast` before the skip).

Cost: once per profile, one step with a tracer (a trace call per Python call and an annotation per own line)
and the reading of its trace: on the 2-core CPU with the cpu preset, 0.31-0.37 s for a 169-213 ms step, and
about 1 s more in all (benchmarks/profiler_cost/eager_lines_cost_results.md). AUTORESEARCH_EAGER_LINES=0 turns
it off (no extra step). A DataLoader's next batch is made untraced (`_untraced_loader`, issue #55): its Dataset
is the user's Python too, and traced line by line it made the step 20x slower.
"""
import linecache
import os
import sys
import threading
import time

from profiling.profile.trace import eager_ops, whose
from profiling.profile.trace.traceio import exported_events

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # profiling/: never a line
MAX_TEXT = 100   # characters of a source line kept


def enabled():
    """Whether the line-record step runs: not turned off, and this torch has the annotation it needs (a
    private API: another version loses the eager lines, the report says there is no record)."""
    if os.environ.get("AUTORESEARCH_EAGER_LINES", "1") == "0":
        return False
    torch = sys.modules.get("torch")
    return torch is None or hasattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast")


def record(step_fn, sync, root=None):
    """Run step_fn once more under the line tracer and a CPU-only profile; return the `eager_lines` record
    (profiling/profile/trace/eager_ops.py), or None when turned off. sync: waits for the device (the step's kernels
    finish before the next timed step)."""
    if not enabled():
        return None
    recorder = Recorder(sync, root)
    recorder.begin()
    try:
        step_fn()
    except BaseException:
        recorder.abandon()
        raise
    return recorder.end()


class Recorder:
    """The line-record step of a loop that runs its own steps: begin() before the step, end() after it (the
    record), or abandon(). The caller's own frames already running (a training loop's body) are traced too."""

    def __init__(self, sync, root=None):
        self.sync, self.root = sync, root

    def begin(self):
        import torch
        from torch.profiler import ProfilerActivity, profile

        self.t0 = time.perf_counter()
        code = whose.current() if self.root is None else whose.of(self.root)
        self.tracer = LineTracer(code, torch._C._profiler._RecordFunctionFast)
        self.prof = profile(activities=[ProfilerActivity.CPU])
        self.prof.__enter__()
        self.tracer.start(sys._getframe(1))

    def end(self):
        self.tracer.stop()
        self.sync()
        self.prof.__exit__(None, None, None)
        result = eager_ops.reduce(exported_events(self.prof), self.tracer.lines(), threading.get_native_id())
        result["seconds"] = round(time.perf_counter() - self.t0, 3)
        return result

    def abandon(self):
        self.tracer.stop()
        self.prof.__exit__(None, None, None)


class LineTracer:
    """While on (main thread only), the operators called while a line of the project's own files runs lie inside
    an annotation `autoresearch line <index>`: the innermost own frame's current line, opened at each of its
    `line` events and, when a frame returns, at its caller's (the innermost own frame further out)."""

    def __init__(self, root, annotation):
        self.code = whose.of(root)   # whose code each frame is
        self.cwd = os.getcwd() + os.sep
        self.annotation = annotation
        self.own = {}      # code object -> whether it is the project's own
        self.ids = {}      # (file, line) -> index
        self.open = None   # the annotation of the current line
        self.previous = None
        self.hooked = []   # frames already running when tracing began, traced through their f_trace
        self.loader = None  # the DataLoader's batches, untraced (_untraced_loader)
        self.on = False

    def start(self, running=None):
        """Trace from now on; `running`: the innermost frame already running whose own frames (outward) are
        traced too (a training loop that called the profiler), else only frames called from now on."""
        _skip_in_dynamo(self._call, self._local, self._switch, self._is_own, self.code.kind, self.code._kind)
        self.previous = sys.gettrace()  # a debugger's or coverage's: back after the step
        self.hooked = []
        while running is not None:
            if self._is_own(running.f_code) and running.f_trace is None:
                running.f_trace = self._local
                self.hooked.append(running)
            running = running.f_back
        self.loader = _untraced_loader(self)
        self.on = True
        sys.settrace(self._call)

    def stop(self):
        self.on = False  # stopped from inside a trace call (a pending close), that call sets nothing again
        sys.settrace(self.previous)
        for frame in self.hooked:
            frame.f_trace = None
        self.hooked = []
        if self.loader is not None:
            self.loader.close()
            self.loader = None
        self._switch(None)

    def _is_own(self, code):
        own = self.own.get(code)
        if own is None:  # string operations only (see the module's docstring)
            path = code.co_filename  # `<frozen os>`, `<string>`: no file
            path = path if path.startswith((os.sep, "<")) else self.cwd + path
            own = self.own[code] = (not path.startswith(PACKAGE)
                                    and self.code.kind(path, code.co_name) is not None)
        return own

    def _call(self, frame, event, arg):
        if self._is_own(frame.f_code):
            self._switch(frame)
            return self._local if self.on else None
        return None

    def _local(self, frame, event, arg):
        if event == "line":
            self._switch(frame)
        elif event == "return":
            self._switch(frame.f_back)
        return self._local if self.on else None  # None keeps the frame's f_trace as stop() left it

    def _switch(self, frame):
        """Close the current line's annotation; open one for the innermost own frame from `frame` out."""
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None
        if not self.on:
            return
        while frame is not None and not self.own.get(frame.f_code, False):
            frame = frame.f_back
        if frame is None:
            return
        key = (frame.f_code.co_filename, frame.f_lineno)
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.ids)
        self.open = self.annotation(f"{eager_ops.SPAN}{i}")
        self.open.__enter__()

    def lines(self):
        """[[file as whose.py names it, line, text]] by index."""
        out = [None] * len(self.ids)
        for (path, line), i in self.ids.items():
            out[i] = [self.code.name(path), line, linecache.getline(path, line).strip()[:MAX_TEXT]]
        return out


def _untraced_loader(tracer):
    """While the tracer is on, a DataLoader's next batch is made without it (issue #55): with num_workers=0 the
    Dataset's Python and the collate run in this thread, and traced line by line they ran 20x slower (a
    Python tokenizer's Dataset on the H200), for lines that launch nothing the report places. The loader's
    operators fall outside every line's annotation (the loader's own row). Returns what puts it back
    (`close()`), or None without torch's DataLoader."""
    try:
        from torch.utils.data import dataloader
        base = dataloader._BaseDataLoaderIter
        plain = base.__dict__["__next__"]
    except (ImportError, AttributeError, KeyError):
        return None

    def __next__(self):
        tracer._switch(None)
        sys.settrace(tracer.previous)
        try:
            return plain(self)
        finally:
            if tracer.loader is not None:  # not stopped meanwhile (an abandon from the watchdog's close)
                sys.settrace(tracer._call)

    class Restore:
        @staticmethod
        def close():
            if base.__dict__.get("__next__") is __next__:
                base.__next__ = plain
    _skip_in_dynamo(__next__)
    base.__next__ = __next__
    return Restore()


def _skip_in_dynamo(*methods):
    """Tell TorchDynamo (when loaded) never to compile the tracer's frames: they run inside compiled regions."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is not None and hasattr(eval_frame, "skip_code"):
        for m in methods:
            eval_frame.skip_code(m.__code__)
