"""Pure: the source lines of eager work, for "Lines of train.py" (issue #33). Stdlib only.

The capture records one more step with the lines of own code marked and keeps of it the `eager_lines` record
(profiling/profile/trace/eager_ops.py). This module places the eager operators of the profiled steps by it.

Placing an eager operator of a profiled step (`Eager.place`):
- Forward: a training loop calls the same eager operators in the same order every step, so the k-th top-level
  eager operator of a profiled step is the k-th of the recorded step, names checked. A step whose sequence
  differs is aligned on runs of at least MIN_RUN equal names; an operator outside them is not placed (a name
  alone would guess: one operator name is called from many lines). Ordinals, not sequence numbers: operators
  under no_grad (the optimizer) carry none, and numbers differ from step to step.
- Backward: the engine runs each autograd node as `autograd::engine::evaluate_function: XBackward0` with the
  node's sequence number, which is the number the forward operator that made the node carries (operators that
  make no node peek at the same number, so it is the last so numbered before the backward). That operator's
  top-level operator gives the line, found as above in the profiled trace itself. AccumulateGrad (the gradients
  summed into `.grad`) has no forward operator: the line that ran the engine, when one line did.
Top-level: the outermost operator (`ns::op`, or an autograd.Function's forward) on the main thread, not inside a
compiled graph's call (`CompiledFunction`, `## Call CompiledFxGraph`) nor the autograd engine.
"""
import bisect
import difflib

from profiling.profile.trace.eager_ops import ACCUMULATE, node_of, seq, top_of, tops

MIN_RUN = 3          # equal names in a row that align a differing step with the recorded one
MAX_ALIGN = 20000    # operators per step beyond which a differing step is not aligned (difflib is quadratic)
NO_RECORD = "eager (outside the compiled graphs)"   # and no line record of eager operators


# ---------------------------------------------------------------------------------------------------------
# Placing the eager operators of a profiled trace
# ---------------------------------------------------------------------------------------------------------

def usable(record):
    return isinstance(record, dict) and bool(record.get("ops"))


def align(recorded, names):
    """For each of a step's operator names, the index of the recorded operator it is, or None."""
    if names == recorded:
        return list(range(len(names)))
    out = [None] * len(names)
    if max(len(names), len(recorded)) > MAX_ALIGN:
        return out
    blocks = difflib.SequenceMatcher(None, recorded, names, autojunk=False).get_matching_blocks()
    for a, b, size in blocks:
        if size >= MIN_RUN:
            out[b:b + size] = range(a, a + size)
    return out


class Eager:
    """The eager operators of a profiled trace, each step aligned with the record: `place(op)` gives the
    line of any operator (a kernel's launching operator, or a CPU operator) outside the compiled graphs.
    threads/parent: the trace's operators per thread and their parents (traceio.by_thread, parents); steps:
    the ProfilerStep windows [(start, end, name)]; in_graph(op): True inside a `## Call CompiledFxGraph`."""

    def __init__(self, record, threads, parent, steps, in_graph):
        self.parent, self.memo = parent, {}
        self.lines = [(str(f), int(n)) for f, n, *_ in record.get("lines") or []]
        self.text = {(str(f), int(n)): str(t[0]) if t else "" for f, n, *t in record.get("lines") or []}
        self.recorded_lines = [int(i) for _, i in record["ops"]]
        self.backward_lines = record.get("backward") or []
        tid = record.get("tid")
        self.main = next((evs for (_, t), evs in threads.items() if t == tid), None)
        self.where = {}      # id(top-level operator) -> index in the record, or None (not aligned)
        self.steps_aligned = [0, 0]   # steps whose sequence equals the record's; steps in all
        self.by_seq = {}     # sequence number -> [(ts, forward operator)] on the main thread, by time
        if self.main is not None:
            self._align_steps([str(name) for name, _ in record["ops"]], steps, in_graph)
            for op in self.main:
                s = seq(op)
                if s is not None and node_of(op, parent) is None:
                    self.by_seq.setdefault(s, []).append((op["ts"], op))

    def _align_steps(self, recorded, steps, in_graph):
        for start, end, _ in steps:
            step_tops = [op for op in tops(self.main, self.parent, start, end, self.memo) if not in_graph(op)]
            names = [str(op.get("name")) for op in step_tops]
            self.steps_aligned[0] += names == recorded
            self.steps_aligned[1] += 1
            for op, k in zip(step_tops, align(recorded, names)):
                self.where[id(op)] = k

    def place(self, op):
        """((file, line),) and None, or None and why not, for an operator outside the compiled graphs."""
        if self.main is None:
            return None, "eager (the line record's thread is not in this trace)"
        if top_of(op, self.parent, self.memo)[1] is None:  # the common case, without walking up again
            return self._forward(op)
        node = node_of(op, self.parent)
        return self._forward(op) if node is None else self._backward(node)

    def _forward(self, op, via=""):
        top, why = top_of(op, self.parent, self.memo)
        if top is None and why == "compiled":
            return None, f"eager{via}, inside a compiled graph's wrapper"
        if top is None:  # on the CPU, an annotation's own time (a compiled region's, the profiler's)
            return None, f"eager{via}, outside any operator"
        if id(top) not in self.where:
            return None, f"eager{via}, not on the main thread or outside the profiled steps"
        k = self.where[id(top)]
        if k is None:
            return None, f"eager{via}, not in the recorded step's sequence of operators"
        i = self.recorded_lines[k]
        if not 0 <= i < len(self.lines):
            return None, f"eager{via}, from no line of your code (its folder: Profiler(code_roots=[...]))"
        return (self.lines[i],), None

    def _backward(self, node):
        name = str(node.get("name", ""))
        if name.endswith(ACCUMULATE):
            if len(self.backward_lines) == 1 and 0 <= self.backward_lines[0] < len(self.lines):
                return (self.lines[self.backward_lines[0]],), None
            return None, "gradient accumulation (AccumulateGrad): the engine ran from several lines or none"
        s = seq(node)
        if s is None:
            return None, "backward without a sequence number"
        found = self.by_seq.get(s, ())
        i = bisect.bisect_left(found, node["ts"], key=lambda x: x[0]) - 1
        if i < 0:
            return None, "backward whose forward operator is not in the trace"
        forward = found[i][1]
        if top_of(forward, self.parent, self.memo)[1] == "compiled":  # e.g. summing gradients a compiled backward made
            return None, "the autograd engine's work around a compiled graph's backward"
        return self._forward(forward, via=" backward")
