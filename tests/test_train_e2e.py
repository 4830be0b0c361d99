"""train.py end to end on the CPU, at test scale: the summary, run.json, --profile, FAIL, the gate.

Most runs call train.main() in-process (torch is imported once); one runs `python train.py` for real.
Scale: the conftest's cpu preset (VOCAB 512) at MAX_SEQ_LEN 64 (SEQ), a few seconds of budget, a tiny eval.
"""
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

import prepare
import train
from profiling import cli, runfile, runner
from profiling.profile.trace.traceio import load_trace
from profiling.research import gate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = 2.0
# The runs' context length: a quarter of the cpu preset's 256 (train.py's TOTAL_BATCH_SIZE on the CPU is 8
# sequences), so the 10 uncounted steps, the profile and the eval cost about half the CPU time; what the tests
# check (the summary, run.json, the profile's files, the gate, the exit codes) does not depend on it
SEQ = 64


@pytest.fixture
def tiny(prepared_cache, tmp_path, monkeypatch):
    """A tiny, fast run: short budget, small eval, files in a temp dir, a memory of its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "TIME_BUDGET", BUDGET)
    for module in (train, prepare):  # train.py took its own copy of prepare's MAX_SEQ_LEN at import
        monkeypatch.setattr(module, "MAX_SEQ_LEN", SEQ)
    monkeypatch.setattr(train, "TOTAL_BATCH_SIZE", 8 * SEQ)  # as train.py sets it on the CPU
    monkeypatch.setattr(prepare, "EVAL_TOKENS", 2 * train.DEVICE_BATCH_SIZE * prepare.MAX_SEQ_LEN)
    monkeypatch.setenv("AUTORESEARCH_MEMORY", str(tmp_path / "experiments.json"))
    monkeypatch.setenv("AUTORESEARCH_PROFILE_DIR", str(tmp_path / "profiles"))
    return tmp_path


def summary_block(out):
    block = out[out.rindex("\n---\n") + 1:]
    return dict(line.split(":", 1) for line in block.splitlines()[1:] if ":" in line)


def test_run_prints_every_summary_field_and_writes_run_json(tiny, capsys):
    assert train.main(["--no-gate"]) == 0
    out = capsys.readouterr().out
    fields = summary_block(out)
    for key in runfile.SUMMARY_FIELDS:
        assert key in fields, key
    assert re.search(r"^val_bpb:\s+\d+\.\d{6}$", out, re.M)
    assert fields["status"].strip() == "ok"
    run = runfile.read_run(tiny / "run.json")  # validates the schema
    assert run["status"] == "ok" and run["dataset"] == "builtin"
    assert 0 < run["summary"]["val_bpb"] < 20
    assert run["summary"]["num_steps"] > train.EXCLUDED_STEPS
    assert run["settings"] == prepare.settings()
    assert run["hyperparameters"]["DEPTH"] == train.DEPTH
    curve = run["loss_curve"]
    assert len(curve["fractions"]) >= 15 and curve["fractions"] == runfile.curve_fractions()[:len(curve["fractions"])]
    # finite points; that it learns is test_loss_falls_on_the_builtin_corpus's, counted in steps: a 2 s budget
    # on a slow machine may count a single step, and then every point is that step's loss
    assert all(math.isfinite(x) for x in curve["loss"])
    # the run profiled itself after compilation and points at its profile
    assert os.path.isfile(os.path.join(run["profile"], "report.md"))
    assert "CPU profile" in out


def test_loss_falls_on_the_builtin_corpus(prepared_cache):
    """A few dozen steps of the CPU model on real data, counted in steps (not seconds, so load can't matter)."""
    torch.manual_seed(0)
    tokenizer = prepare.Tokenizer.from_directory()
    model = train.build_model(tokenizer.get_vocab_size(), torch.device("cpu"))
    loader = prepare.make_dataloader(tokenizer, train.DEVICE_BATCH_SIZE, prepare.MAX_SEQ_LEN, "train")
    step_fn, _ = train.make_train_step(model, train.make_optimizer(model), loader, train.check_batch_sizes(1),
                                       torch.autocast("cpu", dtype=torch.bfloat16), runner.Ranks(cuda=False))
    losses = [step_fn(step, 0.0).item() for step in range(40)]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_profile_only_prints_report_and_writes_three_files(tiny, capsys):
    assert train.main(["--profile", "--warmup-steps", "1", "--active-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "## 1. Step budget" in out and "CPU profile" in out
    assert "val_bpb" not in out  # no training budget spent, no evaluation
    latest = tiny / "profiles" / "latest"
    assert sorted(os.listdir(latest)) == ["report.md", "summary.json", "trace.json.gz"]
    summary = json.loads((latest / "summary.json").read_text())
    assert summary["steps"] == 2
    meta = load_trace(str(latest / "trace.json.gz"))["autoresearch"]  # the steps that timed the reference, and
    assert len(meta["timed_step_faults_each"]) == len(meta["timed_step_ms_each"]) > 0  # their page faults
    assert (latest / "report.md").read_text().strip() in out  # the file is what was printed
    # a second profile diffs against the first, and `latest` moves on
    first = os.readlink(latest)
    assert train.main(["--profile", "--warmup-steps", "1", "--active-steps", "2"]) == 0
    assert "Changes since the previous profile" in capsys.readouterr().out
    assert os.readlink(latest) != first


def test_profile_with_zero_active_steps_is_refused(tiny, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--profile", "--active-steps", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--active-steps" in err and "must be 1 or more" in err


def test_nan_loss_prints_fail_and_exits_1(tiny, capsys, monkeypatch):
    def nan_step(model, optimizer, loader, grad_accum_steps, autocast, ranks):
        return (lambda step, progress: torch.tensor(float("nan"))), model
    monkeypatch.setattr(train, "make_train_step", nan_step)
    assert train.main(["--no-gate", "--no-profile"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert runfile.read_run(tiny / "run.json")["status"] == "fail"


def test_an_exception_in_training_writes_a_crash_run_json(tiny, capsys, monkeypatch):
    def broken_step(model, optimizer, loader, grad_accum_steps, autocast, ranks):
        def step(step, progress):
            raise RuntimeError("shape mismatch in an edit")
        return step, model
    monkeypatch.setattr(train, "make_train_step", broken_step)
    assert train.main(["--no-gate", "--no-profile"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" in captured.err and "shape mismatch" in captured.err
    run = runfile.read_run(tiny / "run.json")
    assert run["status"] == "crash" and "RuntimeError: shape mismatch" in run["error"]


def test_a_run_that_never_finishes_leaves_a_crash_run_json(tiny, monkeypatch):
    """Killed or timed out: run.json already says crash, so the memory never takes an old run's numbers."""
    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "make_train_step", killed)
    with pytest.raises(KeyboardInterrupt):
        train.main(["--no-gate", "--no-profile"])
    run = runfile.read_run(tiny / "run.json")
    assert run["status"] == "crash" and "did not finish" in run["error"]


def test_batch_sizes_that_do_not_divide_fail_before_any_compute(tiny, capsys, monkeypatch):
    monkeypatch.setattr(train, "TOTAL_BATCH_SIZE", 1000)
    monkeypatch.setattr(train, "build_model", lambda *a: pytest.fail("built a model"))
    assert train.main([]) == 2
    assert "TOTAL_BATCH_SIZE" in capsys.readouterr().err
    assert runfile.read_run(tiny / "run.json")["status"] == "crash"


def fabricated_memory(path, loss, tmp_path):
    """A memory whose best kept run has a flat loss curve at `loss` (same settings and dataset)."""
    fractions = runfile.curve_fractions()
    summary = dict.fromkeys(runfile.SUMMARY_FIELDS, 1.0)
    summary.update(val_bpb=0.5, num_steps=100, depth=2)
    run = runfile.make_run("ok", summary, prepare.settings(), "builtin", commit="abc1234",
                           time="2026-11-21T00:00:00+0000",
                           loss_curve={"fractions": fractions, "loss": [loss] * len(fractions)})
    fake = tmp_path / "reference-run.json"
    runfile.write_run(fake, run)
    assert cli.main(["--memory", str(path), "log", "--run", str(fake), "--dimension", "baseline",
                     "--change", "fabricated reference"]) == 0


def test_gate_aborts_a_run_far_worse_than_the_reference(tiny, capsys):
    memory_path = tiny / "experiments.json"
    fabricated_memory(memory_path, 0.01, tiny)  # unreachably good
    capsys.readouterr()
    assert train.main(["--no-profile"]) == gate.EXIT_CODE
    out = capsys.readouterr().out
    fields = summary_block(out)
    assert fields["status"].strip() == "early_abort"
    assert float(fields["gate_ratio"]) > gate.THRESHOLD
    run = runfile.read_run(tiny / "run.json")
    assert run["status"] == "early_abort" and run["summary"]["val_bpb"] is None
    assert run["summary"]["total_seconds"] > 0  # (a loaded machine's first step may outlast the 2 s budget)
    decision = run["gate"]["decisions"][-1]
    assert decision["abort"] and decision["fraction"] == gate.CHECKPOINTS[0]
    assert cli.main(["--memory", str(memory_path), "log", "--dimension", "optimizer", "--change", "bad"]) == 0
    records = json.loads(memory_path.read_text())["experiments"]
    assert records[-1]["status"] == "early_abort"


def test_gate_lets_a_run_better_than_the_reference_finish(tiny, capsys):
    fabricated_memory(tiny / "experiments.json", 50.0, tiny)  # far worse than any real run
    assert train.main(["--no-profile"]) == 0
    run = runfile.read_run(tiny / "run.json")
    assert run["status"] == "ok"
    assert run["gate"]["decisions"] and not run["gate"]["decisions"][0]["abort"]


def test_corrupt_memory_turns_the_gate_off_with_a_warning(tiny, capsys):
    (tiny / "experiments.json").write_text("{ not json")
    assert train.main(["--no-profile"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"Early-abort gate: off: the memory cannot be read", out)
    assert runfile.read_run(tiny / "run.json")["status"] == "ok"
    assert (tiny / "experiments.json").read_text() == "{ not json"  # untouched


def test_gate_decision_math():
    curve = {"fractions": [0.25, 0.5], "loss": [4.0, 2.0]}
    assert gate.curve_at(curve, 0.25) == 4.0
    assert gate.curve_at(curve, 0.375) == pytest.approx(3.0)
    assert gate.curve_at(curve, 0.1) is None and gate.curve_at(curve, 0.6) is None
    d = gate.decide(3.3, 0.375, {"loss_curve": curve, "id": 7})
    assert d["ratio"] == pytest.approx(1.1) and d["abort"]
    assert not gate.decide(3.1, 0.375, {"loss_curve": curve})["abort"]
    g = gate.Gate({"loss_curve": curve}, checkpoints=(0.3,))
    assert g.check(0.29, 100.0) is None  # before the checkpoint: nothing, whatever the loss
    assert g.check(0.31, 3.0)["fraction"] == 0.3
    assert g.check(0.9, 100.0) is None  # each checkpoint is looked at once


@pytest.mark.slow
def test_train_py_runs_as_a_script(prepared_cache, tmp_path):
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET="2", AUTORESEARCH_EVAL_TOKENS="4096",
               AUTORESEARCH_MAX_SEQ_LEN=str(SEQ), AUTORESEARCH_MEMORY=str(tmp_path / "experiments.json"),
               PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--no-profile"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fields = summary_block(proc.stdout)
    assert math.isfinite(float(fields["val_bpb"]))
    assert runfile.read_run(tmp_path / "run.json")["settings"]["TIME_BUDGET"] == 2


# torch's own message, as c10's caching allocator writes it on an 80 GB H100 (figures made up, format real)
OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
               "6.12 GiB is free. Including non-PyTorch memory, this process has 73.06 GiB memory in use. Of the "
               "allocated memory 71.50 GiB is allocated by PyTorch, and 1.06 GiB is reserved by PyTorch but "
               "unallocated. If reserved but unallocated memory is large try setting "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def test_cuda_out_of_memory_explains_itself_in_the_log_run_json_and_the_memory(tiny, capsys, monkeypatch):
    """A simulated allocator error in the training step: the FAIL line names the limit, the request, the line,
    the allocator's split and a micro-batch to try; run.json and, once logged, experiments.json keep it."""
    def oom_step(model, optimizer, loader, grad_accum_steps, autocast, ranks):
        def step(step, progress):
            raise torch.OutOfMemoryError(OOM_MESSAGE)
        return step, model
    monkeypatch.setattr(train, "make_train_step", oom_step)
    assert train.main(["--no-gate", "--no-profile"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = next(x for x in err.splitlines() if x.startswith("FAIL: "))
    assert line.startswith(f"FAIL: CUDA out of memory at DEVICE_BATCH_SIZE={train.DEVICE_BATCH_SIZE}: hit the "
                           "device's memory, 81,091 MB, allocating 8,192 MB at ")
    assert "test_train_e2e.py:" in line and "raise torch.OutOfMemoryError(OOM_MESSAGE)" in line  # the user's line
    assert "allocated by PyTorch 73,216 MB" in line and "reserved but unallocated 1,085 MB" in line
    run = runfile.read_run(tiny / "run.json")
    assert run["status"] == "crash" and run["error"] == line[len("FAIL: "):]
    info = run["oom"]
    assert info["limit"] == "device" and info["requested_mb"] == 8192.0 and info["micro_batch"] == train.DEVICE_BATCH_SIZE
    assert info["fixed_mb"] == 0.0  # the CPU model holds no CUDA memory
    assert info["max_micro_batch"] < train.DEVICE_BATCH_SIZE  # what failed does not fit
    assert f"at most {info['max_micro_batch']} sequences per micro-batch can fit" in line
    assert f"try DEVICE_BATCH_SIZE={info['recommended_micro_batch']}" in line and 1 <= info["recommended_micro_batch"] <= 3
    sequences = train.TOTAL_BATCH_SIZE // train.MAX_SEQ_LEN   # what train.py accepts divides it (#43)
    assert sequences % info["recommended_micro_batch"] == 0 and info["sequences_per_step"] == sequences
    assert info["fitted"] is None   # on the CPU no profile measured memory: nothing to compare with
    assert cli.main(["log", "--dimension", "batching", "--change", "micro-batch 16", "--run", str(tiny / "run.json")]) == 0
    record = json.loads((tiny / "experiments.json").read_text())["experiments"][-1]
    assert record["status"] == "crash" and record["oom"] == info and record["error"] == run["error"]


def test_summary_format_is_pinned():
    """The block the agent greps, character for character (upstream's fields and formats, the number of
    ranks, then status)."""
    summary = dict(val_bpb=0.9979, training_seconds=300.12, total_seconds=325.94, peak_vram_mb=45060.2,
                   mfu_percent=39.8, total_tokens_M=499.6, num_steps=953, num_params_M=50.3, depth=8,
                   world_size=1)
    assert runfile.format_summary(summary) == (
        "---\n"
        "val_bpb:          0.997900\n"
        "training_seconds: 300.1\n"
        "total_seconds:    325.9\n"
        "peak_vram_mb:     45060.2\n"
        "mfu_percent:      39.80\n"
        "total_tokens_M:   499.6\n"
        "num_steps:        953\n"
        "num_params_M:     50.3\n"
        "depth:            8\n"
        "world_size:       1\n"
        "status:           ok")
    summary.update(val_bpb=None, mfu_percent=None)
    block = runfile.format_summary(summary, "early_abort", [("gate_reference_loss", 0.217536)])
    assert "\nval_bpb:             n/a\n" in block  # a longer key widens the column for every line
    assert "\ngate_reference_loss: 0.217536\n" in block and block.endswith("\nstatus:              early_abort")


def test_a_slow_step_in_profile_steps_is_no_stopped_loop(tiny, capsys, monkeypatch):
    """profile_steps drives its loop itself: no watchdog closes it, however slow a step (a loaded 2-core host
    once ran a 2.1 s step after 47 ms ones, the watchdog closed the window and train.py crashed on the missing
    report); here the watchdog would close at once."""
    from profiling.profile.capture import watchdog
    monkeypatch.setattr(watchdog, "LEFT_STEPS", 0.0)
    monkeypatch.setattr(watchdog, "LEFT_FLOOR_S", 0.0)
    assert train.main(["--profile", "--warmup-steps", "1", "--active-steps", "2"]) == 0
    assert "## 1. Step budget" in capsys.readouterr().out


def test_a_profile_that_ended_without_its_report_leaves_the_run_going(tiny, capsys, monkeypatch):
    import profiling.api
    monkeypatch.setattr(profiling.api, "profile_steps", lambda *a, **k: None)
    assert train.main(["--profile", "--warmup-steps", "1", "--active-steps", "2"]) == 0
    assert "status:           crash" not in capsys.readouterr().out
