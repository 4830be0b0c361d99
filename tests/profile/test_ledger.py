"""profiling.profile.findings.ledger: each millisecond of the step claimed once, over every recorded trace;
and the findings issue #42 asks to hold on any trace: slow_device only where the trace tells a slow device
from slow kernels, a large GPU idle without host samples is still a finding (effect first)."""
import glob
import gzip
import json
import os

import pytest

from profiling.cli import main
from profiling.profile.findings import ledger
from profiling.profile.report.summary import META_KEY, load_trace, summarize

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
SLOW_FIXTURES = ("h100-plant33-nan_asserts", "h100-plant-small_batch")  # over 5 s each on a 2-core CPU
TRACES = sorted(p for pattern in ("*.json.gz", os.path.join("foreign", "*.json.gz"))
                for p in glob.glob(os.path.join(DATA, pattern))
                if not os.path.basename(p).startswith("cpu-"))  # CPU profiles have no device findings


def _param(path):
    name = os.path.basename(path).split(".")[0]
    return pytest.param(path, id=name, marks=[pytest.mark.slow] if name in SLOW_FIXTURES else [])


@pytest.mark.parametrize("path", [_param(p) for p in TRACES])
def test_every_trace_claims_each_millisecond_once(path, data_summary):
    """The summary made once per run (conftest's data_summary, shared with the other sweeps of every trace), and
    what the ledger admitted while making it, with what each finding prices (the summary keeps neither key)."""
    made = data_summary.full(path)
    s, admitted = made["summary"], made["admitted"]
    assert sum(f["ms_per_step"] for f in s["findings"]) <= s["step_ms"] + 0.01
    kernels, gaps = set(), set()
    for found in admitted:
        for f in found:
            assert not kernels & set(f["_kernels"]), (f["kind"], "kernels priced twice")
            assert not gaps & set(f["_gaps"]), (f["kind"], "gaps priced twice")
            kernels |= set(f["_kernels"])
            gaps |= set(f["_gaps"])
    assert all(not k.startswith("_") for f in s["findings"] for k in f)


def _finding(kind, ms, kernels=(), gaps=()):
    return {"kind": kind, "ms_per_step": ms, "pct_of_step": ms, "evidence": "e", "fix": "f",
            "_kernels": {k: 1000.0 for k in kernels}, "_gaps": {g: 1000.0 for g in gaps}}


def test_a_finding_on_kernels_already_priced_is_cut_or_left_out():
    ctx = {"step": 100.0, "n": 1}
    found, notes = ledger.admit([_finding("slow_device", 20.0, kernels=(1, 2, 3, 4)),
                                 _finding("fp32_matmul", 30.0, kernels=(1, 2)),
                                 _finding("eager_code", 5.0, kernels=(5, 6))], ctx)
    assert [(f["kind"], f["ms_per_step"]) for f in found] == [("fp32_matmul", 30.0), ("slow_device", 10.0),
                                                              ("eager_code", 5.0)]
    assert "by fp32_matmul above: its gain cut by that share, from 20.0 to 10.0" in found[1]["evidence"]
    assert set(found[1]["_kernels"]) == {3, 4}
    found, notes = ledger.admit([_finding("fp32_matmul", 30.0, kernels=(1, 2)),
                                 _finding("slow_device", 20.0, kernels=(1, 2))], ctx)
    assert [f["kind"] for f in found] == ["fp32_matmul"]
    assert notes[0].startswith("slow_device (20.0 ms/step) left out: 2.0 of the 2.0 ms/step of kernels")


def test_the_findings_never_sum_past_the_step():
    found, notes = ledger.admit([_finding("recompute", 70.0), _finding("host_sync", 50.0, gaps=(1,))],
                                {"step": 100.0, "n": 1})
    assert [(f["kind"], f["ms_per_step"]) for f in found] == [("recompute", 70.0), ("host_sync", 30.0)]
    assert "host_sync: its gain cut from 50.0 to 30.0 ms/step" in notes[0]


# ---------------------------------------------------------------------------------------------------------
# slow_device: a slow device, not slow kernels
# ---------------------------------------------------------------------------------------------------------

def _with_peak(name, factor):
    """A recorded H100 trace with its peak raised `factor` times: its GEMMs then run at 1/factor the share."""
    trace = load_trace(os.path.join(DATA, f"{name}.trace.json.gz"))
    trace[META_KEY]["peak_flops"] *= factor
    return summarize(trace)


def test_steady_gemms_some_at_a_healthy_rate_are_no_slow_device():
    """The clean run's GEMMs at 39% of a 1.7x peak (under SLOW_DEVICE_FRACTION), their best at 47%, each shape
    steady: slow kernels for their shapes, the device is fine (before: slow_device, 'check the GPU')."""
    s = _with_peak("h100-plant-baseline", 1.7)
    assert "slow_device" not in [f["kind"] for f in s["findings"]]


def test_gemms_that_never_reach_a_healthy_rate_are_a_slow_device():
    s = _with_peak("h100-plant-baseline", 3.0)
    f = s["findings"][0]
    assert f["kind"] == "slow_device" and "even their fastest tenth reach only" in f["evidence"]


def test_the_same_shapes_fast_at_times_are_a_shared_device():
    s = summarize(load_trace(os.path.join(DATA, "h100-plant-shared_gpu.trace.json.gz")))
    f = s["findings"][0]
    assert f["kind"] == "slow_device" and "over each shape's own best rate" in f["evidence"]
    assert 150 < f["ms_per_step"] < 170  # the plant's slowdown: ~160 ms of GEMM time over their own best


# ---------------------------------------------------------------------------------------------------------
# Effect first: GPU idle without host samples
# ---------------------------------------------------------------------------------------------------------

def _older(tmp_path):
    """The slow-input plant (the GPU idle 51% of the step, waiting on the loader) as an older trace: no host
    samples, no sync lines."""
    trace = load_trace(os.path.join(DATA, "h100-plant-slow_input.trace.json.gz"))
    for key in ("host_samples", "syncs"):
        trace[META_KEY].pop(key)
    path = tmp_path / "older.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return path


def test_idle_without_host_samples_is_a_finding_first(tmp_path):
    s = summarize(load_trace(_older(tmp_path)))
    f = s["findings"][0]
    assert f["kind"] == "gpu_waits_on_host" and f["ms_per_step"] > 0.4 * s["step_ms"]
    assert f["evidence"].startswith("cause unknown:") and "no host samples" in f["evidence"]
    assert "with_stack=True" in f["fix"] and "profiling.Profiler" in f["fix"]
    assert not [u for u in s["unknown"] if u["rule"] == "gpu_waits_on_host"]  # not also left unexplained


def test_research_profile_of_an_older_trace_puts_the_idle_first(tmp_path, capsys):
    assert main(["profile", str(_older(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "1. **gpu_waits_on_host**" in out and "No rule found a cause" not in out


def test_a_real_trace_where_two_rules_price_the_same_gemms():
    """h100-fresh-mlp_width_1365 with its peak tripled: no GEMM reaches 40% of it, so slow_device prices the
    large GEMMs, and misaligned_shapes (run after it) prices some of them too: its gain cut by that share."""
    s = _with_peak("h100-fresh-mlp_width_1365", 3.0)
    kinds = [f["kind"] for f in s["findings"]]
    assert kinds[0] == "slow_device"
    cut = next(f for f in s["findings"] if f["kind"] == "misaligned_shapes")
    assert "priced by slow_device above: its gain cut by that share" in cut["evidence"]
