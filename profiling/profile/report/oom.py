"""An out-of-memory run that explains itself (issue #35): the limit it hit, what it was allocating and from
which line, the allocator's split at the failure, and the largest micro-batch that could fit. Pure Python, no
torch: the trainer's runner gathers the facts (`Run.out_of_memory` in profiling/runner.py), this module reads
them.

    info = explain(str(error), micro_batch=128, fixed_mb=6400.0, where="train.py:402 loss.backward()")
    print(message(info, knob="DEVICE_BATCH_SIZE"))    # the run's FAIL line
    run["oom"] = info                                # run.json (docs/memory.md)

The largest micro-batch that fits, estimated from the failure itself: memory = fixed + micro_batch x
per_sequence, where fixed is what does not grow with the batch (parameters, gradients and optimizer state,
measured from the tensors, and the memory outside PyTorch's allocator: the CUDA context) and per_sequence is at
least (allocated + reserved-but-unallocated + the failed request - fixed) / micro_batch: the step needed all of
that at once, and the allocator's reserved blocks it could not use for the request (fragmentation) are taken
to grow with the batch like the rest. So the estimate is below the micro-batch that failed. The per-sequence
figure is a lower bound (the step's peak may lie later than the failure), so the micro-batch it gives is an
upper bound: `max_micro_batch` is the most that could fit, `recommended_micro_batch` that less MARGIN (for
fragmentation and the allocator's rounding), then the largest divisor of the sequences per step on this rank
(train.py refuses any other), with `grad_accum_steps`: gpu_memory.advice, the profile's `fits` function too.

A profile of the same model that fitted says more (its memory step measured the peak by category:
gpu_memory.fits): given as `profiled`, its prediction is named first, unless it predicted that the failing
micro-batch fits. A run that fit this very micro-batch with this model (a kept run's profile, or the last
profile: `kept_fit`) turns the failure into a regression: `fitted` has both figures, the growth by category
and by line (profiling/runner.py finds the run; capture/memory.py held_now measures what is held now).
"""
import os
import re

from profiling.profile.tables.gpu_memory import MARGIN, advice
from profiling.profile.trace.allocator import generated

UNITS = {"B": 1 / 2**20, "bytes": 1 / 2**20, "KiB": 1 / 2**10, "MiB": 1.0, "GiB": 2**10, "TiB": 2**20}

# The figures of torch's CUDA out-of-memory message (c10/cuda/CUDACachingAllocator.cpp), each optional.
_SIZE = r"([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)"
FIGURES = {
    "requested_mb": r"Tried to allocate " + _SIZE,
    "device_mb": r"total capacity of " + _SIZE,
    "free_mb": r"of which " + _SIZE + r" is free",
    "process_mb": r"this process has " + _SIZE + r" memory in use",
    "cap_mb": _SIZE + r" allowed",
    "allocated_mb": _SIZE + r" is allocated by PyTorch",
    "reserved_unallocated_mb": _SIZE + r" is reserved by PyTorch but unallocated",
}


def user_line(frames, show=str):
    """`file:line code` of the innermost frame of the user's own code in a traceback's frames (outermost first:
    (filename, line number, code)), skipping installed packages and torch; a frame in a compiled graph's
    generated code is named as that graph, called from the user's line outside it. show: a path as printed.
    None when no frame is the user's."""
    inner = [f for f in frames if f"{os.sep}torch{os.sep}" not in f[0] and "site-packages" not in f[0]]
    if not inner:
        return None
    caller = next((f for f in reversed(inner) if not generated(f[0])), None)
    line = None if caller is None else f"{show(caller[0])}:{caller[1]} {(caller[2] or '').strip()}".strip()
    if not generated(inner[-1][0]):
        return line
    graph = "a compiled graph (Inductor's generated code)"
    return graph if line is None else f"{graph}, called from {line}"


def parse(text):
    """{figure: MB or None} from torch's out-of-memory message (FIGURES); a figure it does not state is None."""
    out = {}
    for key, pattern in FIGURES.items():
        m = re.search(pattern, text)
        out[key] = round(float(m.group(1)) * UNITS[m.group(2)], 1) if m else None
    return out


