"""train.py on several processes (issue #27), on the CPU with gloo: torchrun runs of tests/ddp_worker.py and of
train.py itself. Every rank ends with the same parameters; the ranks' shares of the data are disjoint and
val_bpb is the one-process metric; one rank failing ends the others quickly, with its error shown."""
import json
import os
import subprocess
import sys
import time

import pytest

import prepare
import train
from profiling import runfile, runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "ddp_worker.py")
# The ranks' context length: a quarter of the cpu preset's 256, so each rank's steps and eval cost a quarter
# (every run here is 2 torchrun'd processes on the 2-core CPU); nothing asserted depends on the length
SEQ = 64


def torchrun(args, tmp_path, nproc=2, timeout=300, **env):
    """Run `torchrun --standalone --nproc_per_node=nproc ARGS` in tmp_path; the CompletedProcess and its
    wall seconds."""
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", AUTORESEARCH_MAX_SEQ_LEN=str(SEQ), **env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t0


def ranks_output(folder, n):
    return [json.load(open(os.path.join(folder, f"rank-{k}.json"))) for k in range(n)]


@pytest.mark.slow
def test_every_rank_holds_the_same_parameters_after_each_step(prepared_cache, tmp_path):
    proc, _ = torchrun([WORKER, "params", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = ranks_output(tmp_path, 2)
    assert r0["micro_batches"] == 2  # the no_sync path: gradients averaged on the last micro-batch only
    assert r0["params"] == r1["params"]  # bitwise: the same averaged gradients, the same updates
    assert r0["losses"] != r1["losses"]  # and the ranks did train on different data


@pytest.mark.slow
def test_val_bpb_on_two_ranks_is_the_one_rank_metric(prepared_cache, tmp_path, monkeypatch):
    env = {"AUTORESEARCH_EVAL_TOKENS": str(5 * 2 * SEQ)}  # 5 batches: 3 on rank 0, 2 on rank 1
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one, _ = torchrun([WORKER, "eval", str(tmp_path / "one")], tmp_path, nproc=1, **env)
    two, _ = torchrun([WORKER, "eval", str(tmp_path / "two")], tmp_path, nproc=2, **env)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr + two.stderr)[-3000:]
    [single] = ranks_output(tmp_path / "one", 1)
    both = ranks_output(tmp_path / "two", 2)
    assert both[0]["val_bpb"] == both[1]["val_bpb"]
    assert abs(both[0]["val_bpb"] - single["val_bpb"]) < 1e-4


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("mode,error", [("crash", "planted failure on rank 1"), ("hang", "Signal 9")])
def test_one_rank_failing_ends_the_others_with_its_error(prepared_cache, tmp_path, mode, error):
    proc, seconds = torchrun([WORKER, mode, str(tmp_path)], tmp_path, timeout=120)
    assert proc.returncode != 0
    assert error in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "rank-0.json").exists()  # rank 0 did not finish: it was stopped
    assert seconds < 60  # torchrun's start and imports are most of it; a hang would wait for the timeout


@pytest.mark.slow
def test_train_py_on_two_processes_trains_profiles_evaluates_and_writes_one_run_json(prepared_cache, tmp_path):
    env = dict(AUTORESEARCH_TIME_BUDGET="2", AUTORESEARCH_EVAL_TOKENS=str(4 * 4 * SEQ),
               AUTORESEARCH_MEMORY=str(tmp_path / "experiments.json"),
               AUTORESEARCH_PROFILE_DIR=str(tmp_path / "profiles"))
    proc, _ = torchrun([os.path.join(ROOT, "train.py"), "--active-steps", "2", "--warmup-steps", "1"], tmp_path,
                       **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("\n---\n") == 1 and proc.stdout.count("# Profile:") == 1  # rank 0 prints
    block = proc.stdout[proc.stdout.rindex("\n---\n"):]
    assert "world_size:       2" in block and "status:           ok" in block
    run = runfile.read_run(tmp_path / "run.json")
    assert run["summary"]["world_size"] == 2 and run["settings"]["hardware"] == "2x cpu"
    folder = run["profile"]
    assert sorted(os.listdir(folder)) == ["rank-0.trace.json.gz", "rank-1.trace.json.gz", "report.md",
                                          "summary.json"]
    assert "## Ranks (2)" in proc.stdout
    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    assert summary["world_size"] == 2 and [r["rank"] for r in summary["ranks"]] == [0, 1]
    for r in summary["ranks"]:
        assert {"step_ms", "comm_ms", "exposed_comm_ms", "idle_ms"} <= set(r) and r["comm_ms"] > 0


def test_gradient_accumulation_must_divide_over_the_ranks(monkeypatch):
    tokens = train.DEVICE_BATCH_SIZE * prepare.MAX_SEQ_LEN
    monkeypatch.setattr(train, "TOTAL_BATCH_SIZE", 2 * tokens)
    assert train.check_batch_sizes(2) == 1
    with pytest.raises(runner.ConfigError, match=r"DEVICE_BATCH_SIZE x MAX_SEQ_LEN x 3 ranks"):
        train.check_batch_sizes(3)


def test_training_shares_are_disjoint_and_validation_shares_interleave(prepared_cache):
    tok = prepare.Tokenizer.from_directory()

    def first(split, shard, n):
        stream = prepare.packed_batches(tok, 4, 64, split, shard=shard)
        return [next(stream)[0].tobytes() for _ in range(n)]

    one, r0, r1 = first("train", (0, 1), 4), first("train", (0, 2), 4), first("train", (1, 2), 4)
    assert not set(r0) & set(r1) and set(r0) != set(one)
    one, r0, r1 = first("val", (0, 1), 6), first("val", (0, 2), 3), first("val", (1, 2), 3)
    assert one == [r0[0], r1[0], r0[1], r1[1], r0[2], r1[2]]
