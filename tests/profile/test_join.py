"""Device-only timed steps with operators joined from one untimed step (issue #50; profiling/profile/trace/join.py).

The real pairs in tests/data/h100-join/ were recorded on an H100 (torch 2.11): a 12-layer transformer (width 256,
batch 8x128, bf16 autocast, AdamW), eager and compiled, first under torch.profiler with CUDA activity alone (a
CUDA event recorded at each step's start, as the capture marks its steps), then one step with CPU and CUDA
activity and shapes, as the capture's untimed detail step records it.
"""
import copy
import gzip
import json
import os

import pytest

from benchmarks.same_output import join_fixtures
from profiling.profile.report import render, summary
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.trace import join
from profiling.profile.trace.traceio import STEP_PREFIX

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
PAIRS = os.path.join(DATA, "h100-join")


def pair(name):
    with gzip.open(os.path.join(PAIRS, f"{name}-device-only.trace.json.gz"), "rt") as f:
        trace = json.load(f)
    with gzip.open(os.path.join(PAIRS, f"{name}-untimed-step.trace.json.gz"), "rt") as f:
        donor = json.load(f)["traceEvents"]
    return trace, donor


def marks(events):
    return sorted(e["ts"] for e in events if e.get("name") in join.MARKS)


def steps(events):
    return [e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)]


def joined(name, offset_us=-7.25e6):
    """The device-only trace with its steps found from host readings on another clock, and joined."""
    trace, donor = pair(name)
    events = trace["traceEvents"]
    assert join.add_steps(events, [t + offset_us - 4 for t in marks(events)], 1) == 2
    return trace, join.join(events, donor)


@pytest.mark.parametrize("name", ["eager", "compiled"])
def test_real_h100_steps_get_every_launch_joined(name):
    trace, record = joined(name)
    assert record["steps"] == 2
    assert record["launches"] >= 0.99 * record["of"]  # all but the marks and the like
    assert record["unjoined_us"] == 0.0 and record["device_us"] > 0
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    assert ops and all(e["dur"] >= 0 for e in ops)
    for start, end in [(s["ts"], s["ts"] + s["dur"]) for s in steps(trace["traceEvents"])]:
        inside = [e for e in ops if start <= e["ts"] < end]  # each step has a copy of the untimed step's ops
        assert len(inside) > len(ops) / 3


def test_a_joined_eager_step_gives_the_rules_their_operators():
    trace, _ = joined("eager")
    bare = summarize(copy.deepcopy(pair("eager")[0]))  # the same trace without operators
    s = summarize(trace)
    lacking = lambda x: {r["rule"] for r in x["skipped"] if "shapes" in r["missing"]}  # noqa: E731
    assert s["recorded"]["shapes"] and not lacking(s)
    assert {"math_attention", "attention_fallback", "fp32_intermediate"} <= lacking(bare)
    assert s["steps"] == 2 and s["findings"][0]["kind"] == "launch_bound"  # 985 kernels of 2.6 us, 94% idle


def test_launches_take_their_operators_ids():
    trace, _ = joined("compiled")
    events = trace["traceEvents"]
    ids = {(e.get("args") or {}).get("External id") for e in events if e.get("cat") == "cpu_op"}
    launched = [e for e in events if e.get("cat") == "kernel"]
    assert sum((e.get("args") or {}).get("External id") in ids for e in launched) > 0.95 * len(launched)
    per_step = {}  # the copies' ids differ from step to step, as a recorded trace's do
    for s in steps(events):
        per_step[s["name"]] = {(e.get("args") or {}).get("External id") for e in events if e.get("cat") == "cpu_op"
                               and s["ts"] <= e["ts"] < s["ts"] + s["dur"]}
    a, b = per_step.values()
    assert not a & b


