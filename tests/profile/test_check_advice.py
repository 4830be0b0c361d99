"""A failed check says what it means for the figures below it and what to do (issue #57 item 5), and the header
shows the step the README says it shows: the unprofiled one where profiling lengthened the step."""
import copy
import os

import pytest

from profiling.profile.report.render import to_markdown
from profiling.profile.report.summary import load_trace, summarize

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
STEP_CHECK = "profiled vs unprofiled step time"


@pytest.fixture(scope="module")
def h100():
    trace = load_trace(os.path.join(DATA, "h100-compiled-gpt-5steps.trace.json.gz"))
    trace["autoresearch"] = {"unprofiled_step_ms": 88.5, "tokens_per_step": 131072}
    return summarize(trace)


@pytest.fixture(scope="module")
def cpu():
    return summarize(load_trace(os.path.join(DATA, "cpu-gpt-2steps.trace.json.gz")))


def failing(summary, unprofiled, load=None):
    s = copy.deepcopy(summary)
    s["unprofiled_step_ms"] = unprofiled
    c = next(c for c in s["checks"] if c["name"] == STEP_CHECK)
    c.update(ok=False, detail="the detail")
    c.pop("explained", None)
    if load:
        c["load"] = load
    return s


def top(md):
    return md.split("\n# Profile:")[0].splitlines()


def test_a_profiled_step_longer_says_which_figures_hold_and_what_to_do(h100):
    lines = top(to_markdown(failing(h100, 80.0)))
    assert lines[0] == f"CHECK FAILED: {STEP_CHECK}: the detail"
    assert lines[1].startswith(f"  means: the profiled step took {h100['step_ms'] - 80:.2f} ms more")
    assert "the header, step budget and MFU show the unprofiled step" in lines[1]
    assert lines[2].startswith("  do: compare runs by the unprofiled figure; profile again when the machine is "
                               "otherwise idle;")
    assert "# Profile: 80.00 ms/step (unprofiled; profiled" in to_markdown(failing(h100, 80.0))


def test_a_profiled_step_shorter_says_the_reference_is_none_and_names_the_load(cpu):
    lines = top(to_markdown(failing(cpu, 2297.5, {"load_average": 5.06, "cores": 2})))
    assert lines[0] == f"CHECK FAILED: {STEP_CHECK}: the detail"
    assert lines[1].startswith("  means: the unprofiled step (2297.50 ms) is no reference for these steps")
    assert "the figures below are the profiled steps' own and hold for them" in lines[1]
    assert lines[2].startswith("  do: profile again when the machine is otherwise idle (load average 5.06 on 2 "
                               "cores as the window opened)")


def test_a_cpu_header_shows_the_unprofiled_step_where_the_profiled_one_was_longer(cpu):
    step = cpu["step_ms"]
    md = to_markdown(failing(cpu, step / 2))
    assert f"\n# Profile: {step / 2:.2f} ms/step (CPU, unprofiled; profiled {step:.2f}: the operator times below " \
           "are the profiled ones)\n" in md
    assert "the operator times below are the profiled ones, each with the profiler's cost in it" in top(md)[1]
    assert f"\n# Profile: {step:.2f} ms/step (CPU)\n" in to_markdown(failing(cpu, 2 * step))  # shorter: its own


def test_other_failed_checks_say_what_they_mean_and_what_to_do(h100):
    s = copy.deepcopy(h100)
    c = next(c for c in s["checks"] if c["name"] == "bogus timestamps")
    c.update(ok=False, detail="3 device events ignored")
    lines = top(to_markdown(s))
    assert lines[:3] == ["CHECK FAILED: bogus timestamps: 3 device events ignored",
                         "  means: those device events are left out of every figure below",
                         "  do: record again if there are many"]


def test_the_check_records_the_load_as_the_window_opened(data_trace):
    trace = data_trace("cpu-gpt-2steps")
    trace.setdefault("autoresearch", {})["cpu_threads"] = {"load_average": 3.5, "cores": 2}
    trace["autoresearch"]["unprofiled_step_ms"] = 1.0  # far from the step: fails
    c = next(c for c in summarize(trace)["checks"] if c["name"] == STEP_CHECK)
    assert not c["ok"] and c["load"] == {"load_average": 3.5, "cores": 2}


def test_a_cpu_limit_counts_the_host_samplers_measured_cost(data_trace):
    """train.py's CPU step on a quiet 2-core host: timed 475-514 ms, profiled 597 ms, of which its 6,303 operators
    cost ~50 ms and the 2 ms host sampler 138 ms of its own time over 5 steps (x2 for the main thread: 55 ms)."""
    from profiling.profile.report import summary
    meta = {"host_samples": {"own_ms": 138.163, "samples": [[k, 1000 * k, 0] for k in range(5)]}}
    assert summary._sampler_ms(meta) == pytest.approx(2 * 138.163 / 5)
    assert summary._sampler_ms({}) == 0.0 and summary._sampler_ms({"host_samples": {"own_ms": 5}}) == 0.0
    timed = [475.28, 495.5, 480.9, 513.94]
    without = summary._check_cpu_spread(STEP_CHECK, 596.93, 491.6, timed, 6303)
    assert not without["ok"]
    c = summary._check_cpu_spread(STEP_CHECK, 596.93, 491.6, timed, 6303, summary._sampler_ms(meta))
    assert c["ok"] and "operators/step and the host sampler's 55.27 ms/step above it" in c["detail"]
