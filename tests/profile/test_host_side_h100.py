"""Issue #48's H100 checks, on the traces benchmarks/findings/live/host_side.py captured through the public
API (2026-11-27; each fix applied in a fresh process and timed unprofiled:
benchmarks/findings/live/host_side_results.md). The measured step times are constants here; the claims are
what today's rules make of the recorded traces."""
import os

import pytest

from profiling.profile.report import render
from profiling.profile.report.ranks import summarize_path
from profiling.profile.report.summary import summarize
from profiling.profile.trace.traceio import load_trace

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")

# unprofiled ms/step, median of 3 reps (benchmarks/findings/live/host_side/*.json): the trace's own call, so
# the same machine
WORKERS_0 = {"baseline": 325.42, "workers_8": 36.76, "pin_memory": 301.85}        # call 1
WORKERS_2 = {"baseline": 141.26, "workers_8": 34.61}                              # call 3
CONVNEXT = {"fp32": 100.75, "bf16_channels_last": 37.56, "cudnn_benchmark": 97.41}  # call 1


def summary(name):
    return summarize(load_trace(os.path.join(DATA, f"h100-host-{name}.trace.json.gz")))


def kinds(s):
    return [f["kind"] for f in s["findings"]]


@pytest.mark.parametrize("name, measured", [("resnet18-workers0", WORKERS_0), ("resnet18-workers2", WORKERS_2)])
def test_a_starved_gpu_leads_with_the_dataloader_and_its_fix_recovers_the_claim(name, measured):
    s = summary(name)
    top = s["findings"][0]
    assert top["kind"] == "input_bound" and "DataLoader" in top["evidence"] and "num_workers" in top["fix"]
    recovered = measured["baseline"] - measured["workers_8"]
    assert recovered >= 0.6 * top["ms_per_step"], (recovered, top["ms_per_step"])
    assert sum(f["ms_per_step"] for f in s["findings"]) <= s["step_ms"] + 0.01


def test_too_few_workers_is_said_as_such():
    top = summary("resnet18-workers2")["findings"][0]
    assert "_MultiProcessingDataLoaderIter" in top["evidence"] and top["fix"].startswith("the workers cannot keep up")


def test_the_float32_convnext_precision_finding_is_priced_near_what_autocast_and_channels_last_recover():
    s = summary("convnext-fp32")
    recovered = CONVNEXT["fp32"] - CONVNEXT["bf16_channels_last"]
    precision = next(f for f in s["findings"] if f["kind"] == "fp32_matmul")
    assert abs(precision["ms_per_step"] - recovered) <= 0.5 * recovered, (precision["ms_per_step"], recovered)
    slow = next(f for f in s["findings"] if f["kind"] == "slow_convolution")  # ConvNeXt's depthwise backward
    assert slow["fix"].startswith("run these convolutions in bf16")       # what recovers leads, not the search
    conv = s["categories"]["convolution"]
    assert (conv["ms"] if isinstance(conv, dict) else conv) > 0.2 * s["step_ms"]  # cuDNN's kernels: not "other"


def test_t5s_position_bias_is_never_advised_away():
    s = summary("t5-small")
    for f in s["findings"]:
        fix = f["fix"].lower()
        assert "no mask" not in fix.replace("or no mask in its place", "") and "is_causal=true" not in fix.replace(
            "never is_causal=true", ""), f
    fallback = next(f for f in s["findings"] if f["kind"] == "attention_fallback")
    assert fallback["fix"].startswith("keep the mask") and "bias" in fallback["evidence"]
    assert "forward_without_backward" not in kinds(s)  # the math path's backward trains its attention


def test_a_compile_inside_the_window_is_reported_once_never_per_step():
    s = summary("compile-in-window")
    compile_rows = [r for r in s["one_off"] if r["kind"] == "compile"]
    assert compile_rows and compile_rows[0]["ms"] > 10_000  # 16.9 s, on its own line
    assert s["step_ms"] < 20 and all(f["ms_per_step"] < s["step_ms"] for f in s["findings"])
    assert "one-off, not per step:" in render.to_markdown(s)


def test_two_gpus_under_lightning_ddp_claim_no_straggler_the_unprofiled_steps_do_not_show():
    """Each rank's unprofiled step: 21.2 and 21.3 ms
    (benchmarks/findings/live/host_side/h100x2-call4-lightning-ddp.json); the profiled rank 0 works 8.5
    ms/step more, its own profiler cost."""
    s = summarize_path(os.path.join(DATA, "h100x2-host-lightning-ddp"))
    assert "straggler" not in kinds(s)
    assert any("no straggler is claimed from the profiled skew" in n for n in s["notes"])
