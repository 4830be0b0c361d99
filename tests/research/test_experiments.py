"""experiments.json storage (encoding, validation, atomic append) and the pure record queries."""
import json
import os
import stat
from datetime import datetime, timezone

import pytest

from profiling import runfile
from profiling.errors import UserError
from profiling.research import experiments, history

SETTINGS = {"preset": "test", "MAX_SEQ_LEN": 256, "TIME_BUDGET": 60, "EVAL_TOKENS": 4096, "VOCAB_SIZE": 512}
NOW = datetime(2026, 11, 21, 3, 14, 15, tzinfo=timezone.utc)


def make_run(val=1.0, status="ok", commit="c0", time="t0", settings=SETTINGS, dataset="builtin", **summary):
    values = dict.fromkeys(runfile.SUMMARY_FIELDS)
    values.update(val_bpb=val, training_seconds=55.0, peak_vram_mb=1000.0, num_steps=10)
    values.update(summary)
    curve = {"fractions": [0.5, 1.0], "loss": [3.0, 2.0]}
    return runfile.make_run(status, values, settings, dataset, commit=commit, time=time, loss_curve=curve)


def add(records, run, dimension="optimizer", status=None):
    record, _, _ = history.record_from_run(records, run, dimension, "a change", status=status, now=NOW)
    record["id"] = experiments.next_id(records)
    records.append(record)
    return record


def sample_memory():
    mem = experiments.empty_memory()
    for i, val in enumerate([1.0, 0.99, 1.01]):
        add(mem["experiments"], make_run(val, commit=f"c{i}", time=f"t{i}"))
    mem["rescue_pool"].append({"id": 1, "time": "x", "from_experiment": 3, "dimension": "optimizer",
                               "mechanism": "m", "reuse_signal": "s"})
    return mem


# ----------------------------------------------------------------------------
# Encoding

def test_the_committed_memory_is_the_empty_memory_in_canonical_form():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "experiments.json")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text == experiments.dumps(experiments.empty_memory())
    assert experiments.parse(text)["dimensions"] == ["optimizer", "architecture", "attention", "normalization",
                                                "schedule", "regularization", "batching"]


def test_dumps_is_indented_in_stable_key_order_and_round_trips():
    mem = sample_memory()
    text = experiments.dumps(mem)
    assert experiments.dumps(experiments.parse(text)) == text
    assert list(json.loads(text)) == ["version", "dimensions", "rescue_pool", "experiments"]
    first = json.loads(text)["experiments"][0]
    assert list(first) == list(experiments.RECORD_KEYS)
    assert '\n      "settings": {"preset": "test", "MAX_SEQ_LEN": 256' in text  # nested values on one line
    shuffled = {k: dict(reversed(list(r.items()))) for k, r in enumerate(mem["experiments"])}
    mem["experiments"] = list(shuffled.values())
    assert experiments.dumps(mem) == text  # key order does not depend on the dicts' order


def test_hand_added_keys_survive_a_rewrite():
    mem = sample_memory()
    mem["experiments"][0]["note"] = "added by hand"
    mem["owner"] = "me"
    again = experiments.parse(experiments.dumps(mem))
    assert again["experiments"][0]["note"] == "added by hand" and again["owner"] == "me"


def test_append_without_reencoding_gives_the_canonical_text(tmp_path):
    mem = sample_memory()
    raw = experiments.dumps(mem).encode()
    new = dict(mem["experiments"][-1], id=4)
    kept, tail = experiments._append_parts(raw, experiments.parse(raw.decode()), [new])
    mem["experiments"].append(new)
    assert bytes(kept) + tail == experiments.dumps(mem).encode()
    empty = experiments.empty_memory()
    raw = experiments.dumps(empty).encode()
    kept, tail = experiments._append_parts(raw, experiments.parse(raw.decode()), [new])
    empty["experiments"].append(new)
    assert bytes(kept) + tail == experiments.dumps(empty).encode()


def test_append_to_a_hand_formatted_file_keeps_it_valid(tmp_path):
    mem = sample_memory()
    path = tmp_path / "m.json"
    path.write_text(json.dumps(mem) + "\n\n")  # compact, one line, trailing blank line
    experiments.update(str(path), lambda m: (None, [dict(m["experiments"][0], id=None, change="new")]))
    again = experiments.load(str(path))
    assert [r["id"] for r in again["experiments"]] == [1, 2, 3, 4]
    assert again["experiments"][-1]["change"] == "new"
    # experiments not last: the whole file is rewritten, in canonical form
    reordered = {"experiments": mem["experiments"], **{k: v for k, v in mem.items() if k != "experiments"}}
    path.write_text(json.dumps(reordered))
    experiments.update(str(path), lambda m: (None, [dict(m["experiments"][0], id=None)]))
    text = path.read_text()
    assert text == experiments.dumps(experiments.parse(text)) and len(experiments.parse(text)["experiments"]) == 4


# ----------------------------------------------------------------------------
# Validation

