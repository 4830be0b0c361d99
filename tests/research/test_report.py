"""profiling.research.report: the morning report's numbers against hand computations on a realistic night.

tests/data/results-history.tsv is 50 experiments in upstream's 8-column results.tsv (one agent, 2026-11-20
22:04:12 to 2026-11-21 02:39:40 UTC): the baseline and two reruns of it (dimension `baseline`), then 47
attempts over the seven DUSE dimensions: 12 kept, 25 discarded, 5 crashed, 5 stopped early.
"""
import json
import math
import os

import pytest

from profiling import cli
from profiling.research import experiments, report

HISTORY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "results-history.tsv")


@pytest.fixture
def imported(tmp_path, monkeypatch):
    """The memory `research import-tsv` makes of the history."""
    monkeypatch.delenv("AUTORESEARCH_MEMORY", raising=False)
    path = str(tmp_path / "experiments.json")
    assert cli.main(["--memory", path, "import-tsv", HISTORY]) == 0
    return experiments.load(path)


def table_rows(markdown, first_header):
    """The body rows of the Markdown table whose first header cell is `first_header`, as lists of cells."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| " + first_header + " "))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_the_numbers_equal_hand_computations(imported):
    data = report.summarize(imported)
    assert data["experiments"] == 50 and data["group"] == "imported (no settings, no dataset)"
    assert len(data["groups"]) == 1

    best = data["progress"]["best"]  # the lowest kept val_bpb: row 41
    assert (best["id"], best["val_bpb"], best["commit"]) == (41, 0.981722, "0ae479f")
    assert data["progress"]["first"]["val_bpb"] == 0.9979
    assert data["progress"]["gain"] == pytest.approx(0.997900 - 0.981722)

    o = data["outcomes"]
    assert o["status"] == {"keep": 13, "discard": 27, "crash": 5, "early_abort": 5}
    # attempts: 50 rows less the baseline and its two reruns; keeps among them: 13 less the baseline's
    assert (o["attempts"], o["attempt_keeps"], o["baseline_reruns"]) == (47, 12, 3)
    assert o["keep_rate"] == pytest.approx(12 / 47)  # 25.5%

    pace = data["pace"]
    span_s = 4 * 3600 + 35 * 60 + 28  # 22:04:12 -> 02:39:40 the next day
    assert pace["timed"] == 50 and pace["hours"] == pytest.approx(span_s / 3600)
    assert pace["per_hour"] == pytest.approx(49 / (span_s / 3600))  # 49 intervals: 10.67 per hour
    assert pace["longest_gap_minutes"] == pytest.approx((6 * 60 + 36) / 60)  # 22:31:44 -> 22:38:20
    assert pace["gap_before_id"] == 7
    assert (pace["first"], pace["last"]) == ("2026-11-20 22:04", "2026-11-21 02:39")

    # imported early aborts carry no training_seconds: counted, no time saved
    assert data["early_aborts"] == {"count": 5, "timed": 0, "saved_seconds": 0.0}


def test_per_dimension_counts(imported):
    rows = {r["dimension"]: (r["trials"], r["keeps"], r["crashes"], r["early_aborts"])
            for r in report.summarize(imported)["dimensions"]}
    assert rows == {  # counted by hand from the descriptions' [dimension] prefixes
        "optimizer": (9, 5, 2, 0),       # rows 4 12 15 19 26 31 37 44 46
        "architecture": (8, 2, 2, 0),    # rows 5 6 14 22 29 33 39 47
        "attention": (7, 2, 0, 1),       # rows 7 13 21 27 35 43 50
        "normalization": (5, 0, 1, 0),   # rows 8 18 24 32 42
        "schedule": (7, 2, 0, 0),        # rows 9 16 23 30 38 41 49
        "regularization": (6, 1, 0, 3),  # rows 10 17 25 34 40 48
        "batching": (5, 0, 0, 1),        # rows 11 20 28 36 45
        "baseline": (3, 1, 0, 0),        # rows 1 2 3
    }
    assert sum(t for t, *_ in rows.values()) == 50


def test_top_improvements_stagnation_and_noise(imported):
    data = report.summarize(imported)
    # delta against the best kept run at the time: row 7 is 0.995832 - 0.993104, and so on
    assert [(t["id"], round(t["improvement"], 6)) for t in data["top"]] == [
        (7, 0.002728), (12, 0.002316), (4, 0.002068), (29, 0.001475), (14, 0.001357)]
    periods = data["stagnation_periods"]
    assert [(p["first_id"], p["last_id"], p["count"]) for p in periods] == [(20, 28, 9), (42, 50, 9)]
    assert periods[0]["start"] == "2026-11-20 23:54" and periods[0]["hours"] == pytest.approx(
        (5 * 60 + 38 + 34 * 60 + 25) / 3600)  # 23:54:22 -> midnight -> 00:34:25
    assert data["stagnation_now"]["stagnant"] is True

    # three runs of the baseline commit a1f3c9e: 0.997900, 0.998412, 0.997655 (mean 0.997989)
    std = math.sqrt(((-0.000089) ** 2 + 0.000423 ** 2 + (-0.000334) ** 2) / 2)
    assert data["noise"]["std"] == pytest.approx(std, abs=1e-9) and data["noise"]["runs"] == 3
    assert (data["noise"]["keeps_below"], data["noise"]["keeps_with_delta"]) == (1, 12)  # row 37: 0.000331


def test_markdown_says_it(imported):
    text = report.to_markdown(report.summarize(imported), "experiments.json")
    assert text.startswith("# Research report: 50 experiments\n")
    assert "**best val_bpb: 0.981722** (experiment 41, commit `0ae479f`; schedule: warm-down 60% -> 65%)" \
        in text
    assert "**10.7 experiments per hour**: 50 time stamps from 2026-11-20 22:04 to 2026-11-21 02:39 UTC " \
           "(4.59 h, 49 intervals)" in text
    assert "keep rate: **25.5%** (12 of 47 attempts; 3 runs of the unchanged baseline not counted)" in text
    assert "early aborts: 5; device time saved: unknown" in text
    assert "noise floor: 0.000386" in text and "stagnating now: **yes**" in text
    assert "![progress](progress.png)" in text
    dims = table_rows(text, "dimension")
    assert dims[0][:6] == ["optimizer", "9", "5", "56%", "2", "0"]
    assert [r[0] for r in dims][-1] == "baseline (not listed)"
    top = table_rows(text, "rank")
    assert top[0] == ["1", "7", "attention", "window pattern SSSL -> SSLL", "0.993104", "+0.002728",
                      "+0.274%", "e3c8a55"]
    assert table_rows(text, "experiments") == [["20-28", "9", "2026-11-20 23:54", "2026-11-21 00:34", "0.67"],
                                               ["42-50", "9", "2026-11-21 01:55", "2026-11-21 02:39", "0.73"]]
    assert "Other groups" not in text


def test_plot_series(imported):
    s = report.summarize(imported)["series"]
    assert (len(s["keep"]), len(s["discard"])) == (13, 27)
    assert s["crash"] == [6, 15, 24, 33, 44] and s["early_abort"] == [10, 21, 28, 40, 48]
    assert s["best"][0] == (1, 0.9979) and s["best"][-2:] == [(41, 0.981722), (50, 0.981722)]
    assert s["stagnation"] == [(20, 28), (42, 50)]
    json.dumps(s)  # plain data


SETTINGS = {"preset": "test", "TIME_BUDGET": 60}


def record(i, status, val=None, settings=SETTINGS, dataset="builtin", **extra):
    r = dict.fromkeys(experiments.RECORD_KEYS)
    r.update(id=i, time=f"2026-11-21T0{i}:00:00Z", commit=f"c{i}", dimension="optimizer", change=f"try {i}",
             status=status, val_bpb=val, settings=settings, dataset=dataset, **extra)
    return r


def test_largest_group_early_abort_savings_and_groups_named():
    other = {"preset": "test", "TIME_BUDGET": 120}
    mem = experiments.empty_memory()
    mem["experiments"] = [
        record(1, "keep", 1.0), record(2, "early_abort", training_seconds=20.0),
        record(3, "keep", 0.99, settings=other), record(4, "early_abort", training_seconds=35.0),
        record(5, "early_abort"), record(6, "discard", 1.01),
    ]
    data = report.summarize(mem)
    assert data["outcomes"]["experiments"] == 5 and data["group"] == "dataset builtin, preset test"
    # TIME_BUDGET - training_seconds: (60 - 20) + (60 - 35); record 5 has no training_seconds
    assert data["early_aborts"] == {"count": 3, "timed": 2, "saved_seconds": 65.0}
    assert data["pace"]["per_hour"] == pytest.approx(4 / 5)  # 01:00 .. 06:00 less 03:00: 4 intervals, 5 h
    assert data["noise"] is None
    text = report.to_markdown(data, "m.json")
    assert "the largest of 2 groups, 5 experiments" in text and "## Other groups" in text
    assert "dataset builtin, preset test, TIME_BUDGET 120" in text  # the other group, named by what differs
    assert "device time saved: ~65 s (TIME_BUDGET - training_seconds, over the 2 that carry both)" in text
    assert "noise floor: unknown" in text


def test_ties_go_to_the_group_with_the_latest_experiment():
    mem = experiments.empty_memory()
    mem["experiments"] = [record(1, "keep", 1.0), record(2, "keep", 0.9, dataset="climbmix")]
    assert report.summarize(mem)["group"].startswith("dataset climbmix")


def test_no_experiments_yet():
    data = report.summarize(experiments.empty_memory())
    assert data["group"] is None and data["experiments"] == 0
    text = report.to_markdown(data, "experiments.json")
    assert text.startswith("# Research report: nothing yet") and "no experiments yet" in text
    assert report.plot_title(data) == "no experiments yet"


def test_without_time_stamps_or_keeps():
    mem = experiments.empty_memory()
    mem["experiments"] = [record(1, "crash"), record(2, "discard", 1.0)]
    mem["experiments"][0]["time"] = None
    data = report.summarize(mem)
    assert data["pace"]["per_hour"] is None and data["progress"]["best"] is None and data["top"] == []
    text = report.to_markdown(data, "m.json")
    assert "pace: unknown (1 of 2 experiments have a time stamp" in text
    assert "best val_bpb: none yet" in text and "none yet: no kept run" in text
