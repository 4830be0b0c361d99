"""Pure: the step's time by source line -- "Lines of train.py" in the report (issue #20). Stdlib only.

The capture records, while torch.compile compiles, where each compiled graph's calls came from
(profiling/profile/capture/provenance.py; the trace metadata's `provenance`): for each graph, by its FX graph cache key, its
kernel and extern calls in call order, each with the source stacks of the FX nodes it was made from. A
backward node carries the stack of the forward op it differentiates, so a backward kernel lands on that line.

Placing one device event (CPU profile: one operator's self time):
1. The graph call: the profiler's `## Call CompiledFxGraph <key> ##` annotation around the launch on the
   launching thread names the graph. Outside every call the work is eager (below); what no record places
   is listed by its operator and why.
2. The call: the launching operator (by the launch's External id), or the one around it, up to the outermost
   operator inside the graph call -- a Triton kernel's own record (`triton_poi_fused_..._3`; on CPU
   `graph_0_cpp_fused_..._1`), `aten::mm` for `extern_kernels.mm`, `ns::op` for a custom op. The k-th call of
   a name in one graph call is the graph's k-th recorded call of that name (kernel names are unique only
   within a graph, and a graph may call one kernel or extern op from several lines).
3. The lines: each source stack's innermost own frame: the user's code or installed model code
   (profiling/profile/trace/whose.py: train.py, or transformers' modeling_llama.py under `trainer.train()`; a frame
   in torch is passed over for the line that called it). A call whose nodes came from several
   lines (a fused kernel) is one row against all its lines, never counted twice. A scatter-add the compiler
   calls as an ATen operator for an embedding's backward (its deterministic fallback: no graph node records
   it) goes to the lines of that graph's embedding backward (INSERTED_BACKWARD).

Eager work (outside every graph call: an uncompiled model or part of it, the optimizer's eager operators, copies,
their backward) is placed through the capture's record of one more step's eager lines (the trace metadata's
`eager_lines`, profiling/profile/tables/eager_lines.py): a forward operator by its place in the step's sequence, a
backward one through its autograd node's forward operator. Rows with eager time say how much (`eager_ms`).

Forward and backward: by where the call ran (inside the autograd engine: backward), as the region table.
"""
import bisect
import re

from profiling.profile.tables import eager_lines
from profiling.profile.trace.traceio import backward_windows, by_thread, is_backward, parents

GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph (\S+) ##$")
CPU_PREFIX = re.compile(r"^graph_\d+_")   # inductor.config.cpp.enable_kernel_profile's names on the CPU
TOP = 30               # rows kept in the summary (the report shows fewer)
MAX_UNPLACED = 5       # reasons for unplaced time listed
MISSING = ("no source-line record in this trace (torch.profiler's own Python stacks, with_stack, are not read "
           "for lines): profile the loop with profiling.Profiler or a framework's callback (profiling.HFCallback, "
           "profiling.LightningCallback), created before the first compiled call; `research profile` reads the "
           "trace it writes")


def canonical(name):
    """The trace's operator name for a call as inductor records it: extern_kernels.mm -> aten::mm,
    torch.ops.ns.op.default -> ns::op; kernels keep their names (the CPU's graph_N_ prefix dropped)."""
    if name.startswith("extern_kernels."):
        return "aten::" + name[len("extern_kernels."):]
    parts = name[len("torch.ops."):].split(".") if name.startswith("torch.ops.") else name.split(".")
    if len(parts) >= 2:  # an op overload: namespace.op[.overload]; kernel names have no dots
        return f"{parts[0]}::{parts[1]}"
    return CPU_PREFIX.sub("", name)