def test_a_different_kernel_sequence_is_said_not_guessed():
    trace, donor = pair("eager")
    kernels = sorted((e for e in donor if e.get("cat") == "kernel"), key=lambda e: -e["dur"])[:20]
    gone = {e["args"]["correlation"] for e in kernels}  # the untimed step without its 20 longest kernels
    donor = [e for e in donor if (e.get("args") or {}).get("correlation") not in gone]
    events = trace["traceEvents"]
    join.add_steps(events, marks(events), 1)
    record = join.join(events, donor)
    assert record["unjoined_us"] > 0 and record["unjoined_kernels"]
    how = {"by": "live capture", "ops": {"joined": 1 - record["unjoined_us"] / record["device_us"],
                                         "unjoined_kernels": record["unjoined_kernels"]}}
    text = render._ops_text(how["ops"], {"step_ms": 50.0, "unprofiled_step_ms": 40.0})
    assert "kernels the untimed step did not launch (data-dependent control flow, a step unlike the others), left without operators: `" in text and "+25.0% over the unprofiled step" in text


def test_marks_are_found_among_other_event_records():
    trace, _ = pair("compiled")
    events = trace["traceEvents"]
    t = marks(events)
    user = [dict(ph="X", cat="cuda_runtime", name="cudaEventRecord", ts=x + 300.0, dur=2.0, pid=1, tid=1,
                 args={"correlation": -i}) for i, x in enumerate(t)]  # the user's own event, 0.3 ms after each
    events.extend(user)
    assert join.add_steps(events, [x - 1e9 for x in t], 1) == 2
    assert [s["ts"] for s in steps(events)] == t[:2]


def test_no_steps_when_no_offset_fits_the_readings():
    trace, _ = pair("compiled")
    events = trace["traceEvents"]
    t = marks(events)
    assert join.add_steps(events, [t[0], t[1], t[1] + 5e5], 1) == 0  # a reading 0.5 s past any mark
    assert not steps(events)


@pytest.mark.parametrize("fixture", ["h100-plant26-eager_model", "h100-host-resnet18-workers0",
                                     "h100-fresh-checkpoint_mlp", "h100-plant-dense_mask"])
def test_recorded_fixtures_read_the_same_through_the_join(fixture):
    """A fully recorded trace replayed as a device-only capture (benchmarks/same_output/join_fixtures.py): the
    same findings, step budget, regions and lines."""
    name, share, top_before, top_after, moved, differ = join_fixtures.compare(
        os.path.join(DATA, f"{fixture}.trace.json.gz"))
    assert share == 1.0 and top_before == top_after and not moved and not differ


def test_a_live_trace_says_how_its_steps_were_recorded():
    trace = load_trace(os.path.join(DATA, "h100-plant-baseline.trace.json.gz"))
    meta = trace.setdefault("autoresearch", {})
    meta.update(capture_ops="device", operators={"device_us": 1000.0, "unjoined_us": 0.0, "unjoined_kernels": []})
    text = render.to_markdown(summarize(trace))
    assert "timed steps: device only, operators joined from one untimed step (100.0% of device time)" in text
    meta.update(operators={"missing": "the loop ended before its step (an exception (KeyError))"})
    assert "no operators joined (the loop ended" in render.to_markdown(summarize(trace))


def test_threads_named_by_pthread_id_take_the_operator_steps_ids():
    """A process's first CUDA-only session names threads by pthread id (970979008 where the operator step wrote
    519, H100): the join still pairs them, and the timed thread takes the operator step's id."""
    trace, donor = pair("eager")
    events = trace["traceEvents"]
    renamed = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            e["tid"] = renamed.setdefault(e["tid"], 970979008 + 7 * len(renamed))
    assert join.add_steps(events, marks(events), 1) == 2
    record = join.join(events, donor)
    assert record["unjoined_us"] == 0.0 and record["launches"] >= 0.99 * record["of"]
    threads = {e["tid"] for e in donor if e.get("cat") == "cpu_op"}
    assert {e["tid"] for e in events if e.get("cat") == "cuda_runtime"} <= threads


def test_train_py_takes_the_capture_mode_and_refuses_another(capsys):
    from profiling import runner
    assert runner.parse_args([]).profile_ops == "device"
    assert runner.parse_args(["--profile-ops", "full"]).profile_ops == "full"
    with pytest.raises(SystemExit) as e:
        runner.parse_args(["--profile-ops", "cpu"])
    assert e.value.code == 2 and "--profile-ops" in capsys.readouterr().err


