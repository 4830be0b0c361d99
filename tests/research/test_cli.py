"""`research` commands through main([...]): log, next, show, rescue, dimension, and bad input."""
import json
import math

import pytest

from profiling import cli, runfile

SETTINGS = {"preset": "test", "MAX_SEQ_LEN": 256, "TIME_BUDGET": 60, "EVAL_TOKENS": 4096, "VOCAB_SIZE": 512}
COUNTER = iter(range(10 ** 6))


@pytest.fixture(autouse=True)
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTORESEARCH_MEMORY", raising=False)
    return tmp_path


def write_run(val=1.0, status="ok", commit=None, path="run.json", **summary):
    values = dict.fromkeys(runfile.SUMMARY_FIELDS)
    values.update(val_bpb=val, training_seconds=55.0, peak_vram_mb=2048.0, mfu_percent=1.5, num_steps=10)
    values.update(summary)
    n = next(COUNTER)
    run = runfile.make_run(status, values, SETTINGS, "builtin", commit=commit or f"c{n}", time=f"t{n}",
                           loss_curve={"fractions": [0.5, 1.0], "loss": [3.0, 2.5]})
    runfile.write_run(path, run)


def log(capsys, val=1.0, dimension="optimizer", *extra, status="ok", commit=None):
    write_run(val, status, commit)
    code = cli.main(["log", "--dimension", dimension, "--change", f"try {val}", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def records():
    with open("experiments.json", encoding="utf-8") as f:
        return json.load(f)["experiments"]


def test_log_decides_the_status_and_says_what_to_do(capsys):
    code, out, _ = log(capsys, 1.0, "baseline")
    assert code == 0 and "status: keep" in out and "it is the baseline" in out
    code, out, _ = log(capsys, 0.99)
    assert "status: keep" in out and "improvement: +0.010000 (+1.000%)" in out and "the branch advances" in out
    code, out, _ = log(capsys, 0.995, "attention")
    assert "status: discard" in out and "git reset --keep HEAD~1" in out and "baseline_bpb: 0.990000" in out
    code, out, _ = log(capsys, None, "schedule", status="fail")
    assert "status: crash (the run ended with status fail)" in out
    code, out, _ = log(capsys, None, "schedule", status="early_abort")
    assert "status: early_abort" in out
    code, out, _ = log(capsys, 0.999, "schedule", "--status", "keep", "--rationale", "simpler")
    assert "status: keep (set by --status)" in out and "the baseline stays 0.990000" in out
    recs = records()
    assert [r["id"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert [r["status"] for r in recs] == ["keep", "keep", "discard", "crash", "early_abort", "keep"]
    assert recs[1]["improvement"] == pytest.approx(0.01) and recs[1]["baseline_id"] == 1
    assert recs[1]["peak_vram_mb"] == 2048.0 and recs[1]["mfu_percent"] == 1.5 and recs[1]["num_steps"] == 10
    assert recs[1]["settings"] == SETTINGS and recs[1]["dataset"] == "builtin"
    assert recs[5]["rationale"] == "simpler" and recs[3]["run_status"] == "fail"


def test_log_marks_an_improvement_within_noise(capsys):
    log(capsys, 1.000, "baseline", commit="base")
    log(capsys, 1.004, "baseline", commit="base")  # a rerun: std 0.002828
    _, out, _ = log(capsys, 0.999)
    assert "within noise: yes" in out and "rerun it to confirm" in out
    _, out, _ = log(capsys, 0.99)
    assert "within noise: no" in out
    assert [r["within_noise"] for r in records()] == [None, None, True, False]
    cli.main(["show"])
    assert "noise floor: 0.002828 (std of val_bpb over 2 repeated runs of 1 commit" in capsys.readouterr().out


def test_log_json_prints_the_record(capsys):
    write_run(1.0)
    assert cli.main(["log", "--dimension", "optimizer", "--change", "x", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["id"] == 1 and record["val_bpb"] == 1.0


def test_memory_path_from_option_either_side_or_environment(capsys, workdir, monkeypatch):
    write_run(1.0)
    assert cli.main(["--memory", "a.json", "log", "--dimension", "optimizer", "--change", "x"]) == 0
    write_run(1.0)
    assert cli.main(["log", "--memory", "b.json", "--dimension", "optimizer", "--change", "x"]) == 0
    monkeypatch.setenv("AUTORESEARCH_MEMORY", str(workdir / "c.json"))
    write_run(1.0)
    assert cli.main(["log", "--dimension", "optimizer", "--change", "x"]) == 0
    assert sorted(p.name for p in workdir.glob("*.json")) == ["a.json", "b.json", "c.json", "run.json"]


def row(out, first):
    """The cells of the Markdown table row that starts with `first`."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("|") and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{out}")


def err_line(err):
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("research: error: "), err
    return lines[0]


def raw_run(text):
    with open("run.json", "w", encoding="utf-8") as f:
        f.write(text)


def run_with(**changes):
    write_run(1.0)
    with open("run.json", encoding="utf-8") as f:
        run = json.load(f)
    for key, value in changes.items():
        if key == "val_bpb":
            run["summary"]["val_bpb"] = value
        else:
            run[key] = value
    raw_run(json.dumps(run))  # json.dumps writes NaN and Infinity as JavaScript does


BAD_INPUT = {
    "unknown dimension": (lambda: write_run(1.0), ["--dimension", "vibes"], "unknown dimension 'vibes'; valid: "),
    "NaN val_bpb": (lambda: run_with(val_bpb=math.nan), [], "val_bpb is nan"),
    "inf val_bpb": (lambda: run_with(val_bpb=math.inf), [], "val_bpb is inf"),
    "negative val_bpb": (lambda: run_with(val_bpb=-1.0), [], "val_bpb is -1.0"),
    "NaN val_bpb of a crash": (lambda: run_with(val_bpb=math.nan, status="crash"), [], "finite positive"),
    "NaN in a kept loss curve": (lambda: run_with(val_bpb=0.5, loss_curve={"fractions": [1], "loss": [math.nan]}),
                                 [], "loss_curve holds NaN or infinity"),
    "missing run.json": (lambda: None, [], "run.json: no such run file"),
    "malformed run.json": (lambda: raw_run('{"status": "ok", '), [], "run.json: not valid JSON"),
    "run.json missing a key": (lambda: raw_run('{"status": "ok"}'), [], "not a valid run.json"),
    "run.json not an object": (lambda: raw_run("[1, 2]"), [], "not a valid run.json"),
    "empty change": (lambda: write_run(1.0), ["--change", " "], "--change is empty"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_exits_2_with_one_line_and_leaves_the_memory_alone(case, capsys, workdir):
    write_run(1.0)
    cli.main(["log", "--dimension", "optimizer", "--change", "first"])
    before = (workdir / "experiments.json").read_bytes()
    (workdir / "run.json").unlink()
    prepare, args, message = BAD_INPUT[case]
    prepare()
    capsys.readouterr()
    argv = ["log", "--dimension", "optimizer", "--change", "x"] + args
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    assert message in err_line(out.err) and out.out == ""
    assert (workdir / "experiments.json").read_bytes() == before


CORRUPT = {
    "truncated": lambda text: text[: len(text) // 2],
    "not JSON": lambda text: "hello",
    "not UTF-8": lambda text: b"\xff\xfe{}",
    "duplicate ids": lambda text: text.replace('"id": 2', '"id": 1'),
    "NaN val_bpb": lambda text: text.replace('"val_bpb": 0.99', '"val_bpb": NaN'),
    "no experiments key": lambda text: text.replace('"experiments"', '"experiment"'),
}


@pytest.mark.parametrize("case", list(CORRUPT))
@pytest.mark.parametrize("command", [["log", "--dimension", "optimizer", "--change", "x"], ["next"], ["show"],
                                     ["rescue", "add", "--dimension", "optimizer", "--mechanism", "m",
                                      "--reuse-signal", "s"], ["dimension", "add", "data"]])
def test_a_corrupt_memory_exits_2_and_is_never_overwritten(case, command, capsys, workdir):
    log(capsys, 1.0)
    log(capsys, 0.99)
    path = workdir / "experiments.json"
    corrupt = CORRUPT[case](path.read_text())
    path.write_bytes(corrupt if isinstance(corrupt, bytes) else corrupt.encode())
    before = path.read_bytes()
    write_run(0.98)
    assert cli.main(command) == 2
    out = capsys.readouterr()
    line = err_line(out.err)
    assert "experiments.json: " in line and ("git checkout" in line or "restore" in line)
    assert path.read_bytes() == before


def test_a_run_is_not_logged_twice(capsys, workdir):
    write_run(1.0)
    assert cli.main(["log", "--dimension", "optimizer", "--change", "x"]) == 0
    before = (workdir / "experiments.json").read_bytes()
    assert cli.main(["log", "--dimension", "optimizer", "--change", "x"]) == 2
    assert "is already experiment 1" in err_line(capsys.readouterr().err)
    assert (workdir / "experiments.json").read_bytes() == before


def test_next_prints_every_dimension_the_choice_and_why(capsys):
    log(capsys, 1.0, "baseline")
    for dim in ["optimizer", "architecture", "attention", "normalization", "schedule", "regularization"]:
        log(capsys, 0.999 if dim == "attention" else 1.01, dim)
    assert cli.main(["next"]) == 0
    out = capsys.readouterr().out
    assert row(out, "dimension") == ["dimension", "trials", "keeps", "mean reward", "bonus", "score"]
    assert row(out, "batching") == ["batching", "0", "0", "-", "-", "untried (+inf)"]
    assert "choice: batching" in out and "why: untried" in out and "reward: relative improvement" in out
    log(capsys, 1.02, "batching")
    assert cli.main(["next", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["choice"] == "attention" and data["total_trials"] == 7
    rows = {r["dimension"]: r for r in data["dimensions"]}
    assert rows["attention"]["mean_reward"] == pytest.approx(0.1)  # 0.1% better / 1% scale
    assert rows["attention"]["score"] == pytest.approx(0.1 + math.sqrt(2 * math.log(7)))
    assert data["stagnation"]["stagnant"] is False


def test_next_shows_rescue_entries_and_stagnation(capsys):
    log(capsys, 1.0)
    for _ in range(8):
        log(capsys, 1.01, "optimizer")
    assert cli.main(["rescue", "add", "--from", "3", "--mechanism", "warmup of the Muon momentum",
                     "--reuse-signal", "when the optimizer comes up"]) == 0
    assert "added rescue entry 1 for optimizer" in capsys.readouterr().out
    assert cli.main(["next", "--reward-scale", "0.5"]) == 0  # only optimizer tried: choice is architecture
    out = capsys.readouterr().out
    assert "stagnation: YES (none of the last 8 experiments was kept)" in out
    assert "rescue pool for architecture: 0 entries" in out
    for dim in ["architecture", "attention", "normalization", "schedule", "regularization", "batching"]:
        log(capsys, 1.0 - 0.05 * (dim == "attention") - 0.001, dim)
    assert cli.main(["next", "--c", "0"]) == 0  # no exploration: the best mean reward wins
    out = capsys.readouterr().out
    assert "choice: attention" in out and "stagnation: no" in out
    assert cli.main(["next", "--c", "0.01"]) == 0
    assert cli.main(["rescue", "add", "--dimension", "attention", "--mechanism", "shorter windows",
                     "--reuse-signal", "long contexts"]) == 0
    capsys.readouterr()
    assert cli.main(["next", "--c", "0"]) == 0
    out = capsys.readouterr().out
    assert "rescue pool for attention: 1 entries" in out
    assert row(out, "2") == ["2", "-", "attention", "shorter windows", "long contexts"]


def test_rescue_list_and_errors(capsys):
    log(capsys, 1.0)
    assert cli.main(["rescue", "list"]) == 0
    assert "rescue pool: empty" in capsys.readouterr().out
    assert cli.main(["rescue", "add", "--from", "9", "--mechanism", "m", "--reuse-signal", "s"]) == 2
    assert "--from 9: no experiment has that id" in err_line(capsys.readouterr().err)
    assert cli.main(["rescue", "add", "--mechanism", "m", "--reuse-signal", "s"]) == 2
    capsys.readouterr()
    assert cli.main(["rescue", "add", "--from", "1", "--mechanism", "m", "--reuse-signal", "s"]) == 0
    assert cli.main(["rescue", "list", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert entries == [{"id": 1, "time": entries[0]["time"], "from_experiment": 1, "dimension": "optimizer",
                        "mechanism": "m", "reuse_signal": "s"}]
    assert cli.main(["rescue", "list", "--dimension", "attention"]) == 0
    assert "empty for attention" in capsys.readouterr().out


def test_show_lists_experiments_dimensions_and_early_aborts(capsys):
    log(capsys, 1.0)
    log(capsys, 0.98, "attention")
    log(capsys, None, "schedule", status="early_abort")
    write_run(None, "early_abort", training_seconds=20.0)
    cli.main(["log", "--dimension", "schedule", "--change", "a | b"])
    assert cli.main(["show"]) == 0
    out = capsys.readouterr().out
    assert row(out, "2") == ["2", "attention", "try 0.98", "0.980000", "+0.020000", "keep"]
    assert "a \\| b" in out  # pipes escaped in table cells
    assert "best: 0.980000 (experiment 2, commit" in out
    assert row(out, "schedule") == ["schedule", "2", "0", "-", "0.0000"]
    assert "early aborts: 2, device time saved ~45 s" in out  # (60 - 55) + (60 - 20)
    assert cli.main(["show", "--last", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["count"] == 4 and [r["id"] for r in data["experiments"]] == [4]
    assert data["early_aborts"] == {"count": 2, "timed": 2, "saved_seconds": 45.0}
    assert cli.main(["show", "--last", "2"]) == 0
    assert "(showing the last 2; --last 0 for all)" in capsys.readouterr().out


def test_dimension_add(capsys):
    assert cli.main(["dimension", "add", "data"]) == 0
    assert "dimensions: optimizer, architecture, attention, normalization, schedule, regularization, " \
           "batching, data" in capsys.readouterr().out
    assert log(capsys, 1.0, "data")[0] == 0
    assert cli.main(["dimension", "add", "data"]) == 2
    assert "already listed" in err_line(capsys.readouterr().err)
    assert cli.main(["dimension", "add", "baseline"]) == 2
    assert cli.main(["dimension", "add", "Bad Name"]) == 2


def test_usage_errors_and_help(capsys):
    assert cli.main(["--help"]) == 0
    assert "log" in capsys.readouterr().out
    assert cli.main([]) == 2
    assert cli.main(["log", "--change", "x"]) == 2  # --dimension is required
    assert cli.main(["log", "--dimension", "optimizer", "--change", "x", "--status", "great"]) == 2
    assert cli.main(["next", "--reward-scale", "0"]) == 2


def test_only_the_named_command_loads_other_modules():
    assert cli._command(["--memory", "profile", "next"]) == "next"
    assert cli._command(["profile", "t.json"]) == "profile"
    assert cli._command(["--help"]) is None


@pytest.mark.parametrize("rows, headers", [
    ([["optimizer", 3, 1, "0.1000", "1.2345", "1.3345"], ["regularization", 0, 0, "-", "-", "untried (+inf)"]],
     ["dimension", "trials", "keeps", "mean reward", "bonus", "score"]),
    ([[12345, "a \\| b", "x" * 79 + "…"]], ["id", "change", "c"]),
    ([], ["id", "dimension"]),
])
def test_tables_are_what_tabulate_github_renders(rows, headers):
    from tabulate import tabulate

    from profiling.research import render

    expected = tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)
    assert render.table(rows, headers) == expected
