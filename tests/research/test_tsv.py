"""results.tsv import and export: upstream's 5 columns and the 8-column variant, idempotent, round-tripping."""
import json

import pytest

from profiling import cli
from profiling.research import tsv

UPSTREAM = """commit\tval_bpb\tmemory_gb\tstatus\tdescription
a1b2c3d\t0.997900\t44.0\tkeep\tbaseline
b2c3d4e\t0.993200\t44.2\tkeep\t[optimizer] increase LR to 0.04
c3d4e5f\t1.005000\t44.0\tdiscard\t[Architecture] switch to GeLU activation
d4e5f6g\t0.000000\t0.0\tcrash\t[architecture] double model width (OOM)
e5f6g7h\t0.993200\t44.2\tdiscard\t[optimizer] increase LR to 0.04
"""
VARIANT = """iter\tcommit\tval_bpb\tbest_val_bpb\tmemory_gb\tstatus\tdescription\ttimestamp
1\ta1b2c3d\t0.997900\t0.997900\t44.0\tkeep\tbaseline\t2026-11-20T22:00:00Z
2\tb2c3d4e\t0.993200\t0.993200\t44.2\tkeep\t[optimizer] increase LR to 0.04\t2026-11-20T22:06:00Z
3\tc3d4e5f\t0.000000\t0.993200\t0.0\tcrash\t[attention] full windows\t2026-11-20T22:12:00Z
"""


@pytest.fixture(autouse=True)
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTORESEARCH_MEMORY", raising=False)
    (tmp_path / "results.tsv").write_text(UPSTREAM)
    (tmp_path / "variant.tsv").write_text(VARIANT)
    return tmp_path


def experiments(path="experiments.json"):
    with open(path, encoding="utf-8") as f:
        return json.load(f)["experiments"]


def test_parse_upstream_rows():
    rows = tsv.parse(UPSTREAM)
    assert [(r["dimension"], r["change"]) for r in rows] == [
        ("unlabeled", "baseline"), ("optimizer", "increase LR to 0.04"),
        ("architecture", "switch to GeLU activation"), ("architecture", "double model width (OOM)"),
        ("optimizer", "increase LR to 0.04")]
    assert rows[3]["val_bpb"] is None and rows[3]["memory_gb"] is None  # upstream writes a crash as zeros
    assert rows[1]["val_bpb"] == 0.9932 and rows[1]["memory_gb"] == 44.2
    assert tsv.parse(UPSTREAM.split("\n", 1)[1]) == rows  # no header: 5 columns by count


def test_parse_the_eight_column_variant():
    rows = tsv.parse(VARIANT)
    assert [r["timestamp"] for r in rows] == ["2026-11-20T22:00:00Z", "2026-11-20T22:06:00Z",
                                             "2026-11-20T22:12:00Z"]
    assert rows[2]["status"] == "crash" and rows[2]["dimension"] == "attention"
    assert tsv.parse(VARIANT.split("\n", 1)[1]) == rows  # no header: a leading number and 8 columns


def test_import_computes_baselines_and_twice_adds_nothing(capsys, workdir):
    assert cli.main(["import-tsv", "results.tsv"]) == 0
    assert "imported 5 of 5 rows" in capsys.readouterr().out
    recs = experiments()
    assert [r["status"] for r in recs] == ["keep", "keep", "discard", "crash", "discard"]
    assert [r["baseline_bpb"] for r in recs] == [None, 0.9979, 0.9932, 0.9932, 0.9932]
    assert recs[1]["improvement"] == pytest.approx(0.0047) and recs[1]["peak_vram_mb"] == 44.2 * 1024
    assert all(r["source"] == "import-tsv" and r["settings"] is None for r in recs)
    before = (workdir / "experiments.json").read_bytes()
    assert cli.main(["import-tsv", "results.tsv"]) == 0
    assert "imported 0 of 5 rows" in capsys.readouterr().out
    assert (workdir / "experiments.json").read_bytes() == before
    (workdir / "results.tsv").write_text(UPSTREAM + "f6g7h8i\t0.990000\t44.1\tkeep\t[schedule] warmdown 60%\n")
    assert cli.main(["import-tsv", "results.tsv"]) == 0
    assert "imported 1 of 6 rows" in capsys.readouterr().out
    assert experiments()[-1]["baseline_bpb"] == 0.9932  # continues from the imported history