def explain(text, *, micro_batch=None, fixed_mb=None, where=None, cap_mb=None, device_mb=None, profiled=None,
            sequences=None, before=None, now=None):
    """What the failure shows, as plain data (run.json's `oom`): the message's figures (parse), the limit hit
    (`cap`: a memory fraction the process set, else `device`), `where` (the innermost line of the user's code),
    and the micro-batch estimate of the module docstring where the figures allow it.

    fixed_mb: the parameters, gradients and optimizer state at the failure, measured (None: unknown);
    cap_mb, device_mb: what the process itself read (torch's per-process fraction, the device's total), used
    where the message lacks them; profiled: {folder, fits} of the last profile of this model, or None;
    sequences: the sequences per optimizer step on this rank (the recommendation divides it:
    gpu_memory.advice, as the profile's `fits`); before, now: a run that fit this micro-batch and what is
    held now (`fitted`)."""
    info = parse(text)
    info["device_mb"] = info["device_mb"] or device_mb
    info["cap_mb"] = info["cap_mb"] or cap_mb
    limit = info["cap_mb"] or info["device_mb"]
    info.update(limit="cap" if info["cap_mb"] else ("device" if info["device_mb"] else None), limit_mb=limit,
                where=where, micro_batch=micro_batch, fixed_mb=None if fixed_mb is None else round(fixed_mb, 1),
                max_micro_batch=None, recommended_micro_batch=None, profiled=_profiled(profiled, sequences),
                fitted=fitted(before, now, info["allocated_mb"], info["requested_mb"]) if before else None)
    if info["fitted"] or (info["profiled"] and micro_batch and info["profiled"]["fits"]["max_micro_batch"]
                          >= micro_batch):  # the profile's prediction failed here: it no longer holds
        info["profiled"] = None
    allocated, requested = info["allocated_mb"], info["requested_mb"]
    if None in (limit, allocated, requested, fixed_mb) or not micro_batch:
        return info
    outside = max(0.0, (info["process_mb"] or 0.0) - allocated - (info["reserved_unallocated_mb"] or 0.0))
    per_sequence = (allocated + (info["reserved_unallocated_mb"] or 0.0) + requested - fixed_mb) / micro_batch
    room = limit - outside - fixed_mb
    if per_sequence <= 0 or room <= 0:
        return info
    info.update(outside_mb=round(outside, 1), per_sequence_mb=round(per_sequence, 1),
                **advice(int(room / per_sequence), sequences))
    return info


def _profiled(profiled, sequences):
    """The last profile's prediction with its recommendation made again for today's sequences per step (the
    profile may have run with another TOTAL_BATCH_SIZE): the same `advice` as the failure's own."""
    if not profiled or not (profiled.get("fits") or {}).get("max_micro_batch"):
        return None
    fits = profiled["fits"]
    return dict(profiled, fits=dict(fits, **advice(fits["max_micro_batch"], sequences,
                                                   fits.get("margin_percent", 100 * MARGIN) / 100)))


def fitted(before, now, allocated_mb, requested_mb):
    """A run that fit this micro-batch against this failure: its peak and what is held now, the growth by
    category and, where the failure's snapshot named lines, by line. before: {source, micro_batch, peak_mb,
    categories: {gpu_memory's categories}, lines: [{where, mb}]}; now: {categories: {parameters, gradients,
    optimizer_state: MB measured}, lines: [{where, mb}] or None, lines_missing: why}. Pure."""
    now = now or {}
    held = allocated_mb if allocated_mb is not None else None
    cats = {k: v for k, v in (now.get("categories") or {}).items() if v is not None}
    if held is not None:  # the rest of what is allocated, and the request it failed on, grow with the batch
        cats[REST] = max(0.0, held - sum(cats.values())) + (requested_mb or 0.0)
    kept = dict(before.get("categories") or {})
    kept_rest = sum(kept.pop(k, 0.0) for k in REST_OF)
    if kept:
        kept[REST] = kept_rest
    growth = [{"name": k, "before_mb": round(kept.get(k, 0.0), 1), "now_mb": round(v, 1),
               "change_mb": round(v - kept.get(k, 0.0), 1)} for k, v in cats.items() if k in kept]
    out = {"source": before.get("source"), "folder": before.get("folder"),
           "micro_batch": before.get("micro_batch"), "peak_mb": before.get("peak_mb"), "held_mb": held,
           "requested_mb": requested_mb,
           "growth_mb": None if held is None or before.get("peak_mb") is None
           else round(held + (requested_mb or 0.0) - before["peak_mb"], 1),
           "categories": sorted(growth, key=lambda g: -g["change_mb"]),
           "lines": line_growth(before.get("lines") or [], now.get("lines")), "lines_missing": None}
    if out["lines"] is None:
        out["lines_missing"] = now.get("lines_missing") or LINES_MISSING
    return out


def measured_at(record):
    """The micro-batch a profile's memory record was measured at (its `micro_batch`; older summaries: the
    `fits` basis, "measured at micro-batch 128"), None when it does not say."""
    record = record or {}
    if record.get("micro_batch"):
        return record["micro_batch"]
    m = re.search(r"measured at micro-batch (\d+)", (record.get("fits") or {}).get("basis") or "")
    return int(m.group(1)) if m else None


def kept_fit(candidates, micro_batch, parameters_mb):
    """The first candidate (source, folder, its profile's summary) whose memory step measured this model
    (parameters' MB within 1%) at this micro-batch, as `fitted`'s `before`; None when none did."""
    for source, folder, summary in candidates:
        g = (summary or {}).get("gpu_memory") or {}
        measured = (g.get("categories") or {}).get("parameters")
        if (micro_batch and measured_at(g) == micro_batch and g.get("peak_allocated_mb") and parameters_mb
                and measured and abs(measured / parameters_mb - 1) <= 0.01):
            return {"source": source, "folder": folder, "micro_batch": micro_batch,
                    "peak_mb": g["peak_allocated_mb"], "categories": g["categories"],
                    "lines": g.get("lines") or []}
    return None


