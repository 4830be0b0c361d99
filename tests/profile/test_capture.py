"""profiling.profile.capture.window on the CPU: a profile prints no profiler noise, and real messages still show.

The noise, as torch 2.11 printed it on every run: torch.profiler's UserWarning "Profiler clears events at
the end of each cycle" (a schedule was given), and on a machine without a GPU kineto's line
`ERROR:<time> <pid>:<tid> DeviceProperties.cpp:48] gpuGetDeviceCount failed with code 35`. Both come once
per process, so the capture runs in a fresh one.
"""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOISE = ("Profiler clears events", "gpuGetDeviceCount")

CAPTURE = textwrap.dedent("""
    import os, warnings
    import torch
    from profiling.profile.capture import window

    x, calls = torch.randn(64, 64), []

    def step():
        calls.append(x @ x)
        if len(calls) == 3:  # the last step: a real warning and a real error line from C code
            warnings.warn("a real warning from the step")
            os.write(2, b"ERROR: a real error from C code\\n")

    trace, _ = window.capture(step, warmup=1, active=2, metadata={})
    assert any(e.get("name") == "ProfilerStep#1" for e in trace["traceEvents"])
    assert trace["autoresearch"]["settings"]["values"]["grad_mode"] is True  # recorded before the steps
    print("captured")
""")


