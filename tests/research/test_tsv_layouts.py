"""import-tsv on the layouts autoresearch forks write: headers by name, aliases, quoting, bad rows, round trip.

The rows are written here in the shapes of published histories (made-up numbers): a fork whose agent numbers
its experiments and has no commit column, one with an `experiment` id, upstream's columns reordered, and a
hand-edited file with a BOM, CRLF endings, quoted fields and unknown columns.
"""
import json

import pytest

from profiling import cli
from profiling.research import tsv

NUMBERED = (  # 7 columns, no commit; CRLF endings and a trailing blank line, as written on Windows
    "iter\tval_bpb\tbest_val_bpb\tmemory_gb\tstatus\tdescription\ttimestamp\r\n"
    "1\t0.997900\t0.997900\t44.0\tkeep\tbaseline\t2026-11-20T22:00:00Z\r\n"
    "2\t0.993200\t0.993200\t44.2\tkept\t[optimizer] increase LR to 0.04\t2026-11-20T22:06:00Z\r\n"
    "3\t0.000000\t0.993200\t0.0\tcrashed\t[attention] full windows\t2026-11-20T22:12:00Z\r\n"
    "4\t0.995100\t0.993200\t44.1\tDiscarded\t[schedule] warm-down 60%\t2026-11-20T22:18:00Z\r\n"
    "\r\n")
EXPERIMENT = """experiment\tval_bpb\tmemory_gb\tstatus\tdescription
exp01\t0.998100\t44.0\tKEEP\tbaseline
exp02\t1.001000\t44.0\tdiscard\t[architecture] GeLU
exp03\t\t\tfail\t[optimizer] lr 0.1 (NaN at step 40)
exp04\t0.000000\t0.0\tearly_abort\t[normalization] learned RMSNorm weights
"""
REORDERED = """val_bpb\tcommit\tstatus\tmemory_gb\tdescription
0.997900\ta1b2c3d\tkeep\t44.0\tbaseline
0.993200\tb2c3d4e\tkeep\t44.2\t[optimizer] increase LR to 0.04
"""
UPSTREAM = """commit\tval_bpb\tmemory_gb\tstatus\tdescription
a1b2c3d\t0.997900\t44.0\tkeep\tbaseline
b2c3d4e\t0.993200\t44.2\tkeep\t[optimizer] increase LR to 0.04
"""
HAND_EDITED = (  # BOM, aliases in any case with spaces, quoted fields (a tab inside), unknown columns
    "\ufeff Commit \t BPB\tStatus\tMem_GB\tDesc\tTime\tgpu\tnotes\n"
    "# a comment line\n"
    'a1b2c3d\t0.997900\tkeep\t44.0\tbaseline\t2026-11-20 22:00:00\tH100\t"first run, all defaults"\n'
    'b2c3d4e\t0.994000\tdiscard\t44.0\t"[optimizer] lr 0.04\t-> 0.05"\t2026-11-20T23:06:00+01:00\tH100\t\n'
    'c3d4e5f\t0.993000\tkeep\t44.3\tfused lm head\t1763676000\tH100\t"said ""ok"""\n'
    'e5f6a7b\t0.994500\tdiscard\t44.3\t"fast" path\t\tH100\t"not CSV: this line is split as written"\n'
    "d4e5f6a\t0.995000\tdiscard\t44.3\t[attention] 4 kv heads\tlast night\tH100\t\n")


@pytest.fixture(autouse=True)
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTORESEARCH_MEMORY", raising=False)
    for name, text in (("numbered.tsv", NUMBERED), ("experiment.tsv", EXPERIMENT),
                       ("reordered.tsv", REORDERED), ("upstream.tsv", UPSTREAM), ("hand.tsv", HAND_EDITED)):
        (tmp_path / name).write_bytes(text.encode("utf-8"))
    return tmp_path


def experiments(path="experiments.json"):
    with open(path, encoding="utf-8") as f:
        return json.load(f)["experiments"]


def fields(records, keys=("commit", "val_bpb", "peak_vram_mb", "status", "dimension", "change", "time")):
    return [tuple(r[k] for k in keys) for r in records]


