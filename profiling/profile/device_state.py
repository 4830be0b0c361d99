"""The GPU's state from NVML (nvidia-ml-py), read by the live capture: clocks, power, temperature and the
clock event reasons, so a throttled or shared GPU is evidence in the report, not an inference from slow
kernels. No torch; never raises: without NVML or a GPU the state says why it is missing.

    read(uuid)   # {"sm_mhz", "sm_max_mhz", "power_w", "power_limit_w", "temperature_c", "events": [...],
                 #  "memory_used_mb" (device-wide), "energy_j" (since the driver loaded) with its "time_s"
                 #  (monotonic): absent where NVML does not say} or {"missing": "why"}
    memory_mb(state)  # the most memory NVML saw in use at either end, None without
    text(state)  # one line for the report's header
    mean_power_w(state)  # the mean power between the two readings (NVML's energy counter), None without
"""
import time

# NVML's clock event reasons that slow the GPU down (the idle and application-clock ones do not)
SLOWING = (
    ("nvmlClocksEventReasonSwPowerCap", "SW power cap"),
    ("nvmlClocksEventReasonHwSlowdown", "HW slowdown"),
    ("nvmlClocksEventReasonHwThermalSlowdown", "HW thermal slowdown"),
    ("nvmlClocksEventReasonHwPowerBrakeSlowdown", "HW power brake"),
    ("nvmlClocksEventReasonSwThermalSlowdown", "SW thermal slowdown"),
    ("nvmlClocksEventReasonSyncBoost", "sync boost"),
)


def read(uuid=None, nvml=None):
    """The state of the GPU with this UUID (torch's device uuid, with or without NVML's "GPU-" prefix; None:
    the first GPU). `nvml`: the pynvml module (tests pass a fake)."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception as e:  # no library, no driver, no GPU: the report says so
        return {"missing": f"NVML unavailable ({type(e).__name__}: {str(e)[:80]})"}
    try:
        if uuid:
            name = str(uuid) if str(uuid).startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            h = nvml.nvmlDeviceGetHandleByUUID(name)
        else:
            h = nvml.nvmlDeviceGetHandleByIndex(0)
        reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        out = {
            "sm_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
            "sm_max_mhz": nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM),
            "power_w": round(nvml.nvmlDeviceGetPowerUsage(h) / 1000, 1),
            "power_limit_w": round(nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000, 1),
            "temperature_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
            "events": [label for attr, label in SLOWING if reasons & getattr(nvml, attr, 0)],
        }
        try:  # the report's peak memory when the allocator's counters read nothing (#35 item 5)
            out["memory_used_mb"] = round(nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20, 1)
        except Exception:
            pass
        try:  # energy since the driver loaded: two readings give the mean power between them
            out["energy_j"] = round(nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000, 3)
            out["time_s"] = round(time.monotonic(), 3)
        except Exception:
            pass
        return out
    except Exception as e:  # a MIG slice or a restricted device answers some queries only
        return {"missing": f"NVML query failed ({type(e).__name__}: {str(e)[:80]})"}
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


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