class Provenance:
    """The metadata record, indexed: per graph key its calls [(canonical name, lines)]; the lines' texts."""

    def __init__(self, record):
        frames, stacks = record.get("frames") or [], record.get("stacks") or []
        self.text = {}
        self.graphs = {}
        lines_of = [self._line(stack, frames) for stack in stacks]
        for g in record.get("graphs") or []:
            calls = []
            for name, ids in g.get("kernels") or []:
                lines = sorted({lines_of[i] for i in ids if 0 <= i < len(lines_of)} - {None})
                calls.append((canonical(str(name)), tuple(lines)))
            self.graphs.setdefault(str(g.get("key")), []).append(calls)  # no key: "None", as annotated

    def _line(self, stack, frames):
        """(file, line) of a stack's innermost own frame (else its innermost frame); None if it has none."""
        own = [frames[i] for i in stack if 0 <= i < len(frames)]
        if not own:
            return None
        f = next((f for f in own if len(f) > 4 and f[4]), own[0])
        key = (str(f[0]), int(f[1]))
        self.text.setdefault(key, str(f[3]) if len(f) > 3 else "")
        return key


class Calls:
    """The graph calls of a trace per thread, and for each the lines of its outermost operators."""

    def __init__(self, graph_calls, threads, parent, prov):
        self.threads, self.parent, self.prov = threads, parent, prov
        self.by_thread = {}
        for e in graph_calls:
            m = GRAPH_CALL.match(str(e.get("name", "")))
            if m:
                self.by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        for calls in self.by_thread.values():
            calls.sort(key=lambda e: e["ts"])
        self.starts = {k: [e["ts"] for e in v] for k, v in self.by_thread.items()}
        self.op_starts = {}
        self.aligned = {}   # id(graph call) -> {id(op): lines or reason}

    def call_of(self, e):
        """The graph call around event e (a launch or an operator) on its thread, or None."""
        key = (e.get("pid"), e.get("tid"))
        calls = self.by_thread.get(key)
        if not calls:
            return None
        i = bisect.bisect_right(self.starts[key], e["ts"]) - 1
        return calls[i] if i >= 0 and e["ts"] <= calls[i]["ts"] + calls[i]["dur"] else None

    def place(self, op, call):
        """(lines, None) for an operator inside a graph call, or (None, why not)."""
        top = op
        while True:
            up = self.parent.get(id(top))
            if up is None or up["ts"] < call["ts"]:
                break
            top = up
        table = self.aligned.get(id(call))
        if table is None:
            table = self.aligned[id(call)] = self._align(call)
        name = CPU_PREFIX.sub("", str(top.get("name")))
        return table.get(id(top), (None, f"no recorded call named `{name}`"))

    def _align(self, call):
        key = GRAPH_CALL.match(call["name"]).group(1)
        graphs = self.prov.graphs.get(key)
        tops = self._tops(call)
        if not graphs:
            return {id(op): (None, "a compiled graph without a source-line record") for op in tops}
        names = [CPU_PREFIX.sub("", str(op.get("name", ""))) for op in tops]
        calls = max(graphs, key=lambda g: _overlap(g, names))  # one graph per key, but keys may repeat
        by_name = {}
        for name, lines in calls:
            by_name.setdefault(name, []).append(lines)
        seen, table = {}, {}
        counts = {n: names.count(n) for n in set(names)}
        inserted = _inserted_lines(calls)
        for op, name in zip(tops, names):
            recorded = by_name.get(name)
            if recorded is None:
                if name in INSERTED_BACKWARD and inserted:
                    table[id(op)] = (inserted, None)
                continue
            k = seen[name] = seen.get(name, -1) + 1
            if counts[name] == len(recorded) or len(set(recorded)) == 1:
                table[id(op)] = (recorded[min(k, len(recorded) - 1)], None)
            else:
                why = f"`{name}` called {counts[name]} times, recorded {len(recorded)} times"
                table[id(op)] = (None, why)
        return table

    def _tops(self, call):
        """The operators directly inside a graph call, in time order."""
        key = (call.get("pid"), call.get("tid"))
        ops = self.threads.get(key, [])
        if key not in self.op_starts:
            self.op_starts[key] = [op["ts"] for op in ops]
        lo = bisect.bisect_left(self.op_starts[key], call["ts"])
        hi = bisect.bisect_right(self.op_starts[key], call["ts"] + call["dur"])
        return [op for op in ops[lo:hi] if (self.parent.get(id(op)) or {"ts": -1})["ts"] < call["ts"]]


