"""The GPU's state from NVML (nvidia-ml-py), read by the live capture at the first and last profiled step:
clocks, power, temperature and the clock event reasons, so a throttled or shared GPU is evidence in the report,
not an inference from slow kernels (profiling/profile/trace/device_state.py reads the record). No torch; never
raises: without NVML or a GPU the state says why it is missing.

    read(uuid)   # {"sm_mhz", "sm_max_mhz", "power_w", "power_limit_w", "temperature_c", "events": [...],
                 #  "memory_used_mb" (device-wide), "energy_j" (since the driver loaded) with its "time_s"
                 #  (monotonic): absent where NVML does not say} or {"missing": "why"}
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