def test_on_the_cpu_the_operators_are_recorded_in_the_profiled_steps_either_way():
    import torch

    from profiling.profile.capture import window
    model = torch.nn.Linear(8, 8)
    w = window.Window(1, 2, {"settings": {"recorded": False}}, ops="device")
    trace = None
    while trace is None:
        model(torch.randn(4, 8)).sum().backward()
        trace = w.step()
    meta = trace["autoresearch"]
    assert meta["capture_ops"] == "full" and "operators" not in meta
    assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"]) and len(steps(trace["traceEvents"])) == 2
    with pytest.raises(Exception, match="not a capture mode"):
        window.Window(1, 2, {}, ops="kernels")


def test_a_join_that_fails_leaves_the_profile_without_operators_and_the_run_going(monkeypatch):
    from profiling.profile.capture import window
    w = window.Window.__new__(window.Window)  # only the record's handling: no profiler started
    w.trace, w.sampler = {"traceEvents": [], "autoresearch": {}}, type("S", (), {"root": None})()
    w.syncs = type("R", (), {"result": lambda self, root: [{"where": "train.py:1", "count": 1}]})()

    def broken(events, donor):
        raise KeyError("ts")
    monkeypatch.setattr(window.join, "join", broken)
    w._details({"events": [{"cat": "cpu_op"}]})
    meta = w.trace["autoresearch"]
    assert meta["operators"]["missing"].startswith("the operators' join failed: KeyError")
    assert "record_shapes" not in w.trace
    assert meta["syncs"] == [{"where": "train.py:1", "count": 1}]  # the step's other record kept


def test_work_only_the_untimed_step_did_lends_no_operators():
    """An untimed step that also ran an eval (a forward after the window: launches and operators the timed steps
    never made) lends the timed steps its training operators only (issue #57 item 1)."""
    trace, donor = pair("eager")
    events = trace["traceEvents"]
    join.add_steps(events, marks(events), 1)
    calls = sorted((e for e in donor if e.get("cat") in ("cuda_runtime", "cuda_driver") and
                    e.get("name") == "cudaLaunchKernel"), key=lambda e: e["ts"])[:40]
    kernels = {e["args"]["correlation"]: e for e in donor if e.get("cat") == "kernel"}
    end = max(e["ts"] + e.get("dur", 0) for e in donor if isinstance(e.get("ts"), (int, float)))
    shift, added = end + 100.0 - calls[0]["ts"], []
    for i, c in enumerate(calls):  # the eval: 40 launches again, after the step's own work, in one operator
        c2 = copy.deepcopy(c)
        c2["ts"] += shift
        c2["args"]["correlation"] = 10**9 + i
        added.append(c2)
        k = kernels.get(c["args"]["correlation"])
        if k is not None:
            k2 = copy.deepcopy(k)
            k2["ts"] += shift
            k2["args"]["correlation"] = 10**9 + i
            added.append(k2)
    added.append({"ph": "X", "cat": "cpu_op", "name": "aten::eval_only", "pid": calls[0]["pid"],
                  "tid": calls[0]["tid"], "ts": end + 90.0, "dur": calls[-1]["ts"] - calls[0]["ts"] + 50.0,
                  "args": {"External id": 10**9}})
    record = join.join(events, donor + added)
    assert record["unjoined_us"] == 0.0
    names = {e.get("name") for e in events if e.get("cat") == "cpu_op"}
    assert "aten::eval_only" not in names and len(names) > 20  # the training step's operators, not the eval's
    assert 0 < record["donor_unused_us"] < record["donor_us"]
    ops = summary._ops_joined({"capture_ops": "device", "operators": dict(record, donor_unused_us=
                                                                         0.2 * record["donor_us"])})
    assert "the untimed step ran work no profiled step did (20% of its device time" in render._ops_text(ops, {})