def test_numbered_rows_without_a_commit(capsys):
    assert cli.main(["import-tsv", "numbered.tsv"]) == 0
    assert "imported 4 of 4 rows" in capsys.readouterr().out
    recs = experiments()
    assert fields(recs) == [
        (None, 0.9979, 44.0 * 1024, "keep", "unlabeled", "baseline", "2026-11-20T22:00:00Z"),
        (None, 0.9932, 44.2 * 1024, "keep", "optimizer", "increase LR to 0.04", "2026-11-20T22:06:00Z"),
        (None, None, None, "crash", "attention", "full windows", "2026-11-20T22:12:00Z"),
        (None, 0.9951, 44.1 * 1024, "discard", "schedule", "warm-down 60%", "2026-11-20T22:18:00Z")]
    assert [r["extra"] for r in recs] == [{"iter": str(i)} for i in range(1, 5)]  # best_val_bpb: recomputed
    assert [r["baseline_bpb"] for r in recs] == [None, 0.9979, 0.9932, 0.9932]
    assert cli.main(["import-tsv", "numbered.tsv"]) == 0
    assert "imported 0 of 4 rows" in capsys.readouterr().out


def test_an_experiment_id_is_kept_and_never_taken_for_a_commit():
    assert cli.main(["import-tsv", "experiment.tsv"]) == 0
    recs = experiments()
    assert [(r["commit"], r["extra"], r["status"]) for r in recs] == [
        (None, {"id": "exp01"}, "keep"), (None, {"id": "exp02"}, "discard"),
        (None, {"id": "exp03"}, "crash"), (None, {"id": "exp04"}, "early_abort")]
    assert recs[2]["val_bpb"] is None and recs[2]["peak_vram_mb"] is None  # empty cells of a crash
    assert all(r["time"] is None for r in recs)


def test_reordered_columns_read_like_upstream():
    assert tsv.parse(REORDERED) == tsv.parse(UPSTREAM)
    assert cli.main(["import-tsv", "upstream.tsv"]) == 0
    assert cli.main(["import-tsv", "reordered.tsv"]) == 0
    assert len(experiments()) == 2  # the same rows, so the second import adds nothing


def test_a_hand_edited_file_with_quotes_a_bom_and_extra_columns():
    rows = tsv.parse(HAND_EDITED)
    assert [(r["commit"], r["dimension"], r["change"]) for r in rows] == [
        ("a1b2c3d", "unlabeled", "baseline"), ("b2c3d4e", "optimizer", "lr 0.04 -> 0.05"),
        ("c3d4e5f", "unlabeled", "fused lm head"), ("e5f6a7b", "unlabeled", '"fast" path'),
        ("d4e5f6a", "attention", "4 kv heads")]
    assert [r["timestamp"] for r in rows] == [  # no zone: UTC; a zone: converted; Unix seconds; unreadable
        "2026-11-20T22:00:00Z", "2026-11-20T22:06:00Z", "2025-11-20T22:00:00Z", None, None]
    assert [r["extra"] for r in rows] == [
        {"gpu": "H100", "notes": "first run, all defaults"}, {"gpu": "H100"},
        {"gpu": "H100", "notes": 'said "ok"'},
        {"gpu": "H100", "notes": '"not CSV: this line is split as written"'},
        {"gpu": "H100", "timestamp": "last night"}]
    assert cli.main(["import-tsv", "hand.tsv"]) == 0
    recs = experiments()
    assert recs[0]["extra"] == {"gpu": "H100", "notes": "first run, all defaults"}
    assert recs[1]["time"] == "2026-11-20T22:06:00Z" and recs[4]["time"] is None


def test_a_tab_typed_into_an_unquoted_description_stays_in_it():
    text = "status\tdescription\tval_bpb\nkeep\t[optimizer] lr\t0.04\t0.99\n"
    assert tsv.parse(text)[0]["change"] == "lr 0.04" and tsv.parse(text)[0]["val_bpb"] == 0.99


def test_a_hash_column_and_headerless_files():
    assert tsv.parse("#\tbpb\tstatus\n1\t0.99\tkeep\n")[0]["extra"] == {"iter": "1"}
    headerless = UPSTREAM.split("\n", 1)[1].replace("\n", "\r\n")
    assert tsv.parse(headerless) == tsv.parse(UPSTREAM)  # upstream's 5 columns, as before


BAD = """commit\tval_bpb\tmemory_gb\tstatus\tdescription
a1b2c3d\t0.997900\t44.0\tkeep\tbaseline
b2c3d4e\tabc\t44.2\tkeep\t[optimizer] lr 0.04
c3d4e5f\t0.993000\t44.2\tmaybe\t[optimizer] lr 0.05
d4e5f6a\t0.992000\t44.2\tkeep\t[schedule] warm-down 60%
e5f6a7b\t0.991000\tkeep
"""
BAD_LINES = [
    "  line 3, val_bpb 'abc': not a number",
    ("  line 4, status 'maybe': not one of keep, discard, crash, early_abort "
     "(or kept, discarded, crashed, fail)"),
    "  line 6: 3 columns, expected 5 (commit, val_bpb, memory_gb, status, description)"]


