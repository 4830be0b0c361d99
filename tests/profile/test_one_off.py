"""Steps and spans that do not repeat are left out of every per-step figure and reported once, with their kind
(issue #48 item 2, issue #49 item 1: profiling/profile/trace/irregular.py's split); steps counted right in traces
without markers (compiled iterations, a CPU loop, one call's inner loop: trace/iterations.py) and rank folders
read by the ranks the traces record, with no straggler from the profiler's own cost (issue #48 item 5:
report/ranks.py). On the CPU traces of tests/data/make_cpu_one_off_traces.py and the H100 fixtures."""
import gzip
import json
import os
import shutil
import statistics

import orjson
import pytest

from profiling.errors import UserError
from profiling.profile.report import render
from profiling.profile.report.ranks import summarize_folder
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.trace import irregular
from profiling.profile.trace.traceio import read_json

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def path(name):
    return os.path.join(DATA, name)


def report(name_or_trace):
    trace = load_trace(path(name_or_trace)) if isinstance(name_or_trace, str) else name_or_trace
    s = summarize(trace)
    json.loads(render.to_json(s))
    return s, render.to_markdown(s)


def one_off_lines(md):
    return [line for line in md.splitlines() if line.startswith("one-off, not per step: ")]


def steps_of(s):
    return [r for r in s["one_off"] if r["step"]]


# ---------------------------------------------------------------------------------------------------------
# An eval, a checkpoint save inside the window (issue #49 item 1)

def test_an_eval_after_a_profiled_step_is_left_out_named_and_counted_once():
    s, md = report("cpu-one-off-eval.trace.json.gz")
    (row,) = steps_of(s)
    assert (row["kind"], row["position"], row["of"]) == ("eval", 3, 5)
    assert any("evaluate" in x for x in row["only"])  # the loop's own evaluate(), sampled only in it
    # every per-step figure is the 4 like steps': the mean of them, far under the eval's step
    assert s["steps"] == 4 and len(s["step_ms_each"]) == 4
    assert s["step_ms"] == pytest.approx(statistics.mean(s["step_ms_each"]), rel=1e-3)
    assert row["ms"] > irregular.OUTLIER_RATIO * max(s["step_ms_each"])
    assert row["median_ms"] == pytest.approx(statistics.median(s["step_ms_each"]), abs=1e-3)
    assert sum(s["categories"].values()) == pytest.approx(s["step_ms"], abs=1e-3)
    assert next(c for c in s["checks"] if c["name"] == "CPU ops per step")["ok"]  # the eval's forwards are gone
    assert s["samples_per_s"] == pytest.approx(256 / (s["step_ms"] / 1e3), rel=1e-3)
    # counted once, in a line of its own, never as ms/step; its frames in no table
    (line,) = one_off_lines(md)
    assert "profiled step 3 of 5" in line and "an eval" in line and "ms/step" not in line
    frame = next(x for x in row["only"] if "evaluate" in x)  # `make_cpu_one_off_traces.py:76 evaluate`
    assert frame.split()[0] not in json.dumps([s["lines"], s["regions"], s["kernels"]])


def test_a_checkpoint_save_in_the_window_is_named_a_checkpoint_save():
    s, md = report("cpu-one-off-save.trace.json.gz")
    (row,) = steps_of(s)
    assert (row["kind"], row["position"]) == ("checkpoint save", 2)
    assert any("serialization.py" in x for x in row["only"])
    assert s["steps"] == 4 and row["ms"] > irregular.OUTLIER_RATIO * max(s["step_ms_each"])
    check = next(c for c in s["checks"] if c["name"] == irregular.CHECK)
    assert check["ok"] and check["outliers"] == 1 and "a checkpoint save" in check["detail"]
    assert len(one_off_lines(md)) == 1


@pytest.mark.parametrize("name", ["h100-fresh-eval_forward", "h100-compile-a", "h100-compile-b",
                                  "h100-compiled-gpt-5steps", "h200-default-gpt-5steps"])
