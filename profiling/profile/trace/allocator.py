"""Pure: torch's allocator snapshot of one step -> GPU memory at the step's peak, by category (#35). Stdlib only,
never torch; the snapshot (a dict, never a pickle) is reduced at once and dropped. The capture calls `reduce` in the
training process (profiling/profile/capture/memory.py), so it lives in this lowest stage; what fits in the memory
the record describes is a table (profiling/profile/tables/gpu_memory.py).

    record = reduce(snapshot, tags, device_total=..., other=..., allocations=...)

The snapshot is `torch.cuda.memory._snapshot()` taken after one step run under
`torch.cuda.memory._record_memory_history()` (profiling/profile/capture/memory.py): `segments` (the allocator's
state at the end: cudaMalloc'd segments and their blocks) and `device_traces` (per device, the allocator's
actions in order: alloc, free_requested, free_completed, segment_alloc, segment_free, oom). The state at the
step's start is the end state with the trace undone backwards (so a history that overflowed its ring buffer
still gives a consistent, shorter window); the trace replayed forwards from there finds the moment of most
allocated bytes (a block counts as allocated from its `alloc` to its `free_requested`, as
torch.cuda.max_memory_allocated counts it). Every block live at that moment is given one category, so the
categories sum to the peak exactly:

    parameters, gradients, optimizer_state, activations   the block overlaps tensors of that tag (`tags`);
                                                          most bytes wins, ties in this order (a weight
                                                          saved for backward is a parameter)
    other_persistent                                      untagged, live through the whole step (buffers,
                                                          caches); counted as optimizer_state when no
                                                          optimizer was seen (no optimizer_state tag), and
                                                          the record's note says so
    temporaries                                           the rest

tags: {category: [(data_ptr, nbytes, seq)]}, the storages of known tensors; seq: allocations made since the
history began when the tag was taken (None: any time). A tag matches a block only if that block was live
then, so an address freed and reused within the step is not confused with the tensor tagged there.

The record (JSON-able; summary.json `gpu_memory`):
    {peak_allocated_mb, reserved_mb, reserved_unallocated_mb, device_mb, other_mb, categories: {name: mb},
     lines: [{where, mb}], events, note?}      reserved_mb: the segments at the peak; other_mb: the device's
                                               memory in use outside PyTorch's allocator (the CUDA context,
                                               other processes), None when unknown
"""
import bisect
import os
import re

MB = 2 ** 20
TAGGED = ("parameters", "gradients", "optimizer_state", "activations")
MAX_LINES = 8
BEFORE = "(allocated before the step)"


class Allocation:
    __slots__ = ("addr", "size", "frames", "seq", "freed_seq", "born", "died")

    def __init__(self, addr, size, frames, seq, born):
        self.addr, self.size, self.frames, self.seq, self.born = addr, size, frames, seq, born
        self.freed_seq, self.died = None, None   # alloc ordinal at the free; trace index of the free


def peak(snapshot, device=None):
    """(the allocations live at the peak, the reserved bytes then, the trace's length, allocations in the
    trace). device: the index of device_traces (default: the one with events)."""
    traces = snapshot.get("device_traces") or []
    if device is None:
        device = next((i for i, t in enumerate(traces) if t), 0)
    events = traces[device] if device < len(traces) else []
    segments = [s for s in snapshot.get("segments") or [] if s.get("device", device) == device]
    live = {b["address"]: Allocation(b["address"], b["size"], b.get("frames") or [], -1, -1)
            for s in segments for b in s.get("blocks") or [] if b.get("state") == "active_allocated"}
    reserved = sum(s["total_size"] for s in segments)
    for e in reversed(events):  # undo: the state when the history began
        action = e.get("action")
        if action == "alloc":
            live.pop(e["addr"], None)
        elif action == "free_requested":
            live[e["addr"]] = Allocation(e["addr"], e["size"], [], -1, -1)
        elif action == "segment_alloc":
            reserved -= e["size"]
        elif action == "segment_free":
            reserved += e["size"]
    everything = list(live.values())
    total = top = sum(a.size for a in everything)
    at, top_reserved, n = -1, reserved, 0
    for i, e in enumerate(events):
        action = e.get("action")
        if action == "alloc":
            a = live[e["addr"]] = Allocation(e["addr"], e["size"], e.get("frames") or [], n, i)
            everything.append(a)
            n += 1
            total += a.size
            if total > top:
                top, at, top_reserved = total, i, reserved
        elif action == "free_requested":
            a = live.pop(e["addr"], None)
            if a is not None:
                a.freed_seq, a.died = n, i
                total -= a.size
        elif action == "segment_alloc":
            reserved += e["size"]
        elif action == "segment_free":
            reserved -= e["size"]
    held = [a for a in everything if a.born <= at and (a.died is None or a.died > at)]
    return held, top_reserved, len(events), n