@pytest.mark.parametrize("memory_exists", [False, True])
def test_every_bad_row_is_listed_and_nothing_is_imported(memory_exists, capsys, workdir):
    if memory_exists:
        assert cli.main(["import-tsv", "upstream.tsv"]) == 0
        capsys.readouterr()
    before = (workdir / "experiments.json").read_bytes() if memory_exists else None
    (workdir / "bad.tsv").write_text(BAD)
    assert cli.main(["import-tsv", "bad.tsv"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "research: error: 3 bad rows in bad.tsv (nothing imported; --skip-bad imports the other 2):",
        *BAD_LINES]
    if memory_exists:
        assert (workdir / "experiments.json").read_bytes() == before
    else:
        assert not (workdir / "experiments.json").exists()


def test_skip_bad_imports_the_good_rows_and_lists_the_rest(capsys, workdir):
    (workdir / "bad.tsv").write_text(BAD)
    assert cli.main(["import-tsv", "bad.tsv", "--skip-bad"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("imported 2 of 5 rows from bad.tsv")
    assert lines[0].endswith("(0 already there, 3 bad skipped)")
    assert lines[1:4] == ["skipped (not imported):", *BAD_LINES[:2]] and lines[4] == BAD_LINES[2]
    assert [r["commit"] for r in experiments()] == ["a1b2c3d", "d4e5f6a"]
    assert cli.main(["import-tsv", "bad.tsv", "--skip-bad"]) == 0
    assert "imported 0 of 5 rows" in capsys.readouterr().out


@pytest.mark.parametrize("header, message", [
    ("commit\tbpb\tresult\tdescription",
     "line 1: read as a header (it holds no number), but it names no status column"),
    ("run\tscore",
     "names no val_bpb and no status column (it names 'run', 'score'); accepted names: val_bpb: val_bpb or bpb"),
    ("val_bpb\tstatus\tdesc\tchange", "columns 3 and 4 ('desc' and 'change') are both description"),
])
def test_a_header_without_what_is_needed_exits_2_with_one_line(header, message, capsys, workdir):
    (workdir / "odd.tsv").write_text(header + "\nx\t0.99\tkeep\tfine\n")
    assert cli.main(["import-tsv", "odd.tsv"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("research: error: odd.tsv: ") and message in err[0]
    assert not (workdir / "experiments.json").exists()


@pytest.mark.parametrize("columns", ["5", "8"])
def test_export_then_import_into_an_empty_memory_gives_the_same_records(columns, capsys):
    for name in ("numbered.tsv", "experiment.tsv", "upstream.tsv", "hand.tsv"):
        assert cli.main(["--memory", "source.json", "import-tsv", name]) == 0
    assert cli.main(["--memory", "source.json", "export-tsv", "--columns", columns, "--out", "out.tsv"]) == 0
    assert cli.main(["--memory", "copy.json", "import-tsv", "out.tsv"]) == 0
    keys = ("commit", "val_bpb", "peak_vram_mb", "status", "dimension", "change", "baseline_bpb", "improvement",
            *(("time",) if columns == "8" else ()))
    source, copy = experiments("source.json"), experiments("copy.json")
    assert len(source) == 14  # 4 + 4 + 2 + 5 rows, less hand.tsv's first: upstream.tsv's first row
    assert fields(copy, keys) == fields(source, keys)
    assert cli.main(["--memory", "source.json", "import-tsv", "out.tsv"]) == 0  # an export adds nothing back
    assert "imported 0 of 14 rows" in capsys.readouterr().out.splitlines()[-1]


def test_import_help_names_the_layouts_and_skip_bad(capsys):
    assert cli.main(["import-tsv", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--skip-bad" in text and "val_bpb and status are required" in text and "8-column variant" in text


def test_an_id_column_holding_commits_gives_the_commit():
    from profiling.research import tsv
    rows = tsv.parse("experiment\tval_bpb\tstatus\tdescription\n5c1d0a2\t1.8\tkeep\tbaseline\nexp7\t1.9\tdiscard\tx\n",
                     "f.tsv")
    assert [r["commit"] for r in rows] == ["5c1d0a2", None]