# scatter-adds the compiler calls as ATen operators for an embedding's backward (its deterministic fallback):
# no node of the graph records them, their work is that embedding line's backward
INSERTED_BACKWARD = ("aten::index_put_", "aten::_index_put_impl_", "aten::embedding_dense_backward",
                     "aten::index_add_", "aten::scatter_add_")


def _inserted_lines(calls):
    """The lines of a graph's embedding backward (its recorded embedding_dense_backward calls; else the
    embedding's), from the calls that fuse the fewest lines (a kernel of the embedding alone, not one fused with
    the norms after it): where a scatter-add the compiler inserted for it belongs. () when the graph has none."""
    for word in ("embedding_dense_backward", "embedding"):
        found = [lines for name, lines in calls if word in name and lines]
        if found:
            fewest = min(len(lines) for lines in found)
            return tuple(sorted({line for lines in found if len(lines) == fewest for line in lines}))
    return ()


def _overlap(calls, names):
    have = {}
    for name, _ in calls:
        have[name] = have.get(name, 0) + 1
    return sum(1 for n in names if have.get(n, 0) > 0)


class Totals:
    """Summed microseconds (all steps) by line group and phase, and what could not be placed, by reason."""

    def __init__(self):
        self.us, self.unplaced, self.kernels, self.eager = {}, {}, {}, {}

    def add(self, us, lines, reason, backward, name, eager=False):
        if lines:
            row = self.us.setdefault(lines, [0.0, 0.0])
            row[1 if backward else 0] += us
            k = self.kernels.setdefault(lines, {})
            k[name] = k.get(name, 0.0) + us
            if eager:
                self.eager[lines] = self.eager.get(lines, 0.0) + us
        else:
            key = (reason, CPU_PREFIX.sub("", name))
            self.unplaced[key] = self.unplaced.get(key, 0.0) + us


class Placer:
    """Where one operator's work goes: a compiled graph's call (provenance), else the eager record."""

    def __init__(self, meta, graph_calls, threads, parent, steps):
        self.prov = Provenance(meta.get("provenance") or {})
        self.calls = Calls(graph_calls, threads, parent, self.prov)
        record = meta.get("eager_lines")
        self.eager = None
        if eager_lines.usable(record):
            self.eager = eager_lines.Eager(record, threads, parent, steps, self._in_graph)
            for key, text in self.eager.text.items():
                self.prov.text.setdefault(key, text)

    def _in_graph(self, op):
        return self.calls.call_of(op) is not None

    def place(self, op, anchor):
        """(lines, reason, eager?) of operator op (None: none recorded) launched at anchor (a launch or op)."""
        call = self.calls.call_of(anchor)
        if call is not None:
            if op is None:
                return None, "no operator recorded around the launch", False
            lines, reason = self.calls.place(op, call)
            return lines, reason or (None if lines else "a compiled call recorded without a source stack"), False
        if self.eager is None:
            return None, eager_lines.NO_RECORD, True
        if op is None:
            return None, "eager, no operator recorded around the launch", True
        return (*self.eager.place(op), True)