def reduce(snapshot, tags, device=None, device_total=None, other=None, allocations=None, where=None):
    """The record of the module's docstring. device_total, other: bytes (the device's memory, and what is in
    use outside the allocator); allocations: how many allocations the step made in all (the tags' seq
    counts from the history's start; a trace that lost its oldest events is shifted by the difference).
    where: frames -> a label (default: `innermost_own`); the hook for mapping compiled-graph frames."""
    held, reserved, events, n = peak(snapshot, device)
    lost = max(0, allocations - n) if allocations is not None else 0
    spans = {c: sorted(((p, p + size, None if s is None else s - lost) for p, size, s in tags.get(c) or ()),
                       key=lambda span: span[:2])  # by address: a tensor tagged twice has a seq None and one int
             for c in TAGGED}
    starts = {c: [t[0] for t in v] for c, v in spans.items()}
    optimizer_seen = bool(tags.get("optimizer_state"))
    sizes = dict.fromkeys(TAGGED + ("other_persistent", "temporaries"), 0)
    by_line = {}
    for a in held:
        kind = _category(a, spans, starts)
        if kind is None:
            persistent = a.seq == -1 and a.died is None
            kind = ("other_persistent" if optimizer_seen else "optimizer_state") if persistent else "temporaries"
        sizes[kind] += a.size
        label = (where or innermost_own)(a.frames) or (BEFORE if a.seq == -1 else "(no Python frame)")
        by_line[label] = by_line.get(label, 0) + a.size
    allocated = sum(sizes.values())
    record = {
        "peak_allocated_mb": _mb(allocated), "reserved_mb": _mb(reserved),
        "reserved_unallocated_mb": _mb(max(0, reserved - allocated)),
        "device_mb": _mb(device_total) if device_total else None, "other_mb": _mb(other) if other is not None
        else None, "categories": {k: _mb(v) for k, v in sizes.items() if v or k in TAGGED},
        "lines": [{"where": w, "mb": _mb(b)} for w, b in sorted(by_line.items(), key=lambda kv: -kv[1])][:MAX_LINES],
        "events": events,
    }
    notes = []
    if not optimizer_seen and sizes["optimizer_state"]:
        notes.append("no torch.optim optimizer stepped: optimizer_state is every untagged block live through the "
                     "whole step (optimizer state, buffers, caches)")
    if lost:
        notes.append(f"the history kept the last {n} of {allocations} allocations: the peak is the highest of those")
    if notes:
        record["note"] = "; ".join(notes)
    return record


def _category(a, spans, starts):
    """The tag overlapping most of block `a` among those live with it, None when none."""
    best, most = None, 0
    for c in TAGGED:
        lo, hi = bisect.bisect_left(starts[c], a.addr), bisect.bisect_left(starts[c], a.addr + a.size)
        covered = 0
        for start, end, seq in spans[c][lo:hi]:
            if seq is None or (a.seq < seq and (a.freed_seq is None or a.freed_seq >= seq)):
                covered += min(end, a.addr + a.size) - start
        if covered > most:
            best, most = c, covered
    return best


# Inductor names each generated module by its code's hash, `c<hash>.py`, in a folder named by the hash's next two
# characters (torch/_inductor/codecache.py): `.../24/c24adrdp...py`, wherever TORCHINDUCTOR_CACHE_DIR puts it
GENERATED_FILE = re.compile(r"(?:^|/)([a-z0-9]{2})/c\1[a-z0-9]{20,}\.py$")