REST = "activations, temporaries and buffers"   # what the failure cannot split (no saved-tensor tags there)
REST_OF = ("activations", "temporaries", "other_persistent")
HISTORY_ENV = "AUTORESEARCH_MEMORY_HISTORY"
LINES_MISSING = (f"run again with {HISTORY_ENV}=1 for the lines holding it (the allocator records each "
                 "allocation's Python line from the start; the failure's snapshot names them)")
MAX_GROWTH_LINES = 5


def _key(where):
    """A memory line's label without its folder or `(compiled graph)`: `train.py:122`, so the lines of a
    run in another checkout compare."""
    return str(where).split(" (")[0].rsplit("/", 1)[-1]


def line_growth(before, now):
    """[{where, before_mb, now_mb, change_mb}] of the lines whose memory grew most (now's labels), None when
    the failure named no lines."""
    if now is None:
        return None
    kept = {}
    for r in before:
        kept[_key(r["where"])] = kept.get(_key(r["where"]), 0.0) + r["mb"]
    rows = [{"where": r["where"], "before_mb": round(kept.get(_key(r["where"]), 0.0), 1), "now_mb": r["mb"],
             "change_mb": round(r["mb"] - kept.get(_key(r["where"]), 0.0), 1)} for r in now]
    return sorted(rows, key=lambda r: -r["change_mb"])[:MAX_GROWTH_LINES]


def message(info, knob="the micro-batch"):
    """The one paragraph an out-of-memory run prints: the limit, the request, the split, what could fit."""
    limit = ({"cap": "the process's memory cap (torch.cuda.set_per_process_memory_fraction)",
              "device": "the device's memory"}.get(info.get("limit"), "an unknown limit"))
    parts = [f"CUDA out of memory at {knob}={info.get('micro_batch')}: hit {limit}, "
             f"{_mb(info.get('limit_mb'))}, allocating {_mb(info.get('requested_mb'))}"
             + (f" at {info['where']}" if info.get("where") else "")]
    split = [f"allocated by PyTorch {_mb(info.get('allocated_mb'))}"]
    if info.get("fixed_mb") is not None:
        split.append(f"of which parameters, gradients and optimizer state {_mb(info['fixed_mb'])}")
    split.append(f"reserved but unallocated {_mb(info.get('reserved_unallocated_mb'))}")
    if info.get("outside_mb"):
        split.append(f"outside PyTorch (CUDA context) {_mb(info['outside_mb'])}")
    parts.append("at the failure: " + ", ".join(split))
    if info.get("fitted"):
        parts.append(_fitted(info["fitted"], knob))
    fits = (info.get("profiled") or {}).get("fits")
    if fits:  # measured at the peak of a run that fitted: named first, and its value is the one to try
        parts.append(f"the last profile of this model ({info['profiled']['folder']}) predicts at most "
                     f"{fits['max_micro_batch']} fit: try {knob}={fits['recommended_micro_batch']} "
                     f"({_accumulation(fits)}{fits['margin_percent']}% margin)")
    most = info.get("max_micro_batch")
    if most is not None and most >= 1:
        bound = (f"{'from this failure, ' if fits else ''}at most {most} sequences per micro-batch can fit (an "
                 f"upper bound: {_mb(info['per_sequence_mb'])} or more each)")
        parts.append(bound if fits else f"{bound}; try {knob}={info['recommended_micro_batch']} "
                     f"({_accumulation(info)}{100 * MARGIN:.0f}% margin)")
    elif most is not None:
        parts.append(f"even one sequence needs about {_mb(info['per_sequence_mb'])} beside "
                     f"{_mb(info['fixed_mb'])} of weights and optimizer state: make the model smaller")
    elif not fits:
        parts.append(f"lower {knob} (the figures to estimate what fits are missing)")
    return "; ".join(parts)


def _mb(x):
    return "?" if x is None else f"{x:,.0f} MB"


def _accumulation(advised):
    """`gradient accumulation 2, ` where the recommendation divides a known number of sequences per step."""
    n = advised.get("grad_accum_steps")
    if not n:
        return ""
    return f"gradient accumulation {n} for the {advised['sequences_per_step']:,} sequences per step, "


def _fitted(f, knob):
    """The clause on a run that fit this micro-batch: both figures, what grew by category and by line."""
    grew = ", ".join(f"{c['name'].replace('_', ' ')} {c['change_mb']:+,.0f} MB" for c in f["categories"]
                     if abs(c["change_mb"]) >= 1)
    text = (f"{f['source']} fit {knob}={f['micro_batch']} with a peak of {_mb(f['peak_mb'])} allocated; "
            f"this run held {_mb(f['held_mb'])} and asked for {_mb(f['requested_mb'])} more"
            + (f" ({f['growth_mb']:+,.0f} MB)" if f.get("growth_mb") is not None else "")
            + (f": {grew}" if grew else ""))
    if f.get("lines"):
        text += "; grew most at " + ", ".join(
            f"`{r['where']}` {r['change_mb']:+,.0f} MB ({r['now_mb']:,.0f} MB now)"
            for r in f["lines"] if r["change_mb"] > 0)
    elif f.get("lines_missing"):
        text += f"; {f['lines_missing']}"
    return text
