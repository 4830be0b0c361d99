"""Which source lines each compiled kernel came from, recorded while torch.compile compiles (issue #20).

Inductor can record, for every kernel it generates and every extern call it makes (a cuBLAS GEMM through
`extern_kernels.mm`, a custom op), the source stack traces of the FX nodes it was made from
(`torch._inductor.config.trace.provenance_tracking_level`; backward nodes carry the stack of the forward op
they differentiate). It hands the record out on torch's structured-trace logger (`torch.__trace`, what
TORCH_TRACE and tlparse read), once per compiled graph, in this order:

    inductor_output_code                                the graph's wrapper code; a comment
                                                        `[Provenance debug handles] NAME:N` before each call
    inductor_provenance_tracking_kernel_stack_traces    {"NAME:N": [stack trace, ...]}
    fx_graph_cache_{miss,hit,bypass}                    {"key": ...}: the key the profiler's
                                                        `## Call CompiledFxGraph <key> ##` annotation names

A logging handler on that logger reads the three in-process (nothing is written to disk). N numbers the
calls in the order the graph makes them. The stack-trace record can hold stale entries of earlier graphs (a
lazily compiled backward graph dumps inductor's global table, which nothing has reset); the wrapper's
comments say which entries are this graph's.

    provenance.start()               # before the first compiled call (train.py does it when it will profile)
    ...                              # compile, train, profile
    record = provenance.result()     # plain data for the trace metadata, see `result`

The FX graph cache leaves trace.* settings out of its key, so a graph cached by a run without provenance
would come back without it: `start` sets `torch.compiler.config.cache_key_tag`, which gives these compiles
cache entries of their own. Neither is a source path or line number in the key: a graph from the cache
brings the stacks of the run that compiled it (another checkout, the file before a line was added), which
`result` maps to the running code (profiling/profile/capture/relocate.py). AUTORESEARCH_PROVENANCE=0 turns the whole
thing off (to measure its cost: benchmarks/profiler_cost/provenance_cost.py).

Cost, measured on a 2-core CPU compiling train.py's GPT (cpu preset), forward and backward: cold cache 52.8 s
vs 51.8 s without (+2%; the handler's share, torch's own `structured_logging_overhead`, is 0.15 s), warm
cache 30.8 s vs 30.6 s; the step itself is unchanged (the compiled code is the same). On the CPU the C++
kernels' profiler records (`cpp.enable_kernel_profile`, needed to see them in the trace) add another 3 s.
On an H100 (train.py --profile at the default config, INDUCTOR_PROVENANCE=1 with TORCH_TRACE, cold caches):
step 0, which compiles, 50.2 s vs 42.6 s without, and 70.5 vs 59.4 s on a second machine (+18%; TORCH_TRACE
also wrote every record to disk there); warm caches 14.8 vs 14.9 s; steps unchanged. Over 2%:
so it runs only when the run will profile, and compilation falls in the steps the time budget excludes.
"""
import json
import logging
import os
import re
from collections import Counter

import profiling.profile.capture.relocate as relocation
from profiling.profile.trace import whose

VERSION = 1
TAG = "autoresearch-provenance"   # torch.compiler.config.cache_key_tag while provenance is recorded
STACKS = "inductor_provenance_tracking_kernel_stack_traces"
CODE = "inductor_output_code"
CACHE = "fx_graph_cache_"
BREAK = "dynamo_graph_break_reason"   # Dynamo's graph breaks, with the user code's stack where each happened
HANDLE = re.compile(r"\[Provenance debug handles\] (\S+):(\d+)\s*$", re.M)
FRAME = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$')
MAX_TEXT = 100   # characters of a source line kept
UNSEEN = object()  # no stack-trace artifact yet for the graph being compiled

_collector = None
_unavailable = None  # why `start` could not run on this torch
_changes = {}   # the settings `start` changed, for the trace's settings record (profiling/profile/trace/settings.py)
_undo = []      # (object, attribute, value before) of each setting `start` changed; the logger's level before


