"""What the host was doing while the GPU waited: a sampler of the main thread's Python stack. Stdlib only.

Scalene and py-spy find where a program spends its time by looking at its stack every few milliseconds
instead of tracing every call; this does the same for the profiled steps, from a daemon thread inside the
process (`sys._current_frames`), so it needs no extra tool or permission. The capture starts it a step
before the active steps (until the first `step(i)` it only warms its label caches) and calls `step(i)` as
each one begins; each sample is kept as (step, microseconds since that
step began, stack id), which the findings place on the trace's timeline from the ProfilerStep windows, on
any machine, later.

    sampler = StackSampler()           # samples the thread that creates it
    sampler.start()
    for i in range(steps):
        sampler.step(i)                # before each profiled step
        ...
    sampler.stop()
    data = sampler.result()            # plain JSON data: interval_ms, stacks, samples (see `result`)

Cost: one sample walks the main thread's frames under the GIL (each code object's kind and label worked out
once). Where the host is the bottleneck it still shows: on the H100, a compiled ResNet-50 (863 launches in a 25 ms
step) ran +29% profiled with it against +16% without (benchmarks/profiler_cost/profiler_cost_results.md, call
3). So the sampler times each of its own samples and stretches its period until they take at most OWN_SHARE of
the time (issue #50), where the capture asks for it (device-only steps on CUDA: there the sampler is much of
what the capture costs; a CPU run's profiler costs microseconds an operator, and its one-off steps are named
from 2 ms samples): a deep stack is sampled less often, a shallow one every INTERVAL_S. Its own time is its
thread's CPU time (a thread the OS set aside costs the main thread nothing) plus the GIL's two hand-offs; the
main thread pays about MAIN_PAYS times that (benchmarks/profiler_cost/sampler_cost.py: paced on its own time
alone, at 2%, the sampler made host-bound steps 4.2-5.2% longer on the H100's host and 4.4% here; per sample
the main thread lost 0.6-2.6x the sampler's count, median 1.8 over 11 loops and machines: the walk holds the
GIL, and each hand-off wakes a thread and evicts its caches).
"""
import linecache
import sys
import threading
import time
from collections import deque

from profiling.profile.trace import whose

INTERVAL_S = 0.002   # 500 samples a second: a 1 ms wait is seen about every other time
MAX_FRAMES = 12      # frames kept per sample
INNERMOST = 3        # innermost frames kept whatever their file; further out, only own ones (whose.py)
MAX_TEXT = 100       # characters of a source line kept
OWN_SHARE = 0.02     # what the samples cost the main thread: at most 2% of its time
SWITCH_S = 25e-6     # two GIL hand-offs a sample (the main thread's cost, not seen by the sampler's own clock)
MAIN_PAYS = 2.0      # the main thread's loss per sample over the sampler's count (measured: median 1.8x)
RECENT = 16          # the period follows the least cost of the last RECENT samples: a walk that met new frames
                     # paid once for their labels (0.9 ms against 0.02 on a Lightning stack), not at every sample


def frame_label(code_file, line, function, root):
    """`file:line function`, the file named as profiling/profile/trace/whose.py does (relative to its code root,
    from its installed package's folder, else its last two parts). root: a whose.Code, a folder or folders."""
    return whose.of(root).label(code_file, line, function)


class StackSampler:
    """Samples one thread's Python stack every `interval` seconds between start() and stop()."""

    def __init__(self, interval=INTERVAL_S, thread_id=None, root=None, paced=False):
        self.interval, self.paced = interval, paced  # paced: the period follows the samples' own cost
        self.thread_id = thread_id if thread_id is not None else threading.get_ident()
        self.root = whose.current() if root is None else whose.of(root)  # whose code each frame is
        self.stacks, self.ids, self.samples, self.texts, self.own = [], {}, [], {}, set()
        self.current = None           # (step, perf_counter at its start)
        self._stop = threading.Event()
        self._thread = None
        self._kinds, self._labels = {}, {}   # code -> own?, (code, line) -> label
        self.base, self._costs, self.own_s = interval, deque(maxlen=RECENT), 0.0

    def step(self, index):
        """Mark the start of profiled step `index` (0 = the first one recorded)."""
        self.current = (index, time.perf_counter())

    def start(self):
        self._thread = threading.Thread(target=self._run, name="autoresearch-stack-sampler", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self):
        while not self._stop.wait(self.interval):
            at, own = time.perf_counter(), time.thread_time()  # own: this thread's CPU time, not the wall's
            current = self.current
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            if current is None:  # started before the first recorded step: only the labels' caches warm
                self._labels_of(frame)
            else:
                self.samples.append([current[0], round((at - current[1]) * 1e6), self._stack_id(frame)])
            del frame
            if current is not None:  # the warm-up's walks fill the label caches: not what a sample costs
                self._paced(time.thread_time() - own + SWITCH_S)

    def _paced(self, cost):
        """This sample's own cost counted; paced, the next period from it: what the recent least cost costs the
        main thread (MAIN_PAYS times it) over OWN_SHARE, at least `base`."""
        self._costs.append(cost)
        self.own_s += cost
        if self.paced:
            self.interval = max(self.base, MAIN_PAYS * min(self._costs) / OWN_SHARE)

    def _stack_id(self, frame):
        """The id of this stack (its labels: `_labels_of`)."""
        labels = self._labels_of(frame)
        key = tuple(labels)
        if key not in self.ids:
            self.ids[key] = len(self.stacks)
            self.stacks.append(labels)
        return self.ids[key]

    def _labels_of(self, frame):
        """The labels of this stack: its INNERMOST frames, then own frames (whose.py) further out. Each code
        object's kind and each (code, line)'s label are worked out once: the walk holds the GIL, and the main
        thread waits for it (benchmarks/profiler_cost/profiler_cost_results.md); a first walk of a Lightning
        stack took 0.9 ms against 0.02 ms once cached, so the capture starts the thread a step early to fill
        the caches (profiling/profile/capture/window.py)."""
        labels, depth, kinds, known = [], 0, self._kinds, self._labels
        while frame is not None and len(labels) < MAX_FRAMES:
            code = frame.f_code
            own = kinds.get(code)
            if own is None:
                own = kinds[code] = self.root.owns(code.co_filename, code.co_name)
            if depth < INNERMOST or own:
                line = frame.f_lineno or 0  # None in a frame between two instructions (seen in a compile)
                label = known.get((code, line))
                if label is None:
                    label = known[(code, line)] = self._label(code, line, own)
                labels.append(label)
            frame, depth = frame.f_back, depth + 1
        return labels

    def _label(self, code, line, own):
        label = self.root.label(code.co_filename, line, code.co_name)
        if own:
            self.own.add(label)
        if label not in self.texts:
            self.texts[label] = linecache.getline(code.co_filename, line).strip()[:MAX_TEXT]
        return label

    def result(self):
        """{"interval_ms": the last period, "own_ms": the samples' own time (with the GIL's hand-offs), "stacks":
        [[frame label, innermost first]], "samples": [[step, us, stack id]],
        "lines": {frame label: its source line}, "own": [labels of the user's code and of installed model
        code (profiling/profile/trace/whose.py)]}: plain data for the trace metadata."""
        used = {label for stack in self.stacks for label in stack}
        return {"interval_ms": self.interval * 1e3, "own_ms": round(self.own_s * 1e3, 3), "stacks": self.stacks,
                "samples": self.samples,
                "lines": {label: text for label, text in self.texts.items() if label in used and text},
                "own": sorted(self.own & used)}