def test_steps_that_repeat_are_all_kept(name):
    """An eval forward in every step (eval_forward) repeats: it is the step's, and its finding stays; two fresh
    compiles' traces and the 5-step ones have no step unlike the others."""
    s = summarize(load_trace(path(f"{name}.trace.json.gz")))
    assert s["one_off"] == [] and len(s["step_ms_each"]) == s["steps"]
    if name == "h100-fresh-eval_forward":
        assert s["findings"][0]["kind"] == "forward_without_backward"


def test_too_few_like_steps_are_said_with_how_to_widen_the_window():
    s, md = report("cpu-tiny-mlp-3steps.trace.json.gz")  # its second step: 51.6 ms against 18.1 and 15.2
    assert [r["position"] for r in steps_of(s)] == [2] and s["steps"] == 2
    assert any("2 like steps left" in n and "active_steps" in n for n in s["notes"])


# ---------------------------------------------------------------------------------------------------------
# Compilation inside the window (issue #48 item 2, DESIGN.md pitfall 20)

def with_compile(trace, step, ms):
    """The trace with a compile of `ms` at the start of ProfilerStep `step` (0-based among them), as torch <= 2.6
    records one (`_compile.compile_inner (dynamo_timed)`): every later host event, and the device events they
    launched, `ms` later; the step that long more."""
    events, us = trace["traceEvents"], ms * 1e3
    marks = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
                    and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    at = marks[step]["ts"] + 1.0
    launches = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    for e in events:
        if e.get("ph") != "X" or not isinstance(e.get("ts"), (int, float)):
            continue
        device = e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
        when = launches.get((e.get("args") or {}).get("correlation"), e["ts"]) if device else e["ts"]
        if e is marks[step] or (e["ts"] < at < e["ts"] + e.get("dur", 0) and not device):
            e["dur"] += us  # the step and whatever host span runs across the compile's start
        elif when >= at and (device or e.get("cat") != "Trace"):
            e["ts"] += us
    pid, tid = marks[step]["pid"], marks[step]["tid"]
    events.append({"ph": "X", "cat": "user_annotation", "name": "_compile.compile_inner (dynamo_timed)", "pid": pid,
                   "tid": tid, "ts": at, "dur": us})
    return trace


def test_a_compile_inside_a_profiled_step_is_reported_once_never_per_step():
    """The H100 5-step trace with a 1.69 s compile at the start of its fourth step (issue #48: host_sync 1,436
    ms/step with a pin_memory fix, and a launch_bound of one compile gap): the GPU idles at the end of the third
    step's window and the host in the fourth's; both are compile one-offs; the figures and findings are the
    other three steps'."""
    name = path("h100-compiled-gpt-5steps.trace.json.gz")
    clean = summarize(load_trace(name))
    s, md = report(with_compile(load_trace(name), 3, 1690))
    rows = steps_of(s)
    assert [(r["kind"], r["position"]) for r in rows] == [("compile", 3), ("compile", 4)]
    assert rows[0]["ms"] > 1690 and rows[0]["compile_ms"] == pytest.approx(1690, rel=1e-3)
    assert s["steps"] == 3 and s["step_ms"] == pytest.approx(clean["step_ms"], rel=0.05)
    assert [f["kind"] for f in s["findings"]] == [f["kind"] for f in clean["findings"]]
    assert s["idle_ms"] == pytest.approx(clean["idle_ms"], abs=2.0)
    lines = one_off_lines(md)
    assert len(lines) == 2 and all("a compile" in x for x in lines) and "1,690.0 ms of it compiling" in lines[0]
    unmarked = summarize(with_compile(load_trace(name), 3, 1690) | {"traceEvents": [
        e for e in with_compile(load_trace(name), 3, 1690)["traceEvents"] if "dynamo_timed" not in str(e.get("name"))]})
    assert [r["why"] for r in steps_of(unmarked)] == ["outlier"]  # without the annotation: an unnamed outlier


