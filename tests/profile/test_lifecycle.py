"""The Profiler never changes how the run ends (issue #41, DESIGN.md pitfall 14, STYLE.md habit 17): every way
a loop can end, in a plain loop, in `with`, under the HF Trainer and Lightning, gives the exit code the run
gives without the profiler, and what was recorded is kept with a note of what is missing; settings are put
back; a bad out_dir fails at once; outlier steps are left out or named; a report compares itself only with a
profile of the same script and model.

The ways of ending run in tests/profile/lifecycle_worker.py: one process imports torch (and transformers,
lightning) once and forks a child per case, the HF Trainer and Lightning forms each against the same
framework run without the profiler's callback; and a few true subprocesses end with a real uncaught exception
and a real KeyboardInterrupt."""
import gzip
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn

import profiling
from profiling.profile.capture import provenance, watchdog
from profiling.profile.report import folder
from profiling.profile.trace import irregular

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "profile", "lifecycle_worker.py")
sys.path.insert(0, os.path.dirname(WORKER))
import lifecycle_worker as worker  # noqa: E402

FAST = dict(warmup_steps=1, timed_steps=3, active_steps=3)   # 1 + 3 + 1 + 3 + 1 + 1 = 10 steps


def matrix(tmp_path, forms, counts, ends):
    """{"FORM N END": exit code} from the worker's forked children, and the folder of their logs."""
    run = subprocess.run([sys.executable, WORKER, "--matrix", forms, counts, ends, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def check_matrix(tmp_path, forms, counts):
    baselines = sorted({worker.BASELINES[form] for form in forms})
    codes = matrix(tmp_path, ",".join(forms + baselines), counts, "done,raise")
    assert not worker.problems(codes, tmp_path)  # as without the profiler: 0, or 1 and the traceback
    assert set(worker.expected(codes).values()) == {0, 1}


@pytest.mark.slow
def test_ending_inside_and_around_the_window_exits_as_without_the_profiler(tmp_path):
    # the default 16-step schedule: 8 unprofiled, the window opens after step 8, 1 + 5 profiled, 1 shape step,
    # 1 line record; ending after 9 (no profiled step yet), inside the window (10: 139 before the fix) and in
    # the shape step (15). The whole 1-20 matrix: test_every_step_count_from_1_to_20 below.
    check_matrix(tmp_path, ["loop", "with", "drop"], "9,10,15")
    kept = list((tmp_path / "profiles" / "loop-10-done").glob("*/trace.json.gz"))
    assert len(kept) == 1  # 1 complete profiled step
    meta = json.loads(gzip.decompress(kept[0].read_bytes()))["autoresearch"]
    assert meta["ended_early"]["active_steps"] == 1 and meta["ended_early"]["of"] == 5
    assert meta["eager_lines"]["missing"].startswith("the loop ended before its step")
    assert meta["shapes"]["missing"].startswith("the loop ended before its step")
    assert not (tmp_path / "profiles" / "loop-9-done").exists()  # no profiled step: nothing written


# The HF Trainer and Lightning forms at 10 and 15 steps run in CI with the callbacks' cases (one import of
# each framework): tests/test_callbacks.py::test_max_steps_and_raising_in_the_default_window.


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("AUTORESEARCH_LIFECYCLE_MATRIX") != "1",
                    reason="the whole 1-20 matrix (320 forked runs, ~4 min on a loaded 2-core CPU; results "
                           "in benchmarks/profiler_cost/lifecycle_results.md): AUTORESEARCH_LIFECYCLE_MATRIX=1")
def test_every_step_count_from_1_to_20(tmp_path):
    check_matrix(tmp_path, ["loop", "with", "drop", "hf", "lightning"], "1-20")


def run_worker(*args, timeout=300):
    return subprocess.run([sys.executable, WORKER, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("end", ["raise", pytest.param("interrupt", marks=pytest.mark.slow)])
def test_a_real_uncaught_exception_keeps_its_traceback_and_exit_code(tmp_path, end):
    # the exit code of the same loop without the profiler: 1; an uncaught KeyboardInterrupt exits 1 there
    # too, not 130, as CPython 3.11 does once torch._dynamo's exit hook imports tabulate (a string exec'd at
    # exit); the profiler once imported it early and the interrupted run exited 130 (issue #49)
    code = 1 if end == "raise" else run_worker("none", 12, end, tmp_path / "none").returncode
    run = run_worker("loop", 12, end, tmp_path)
    assert run.returncode == code, run.stderr[-2000:]
    assert ("RuntimeError: the user's own error" if end == "raise" else "KeyboardInterrupt") in run.stderr
    said = [line for line in run.stderr.splitlines() if line.startswith("profiling:")]
    # step 12 raised: 8 unprofiled steps, 1 profiler warm-up, 2 complete profiled ones
    assert len(said) == 1 and "the 2 profiled steps recorded are in" in said[0], run.stderr[-2000:]
    assert "research profile" in said[0] and len(list(tmp_path.glob("*/trace.json.gz"))) == 1


def left_open(tmp_path, after):
    """The worker's loop that stops stepping after step 11 (the window's second profiled step) without close()
    and runs something else for up to worker.EVAL_S seconds: (what it saw then, its stderr, seconds from its last
    line to its exit, the trace's bytes)."""
    run = run_worker("open", 11, after, tmp_path)
    ended = time.time()
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-2])
    (trace,) = tmp_path.glob("*/trace.json.gz")
    return seen, run.stderr, ended - seen["at"], trace.stat().st_size


@pytest.mark.slow
@pytest.mark.parametrize("after", ["evals", "return", "backward", "hook"])
def test_a_window_left_open_closes_itself(tmp_path, after):
    """Issue #49: a loop that stops inside the window without close() and goes on (eval forwards in the same
    function; after its function returned; a backward whose Python the close may land in; eval forwards with
    a forward hook): the watchdog closes the window on the main thread (never inside the backward), so that
    nothing the profiler started runs on, and the trace keeps only the 2 profiled steps."""
    seen, err, exit_s, size = left_open(tmp_path, after)
    assert not seen["profiler"] and not seen["sampler"] and not seen["watchdog"] and seen["done"], seen
    assert not seen["provenance"] and seen["launch_records"], seen  # the settings put back
    assert set(seen["closed_on"]) == {"MainThread"}, seen  # torch.profiler stopped on its own thread
    said = [line for line in err.splitlines() if line.startswith("profiling:")]
    assert len(said) == 1 and "the loop stopped stepping after step 11" in said[0], err[-2000:]
    assert ("its function loop" in said[0]) == (after == "return"), said  # the quick rule once it returned
    assert "the 2 profiled steps recorded are in" in said[0] and "Warning" not in err, err[-2000:]
    assert size < 50_000  # the two steps only (about 10 KB): nothing recorded after the loop stopped
    # the process ends promptly: no profiler left to stop and no long trace to write at exit (2.2 s here against
    # 7.2 s without the watchdog: benchmarks/profiler_cost/lifecycle_results.md; the bound leaves a loaded CI host room)
    assert exit_s < 6.0, exit_s
    if after == "backward":
        assert seen["grad_ok"]  # the backward's result is its own


def test_a_loop_that_steps_is_left_alone(out):
    """The watchdog never touches a loop that keeps stepping, a pause under its limit included (half a
    second in one profiled step; the limit: 1 s or 20x the slowest step)."""
    model, opt = tiny()
    prof = profiling.Profiler(model, out_dir=out, **FAST)
    dog = None
    while not prof.done:
        train(model, opt)
        if prof.steps == 6:  # the second profiled step
            time.sleep(0.5)
        prof.step()
        dog = prof._watchdog or dog
    one_off = [r for r in prof.summary.get("one_off") or () if r.get("step")]  # the paused step: a one-off
    assert prof.report is not None and prof.summary["steps"] + len(one_off) == 3
    assert dog.scheduled == 0 and not dog._thread.is_alive()


def test_the_loop_frame_is_the_function_that_steps():
    pace = watchdog.Pace()

    def steps(n):
        for _ in range(n):
            pace.stepped(sys._getframe(), measured=True)
            pace.returned()
        return pace.loop_frame(), watchdog._on_stack(pace.thread, pace.loop_frame())

    frame, there = steps(3)
    assert frame[1] is steps.__code__ and there  # the loop's own frame, on the stack while it runs
    assert not watchdog._on_stack(pace.thread, frame)  # returned

    def generator():
        while True:
            pace.stepped(sys._getframe(), measured=True)
            yield
    pace, gen = watchdog.Pace(), generator()
    next(gen), next(gen)
    assert pace.loop_frame()[1] is not generator.__code__  # a generator's frame is off the stack between


def test_what_ran_after_the_last_step_is_cut():
    from profiling.profile.capture.window import cut_after_steps
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 10},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 2, "dur": 1},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 3, "dur": 1,
               "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 30, "dur": 5, "args": {"correlation": 1}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 20, "dur": 1},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 21, "dur": 1,
               "args": {"correlation": 2}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 40, "dur": 5, "args": {"correlation": 2}},
              {"ph": "f", "cat": "ac2g", "id": 2, "ts": 40},
              {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "ts": 0, "dur": 50},
              {"ph": "M", "name": "process_name", "args": {"name": "python"}}]
    trace = {"traceEvents": events}
    cut_after_steps(trace)
    kept = [(e["name"], e.get("ts")) for e in trace["traceEvents"]]
    # the step's own kernel stays however late it ran; the later launch, its kernel and flow go
    assert kept == [("ProfilerStep#1", 0), ("aten::mm", 2), ("cudaLaunchKernel", 3), ("gemm", 30),
                    ("PyTorch Profiler (0)", 0), ("process_name", None)]
    assert trace["traceEvents"][4]["dur"] == 10


def tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train(model, opt):
    model(torch.randn(4, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    return tmp_path / "profiles"


def test_close_inside_the_window_writes_the_report_with_what_is_missing(out):
    model, opt = tiny()
    prof = profiling.Profiler(model, out_dir=out, **FAST)
    for _ in range(7):  # 1 + 3 timed + 1 profiler warm-up + 2 of the 3 profiled
        train(model, opt)
        prof.step()
    assert torch.autograd.profiler._is_profiler_enabled  # mid-window
    prof.close()
    assert prof.done and not torch.autograd.profiler._is_profiler_enabled
    assert prof.summary["steps"] == 2
    assert "note: the loop ended after 2 of 3 profiled steps (the loop stopped after step 7); missing: " \
        "shapes, eager_lines" in prof.report
    prof.close()  # twice: nothing more


def test_with_ending_on_an_exception_keeps_it_and_saves_the_trace(out, capsys):
    model, opt = tiny()
    with pytest.raises(ZeroDivisionError):
        with profiling.Profiler(model, out_dir=out, **FAST) as prof:
            for i in range(9):
                train(model, opt)
                if i == 7:
                    1 / 0
                prof.step()
    assert prof.done and prof.report is None and not torch.autograd.profiler._is_profiler_enabled
    assert sys.gettrace() is None or "LineTracer" not in repr(sys.gettrace())
    err = capsys.readouterr().err
    assert re.search(r"an exception \(ZeroDivisionError: division by zero, at \S*test_lifecycle\.py:\d+\) in step 8", err)
    assert "the 2 profiled steps recorded" in err  # its type, message and the line that raised it (#49)
    assert len(list(out.glob("*/trace.json.gz"))) == 1


def test_ending_in_the_line_record_step_keeps_the_profile_whole(out, capsys):
    model, opt = tiny()
    with pytest.raises(KeyboardInterrupt):
        with profiling.Profiler(model, out_dir=out, **FAST) as prof:
            for i in range(10):
                train(model, opt)
                if i == 9:  # the line-record step (after the shape step): its tracer is on
                    raise KeyboardInterrupt
                prof.step()
    assert sys.gettrace() is None and not torch.autograd.profiler._is_profiler_enabled
    path = next(out.glob("*/trace.json.gz"))
    meta = json.loads(gzip.decompress(path.read_bytes()))["autoresearch"]
    assert meta["ended_early"] == {"how": "KeyboardInterrupt in step 10", "active_steps": 3, "of": 3,
                                   "missing": ["eager_lines"]}


def test_the_settings_it_changed_are_put_back(out):
    import torch._inductor.config as config
    before = (config.trace.provenance_tracking_level, config.cpp.enable_kernel_profile,
              torch.compiler.config.cache_key_tag)
    provenance.stop()  # another test's Profiler may have left it on before this fix's time
    model, opt = tiny()
    for stop_early in (False, True):
        prof = profiling.Profiler(model, out_dir=out, **FAST)
        assert config.trace.provenance_tracking_level == 1 and provenance.started()
        for _ in range(6 if stop_early else prof.total_steps):
            train(model, opt)
            prof.step()
        prof.close()
        after = (config.trace.provenance_tracking_level, config.cpp.enable_kernel_profile,
                 torch.compiler.config.cache_key_tag)
        assert after == before and not provenance.started()


def test_an_out_dir_that_cannot_be_written_fails_at_construction(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"out_dir .*file/profiles.* is a file; give a folder path") as e:
        profiling.Profiler(out_dir=tmp_path / "file" / "profiles")
    assert "\n" not in str(e.value)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="cannot be written"):
            profiling.Profiler(out_dir=ro / "profiles")


def test_the_outlier_rule():
    assert irregular.outliers([10, 10, 11, 10, 30]) == ([4], 10)
    assert irregular.outliers([10, 10, 14, 10, 19]) == ([], 10)  # under 2x the median
    assert irregular.outliers([0.2, 0.2, 0.9]) == ([], 0.2)      # under 1 ms over it
    assert irregular.outliers([10, 50]) == ([], None)           # too few steps
    mean, rows = irregular.timed([10, 10, 40, 10, 10])
    assert mean == 10 and rows == [{"step": 3, "ms": 40, "median_ms": 10}]


def saving_loop(out, save_at, profile_save_at, tmp_path):
    """A real loop with a torch.save of a big tensor in one timed and one profiled step."""
    model, opt = tiny()
    big = torch.randn(16, 1024, 1024)  # 64 MB
    # 7 timed steps: the step after a save may run slow too (the OS writing the file back), and 2 slow steps of 5
    # would read as the loop's periodic pattern (irregular.PERIODIC_SHARE)
    prof = profiling.Profiler(model, out_dir=out, warmup_steps=1, timed_steps=7, active_steps=4)
    step = 0
    while not prof.done:
        step += 1
        train(model, opt)
        if step in (save_at, profile_save_at):
            for _ in range(3):
                torch.save(big, tmp_path / "checkpoint.pt")
        prof.step()
    return prof


def test_a_checkpoint_save_in_a_timed_and_a_profiled_step_is_named(out, tmp_path):
    prof = saving_loop(out, save_at=4, profile_save_at=11, tmp_path=tmp_path)  # timed step 3; profiled step 2
    s, md = prof.summary, prof.report
    assert "timed step 3 of 7 took" in md and "left out of the unprofiled step time" in md
    check = next(c for c in s["checks"] if c["name"] == irregular.CHECK)
    # (a loaded 2-core host may make one more tiny step an outlier: the save is the one named first)
    assert check["outliers"] >= 1 and check["detail"].startswith("profiled step 2 of 4"), check
    assert "a checkpoint save" in check["detail"] and s["steps"] <= 3  # left out of the per-step figures
    assert "one-off, not per step: profiled step 2 of 4" in md
    assert "serialization.py" in check["detail"], check  # torch.save's frames, sampled only in it


def test_the_previous_profile_is_compared_only_when_of_the_same_script_and_model(out):
    meta = dict(script="/a/train.py", parameters={"h.0.w": [4, 4], "h.1.w": [4, 4]})
    deeper = dict(meta, parameters={"h.0.w": [8, 8], "h.1.w": [8, 8], "h.2.w": [8, 8]})
    assert folder.run_identity(meta) == folder.run_identity(deeper)  # the same model, deeper and wider
    other = dict(meta, parameters={"conv.0.weight": [3, 3]})
    assert folder.run_identity(meta) != folder.run_identity(other)
    assert folder.run_identity(meta) != folder.run_identity(dict(meta, script="/b/bench.py"))
    previous, now = {"run": folder.run_identity(meta)}, {"run": folder.run_identity(other)}
    assert folder.comparable(previous, {"run": folder.run_identity(deeper)}) == (previous, None)
    assert folder.comparable(previous, now)[0] is None and "another script or model" in \
        folder.comparable(previous, now)[1]
    models = [tiny()[0], nn.Sequential(nn.Conv1d(4, 4, 3))]
    reports = []
    for model in models:
        prof = profiling.Profiler(model, out_dir=out, warmup_steps=0, timed_steps=0, unprofiled_step_ms=1.0,
                                  active_steps=1, profiler_warmup_steps=0)
        x = torch.randn(4, 32) if model is models[0] else torch.randn(2, 4, 8)
        while not prof.done:
            model(x).sum().backward()
            prof.step()
        reports.append(prof.report)
    assert "Changes since the previous profile" not in reports[1] and "another script or model" in reports[1]
