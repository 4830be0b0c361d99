"""runner.Run.profile_reference: the live profile's reference for the `regression` finding is the best kept
run of the memory with the same settings and dataset, when its profile folder still holds a summary."""
import types

from profiling import runner
from profiling.research import experiments

SETTINGS = {"preset": "cpu", "MAX_SEQ_LEN": 256}


def record(i, val, status, profile):
    r = dict.fromkeys(experiments.RECORD_KEYS)
    r.update(id=i, time=f"2026-11-23T0{i}:00:00Z", commit=f"c{i}", dimension="baseline" if i == 1 else "optimizer",
             change="x", status=status, val_bpb=val, settings=SETTINGS, dataset="builtin", profile=profile)
    return r


def run_with(tmp_path, monkeypatch, records):
    mem = experiments.empty_memory()
    mem["experiments"] = records
    path = tmp_path / "experiments.json"
    path.write_text(experiments.dumps(mem))
    monkeypatch.setenv("AUTORESEARCH_MEMORY", str(path))
    return types.SimpleNamespace(record={"settings": SETTINGS, "dataset": "builtin"})


def test_the_best_kept_runs_profile(tmp_path, monkeypatch):
    best, worse = tmp_path / "p2", tmp_path / "p1"
    for folder in (best, worse):
        folder.mkdir()
        (folder / "summary.json").write_text("{}")
    run = run_with(tmp_path, monkeypatch, [record(1, 1.0, "keep", str(worse)), record(2, 0.9, "keep", str(best)),
                                           record(3, 0.8, "discard", str(worse))])
    path, label = runner.Run.profile_reference(run)
    assert path == str(best / "summary.json") and label == "the best kept run, experiment 2 (c2)"


def test_none_without_a_profile_or_a_readable_memory(tmp_path, monkeypatch):
    run = run_with(tmp_path, monkeypatch, [record(1, 1.0, "keep", str(tmp_path / "gone"))])
    assert runner.Run.profile_reference(run) is None
    (tmp_path / "experiments.json").write_text("{not json")
    assert runner.Run.profile_reference(run) is None
