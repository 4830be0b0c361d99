"""profiling.profile.findings: the causes the profile names, each kind on a real H100 trace of a planted slowdown.

The fixtures h100-plant-<case>.trace.json.gz come from benchmarks/findings/planted/diagnoses.py on an H100
(2026-11-23), cut to their first profiled steps by tests/data/trim_trace.py;
benchmarks/findings/planted/diagnoses_results.md has the runs.
"""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from profiling.profile import findings
from profiling.profile.capture.sampler import StackSampler
from profiling.profile.report.render import to_markdown
from profiling.profile.report.summary import load_trace, summarize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")


def plant(case):
    return os.path.join(DATA, f"h100-plant-{case}.trace.json.gz")


@pytest.fixture(scope="module")
def summaries(data_summary):
    """summaries(case) -> the plant's summary (conftest's data_summary: made once per run, a fresh copy)."""
    def get(case):
        return data_summary(plant(case))
    return get


def kinds(s):
    return [f["kind"] for f in s["findings"]]


def top(s):
    return s["findings"][0]


@pytest.mark.parametrize("case, kind", [
    ("host_sync", "host_sync"), ("nan_check", "graph_break"), ("fp32_mlp", "fp32_intermediate"),
    ("dense_mask", "attention_fallback"), ("small_batch", "launch_bound"), ("slow_input", "gpu_waits_on_host"),
    ("shared_gpu", "slow_device"),
])
def test_the_top_finding_names_the_planted_cause(summaries, case, kind):
    s = summaries(case)
    assert top(s)["kind"] == kind
    assert top(s)["ms_per_step"] > 0.05 * s["step_ms"]
    assert set(top(s)) == {"kind", "ms_per_step", "pct_of_step", "evidence", "fix"}


def test_a_clean_default_run_has_no_finding_of_5_percent(summaries):
    s = summaries("baseline")
    assert all(f["ms_per_step"] < 0.05 * s["step_ms"] for f in s["findings"])


@pytest.mark.parametrize("name", ["h100-compiled-gpt-5steps", "h100-cudnn-window-gpt-5steps",
                                  "h200-default-gpt-5steps", "h200-fused-gpt-5steps"])
def test_traces_made_before_the_findings_still_work_and_stay_clean(name, data_summary):
    """No stack samples, sync lines or micro-batch count in their metadata: the rules use the events alone.
    These are default-config runs: no rule finds a cause costing 5% of the step. The H200 ones ran train.py's
    FlexAttention, since replaced by cuDNN's kernels: there over_bound (the fallback when no rule fires) names
    its attention kernels, 6-7x their bound, which is real lost time, not a false cause."""
    s = data_summary(name)
    ruled = [f for f in s["findings"] if f["kind"] != "over_bound"]
    assert all(f["ms_per_step"] < 0.05 * s["step_ms"] for f in ruled), s["findings"]
    over = [f for f in s["findings"] if f["kind"] == "over_bound"]
    assert not over if name.startswith("h100") else "(attention)" in over[0]["evidence"]


def test_host_sync_names_the_op_the_line_and_costs_the_idle_after_it(summaries):
    f = top(summaries("host_sync"))
    assert "2 syncs/step: aten::item x2" in f["evidence"]
    assert "train.py:702 `last_loss = loss.item()  # planted`" in f["evidence"]
    # the unprofiled step was 154.7 ms slower than the baseline's: the idle after the syncs is most of it
    assert 120 < f["ms_per_step"] < 180


def test_a_sync_while_the_gpu_is_busy_costs_nothing(summaries):
    """The capture's own synchronize at the end of the last step has no GPU idle after it."""
    s = summaries("baseline")
    assert "host_sync" not in kinds(s)


def test_graph_break_counts_regions_and_eager_kernels(summaries):
    s = summaries("nan_check")
    f = top(s)
    assert "11 compiled regions per micro-batch (1 expected)" in f["evidence"]
    assert "Data-dependent branching" in f["evidence"] and "forward at line 439" in f["evidence"]
    assert "aten::mul" in f["evidence"]
    sync = next(x for x in s["findings"] if x["kind"] == "host_sync")
    assert "16 syncs/step: aten::is_nonzero x16" in sync["evidence"] and "train.py:439" in sync["evidence"]


def test_graph_break_names_the_line_the_compile_recorded():
    """With the compile's record of its graph breaks (profiling/profile/capture/provenance.py `breaks`), the finding names the
    line and its code instead of Dynamo's resume function."""
    trace = load_trace(plant("nan_check"))
    text = "if torch.isnan(x).any():  # planted"
    trace["autoresearch"]["provenance"] = {
        "version": 1, "frames": [["torch/nn/modules/module.py", 1787, "_call_impl", "", False],
                                 ["train.py", 439, "forward", text, True],
                                 ["train.py", 508, "forward", "x = block(x, ve, cos_sin, mask)", True]],
        "stacks": [[0, 1, 2]], "graphs": [], "without": 0, "breaks": [[0, 5]]}
    f = top(summarize(trace))
    assert f["kind"] == "graph_break"
    assert f"breaks at train.py:439 `{text}` x5" in f["evidence"] and "resumes in" not in f["evidence"]


