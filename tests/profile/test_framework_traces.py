"""Real H100 traces of the framework examples, profiled through their one-line callbacks (issue #41;
benchmarks/findings/live/frameworks_results.md): Lightning runs forward and backward inside
`optimizer.step(closure)`, yet the optimizer is only its own kernels; a Hugging Face Trainer run's lines are
the model's (modeling_llama.py), not
`trainer.train()`; both carry samples and tokens per optimizer step."""
import os

import pytest

from profiling.profile.report.summary import summarize
from profiling.profile.trace.traceio import load_trace

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


@pytest.fixture(scope="module")
def lightning():
    return summarize(load_trace(os.path.join(DATA, "h100-lightning-compiled-callback.trace.json.gz")))


@pytest.fixture(scope="module")
def hf():
    return summarize(load_trace(os.path.join(DATA, "h100-hf-llama-compiled-callback.trace.json.gz")))


def test_lightnings_closure_is_the_models_forward_and_backward(lightning):
    assert lightning["categories"]["optimizer"] <= 0.05 * lightning["step_ms"]  # 89-92% before closures.py
    rows = {r["region"]: r for r in lightning["regions"]["rows"]}
    for region in ("attention", "MLP", "head and loss"):
        assert rows[region]["forward_ms"] > 1 and rows[region]["backward_ms"] > rows[region]["forward_ms"]
    assert lightning["categories"]["GEMM"] > 10  # the model's GEMMs, not optimizer work


def test_a_trainer_runs_lines_are_the_models(hf):
    lines = hf["lines"]
    assert lines["placed_percent"] > 90
    files = {x["file"] for r in lines["rows"][:5] for x in r["lines"]}
    assert "transformers/models/llama/modeling_llama.py" in files
    assert lines["rows"][0]["lines"][0]["file"] == "transformers/models/llama/modeling_llama.py"
    assert not any(x["file"] == "transformers/trainer.py" for r in lines["rows"] for x in r["lines"])


@pytest.mark.parametrize("which", ["lightning", "hf"])
def test_the_callbacks_give_samples_and_tokens_per_optimizer_step(which, request):
    s = request.getfixturevalue(which)
    assert (s["samples_per_step"], s["tokens_per_step"]) == (16, 16 * 1024)
    assert s["samples_per_s"] == pytest.approx(16 / (s["step_ms"] / 1e3), rel=0.2)
