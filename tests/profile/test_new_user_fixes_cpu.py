"""Issue #56's CPU acceptance line on real CPU traces (tests/data/make_cpu_new_user_fixes_traces.py; the live
benchmark is benchmarks/findings/live/new_user_fixes_cpu.py): a stack of layers on one line is no Python loop to
vectorize (findings/cpu.py `layer_stack`), a loop whose sequence length changes every step keeps its long timed
step in the unprofiled figure (trace/irregular.py `_spread`), and a CPU report's title is the unprofiled step
wherever that is the shorter (report/render.py `_title`)."""
import os
import statistics

import pytest

from profiling.profile.report.render import to_markdown
from profiling.profile.report.summary import summarize
from profiling.profile.trace.traceio import load_trace

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def summary(name):
    return summarize(load_trace(os.path.join(DATA, name)))


@pytest.fixture(scope="module")
def mlp():
    return summary("cpu-mlp16-adamw-foreach-off.trace.json.gz")


@pytest.fixture(scope="module")
def hf():
    return summary("cpu-hf-gpt2-dropout.trace.json.gz")


@pytest.fixture(scope="module")
def varlen():
    t = load_trace(os.path.join(DATA, "cpu-varlen-steps.trace.json.gz"))
    return t, summarize(t)


def kinds(s):
    return [f["kind"] for f in s["findings"]]


def test_a_stack_of_layers_on_one_line_is_no_python_loop(mlp):
    # `cross_entropy(model(x), y)`: nn.Sequential runs (linear, layer_norm, gelu) 16 times, each Linear its own
    # weight (16 parameters of [64, 64]); "vectorize the loop" has nothing to vectorize
    assert "python_loop" not in kinds(mlp), mlp["findings"]
    top = mlp["findings"][0]
    assert top["kind"] == "per_tensor_optimizer" and "fused=True" in top["fix"]


def test_gpt2s_conv1d_line_run_once_a_layer_is_no_python_loop(hf):
    # transformers/pytorch_utils.py `torch.addmm(self.bias, x, self.weight)`: 16 calls a step over 4 weight
    # shapes, 4 parameters of each
    assert "python_loop" not in kinds(hf), [(f["kind"], f["evidence"][:120]) for f in hf["findings"]]
    assert not any("pytorch_utils.py" in f["fix"] for f in hf["findings"])


def test_a_loop_over_a_batchs_samples_is_still_a_python_loop():
    s = summary("cpu-per-sample-loss.trace.json.gz")  # one loss per sample: the same module for every sample
    assert s["findings"][0]["kind"] == "python_loop"


def test_steps_of_changing_length_keep_their_long_timed_step(varlen):
    t, s = varlen
    meta = t["autoresearch"]
    timed = meta["timed_step_ms_each"]
    assert max(timed) >= 2 * statistics.median(timed)  # the 512-token timed step: an outlier by the 2x rule
    assert s["unprofiled_step_ms"] == pytest.approx(statistics.mean(timed))  # kept: the loop's own work
    check = next(c for c in s["checks"] if c["name"] == "profiled steps alike")
    assert "by design" in check["detail"], check
    each = s["step_ms_each"]
    assert max(each) >= 2 * min(each) and len(each) == 3  # every profiled step kept


def test_a_cpu_title_is_the_unprofiled_step_where_that_is_the_shorter(mlp, varlen):
    for s in (mlp, varlen[1]):
        u = s["unprofiled_step_ms"]
        assert 0 < u < s["step_ms"]
        assert f"\n# Profile: {u:.2f} ms/step (CPU, unprofiled; profiled {s['step_ms']:.2f}" in to_markdown(s)


# On the CPU, advice that does not pay (issue #56): torch.compile made every CPU loop timed slower (the HF GPT-2 with
# dropout -5.8 and -3.6 ms/step, the varying-length loop -22.6, a tiny HF BERT -15 to -20:
# benchmarks/findings/live/new_user_fixes_cpu_results.md), so the eager chains are named in `unknown`, not priced.

CPU_FIXTURES = sorted(n for n in os.listdir(DATA) if n.startswith("cpu-") and n.endswith(".json.gz"))


@pytest.mark.parametrize("name", CPU_FIXTURES)
def test_no_cpu_report_prices_compiling(name):
    s = summary(name)
    assert not [f for f in s["findings"] if f["kind"] == "eager_code"], s["findings"]
    assert not [f for f in s["findings"] if "torch.compile" in f["fix"] or "compile the" in f["fix"]], s["findings"]


