"""The `regression` finding (issue #26): where the step grew since a reference profile, on the H100 plants of
issue #26 (tests/data/h100-plant26-*, one machine, one call; unprofiled ms/step: baseline 309.87,
checkpoint_blocks 391.28, odd_mlp_width 341.02, fp32_logits 316.29, eager_model 555.02)."""
import json
import os

import pytest

from profiling.cli import main
from profiling.profile.report import regression, summary

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def load(name):
    return summary.load_summary(os.path.join(DATA, f"{name}.trace.json.gz"))


@pytest.fixture(scope="module")
def base():
    return load("h100-plant26-baseline")


@pytest.mark.parametrize("case,loss", [("checkpoint_blocks", 81.41), ("odd_mlp_width", 31.15),
                                       ("fp32_logits", 6.42), ("eager_model", 245.15)])
def test_the_growth_is_the_measured_loss_and_says_where(base, case, loss):
    f = regression.regression(base, load(f"h100-plant26-{case}"), "experiment 1 (c64cda3)")
    assert f["kind"] == "regression" and 0.9 * loss - 1 <= f["ms_per_step"] <= 1.1 * loss + 1
    assert f"the unprofiled step +{loss - 0.04:.1f}"[:-1] in f["evidence"] and "since experiment 1 (c64cda3)" in f["evidence"]
    assert "regions (ms/step):" in f["evidence"] and "kernels:" in f["evidence"]


def test_checkpointing_points_at_the_recomputed_regions_and_the_planted_lines(base):
    f = regression.regression(base, load("h100-plant26-checkpoint_blocks"))
    assert "regions (ms/step): MLP +" in f["evidence"] and "attention +" in f["evidence"]
    assert "checkpoint_blocks/train.py:" in f["fix"]


def test_no_growth_no_finding(base):
    assert regression.regression(base, base) is None
    assert regression.regression(load("h100-plant26-eager_model"), base) is None  # faster is no regression
    a, b = load("h100-compile-a"), load("h100-compile-b")  # two fresh compiles of one commit
    assert regression.regression(a, b) is None and regression.regression(b, a) is None


def test_other_devices_are_not_compared(base):
    other = dict(load("h100-plant26-checkpoint_blocks"), device="NVIDIA H200")
    assert regression.regression(base, other) is None


def test_research_profile_against_adds_the_finding_first(capsys):
    trace = os.path.join(DATA, "h100-plant26-checkpoint_blocks.trace.json.gz")
    ref = os.path.join(DATA, "h100-plant26-baseline.trace.json.gz")
    assert main(["profile", trace, "--against", ref]) == 0
    out = capsys.readouterr().out
    assert out.split("## 0.")[1].splitlines()[1].startswith("1. **regression**: ~79.7")
    assert "## 4." in out  # the changes table as with --previous
    assert main(["profile", trace, "--json", "--previous", ref]) == 0
    assert json.loads(capsys.readouterr().out)["findings"][0]["kind"] == "regression"
