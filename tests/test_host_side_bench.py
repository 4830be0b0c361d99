"""benchmarks/findings/live/host_side.py (issue #48) at its tiny size on the CPU: the driver runs each variant
in a fresh process and writes OUT/host_side.json with every step's timing, and the profiled variants' traces
beside it, which `research profile` reads again. A DataLoader with workers, and a compiled model profiled
while it compiles."""
import gzip
import json
import re
import os

import pytest

from profiling import cli
from tests.scripts import load


@pytest.mark.slow
@pytest.mark.heavy
def test_driver_times_and_profiles_each_variant(tmp_path, capsys):
    host_side = load("benchmarks/findings/live/host_side.py")
    out = tmp_path / "out"
    runs = [("resnet18_pydecode", "workers_2"), ("compile_in_window", "warm"),
            ("compile_in_window", "in_window")]
    rc = host_side.main([str(out), "--cases", "resnet18_pydecode", "compile_in_window", "--variants",
                         *{v for _, v in runs}, "--size", "tiny", "--device", "cpu", "--reps", "1",
                         "--warmup", "1", "--timed", "2", "--work", str(tmp_path / "work")])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    result = json.loads((out / "host_side.json").read_text())
    assert result["device"] == "cpu" and result["torch"] and result["date"] and not result["skipped"]
    assert sorted(os.listdir(out)) == sorted(["host_side.json"] + [f"{c}-{v}.trace.json.gz" for c, v in runs])
    for case, variant in runs:
        part = result["cases"][case][variant]
        assert f"{case} {variant}: " in printed
        timing = part["timing"]
        assert len(timing["reps_ms_per_step"]) == 1 and len(timing["ms_each"][0]) == 2
        assert all(ms > 0 for ms in timing["warmup_ms_each"] + timing["ms_each"][0])
        assert part["ms_per_step_median"] == timing["reps_ms_per_step"][0] and part["samples_per_s"] > 0
        assert part["profile"]["traces"] == [f"{case}-{variant}.trace.json.gz"] and part["profile"]["report"]
    assert result["cases"]["resnet18_pydecode"]["workers_2"]["info"]["loader"]["num_workers"] == 2

    # warm compiles in the Profiler's warm-up; in_window in its first profiled step, against warm's step time
    warm, in_window = (result["cases"]["compile_in_window"][v]["profile"] for v in ("warm", "in_window"))
    assert in_window["options"]["warmup_steps"] == in_window["options"]["profiler_warmup_steps"] == 0
    assert in_window["unprofiled_step_ms"] == pytest.approx(
        result["cases"]["compile_in_window"]["warm"]["ms_per_step_median"], rel=1e-3)
    for profile, compiles in ((warm, False), (in_window, True)):
        with gzip.open(out / profile["traces"][0]) as f:
            names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
        assert any("_compile.compile_inner" in n for n in names) == compiles
    assert cli.main(["profile", str(out / in_window["traces"][0])]) == 0
    assert re.search(r"\b[1-5] steps? profiled", capsys.readouterr().out)  # a noisy CPU step may be a one-off