def test_a_cpu_profile_prints_no_profiler_noise_but_real_messages():
    r = subprocess.run([sys.executable, "-c", CAPTURE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "captured\n"
    assert not [line for line in r.stderr.splitlines() if any(n in line for n in NOISE)], r.stderr
    assert "UserWarning: a real warning from the step" in r.stderr
    assert "ERROR: a real error from C code" in r.stderr


def test_stderr_without_drops_only_the_matching_lines(capfd):
    from profiling.profile.capture.window import NO_GPU_LINE, stderr_without
    with stderr_without(NO_GPU_LINE):
        os.write(2, b"ERROR:2026-11-23 11:26:10 6607:6607 DeviceProperties.cpp:48] gpuGetDeviceCount failed "
                    b"with code 35\n")
        os.write(2, b"ERROR:2026-11-23 11:26:10 6607:6607 output_json.cpp:12] could not write the trace\n")
        print("from Python", file=sys.stderr)
    err = capfd.readouterr().err
    assert "gpuGetDeviceCount" not in err
    assert "could not write the trace" in err and "from Python" in err


def test_stderr_is_back_after_an_exception(capfd):
    from profiling.profile.capture.window import NO_GPU_LINE, stderr_without
    try:
        with stderr_without(NO_GPU_LINE):
            os.write(2, b"before the error\n")
            raise ValueError("boom")
    except ValueError:
        pass
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before the error\nafter\n"


@pytest.mark.parametrize("stage", ["begin", "end"])
def test_a_record_after_the_window_that_fails_never_stops_the_training(monkeypatch, stage):
    """The untimed records after the profiled window (eager lines; GPU memory on CUDA) rest on private torch
    APIs: one that raises is left out with its reason, the trace is still returned and the steps still run."""
    import torch

    from profiling.profile.capture import eager_record, window

    def boom(self):
        raise RuntimeError("boom")
    monkeypatch.setattr(eager_record.Recorder, stage, boom)
    monkeypatch.delenv("AUTORESEARCH_EAGER_LINES", raising=False)
    w = torch.nn.Parameter(torch.ones(4))
    steps = []

    def step():
        (w * 2).sum().backward()
        steps.append(1)
    trace, _ = window.capture(step, warmup=1, active=1, metadata={})
    assert trace["autoresearch"]["eager_lines"] == {"missing": "eager_lines failed and was left out: RuntimeError: boom"}
    assert len(steps) == 1 + 1 + 1 + (stage == "end")  # the shape step; a failed begin adds no step, a failed end had one


def test_shapes_come_from_an_untimed_step_after_the_window():
    """The profiled steps record no shapes (record_shapes slowed them); the step after them does, and its
    operators lend their shapes to the profiled steps' operators of the same thread, name and rank."""
    import torch

    from profiling.profile.capture import window

    lin = torch.nn.Linear(8, 4)

    def step():
        lin(torch.randn(3, 8)).sum().backward()
    trace, _ = window.capture(step, warmup=1, active=2, metadata={})
    meta = trace["autoresearch"]
    assert meta["shapes"]["matched"] > 0 and meta["shapes"]["unmatched"] == 0
    assert meta["syncs_steps"] == 1 and isinstance(meta["syncs"], list)
    addmm = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    assert len(addmm) == 2 and all(e["args"]["Input Dims"][1:3] == [[3, 8], [8, 4]] for e in addmm)


def test_shapes_are_lent_only_where_the_counts_agree():
    from profiling.profile.capture import shapes

    def op(name, ts, dims=None):
        return {"cat": "cpu_op", "name": name, "tid": 1, "ts": ts, "dur": 1,
                "args": {"Input Dims": dims} if dims else {}}
    step = {"cat": "user_annotation", "name": "ProfilerStep#0", "tid": 1, "ts": 0, "dur": 100}
    shaped = shapes.signatures([op("aten::mm", 1, [[2, 3], [3, 4]]), op("aten::mm", 2, [[5, 6], [6, 7]]),
                                op("aten::add", 3, [[1]])])
    events = [step, op("aten::mm", 20), op("aten::mm", 10), op("aten::add", 30), op("aten::add", 40),
              op("aten::mm", 200)]  # outside the step
    assert shapes.transplant(events, shaped) == {"matched": 2, "unmatched": 2}
    assert events[2]["args"]["Input Dims"] == [[2, 3], [3, 4]] and events[1]["args"]["Input Dims"] == [[5, 6], [6, 7]]
    assert "Input Dims" not in events[3]["args"] and "Input Dims" not in events[5]["args"]


def test_triton_launch_records_come_back_from_the_shape_step():
    """The profiled steps run without Inductor's per-launch records (detail.without_launch_records); the shape
    step's records are lent back around the launches of the kernels of their names, so the Triton kernels'
    bytes (roofline.tensor_bytes) are there again. A real H100 trace recorded with its launch records and shapes:
    its records of step 0 play the shape step's, and every step's records are taken out as the shim leaves them."""
    import gzip
    import json

    from profiling.profile.capture import shapes
    from profiling.profile.tables import roofline
    from profiling.profile.trace.traceio import STEP_PREFIX

    with gzip.open(os.path.join(ROOT, "tests", "data", "h100-gpt2-clean-api.trace.json.gz")) as f:
        events = json.load(f)["traceEvents"]
    is_record = lambda e: e.get("cat") == "cpu_op" and (e.get("args") or {}).get("kernel_backend") == "triton"  # noqa: E731
    step0 = min((e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)), key=lambda e: e["ts"])
    records = [e for e in events if is_record(e)]
    shaped = shapes.signatures([e for e in records if step0["ts"] <= e["ts"] <= step0["ts"] + step0["dur"]])
    before = {(e["tid"], e["ts"]): roofline.tensor_bytes(e) for e in records}
    events = [e for e in events if not is_record(e)]
    steps = sum(1 for e in events if str(e.get("name", "")).startswith(STEP_PREFIX))

    out = shapes.transplant(events, shaped)
    lent = [e for e in events if is_record(e)]
    assert out["launch_records"] == len(lent) == len(records) and steps > 1
    assert all(roofline.tensor_bytes(e) for e in lent)  # the kernel's bytes, from the lent shapes
    kernels = {e["args"]["correlation"]: e for e in events if e.get("cat") == "kernel"}
    launch = {e["args"]["External id"]: e for e in events if e.get("cat") in shapes.RUNTIME
              and e["args"].get("correlation") in kernels}
    for e in lent:  # around its own launch, of a kernel of its name, and found from it by External id
        run = launch[e["args"]["External id"]]
        assert (run["ts"], run["dur"]) == (e["ts"], e["dur"])
        assert kernels[run["args"]["correlation"]]["name"] == e["name"]
    assert sorted(roofline.tensor_bytes(e) for e in lent) == sorted(before.values())


def test_inductor_sees_the_profiler_off_only_inside_the_window():
    """Inductor's launcher reads torch.autograd.profiler through its own module attribute: the window swaps it
    for one that says "off" and puts torch's back when the profiled steps end, also when the loop ends early."""
    import torch
    from torch._inductor.runtime import triton_heuristics

    from profiling.profile.capture import window

    seen = []
    step = lambda: seen.append(triton_heuristics.autograd_profiler is torch.autograd.profiler)  # noqa: E731
    window.capture(step, warmup=1, active=2, metadata={})
    assert seen[:3] == [False, False, False] and seen[3:] == [True] * (len(seen) - 3)
    assert triton_heuristics.autograd_profiler is torch.autograd.profiler
    window = window.Window(1, 3, {})
    window.step()
    assert triton_heuristics.autograd_profiler is not torch.autograd.profiler
    window.end_early("the loop stopped after step 1")
    assert triton_heuristics.autograd_profiler is torch.autograd.profiler


def test_the_stack_sampler_starts_in_the_warm_up_step_and_samples_only_the_recorded_ones():
    """Started with the first recorded step, the sampler's thread start and its first (uncached) walks of the
    stack made that step 1.5-1.9x the others on a loaded 2-core host (issue #49): it starts when the window
    opens, warming its caches in the profiler's warm-up step, and keeps no sample of that step."""
    import threading
    import time

    import torch

    from profiling.profile.capture import window

    x = torch.randn(64, 64)
    w = window.Window(1, 2, {})
    try:
        assert w.sampler._thread is not None and w.sampler._thread.is_alive()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.05:  # the warm-up step: sampled for the caches only
            x @ x
        assert w.sampler.samples == [] and w.sampler._labels
        trace = None
        while trace is None:  # the 2 recorded steps, then the records after them
            trace = w.step()
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.02:
                x @ x
    finally:
        w.end_early("the test ended")
    assert {s for s, _, _ in trace["autoresearch"]["host_samples"]["samples"]} <= {0, 1}
    assert not any(t.name == "autoresearch-stack-sampler" for t in threading.enumerate())
