"""UCB1 selection: hand-computed scores, reward scaling, tie rules, and the stagnation flag."""
import math

import pytest

from profiling.research import history, ucb1

DIMS = ["optimizer", "attention", "schedule"]


def rec(dimension, status="discard", improvement=None, baseline=1.0, id_=0):
    return {"id": id_, "dimension": dimension, "status": status, "improvement": improvement,
            "baseline_bpb": baseline, "val_bpb": None if improvement is None else baseline - improvement}


def numbered(records):
    for i, r in enumerate(records, 1):
        r["id"] = i
    return records


def test_reward_is_relative_improvement_over_the_scale_clipped_to_one():
    assert ucb1.reward(rec("optimizer", "keep", 0.003)) == pytest.approx(0.3)      # 0.3% of 1.0
    assert ucb1.reward(rec("optimizer", "keep", 0.005, baseline=0.5)) == 1.0        # 1% -> full reward
    assert ucb1.reward(rec("optimizer", "keep", 0.05)) == 1.0                       # 5% clipped
    assert ucb1.reward(rec("optimizer", "keep", -0.001)) == 0.0                     # kept by --status, worse
    assert ucb1.reward(rec("optimizer", "keep", None)) == 0.0                       # the first run: no baseline
    assert ucb1.reward(rec("optimizer", "discard", -0.002)) == 0.0
    assert ucb1.reward(rec("optimizer", "crash")) == 0.0
    assert ucb1.reward(rec("optimizer", "keep", 0.003), scale=0.006) == pytest.approx(0.5)


def test_scores_match_a_hand_computation():
    records = [rec("optimizer", "keep", 0.003), rec("optimizer"), rec("attention", "keep", 0.006),
               rec("schedule"), rec("schedule", "crash"), rec("schedule", "early_abort")]
    rows = {r["dimension"]: r for r in ucb1.scores(records, DIMS)}
    # N = 6, c = sqrt(2): bonus = sqrt(2 ln 6 / n); ln 6 = 1.791759
    #   optimizer: mean (0.3 + 0) / 2 = 0.15, bonus sqrt(3.583519 / 2) = 1.338566 -> 1.488566
    #   attention: mean 0.6,                   bonus sqrt(3.583519 / 1) = 1.893019 -> 2.493019
    #   schedule:  mean 0,                     bonus sqrt(3.583519 / 3) = 1.092935 -> 1.092935
    assert rows["optimizer"]["mean_reward"] == pytest.approx(0.15)
    assert rows["optimizer"]["bonus"] == pytest.approx(1.338566, abs=1e-6)
    assert rows["optimizer"]["score"] == pytest.approx(1.488566, abs=1e-6)
    assert rows["attention"]["score"] == pytest.approx(2.493019, abs=1e-6)
    assert rows["schedule"]["score"] == pytest.approx(1.092935, abs=1e-6)
    assert [rows[d]["trials"] for d in DIMS] == [2, 1, 3]
    assert [rows[d]["keeps"] for d in DIMS] == [1, 1, 0]
    assert all(r["total_trials"] == 6 for r in rows.values())
    sel = ucb1.select(records, DIMS)
    assert sel["choice"] == "attention"
    assert "2.4930" in sel["reason"] and "0.6000" in sel["reason"] and "1.8930" in sel["reason"]


def test_c_scales_the_bonus():
    records = [rec("optimizer", "keep", 0.003), rec("attention")]
    rows = ucb1.scores(records, DIMS[:2], c=1.0)
    assert rows[0]["bonus"] == pytest.approx(math.sqrt(math.log(2)))
    assert rows[0]["score"] == pytest.approx(0.3 + math.sqrt(math.log(2)))


def test_exploitation_matters():
    # Equally tried: the dimension with kept improvements outranks the one without.
    equal = [rec("optimizer", "keep", 0.004), rec("optimizer"), rec("attention"), rec("attention")]
    rows = {r["dimension"]: r for r in ucb1.scores(equal, DIMS[:2])}
    assert rows["optimizer"]["score"] > rows["attention"]["score"]
    assert ucb1.select(equal, DIMS[:2])["choice"] == "optimizer"

    # More tried and successful vs less tried and fruitless: scaled rewards pick the successful one,
    # where DUSE's raw bpb deltas (~0.01) would let the exploration bonus decide.
    records = [rec("optimizer", "keep", 0.01)] * 3 + [rec("optimizer")] + [rec("attention")] * 3
    rows = {r["dimension"]: r for r in ucb1.scores(records, DIMS[:2])}
    # N = 7: optimizer 0.75 + sqrt(3.891820 / 4) = 1.736385; attention 0 + sqrt(3.891820 / 3) = 1.138979 (ln 7 = 1.945910)
    assert rows["optimizer"]["score"] == pytest.approx(1.736385, abs=1e-6)
    assert rows["attention"]["score"] == pytest.approx(1.138979, abs=1e-6)
    assert ucb1.select(records, DIMS[:2])["choice"] == "optimizer"
    raw_optimizer = 3 * 0.01 / 4 + rows["optimizer"]["bonus"]
    assert raw_optimizer < rows["attention"]["score"]  # the raw formula would have chosen attention


