"""Loops whose steps are not alike, as an H200 recorded them (issue #57 items 1-2; 2026-11-28): device-only timed
steps whose operators come from one untimed step, and the one-off step named by what it ran.

The fixtures are three traces of benchmarks/findings/live/uneven_steps.py (ac2g flow events left out), as the
capture wrote them, operators joined: `eval_in_window` through transformers.Trainer + HFCallback (an eval of 20
forwards in profiled step 2) and through lightning.Trainer + LightningCallback (its validation loop at the start
of profiled step 2), `varying_size` through the API (a new input size every step; step 2 the first of its size).
A trace keeps no untimed step of its own: join_fixtures.rejoin takes the copies out and joins again with the
like step that joined best in its place, as today's capture would join it.
"""
import pytest

from benchmarks.same_output import join_fixtures
from profiling.profile.report import render
from profiling.profile.report.summary import summarize
from profiling.profile.trace import irregular

EVAL_HF, EVAL_LIGHTNING, SIZES_API = ("h200-uneven-eval_in_window-hf", "h200-uneven-eval_in_window-lightning",
                                      "h200-uneven-varying_size-api")


@pytest.fixture(scope="session")
def rejoined(computed, data_trace):
    """rejoined(name) -> (the trace joined again, its summary), made once per run for all workers."""
    def make(name):
        joined = join_fixtures.rejoin(data_trace(name))
        return joined, summarize(joined)
    return lambda name: computed.get(("uneven-rejoined", name), lambda: make(name))


@pytest.mark.parametrize("name", [EVAL_HF, EVAL_LIGHTNING, SIZES_API])
def test_the_tables_read_steps_joined_whole(name, rejoined):
    """95% of the like steps' device time joined, at least (issue #57 acceptance 1); where a one-off step's kernels
    were not (the eval's forwards, which the untimed step did not run), the report says so and what it cost."""
    trace, s = rejoined(name)
    ops = s["recorded"]["ops"]
    assert ops["joined"] >= 0.95
    record = trace["autoresearch"]["operators"]
    assert len(record["per_step"]) == 5
    text = render._ops_text(ops, s)
    assert "of the like steps' device time, which every table reads" in text
    if name == SIZES_API:  # a new size: the same calls, other kernels, paired call by call
        assert record["unjoined_us"] == 0.0
        return
    assert ops["joined_all"] < 0.6  # the eval's 1,100-odd kernels: over 40% of the window's device time
    (off,) = ops["one_off"]
    assert off["position"] == 2 and off["kind"] == "eval" and off["joined"] < 0.3
    assert ("profiled step 2 (eval), " in text and "left out of every table as a one-off, it costs the tables "
            "nothing" in text)


@pytest.mark.parametrize("name", [EVAL_HF, EVAL_LIGHTNING])
def test_an_eval_in_the_window_is_named_an_eval(name, rejoined):
    """HF's eval left no frame of its own in the host samples: its kernels say it was a forward without backward.
    Lightning's was read as a 157 ms wait for the DataLoader (the loader's copied annotation stretched over it)."""
    _, s = rejoined(name)
    (row,) = s["one_off"]
    assert row["kind"] == "eval" and row["position"] == 2 and row["ms"] > 100
    assert "an eval:" in row["text"]
    if name == EVAL_HF:
        assert "forward without backward" in row["text"]
    assert not any("waiting for the DataLoader" in n for n in s["notes"])
    assert s["steps"] == 4


def test_the_loaders_copy_keeps_its_pace_where_an_eval_ran_before_it(rejoined):
    trace, _ = rejoined(EVAL_LIGHTNING)
    events = trace["traceEvents"]
    step = next(e for e in events if e.get("name") == "ProfilerStep#2" and e.get("cat") == "user_annotation")
    loads = [e for e in events if "DataLoader" in str(e.get("name")) and step["ts"] <= e["ts"] < step["ts"] +
             step["dur"]]
    assert loads and all(e["dur"] < 20e3 for e in loads)  # 6.3 ms, just before the step's first launch
    assert all(e["ts"] > step["ts"] + 100e3 for e in loads)


def test_a_first_seen_size_is_a_cold_first_call(rejoined):
    """Step 2 ran the like steps' kernels, its host 28 ms longer in 1,938 more `cudaPeekAtLastError` calls (cuDNN
    trying its engines at a new input size): named as such, never priced per step."""
    _, s = rejoined(SIZES_API)
    (row,) = s["one_off"]
    assert row["kind"] == irregular.COLD_CALL == "cold first call" and row["position"] == 2
    assert "`cudaPeekAtLastError` x1,938" in row["text"]
    assert "cuDNN's engines at an input size it had not seen" in row["text"]
    assert s["steps"] == 4


@pytest.mark.parametrize("name", [EVAL_HF, EVAL_LIGHTNING])
def test_the_traces_as_captured_read_the_same(name, data_summary):
    """As the capture wrote them, before the join kept each step's share or the untimed step's pace: the shares
    read from the trace step by step, the eval named, Lightning's loader copy stretched over the validation loop
    not taken for a wait (the launches inside it, without operators, were the eval's)."""
    s = data_summary(name)
    (row,) = s["one_off"]
    assert row["kind"] == "eval" and row["position"] == 2
    ops = s["recorded"]["ops"]
    assert ops["joined"] >= 0.95 and ops["joined_all"] < 0.6
    assert not any("waiting for the DataLoader" in n for n in s["notes"]) and s["step_ms"] < 20
