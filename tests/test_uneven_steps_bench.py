"""benchmarks/findings/live/uneven_steps.py (issue #57) at its CPU size: one loop through one harness, end to
end -- the driver runs it in a fresh process, keeps its row and its profile folder (in a tar), and `report`
reads the trace again into the table."""
import json
import os
import tarfile

import pytest

from tests.scripts import load


@pytest.mark.slow
def test_eval_in_window_through_the_api_runs_and_reports(tmp_path, capsys):
    bench = load("benchmarks/findings/live/uneven_steps.py")
    out = tmp_path / "out"
    argv = ["run", str(out), "--loops", "eval_in_window", "--harnesses", "api", "--cpu-smoke"]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert "eval_in_window  api" in printed and "FAILED" not in printed, printed
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert not row.get("failed"), row
    assert (row["loop"], row["harness"], row["device"]) == ("eval_in_window", "api", "cpu")
    first, last = row["window"]
    assert last - first + 1 == 5
    assert any(first <= k <= last for k in row["evals_in_step"])  # an eval pass inside the window
    assert row["step_ms"] > 0 and row["joined"] is None  # the CPU records every operator: nothing to join
    assert isinstance(row["one_off"], list) and isinstance(row["top"], list)
    assert sorted(os.listdir(out)) == ["profiles-1.tar", "results.jsonl"]
    with tarfile.open(out / "profiles-1.tar") as tar:
        names = set(tar.getnames())
    assert {f"eval_in_window-api/{n}" for n in ("trace.json.gz", "report.md", "summary.json")} <= names

    assert bench.main(["report", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| loop | harness |") and "| eval_in_window | api | " in table
    assert "failed" not in table.split("\n")[2]