def device_table(tl, graph_calls, meta, step_ms, moved=frozenset()):
    """The lines table of a device profile. tl: the trace's Timeline (profiling/profile/trace/timeline.py); graph_calls:
    the `## Call CompiledFxGraph` annotations (traceio.Index.graph_calls); moved: ids of the device events
    that are backward work run in a compiled forward (profiling/profile/tables/regions.py `moved_to_backward`)."""
    if not _usable(meta):
        return _compiled_before(_missing(meta.get("provenance"), meta), meta)
    placer = Placer(meta, graph_calls, tl.threads, tl.parent, tl.ix.steps)
    tl.placer = placer  # the host's lines (profiling/profile/findings/lines.py) place by it too
    windows = backward_windows(tl.threads)
    totals, device_us = Totals(), 0.0
    for evs in tl.per_step:
        for e, launch in evs:
            device_us += e["dur"]
            op = tl.op_of(launch)
            lines, reason, eager = placer.place(op, launch)
            # a placed row lists its kernels; eager time left unplaced is listed by its operator
            name = str(op.get("name")) if eager and not lines and op is not None else str(e.get("name", ""))
            totals.add(e["dur"], lines, reason, is_backward(launch, windows) or id(e) in moved, name, eager)
    return _compiled_before(_table(totals, tl.n, step_ms, device_us, placer, meta), meta)


def _compiled_before(table, meta):
    """The note for graphs compiled before the profiling API was set up (`compiled_before_profiler`)."""
    n = meta.get("compiled_before_profiler")
    if isinstance(n, int) and n > 0:
        table["notes"] = list(table.get("notes") or []) + [
            f"{n} compiled graphs were made before profiling.Profiler was created: their kernels have no source "
            "lines; create it before the first call of a torch.compile'd function"]
    return table


def cpu_table(ix, placed_ops, meta, step_ms):
    """The lines table of a CPU profile: placed_ops is [(operator, self time in us, category)]."""
    if not _usable(meta):
        return _compiled_before(_missing(meta.get("provenance"), meta), meta)
    threads = by_thread(ix.cpu_ops)
    parent = parents(threads)
    placer = Placer(meta, ix.graph_calls, threads, parent, ix.steps)
    ix.placer = placer  # a CPU run's loops (profiling/profile/findings/lines.py) place by it too
    windows = backward_windows(threads)
    totals, total_us = Totals(), 0.0
    for op, self_us, _ in placed_ops:
        total_us += self_us
        lines, reason, eager = placer.place(op, op)
        totals.add(self_us, lines, reason, is_backward(op, windows), str(op.get("name", "")), eager)
    return _table(totals, len(ix.steps), step_ms, total_us, placer, meta)


def _usable(meta):
    record = meta.get("provenance")
    return isinstance(record, dict) and bool(record.get("graphs")) or eager_lines.usable(meta.get("eager_lines"))


MISSING_TRAIN_PY = ("no source-line record in this trace; profiling.Profiler records one (set it up before the first "
                    "compiled call; `uv run train.py --profile` does)")


def _missing(record, meta=None):
    meta = meta or {}
    live = any(key in meta for key in ("parameters", "unprofiled_step_ms", "tokens_per_step", "host_samples"))
    note = MISSING_TRAIN_PY if live else MISSING  # a foreign trace's hint names the API, not train.py
    eager = meta.get("eager_lines")
    if isinstance(eager, dict) and eager.get("missing") and not (isinstance(record, dict) and record.get("graphs")):
        note = f"the line-record step after the profiled ones did not run: {eager['missing']}"
    elif isinstance(record, dict) and record.get("unavailable"):
        note = record["unavailable"]
    elif isinstance(record, dict) and not record.get("without"):
        note = ("no compiled graph was recorded (the model ran eager, or was compiled before "
                "profiling.profile.capture.provenance.start()), and no line record of eager operators "
                "(AUTORESEARCH_EAGER_LINES=0, or a capture older than it)")
    elif isinstance(record, dict):
        note = (f"no source-line record: {record['without']} compiled graphs came from a cache entry made "
                "without one; delete the inductor cache (TORCHINDUCTOR_CACHE_DIR) and profile again")
    return {"rows": [], "rows_total": 0, "placed_percent": None, "placed_ms": None, "unplaced": [],
            "graphs": 0, "missing": note}


