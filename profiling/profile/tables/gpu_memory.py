"""Pure: what fits in GPU memory, from the memory step's record (profiling/profile/trace/allocator.py, #35).

    fits(record, micro_batch, sequences)  # the largest micro-batch predicted to fit, the one recommended (a
                                          # divisor of the sequences per step: what train.py accepts)
    max_depth(record, micro_batch, depth)
    advice(most, sequences)               # what the profile's `fits` and the out-of-memory line both say
"""
import math

FIXED = ("parameters", "gradients", "optimizer_state", "other_persistent")   # do not grow with the batch
SCALED = ("activations", "temporaries")                                     # grow with the batch
DEFAULT_OTHER_MB = 500.0   # the CUDA context and libraries outside the allocator, when not measured
MARGIN = 0.10              # the recommended micro-batch leaves this share of the predicted one
MULTIPLE = 8               # and rounded down to a multiple of this (where the step is unknown)


def _fixed_scaled(record):
    cats = record.get("categories") or {}
    return sum(cats.get(k, 0) for k in FIXED), sum(cats.get(k, 0) for k in SCALED)


def _model(record):
    """The `fits` model's inputs: (fixed MB, scaled MB, f, MB the allocator may reserve, the basis of the
    context figure), or None without the device's total or memory that grows with the batch."""
    if not record or not record.get("device_mb") or not record.get("categories"):
        return None
    fixed, scaled = _fixed_scaled(record)
    if scaled <= 0:
        return None
    other = record.get("other_mb")
    basis = "measured" if other is not None else f"assumed {DEFAULT_OTHER_MB:.0f} MB"
    room = record["device_mb"] - (other if other is not None else DEFAULT_OTHER_MB)
    return fixed, scaled, record.get("reserved_unallocated_mb", 0) / scaled, room, basis


def recommend(most, sequences=None, margin=MARGIN, multiple=MULTIPLE):
    """The micro-batch to try when `most` is the largest predicted to fit: `margin` less, then, with
    `sequences` (the sequences per optimizer step on one rank: TOTAL_BATCH_SIZE / MAX_SEQ_LEN / ranks), the
    largest divisor of it up to that (train.py exits 2 on any other), else rounded down to a multiple of
    `multiple` when that leaves one. At least 1 when anything fits, 0 when nothing does."""
    if most < 1:
        return 0
    lower = max(1, math.floor(most * (1 - margin)))
    if sequences:
        return next(b for b in range(min(lower, sequences), 0, -1) if sequences % b == 0)
    return lower - lower % multiple if lower >= multiple else min(most, lower)


def advice(most, sequences=None, margin=MARGIN, multiple=MULTIPLE):
    """What the profile's `fits` and the out-of-memory line both say (one function, so they agree):
    {max_micro_batch, recommended_micro_batch, margin_percent} and, with `sequences` (per step, one rank),
    the gradient accumulation the recommendation implies: {sequences_per_step, grad_accum_steps}."""
    out = {"max_micro_batch": most, "recommended_micro_batch": recommend(most, sequences, margin, multiple),
           "margin_percent": round(100 * margin)}
    if sequences and out["recommended_micro_batch"]:
        out.update(sequences_per_step=sequences, grad_accum_steps=sequences // out["recommended_micro_batch"])
    return out


def fits(record, micro_batch, sequences=None, margin=MARGIN, multiple=MULTIPLE):
    """The largest micro-batch predicted to fit, with no margin, and the one recommended (`advice`: with
    `sequences`, the sequences per optimizer step on this rank, a divisor of it, and the accumulation it
    implies); None without the device's total or a peak.

    The model: at micro-batch B the device must hold
        other + fixed + (1 + f) * B * per_sequence  <=  device_mb
    other: the memory outside the allocator (the CUDA context, other processes; measured, else 500 MB);
    fixed: parameters, gradients, optimizer state and other persistent blocks (they do not grow with B);
    per_sequence: (activations + temporaries) at the peak / today's B; f: the reserved-but-unallocated memory
    at the peak as a share of that scaled part (fragmentation and the allocator's cache, assumed to grow
    with it). Recommended: B less `margin`, then the largest divisor of `sequences` up to that (without it,
    rounded down to a multiple of `multiple`)."""
    inputs = _model(record)
    if inputs is None or not micro_batch:
        return None
    fixed, scaled, frag, room, basis = inputs
    per_seq = scaled / micro_batch
    best = max(0, math.floor((room - fixed) / ((1 + frag) * per_seq)))
    return dict(advice(best, sequences, margin, multiple), per_sequence_mb=round(per_seq, 1),
                fixed_mb=round(fixed, 1), fragmentation_percent=round(100 * frag, 1),
                basis=f"measured at micro-batch {micro_batch}; memory outside PyTorch {basis}; "
                      "reserved-unallocated assumed to grow with activations and temporaries")


def max_depth(record, micro_batch, depth, fixed_power=1.0, scaled_power=1.0, limit=4):
    """The largest depth predicted to fit at today's micro-batch, up to `limit` x today's: fixed memory
    (parameters, gradients, optimizer state) taken to grow as (depth'/depth)^fixed_power, activations and
    temporaries as (depth'/depth)^scaled_power, in the `fits` model. Proportional (1, 1) for a model of fixed
    width; train.py widens with depth (width = DEPTH x ASPECT_RATIO), so its layers' weights grow as depth^3
    and its activations as depth^2 (embeddings and logits grow slower: an estimate from above on fixed memory,
    so a bound from below on the depth). None without the inputs."""
    inputs = _model(record)
    if inputs is None or not micro_batch or not depth:
        return None
    fixed, scaled, frag, room, _ = inputs
    fitting = [d for d in range(1, limit * depth + 1)
               if fixed * (d / depth) ** fixed_power + (1 + frag) * scaled * (d / depth) ** scaled_power <= room]
    return max(fitting, default=0)
