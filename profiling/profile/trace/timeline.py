"""Pure: the facts the findings (profiling/profile/findings/) reason from, read once from an indexed trace. Stdlib only.

- GPU idle gaps: per step, the stretches of the step's device window where no device event runs, each with
  the device event that ends it (and the CPU launch of that event) and the one before it.
- Host syncs: CUDA runtime calls that block the host until the GPU is done (`cudaStreamSynchronize`, ...),
  with the operators around them (`aten::item`, `aten::is_nonzero`, ...). A sync costs the GPU idle that
  starts while the host waits in it: with the queue drained, the GPU then waits for everything the host does
  until its next launch (a sync while the GPU has a full queue costs nearly nothing).
- The compiled model's regions (`Torch-Compiled Region: F/C` operators outside the optimizer), per step.
- Operators by External id, so a kernel's launching operator gives its input shapes and dtypes.
- Host stack samples from the live run (profiling/profile/capture/sampler.py), placed on the trace's timeline.
- The input pipeline: the DataLoader's `enumerate(DataLoader)#...__next__` spans inside the steps (the host waiting
  for its next batch, or making it in the training thread), by start.
"""
import bisect
import functools
import math
import re

from profiling.profile.trace.cold import COLD
from profiling.profile.trace.traceio import by_thread, find, merge, outer_names, parents

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
              # ROCm's HIP runtime (hipMemcpyWithStream: its blocking copy, as .item() and .cpu() make)
              "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
              "hipMemcpyWithStream")
COMPILED = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph")  # compiled code's op names
# a tensor tested for the host, reduced to one boolean; called by compiled code itself, Inductor's debug checks
# (nan_asserts: `assert not buf.isnan().any().item()` and isinf after every buffer) are the case seen
CHECK_OPS = ("aten::isnan", "aten::isinf", "aten::isfinite", "aten::any", "aten::all")
LAUNCH_CALLS = re.compile(r"^(cudaLaunch|cuLaunch|hip(Ext)?(Module)?Launch)")  # HIP: hipLaunchKernel,
                                                                             # hipExtModuleLaunchKernel...
REGION = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
MAX_LOOKBACK = 400     # operators looked back through for the one around a runtime call
SYNC_SLACK_US = 50.0   # the GPU drains a few us before the sync call returns; clocks agree to ~1 us


WINDOW_START = "the window's start"  # the "work before" the GPU idle ahead of a marker-less window's first kernel
WINDOW_END = "the window's end"      # the "next work" of the GPU idle after its last kernel


class Gap:
    """One stretch of GPU idle inside a step: [start, end) in trace microseconds."""

    __slots__ = ("after", "before", "cause", "end", "launch", "start", "step")

    def __init__(self, step, start, end, before, after, launch):
        self.step, self.start, self.end = step, start, end
        self.before, self.after, self.launch = before, after, launch
        self.cause = None   # set by the first finding that explains it (host_sync, graph_break)

    @property
    def us(self):
        return self.end - self.start


