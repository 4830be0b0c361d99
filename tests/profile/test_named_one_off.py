"""A step under the 2x limit whose own work is a save, an eval or a log is left out and named; a step that is
merely noisy is kept (issue #49's acceptance: "the per-step figures within 10% of the median of the like
steps"; profiling/profile/trace/irregular.py's `_named`, trace/only_in_step.py). On real CPU traces: the
Hugging Face Trainer's log-and-save step (tests/data/make_cpu_framework_traces.py hf-gpt2-save: a GPT-2 built
from a GPT2Config, nothing downloaded; and cpu-hf-gpt2-save-undersampled,
benchmarks/findings/live/new_user_cpu.py's), Lightning's logging step and a plain loop's noisy steps."""
import copy
import importlib.util
import os
import statistics

import pytest

from profiling.profile.report import render
from profiling.profile.report.summary import summarize
from profiling.profile.trace import irregular, only_in_step
from profiling.profile.trace.traceio import load_trace

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
WITHIN = 0.10   # the acceptance's "within 10% of the median of the like steps"


def trace(name):
    return load_trace(os.path.join(DATA, name))


def steps_of(s):
    return [r for r in s["one_off"] if r["step"]]


def step_marks(t):
    return sorted((e for e in t["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
                   and e.get("ph") == "X"), key=lambda e: e["ts"])


@pytest.fixture(scope="module")
def hf_save():
    return trace("cpu-hf-gpt2-save.trace.json.gz")


def test_the_hf_trainers_log_and_save_step_under_2x_is_left_out_and_named(hf_save):
    """logging_steps=10, save_steps=5: step 10's log and checkpoint run in the second profiled step, 56.1 ms
    against 35.5 (1.58x): under the 2x limit, over NAMED_RATIO, and the save's frames hold most of the extra."""
    s = summarize(copy.deepcopy(hf_save))
    (row,) = steps_of(s)
    assert (row["kind"], row["position"], row["why"]) == ("checkpoint save", 2, "named")
    assert irregular.NAMED_RATIO < row["ms"] / row["median_ms"] < irregular.OUTLIER_RATIO
    assert s["steps"] == 3 and len(s["step_ms_each"]) == 3
    assert s["step_ms"] == pytest.approx(statistics.mean(s["step_ms_each"]), rel=1e-3)
    assert abs(s["step_ms"] / statistics.median(s["step_ms_each"]) - 1) <= WITHIN
    md = render.to_markdown(s)
    (line,) = [x for x in md.splitlines() if x.startswith("one-off, not per step: ")]
    assert "profiled step 2 of 4" in line and "a checkpoint save" in line and "torch/serialization.py" in line
    assert "_save_checkpoint" in line and "ms/step" not in line
    assert next(c for c in s["checks"] if c["name"] == "CPU ops per step")["ok"]


def test_under_the_old_2x_limit_alone_the_save_step_stayed_in(hf_save, monkeypatch):
    monkeypatch.setattr(irregular, "NAMED_RATIO", irregular.OUTLIER_RATIO)
    s = summarize(copy.deepcopy(hf_save))
    assert steps_of(s) == [] and s["steps"] == 4


def test_too_few_like_steps_keep_the_named_step_and_say_so(hf_save):
    """Its first 3 profiled steps: leaving the save out would leave 2 like steps (MIN_STEPS is 3)."""
    spec = importlib.util.spec_from_file_location("trim_trace", os.path.join(DATA, "trim_trace.py"))
    trim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trim)
    s = summarize(trim.trim(copy.deepcopy(hf_save), 3))
    assert steps_of(s) == [] and s["steps"] == 3
    (note,) = [n for n in s["notes"] if "stays in the per-step figures" in n]
    assert "profiled step 2 ran a checkpoint save" in note and "2 like steps, too few" in note
    assert "active_steps" in note  # how to widen the window


def test_a_noisy_logging_step_whose_log_took_little_of_it_is_kept():
    """Lightning's step 2 (a CSV logger's save, log_every_n_steps=5) is 553.5 ms against 319.4, but the
    logger's frames hold 11 ms of its 234 ms extra: the rest is the loaded host's noise, so it is a like step."""
    s = summarize(trace("cpu-lightning-sequential.trace.json.gz"))
    assert steps_of(s) == [] and s["steps"] == 5
    t = trace("cpu-lightning-sequential.trace.json.gz")
    per = only_in_step.per_step(_index(t), t["autoresearch"])
    assert only_in_step.kind_of(only_in_step.only_labels(per, 1)) == only_in_step.LOG  # named, yet kept