@pytest.mark.parametrize("mutate, message", [
    (lambda m: m["experiments"][1].update(id=1), "id 1 is not an integer above the previous id 1"),
    (lambda m: m["experiments"][1].update(id="2"), "id '2'"),
    (lambda m: m["experiments"][0].update(status="great"), "status 'great'"),
    (lambda m: m["experiments"][0].update(val_bpb=-1.0), "val_bpb -1.0 is not positive"),
    (lambda m: m["experiments"][0].update(val_bpb=float("nan")), "val_bpb nan"),
    (lambda m: m["experiments"][0].update(dimension=""), "dimension ''"),
    (lambda m: m["experiments"][0].update(settings=[1]), "settings"),
    (lambda m: m.update(version=2), "version 2"),
    (lambda m: m.pop("rescue_pool"), "missing key 'rescue_pool'"),
    (lambda m: m.update(dimensions=["a", "a"]), "dimensions must be"),
    (lambda m: m["rescue_pool"][0].update(mechanism=None), "rescue_pool[0]"),
])
def test_validation_names_the_problem(mutate, message):
    mem = sample_memory()
    mutate(mem)
    with pytest.raises(UserError) as e:
        experiments.parse(json.dumps(mem), "m.json")
    assert message in str(e.value) and str(e.value).startswith("m.json: ")
    assert "\n" not in str(e.value)


def test_unparseable_text_is_a_user_error():
    with pytest.raises(UserError, match=r"m.json: not valid JSON .*never overwrites"):
        experiments.parse('{"version": 1, "dimensions": [', "m.json")


def test_a_missing_file_is_the_empty_memory(tmp_path):
    assert experiments.load(str(tmp_path / "none.json")) == experiments.empty_memory()


# ----------------------------------------------------------------------------
# Writing

def test_update_writes_atomically_and_keeps_the_mode(tmp_path):
    path = str(tmp_path / "m.json")
    experiments.update(path, lambda m: (None, [dict(sample_memory()["experiments"][0])]))
    os.chmod(path, 0o640)
    (tmp_path / ".m.json.123.dead.tmp").write_text("left by a killed writer")
    experiments.update(path, lambda m: (None, [dict(m["experiments"][0], id=None)]))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["m.json", "m.json.lock"]  # stale temp removed under the lock
    assert [r["id"] for r in experiments.load(path)["experiments"]] == [1, 2]


def test_update_writes_nothing_when_nothing_changes_or_change_fails(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(sample_memory()))  # not canonical: a rewrite would show
    before = path.read_bytes()
    assert experiments.update(str(path), lambda m: ("result", [])) == "result"

    def fail(m):
        m["dimensions"].append("new")
        raise UserError("no")
    with pytest.raises(UserError):
        experiments.update(str(path), fail)
    assert path.read_bytes() == before


def test_update_never_overwrites_a_file_it_cannot_parse(tmp_path):
    path = tmp_path / "m.json"
    path.write_bytes(b'{"version": 1, "experiments": [{"id": 1')
    with pytest.raises(UserError, match="not valid JSON"):
        experiments.update(str(path), lambda m: (None, [{"id": None}]))
    assert path.read_bytes() == b'{"version": 1, "experiments": [{"id": 1'


def test_update_in_a_missing_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        experiments.update(str(tmp_path / "no" / "m.json"), lambda m: (None, []))


# ----------------------------------------------------------------------------
# Records and queries

def test_baseline_is_the_best_kept_run_with_identical_settings_and_dataset():
    records = []
    first = add(records, make_run(1.0, commit="a", time="1"))
    assert (first["status"], first["baseline_bpb"], first["improvement"]) == ("keep", None, None)
    better = add(records, make_run(0.98, commit="b", time="2"))
    assert better["status"] == "keep" and better["baseline_id"] == 1
    assert better["improvement"] == pytest.approx(0.02)
    worse = add(records, make_run(0.985, commit="c", time="3"))
    assert worse["status"] == "discard" and worse["baseline_bpb"] == 0.98 and worse["loss_curve"] is None
    assert better["loss_curve"] == {"fractions": [0.5, 1.0], "loss": [3.0, 2.0]}  # kept runs keep their curve
    other = add(records, make_run(1.2, commit="d", time="4", dataset="climbmix"))
    assert other["status"] == "keep" and other["baseline_bpb"] is None  # never compared across datasets
    longer = add(records, make_run(1.1, commit="e", time="5", settings={**SETTINGS, "TIME_BUDGET": 300}))
    assert longer["baseline_bpb"] is None
    assert history.best_kept(records, SETTINGS, "builtin")["id"] == 2
    assert [r["id"] for r in history.best_per_group(records)] == [2, 4, 5]


