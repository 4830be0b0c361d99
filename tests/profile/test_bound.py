"""The step's bound and the findings for causes no narrower rule names (issue #26), on real H100 traces.

tests/data/h100-plant26-*.trace.json.gz: benchmarks/findings/planted/diagnoses.py's plants of issue #26 (one
H100 80GB HBM3, one call, 2026-11-23, the loader off the main thread), 2 steps each. Unprofiled ms/step
measured in the same call: baseline 309.87, eager_model 555.02 (+245.15), odd_mlp_width 341.02 (+31.15),
fp32_logits 316.29 (+6.42). tests/data/h100-fresh-*.trace.json.gz: plants made after the rules recompute and
misaligned_shapes were written (benchmarks/findings/planted/diagnoses.py, 2026-11-24, two calls on one H100),
2 steps each.
"""
import os

import pytest

from profiling.profile.report import render, summary

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
CLEAN = ["h100-plant26-baseline", "h100-cudnn-window-gpt-5steps", "h100-plant-baseline", "h100-compile-a",
         "h100-compile-b", "h100-lines-gpt-2steps"]


@pytest.fixture(scope="module")
def load(data_summary):
    """load(name) -> the fixture's summary (conftest's data_summary: made once per run, a fresh copy)."""
    def get(name):
        return data_summary(os.path.join(DATA, f"{name}.trace.json.gz"))
    return get


@pytest.fixture(scope="module")
def base(load):
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
def test_clean_runs_stay_quiet(name, load):
    """The new rules never fire on the default config (older traces, made while the loader ran on the main
    thread, may show the loader's idle: gpu_waits_on_host, a real cause there)."""
    s = load(name)
    assert [f["kind"] for f in s["findings"] if f["kind"] in ("eager_code", "over_bound")] == []


def test_the_clean_default_has_no_finding_of_1_percent_and_says_what_is_unexplained(base):
    assert [f["kind"] for f in base["findings"] if f["ms_per_step"] >= 0.01 * base["step_ms"]] == []
    assert "No rule found a cause costing 1% of the step or more" in render.to_markdown(base)
    assert "x its bound" in render.to_markdown(base)


def test_an_uncompiled_model_is_eager_code_with_its_loss(load):
    s = load("h100-plant26-eager_model")
    top = s["findings"][0]
    assert top["kind"] == "eager_code" and "mostly in the model" in top["evidence"]
    assert 0.7 * 245.15 <= top["ms_per_step"] <= 1.3 * 245.15  # the measured unprofiled loss
    assert "torch.compile the model" in top["fix"]


def test_an_uncompiled_optimizer_is_named_as_such(load):
    s = load("h100-plant26-eager_optimizer")
    f = next(f for f in s["findings"] if f["kind"] == "eager_code")
    assert "mostly in the optimizer" in f["evidence"] and "torch.compile the function that calls optimizer.step()" \
        in f["fix"] and "fused=True" in f["fix"]


def test_misaligned_widths_are_named_with_their_parameters_and_loss(load):
    """odd_mlp_width (hidden 2049): the GEMMs on the padded shape are placed in the MLP, and misaligned_shapes
    names the parameters, within 30% of the measured loss (31.15 ms)."""
    s = load("h100-plant26-odd_mlp_width")
    top = s["findings"][0]
    assert top["kind"] == "misaligned_shapes" and "[2049, 512]" in top["evidence"]
    assert 0.7 * 31.15 <= top["ms_per_step"] <= 1.3 * 31.15
    assert "multiple of 64" in top["fix"]
    assert s["regions"]["attributed_percent"] > 99  # before the padded shapes: 79.5%
    mlp = next(r for r in s["regions"]["rows"] if r["region"] == "MLP")
    assert mlp["ms_per_step"] > 130  # the baseline's 106.6 plus the loss


def test_fresh_misaligned_width_is_named_and_its_aligned_twin_is_clean(load):
    """h100-fresh-mlp_width_1365 / _1344 (one H100 call, 2026-11-24, after the rule was written): int(8/3 x 512)
    against the same width rounded to 64. Kernel time 269.5 -> 290.6 ms (5 steps); unprofiled 276.68 -> 290.41."""
    odd, aligned = load("h100-fresh-mlp_width_1365"), load("h100-fresh-mlp_width_1344")
    assert odd["findings"][0]["kind"] == "misaligned_shapes" and "[1365, 512]" in odd["findings"][0]["evidence"]
    assert not aligned["findings"]


def test_activation_checkpointing_is_recompute_with_its_loss(load):
    """checkpoint_blocks: every block's forward re-run in the backward: the backward GEMMs do 3x the forward's
    FLOPs in attention and MLP (2x without), measured loss 81.4 ms; fresh checkpoint_mlp (MLP only, a case made
    after the rule): 18.87 ms (unprofiled 326.72 vs 307.85 in that call)."""
    s = load("h100-plant26-checkpoint_blocks")
    top = s["findings"][0]
    assert top["kind"] == "recompute" and "attention 3.00x" in top["evidence"] and "MLP 3.00x" in top["evidence"]
    assert 0.7 * 81.4 <= top["ms_per_step"] <= 1.3 * 81.4
    assert "torch.utils.checkpoint" in top["fix"]
    mlp_only = load("h100-fresh-checkpoint_mlp")["findings"]
    assert [f["kind"] for f in mlp_only] == ["recompute"] and "attention" not in mlp_only[0]["evidence"]
    assert 0.7 * 18.87 <= mlp_only[0]["ms_per_step"] <= 1.3 * 18.87


