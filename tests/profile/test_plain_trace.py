"""Issue #34: a trace recorded as people usually record it (plain torch.profiler, with_stack=True, none of this
profiler's metadata). Python stacks slow the host, so without the user's unprofiled step time the GPU idle is
not priced (it may be the profiler's own), and section 0 says so; given the figure, the idle is priced at its
share of it, as for a live capture. The plain trace here is a real H100 trace of train.py with 16 micro-batches
(launch-bound) stripped of this profiler's metadata and marked as recorded with stacks."""
import json
import os
import subprocess
import sys

import pytest

from profiling.profile.report import render
from profiling.profile.report.summary import META_KEY, summarize

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
ROOT = os.path.dirname(DATA.rsplit(os.sep, 1)[0])
IDLE_RULES = {"host_sync", "graph_break", "blocking_launch", "alloc_churn", "cuda_sync", "launch_bound",
              "gpu_waits_on_host", "per_parameter_loop", "python_loop", "host_read", "host_tensor"}
RECORDED = {"host_sync", "cuda_sync", "alloc_churn"}  # issue #48: they price what the trace records (a sync's own
                                                      # gap, at most the host's wait in it; a pageable copy's device
                                                      # time; the idle inside the allocator's calls), stacks or not


LIVE = "h100-plant-small_batch"


@pytest.fixture
def live(data_trace):
    """live() -> a fresh copy of the live capture's trace (parsed anew from the text kept in memory: about
    twice as fast as copy.deepcopy)."""
    return lambda: data_trace(LIVE)


def plain(live, stacks=True):
    trace = live()
    del trace[META_KEY]
    if stacks:
        trace["with_stack"] = 1  # as torch 2.x writes it at the top of an exported trace
    return trace


def test_with_stacks_and_no_unprofiled_figure_no_idle_is_priced_and_section_0_says_why(live):
    s = summarize(plain(live))
    assert s["recorded"]["by"] == "torch.profiler" and s["recorded"]["stacks"] and not s["recorded"]["unprofiled"]
    assert not IDLE_RULES & {f["kind"] for f in s["findings"]}
    assert {x["rule"] for x in s["skipped"] if "own_idle" in x["missing"]} == IDLE_RULES - RECORDED
    idle = [u for u in s["unknown"] if u["rule"] == "GPU idle"]
    assert len(idle) == 1 and idle[0]["ms_per_step"] == pytest.approx(s["idle_ms"], abs=0.01) and s["idle_ms"] > 300
    md = render.to_markdown(s)
    head, section0 = md.split("## 0.")[0], md.split("## 0.")[1].split("## 1.")[0]
    assert "Recorded by torch.profiler: Python stacks (with_stack)" in head
    assert "the profiled step could not be checked (give it: --unprofiled-ms)" in head
    assert "unexplained: GPU idle in a trace recorded with Python stacks" in section0
    assert "the idle may be the profiler's own cost" in section0


def test_given_the_users_unprofiled_figure_the_idle_is_priced_at_its_share(live):
    """With the live run's own unprofiled figure, the plain trace's launch_bound is the live capture's (the
    same idle, scaled to the same unprofiled step); a slower figure leaves more idle to gain."""
    own_trace = live()
    unprofiled = own_trace[META_KEY]["unprofiled_step_ms"]
    own = next(f for f in summarize(own_trace)["findings"] if f["kind"] == "launch_bound")
    given = summarize(plain(live), unprofiled_ms=unprofiled)
    assert given["recorded"]["unprofiled"] == "given" and not given["unknown"]
    bound = next(f for f in given["findings"] if f["kind"] == "launch_bound")
    assert bound["ms_per_step"] == pytest.approx(own["ms_per_step"], rel=0.05)
    slower = summarize(plain(live), unprofiled_ms=unprofiled + 100)
    more = next(f for f in slower["findings"] if f["kind"] == "launch_bound")
    assert more["ms_per_step"] > bound["ms_per_step"] + 50
    md = render.to_markdown(given)
    assert f"# Profile: {unprofiled:.2f} ms/step (unprofiled; profiled" in md  # the figures follow it
    assert "unprofiled step: given (--unprofiled-ms)" in md


def test_without_stacks_the_idle_is_priced_as_recorded(live):
    s = summarize(plain(live, stacks=False))
    assert not s["recorded"]["stacks"] and "launch_bound" in {f["kind"] for f in s["findings"]}


def test_the_flag_on_the_command_line(live, tmp_path):
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(plain(live)))
    run = lambda *a: subprocess.run([sys.executable, "-m", "profiling", "profile", str(path), *a], cwd=ROOT,
                                    capture_output=True, text=True)
    bad = run("--unprofiled-ms", "fast")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        "--unprofiled-ms: expected the unprofiled step time in ms, a number above 0, got 'fast'")
    assert run("--unprofiled-ms", "-3").returncode == 2
    good = run("--unprofiled-ms", "480.5")
    assert good.returncode == 0 and "**launch_bound**" in good.stdout


# The two example models' own plain traces (examples/*_train.py --plain-trace: torch.profiler with stacks, shapes
# and modules, no metadata of ours), recorded on the H100 on 2026-11-25
# (benchmarks/findings/live/models_results.md), one step each; their unprofiled ms/step measured in the same
# device call.
PLAIN = {"gpt2": ("h100-gpt2-clean-plain.trace.json.gz", 36.57), "llama": ("h100-llama-clean-plain.trace.json.gz", 32.90)}


@pytest.mark.parametrize("model", sorted(PLAIN))
def test_the_example_models_plain_traces(model, data_trace):
    name, unprofiled = PLAIN[model]
    s = summarize(data_trace(name))
    assert s["recorded"]["stacks"] and s["recorded"]["modules"] and not s["recorded"]["unprofiled"]
    assert s["idle_percent"] > 60 and not IDLE_RULES & {f["kind"] for f in s["findings"]}
    section0 = render.to_markdown(s).split("## 0.")[1].split("## 1.")[0]
    assert "the idle may be the profiler's own cost" in section0
    given = summarize(data_trace(name), unprofiled_ms=unprofiled)  # the user's figure: the step follows it
    assert given["unprofiled_step_ms"] == unprofiled and given["recorded"]["unprofiled"] == "given"
    md = render.to_markdown(given)
    assert md.startswith("CHECK FAILED") and f"# Profile: {unprofiled:.2f} ms/step (unprofiled" in md
    assert f"corrected idle = unprofiled - device busy = {unprofiled - given['device_ms']:.1f} ms/step" in md