class Timeline:
    """Everything the findings read, computed once. `per_step`: [[(device event, launch)]] (traceio.attribute);
    `windows`: each step's (start, end) on the device timeline; `labels`: each event's budget category."""

    def __init__(self, ix, per_step, windows, labels, meta):
        self.ix, self.per_step, self.windows, self.labels, self.meta = ix, per_step, windows, labels, meta
        self.n = len(per_step)
        self.threads = by_thread(ix.cpu_ops)
        self.parent, self.memo, self.starts = parents(self.threads), {}, {}
        self.launch_ops, self.chains = {}, {}  # op_of and chain, memoized
        self.ops = {}
        for op in ix.cpu_ops:
            self.ops.setdefault((op.get("args") or {}).get("External id"), op)
        self.ops.pop(None, None)
        self.gaps = [g for k in range(self.n) for g in self._gaps(k)]
        self._cold(getattr(ix, "cold", None))
        self.syncs = self._syncs()
        reach = 0.0  # the latest end (plus slack) of the syncs so far, by time: sync_at bisects it
        self.sync_reach = [reach := max(reach, e["ts"] + e["dur"] + SYNC_SLACK_US) for e, _ in self.syncs]
        self.regions = self._regions()

    # -- where things are ------------------------------------------------------------------------------

    def step_of(self, ts):
        """The index of the profiled step whose CPU window holds time ts, or None."""
        return find(self.ix.steps, [s[0] for s in self.ix.steps], ts)

    def op_of(self, launch):
        """The operator that made a runtime call (by External id, else the innermost operator around it).
        Memoized: every rule asks it of the same launches."""
        key = id(launch)
        if key not in self.launch_ops:
            op = self.ops.get((launch.get("args") or {}).get("External id"))
            self.launch_ops[key] = op if op is not None else self.enclosing(launch)
        return self.launch_ops[key]

    def enclosing(self, e):
        """The innermost operator on e's thread whose span holds e's start."""
        key = (e.get("pid"), e.get("tid"))
        evs = self.threads.get(key, [])
        if key not in self.starts:
            self.starts[key] = [x["ts"] for x in evs]
        i = bisect.bisect_right(self.starts[key], e["ts"]) - 1
        best = None
        for op in evs[max(0, i - MAX_LOOKBACK):i + 1][::-1]:
            if op["ts"] + op["dur"] >= e["ts"] and (best is None or op["dur"] < best["dur"]):
                best = op
        return best

    def chain(self, op):
        """Names of an operator and those around it, innermost first (memoized)."""
        if not op:
            return ()
        key = id(op)
        if key not in self.chains:
            self.chains[key] = (str(op.get("name", "")),) + outer_names(op, self.parent, self.memo)
        return self.chains[key]

    # -- gaps ------------------------------------------------------------------------------------------

    def _cold(self, found):
        """The gaps the host spent mostly in a cold start's first calls (trace/cold.py): no finding's, said once as
        a one-off (cause COLD); every gap, where the window is one iteration and that the first (found["once"]),
        but the DataLoader's (input_bound says a first batch once)."""
        if not found:
            return
        spans = found["spans"]
        for g in self.gaps:
            loader = g.launch["ts"] >= g.start and self.loader_overlap(g.start, g.end) >= g.us / 2
            if (found.get("once") and not loader
                    or sum(max(0.0, min(g.end, b) - max(g.start, a)) for a, b in spans) >= g.us / 2):
                g.cause = COLD

    def _gaps(self, k):
        evs = self.per_step[k]
        if not evs:
            return []
        end = self.windows[k][1]
        busy = merge([(e["ts"], e["ts"] + e["dur"]) for e, _ in evs])
        by_start = sorted(evs, key=lambda p: p[0]["ts"])
        starts = [e["ts"] for e, _ in by_start]
        by_end = sorted((e["ts"] + e["dur"], i) for i, (e, _) in enumerate(evs))
        ends = [t for t, _ in by_end]
        following = self.per_step[k + 1] if k + 1 < self.n else []
        first_next = min(following, key=lambda p: p[0]["ts"]) if following else None
        gaps = []
        for i, (_, b1) in enumerate(busy):
            g1 = busy[i + 1][0] if i + 1 < len(busy) else end
            if g1 <= b1:
                continue
            j = bisect.bisect_left(starts, g1)
            after = by_start[j] if j < len(starts) else first_next
            if after is None:
                continue
            before = evs[by_end[bisect.bisect_right(ends, b1) - 1][1]][0]
            gaps.append(Gap(k, b1, g1, before, after[0], after[1]))
        # a window that begins or ends on the host (traceio.step_windows' `host`, a trace without markers): the GPU
        # idle before its first kernel, waiting for the host (a first batch, setup), and after its last kernel while
        # the host works on (a save, a log, freeing memory): a gap whose next work is the window's end
        if self.windows[k][0] < starts[0]:
            first, edge = by_start[0], {"name": WINDOW_START, "cat": "", "ts": self.windows[k][0], "dur": 0}
            gaps.insert(0, Gap(k, self.windows[k][0], starts[0], edge, first[0], first[1]))
        if k == self.n - 1 and busy and end > busy[-1][1] and not (gaps and gaps[-1].end >= end):
            edge = {"name": WINDOW_END, "cat": "", "ts": end, "dur": 0}
            before = evs[by_end[-1][1]][0]
            gaps.append(Gap(k, busy[-1][1], end, before, edge, edge))
        return gaps

    @functools.cached_property
    def checks(self):
        """[(device event, operator)] of the kernels of host checks inside compiled graphs: CHECK_OPS called by
        the compiled code itself (the outermost operator inside a compiled graph's call)."""
        out = []
        for evs in self.per_step:
            for e, launch in evs:
                chain = self.chain(self.op_of(launch))
                i = next((i for i, c in enumerate(chain) if c.startswith(COMPILED)), 0)
                if i and chain[i - 1] in CHECK_OPS:
                    out.append((e, chain[i - 1]))
        return out

    @functools.cached_property
    def device_limited(self):
        """({id(device event): (alone us, group)}, {group: us}): each event's time while no other device event ran
        (a kernel beside another stream's work is hidden by it), and the most the step would lose were the events
        of its group faster. A kernel made shorter moves the GPU's next idle earlier; a group is the events before
        one such idle. Where it is the GPU waiting for the host's next launch (launched after the GPU went idle,
        the host not in a sync), the idle only grows: 0. Where it is the host blocked in a sync, the sync returns
        sooner, by no more than the host waited in it while the GPU ran: that wait. Where the GPU does not idle
        again before the next step's work: no limit (inf); after the last step's work the trace does not tell,
        so it is as the step before it."""
        out, limits, tail = {}, {}, math.inf
        for k, evs in enumerate(self.per_step):
            host = sorted((g.start, g) for g in self.gaps if g.step == k and g.launch["ts"] > g.start)
            starts, alone = [t for t, _ in host], _alone([e for e, _ in evs])
            last = None
            for e, _ in sorted(evs, key=lambda p: p[0]["ts"] + p[0]["dur"]):
                i = bisect.bisect_left(starts, e["ts"] + e["dur"])
                g = host[i][1] if i < len(host) else None
                key = id(g) if g is not None else ("tail", k)
                if key not in limits:
                    limits[key] = math.inf if g is None else self._waited(g)
                out[id(e)], last = (alone(e), key), key
            if last is not None and k < self.n - 1:
                tail = limits[last]
            elif last == ("tail", k):
                limits[last] = tail
        return out, limits

    def _waited(self, gap):
        """us the host waited in the sync it was blocked in as the GPU went idle at `gap`, while the GPU ran; 0 where
        it was in none (the GPU waited for its launch)."""
        sync = self.sync_at(gap)
        return max(0.0, min(sync[0]["ts"] + sync[0]["dur"], gap.start) - sync[0]["ts"]) if sync else 0.0

    # -- syncs -----------------------------------------------------------------------------------------

    def _syncs(self):
        """[(runtime call, operator chain)] of the host syncs made inside the profiled steps, by time."""
        out = [(e, self.chain(self.enclosing(e))) for e in self.ix.launches.values()
               if str(e.get("name", "")) in SYNC_CALLS and self.step_of(e["ts"]) is not None]
        return sorted(out, key=lambda x: x[0]["ts"])

    def sync_at(self, gap):
        """The sync call the host was blocked in when the GPU went idle at gap.start (the first by time, SYNC_SLACK_US
        either side), or None. The first sync whose end reaches gap.start is where the running latest end does;
        it holds gap.start if it began by then."""
        i = bisect.bisect_left(self.sync_reach, gap.start)
        if i < len(self.syncs) and self.syncs[i][0]["ts"] - SYNC_SLACK_US <= gap.start:
            return self.syncs[i]
        return None

    # -- compiled regions --------------------------------------------------------------------------------

    def _regions(self):
        """[(op, frame id)] of the model's compiled regions per step (optimizer windows excluded)."""
        opt_starts = [w[0] for w in self.ix.optimizer]
        per = [[] for _ in range(self.n)]
        for op in self.ix.cpu_ops:
            m = REGION.match(str(op.get("name", "")))
            if not m or find(self.ix.optimizer, opt_starts, op["ts"]) is not None:
                continue
            k = self.step_of(op["ts"])
            if k is not None:
                per[k].append((op, int(m.group(1))))
        for regions in per:
            regions.sort(key=lambda r: r[0]["ts"])
        return per

    # -- the input pipeline ------------------------------------------------------------------------------

    @functools.cached_property
    def loader(self):
        """[(start, end, mark)] of the DataLoader's next-batch spans that begin inside a profiled step, by start; the
        outermost of nested ones on a thread (an iterator wrapping another records both)."""
        marks = [m for m in self.ix.loader if self.step_of(m["ts"]) is not None]
        out, ends = [], {}
        for m in sorted(marks, key=lambda m: (m["ts"], -m["dur"])):
            key = (m.get("pid"), m.get("tid"))
            if m["ts"] >= ends.get(key, float("-inf")):
                out.append((m["ts"], m["ts"] + m["dur"], m))
                ends[key] = m["ts"] + m["dur"]
        return out

    def loader_overlap(self, start, end):
        """us of [start, end] that the loader's spans cover (each instant once)."""
        spans = self._loader_merged
        i = bisect.bisect_right([a for a, _ in spans], end)
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans[:i] if b > start)

    @functools.cached_property
    def _loader_merged(self):
        return merge([(a, b) for a, b, _ in self.loader])

    # -- host samples ------------------------------------------------------------------------------------

    def samples_between(self, k, start, end):
        """Stack ids of the live run's host samples of step k whose time falls in [start, end], in time order."""
        times, ids = self._samples_by_step.get(k, ((), ()))
        return ids[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]

    @functools.cached_property
    def _samples_by_step(self):
        """{step: ([sample times], [stack ids])}, by time (a gap asks for its samples 48k times over the fixtures:
        one scan of every sample each was a fortieth of the summaries' time)."""
        host = self.meta.get("host_samples") or {}
        per = {}
        for step, us, sid in host.get("samples", ()):
            if 0 <= step < len(self.ix.steps):
                per.setdefault(step, []).append((self.ix.steps[step][0] + us, sid))
        out = {}
        for step, rows in per.items():
            rows.sort(key=lambda r: r[0])
            out[step] = ([t for t, _ in rows], [sid for _, sid in rows])
        return out


def _alone(events):
    """A function: an event's us while no other of `events` ran (one sweep over their starts and ends)."""
    edges = sorted([(e["ts"], 1) for e in events] + [(e["ts"] + e["dur"], -1) for e in events])
    times, solo, depths = [], [], []  # at each edge: its time, the us run by one event alone up to it, the events after
    depth, acc = 0, 0.0
    for t, d in edges:
        if times and depth == 1:
            acc += t - times[-1]
        depth += d
        times.append(t)
        solo.append(acc)
        depths.append(depth)

    def upto(t):
        i = bisect.bisect_right(times, t) - 1
        return 0.0 if i < 0 else solo[i] + (t - times[i] if depths[i] == 1 else 0.0)

    return lambda e: max(0.0, upto(e["ts"] + e["dur"]) - upto(e["ts"]))


def input_types(op):
    """The recorded dtypes of an operator's inputs (`Input type`), or ()."""
    types = (op.get("args") or {}).get("Input type") if op else None
    return tuple(t for t in types if isinstance(t, str) and t) if isinstance(types, list) else ()