def _table(totals, n, step_ms, total_us, placer, meta):
    prov, rows, record = placer.prov, [], meta.get("provenance") or {}
    for lines, (fwd, bwd) in sorted(totals.us.items(), key=lambda kv: (-sum(kv[1]), kv[0])):
        ms = (fwd + bwd) / n / 1e3
        kernels = sorted(totals.kernels[lines].items(), key=lambda kv: -kv[1])
        rows.append({
            "where": where(lines), "lines": [{"file": f, "line": ln, "text": prov.text.get((f, ln), "")}
                                             for f, ln in lines],
            "fused": len(lines) > 1, "forward_ms": _r(fwd / n / 1e3), "backward_ms": _r(bwd / n / 1e3),
            "ms_per_step": _r(ms), "pct_of_step": _r(100 * ms / step_ms if step_ms else 0.0),
            "kernels": len(kernels), "top_kernel": CPU_PREFIX.sub("", kernels[0][0]),
            "eager_ms": _r(totals.eager.get(lines, 0.0) / n / 1e3),
        })
    placed_us = sum(sum(v) for v in totals.us.values())
    unplaced = sorted(totals.unplaced.items(), key=lambda kv: -kv[1])
    by_file = {}  # a kernel fused from lines of several files is split evenly between them
    for lines, (fwd, bwd) in totals.us.items():
        files = set(f for f, _ in lines)
        for f in files:
            by_file[f] = by_file.get(f, 0.0) + (fwd + bwd) / len(files)
    return {
        "rows": rows[:TOP], "rows_total": len(rows),
        "placed_percent": _r(100 * placed_us / total_us if total_us else 0.0),
        "placed_ms": _r(placed_us / n / 1e3), "unplaced_ms": _r((total_us - placed_us) / n / 1e3),
        "unplaced": [{"reason": reason, "name": name, "ms_per_step": _r(us / n / 1e3)}
                     for (reason, name), us in unplaced[:MAX_UNPLACED]],
        "files": {f: _r(us / n / 1e3) for f, us in sorted(by_file.items(), key=lambda kv: -kv[1])},
        "graphs": len(record.get("graphs") or []), "missing": None,
        "notes": notes(record),  # lines a cached compile recorded that the running code lacks
        "eager": _eager_note(placer.eager, meta.get("eager_lines")),
    }


def _eager_note(eager, record):
    """How the eager operators were placed: None without a record, else the record's size and cost and how many
    profiled steps called exactly its sequence of operators."""
    if eager is None:
        return None
    matching, steps = eager.steps_aligned
    return {"ops_per_step": len(record["ops"]), "steps_matching": matching, "steps": steps,
            "seconds": record.get("seconds")}


def where(lines):
    """`train.py:426-427` for a group of (file, line): per file, runs of consecutive lines as ranges."""
    by_file = {}
    for f, ln in lines:
        by_file.setdefault(f, []).append(ln)
    parts = []
    for f, nums in by_file.items():
        nums, runs = sorted(set(nums)), []
        for x in nums:
            if runs and x == runs[-1][1] + 1:
                runs[-1][1] = x
            else:
                runs.append([x, x])
        parts.append(f + ":" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs))
    return "; ".join(parts)


def _r(x):
    return None if x is None else round(float(x), 4)


def notes(record):
    """What the lines table must say about its record: own lines a compile recorded that are not in the
    running code (a cache entry compiled from another folder or an older version of the file)."""
    record = record if isinstance(record, dict) else {}
    frames = record.get("frames") or []
    own = [was for i, was in record.get("unmapped") or []
           if 0 <= i < len(frames) and len(frames[i]) > 4 and frames[i][4]]
    if not own:
        return []
    shown = ", ".join(own[:3])  # the recorded path in full: the table shows only its last two parts
    note = (f"{len(own)} source lines of the compiled graphs are not in the running code and are shown as "
            f"recorded ({shown}{', ...' if len(own) > 3 else ''}): Inductor's cache returned graphs compiled "
            "from another folder or another version of the file; for exact lines delete the inductor cache "
            "(TORCHINDUCTOR_CACHE_DIR) and profile again")
    return [note]
