"""Operators for device-only timed steps, joined from one untimed step (issue #50). Pure.

Recording every operator on the CPU is what torch.profiler costs a host-bound loop: on the H100 a 12-layer eager
transformer ran +60% with CPU and CUDA activity and +18% with CUDA activity alone (a compiled one: +45% and +25%;
benchmarks/profiler_cost/profiler_cost_results.md). So the timed steps record the device only (kernels,
copies, memsets and the runtime calls that launch them), and one untimed step after them records everything
(operators, annotations, shapes). A training step launches the same kernels in the same order every time; here
each timed step gets a copy of the untimed step's host events, placed by its launches: every runtime call of
the untimed step is paired with the timed step's call of the same name and kernel, in launch order, thread by
thread, and an operator's start and end move with the launches around them (linearly between two paired
launches). A paired launch and its kernels take the copied operator's External id, so every table reads the
joined trace as it reads a fully recorded one. Where the sequences differ (data-dependent control flow, a step
unlike the others) the unpaired launches keep no operator, and `join` says what share of the device time that
leaves unjoined, step by step (the summary then says the share of the like steps, which every table reads, apart
from a one-off's: an eval's forwards in the window, which the untimed step never ran; issue #57). Where only the
kernels differ (another cuDNN algorithm at a new input size) the calls pair one by one; where the timed step ran
work the untimed step did not (an eval) the untimed step's events keep their own pace around it, never stretched
over it; the untimed step's own extra work (an eval after the window) lends no operators to a step that did not
run it (benchmarks/findings/live/uneven_steps_results.md).

A CUDA-only trace has no ProfilerStep annotations (they are CPU events): the capture marks each step's start
with a CUDA event record and notes its host time; `add_steps` finds those runtime calls by their spacing.
"""
import bisect
import difflib
from collections import Counter, defaultdict

from profiling.profile.trace.traceio import DEVICE_CATS, LAUNCH_CATS, STEP_PREFIX, corr, num

# What the timed steps record on CUDA (the Profiler's `ops`): "device", the device only (kernels, copies, memsets
# and the runtime calls that launch them; operators, annotations and shapes joined from the untimed detail step),
# or "full", every operator too (torch.profiler's CPU and CUDA activity). Without CUDA the CPU is the device: its
# operators are recorded in the timed steps either way.
OPS = ("device", "full")
MARKS = ("cudaEventRecord", "cudaEventRecordWithFlags")  # what torch.cuda.Event.record() calls
# A mark's runtime call starts a few microseconds after the host time the capture noted just before it; a 1 ms
# tolerance still tells one step's mark from the next at any step of over 2 ms, and the offset is fitted on all.
MARK_TOLERANCE_US = 1000.0
HOST_CATS = ("cpu_op", "user_annotation", "python_function")  # what the untimed step lends
# a stretch where the timed step's keys differ from the untimed step's is paired call by call (`_by_call`) when
# the shorter side holds this share of the longer's calls: the same operators with other kernels, not work added
REPLACED = 0.8
# a gap between two paired launches holding calls the untimed step did not make, this much longer than in the
# untimed step (and by JUMP_MIN_US), is work added (an eval, a save): the untimed step's events keep their pace
# (`_Placement`); a gap merely slower (a host busier in the timed steps) stretches them, as before
JUMP, JUMP_MIN_US = 2.0, 1000.0
RENUMBERED = ("External id", "Sequence number")  # one event's ids: unique per copy, as they are per step


def add_steps(events, host_us, first):
    """Add a `ProfilerStep#<first + k>` annotation for each step between the marks of a CUDA-only trace
    (`events`, changed in place): `host_us` are the host's clock readings (µs, any origin) just before each
    mark, one per step start and one at the last step's end. Returns the number of steps added (0 when no
    offset puts every reading on a mark: then the trace keeps no steps)."""
    marks = _marks(events, host_us) if host_us else None
    if marks is None:
        return 0
    for k, (a, b) in enumerate(zip(marks, marks[1:])):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"{STEP_PREFIX}{first + k}",
                       "pid": a.get("pid"), "tid": a.get("tid"), "ts": a["ts"], "dur": b["ts"] - a["ts"],
                       "args": {}})
    return len(marks) - 1


def _marks(events, host_us):
    """The runtime calls of the marks, one per host reading, or None: the candidates (event records) fitted
    to the readings' spacing with the offset of each candidate in turn as the first."""
    found = sorted((e for e in events if e.get("cat") in LAUNCH_CATS and e.get("name") in MARKS
                    and num(e.get("ts"))), key=lambda e: e["ts"])
    starts = [e["ts"] for e in found]
    for first in found:
        offset = first["ts"] - host_us[0]
        picked = [_nearest(found, starts, t + offset) for t in host_us]
        if all(p is not None for p in picked) and len({id(p) for p in picked}) == len(picked):
            return picked
    return None