def test_import_notes_dimensions_ucb1_ignores(capsys):
    assert cli.main(["import-tsv", "results.tsv"]) == 0
    assert "UCB1 ignores them: unlabeled" in capsys.readouterr().out


def test_round_trip_through_export(capsys, workdir):
    for name, columns in (("results.tsv", "5"), ("variant.tsv", "8")):
        memory = f"{name}.json"
        assert cli.main(["--memory", memory, "import-tsv", name]) == 0
        assert cli.main(["--memory", memory, "export-tsv", "--columns", columns, "--out", f"out-{name}"]) == 0
        original = (workdir / name).read_text()
        exported = (workdir / f"out-{name}").read_text()
        assert tsv.parse(exported) == tsv.parse(original)
        # a file exported from a memory adds nothing to it
        assert cli.main(["--memory", memory, "import-tsv", f"out-{name}"]) == 0
        assert "imported 0 of" in capsys.readouterr().out.splitlines()[-1]
    exported = (workdir / "out-results.tsv").read_text()
    assert exported.splitlines()[0] == "commit\tval_bpb\tmemory_gb\tstatus\tdescription"
    assert exported.splitlines()[3] == "c3d4e5f\t1.005000\t44.0\tdiscard\t[architecture] switch to GeLU activation"
    assert exported.splitlines()[4] == "d4e5f6g\t0.000000\t0.0\tcrash\t[architecture] double model width (OOM)"
    assert (workdir / "out-variant.tsv").read_text() == VARIANT


def test_export_to_stdout_of_logged_runs(capsys):
    assert cli.main(["import-tsv", "variant.tsv"]) == 0
    capsys.readouterr()
    assert cli.main(["export-tsv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "b2c3d4e\t0.993200\t44.2\tkeep\t[optimizer] increase LR to 0.04"


@pytest.mark.parametrize("line, message", [
    ("x\t0.99\t44\tgreat\tbad status", "line 7, status 'great': not one of keep, discard, crash, "),
    ("x\tabc\t44\tkeep\tbad number", "line 7, val_bpb 'abc': not a number"),
    ("x\tnan\t44\tkeep\tnan", "line 7, val_bpb 'nan': not a finite number >= 0"),
    ("x\t0.99\tkeep", "line 7: 3 columns, expected 5 (commit, val_bpb, memory_gb, status, description)"),
    ("x\t0.0\t44\tkeep\tzero", "line 7, val_bpb '0.0': 0 for a keep row"),
    ("x\t0.99\t-1\tkeep\tnegative", "line 7, memory_gb '-1': not a finite number >= 0"),
    ("x\t\t44\tdiscard\tno number", "line 7, val_bpb '': missing"),
])
def test_a_bad_row_exits_2_naming_the_line(line, message, capsys, workdir):
    assert cli.main(["import-tsv", "results.tsv"]) == 0
    before = (workdir / "experiments.json").read_bytes()
    (workdir / "results.tsv").write_text(UPSTREAM + line + "\n")
    assert cli.main(["import-tsv", "results.tsv"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("research: error: 1 bad row in results.tsv (nothing imported; --skip-bad imports "
                      "the other 5):")
    assert len(err) == 2 and err[1].startswith("  " + message)
    assert (workdir / "experiments.json").read_bytes() == before


def test_a_missing_file_exits_2(capsys):
    assert cli.main(["import-tsv", "nope.tsv"]) == 2
    assert "nope.tsv: cannot read it" in capsys.readouterr().err
