"""Pure: over_bound, the fallback when no other rule found a cause: kernels far over their bound (tables/bound.py:
FLOPs at this trace's best GEMM rate, bytes at the peak bandwidth; the evidence says which rate), by how much, and
where. Not judged: the kernels of a causal attention call off the math path (kernels.fused_causal: the form attention
should take), kernels of a few microseconds or whose work needs under a microsecond (their fixed cost is their
time), and one partial wave of a small shape (its grid leaves SMs idle: no slow form). Stdlib only.
"""
from profiling.profile.findings.contract import claim, finding, rule, top
from profiling.profile.findings.kernels import fused_causal
from profiling.profile.findings.settings import attribute
from profiling.profile.tables.bound import eager_bytes
from profiling.profile.trace import hardware
from profiling.profile.trace.classify import short_name

# over_bound: a kernel over its bound by more than its category does in the clean default config (H100,
# 2026-11-23: GEMMs at most 1.25x, cuDNN attention 2.0-2.3x (flash recomputation is not in its FLOPs),
# fused elementwise and loss kernels at most 4.0x (the fused loss: exp-bound, its bytes a floor))
OVER_RATIO = {"GEMM": 1.5, "attention": 3.0}
OVER_RATIO_OTHER = 5.0
OVER_MIN_KERNEL_US = 10.0  # a kernel this short is its fixed cost (launch on the device, one wave, its tail;
                           # the shortest kernels of the H100 fixtures take 1.06 us): its bound says nothing
OVER_MIN_BOUND_US = 1.0  # a kernel whose work needs less than this at the device's peak is all fixed cost (an H100
                         # kernel takes 1-2 us however small its work; a 513-element int64->int32 copy took 22 us a
                         # call on an MI300X, 12,835x its bound, tests/data/foreign/tracelens-mi300x-sglang-deepseek-*):
                         # its ratio to the bound is no slow form to find
OVER_SMALL_GRID_US = 20.0  # a grid of half the SMs or more, but not all, is one partial wave of a small shape when
                          # its work needs under this at peak (ViT-B at batch 4 on the H100: GEMMs of 4.7 us in 98
                          # blocks on 132 SMs, flash attention of 1 us in 96): the shape keeps it from the peak, not
                          # a slow form; a grid far under the SMs for its work is the kernel's choice (cuBLAS without
                          # its workspace: an [8, 262144] x [262144, 32] GEMM, 21 MB to read, in 1 block: no split-K)
# HIP's hipExtModuleLaunchKernel records its grid in threads (Tensile's GEMMs: grid [76800] of blocks of [256]), every
# other launch in blocks
GRID_IN_THREADS = ("hipExtModuleLaunchKernel",)
OVER_MIN_SHARE = 0.02    # of the step, summed over the flagged kernels: a clean Llama (examples/llama_train.py,
                         # batch 32, H100) has 1.3% in narrow GEMMs (its 4 k/v heads' projections at 1.7-2.1x
                         # their bound) that no edit of the user's code recovers


def _blocks(e, launch):
    """The thread blocks (AMD: workgroups) a kernel ran, from its recorded grid; None where not recorded."""
    args = e.get("args") or {}
    grid, block = args.get("grid"), args.get("block")
    if not isinstance(grid, list) or not grid or not all(isinstance(g, int) and g > 0 for g in grid):
        return None
    blocks = 1
    for g in grid:
        blocks *= g
    if str((launch or {}).get("name", "")) in GRID_IN_THREADS and isinstance(block, list) and block:
        threads = 1
        for b in block:
            threads *= b if isinstance(b, int) and b > 0 else 1
        blocks = -(-blocks // threads)
    return blocks


def _judged(tl, e, launch, bound):
    """Whether a kernel's bound is one it could reach: its work (the bound, or its operator's tensors at the
    device's bandwidth, for a GEMM's bound counts only FLOPs) needs OVER_MIN_BOUND_US or more, and its grid is not
    one partial wave of a small shape (OVER_SMALL_GRID_US): such a kernel leaves SMs idle and never nears the
    peak, with nothing slow to find."""
    nbytes, bandwidth = eager_bytes(tl.op_of(launch)), hardware.peak_bandwidth(tl.meta.get("device"))
    work = max(bound, nbytes / bandwidth * 1e6 if nbytes and bandwidth else 0.0)
    if work < OVER_MIN_BOUND_US:
        return False
    sms, blocks = tl.meta.get("sms"), _blocks(e, launch)
    partial = isinstance(sms, int) and blocks is not None and sms / 2 <= blocks < sms
    return not (partial and work < OVER_SMALL_GRID_US)


@rule("over_bound", needs=("device", "bounds"))
def over_bound(tl, ctx, found):
    """When no rule named a cause: the kernels furthest over their bound, beyond what their category shows in
    a clean run."""
    bounds = getattr(tl, "bounds", None)
    if not bounds or any(f["ms_per_step"] >= OVER_MIN_SHARE * ctx["step"] for f in found):
        return None
    rows = {}
    for evs, cats, bs in zip(tl.per_step, tl.labels, bounds):
        for (e, launch), cat, b in zip(evs, cats, bs):
            if b and e["dur"] >= OVER_MIN_KERNEL_US and _judged(tl, e, launch, b) \
                    and not (cat == "attention" and fused_causal(tl, launch)):
                acc = rows.setdefault((str(e.get("name", "")), cat), [0.0, 0.0, []])
                acc[0], acc[1] = acc[0] + e["dur"], acc[1] + b
                acc[2].append(e)
    over = {key: (us, b) for key, (us, b, _) in rows.items()
            if us > OVER_RATIO.get(key[1], OVER_RATIO_OTHER) * b}
    excess = {key: (us - b) / ctx["n"] / 1e3 for key, (us, b) in over.items()}
    ms = sum(excess.values())
    if ms < OVER_MIN_SHARE * ctx["step"]:
        return None
    claim(ctx, [e for key in over for e in rows[key][2]])
    shown = ", ".join(f"`{short_name(name)}` ({cat}) {over[(name, cat)][0] / over[(name, cat)][1]:.1f}x its bound, "
                      f"+{x:.1f} ms" for (name, cat), x in top(excess))
    evidence = (f"no rule names a cause, but {len(over)} kernels run far over the least time their work needs "
                f"(beyond what their category reaches in a clean run): {shown}; bounds: FLOPs at "
                f"{getattr(tl, 'bound_basis', None) or 'the best GEMM rate'}, bytes at the device's datasheet "
                f"bandwidth; kernels under {OVER_MIN_KERNEL_US:g} us, whose work needs under {OVER_MIN_BOUND_US:g} "
                "us, or "
                f"under {OVER_SMALL_GRID_US:g} us in one partial wave of blocks not judged (their fixed cost or the "
                "small shape dominates); see the "
                "lines and the regions below for where they come from")
    f = finding("over_bound", ms, ctx, evidence,
                "find the work done in a slow form at those kernels' lines: shapes not multiples of 64 "
                "(misaligned GEMMs), float32 where bf16 would do, unfused or eager ops, extra copies; compare "
                "with the last good run's profile (--previous)")
    gemm = sum(x for (_, cat), x in excess.items() if cat == "GEMM")
    return attribute(tl, f, "slow_gemms") if gemm >= ms / 2 else f