def _index(t):
    from profiling.profile.trace.traceio import index
    return index(t["traceEvents"])


def test_a_plain_loops_noisy_steps_are_all_kept():
    """A plain loop on the loaded 2-core host (make_cpu_one_off_traces.py): its like steps run 140.7 to 347.8 ms,
    the slowest 2.1x the others' median, each with frames sampled only in it; none names a save, an eval or a
    log, so only the real save (1,320.7 ms, over 2x) goes."""
    s = summarize(trace("cpu-one-off-save.trace.json.gz"))
    assert [(r["position"], r["why"]) for r in steps_of(s)] == [(2, "outlier")]
    assert s["steps"] == 4 and max(s["step_ms_each"]) > 2 * statistics.median(sorted(s["step_ms_each"])[:3])


def stretched(t, k, ms):
    """The trace with profiled step k (0-based) `ms` longer, idle at its end, as a descheduled host makes it:
    every later event that much later; host samples keep their offsets."""
    marks, us = step_marks(t), ms * 1e3
    at = marks[k]["ts"] + marks[k]["dur"] - 1.0
    for e in t["traceEvents"]:
        if e.get("ph") != "X" or not isinstance(e.get("ts"), (int, float)) or e.get("cat") == "Trace":
            continue
        if e["ts"] >= at:
            e["ts"] += us
        elif e["ts"] + e.get("dur", 0) > at:
            e["dur"] += us
    return t


def with_samples(t, k, stack, n):
    """The trace with `n` more host samples in profiled step k (0-based), each of `stack` (innermost first)."""
    host = t["autoresearch"]["host_samples"]
    host["stacks"].append(stack)
    host["samples"] += [[k, 1000 * i, len(host["stacks"]) - 1] for i in range(n)]
    return t


LOGGING = ["logging/__init__.py:1636 _log", "logging/__init__.py:1489 info", "train.py:40 train"]


def test_a_noisy_step_with_one_chance_sample_of_a_logging_frame_is_kept():
    """The eval fixture's step 4 made 1.66x the others' median by idle time alone, with one sample in Python's
    logging only in it: one sample (2 ms) is chance, and it explains none of the 200 ms: kept."""
    t = with_samples(stretched(trace("cpu-one-off-eval.trace.json.gz"), 3, 200), 3, LOGGING, 1)
    s = summarize(t)
    assert [r["position"] for r in steps_of(s)] == [3] and s["steps"] == 4  # the eval alone goes


def test_a_step_whose_extra_time_is_a_log_goes_named():
    """The same step with the logging frames in as many samples as its own: half its time logging, the extra
    time's worth: left out, named a log flush."""
    t = trace("cpu-one-off-eval.trace.json.gz")
    n = sum(1 for row in t["autoresearch"]["host_samples"]["samples"] if row[0] == 3)
    s = summarize(with_samples(stretched(t, 3, 200), 3, LOGGING, n))
    assert [(r["position"], r["kind"], r["why"]) for r in steps_of(s)] == [(3, "eval", "outlier"),
                                                                            (4, "log flush", "named")]
    assert s["steps"] == 3 and "`logging/__init__.py:1636 _log`" in steps_of(s)[1]["text"]


def cpu_steps(ms, extra=None):
    """A CPU trace of profiled steps `ms` long, each running the same operators; `extra`: (step, name, ms) an
    annotation inside that step only (a with_stack frame or record_function, as the trace times it)."""
    events, t = [], 0.0
    for i, d in enumerate(ms):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 1}", "pid": 1, "tid": 1,
                       "ts": t, "dur": d * 1e3})
        for j, op in enumerate(("aten::mm", "aten::add", "aten::relu")):
            events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": t + 100 + 1000 * j,
                           "dur": 500})
        if extra and extra[0] == i:
            events.append({"ph": "X", "cat": "user_annotation", "name": extra[1], "pid": 1, "tid": 1,
                           "ts": t + 4000, "dur": extra[2] * 1e3})
        t += d * 1e3
    return {"traceEvents": events}


@pytest.mark.parametrize("named_ms, left_out", [(5.0, True), (1.0, False)])
def test_an_eval_the_trace_times_goes_when_it_is_the_extra_time(named_ms, left_out):
    """No host samples: an annotation only step 3 ran, `evaluation_loop`, 5 ms of its 5 ms extra (1.5x): an
    eval, left out; 1 ms of it: the rest is noise, kept."""
    s = summarize(cpu_steps([10, 10.2, 15, 9.8, 10], (2, "evaluation_loop", named_ms)))
    assert [(r["kind"], r["position"]) for r in steps_of(s)] == ([("eval", 3)] if left_out else [])


