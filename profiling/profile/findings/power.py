"""Pure: what removing GPU idle does to the GPU's clock, so an idle finding claims what its fix recovers.
Stdlib only.

A GPU that idles part of the step draws less than its power limit and runs at higher clocks than a busy one
can hold (an H100 at its 700 W limit: 1,515-1,770 MHz busy, 1,845-1,965 with a quarter of the step idle;
benchmarks/findings/planted/diagnoses_results.md). Remove the idle and the power rises, the power limit pulls
the clock down, and the compute-bound kernels (GEMMs, attention) slow: the step gains less than the idle it
loses. From the GPU state the live capture records (NVML: clock, power and power limit;
profiling/profile/trace/device_state.py):

    power busy throughout  = P * b' / b       P: the mean power over the profiled steps (NVML's energy
                                              counter), else NVML's power after them; b: the device's
                                              busy share of the step, b': the same with this idle gone
    clock under the limit  = f * (limit / that power) ** (1/3)    (dynamic power ~ clock^3: the voltage
                                                                   rises with the clock)
    the kernels' loss      = GEMM and attention ms * (f / that clock - 1)   (their time ~ 1 / clock; the
                                                                            memory-bound rest unchanged)

No correction where the GPU would stay under its limit busy throughout (a small model: an H100 training
GPT-2 at 322 W), or without a GPU state (an older or foreign trace; the gain is then the idle, an upper
bound). The model ignores the power the idle itself draws (so it errs toward a larger correction) and
memory-bound kernels' small clock dependence. Checked on fresh H100 plants it was not written against (d35,
d36 in benchmarks/findings/planted/diagnoses_results.md): the idle findings' claims went from -31..+39% of the
measured slowdown to -8..+16%, but for a plant whose profiled steps ran faster than its unprofiled ones.
"""
from profiling.profile.trace import device_state

COMPUTE = ("GEMM", "attention")   # the budget categories whose kernels' time follows the SM clock


def state(tl, ctx):
    """{mhz, watts, limit, mean, busy, step, compute} from the trace's GPU state, or None without one."""
    record = tl.meta.get("device_state")
    if not isinstance(record, dict):
        return None
    end = record.get("end") or {}
    try:
        mhz, watts, limit = float(end["sm_mhz"]), float(end["power_w"]), float(end["power_limit_w"])
    except (KeyError, TypeError, ValueError):
        return None
    if mhz <= 0 or watts <= 0 or limit <= 0 or not 0 < ctx["busy"] < ctx["step"]:
        return None
    mean = device_state.mean_power_w(record)
    watts = mean or watts
    compute = sum(e["dur"] for evs, cats in zip(tl.per_step, tl.labels)
                  for (e, _), cat in zip(evs, cats) if cat in COMPUTE) / tl.n / 1e3
    return {"mhz": mhz, "watts": watts, "limit": limit, "mean": mean is not None, "busy": ctx["busy"],
            "step": ctx["step"], "compute": compute}


def loss(p, removed_ms):
    """(ms/step the GEMMs and attention would lose, the power busy without `removed_ms` of idle at today's
    clock, the clock the limit then allows) for removing that much of the profiled step's idle."""
    share, after = p["busy"] / p["step"], p["busy"] / max(p["busy"], p["step"] - removed_ms)
    need = p["watts"] * after / share
    if need <= p["limit"]:
        return 0.0, need, p["mhz"]
    mhz = p["mhz"] * (p["limit"] / need) ** (1 / 3)
    return p["compute"] * (p["mhz"] / mhz - 1), need, mhz


def net_of_clock(tl, ctx, found):
    """The idle findings (those that claimed gaps: Gap.cause is their rule) with their gain net of the clock's
    fall (module docstring), the figures in their evidence; the others unchanged."""
    idle = {}  # ms/step of the profiled step's idle by the rule that claimed it
    for g in tl.gaps:
        idle[g.cause] = idle.get(g.cause, 0.0) + g.us / tl.n / 1e3
    removals = [idle.get(f.pop("_rule", f["kind"]), 0.0) for f in found]
    p = state(tl, ctx) if any(removals) else None  # only for a trace with an idle finding
    out = []
    for f, removed in zip(found, removals):
        lost, need, mhz = loss(p, removed) if p and removed > 0 else (0.0, 0.0, 0.0)
        if lost >= 0.05:
            ms = max(0.0, f["ms_per_step"] - lost)
            where = "their mean over the profiled steps" if p["mean"] else "after the profiled steps"
            f = dict(f, ms_per_step=round(ms, 2), pct_of_step=round(100 * ms / ctx["step"], 1),
                     evidence=f["evidence"] + (
                         f"; net of the clock: idling, the GPU runs at {p['mhz']:.0f} MHz and "
                         f"{p['watts']:.0f} of {p['limit']:.0f} W (NVML, {where}); busy without this idle it "
                         f"would need ~{need:.0f} W at that clock, so its power limit would hold it near "
                         f"{mhz:.0f} MHz and its GEMMs and attention ({p['compute']:.0f} ms/step) would take "
                         f"{lost:.1f} ms longer, taken off the gain (power as busy share x clock^3)"))
        out.append(f)
    return out