def enabled():
    return os.environ.get("AUTORESEARCH_PROVENANCE", "1") != "0"


def started():
    """Whether `start` ran in this process."""
    return _collector is not None


def start(root=None):
    """Turn on inductor's provenance tracking and collect what it records from now on; idempotent. Call it
    before the first compiled call: graphs compiled earlier have no record."""
    global _collector
    if _collector is not None or not enabled():
        return
    import torch  # only here: the rest of the module is plain data
    import torch._inductor.config

    config = torch._inductor.config
    try:  # private settings: a torch without them loses the lines of compiled kernels, not the profile
        settings = [("inductor.trace.provenance_tracking_level", config.trace, "provenance_tracking_level", 1)]
        if not torch.cuda.is_available():  # the CPU's compiled C++ kernels appear in the trace only with this
            settings.append(("inductor.cpp.enable_kernel_profile", config.cpp, "enable_kernel_profile", True))
        settings.append(("compiler.cache_key_tag", torch.compiler.config, "cache_key_tag",
                         (torch.compiler.config.cache_key_tag + "-" + TAG).lstrip("-")))
        for _, obj, attr, _ in settings:
            getattr(obj, attr)
    except AttributeError as e:
        global _unavailable
        _unavailable = f"torch {torch.__version__} lacks {e.name or e}: no source lines of compiled kernels"
        return
    for change in settings:
        _change(*change)
    _collector = Collector(root)
    log = logging.getLogger("torch.__trace")
    log.addHandler(_collector)
    _undo.append((log, "level", log.level))
    if log.level == logging.NOTSET or log.level > logging.DEBUG:
        log.setLevel(logging.DEBUG)


def stop():
    """Put back every setting `start` changed and stop collecting (what was collected is dropped): the
    profile that needed them is done, and a guest leaves the house as it found it (STYLE.md habit 17).
    Graphs compiled from now on have no record; `start` may run again."""
    global _collector
    if _collector is None:
        return
    logging.getLogger("torch.__trace").removeHandler(_collector)
    for obj, attr, before in reversed(_undo):
        if isinstance(obj, logging.Logger):
            obj.setLevel(before)
        else:
            setattr(obj, attr, before)
    _undo.clear()
    _changes.clear()
    _collector = None


def _change(name, obj, attr, value):
    """Set obj.attr and remember it under its settings name, with the value it had."""
    _changes[name] = {"value": value, "before": getattr(obj, attr), "during": "compile"}
    _undo.append((obj, attr, getattr(obj, attr)))
    setattr(obj, attr, value)


def changes():
    """The settings `start` changed: {settings name: {"value", "before", "during": "compile"}}; {} if it did
    not run (settings.py's `profiler` entries)."""
    return {name: dict(change) for name, change in _changes.items()}


def result():
    """What was collected, as plain data for the trace metadata (None when `start` was never called):

        {"version": 1,
         "frames": [[file, line, function, text, own], ...],   # file relative to its code root, or from its
                                                               # installed package; own: the user's code or
                                                               # installed model code (whose.py)
         "stacks": [[frame index, ...], ...],                  # one source stack, innermost frame first
         "graphs": [{"key": fx graph cache key,
                     "kernels": [[name, [stack index, ...]], ...]}],  # the graph's calls, in call order;
                                          # names as inductor writes them: triton_poi_fused_add_0,
                                          # extern_kernels.mm, torch.ops.ns.op.default
         "without": n,                                         # graphs compiled with no record (a cache entry
                                                               # made without provenance)
         "breaks": [[stack index, count], ...],                # Dynamo's graph breaks by the user's stack
         "relocated": n,                                       # frames moved to the running file or line
         "unmapped": [[frame index, recorded "path:line"], ...]}  # frames not in the running code, kept as
                                                               # recorded (profiling/profile/capture/relocate.py)

    A graph loaded from Inductor's on-disk cache carries the stacks of the run that compiled it, maybe in
    another folder or an older version of the file: each frame is mapped to the running code by its source
    text (profiling/profile/capture/relocate.py) when the record is read.
    """
    if _unavailable:
        return {"unavailable": _unavailable, "graphs": []}
    return None if _collector is None else _collector.result()