def _nearest(found, starts, t):
    i = bisect.bisect_left(starts, t)
    near = [found[j] for j in (i - 1, i) if 0 <= j < len(found)]
    best = min(near, key=lambda e: abs(e["ts"] - t), default=None)
    return best if best is not None and abs(best["ts"] - t) <= MARK_TOLERANCE_US else None


def join(events, donor):
    """Give every step of `events` (a device-only trace with ProfilerStep annotations; changed in place) a
    copy of the host events of `donor` (the events of one fully recorded step), placed by launch order.
    Returns {"steps", "launches": paired runtime calls, "of": the steps' runtime calls, "device_us",
    "unjoined_us": device time whose launch found no pair, "unjoined_kernels": the commonest of those,
    "per_step": [[device_us, unjoined_us]] step by step, "donor_us": the untimed step's device time,
    "donor_unused_us": the part of it whose launch paired in no step (work only it ran: an eval after the
    window)}."""
    steps = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") == "user_annotation"
                   and str(e.get("name", "")).startswith(STEP_PREFIX) and num(e.get("ts")))
    device = _launched(events)
    lent = _Donor(donor)
    _same_threads(events, lent, device)
    ids = _IdSpace(events, donor)
    out = {"steps": len(steps), "launches": 0, "of": 0, "device_us": 0.0, "unjoined_us": 0.0, "per_step": []}
    missed = defaultdict(float)
    added, used = [], set()
    launches = sorted((e for e in events if e.get("cat") in LAUNCH_CATS and num(e.get("ts"))), key=lambda e: e["ts"])
    starts = [e["ts"] for e in launches]
    for k, (start, end) in enumerate(steps):
        calls = launches[bisect.bisect_left(starts, start):bisect.bisect_left(starts, end)]
        pairs = lent.pair(calls, device)
        used.update(id(d) for d, _ in pairs)
        shift = ids.shift(k)
        for d, t in pairs:
            for e in [t] + device.get(corr(t), []):
                ext = (d.get("args") or {}).get("External id")
                if ext is not None:
                    e.setdefault("args", {})["External id"] = ext + shift["External id"]
        paired = {id(t) for _, t in pairs}
        mine = [0.0, 0.0]  # this step's device time, and the part of it left unjoined
        for t in calls:
            us = sum(x.get("dur", 0) for x in device.get(corr(t), []))
            mine[0] += us
            if id(t) not in paired and us:
                mine[1] += us
                missed[device[corr(t)][0].get("name", "?")] += us
        out["device_us"] += mine[0]
        out["unjoined_us"] += mine[1]
        out["per_step"].append([round(mine[0], 1), round(mine[1], 1)])
        out["launches"] += len(pairs)
        out["of"] += len(calls)
        inserted = sorted(t["ts"] for t in calls if id(t) not in paired and t.get("name") not in MARKS)
        added += lent.placed(pairs, (start, end), shift, inserted)
    events.extend(added)
    lent_us = [(id(d), sum(x.get("dur", 0) for x in lent.device.get(corr(d), []))) for d in lent.calls]
    out["donor_us"] = round(sum(us for _, us in lent_us), 1)  # the untimed step's device time, and the part of
    out["donor_unused_us"] = round(sum(us for i, us in lent_us if i not in used), 1)  # it no timed step ran
    out["unjoined_kernels"] = [name for name, _ in sorted(missed.items(), key=lambda kv: -kv[1])[:3]]
    out["device_us"], out["unjoined_us"] = round(out["device_us"], 1), round(out["unjoined_us"], 1)
    return out