def test_a_compile_in_every_step_keeps_them_and_says_so():
    """Two steps, both compiling: none is like the others, so none is left out (the report has figures)."""
    trace = with_compile(with_compile(load_trace(path("h100-compile-a.trace.json.gz")), 0, 50), 1, 50)
    s = summarize(trace)
    assert s["steps"] == 2 and steps_of(s) == []


def test_compiled_iterations_without_markers_are_counted_and_the_compile_reported_once():
    """A torch.compile'd MLP profiled from its first call, no schedule, a hand-written update (no optimizer
    annotation, no module scopes): its 4 iterations from the compiled region's calls (issue #48: three compiled
    iterations read as one step); the compile (before the first call) and the cold first iteration once each."""
    s, md = report("cpu-compile-in-window.json.gz")
    assert s["iterations"]["by"] == "a compiled region's call" and s["iterations"]["count"] == 4
    kinds = [r["kind"] for r in s["one_off"]]
    assert kinds[0] == "compile" and s["one_off"][0]["step"] is None and s["one_off"][0]["ms"] > 1000
    assert s["one_off"][1]["kind"] == "cold first pass" and s["one_off"][1]["step"] == "iteration#0"
    assert 2 <= s["steps"] <= 3 and s["step_ms"] < 0.1 * s["one_off"][1]["ms"]
    assert len(one_off_lines(md)) == len(s["one_off"])


