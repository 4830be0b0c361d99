"""`research profile TRACE [--top N] [--json] [--previous TRACE_OR_JSON]` (profiling/profile/report/cli_profile.py)."""
import argparse
import gzip
import json
import os
import subprocess
import sys

import pytest

from profiling.cli import main
from profiling.errors import UserError
from profiling.profile.report import cli_profile

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
H100 = os.path.join(DATA, "h100-compiled-gpt-5steps.trace.json.gz")
CPU = os.path.join(DATA, "cpu-tiny-mlp-3steps.trace.json.gz")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_handler(argv):
    """The subcommand on a parser of our own, as the main CLI registers it."""
    parser = argparse.ArgumentParser(prog="research")
    cli_profile.add_subparser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_handler_prints_the_report(capsys):
    assert run_handler(["profile", H100]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Profile: 88.46 ms/step\n")
    assert "## 2. Top 10 kernels per step (of 45)" in out


def test_handler_raises_user_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(UserError, match="not JSON"):
        run_handler(["profile", str(bad)])


def test_main_markdown(capsys):
    assert main(["profile", H100, "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "## 2. Top 3 kernels per step (of 45)" in out and "## 3. Checks" in out


def test_main_json(capsys):
    assert main(["profile", H100, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["steps"] == 5 and abs(s["step_ms"] - 88.5) / 88.5 < 0.02
    assert len(s["kernels"]) == s["kernels_total"] == 45
    assert {"name", "category", "ms_per_step", "calls_per_step"} <= set(s["kernels"][0])
    assert {"name", "ok", "detail"} == set(s["checks"][0])
    assert main(["profile", H100, "--json", "--top", "2"]) == 0
    assert len(json.loads(capsys.readouterr().out)["kernels"]) == 2


def test_main_cpu_trace(capsys):
    assert main(["profile", CPU]) == 0
    assert capsys.readouterr().out.startswith("CPU profile:")


def test_main_previous_summary_or_trace(tmp_path, capsys):
    assert main(["profile", H100, "--json"]) == 0
    saved = tmp_path / "summary.json"
    saved.write_text(capsys.readouterr().out)
    for previous in (str(saved), H100):
        assert main(["profile", H100, "--previous", previous]) == 0
        out = capsys.readouterr().out
        assert "## 4. Changes since the previous profile" in out
        assert "step: 88.46 -> 88.46 ms/step (+0.00 ms, +0.0%)" in out
    assert main(["profile", CPU, "--json", "--previous", str(saved)]) == 0
    changes = json.loads(capsys.readouterr().out)["changes"]
    assert any("kind differs" in note for note in changes["notes"])


@pytest.mark.parametrize("content, message", [
    (b"not json at all", "not JSON"),
    (json.dumps({"foo": 1}).encode(), "not a torch.profiler trace"),
    (json.dumps({"traceEvents": []}).encode(), "no device events and no CPU operators"),
    (gzip.compress(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 5}]}).encode()),
     "no device events and no CPU operators"),
])
def test_main_bad_input_exits_2_with_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "trace.json.gz"
    path.write_bytes(content)
    assert main(["profile", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("research: error: ") and message in captured.err
    assert captured.err.count("\n") == 1


def test_main_usage_errors_exit_2(capsys):
    assert main(["profile", H100, "--top", "0"]) == 2
    assert main(["profile", "/no/such/trace.json"]) == 2
    assert "research: error: /no/such/trace.json: cannot read" in capsys.readouterr().err


def test_subcommand_does_not_import_torch():
    code = ("import sys; from profiling.profile.report import cli_profile, summary, render; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False).returncode == 0