def test_fp32_matmul_shows_shapes_and_the_bf16_estimate(summaries):
    f = next(f for f in summaries("fp32_mlp")["findings"] if f["kind"] == "fp32_matmul")
    assert "on float32 inputs" in f["evidence"]
    assert "[262144, 512] x [512, 2048]" in f["evidence"]
    assert "at this trace's bf16 GEMM rate" in f["evidence"] and "tf32" in f["evidence"]


def test_attention_fallback_names_the_mask_and_the_rates(summaries):
    f = top(summaries("dense_mask"))
    assert "`aten::_cudnn_attention_backward` 12 calls/step with a dense [2048, 2048] mask" in f["evidence"]
    assert "this trace's other attention calls run at 425 TFLOP/s" in f["evidence"]  # the trace's own rate


def test_launch_bound_and_the_profiler_correction(summaries):
    s = summaries("small_batch")
    f = top(s)
    assert "(16 micro-batches of" in f["evidence"] and "DEVICE_BATCH_SIZE" in f["fix"]
    overhead = s["findings"][-1]
    assert overhead["kind"] == "profiler_overhead" and overhead["ms_per_step"] == 0.0
    assert "corrected idle = unprofiled - device busy" in overhead["evidence"]
    # the idle-based cost is scaled down to the unprofiled run's idle, never the inflated profiled one
    assert f["ms_per_step"] < s["idle_ms"] * 0.5


def test_gpu_waits_on_host_names_the_python_line(summaries):
    f = top(summaries("slow_input"))
    assert "train.py:692 preprocess" in f["evidence"] and "while time.perf_counter() - t0 < 0.2:" in f["evidence"]
    assert "train.py:692 preprocess" in f["fix"]


def test_slow_device_and_no_attention_blame_on_a_slow_gpu(summaries):
    s = summaries("shared_gpu")
    assert top(s)["kind"] == "slow_device" and "TFLOP/s" in top(s)["evidence"]
    assert "attention_fallback" not in kinds(s)


def test_findings_without_a_peak_or_unprofiled_time(summaries):
    trace = load_trace(plant("shared_gpu"))
    meta = trace["autoresearch"]
    meta.update(peak_flops=None, unprofiled_step_ms=None, device="Some GPU")
    s = summarize(trace)
    assert "slow_device" not in kinds(s) and "profiler_overhead" not in kinds(s)


# ---------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------

def test_findings_come_first_and_stay_short(summaries):
    text = to_markdown(summaries("small_batch"))
    lines = text.splitlines()
    start = lines.index("## 0. Findings (start here: the tables below are their evidence)")
    assert lines[start - 4].startswith("NVIDIA H100") and lines[start - 3].startswith("Process settings")
    assert lines[start - 2].startswith("Recorded by this profiler (live capture): host stacks sampled every 2 ms (less often where that took over 2% of the time), "
                                       "shapes; unprofiled")
    end = lines.index("## 1. Step budget")
    assert start < end and end - start <= 16
    assert lines[start + 1].startswith("1. **launch_bound**: ~")
    assert any(line.startswith("note: profiled 716") for line in lines[start:end])


def test_a_clean_report_says_so(summaries):
    text = to_markdown(summaries("baseline"))
    assert "No rule found a cause costing 1% of the step or more" in text


