"""An idle finding's gain net of the clock (profiling/profile/findings/power.py), on H100 traces of the clock cases
(benchmarks/findings/planted/diagnoses.py, d35, 2026-11-25; tests/data/h100-clock-<case>, the first 2 of 5
profiled steps): the slowdowns below are the unprofiled ms/step minus the same call's baseline's (304.94)."""
import pytest

from profiling.profile.findings import power
from profiling.profile.report.summary import summarize

SLOWDOWN_MS = {"log_40ms": 85.94, "launch_blocking": 71.04}


@pytest.mark.parametrize("case", sorted(SLOWDOWN_MS))
def test_an_idle_findings_gain_is_net_of_the_clock_and_within_30_percent(data_trace, case):
    top = summarize(data_trace(f"h100-clock-{case}"))["findings"][0]
    assert abs(top["ms_per_step"] - SLOWDOWN_MS[case]) <= 0.3 * SLOWDOWN_MS[case]
    assert "net of the clock" in top["evidence"] and "their mean over the profiled steps" in top["evidence"]


def test_without_a_gpu_state_the_gain_is_the_idle(data_trace):
    """An older or foreign trace: nothing to correct with, so the gain is the idle (an upper bound), said as is."""
    def state(drop):
        trace = data_trace("h100-clock-log_40ms")
        drop(trace["autoresearch"])
        return summarize(trace)["findings"][0]

    netted = state(lambda meta: None)
    whole = state(lambda meta: meta.pop("device_state"))
    assert whole["kind"] == netted["kind"] == "host_read"  # `log_loss(loss.item())`: the read, then 40 ms of host work
    assert "net of the clock" not in whole["evidence"]
    assert whole["ms_per_step"] > netted["ms_per_step"] + 5
    # without the energy counter (captures before it was recorded): NVML's power after the profiled steps
    end_only = state(lambda meta: meta["device_state"]["end"].pop("energy_j"))
    assert "after the profiled steps" in end_only["evidence"]


def p(watts, busy=0.75, limit=700.0, mhz=1900.0, compute=200.0):
    return {"mhz": mhz, "watts": watts, "limit": limit, "mean": True, "busy": 100.0 * busy, "step": 100.0,
            "compute": compute}


def test_a_gpu_that_stays_under_its_limit_busy_loses_nothing():
    """GPT-2 small on an H100 (tests/data/h100-gpt2-clean-api): 322 W busy 95% of the step, far from 700 W."""
    assert power.loss(p(322.0, busy=0.95), 5.0)[0] == 0.0
    assert power.loss(p(600.0), 0.0)[0] == 0.0  # nothing removed, nothing lost


def test_the_loss_grows_with_the_idle_removed_and_the_power_drawn():
    assert power.loss(p(600.0), 10.0)[0] == 0.0  # busy 83% of the step it would draw 667 W: under the limit
    small, large = power.loss(p(600.0), 15.0)[0], power.loss(p(600.0), 25.0)[0]
    assert 0.0 < small < large
    assert power.loss(p(650.0), 25.0)[0] > large
    lost, need, mhz = power.loss(p(600.0), 25.0)
    assert need == pytest.approx(800.0) and mhz == pytest.approx(1900.0 * (700 / 800) ** (1 / 3))
    assert lost == pytest.approx(200.0 * (1900.0 / mhz - 1))


def test_unprofiled_steps_slower_than_the_profiled_ones_leave_their_time_unexplained(data_trace):
    """d36's empty_cache ran 17 ms/step faster profiled than unprofiled: no finding may claim that time, and it is
    not dropped either: `unknown` carries it."""
    trace = data_trace("h100-clock-log_40ms")
    step = summarize(data_trace("h100-clock-log_40ms"))["step_ms"]
    trace["autoresearch"]["unprofiled_step_ms"] = step + 20.0
    s = summarize(trace)
    [u] = [u for u in s["unknown"] if u["rule"] == "profiler_overhead"]
    assert u["ms_per_step"] == pytest.approx(20.0, abs=0.01) and "did not record" in u["what"]
    assert "unprofiled steps were slower" in s["findings"][-1]["evidence"]