def test_the_eager_chains_are_named_unpriced_with_their_figures(hf):
    (u,) = [u for u in hf["unknown"] if u["rule"] == "eager_code"]
    assert u.get("unpriced") and 0 < u["ms_per_step"] < hf["step_ms"]
    what = u["what"]
    assert f"({u['ms_per_step']:.1f} ms of self time)" in what and "chains of elementwise operators" in what
    assert "fused into one pass would save ~" in what and "unmeasured" in what, what
    assert "time the compiled step" in what, what
    assert "GPT-2" not in what and "this project" not in what, what  # the user's run only (#56 item 4)
    report = to_markdown(hf)
    (line,) = [x for x in report.splitlines() if x.startswith("not priced: ") and "elementwise" in x]
    assert line.endswith(f"(~{u['ms_per_step']:.2f} ms/step, eager_code; would need: the compiled step timed on "
                         "this host against this one)"), line


def test_dropouts_random_masks_are_an_experiment_not_a_finding(hf):
    # GPT-2 at its default dropout 0.1: aten::bernoulli_ under aten::dropout, then MulBackward0 of the mask; its
    # only remedy (p=0) changes the model: an experiment line, never a finding's fix
    (u,) = [u for u in hf["unknown"] if u["rule"] == "dropout"]
    share = u["ms_per_step"] / hf["step_ms"]
    assert u.get("experiment") and not u.get("unpriced") and 0.10 <= share < 0.5, u
    assert f"{u['ms_per_step']:.1f} ms/step, {100 * share:.0f}% of the step" in u["what"], u["what"]
    assert "dropout 0 (or fewer dropout layers) is an experiment" in u["what"] and "not a fix" in u["what"]
    assert not any("dropout" in f["fix"] for f in hf["findings"])
    report = to_markdown(hf).splitlines()
    (line,) = [x for x in report if x.startswith("experiment (it changes what the model computes): dropout's")]
    assert line.endswith(f"(~{u['ms_per_step']:.2f} ms/step, dropout)"), line
    # the headline says why no finding leads: no fix that keeps the model, an experiment below
    assert any(x.startswith("No rule found a cause costing 1% of the step or more with a fix that keeps what the "
                            "model computes; an experiment that changes it is below") for x in report)


def test_attentions_dropout_is_named_as_what_keeps_sdpa_on_its_math_path(hf):
    """On a CPU, SDPA's fused kernel takes no dropout: GPT-2's attn_pdrop 0.1 sends each layer's attention (4 a
    step) down `aten::_scaled_dot_product_attention_math`, which dropout 0 also removes (measured in one process
    on the live loop: the masks priced 51.1 ms/step, dropout off recovered 65)."""
    (u,) = [u for u in hf["unknown"] if u["rule"] == "dropout"]
    assert "4 attention calls a step ran SDPA's math path (`aten::_scaled_dot_product_attention_math`" in u["what"]
    assert "because their dropout_p > 0" in u["what"], u["what"]


def test_a_loop_without_dropout_has_no_dropout_line(mlp):
    assert not [u for u in mlp["unknown"] if u["rule"] == "dropout"]


@pytest.fixture(scope="module")
def one_line():
    t = load_trace(os.path.join(DATA, "cpu-varlen-one-line-step.trace.json.gz"))
    return t, summarize(t)


def test_the_optimizers_own_loop_on_a_line_that_runs_the_whole_step_is_no_per_parameter_loop(one_line):
    # `profile_steps(lambda: step(), ...)`, the step's code outside the script's folder: its one line of the user's
    # code runs the forward, the backward and AdamW's update tensor by tensor (a block of 10 operators 54 times).
    # That loop is the optimizer's, priced by per_tensor_optimizer; as a per_parameter_loop it was priced at the
    # whole line's time (108.7 ms of a 157 ms step) and led
    _, s = one_line
    assert "per_parameter_loop" not in kinds(s), [(f["kind"], f["ms_per_step"]) for f in s["findings"]]
    assert "per_tensor_optimizer" in kinds(s)


def test_the_steps_timed_after_the_window_are_in_the_per_step_figure(one_line):
    t, s = one_line
    meta = t["autoresearch"]
    after, each = meta["timed_after"], meta["timed_step_ms_each"]
    assert after["before"] == 5 and after["after"] > 5 and not after["drifted"]  # random lengths: no change of pace
    assert len(each) == 5 + after["after"]
    assert after["error"] <= 0.035 or len(each) + after["left_out"] >= 200  # known within 3%, or the cap
    assert s["unprofiled_step_ms"] == pytest.approx(statistics.fmean(each), rel=1e-6)  # every step: sizes vary
    md = to_markdown(s)
    assert f"5 steps timed before the window and {after['after']} after it" in md
    assert "unprofiled step: measured before and after the profiled steps" in md