def test_backward_gemms_do_twice_the_forward_flops_in_a_clean_run(base):
    for row in base["regions"]["rows"]:
        if row.get("gemm_flops"):
            assert row["gemm_flops"]["backward"] == pytest.approx(2 * row["gemm_flops"]["forward"], rel=0.01)


def test_a_graph_break_counts_only_the_work_one_graph_would_fuse(load):
    """h100-fresh-eager_attention: @torch.compiler.disable on the attention module, +59.99 ms measured; its
    GEMMs, attention and kernels.py operators run as long in one graph and are not counted."""
    s = load("h100-fresh-eager_attention")
    top = s["findings"][0]
    assert top["kind"] == "graph_break" and "torch.compiler.disable" in top["evidence"]
    assert "aten::mm" not in top["evidence"] and "attention_backward" not in top["evidence"]
    assert 59.99 <= top["ms_per_step"] <= 1.35 * 59.99


def test_traces_without_shapes_have_no_bound(load):
    """The shared fixture, recorded without input shapes: no kernel has a known work, so a bound summed from
    measured times would be the step itself (1.01x, once printed); no bound, and section 0 says why."""
    s = load("h100-compiled-gpt-5steps")
    assert s["bound"]["ms"] is None and s["bound"]["known_percent"] == 0
    assert not any("bound_ms" in r for r in s["regions"]["rows"])
    md = render.to_markdown(s)
    assert "x its bound" not in md and "| bound ms" not in md
    assert "the step's bound cannot be judged (0.0% of device time has a known work" in md


def test_when_profiling_distorts_the_step_the_report_shows_the_unprofiled_one(load):
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


def test_float32_activations_are_fp32_intermediate_beside_fp32_matmul(load):
    """h100-plant-fp32_mlp (issue #16's plant: the MLP in float32, +77.0 ms/step unprofiled): fp32_matmul
    counts its GEMMs, fp32_intermediate the float32 elementwise traffic around them; together within 30%."""
    s = load("h100-plant-fp32_mlp")
    kinds = {f["kind"]: f for f in s["findings"]}
    f = kinds["fp32_intermediate"]
    assert s["findings"][0] is f and "largest [128, 2048, 512], 537 MB" in f["evidence"]
    assert 0.7 * 77.02 <= f["ms_per_step"] + kinds["fp32_matmul"]["ms_per_step"] <= 1.3 * 77.02
    assert "fp32_intermediate" not in {x["kind"] for x in load("h100-plant26-eager_model")["findings"]}


def test_a_no_grad_forward_in_the_step_is_forward_without_backward(load):
    """h100-fresh-eval_forward: a torch.no_grad forward of one micro-batch each step (+48.89 ms measured,
    unprofiled 355.72 vs 306.83 in that call): every region's backward GEMMs do 1.33x its forward's."""
    s = load("h100-fresh-eval_forward")
    top = s["findings"][0]
    assert top["kind"] == "forward_without_backward" and "MLP 1.33x" in top["evidence"]
    assert 0.7 * 48.89 <= top["ms_per_step"] <= 1.3 * 48.89
    assert "torch.no_grad" in top["fix"]
    assert not any(f["kind"] == "forward_without_backward" for f in load("h100-plant26-baseline")["findings"])


def test_torch_cuda_synchronize_is_a_host_sync_with_its_line(load):
    """h100-fresh-sync_microbatch: torch.cuda.synchronize() after each backward has no operator around it; the
    host samples place the host in train.py, so it is the step's sync, and the first finding (root cause)."""
    s = load("h100-fresh-sync_microbatch")
    top = s["findings"][0]
    assert top["kind"] == "host_sync" and "cudaDeviceSynchronize x2" in top["evidence"]
    assert "sync_microbatch/train.py:399" in top["evidence"]


def test_a_misaligned_vocabulary_is_padded_and_masked_a_width_is_said_to_change_the_model():
    from profiling.profile.findings import waste
    vocab = waste._aligned_fix({"lm_head.weight": [8193, 768], "transformer.wte.weight": [8193, 768]})
    assert "pad the vocabulary 8193 to 8256" in vocab and "mask the padded rows' logits to -inf" in vocab
    assert "stay exactly the same" in vocab and "round the width" not in vocab
    width = waste._aligned_fix({"blocks.0.mlp.c_fc.weight": [1365, 512]})
    assert "round the width behind blocks.0.mlp.c_fc.weight" in width and "changes the model" in width
    assert "vocabulary" not in width
    both = waste._aligned_fix({"lm_head.weight": [50257, 768], "blocks.0.mlp.c_fc.weight": [1365, 512]})
    assert both.index("pad the vocabulary 50257 to 50304") < both.index("round the width")
