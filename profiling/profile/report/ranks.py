"""Pure: a profile folder with one trace per rank (torchrun) -> one result for all ranks. Stdlib only, never torch.

    result = summarize_folder(folder)        # render.to_markdown(result), render.to_json(result)
    result = summarize_path(path)            # a trace file, or a folder: what `research profile PATH` reads

The folder holds `rank-<k>.trace.json.gz` (the capture under torchrun) or `rank-<k>.json` / `rank-<k>.json.gz`
(the names Holistic Trace Analysis reads, so other scripts' traces work), k = 0..N-1, none missing. A folder
with a single `trace.json.gz` is a single-process profile: its summary, exactly as for the file.
A folder of torch.profiler's `tensorboard_trace_handler` files, `<worker>.<time_ns>.pt.trace.json[.gz]` (worker
`<hostname>_<pid>` unless the script names it, often `rank{rank}`), is read too: each worker's latest file
(several cycles of one worker: the latest, said in a note); its rank the one the trace records (kineto's
`distributedInfo` when torch.distributed was initialized, or the capture's own), else the number in the worker
name (rank3, worker_3) where those run 0..N-1, else the workers in the order of those numbers (pids), else in
name order; said in a note unless the traces recorded it. One worker's file: its summary, as a single trace.
Traces named otherwise (`trace_rank0.json`, `node1_gpu0.json.gz`) are read by the rank each records
(distributedInfo.rank), whatever their names; one that records none is refused (its rank would be a guess).

Each rank's trace is summarized on its own (profiling/profile/report/summary.py). The result is rank 0's summary (rank
0 speaks, and a --previous comparison diffs the same rank), its findings joined by `exposed_communication` and
`straggler`, plus:

    world_size, report_rank    how many ranks; whose summary the rest of the result is (0)
    ranks                      [{rank, step_ms, compute_ms, comm_ms, exposed_comm_ms, idle_ms, work_ms,
                               categories, collectives: [{name, bytes, calls_per_step, ms_per_step}]}]
    skew                       {slowest, fastest, step_spread_ms, straggler, work_spread_ms,
                               grew: [{part, ms}] (straggler vs the least-working rank), ops: [{name, ms}]}

Per rank and step (means over the profiled steps); compute + exposed + idle = step:
- communication: the union of the collectives' intervals: NCCL kernels on the GPU; on the CPU the gloo/c10d
  collectives on the threads that ran them (gloo runs them on worker threads, recorded as `gloo:all_reduce`).
- compute: the union of the other kernels' intervals (CPU: of the operators on every thread, less the
  collectives nested in them on the same thread).
- exposed communication: communication while no compute runs on that rank; idle: neither runs.
- work = step - exposed communication. A collective ends on every rank when the last rank joins it, so the
  ranks' steps come out equal and a slow rank shows as the others' exposed communication; the work does not.
- the steps are each rank's like steps (profiling/profile/trace/irregular.py: one-off steps left out), and a
  straggler is never built on the profiler's own host cost: the part of the work spread that the straggler's
  profiled step adds over its unprofiled one is not claimed (`profiler_cost`; a note says so when nothing is left).
"""
import os
import re

from profiling.errors import UserError
from profiling.profile.findings.contract import finding, rule
from profiling.profile.report import summary
from profiling.profile.trace import irregular
from profiling.profile.trace.classify import CATEGORIES, is_communication
from profiling.profile.trace.traceio import (
    by_thread,
    index,
    merge,
    num,
    union_length,
)

RANK_FILE = re.compile(r"^rank-(\d+)(\.trace)?\.json(\.gz)?$")
WORKER_FILE = re.compile(r"^(.+)\.(\d+)\.pt\.trace\.json(\.gz)?$")  # tensorboard_trace_handler: worker.time_ns
LAST_NUMBER = re.compile(r"(\d+)\D*$")
SEPARATE_RUNS = "; if these files are separate runs, not ranks, give `research profile` one file"
SINGLE = ("trace.json.gz", "trace.json")
STRAGGLER_SHARE = 0.10  # work spread below this share of the step is taken for noise: the two ranks of the
                        # balanced CPU fixture (tests/data/cpu-ddp-2ranks) differ by 9% (cores of unequal speed)
