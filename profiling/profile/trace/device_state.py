"""The GPU's state as the live capture recorded it from NVML (profiling/profile/capture/nvml.py), read for the
report: its header line, the mean power, the clock event reasons that slow the GPU, the memory in use. Pure.

    memory_mb(state)  # the most memory NVML saw in use at either end, None without
    text(state)  # one line for the report's header
    mean_power_w(state)  # the mean power between the two readings (NVML's energy counter), None without
    slowing(state)  # the slowing clock event reasons seen at either end
"""


def _one(s):
    return (f"SM {s['sm_mhz']}/{s['sm_max_mhz']} MHz · {s['power_w']:.0f}/{s['power_limit_w']:.0f} W · "
            f"{s['temperature_c']} °C · clock events: {', '.join(s['events']) or 'none'}")


def text(state):
    """`GPU state: ...` for the header, from {"start": state, "end": state}; None without a record."""
    if not isinstance(state, dict) or not state:
        return None
    start, end = state.get("start") or {}, state.get("end") or {}
    if "missing" in start or "missing" in end or not start or not end:
        return f"GPU state: not available: {start.get('missing') or end.get('missing') or 'not recorded'}"
    mean = mean_power_w(state)
    return (f"GPU state (NVML, first → last profiled step): {_one(start)} → {_one(end)}"
            + (f" · mean power between them {mean:.0f} W" if mean else ""))


def mean_power_w(state, min_seconds=0.1):
    """The mean power between the two readings, from NVML's energy counter; None without it (older records) or
    with readings less than min_seconds apart."""
    try:
        start, end = state["start"], state["end"]
        seconds = float(end["time_s"]) - float(start["time_s"])
        joules = float(end["energy_j"]) - float(start["energy_j"])
    except (KeyError, TypeError, ValueError):
        return None
    return joules / seconds if seconds >= min_seconds and joules > 0 else None


def slowing(state):
    """The slowing clock event reasons seen at either end of the profiled steps ([] without a record)."""
    if not isinstance(state, dict):
        return []
    seen = [e for key in ("start", "end") for e in (state.get(key) or {}).get("events", [])]
    return list(dict.fromkeys(seen))


def memory_mb(state):
    """The most device memory NVML saw in use at either end of the profiled steps, None without a figure."""
    if not isinstance(state, dict):
        return None
    seen = [(state.get(k) or {}).get("memory_used_mb") for k in ("start", "end")]
    seen = [x for x in seen if isinstance(x, (int, float)) and x > 0]
    return max(seen) if seen else None