def test_runs_on_other_gpu_kinds_or_numbers_are_other_groups():
    def on(hardware, val, commit, device="NVIDIA H100 80GB HBM3"):
        run = make_run(val, commit=commit, time=commit,
                       settings={**SETTINGS, "hardware": hardware} if hardware else SETTINGS)
        run["device"] = device
        return run

    records = []
    legacy = add(records, on(None, 1.0, "a"))  # written before runs named their hardware: one GPU
    assert legacy["settings"]["hardware"] == "1x NVIDIA H100 80GB HBM3"
    assert add(records, on("1x NVIDIA H100 80GB HBM3", 0.99, "b"))["baseline_id"] == legacy["id"]
    two = add(records, on("2x NVIDIA H100 80GB HBM3", 1.2, "c"))
    assert two["status"] == "keep" and two["baseline_bpb"] is None  # a new group: its own baseline
    h200 = add(records, on("1x NVIDIA H200", 1.3, "d", device="NVIDIA H200"))
    assert h200["baseline_bpb"] is None
    assert history.best_kept(records, {**SETTINGS, "hardware": "2x NVIDIA H100 80GB HBM3"}, "builtin") is two
    assert len(history.best_per_group(records)) == 3
    cpu = make_run(1.0, commit="e", time="e")
    cpu["device"] = "cpu"
    assert "hardware" not in history.group_settings(cpu)  # CPU runs of one process: as before


def test_run_status_maps_to_the_memory_status():
    records = [dict(add([], make_run(1.0)), id=1)]
    crash = history.record_from_run(records, make_run(None, "crash"), "optimizer", "x", now=NOW)[0]
    fail = history.record_from_run(records, make_run(None, "fail"), "optimizer", "x", now=NOW)[0]
    abort = history.record_from_run(records, make_run(None, "early_abort"), "optimizer", "x", now=NOW)[0]
    assert (crash["status"], crash["run_status"]) == ("crash", "crash")
    assert (fail["status"], fail["run_status"]) == ("crash", "fail")
    assert (abort["status"], abort["run_status"]) == ("early_abort", "early_abort")
    assert fail["time"] == "2026-11-21T03:14:15Z"


def test_status_override_is_checked():
    records = [dict(add([], make_run(1.0)), id=1)]
    kept = history.record_from_run(records, make_run(1.001), "optimizer", "simpler", status="keep", now=NOW)[0]
    assert kept["status"] == "keep" and kept["improvement"] == pytest.approx(-0.001)
    with pytest.raises(UserError, match="no val_bpb"):
        history.record_from_run(records, make_run(None, "crash"), "optimizer", "x", status="keep", now=NOW)


def test_noise_floor_is_the_pooled_std_of_repeated_commits():
    records = []
    for commit, val, t in [("a", 1.000, 1), ("a", 1.002, 2), ("b", 0.990, 3), ("b", 0.994, 4), ("c", 0.5, 5)]:
        add(records, make_run(val, commit=commit, time=str(t)), status="discard")
    add(records, make_run(None, "crash", commit="a", time="6"))  # crashes have no val_bpb: ignored
    # a: mean 1.001, squares 2e-6; b: mean 0.992, squares 8e-6; pooled: sqrt(10e-6 / 2) = 0.0022361
    floor = history.noise_floor(records, SETTINGS, "builtin")
    assert floor["std"] == pytest.approx(0.0022361, abs=1e-7)
    assert (floor["runs"], floor["commits"]) == (4, 2)
    assert history.noise_floor(records, SETTINGS, "climbmix") is None
    assert [f["std"] for f in history.noise_floors(records)] == [floor["std"]]
    # a new run 0.001 better than the best kept is within that noise
    records.append(dict(records[0], id=7, commit="k", status="keep", val_bpb=1.0))
    new = history.record_from_run(records, make_run(0.999, commit="d", time="8"), "optimizer", "x", now=NOW)[0]
    assert new["within_noise"] is True and new["noise_floor"] == pytest.approx(0.0022361, abs=1e-7)


def test_early_abort_savings():
    records = []
    add(records, make_run(None, "early_abort", time="1", training_seconds=18.0))  # TIME_BUDGET 60: saves 42
    add(records, make_run(None, "early_abort", time="2", training_seconds=20.5))  # saves 39.5
    add(records, make_run(1.0, time="3"))
    records.append(dict(records[0], id=4, settings=None))  # imported: no budget known
    assert history.early_abort_savings(records) == {"count": 3, "timed": 2, "saved_seconds": 81.5}


def test_a_run_is_logged_once():
    records = []
    run = make_run(1.0, commit="a", time="2026-11-21T10:00:00")
    add(records, run)
    assert history.already_logged(records, run)["id"] == 1
    assert history.already_logged(records, make_run(1.0, commit="a", time="2026-11-21T11:00:00")) is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5, 0.0])
def test_a_non_ok_run_with_a_bad_val_bpb_is_refused(bad):
    run = make_run(None, "crash")
    run["summary"]["val_bpb"] = bad
    with pytest.raises(UserError, match="finite positive"):
        history.record_from_run([], run, "optimizer", "x", now=NOW)


def test_stale_temp_cleanup_spares_other_files_temps(tmp_path):
    """`experiments.json.run0.json`'s temp starts like the memory's own temps: it is not the memory's."""
    from profiling.files import is_temp_of
    path = str(tmp_path / "experiments.json")
    assert is_temp_of(path, ".experiments.json.123.ab12cd34.tmp")
    assert not is_temp_of(path, ".experiments.json.run0.json.123.ab12cd34.tmp")
    assert not is_temp_of(path, "experiments.json")