class _Donor:
    """The untimed step: its runtime calls by thread in launch order (with their keys), its host events."""

    def __init__(self, donor):
        device = _launched(donor)
        calls = sorted((e for e in donor if e.get("cat") in LAUNCH_CATS and num(e.get("ts"))),
                       key=lambda e: e["ts"])
        calls = [e for e in calls if e.get("name") not in MARKS]  # the capture's step edges: no one's work
        self.calls, self.device = calls, device
        self.by_thread = defaultdict(list)
        for e in calls:
            self.by_thread[e.get("tid")].append(e)
        self.keys = {tid: [_key(e, device) for e in es] for tid, es in self.by_thread.items()}
        self.starts = {tid: [e["ts"] for e in es] for tid, es in self.by_thread.items()}
        self.host = [e for e in donor if e.get("ph") == "X" and e.get("cat") in HOST_CATS and num(e.get("ts"))
                     and not str(e.get("name", "")).startswith(STEP_PREFIX)]
        ends = [e["ts"] + e.get("dur", 0) for e in self.host + calls]  # (a step's edge is no anchor: the
        # work before the first paired launch then keeps its pace when an eval ran ahead of it)
        self.span = (min(e["ts"] for e in self.host + calls), max(ends)) if ends else None

    def pair(self, calls, device):
        """[(untimed call, timed call)] of one timed step's runtime calls, aligned thread by thread."""
        mine = defaultdict(list)
        for e in sorted(calls, key=lambda e: e["ts"]):
            if e.get("name") not in MARKS:
                mine[e.get("tid")].append(e)
        pairs = []
        for tid, theirs in mine.items():
            ours = self.by_thread.get(tid, [])
            a, b = self.keys.get(tid, []), [_key(e, device) for e in theirs]
            if a == b:
                pairs += zip(ours, theirs)
                continue
            matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
            for op, i1, i2, j1, j2 in matcher.get_opcodes():
                if op == "equal":
                    pairs += zip(ours[i1:i2], theirs[j1:j2])
                elif op == "replace" and min(i2 - i1, j2 - j1) >= REPLACED * max(i2 - i1, j2 - j1):
                    pairs += _by_call(ours[i1:i2], theirs[j1:j2], a[i1:i2], b[j1:j2])  # kernels differ
        return pairs

    def placed(self, pairs, step, shift, inserted=()):
        """Copies of the host events, each moved into `step` by the paired launches around it (`inserted`: the
        starts of the step's unpaired calls, work the untimed step did not do)."""
        if self.span is None:
            return []
        place = _Placement(pairs, self.span, step, inserted)
        ran = {id(d) for d, _ in pairs}
        out = []
        for e in self.host:
            if not self._ran_here(e, ran):
                continue
            start, end = place(e["ts"]), place(e["ts"] + e.get("dur", 0))
            copy = dict(e, ts=start, dur=max(0.0, end - start))
            args = dict(e.get("args") or {})
            for key in RENUMBERED:
                if num(args.get(key)):
                    args[key] += shift[key]
            copy["args"] = args
            out.append(copy)
        return out


    def _ran_here(self, e, ran):
        """Whether host event `e` of the untimed step ran in a timed step whose paired untimed calls are `ran`
        (ids): not when the calls it made, or the two around it on its thread, all went unpaired (work only the
        untimed step did: an eval or a save after the window, a branch the timed step did not take; its copy would
        put operators in every timed step that never ran there)."""
        calls, starts = self.by_thread.get(e.get("tid"), ()), self.starts.get(e.get("tid"), ())
        if not calls:
            return True
        a, b = bisect.bisect_left(starts, e["ts"]), bisect.bisect_right(starts, e["ts"] + e.get("dur", 0))
        inside = calls[a:b]
        if inside:
            return any(id(c) in ran for c in inside)
        around = calls[max(0, a - 1):a + 1]
        return len(around) < 2 or any(id(c) in ran for c in around)


def _by_call(ours, theirs, a, b):
    """Pairs in a stretch where the two steps' keys differ: the runtime calls of the same name and as many device
    events, in order (a convolution at a new input size launches another algorithm's kernels from the same
    operator: cuDNN chose `sm90_xmma_fprop_..._nhwckrsc` at one size and another at the next; varying_size in
    benchmarks/findings/live/uneven_steps.py left 1.6-4.9% of its device time unjoined for that alone). Work the
    untimed step did not run at all (an eval's forwards) is an insertion, never a replacement: it stays unpaired."""
    shape = lambda k: (k[0], len(k) - 1)  # noqa: E731
    matcher = difflib.SequenceMatcher(None, [shape(k) for k in a], [shape(k) for k in b], autojunk=False)
    return [p for block in matcher.get_matching_blocks()
            for p in zip(ours[block.a:block.a + block.size], theirs[block.b:block.b + block.size])]


def _same_threads(events, lent, device):
    """Give the timed steps' threads the untimed step's thread ids (`events` changed in place). CUPTI names a
    thread by its pthread id until a CPU operator has been recorded on it, so a process's first CUDA-only session
    wrote 970979008 where the operator step wrote 519 (H100, torch 2.11); each timed thread takes the untimed
    thread whose runtime calls it shares most (by name and kernel), one for one. device: `_launched(events)`."""
    mine = defaultdict(Counter)
    for e in events:
        if e.get("cat") in LAUNCH_CATS:
            mine[e.get("tid")][_key(e, device)] += 1
    ours = {tid: Counter(keys) for tid, keys in lent.keys.items()}
    shared = sorted(((sum((a & b).values()), t, d) for t, a in mine.items() for d, b in ours.items()),
                    key=lambda x: -x[0])
    renamed, taken = {}, set()
    for n, t, d in shared:
        if n and t not in renamed and d not in taken:
            renamed[t] = d
            taken.add(d)
    renamed = {t: d for t, d in renamed.items() if t != d}
    for e in events:
        if e.get("tid") in renamed and e.get("cat") not in DEVICE_CATS:
            e["tid"] = renamed[e["tid"]]


