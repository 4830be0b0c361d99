"""`research report [--out DIR]` (profiling/research/cli_report.py): the files it writes, the PNG, bad input, and that
no other command pays for matplotlib."""
import os
import struct
import subprocess
import sys

import pytest

from profiling import cli
from profiling.research import experiments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HISTORY = os.path.join(ROOT, "tests", "data", "results-history.tsv")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTORESEARCH_MEMORY", raising=False)
    return tmp_path


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_report_writes_both_files_into_a_new_directory(workdir, capsys):
    assert cli.main(["import-tsv", HISTORY]) == 0
    capsys.readouterr()
    assert cli.main(["report", "--out", "morning/2026-11-21"]) == 0  # two levels, created
    out = capsys.readouterr().out
    out_dir = os.path.join("morning", "2026-11-21")
    md, png = os.path.join(out_dir, "report.md"), os.path.join(out_dir, "progress.png")
    assert f"wrote {md} (50 experiments)" in out and f"wrote {png} (1200x600 px)" in out
    assert png_size(png) == (1200, 600)
    with open(md, encoding="utf-8") as f:
        text = f.read()
    assert "**best val_bpb: 0.981722** (experiment 41, commit `0ae479f`" in text
    assert sorted(os.listdir(out_dir)) == ["progress.png", "report.md"]  # no temp files left

    # default --out: the current directory; --memory after the subcommand; a second run replaces the files
    os.rename("experiments.json", "night.json")
    assert cli.main(["report", "--memory", "night.json"]) == 0
    assert png_size("progress.png") == (1200, 600) and os.path.exists("report.md")


def test_empty_memory_reports_nothing_yet(workdir, capsys):
    experiments.atomic_write("experiments.json", experiments.dumps(experiments.empty_memory()))
    assert cli.main(["report"]) == 0
    with open("report.md", encoding="utf-8") as f:
        assert f.read().startswith("# Research report: nothing yet")
    assert png_size("progress.png") == (1200, 600)


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 1}', b"\xff\xfe"])
def test_unreadable_memory_exits_2_and_writes_nothing(workdir, capsys, content):
    (workdir / "experiments.json").write_bytes(content)
    assert cli.main(["report", "--out", "out"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("research: error: experiments.json:") and err.count("\n") == 1
    assert not os.path.exists("out") and (workdir / "experiments.json").read_bytes() == content


def test_missing_memory_or_bad_out_exit_2(workdir, capsys):
    assert cli.main(["report"]) == 2
    assert "no such memory file" in capsys.readouterr().err and not os.path.exists("report.md")
    assert cli.main(["import-tsv", HISTORY]) == 0
    (workdir / "a-file").write_text("x")
    assert cli.main(["report", "--out", "a-file"]) == 2
    assert "research: error: --out a-file: cannot create the directory" in capsys.readouterr().err
    os.mkdir("memdir")
    assert cli.main(["--memory", "memdir", "report"]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_help_lists_report(capsys):
    assert cli.main(["--help"]) == 0
    assert "report" in capsys.readouterr().out
    assert cli.main(["report", "--help"]) == 0
    assert "--out DIR" in capsys.readouterr().out


def test_only_report_imports_matplotlib(workdir):
    code = ("import sys; from profiling import cli; cli.main(sys.argv[1:]); "
            "names = ('matplotlib', 'profiling.research.plot', 'profiling.research.cli_report'); "
            "bad = [m for m in names if m in sys.modules]; "
            "print(' '.join(bad))")

    def loaded(*argv):
        result = subprocess.run([sys.executable, "-c", code, *argv], cwd=workdir, capture_output=True,
                                text=True, env={**os.environ, "PYTHONPATH": ROOT}, check=False)
        return result.stdout.split("\n")[-2].split()

    assert loaded("next") == [] and loaded("show") == []
    assert loaded("--help") == ["profiling.research.cli_report"]  # listed in the help, without matplotlib
    assert loaded("profile", "--help") == []


def test_far_discards_do_not_squash_the_plot():
    from profiling.research import plot

    series = {"keep": [(1, 1.0), (3, 0.99)], "discard": [(2, 1.004), (4, 1.5)], "crash": [5], "early_abort": [],
              "best": [(1, 1.0), (3, 0.99), (5, 0.99)], "stagnation": []}
    low, high = plot._limits(series)
    assert low < 0.99 and 1.004 < high < 1.5  # 1.5 is drawn as a triangle on the top edge
    png = plot.png_bytes(series, "t", [(3, 0.99, "#3 a change")])
    assert png[:8] == PNG_MAGIC and struct.unpack(">II", png[16:24]) == (1200, 600)