def generated(path):
    """A file torch.compile wrote (Inductor's generated code, in its cache folder): not a line the user wrote.
    By the folder's name (`torchinductor_<user>` by default) or by Inductor's own file naming, so a cache
    moved by TORCHINDUCTOR_CACHE_DIR is recognized too."""
    path = str(path).replace("\\", "/").lower()
    return "torchinductor" in path or GENERATED_FILE.search(path) is not None


def _label(f):
    parts = f["filename"].split(os.sep)
    return f"{'/'.join(parts[-2:]) if len(parts) > 1 else parts[0]}:{f['line']}"


def innermost_own(frames):
    """`file.py:line` of the innermost Python frame outside installed packages (torch's frames come first in
    a snapshot's list), else of the innermost Python frame; None without one. A frame in a compiled graph's
    generated code is named by the user's line that called the graph: `train.py:389 (compiled graph)`."""
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    own = [f for f in python if "-packages" + os.sep not in f["filename"]]
    f = (own or python or [None])[0]
    if f is None:
        return None
    if not generated(f["filename"]):
        return _label(f)
    caller = next((g for g in own if not generated(g["filename"])), None)
    return f"{_label(caller)} (compiled graph)" if caller else "a compiled graph"


def placed(placement):
    """A `where` for reduce: frames -> label, each frame first moved to the running code as the time lines'
    frames are (profiling/profile/capture/relocate.py, through provenance.placement()): a compiled graph from
    Inductor's cache carries the source frames of the run that compiled it (another folder, the file before a
    line was added). placement: {"frames": {(path, line, function): (path, line)}, "files": {recorded
    path that no running file has: (running path, usual shift)}}; None or empty: the frames as recorded."""
    if not placement or not (placement.get("frames") or placement.get("files")):
        return None
    exact, files = placement.get("frames") or {}, placement.get("files") or {}

    def move(f):
        path, line = f.get("filename"), f.get("line")
        to = exact.get((path, line, f.get("name")))
        if to is None and path in files:  # a file no process code is: only a cached graph names it
            to = (files[path][0], line + files[path][1])
        return f if to is None else dict(f, filename=to[0], line=to[1])

    return lambda frames: innermost_own([move(f) for f in frames])


NO_CACHING = "PYTORCH_NO_CUDA_MEMORY_CACHING"


def uncached(value):
    """Whether a value of PYTORCH_NO_CUDA_MEMORY_CACHING turns the caching allocator off (not empty or 0)."""
    return value is not None and str(value).strip() not in ("", "0")


def unmeasured(caching_off, allocator_peak_mb=None):
    """The memory record when the allocator's snapshot held no block: why, and the allocator's own peak where
    its statistics still counted (None: they read 0)."""
    why = (f"the caching allocator is off ({NO_CACHING}=1): every tensor is its own cudaMalloc, outside the "
           "allocator's blocks, so its snapshot holds nothing to split by category; profile once without it "
           "for this table" if caching_off else "the allocator's snapshot held no block at the step's peak")
    return {"missing": why, "caching_allocator": not caching_off, "allocator_peak_mb": allocator_peak_mb}


def held_lines(snapshot, exclude=(), where=None, device=None):
    """[{where, mb}] of the blocks allocated now (a snapshot taken at an out-of-memory failure), by line,
    largest first, leaving out those starting in `exclude` ((start, end) address ranges: parameters,
    gradients, optimizer state); None when no block has frames (the allocator's history was not recorded)."""
    blocks = [b for seg in snapshot.get("segments") or []
              if device is None or seg.get("device", device) == device
              for b in seg.get("blocks") or [] if b.get("state") == "active_allocated"]
    if not any(b.get("frames") for b in blocks):
        return None
    spans = sorted(exclude)
    starts = [a for a, _ in spans]
    by_line = {}
    for b in blocks:
        i = bisect.bisect_right(starts, b["address"]) - 1
        if i >= 0 and b["address"] < spans[i][1]:
            continue
        label = (where or innermost_own)(b.get("frames") or []) or "(allocated before the history)"
        by_line[label] = by_line.get(label, 0) + b["size"]
    return [{"where": w, "mb": _mb(n)} for w, n in sorted(by_line.items(), key=lambda kv: -kv[1])][:MAX_LINES]


def _mb(n):
    return round(n / MB, 3)