def test_compile_at_the_start_of_one_window_is_start_up():
    """A window without anything repeating: a compile before most of its work is cut as start-up, named."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 5000 + 100 * i,
               "dur": 50} for i in range(10)]  # nothing repeats
    events.append({"ph": "X", "cat": "user_annotation", "name": "_compile.compile_inner (dynamo_timed)",
                   "pid": 1, "tid": 1, "ts": 0, "dur": 4000})
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 100, "dur": 10})
    s = summarize({"traceEvents": events})
    assert s["window"] == "whole trace" and s["startup"]["compile_ms"] == 4.0
    assert s["step_ms"] == pytest.approx(1.95) and any("compilation (4.000 ms)" in n for n in s["notes"])  # 4.0-5.95 ms


# ---------------------------------------------------------------------------------------------------------
# Steps of traces without markers (issue #48 item 5)

def test_a_cpu_loop_of_plain_operators_is_its_100_iterations():
    s = summarize(load_trace(path("cpu-loop-100-no-markers.json.gz")))
    assert s["iterations"]["by"] == "the operators' sequence" and s["iterations"]["count"] == 100
    assert s["steps"] + len(steps_of(s)) == 100 and s["steps"] >= 90
    assert next(c for c in s["checks"] if c["name"] == "CPU ops per step")["ok"]  # each the same operators


def test_one_calls_inner_loop_is_one_step():
    s, md = report("cpu-one-call-16-forwards.json.gz")
    assert s["steps"] == 1 and s["iterations"]["one_call"] == "generate" and s["iterations"]["inner"] == 16
    assert "it is one call, `generate`, read as one step; its inner loop repeats the model's forward" in md


# ---------------------------------------------------------------------------------------------------------
# Ranks (issue #48 item 5)

BALANCED = path("cpu-ddp-2ranks")


def test_a_folder_of_traces_named_otherwise_is_read_by_their_recorded_ranks(tmp_path):
    want = summarize_folder(BALANCED)
    shutil.copy(os.path.join(BALANCED, "rank-1.trace.json.gz"), tmp_path / "a_trace.json.gz")  # rank 1 first by name
    with gzip.open(os.path.join(BALANCED, "rank-0.trace.json.gz"), "rb") as f:
        (tmp_path / "b_trace.json").write_bytes(f.read())
    r = summarize_folder(str(tmp_path))
    assert r["world_size"] == 2 and [x["rank"] for x in r["ranks"]] == [0, 1] and r["ranks"] == want["ranks"]
    unranked = {k: v for k, v in read_json(os.path.join(BALANCED, "rank-0.trace.json.gz")).items()
                if k not in ("distributedInfo", "autoresearch")}
    (tmp_path / "b_trace.json").write_bytes(orjson.dumps(unranked))
    with pytest.raises(UserError, match=r"b_trace.json records no rank \(no distributedInfo.rank\)") as e:
        summarize_folder(str(tmp_path))
    assert "\n" not in str(e.value)


def test_no_straggler_from_the_profilers_own_cost():
    """cpu-ddp-comm: rank 0 works 2.0 ms/step more than rank 1 in the profiled steps, and its profiled step
    exceeds its unprofiled one by 2.6 ms (the profiler's own host cost); the unprofiled steps agree within
    0.01 ms: no straggler. The straggler fixture's profiled step is no longer than its unprofiled one: kept."""
    r = summarize_folder(path("cpu-ddp-comm"))
    assert r["skew"]["work_spread_ms"] > irregular_share(r) and r["skew"]["profiler_ms"] >= r["skew"]["work_spread_ms"]
    assert not any(f["kind"] == "straggler" for f in r["findings"])
    assert any("no straggler is claimed from the profiled skew" in n and "unprofiled steps agree" in n
               for n in r["notes"])
    kept = summarize_folder(path("cpu-ddp-straggler"))
    assert kept["skew"]["profiler_ms"] == 0 and any(f["kind"] == "straggler" for f in kept["findings"])


def irregular_share(r):
    from profiling.profile.report.ranks import STRAGGLER_SHARE
    return STRAGGLER_SHARE * r["step_ms"]


def gpu_rank(rank, kernels, unprofiled):
    """Two steps as test_ranks' hand-computed GPU traces, with the rank's unprofiled step."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1, "ts": a,
               "dur": b - a} for i, (a, b) in enumerate([(0, 60000), (60000, 90000)])]
    for c, (name, launch, start, dur, stream) in enumerate(kernels, 100):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": launch, "dur": 1.0, "args": {"correlation": c}})
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
                       "args": {"correlation": c, "stream": stream}})
    return {"traceEvents": events, "autoresearch": {"rank": rank, "world_size": 2, "device": "NVIDIA H100",
                                                    "unprofiled_step_ms": unprofiled}}


NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
FAST = [("gemm_a", 10000, 50000, 10000, 7), (NCCL, 20000, 56000, 8000, 9),
        ("gemm_a", 65000, 100000, 20000, 7), (NCCL, 70000, 110000, 16000, 9)]
SLOW = [("gemm_a", 10000, 50000, 14000, 7), (NCCL, 20000, 60000, 4000, 9),  # 4 ms/step more work on rank 1
        ("gemm_a", 65000, 100000, 24000, 7), (NCCL, 70000, 114000, 12000, 9)]


@pytest.mark.parametrize("unprofiled, claimed", [(38.0, 4.0), (35.0, 1.0), (33.0, None)])
def test_the_straggler_is_priced_without_the_profilers_cost(tmp_path, unprofiled, claimed):
    """Steps of 38 ms, rank 1 working 4 ms/step more: an unprofiled step of 38 leaves all 4 to the straggler;
    of 35, 3 ms are the profiler's (1 left, under the share: none); of 33, all of it."""
    for k, kernels in enumerate((FAST, SLOW)):
        (tmp_path / f"rank-{k}.trace.json.gz").write_bytes(
            gzip.compress(json.dumps(gpu_rank(k, kernels, unprofiled)).encode()))
    r = summarize_folder(str(tmp_path))
    f = next((f for f in r["findings"] if f["kind"] == "straggler"), None)
    if claimed == 4.0:
        assert f["ms_per_step"] == 4.0 and "profiler's own" not in f["evidence"]
    else:
        assert f is None and any("no straggler is claimed" in n for n in r["notes"])
