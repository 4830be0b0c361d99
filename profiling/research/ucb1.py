"""UCB1 over research dimensions: records in, per-dimension scores and the choice out. Pure and deterministic.

    score(d) = mean_reward(d) + c * sqrt(ln N / n(d))

n(d): experiments logged under dimension d (every status counts as a trial); N: the sum of n(d) over the
dimensions listed in the memory (records under other names, e.g. `baseline` reruns, are not trials).

Rewards must lie in [0, 1], as UCB1 assumes. DUSE added raw val_bpb improvements (~0.001-0.01) to a
bonus of ~1, so exploitation never mattered. Here a trial's reward is its relative improvement scaled by
a fixed REWARD_SCALE and clipped:

    reward = clip((baseline_bpb - val_bpb) / baseline_bpb / REWARD_SCALE, 0, 1)   for a kept run
    reward = 0                                                                      otherwise

With REWARD_SCALE = 0.01, a kept run 1% better than its baseline earns the full reward 1, a typical kept
0.1-0.5% earns 0.1-0.5; discards, crashes and early aborts earn 0. The scale is fixed (not derived from
the data) so that one record never changes the rewards of the others.

Ties: untried dimensions score +inf and come first. The choice is the highest score; equal scores (within
1e-12) go to the dimension with fewer trials, then to the one listed first in the memory's dimensions.
"""
import math

from profiling.research.history import relative_improvement

C = math.sqrt(2)       # Auer et al.'s UCB1: bonus sqrt(2 ln N / n)
REWARD_SCALE = 0.01    # relative improvement that earns the full reward
TIE = 1e-12


def reward(record, scale=REWARD_SCALE):
    """The reward of one trial, in [0, 1]."""
    if record["status"] != "keep":
        return 0.0
    rel = relative_improvement(record)
    return 0.0 if rel is None or rel <= 0 else min(rel / scale, 1.0)


def dimension_stats(records, dimensions, scale=REWARD_SCALE):
    """Per dimension: {"dimension", "listed", "trials", "keeps", "reward_sum", "best_improvement"}.
    The listed dimensions first, in order; then any other dimension the records use, in order of first use."""
    stats = {d: _empty(d, True) for d in dimensions}
    for r in records:
        s = stats.get(r["dimension"])
        if s is None:
            s = stats[r["dimension"]] = _empty(r["dimension"], False)
        s["trials"] += 1
        if r["status"] == "keep":
            s["keeps"] += 1
            s["reward_sum"] += reward(r, scale)
        imp = r.get("improvement")
        if imp is not None and r["status"] in ("keep", "discard") and (
                s["best_improvement"] is None or imp > s["best_improvement"]):
            s["best_improvement"] = imp
    for s in stats.values():
        s["mean_reward"] = s["reward_sum"] / s["trials"] if s["trials"] else None
    return list(stats.values())


def _empty(dimension, listed):
    return {"dimension": dimension, "listed": listed, "trials": 0, "keeps": 0, "reward_sum": 0.0,
            "best_improvement": None}


def scores(records, dimensions, c=C, scale=REWARD_SCALE):
    """One row per listed dimension, in the memory's order: the stats plus "bonus" and "score"
    (None and +inf for an untried dimension) and "total_trials" (N)."""
    rows = [s for s in dimension_stats(records, dimensions, scale) if s["listed"]]
    total = sum(s["trials"] for s in rows)
    for s in rows:
        s["total_trials"] = total
        if s["trials"] == 0:
            s["bonus"], s["score"] = None, math.inf
        else:
            s["bonus"] = c * math.sqrt(math.log(total) / s["trials"])
            s["score"] = s["mean_reward"] + s["bonus"]
    return rows


def choose(rows):
    """(row, reason) for the rows of `scores`: the highest score, then fewer trials, then file order."""
    if not rows:
        return None, "the memory lists no dimensions; add one with `research dimension add NAME`"
    top = max(r["score"] for r in rows)
    tied = [r for r in rows if r["score"] == top or abs(r["score"] - top) <= TIE]
    fewest = min(r["trials"] for r in tied)
    best = next(r for r in tied if r["trials"] == fewest)
    if best["trials"] == 0:
        untried = [r["dimension"] for r in tied]
        reason = (f"untried: UCB1 tries every dimension once first (untried now: {', '.join(untried)}); "
                  "among untried ones, the first listed in the memory")
    else:
        reason = (f"highest score {best['score']:.4f} = mean reward {best['mean_reward']:.4f} + bonus "
                  f"{best['bonus']:.4f} ({best['trials']} of {best['total_trials']} trials)")
        others = [r["dimension"] for r in tied if r is not best]
        if others:
            reason += f"; tied with {', '.join(others)}, broken by fewer trials, then the order in the memory"
    return best, reason


def select(records, dimensions, c=C, scale=REWARD_SCALE):
    """{"choice", "reason", "rows", "c", "reward_scale"}: everything `research next` reports."""
    rows = scores(records, dimensions, c, scale)
    best, reason = choose(rows)
    return {"choice": best["dimension"] if best else None, "reason": reason, "rows": rows,
            "c": c, "reward_scale": scale}


def reward_rule(scale=REWARD_SCALE):
    """The reward rule in words, for the output."""
    return (f"relative improvement of a kept run / {scale:g} ({scale:.2%} better earns the full 1), "
            "clipped to [0, 1]; discards, crashes and early aborts earn 0")