def test_research_profile_json_has_the_findings():
    out = subprocess.run([sys.executable, "-m", "profiling", "profile", plant("fp32_mlp"), "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert [f["kind"] for f in json.loads(out)["findings"][:2]] == ["fp32_intermediate", "fp32_matmul"]


def test_no_overhead_finding_without_an_unprofiled_time(summaries):
    step = summaries("baseline")["step_ms"]
    assert findings.idle.profiler_overhead(None, {"unprofiled": None, "step": step}, []) is None
    assert findings.idle.profiler_overhead(None, {"unprofiled": step * 1.02, "step": step}, []) is None


# ---------------------------------------------------------------------------------------------------------
# The stack sampler
# ---------------------------------------------------------------------------------------------------------

def busy_line(seconds):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


def test_the_sampler_sees_the_busy_line(tmp_path):
    sampler = StackSampler(interval=0.001, root=ROOT)
    sampler.start()
    sampler.step(0)
    busy_line(0.15)
    sampler.stop()
    data = sampler.result()
    assert len(data["samples"]) >= 3  # ~150 unloaded; a loaded machine's GIL hand-offs give far fewer
    assert all(step == 0 and 0 <= us <= 200_000 for step, us, _ in data["samples"])
    innermost = {data["stacks"][sid][0] for _, _, sid in data["samples"]}
    assert any(label.startswith("tests/profile/test_findings.py:") and "busy_line" in label for label in innermost)
    assert any(label.startswith("tests/profile/test_findings.py:") for label in data["own"])
    assert "while time.perf_counter() - t0 < seconds:" in data["lines"].values()
    assert not any(t.name == "autoresearch-stack-sampler" for t in threading.enumerate())


def test_a_paced_sampler_stretches_its_period_to_what_its_samples_cost_the_main_thread():
    """Paced (device-only steps), the period is the recent least sample cost, times what the main thread pays
    for it, over the share allowed; never under the base period. Unpaced, the period stays."""
    from profiling.profile.capture import sampler as S
    paced = StackSampler(paced=True)
    paced._paced(200e-6)  # a deep stack: 0.2 ms a sample
    assert paced.interval == pytest.approx(S.MAIN_PAYS * 200e-6 / S.OWN_SHARE)  # 20 ms at 2x and 2%
    paced._paced(1e-3)  # one slow walk (new frames' labels) does not stretch it: the recent least cost counts
    assert paced.interval == pytest.approx(S.MAIN_PAYS * 200e-6 / S.OWN_SHARE)
    for _ in range(S.RECENT):
        paced._paced(5e-6)  # a shallow stack: the base period
    assert paced.interval == S.INTERVAL_S
    assert paced.own_s == pytest.approx(200e-6 + 1e-3 + S.RECENT * 5e-6)
    unpaced = StackSampler()
    unpaced._paced(200e-6)
    assert unpaced.interval == S.INTERVAL_S


def test_every_diagnoses_plant_still_applies_to_train_py():
    """benchmarks/findings/planted/diagnoses.py plants each slowdown by exact text replacement in a copy of
    train.py: every replaced text is still in train.py once, and the planted file is valid Python importing
    what it uses."""
    import ast
    import importlib.util

    root = ROOT
    path = os.path.join(root, "benchmarks", "findings", "planted", "diagnoses.py")
    spec = importlib.util.spec_from_file_location("diagnoses", path)
    diagnoses = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diagnoses)
    with open(os.path.join(root, "train.py"), encoding="utf-8") as f:
        source = f.read()
    for case in diagnoses.CASES:
        tree = ast.parse(diagnoses.plant(case, source))
        imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names}
        used = {n.value.id for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
        modules = {"time", "torch", "kernels", "runner", "math", "gc", "sys", "nn", "F"}
        assert used & modules <= imported, (case, (used & modules) - imported)


def test_a_sync_that_waited_for_nothing_is_not_the_loaders_cause(data_summary):
    """h100-slowhost-sync_per_step: one `.item()` per step (benchmarks/findings/planted/diagnoses.py's
    sync_per_step) on an H100 whose host was slow, while the loader ran on the main thread (before issue #25).
    Each `.item()` waited about 12 us: the loader had already drained the GPU's queue, so the sync hid no GPU
    work and removing it recovers nothing (the same run without it, h100-slowhost-baseline, idles 92.9 ms/step
    in the same loader). The finding is the loader's idle, named by its line; no host_sync prices the loader's
    time (43.9 ms before issue #48)."""
    s = data_summary("h100-slowhost-sync_per_step")
    f = s["findings"][0]
    assert f["kind"] == "gpu_waits_on_host" and "prepare.py:502 encode" in f["evidence"]
    assert f["fix"].startswith("the GPU waits for the next batch")
    assert not [x for x in s["findings"] if x["kind"] == "host_sync" and x["ms_per_step"] >= 0.01 * s["step_ms"]]


def test_root_cause_first_the_sync_that_exposed_hidden_host_work(data_summary):
    """h100-plant26-sync_exposes_host and -hidden_host_work (benchmarks/findings/planted/diagnoses.py, one
    H100 call, loader off the main thread): 50 ms of Python per micro-batch costs nothing alone (unprofiled
    306.45 ms/step against the baseline's 309.42); with a `.item()` after each backward it costs 97.56 ms/step
    (406.98), because the sync drains the GPU's queue before it. The finding is the sync, its gain the
    combined idle, within 30%."""
    hidden = data_summary("h100-plant26-hidden_host_work")
    assert not [f for f in hidden["findings"] if f["ms_per_step"] >= 0.01 * hidden["step_ms"]]
    s = data_summary("h100-plant26-sync_exposes_host")
    f = s["findings"][0]
    assert f["kind"] == "host_sync" and "with the queue drained" in f["evidence"]
    assert "preprocess `while time.perf_counter() - t0 < 0.05:`" in f["evidence"]
    assert abs(f["ms_per_step"] - 97.56) < 0.3 * 97.56
    assert all(x["ms_per_step"] < 0.1 * f["ms_per_step"] for x in s["findings"][1:])


def test_an_explicit_graph_break_is_the_call_to_delete():
    from profiling.profile.findings import idle
    fix = idle._break_fix(["train.py:412 `torch._dynamo.graph_break()` x8"], "")
    assert fix.startswith("delete the explicit `torch._dynamo.graph_break()` call at train.py:412")
    assert "computes the same" in fix
    assert "delete" in idle._break_fix([], "Call to `torch._dynamo.graph_break()` x8")
    generic = idle._break_fix(["train.py:439 `if x.isnan().any():`"], "Data-dependent branching x8")
    assert generic.startswith("keep the model one graph") and "delete" not in generic