DTYPE_BYTES = {"float": 4, "float32": 4, "bfloat16": 2, "c10::bfloat16": 2, "half": 2, "float16": 2,
               "c10::half": 2, "double": 8, "float64": 8, "long int": 8, "int64": 8, "int": 4, "int32": 4}
SHOWN = 3               # collectives, parts and operators named in a finding's evidence


# ---------------------------------------------------------------------------------------------------------
# The folder
# ---------------------------------------------------------------------------------------------------------

def rank_files(folder):
    """{rank: path} of a profile folder's per-rank traces; None for a single-process folder (trace.json.gz) or
    one of tensorboard_trace_handler files (summarize_folder reads their ranks from the traces).
    UserError (one line) for an empty folder, a rank missing or a rank twice."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise UserError(f"{folder}: cannot read the folder ({e.strerror or e})") from None
    files = {}
    for name in names:
        m = RANK_FILE.match(name)
        if m:
            k = int(m.group(1))
            if k in files:
                raise UserError(f"{folder}: two traces for rank {k} ({os.path.basename(files[k])}, {name}); "
                                "keep one")
            files[k] = os.path.join(folder, name)
    if not files:
        if any(n in names for n in SINGLE) or worker_files(names)[0] or other_files(names):
            return None
        raise UserError(f"{folder}: no traces in this folder; expected rank-<k>.trace.json.gz (one per rank, "
                        "as train.py --profile under torchrun writes), rank-<k>.json[.gz] (as Holistic Trace "
                        "Analysis reads), <worker>.<time>.pt.trace.json[.gz] (as tensorboard_trace_handler "
                        "writes), traces that record their rank (distributedInfo) or trace.json.gz")
    missing = sorted(set(range(max(files) + 1)) - set(files))
    if missing:
        raise UserError(f"{folder}: no trace for rank {_list(missing)} (found rank {_list(sorted(files))}); every "
                        f"rank 0..{max(files)} writes rank-<k>.trace.json.gz: copy the missing ones here or "
                        "profile again")
    return files


def summarize_path(path, top=None, unprofiled_ms=None):
    """The summary of a trace file, or of a profile folder (summarize_folder). `unprofiled_ms`: the user's
    own unprofiled ms/step (summary.summarize)."""
    if os.path.isdir(path):
        return summarize_folder(path, top, unprofiled_ms)
    return summary.summarize(summary.load_trace(path), top, unprofiled_ms)


def summarize_folder(folder, top=None, unprofiled_ms=None):
    """The one result for all ranks of a profile folder (module docstring); a single-process folder's trace
    summary as is. Traces are read one at a time. `top`: as summary.summarize (rank 0's kernel rows)."""
    files = rank_files(folder)
    if files is None:
        single = next((os.path.join(folder, n) for n in SINGLE if os.path.exists(os.path.join(folder, n))), None)
        if single is None:
            names = sorted(os.listdir(folder))
            workers, older = worker_files(names)
            if workers:
                return _summarize_workers(folder, workers, older, top, unprofiled_ms)
            return _summarize_workers(folder, other_files(names), 0, top, unprofiled_ms, named=False)
        return summary.summarize(summary.load_trace(single), top, unprofiled_ms)
    sums, rows = [], []
    for k, path in sorted(files.items()):
        trace = summary.load_trace(path)
        _check_meta(trace, k, len(files), path)
        s = summary.summarize(trace, unprofiled_ms=unprofiled_ms)
        sums.append(s)
        rows.append(rank_row(k, trace, s))
        del trace
    return combine(sums, rows, top)


# ---------------------------------------------------------------------------------------------------------
# A folder of tensorboard_trace_handler files
# ---------------------------------------------------------------------------------------------------------

def worker_files(names):
    """({worker: file name}, the number of older files left out): the latest tensorboard_trace_handler file
    (`<worker>.<time_ns>.pt.trace.json[.gz]`) of each worker among `names`, workers in name order."""
    latest, older = {}, 0
    for name in names:
        m = WORKER_FILE.match(name)
        if not m:
            continue
        worker, ns = m.group(1), int(m.group(2))
        older += worker in latest
        if worker not in latest or ns > latest[worker][0]:
            latest[worker] = (ns, name)
    return {w: latest[w][1] for w in sorted(latest)}, older


def other_files(names):
    """{name: file name} of the Chrome traces among `names` named neither rank-<k> nor as
    tensorboard_trace_handler names them (`trace_rank0.json`, `node1_gpu0.json.gz`): read only by the rank each
    records (`_recorded_rank`), whatever the name."""
    return {n.split(".json")[0]: n for n in names if n.endswith((".json", ".json.gz"))
            and not RANK_FILE.match(n) and not WORKER_FILE.match(n) and not n.startswith("summary.")}


def worker_ranks(workers, recorded):
    """(each worker's rank, how they were found: None when the traces recorded them). `workers`: the worker
    names; `recorded`: the rank each one's trace records, or None. UserError when the recorded ranks leave
    one out."""
    n = len(workers)
    if all(num(r) for r in recorded):
        twice = sorted({r for r in recorded if recorded.count(r) > 1})
        if twice:
            raise UserError(f"several workers' traces record rank {_list(twice)}: files of different runs; keep "
                            "one run's files")
        missing = sorted(set(range(max(recorded) + 1)) - set(recorded))
        if missing:
            raise UserError(f"no trace for rank {_list(missing)} (the traces record rank {_list(sorted(recorded))}); "
                            "copy every rank's trace here or profile again")
        return list(recorded), None
    numbers = [LAST_NUMBER.search(w) for w in workers]
    values = [int(m.group(1)) for m in numbers] if all(numbers) else []
    if sorted(values) == list(range(n)):
        return values, "ranks read from the worker names (the traces record none)"
    if len(set(values)) == n:
        return _order(values), ("ranks numbered in the order of the numbers in the worker names (not 0..N-1: "
                                "process ids?), the traces recording none" + SEPARATE_RUNS)
    return _order(workers), "ranks numbered in file-name order: neither the traces nor the names give them" \
        + SEPARATE_RUNS


def _order(keys):
    """Each key's position when the keys are sorted."""
    by = sorted(range(len(keys)), key=lambda i: keys[i])
    return [by.index(i) for i in range(len(keys))]


def _recorded_rank(trace):
    """(rank, world size) the trace records: kineto's `distributedInfo` (torch.distributed initialized), else
    this capture's metadata; None where absent."""
    for key in ("distributedInfo", summary.META_KEY):
        info = trace.get(key)
        if isinstance(info, dict) and num(info.get("rank")):
            return info["rank"], info.get("world_size") if num(info.get("world_size")) else None
    return None, None


def _summarize_workers(folder, workers, older, top, unprofiled_ms, named=True):
    """The result of a folder of tensorboard_trace_handler files (module docstring), or (named False) of traces
    named otherwise, which must record their ranks; one worker's: its summary."""
    sums, rows, recorded, worlds = [], [], [], set()
    for name in workers.values():
        trace = summary.load_trace(os.path.join(folder, name))
        rank, world = _recorded_rank(trace)
        if not named and rank is None and len(workers) > 1:
            raise UserError(f"{folder}: {name} records no rank (no distributedInfo.rank); name each rank's trace "
                            "rank-<k>.json, or give `research profile` one file")
        recorded.append(rank)
        worlds.add(world)
        sums.append(summary.summarize(trace, unprofiled_ms=unprofiled_ms))
        rows.append(rank_row(rank, trace, sums[-1]))
        del trace
    notes = [f"{older} older tensorboard_trace_handler file{'s' * (older > 1)} of the same worker{'s' * (older > 1)} "
             "left out: each worker's latest is read"] if older else []
    if len(sums) == 1:
        rank, world = recorded[0], next(iter(worlds))
        one = [f"the folder holds one worker's trace: rank {rank} of {world}"] if world and world > 1 else []
        return _with_notes(sums[0], notes + one, top)
    try:
        ranks, how = worker_ranks(list(workers), recorded)
    except UserError as e:
        raise UserError(f"{folder}: {e}") from None
    world = max((w for w in worlds if w and w != len(sums)), default=None)
    if world:
        raise UserError(f"{folder}: the run had {world} ranks (recorded in the traces) but the folder holds "
                        f"{len(sums)} workers' traces; copy every rank's trace here or profile again")
    for row, rank in zip(rows, ranks):
        row["rank"] = rank
    order = sorted(range(len(ranks)), key=lambda i: ranks[i])
    result = combine([sums[i] for i in order], [rows[i] for i in order], top)
    return _with_notes(result, notes + ([how] if how else []), top)


def _with_notes(result, notes, top):
    result = dict(result, notes=list(result.get("notes") or []) + notes)
    if top is not None:
        result["kernels"] = result["kernels"][:max(0, top)]
    return result


def _check_meta(trace, k, n, path):
    meta = trace.get(summary.META_KEY) if isinstance(trace.get(summary.META_KEY), dict) else {}
    world, rank = meta.get("world_size"), meta.get("rank")
    if num(rank) and rank != k:
        raise UserError(f"{path}: holds rank {rank}'s trace ({summary.META_KEY}.rank), not rank {k}'s; name each "
                        "trace after its own rank")
    if num(world) and world != n:
        raise UserError(f"{path}: the run had {world} ranks ({summary.META_KEY}.world_size) but the folder holds "
                        f"{n} traces; copy every rank's trace here or profile again")


# ---------------------------------------------------------------------------------------------------------
# One rank: compute, communication, exposed, idle
# ---------------------------------------------------------------------------------------------------------

def rank_row(rank, trace, s):
    """The rank's row: per-step ms of compute, communication, exposed communication and idle; its collectives."""
    ix = index(trace["traceEvents"])
    per_step, windows, _, _ = irregular.split(ix, {})  # the steps the summary reads: the one-offs left out
    if s["kind"] == "cuda":
        comm = [[(e["ts"], e["ts"] + e["dur"]) for e, _ in evs if _comm_kernel(e)] for evs in per_step]
        work = [[(e["ts"], e["ts"] + e["dur"]) for e, _ in evs if not _comm_kernel(e)] for evs in per_step]
        events = [e for evs in per_step for e, _ in evs if _comm_kernel(e)]
    else:
        windows = [(start, end) for start, end, _ in ix.steps]
        comm_evs = [e for e in ix.cpu_ops if is_communication(str(e.get("name", "")))] + _annotations(trace)
        everywhere = _cpu_compute(ix.cpu_ops, comm_evs)
        comm_all = merge([(e["ts"], e["ts"] + e["dur"]) for e in comm_evs])
        comm = [_clip(comm_all, w) for w in windows]
        work = [_clip(everywhere, w) for w in windows]
        named = [e for e in comm_evs if str(e.get("name", "")).startswith(("gloo:", "nccl:"))] or comm_evs
        events = [e for e in named if any(a <= e["ts"] <= b for a, b in windows)]
    n = len(windows)
    comm_us = sum(union_length(c) for c in comm)
    compute_us = sum(union_length(w) for w in work)
    busy_us = sum(union_length(c + w) for c, w in zip(comm, work))
    step = s["step_ms"]
    exposed = (busy_us - compute_us) / n / 1e3
    compute = compute_us / n / 1e3
    return {"rank": rank, "step_ms": step, "compute_ms": _r(compute), "comm_ms": _r(comm_us / n / 1e3),
            "exposed_comm_ms": _r(exposed), "idle_ms": _r(max(0.0, step - compute - exposed)),
            "work_ms": _r(step - exposed), "categories": s["categories"], "collectives": _collectives(events, n),
            "unprofiled_step_ms": s.get("unprofiled_step_ms")}


def _comm_kernel(e):
    return is_communication(str(e.get("name", "")), device=True)


def _annotations(trace):
    """The CPU annotations that are collectives (gloo's `gloo:all_reduce`, on its worker threads)."""
    return [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
            and e.get("cat") == "user_annotation" and num(e.get("ts")) and num(e.get("dur"))
            and is_communication(str(e.get("name", "")))]


def _cpu_compute(ops, comm_evs):
    """The union over threads of each thread's operator time less the collectives on that same thread."""
    comm = by_thread(comm_evs)
    out = []
    for key, evs in by_thread([e for e in ops if num(e.get("ts")) and num(e.get("dur"))]).items():
        busy = merge([(e["ts"], e["ts"] + e["dur"]) for e in evs])
        out += _minus(busy, merge([(e["ts"], e["ts"] + e["dur"]) for e in comm.get(key, [])]))
    return merge(out)


def _minus(a, b):
    """Merged intervals a less merged intervals b."""
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        i, t = j, start
        while i < len(b) and b[i][0] < end:
            if b[i][0] > t:
                out.append((t, b[i][0]))
            t = max(t, b[i][1])
            i += 1
        if t < end:
            out.append((t, end))
    return out


def _clip(intervals, window):
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _collectives(events, n):
    """[{name, bytes, calls_per_step, ms_per_step}] by name and size, most time first (bytes None: not recorded)."""
    groups = {}
    for e in events:
        key = (str(e.get("name", "")).split("(")[0], _bytes(e))
        g = groups.setdefault(key, [0, 0.0])
        g[0] += 1
        g[1] += e["dur"]
    return [{"name": name, "bytes": nbytes, "calls_per_step": _r(c / n), "ms_per_step": _r(us / n / 1e3)}
            for (name, nbytes), (c, us) in sorted(groups.items(), key=lambda kv: -kv[1][1])]


def _bytes(e):
    """A collective's message size in bytes: NCCL's `In msg nelems` and `dtype`, else the recorded input shape."""
    args = e.get("args") or {}
    nelems, dtype = args.get("In msg nelems"), args.get("dtype")
    if not num(nelems):
        dims, types = args.get("Input Dims"), args.get("Input type")
        if not (isinstance(dims, list) and dims and isinstance(types, list) and types):
            return None
        nelems, dtype = _elements(dims[0]), types[0]
    size = DTYPE_BYTES.get(str(dtype).lower())
    return int(nelems * size) if num(nelems) and size else None


def _elements(dims):
    if not isinstance(dims, list) or not all(num(d) for d in dims):
        return None
    total = 1
    for d in dims:
        total *= d
    return total


# ---------------------------------------------------------------------------------------------------------
# All ranks: the result, the skew, the findings
# ---------------------------------------------------------------------------------------------------------

def combine(sums, rows, top=None):
    """Rank 0's summary with the ranks' rows, their skew and the two findings (module docstring)."""
    result = dict(sums[0], world_size=len(rows), report_rank=rows[0]["rank"], ranks=rows)
    if top is not None:
        result["kernels"] = result["kernels"][:max(0, top)]
    result["skew"] = skew(sums, rows)
    ctx = {"step": result["step_ms"]}
    note = profiler_note(rows, result["skew"], result["step_ms"])
    result["notes"] = list(result.get("notes") or []) + ([note] if note else [])
    new = [f for f in (exposed_communication(rows, ctx), straggler(rows, result["skew"], ctx)) if f]
    old = result.get("findings") or []
    keep = [f for f in old if f["kind"] not in ("profiler_overhead", "exposed_communication")]  # rank 0's own
    found = sorted(keep + new, key=lambda f: -f["ms_per_step"])  # exposed communication: the ranks' together
    result["findings"] = found + [f for f in old if f["kind"] == "profiler_overhead"]
    return result


def skew(sums, rows):
    """Slowest vs fastest step; the rank that works most (the straggler) vs the one that works least, and the
    parts of its step (budget categories, idle) and the operators that grew."""
    by_step = sorted(rows, key=lambda r: (r["step_ms"], r["rank"]))
    by_work = sorted(rows, key=lambda r: (r["work_ms"], r["rank"]))
    slow, fast = by_work[-1], by_work[0]
    parts = [c for c in CATEGORIES if c != "communication"]
    grew = {p: (slow["categories"].get(p) or 0.0) - (fast["categories"].get(p) or 0.0) for p in parts}
    grew["idle"] = slow["idle_ms"] - fast["idle_ms"]
    kernels = [{k["raw_name"]: k["ms_per_step"] for k in sums[rows.index(r)]["kernels"]
                if k["category"] != "communication"} for r in (slow, fast)]
    ops = {name: ms - kernels[1].get(name, 0.0) for name, ms in kernels[0].items()}
    unprofiled = [r.get("unprofiled_step_ms") for r in rows]
    known = all(num(u) and u > 0 for u in unprofiled)
    return {"slowest": by_step[-1]["rank"], "fastest": by_step[0]["rank"],
            "step_spread_ms": _r(by_step[-1]["step_ms"] - by_step[0]["step_ms"]),
            "straggler": slow["rank"], "least_work": fast["rank"], "work_spread_ms": _r(slow["work_ms"] - fast["work_ms"]),
            "profiler_ms": _r(profiler_cost(slow)),
            "unprofiled_spread_ms": _r(max(unprofiled) - min(unprofiled)) if known else None,
            "grew": [{"part": p, "ms": _r(ms)} for p, ms in sorted(grew.items(), key=lambda kv: -kv[1]) if ms > 0],
            "ops": [{"name": o, "ms": _r(ms)} for o, ms in sorted(ops.items(), key=lambda kv: -kv[1])[:SHOWN]
                    if ms > 0]}


def profiler_cost(row):
    """ms/step the profiler added to a rank's step: its profiled step over its unprofiled one (0 when not
    measured). Under DDP every rank's step is the slowest rank's, so a rank the profiler slows (its host
    sampler, its records: 34.5 ms, 77% of a Lightning DDP step on 2 H100s) shows as a straggler while the
    unprofiled steps agree."""
    u = row.get("unprofiled_step_ms")
    return max(0.0, row["step_ms"] - u) if num(u) and u > 0 else 0.0


def claimable(sk):
    """The straggler's excess work that is not the profiler's own cost (skew's work spread less profiler_ms)."""
    return max(0.0, (sk["work_spread_ms"] or 0.0) - (sk.get("profiler_ms") or 0.0))


def profiler_note(rows, sk, step):
    """The note when the profiled skew is the profiler's own cost, so no straggler is claimed; else None."""
    if sk["work_spread_ms"] < STRAGGLER_SHARE * step or claimable(sk) >= STRAGGLER_SHARE * step:
        return None
    slow = next(r for r in rows if r["rank"] == sk["straggler"])
    agree = (f"; the ranks' unprofiled steps agree within {sk['unprofiled_spread_ms']:.2f} ms"
             if sk.get("unprofiled_spread_ms") is not None and sk["unprofiled_spread_ms"] < STRAGGLER_SHARE * step
             else "")
    return (f"rank {slow['rank']} works {sk['work_spread_ms']:.2f} ms/step more than rank {sk['least_work']} in the "
            f"profiled steps, but its profiled step exceeds its unprofiled one by {sk['profiler_ms']:.2f} ms (the "
            f"profiler's own host cost){agree}: no straggler is claimed from the profiled skew")


@rule("exposed_communication", needs=("device", "ranks"))
def exposed_communication(rows, ctx):
    """The communication no rank hides: the least exposed time over the ranks (the rest, on the others, is
    waiting for a slower rank: the straggler finding's)."""
    least = min(rows, key=lambda r: r["exposed_comm_ms"])
    if least["exposed_comm_ms"] <= 0:
        return None
    per_rank = ", ".join(f"rank {r['rank']} {r['exposed_comm_ms']:.2f} of {r['comm_ms']:.2f}" for r in rows)
    evidence = (f"exposed communication ms/step (of the time collectives run): {per_rank}; every rank pays "
                f"{least['exposed_comm_ms']:.2f} (rank {least['rank']}, the last to join the collectives)"
                + _sizes(rows[0]))
    return finding("exposed_communication", least["exposed_comm_ms"], ctx, evidence,
                   "send fewer, larger gradient all-reduces and start them during backward: a larger DDP "
                   "bucket_cap_mb, gradient sync on the last micro-batch only (no_sync), bf16 gradients "
                   "(DDP comm hook bf16_compress_hook), compiled DDP (torch.compile) for more overlap")


def _sizes(row):
    colls = row["collectives"]
    if not colls:
        return ""
    calls = sum(c["calls_per_step"] for c in colls)
    sizes = [c["bytes"] for c in colls if c["bytes"]]
    text = f"; rank {row['rank']} runs {calls:g} collectives/step: " + ", ".join(
        f"{c['name']} x{c['calls_per_step']:g}" + (f" of {_mb(c['bytes'])}" if c["bytes"] else "")
        for c in colls[:SHOWN]) + (" ..." if len(colls) > SHOWN else "")
    if sizes:
        total = sum(c["bytes"] * c["calls_per_step"] for c in colls if c["bytes"])
        text += f" ({_mb(total)}/step in all)"
    return text


@rule("straggler", needs=("device", "ranks"))
def straggler(rows, sk, ctx):
    """One rank works longer per step than another (step - exposed communication) by STRAGGLER_SHARE of the
    step or more, not counting the profiler's own cost on it (`claimable`): the others wait for it in every
    collective. Gain: that excess over the least-working rank."""
    excess = claimable(sk)
    if len(rows) < 2 or excess < STRAGGLER_SHARE * ctx["step"]:
        return None
    slow, fast = (next(r for r in rows if r["rank"] == k) for k in (sk["straggler"], sk["least_work"]))
    grew = ", ".join(f"{g['part']} +{g['ms']:.2f}" for g in sk["grew"][:SHOWN]) or "nothing by category"
    ops = ", ".join(f"`{o['name'][:60]}` +{o['ms']:.2f}" for o in sk["ops"])
    evidence = (f"rank {slow['rank']} works {excess:.2f} ms/step more than rank {fast['rank']} (step - exposed "
                f"communication: {slow['work_ms']:.2f} vs {fast['work_ms']:.2f} ms); the others wait for it in "
                f"their collectives (exposed communication: rank {fast['rank']} {fast['exposed_comm_ms']:.2f}, "
                f"rank {slow['rank']} {slow['exposed_comm_ms']:.2f} ms/step); grew on rank {slow['rank']}, ms/step: "
                f"{grew}" + (f"; operators: {ops}" if ops else "")
                + (f"; {sk['profiler_ms']:.2f} ms/step of the spread is the profiler's own (rank {slow['rank']}'s "
                   f"profiled step over its unprofiled one), not claimed" if sk.get("profiler_ms") else ""))
    return finding("straggler", excess, ctx, evidence,
                   f"give every rank the same work per step: the same batch shapes, no work on rank "
                   f"{slow['rank']} alone inside the step (logging, eval, checkpoints go outside it); with the "
                   "same work, its device or host is slower (shared, throttled: see its device state)")


def _r(x):
    return None if x is None else round(float(x), 4)


def _mb(nbytes):
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} KB"


def _list(ks):
    return ", ".join(map(str, ks))