def placement():
    """Where this run's compiles recorded each source frame and where it is in the running code, for other
    records of the same compiled graphs (the GPU memory step's allocator frames: allocator.placed), so both
    map a cached graph's frames alike: {"frames": {(path, line, function): (running path, line)} of the frames
    that moved, "files": {recorded path no running file has: (running path, its frames' usual line shift)}};
    {} without a collector or a moved frame."""
    return {} if _collector is None else _collector.placement()


class Collector(logging.Handler):
    """Reads the provenance artifacts of each compiled graph off the structured-trace logger. running=False
    for records read away from the run they came from (a replayed TORCH_TRACE log): their frames are kept as
    recorded, not checked against this process's code. root: whose code the frames are (whose.Code, or its
    folders); None: this process's (whose.current()) when the record is made."""

    def __init__(self, root=None, running=True):
        super().__init__(logging.DEBUG)
        self.root, self.running = root, running
        self.handles = None   # the NAME:N of the graph being compiled, from its wrapper code
        self.entries = UNSEEN  # its [(N, name, [stack trace])] from the stack-trace artifact; None: empty
        self.graphs, self.without, self.breaks = [], 0, {}
        self.frames, self.frame_ids, self.stacks, self.stack_ids = [], {}, [], {}  # frames as recorded
        self._memo = (None, None)  # (how many frames, their relocation)

    def emit(self, record):
        try:
            meta = getattr(record, "metadata", None) or {}
            payload = getattr(record, "payload", None)
            if CODE in meta:
                if self.entries is not UNSEEN:  # the previous graph named no cache key (caching off)
                    self._graph(None)
                self.handles = set(HANDLE.findall(payload or ""))
                return
            name = (meta.get("artifact") or {}).get("name", "")
            if name == BREAK:
                self._break(payload or "")
            elif name == STACKS:
                self.entries = self._entries(payload)
            elif name.startswith(CACHE):
                self._graph(json.loads(payload or "{}").get("key"))
        except Exception:  # a record we do not understand must never break a compile
            self.handles, self.entries = None, UNSEEN

    def _break(self, payload):
        """Counts a graph break by the user code's stack (the frames before the exception's traceback)."""
        user = payload.split("User code traceback:", 1)[-1].split("Traceback (most recent call last)", 1)[0]
        stack = self._stack(user)
        if stack is not None:
            self.breaks[stack] = self.breaks.get(stack, 0) + 1

    def _entries(self, payload):
        table = json.loads(payload) if payload else None
        if not isinstance(table, dict):
            return None
        out = []
        for name_n, traces in table.items():
            name, _, n = name_n.rpartition(":")
            if not n.isdigit() or self.handles is not None and (name, n) not in self.handles:
                continue
            out.append((int(n), name, traces if isinstance(traces, list) else []))
        return sorted(out)

    def _graph(self, key):
        """The graph compiled (or loaded) last is done: keep its calls under its FX graph cache key."""
        entries, self.handles, self.entries = self.entries, None, UNSEEN
        if entries is UNSEEN:  # a cache lookup that found nothing: the compile that follows reports it
            return
        if entries is None:
            self.without += 1
            return
        kernels = [[name, sorted({self._stack(t) for t in traces if isinstance(t, str)} - {None})]
                   for _, name, traces in entries]
        self.graphs.append({"key": None if key is None else str(key), "kernels": kernels})

    def _stack(self, trace):
        """The index of a source stack (innermost frame first) in self.stacks, or None if it has no frame."""
        frames = []
        lines = trace.splitlines()
        for i, line in enumerate(lines):
            m = FRAME.match(line)
            if not m:
                continue
            text = lines[i + 1].strip() if i + 1 < len(lines) and not FRAME.match(lines[i + 1]) else ""
            frames.append(self._frame(m.group(1), int(m.group(2)), m.group(3), text))
        if not frames:
            return None
        key = tuple(reversed(frames))
        if key not in self.stack_ids:
            self.stack_ids[key] = len(self.stacks)
            self.stacks.append(list(key))
        return self.stack_ids[key]

    def _frame(self, path, line, function, text):
        key = (path, line, function, text)  # a cached graph's line N may hold other text than today's line N
        if key not in self.frame_ids:
            self.frame_ids[key] = len(self.frames)
            self.frames.append(key)
        return self.frame_ids[key]

    def result(self):
        """The record (see `result` above): frames mapped to the running code, the same frame or stack
        reached from two records (a cached graph's and a fresh one's) kept once."""
        frames, frame_of, unmapped, moved = self._placed()
        stacks, stack_ids, stack_of = [], {}, []
        for stack in self.stacks:
            key = tuple(frame_of[i] for i in stack)
            if key not in stack_ids:
                stack_ids[key] = len(stacks)
                stacks.append(list(key))
            stack_of.append(stack_ids[key])
        graphs = [{"key": g["key"], "kernels": [[name, sorted({stack_of[i] for i in ids})]
                                                for name, ids in g["kernels"]]} for g in self.graphs]
        breaks = Counter()
        for stack, n in self.breaks.items():
            breaks[stack_of[stack]] += n
        return {"version": VERSION, "frames": frames, "stacks": stacks, "graphs": graphs,
                "without": self.without, "breaks": [[stack, n] for stack, n in breaks.items()],
                "relocated": moved, "unmapped": unmapped}

    def _code(self):
        return whose.current() if self.root is None else whose.of(self.root)

    def _relocated(self, code):
        """relocate() of the recorded frames (running records only), computed once per set of frames."""
        if self._memo[0] != len(self.frames):
            self._memo = (len(self.frames), relocation.relocate(self.frames, code))
        return self._memo[1]

    def placement(self):
        """The module's `placement()` for this collector's frames."""
        if not self.running or not self.frames:
            return {}
        frames, shifts = {}, {}
        for (path, line, function, _), (where, n, found) in zip(self.frames, self._relocated(self._code())):
            if found and (where, n) != (path, line):
                frames[(path, line, function)] = (where, n)
                shifts.setdefault(path, Counter())[(where, n - line)] += 1
        running = relocation.running_files()
        files = {p: c.most_common(1)[0][0] for p, c in shifts.items() if p not in running}
        return {"frames": frames, "files": files} if frames else {}

    def _placed(self):
        """(frames as the record names them, the index of each recorded frame among them, the frames not
        found in the running code, how many frames moved to another file or line)."""
        frames, ids, frame_of, unmapped, moved = [], {}, [], [], 0
        code = self._code()
        placed = (self._relocated(code) if self.running
                  else [(path, n, True) for path, n, _, _ in self.frames])
        for (path, line, function, text), (where, n, found) in zip(self.frames, placed):
            name = code.name(where)
            # a frame not found keeps its place as the user's code unless it is an installed package's: it
            # names the lines of another checkout's compile, which the report must show as such, not skip
            installed = any(p in where.split(os.sep) for p in whose.INSTALLED)
            own = code.owns(where, function) or not found and not installed
            row = (name, n, function, text[:MAX_TEXT], own)
            if row not in ids:
                ids[row] = len(frames)
                frames.append(list(row))
                if not found:
                    unmapped.append([ids[row], f"{path}:{line}"])
            moved += found and (where, n) != (path, line)
            frame_of.append(ids[row])
        return frames, frame_of, unmapped, moved
