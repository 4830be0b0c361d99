"""The GPU's state from NVML (profiling/profile/capture/nvml.py, read back by profiling/profile/trace/device_state.py),
with a fake NVML, and in the report."""
import os

from profiling.profile.capture import nvml
from profiling.profile.report import render, summary
from profiling.profile.trace import device_state

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


class FakeNVML:
    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0
    nvmlClocksEventReasonGpuIdle, nvmlClocksEventReasonSwPowerCap = 0x1, 0x4
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80

    def __init__(self, reasons=0, fail=None):
        self.reasons, self.fail, self.shut, self.asked = reasons, fail, False, None

    def nvmlInit(self):
        if self.fail == "init":
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.asked = uuid
        return "h"

    def nvmlDeviceGetHandleByIndex(self, i):
        return "h"

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        if self.fail == "query":
            raise RuntimeError("Not Supported")
        return self.reasons

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1410

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return 1980

    def nvmlDeviceGetPowerUsage(self, h):
        return 699_500

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 71


def test_read_names_the_slowing_clock_events_and_shuts_nvml_down():
    fake = FakeNVML(reasons=0x1 | 0x4 | 0x80)
    s = nvml.read("58e5a2a4-1b2c", fake)
    assert fake.asked == "GPU-58e5a2a4-1b2c" and fake.shut
    assert s == {"sm_mhz": 1410, "sm_max_mhz": 1980, "power_w": 699.5, "power_limit_w": 700.0, "temperature_c": 71,
                 "events": ["SW power cap", "HW power brake"]}  # GPU idle is no slowdown
    text = device_state.text({"start": s, "end": s})
    assert text.startswith("GPU state (NVML, first → last profiled step): SM 1410/1980 MHz · 700/700 W · 71 °C")
    assert "clock events: SW power cap, HW power brake" in text


def test_no_nvml_or_a_refused_query_is_said_not_raised():
    assert "NVML unavailable (OSError" in nvml.read(None, FakeNVML(fail="init"))["missing"]
    missing = nvml.read(None, FakeNVML(fail="query"))
    assert "NVML query failed (RuntimeError: Not Supported)" in missing["missing"]
    assert device_state.text({"start": missing, "end": missing}).startswith("GPU state: not available: NVML query")
    assert device_state.text(None) is None and device_state.slowing(None) == []


def test_the_report_header_shows_the_state_and_old_traces_have_none():
    s = summary.load_summary(os.path.join(DATA, "h100-plant26-baseline.trace.json.gz"))
    assert s["device_state"] is None and "GPU state" not in render.to_markdown(s)  # made before the record
    state = {"start": nvml.read(None, FakeNVML()), "end": nvml.read(None, FakeNVML(0x80))}
    lines = render.to_markdown(dict(s, device_state=state)).splitlines()
    assert lines[2].startswith("GPU state (NVML") and lines[2].endswith("clock events: HW power brake")


def test_slow_device_cites_the_clock_events():
    trace = summary.load_trace(os.path.join(DATA, "h100-plant-shared_gpu.trace.json.gz"))
    trace["autoresearch"]["device_state"] = {"start": nvml.read(None, FakeNVML(0x80)),
                                             "end": nvml.read(None, FakeNVML(0x80))}
    f = next(f for f in summary.summarize(trace)["findings"] if f["kind"] == "slow_device")
    assert "NVML: clock events active: HW power brake" in f["evidence"]


def test_a_real_h100_record():
    """h100-default-nvml: `train.py --profile` at the default config on an H100 (2026-11-23, 2 of its 5 steps):
    at full load the GPU sat at its 700 W power limit, NVML's SW power cap event on, the SM clock below max."""
    s = summary.load_summary(os.path.join(DATA, "h100-default-nvml.trace.json.gz"))
    assert s["device_state"]["start"]["sm_max_mhz"] == 1980 and s["device_state"]["start"]["power_limit_w"] == 700
    assert device_state.slowing(s["device_state"]) == ["SW power cap"]
    md = render.to_markdown(s)
    assert "GPU state (NVML, first → last profiled step): SM 1725/1980 MHz · 650/700 W · 51 °C" in md
    assert [f for f in s["findings"] if f["ms_per_step"] >= 0.01 * s["step_ms"]] == []  # the clean default


def test_the_mean_power_between_the_readings_comes_from_the_energy_counter():
    """NVML's power is a reading at one moment; the energy counter gives the mean over the profiled steps."""
    start = {"sm_mhz": 1920, "sm_max_mhz": 1980, "power_w": 502.0, "power_limit_w": 700.0, "temperature_c": 50,
             "events": [], "energy_j": 1000.0, "time_s": 10.0}
    end = dict(start, power_w=610.0, energy_j=2218.0, time_s=12.0)
    assert device_state.mean_power_w({"start": start, "end": end}) == 609.0
    assert device_state.text({"start": start, "end": end}).endswith("mean power between them 609 W")
    older = {"start": {k: v for k, v in start.items() if k != "energy_j"}, "end": end}
    assert device_state.mean_power_w(older) is None and "mean power" not in device_state.text(older)
    assert device_state.mean_power_w({"start": start, "end": dict(end, time_s=10.05)}) is None  # too close
