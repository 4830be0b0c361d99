"""Many writers on one experiments.json, and writers killed with SIGKILL in the middle of a write."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from profiling.research import experiments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A worker: `python -c WORKER memory_path worker_index count`: logs `count` distinct runs through main().
WORKER = r"""
import sys
from profiling import cli, runfile
path, k, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
run = f"{path}.run{k}.json"
summary = dict.fromkeys(runfile.SUMMARY_FIELDS)
settings = {"preset": "test", "TIME_BUDGET": 60}
for i in range(count):
    summary["val_bpb"] = 1.0 + (k * 1000 + i) * 1e-6
    runfile.write_run(run, runfile.make_run("ok", summary, settings, "builtin", commit=f"w{k}", time=f"{k}.{i}"))
    code = cli.main(["--memory", path, "log", "--dimension", "optimizer", "--change", f"w{k} i{i}", "--run", run])
    assert code == 0, code
"""

# Logs once, but stops for good at `phase` (before or after the rename) after writing a marker file.
STALL = r"""
import os, sys, time
from profiling import cli, runfile
path, phase, marker = sys.argv[1], sys.argv[2], sys.argv[3]
summary = dict.fromkeys(runfile.SUMMARY_FIELDS)
summary["val_bpb"] = 0.5
runfile.write_run(path + ".run.json", runfile.make_run("ok", summary, {}, "builtin", commit="x", time="x"))
real = {"fsync": os.fsync, "replace": os.replace}
def stall(name):
    def wrapped(*args):
        if name == "replace":
            real["replace"](*args)
        open(marker, "w").close()
        time.sleep(600)
    return wrapped
setattr(os, "fsync" if phase == "before rename" else "replace", stall("fsync" if phase == "before rename" else "replace"))
cli.main(["--memory", path, "log", "--dimension", "optimizer", "--change", "stalled", "--run", path + ".run.json"])
"""


def spawn(code, *args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def seed_memory(path, n):
    """A valid memory of n records, written directly."""
    mem = experiments.empty_memory()
    base = {k: None for k in experiments.RECORD_KEYS}
    mem["experiments"] = [dict(base, id=i, dimension="optimizer", status="discard", val_bpb=1.0, change="seed",
                               settings={"preset": "test", "TIME_BUDGET": 60}, dataset="builtin")
                          for i in range(1, n + 1)]
    path.write_text(experiments.dumps(mem))


def check(path):
    """The file parses and validates; its records."""
    return experiments.parse(path.read_text(encoding="utf-8"), str(path))["experiments"]


@pytest.mark.slow
def test_eight_processes_times_100_logs_lose_nothing(tmp_path):
    path = tmp_path / "experiments.json"
    workers = [spawn(WORKER, path, k, 100) for k in range(8)]
    for w in workers:
        _, err = w.communicate(timeout=600)
        assert w.returncode == 0, err.decode()
    records = check(path)
    assert len(records) == 800
    assert [r["id"] for r in records] == list(range(1, 801))
    assert sorted(r["change"] for r in records) == sorted(f"w{k} i{i}" for k in range(8) for i in range(100))
    for k in range(8):  # each worker's records are in its own order
        mine = [int(r["change"].split(" i")[1]) for r in records if r["change"].startswith(f"w{k} ")]
        assert mine == list(range(100))
    json.loads(path.read_text())  # plain JSON, too
    assert sorted(os.listdir(tmp_path)) == sorted(["experiments.json", "experiments.json.lock"]
                                                  + [f"experiments.json.run{k}.json" for k in range(8)])


@pytest.mark.parametrize("phase", ["before rename", "after rename"])
def test_kill_9_in_the_middle_of_a_write_leaves_a_valid_file(tmp_path, phase):
    path, marker = tmp_path / "experiments.json", tmp_path / "marker"
    seed_memory(path, 50)
    before = path.read_bytes()
    child = spawn(STALL, path, phase, marker)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert child.poll() is None, child.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    records = check(path)
    if phase == "before rename":
        assert path.read_bytes() == before  # the temp file was never renamed over it
        assert any(name.endswith(".tmp") for name in os.listdir(tmp_path))
    else:
        assert len(records) == 51 and records[-1]["change"] == "stalled"
    # the killed writer's flock died with it: the next writer gets the lock and clears the stale temp
    worker = spawn(WORKER, path, 0, 1)
    assert worker.wait(timeout=60) == 0, worker.stderr.read().decode()
    assert len(check(path)) == len(records) + 1
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))


@pytest.mark.slow
def test_kill_9_at_random_moments_never_corrupts(tmp_path):
    path = tmp_path / "experiments.json"
    seed_memory(path, 3000)  # ~2 MB: each log spends a good part of its time writing
    rng, count, mid_write = random.Random(5), 3000, 0
    for k in range(8):
        child = spawn(WORKER, path, k, 1000)
        time.sleep(rng.uniform(0.3, 1.2))
        assert child.poll() is None, child.stderr.read().decode()  # killed while logging, not after
        child.send_signal(signal.SIGKILL)
        child.wait()
        mid_write += any(name.endswith(".tmp") for name in os.listdir(tmp_path))
        records = check(path)
        assert len(records) >= count and [r["id"] for r in records] == list(range(1, len(records) + 1))
        count = len(records)
    assert count > 3000
    print(f"{mid_write} of 8 kills landed mid-write")  # the stalled-writer test above covers that case surely
