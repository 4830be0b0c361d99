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
fragmentation and the allocator's rounding), rounded down to a multiple of 8 (gpu_memory.recommend).

A profile of the same model that fitted says more (its memory step measured the peak by category:
gpu_memory.fits): given as `profiled`, its prediction is named first.
"""
import os
import re

from profiling.profile.gpu_memory import MARGIN, generated, recommend

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


def explain(text, *, micro_batch=None, fixed_mb=None, where=None, cap_mb=None, device_mb=None, profiled=None):
    """What the failure shows, as plain data (run.json's `oom`): the message's figures (parse), the limit hit
    (`cap`: a memory fraction the process set, else `device`), `where` (the innermost line of the user's code),
    and the micro-batch estimate of the module docstring where the figures allow it.

    fixed_mb: the parameters, gradients and optimizer state at the failure, measured (None: unknown);
    cap_mb, device_mb: what the process itself read (torch's per-process fraction, the device's total), used
    where the message lacks them; profiled: {folder, fits} of the last profile of this model, or None."""
    info = parse(text)
    info["device_mb"] = info["device_mb"] or device_mb
    info["cap_mb"] = info["cap_mb"] or cap_mb
    limit = info["cap_mb"] or info["device_mb"]
    info.update(limit="cap" if info["cap_mb"] else ("device" if info["device_mb"] else None), limit_mb=limit,
                where=where, micro_batch=micro_batch, fixed_mb=None if fixed_mb is None else round(fixed_mb, 1),
                max_micro_batch=None, recommended_micro_batch=None, profiled=profiled)
    allocated, requested = info["allocated_mb"], info["requested_mb"]
    if None in (limit, allocated, requested, fixed_mb) or not micro_batch:
        return info
    outside = max(0.0, (info["process_mb"] or 0.0) - allocated - (info["reserved_unallocated_mb"] or 0.0))
    per_sequence = (allocated + (info["reserved_unallocated_mb"] or 0.0) + requested - fixed_mb) / micro_batch
    room = limit - outside - fixed_mb
    if per_sequence <= 0 or room <= 0:
        return info
    most = int(room / per_sequence)
    info.update(outside_mb=round(outside, 1), per_sequence_mb=round(per_sequence, 1), max_micro_batch=most,
                recommended_micro_batch=recommend(most))
    return info


def message(info, knob="the micro-batch"):
    """The one paragraph an out-of-memory run prints: the limit, the request, the split, what could fit."""
    def mb(x):
        return "?" if x is None else f"{x:,.0f} MB"

    limit = ({"cap": "the process's memory cap (torch.cuda.set_per_process_memory_fraction)",
              "device": "the device's memory"}.get(info.get("limit"), "an unknown limit"))
    parts = [f"CUDA out of memory at {knob}={info.get('micro_batch')}: hit {limit}, {mb(info.get('limit_mb'))}, "
             f"allocating {mb(info.get('requested_mb'))}" + (f" at {info['where']}" if info.get("where") else "")]
    split = [f"allocated by PyTorch {mb(info.get('allocated_mb'))}"]
    if info.get("fixed_mb") is not None:
        split.append(f"of which parameters, gradients and optimizer state {mb(info['fixed_mb'])}")
    split.append(f"reserved but unallocated {mb(info.get('reserved_unallocated_mb'))}")
    if info.get("outside_mb"):
        split.append(f"outside PyTorch (CUDA context) {mb(info['outside_mb'])}")
    parts.append("at the failure: " + ", ".join(split))
    fits = (info.get("profiled") or {}).get("fits")
    if fits:  # measured at the peak of a run that fitted: named first, and its value is the one to try
        parts.append(f"the last profile of this model ({info['profiled']['folder']}) predicts at most "
                     f"{fits['max_micro_batch']} fit: try {knob}={fits['recommended_micro_batch']} "
                     f"({fits['margin_percent']}% margin)")
    most = info.get("max_micro_batch")
    if most is not None and most >= 1:
        bound = (f"{'from this failure, ' if fits else ''}at most {most} sequences per micro-batch can fit (an "
                 f"upper bound: {mb(info['per_sequence_mb'])} or more each)")
        parts.append(bound if fits else
                     f"{bound}; try {knob}={info['recommended_micro_batch']} ({100 * MARGIN:.0f}% margin)")
    elif most is not None:
        parts.append(f"even one sequence needs about {mb(info['per_sequence_mb'])} beside "
                     f"{mb(info['fixed_mb'])} of weights and optimizer state: make the model smaller")
    elif not fits:
        parts.append(f"lower {knob} (the figures to estimate what fits are missing)")
    return "; ".join(parts)