def test_untried_dimensions_come_first_in_file_order():
    records = [rec("optimizer", "keep", 0.01)] * 5
    sel = ucb1.select(records, ["optimizer", "schedule", "attention"])
    assert sel["choice"] == "schedule"
    assert "untried" in sel["reason"]
    rows = {r["dimension"]: r for r in sel["rows"]}
    assert rows["attention"]["score"] == math.inf and rows["attention"]["bonus"] is None
    assert ucb1.select([], DIMS)["choice"] == "optimizer"


def test_ties_go_to_fewer_trials_then_file_order():
    records = [rec("attention"), rec("schedule")]
    sel = ucb1.select(records, ["schedule", "attention"])
    assert sel["choice"] == "schedule"  # identical scores and trials: listed first
    assert "tied with attention" in sel["reason"]
    rows = [{"dimension": "a", "trials": 3, "score": 1.0, "mean_reward": 0.0, "bonus": 1.0, "total_trials": 5},
            {"dimension": "b", "trials": 2, "score": 1.0 + 1e-13, "mean_reward": 0.0, "bonus": 1.0,
             "total_trials": 5}]
    assert ucb1.choose(rows)[0]["dimension"] == "b"  # equal within 1e-12: fewer trials wins


def test_records_outside_the_listed_dimensions_are_not_trials():
    records = [rec("baseline", "keep", None), rec("unlabeled"), rec("optimizer", "keep", 0.002)]
    rows = ucb1.scores(records, ["optimizer"])
    assert rows[0]["trials"] == 1 and rows[0]["total_trials"] == 1
    stats = ucb1.dimension_stats(records, ["optimizer"])
    assert [(s["dimension"], s["listed"], s["trials"]) for s in stats] == [
        ("optimizer", True, 1), ("baseline", False, 1), ("unlabeled", False, 1)]


def test_selection_is_deterministic():
    records = [rec(d, s, i) for d, s, i in [("optimizer", "keep", 0.002), ("attention", "discard", -0.001),
                                            ("schedule", "keep", 0.004), ("attention", "crash", None)]]
    assert ucb1.select(records, DIMS) == ucb1.select(list(records), list(DIMS))


def test_stagnation_after_eight_not_kept():
    records = numbered([rec("optimizer", "keep", 0.01)] + [rec("attention")] * 7)
    assert not history.stagnation(records)["stagnant"]
    records = numbered([rec("optimizer", "keep", 0.01)] + [dict(rec("attention")) for _ in range(8)])
    flag = history.stagnation(records)
    assert flag["stagnant"] and "8" in flag["reason"]
    # reruns of the baseline are not attempts
    records = numbered([rec("optimizer", "keep", 0.01)] + [dict(rec("attention")) for _ in range(7)]
                       + [rec("baseline")])
    assert not history.stagnation(records)["stagnant"]


def test_stagnation_when_the_last_five_keeps_are_tiny():
    tiny = [dict(rec("optimizer", "keep", 0.0009)) for _ in range(5)]  # 0.09% each
    assert history.stagnation(numbered(tiny))["stagnant"]
    mixed = tiny[:4] + [rec("optimizer", "keep", 0.001)]  # one of 0.1%: not stagnant
    assert not history.stagnation(numbered(mixed))["stagnant"]
    assert "too few" in history.stagnation(numbered(tiny[:3]))["reason"]


def test_stagnation_periods():
    statuses = ["keep"] + ["discard"] * 8 + ["keep"] + ["crash"] * 3 + ["keep"] + ["discard"] * 9
    records = numbered([rec("optimizer", s) for s in statuses])
    assert history.stagnation_periods(records) == [
        {"first_id": 2, "last_id": 9, "count": 8}, {"first_id": 15, "last_id": 23, "count": 9}]