def test_a_steady_loop_loses_no_step():
    s = summarize(cpu_steps([10, 11, 12.5, 9.5, 10.5, 12.9]))
    assert steps_of(s) == [] and s["steps"] == 6


def test_hfs_log_save_evaluate_wrapper_names_no_eval():
    only = ["transformers/trainer.py:3100 _maybe_log_save_evaluate", "transformers/trainer.py:3050 log"]
    assert only_in_step.kind_of(only) is None
    assert only_in_step.kind_of(only + ["transformers/trainer_callback.py:480 on_log"]) == only_in_step.LOG


def test_one_chance_sample_measures_no_work(hf_save):
    """named_ms counts sampled work from MIN_SAMPLES samples on: one sample of a frame is chance."""
    t = copy.deepcopy(hf_save)
    ix = _index(t)
    per = only_in_step.per_step(ix, t["autoresearch"])
    save = only_in_step.telling(only_in_step.only_labels(per, 1), only_in_step.SAVE)
    assert only_in_step.named_ms(ix, t["autoresearch"], per, 1, save) > 0.5 * (56.1 - 35.5)
    one = [x for x in save if x.endswith("_save_checkpoint")]  # in one sample only
    assert one and only_in_step.named_ms(ix, t["autoresearch"], per, 1, one) == 0.0


def without_samples_in(t, k):
    """The trace with no host sample in profiled step k (0-based): a save holding the GIL, which the sampler
    thread cannot sample (HF's safetensors write in benchmarks/findings/live/new_user_cpu_results.md's run
    3)."""
    host = t["autoresearch"]["host_samples"]
    host["samples"] = [row for row in host["samples"] if row[0] != k]
    return t


def test_a_save_step_no_sample_saw_goes_as_work_added(hf_save):
    """HF's log-and-save step with its samples gone: nothing it ran names its work, but it ran every operator of
    the like steps and more (the state dict detached for the save): left out, as work added, its operators said."""
    s = summarize(without_samples_in(copy.deepcopy(hf_save), 1))
    (row,) = steps_of(s)
    assert (row["kind"], row["position"], row["why"]) == (irregular.ADDED, 2, "named")
    assert "every operator of the like steps and" in row["text"] and "`aten::detach` x" in row["text"]
    assert s["steps"] == 3 and abs(s["step_ms"] / statistics.median(s["step_ms_each"]) - 1) <= WITHIN


def test_added_work_needs_a_usual_step_and_more_than_a_few_operators():
    def counts(*steps):
        from collections import Counter
        return [Counter(dict(st)) for st in steps]
    usual = {"aten::mm": 3, "aten::add": 2}
    ops = counts(usual, dict(usual, **{"aten::detach": 29, "aten::copy_": 57}), usual, usual)
    assert sum(irregular._added(ops, 1, [0, 2, 3]).values()) == 86
    assert irregular._added(counts(usual, dict(usual, **{"aten::detach": 3}), usual, usual), 1, [0, 2, 3]) is None
    growing = counts(*({"aten::dot": 50 * (i + 1), "aten::mm": 2} for i in range(5)))  # L-BFGS's history
    assert irregular._added(growing, 4, [0, 1, 2, 3]) is None
    missing = counts(usual, {"aten::detach": 40, "aten::mm": 3}, usual, usual)  # not every operator of the others
    assert irregular._added(missing, 1, [0, 2, 3]) is None


def test_a_stalled_step_running_the_same_operators_is_kept():
    """1.5x by time alone (the host off the CPU), the same operators as the others: no work added, kept."""
    s = summarize(cpu_steps([10, 10.2, 15, 9.8, 10]))
    assert steps_of(s) == [] and s["steps"] == 5


def test_a_real_save_step_the_samples_undermeasured_goes_as_work_added():
    """benchmarks/findings/live/new_user_cpu.py's HF loop on the quiet 2-core CPU (2026-11-27, run 1 of 5,
    kept as cpu-hf-gpt2-save-undersampled): the log-and-save step ran 21.0 ms against 10.3-11.9 (1.9x, under
    2x); 7 host samples fell in it, too few in the save's frames to measure half its extra time, so it stayed
    in the mean (1.153x the like steps' median). It ran every operator of the others and 86 more: now left
    out."""
    s = summarize(trace("cpu-hf-gpt2-save-undersampled.trace.json.gz"))
    (row,) = steps_of(s)
    assert (row["position"], row["why"]) == (2, "named") and "and 86 more" in row["text"]
    assert s["steps"] == 4 and abs(s["step_ms"] / statistics.median(s["step_ms_each"]) - 1) <= WITHIN
