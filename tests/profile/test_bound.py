"""The step's bound and the findings for causes no narrower rule names (issue #26), on real H100 traces.

tests/data/h100-plant26-*.trace.json.gz: benchmarks/diagnoses.py's plants of issue #26 (one H100 80GB HBM3,
one call, 2026-11-23, the loader off the main thread), 2 steps each. Unprofiled ms/step measured in the same
call: baseline 309.87, eager_model 555.02 (+245.15), odd_mlp_width 341.02 (+31.15), fp32_logits 316.29 (+6.42).
"""
import os

import pytest

from profiling.profile import render, summary

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
CLEAN = ["h100-plant26-baseline", "h100-cudnn-window-gpt-5steps", "h100-plant-baseline", "h100-compile-a",
         "h100-compile-b", "h100-lines-gpt-2steps"]


def load(name):
    return summary.summarize(summary.load_trace(os.path.join(DATA, f"{name}.trace.json.gz")))


@pytest.fixture(scope="module")
def base():
    return load("h100-plant26-baseline")


def test_each_region_has_a_bound_below_its_time_and_the_step_sums_them(base):
    rows = {r["region"]: r for r in base["regions"]["rows"]}
    for name in ("attention", "MLP", "norms and residuals", "head and loss", "embedding"):
        assert 0 < rows[name]["bound_ms"] < rows[name]["ms_per_step"], name
    assert rows["GPU idle"]["bound_ms"] == 0.0
    b = base["bound"]
    assert b["ms"] == pytest.approx(sum(r["bound_ms"] for r in base["regions"]["rows"]), abs=1e-3)
    # the MLP's GEMMs near the trace's best rate: its bound is most of its time; attention's flash kernels less
    assert rows["MLP"]["bound_ms"] / rows["MLP"]["ms_per_step"] > 0.8
    assert 650 < b["gemm_tflops_per_s"] < 800 and b["known_percent"] > 99  # a healthy H100's GEMMs
    assert 1.2 < b["measured_ms"] / b["ms"] < 1.6


def test_the_report_shows_the_bound_column_and_line(base):
    md = render.to_markdown(base)
    assert "| bound ms" in md and f"**{base['bound']['ms']:.2f}**" in md
    assert f"bound {base['bound']['ms']:.2f} ms, measured {base['step_ms']:.2f} ms" in md


@pytest.mark.parametrize("name", CLEAN)
def test_clean_runs_stay_quiet(name):
    """The new rules never fire on the default config (older traces, made while the loader ran on the main
    thread, may show the loader's idle: gpu_waits_on_host, a real cause there)."""
    s = load(name)
    assert [f["kind"] for f in s["findings"] if f["kind"] in ("eager_code", "over_bound")] == []


def test_the_clean_default_has_no_finding_of_1_percent_and_says_what_is_unexplained(base):
    assert [f["kind"] for f in base["findings"] if f["ms_per_step"] >= 0.01 * base["step_ms"]] == []
    assert "No rule found a cause costing 1% of the step or more" in render.to_markdown(base)
    assert "x its bound" in render.to_markdown(base)


def test_an_uncompiled_model_is_eager_code_with_its_loss():
    s = load("h100-plant26-eager_model")
    top = s["findings"][0]
    assert top["kind"] == "eager_code" and "mostly in the model" in top["evidence"]
    assert 0.7 * 245.15 <= top["ms_per_step"] <= 1.3 * 245.15  # the measured unprofiled loss
    assert "torch.compile the model" in top["fix"]


def test_an_uncompiled_optimizer_is_named_as_such():
    s = load("h100-plant26-eager_optimizer")
    f = next(f for f in s["findings"] if f["kind"] == "eager_code")
    assert "mostly in the optimizer" in f["evidence"] and "torch.compile the optimizer" in f["fix"]


def test_misaligned_gemms_are_over_their_bound():
    """No rule knows misaligned shapes: over_bound points at the MLP's slow GEMM kernel."""
    s = load("h100-plant26-odd_mlp_width")
    top = s["findings"][0]
    first = top["evidence"].split("x its bound")[0]
    assert top["kind"] == "over_bound" and "gemm" in first and "(GEMM)" in first
    assert top["ms_per_step"] >= 0.01 * s["step_ms"]
    assert "multiples of 64" in top["fix"]


def test_traces_without_shapes_have_no_bound():
    s = load("h100-compiled-gpt-5steps")  # recorded without input shapes: no FLOPs, no bytes
    assert all(r.get("bound_ms") in (None, r["ms_per_step"], 0.0) or r["region"] == "overlap"
               for r in s["regions"]["rows"]) or s["bound"]["known_percent"] < 50


def test_when_profiling_distorts_the_step_the_report_shows_the_unprofiled_one():
    """h100-slowhost-baseline: the default config on an H100 whose host could not feed the GPU while the loader
    ran on the main thread (before issue #25): profiled far longer than unprofiled, its check failed."""
    s = load("h100-slowhost-baseline")
    u, step = s["unprofiled_step_ms"], s["step_ms"]
    assert step > 1.1 * u
    md = render.to_markdown(s)
    title = next(line for line in md.splitlines() if line.startswith("# Profile:"))
    assert title.startswith(f"# Profile: {u:.2f} ms/step (unprofiled; profiled {step:.2f}")
    budget = md.split("## 1. Step budget")[1].split("###")[0]
    rows = [r.split("|") for r in budget.splitlines() if r.startswith("| ") and "part" not in r and "**" not in r]
    assert sum(float(r[2]) for r in rows) == pytest.approx(u, abs=0.05)  # the parts add up to the unprofiled step
    assert f"**{u:.2f}**" in budget and f"note: profiled {step:.2f} ms/step" in budget
    idle = u - (step - s["idle_ms"])
    assert any("GPU idle" in r[1] and float(r[2]) == pytest.approx(idle, abs=0.01) for r in rows)
    assert f"MFU {s['mfu_percent'] * step / u:.1f}%" in budget
    assert render.to_json(s) == render.to_json(load("h100-slowhost-baseline"))  # the JSON keeps the profiled step


def test_float32_activations_are_fp32_intermediate_beside_fp32_matmul():
    """h100-plant-fp32_mlp (issue #16's plant: the MLP in float32, +77.0 ms/step unprofiled): fp32_matmul
    counts its GEMMs, fp32_intermediate the float32 elementwise traffic around them; together within 30%."""
    s = summary.summarize(summary.load_trace(os.path.join(DATA, "h100-plant-fp32_mlp.trace.json.gz")))
    kinds = {f["kind"]: f for f in s["findings"]}
    f = kinds["fp32_intermediate"]
    assert s["findings"][0] is f and "largest [128, 2048, 512], 537 MB" in f["evidence"]
    assert 0.7 * 77.02 <= f["ms_per_step"] + kinds["fp32_matmul"]["ms_per_step"] <= 1.3 * 77.02
    assert "fp32_intermediate" not in {x["kind"] for x in load("h100-plant26-eager_model")["findings"]}