def _launched(events):
    """{correlation: the device events a launch made}."""
    device = defaultdict(list)
    for e in events:
        if e.get("cat") in DEVICE_CATS and corr(e) is not None:
            device[corr(e)].append(e)
    return device


def _key(call, device):
    """What a runtime call must share with its pair: its name and its device events' names."""
    return (call.get("name"),) + tuple(e.get("name") for e in device.get(corr(call), ()))


class _Placement:
    """A monotone map of the untimed step's clock onto a timed step's: linear between paired launches (their
    starts and ends), the steps' edges pinned to each other. Where the timed step ran calls the untimed step did
    not (`inserted`: an eval's forwards, sorted starts) between two paired launches further apart than in the
    untimed step, the untimed step's events between them keep their own pace and end at the later launch: the
    work added is not theirs (stretched over it, Lightning's validation loop, 155 ms at the step's start, became
    a DataLoader `__next__` of 159 ms and was kept as a loader wait instead of a one-off eval)."""

    def __init__(self, pairs, span, step, inserted=()):
        anchors = [(span[0], step[0])]
        for d, t in sorted(pairs, key=lambda p: p[0]["ts"]):
            anchors += [(d["ts"], t["ts"]), (d["ts"] + d.get("dur", 0), t["ts"] + t.get("dur", 0))]
        anchors.append((span[1], step[1]))
        kept = _increasing(sorted(anchors))  # a thread that runs apart from the step (a loader's pinning
        self.src, self.dst = [], []          # thread) pairs out of order: its anchors are skipped
        for s, t in kept:
            if not self.src or s > self.src[-1]:
                if (self.src and _holds(inserted, self.dst[-1], t)
                        and t - self.dst[-1] > JUMP * (s - self.src[-1]) + JUMP_MIN_US):
                    s0 = self.src[-1]
                    if len(self.src) == 1:  # before the first paired launch: the step's start is no anchor
                        self.dst[0] = t - (s - s0)
                    else:  # a jump over the work added, then the untimed step's pace
                        tiny = min(1e-3, (s - s0) / 2)
                        self.src.append(s0 + tiny)
                        self.dst.append(t - (s - s0 - tiny))
                self.src.append(s)
                self.dst.append(t)

    def __call__(self, t):
        i = bisect.bisect_right(self.src, t) - 1
        if i < 0:
            return self.dst[0] - (self.src[0] - t)
        if i >= len(self.src) - 1:
            return self.dst[-1] + (t - self.src[-1])
        s0, s1, d0, d1 = self.src[i], self.src[i + 1], self.dst[i], self.dst[i + 1]
        return d0 + (d1 - d0) * (t - s0) / (s1 - s0)


def _holds(starts, a, b):
    """Whether a sorted list of starts has one inside (a, b)."""
    i = bisect.bisect_right(starts, a)
    return i < len(starts) and starts[i] < b


def _increasing(anchors):
    """The longest run of `anchors` (sorted by their first value) whose second values never decrease
    (patience sorting, n log n)."""
    tails, tail_at, back = [], [], [None] * len(anchors)
    for i, (_, t) in enumerate(anchors):
        k = bisect.bisect_right(tails, t)
        back[i] = tail_at[k - 1] if k else None
        if k == len(tails):
            tails.append(t)
            tail_at.append(i)
        else:
            tails[k], tail_at[k] = t, i
    out, i = [], tail_at[-1] if tail_at else None
    while i is not None:
        out.append(anchors[i])
        i = back[i]
    return out[::-1]


class _IdSpace:
    """Per-step offsets for the copied events' ids, past every id the trace and the donor hold."""

    def __init__(self, events, donor):
        top = {key: 0 for key in RENUMBERED}
        for e in list(events) + list(donor):
            args = e.get("args") or {}
            for key in RENUMBERED:
                if num(args.get(key)):
                    top[key] = max(top[key], args[key])
        self.top = {key: v + 1 for key, v in top.items()}

    def shift(self, k):
        return {key: (k + 1) * v for key, v in self.top.items()}
