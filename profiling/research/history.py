"""Pure queries over experiment records: baselines, new records from a run, the noise floor, early-abort
savings and stagnation. Plain lists of record dicts in, plain data out; no I/O, no clock (`now` is passed).
"""
import math
from datetime import timezone

from profiling.errors import UserError
from profiling.research.experiments import BASELINE_DIMENSION, RECORD_KEYS, STATUSES

STAGNANT_NOT_KEPT = 8     # this many experiments in a row not kept: stagnant
STAGNANT_KEPT = 5         # ... or the last this-many kept ones each improved by under
STAGNANT_RELATIVE = 0.001  # 0.1% relative


def group_settings(record):
    """A record's settings as its group compares them. Since issue #27 a GPU run's settings name its hardware
    ("hardware": "2x NVIDIA H100 80GB HBM3"), so runs on other GPU kinds or numbers never compare; a record
    written before then ran on one GPU of its `device`."""
    settings, device = record.get("settings"), record.get("device")
    if isinstance(settings, dict) and "hardware" not in settings and device not in (None, "cpu"):
        return {**settings, "hardware": f"1x {device}"}
    return settings


def same_group(record, settings, dataset):
    """Runs are compared only with runs of identical settings (hardware included) and dataset."""
    return group_settings(record) == settings and record.get("dataset") == dataset


def best_kept(records, settings, dataset):
    """The kept record with the lowest val_bpb among those with these settings and dataset (the earliest
    on a tie), or None. This is the baseline a new run must beat, and the gate's reference run."""
    best = None
    for r in records:
        bpb = r.get("val_bpb")
        if r["status"] == "keep" and bpb is not None and (best is None or bpb < best["val_bpb"]) \
                and same_group(r, settings, dataset):
            best = r
    return best


def best_per_group(records):
    """The best kept record of every settings/dataset group, in order of each group's first keep."""
    best = {}
    for r in records:
        bpb = r.get("val_bpb")
        if r["status"] == "keep" and bpb is not None:
            key = (_freeze(group_settings(r)), r.get("dataset"))
            if key not in best or bpb < best[key]["val_bpb"]:
                best[key] = r
    return list(best.values())


def relative_improvement(record):
    """improvement / baseline_bpb (0.01 is 1% better), or None."""
    imp, base = record.get("improvement"), record.get("baseline_bpb")
    return None if imp is None or not base else imp / base


def _pooled_std(runs_by_commit):
    ss, dof, runs, commits = 0.0, 0, 0, 0
    for vals in runs_by_commit.values():
        if len(vals) >= 2:
            mean = sum(vals) / len(vals)
            ss += sum((v - mean) ** 2 for v in vals)
            dof, runs, commits = dof + len(vals) - 1, runs + len(vals), commits + 1
    return None if dof == 0 else {"std": math.sqrt(ss / dof), "runs": runs, "commits": commits}


def noise_floor(records, settings, dataset):
    """Run-to-run noise of val_bpb: the (pooled, sample) std of repeated runs of one commit with these
    settings and dataset, as {"std", "runs", "commits"}; None without repeats."""
    by_commit = {}
    for r in records:
        if r["status"] in ("keep", "discard") and r.get("val_bpb") is not None and r.get("commit"):
            by_commit.setdefault(r["commit"], []).append(r)
    # settings are compared only for commits run more than once (most commits run once)
    return _pooled_std({c: [r["val_bpb"] for r in runs if same_group(r, settings, dataset)]
                        for c, runs in by_commit.items() if len(runs) >= 2})


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def noise_floors(records):
    """noise_floor for every settings/dataset group that has repeated runs: a list of
    {"settings", "dataset", "std", "runs", "commits"} in order of first appearance."""
    groups = {}
    for r in records:
        key = (_freeze(group_settings(r)), r.get("dataset"))
        groups.setdefault(key, (group_settings(r), r.get("dataset"), []))[2].append(r)
    out = []
    for settings, dataset, members in groups.values():
        floor = noise_floor(members, settings, dataset)
        if floor:
            out.append({"settings": settings, "dataset": dataset, **floor})
    return out


def early_abort_savings(records):
    """Early aborts and the device time they saved: for each, settings.TIME_BUDGET - training_seconds
    (the rest of the budget the run did not spend; 0 if negative). `timed` counts the aborts that carry
    both numbers; the others (e.g. imported ones) add nothing to `saved_seconds`."""
    count, timed, saved = 0, 0, 0.0
    for r in records:
        if r["status"] != "early_abort":
            continue
        count += 1
        budget, spent = (r.get("settings") or {}).get("TIME_BUDGET"), r.get("training_seconds")
        if isinstance(budget, (int, float)) and isinstance(spent, (int, float)):
            timed += 1
            saved += max(0.0, budget - spent)
    return {"count": count, "timed": timed, "saved_seconds": saved}


def _attempts(records):
    """Experiments that tried a change (reruns of the baseline are not attempts)."""
    return [r for r in records if r["dimension"] != BASELINE_DIMENSION]


def stagnation(records):
    """{"stagnant": bool, "reason": str}: stagnant when the last 8 attempts were not kept, or when each of
    the last 5 kept attempts improved val_bpb by under 0.1% relative (a kept run without a baseline
    counts as under)."""
    tries = _attempts(records)
    last = tries[-STAGNANT_NOT_KEPT:]
    if len(last) == STAGNANT_NOT_KEPT and all(r["status"] != "keep" for r in last):
        return {"stagnant": True, "reason": f"none of the last {STAGNANT_NOT_KEPT} experiments was kept"}
    kept = [r for r in tries if r["status"] == "keep"][-STAGNANT_KEPT:]
    if len(kept) == STAGNANT_KEPT and all((relative_improvement(r) or 0) < STAGNANT_RELATIVE for r in kept):
        return {"stagnant": True, "reason": f"each of the last {STAGNANT_KEPT} kept experiments improved "
                                            f"val_bpb by under {STAGNANT_RELATIVE:.1%}"}
    why = ([f"a keep among the last {STAGNANT_NOT_KEPT} experiments"] if len(last) == STAGNANT_NOT_KEPT else []) \
        + ([f"an improvement of {STAGNANT_RELATIVE:.1%} or more among the last {STAGNANT_KEPT} keeps"]
           if len(kept) == STAGNANT_KEPT else [])
    return {"stagnant": False, "reason": "; ".join(why) or f"too few experiments to tell: {len(tries)} so far"}


def stagnation_periods(records, length=STAGNANT_NOT_KEPT):
    """Maximal runs of at least `length` consecutive attempts not kept, as {"first_id", "last_id", "count"}."""
    periods, run = [], []
    for r in _attempts(records) + [None]:
        if r is not None and r["status"] != "keep":
            run.append(r)
            continue
        if len(run) >= length:
            periods.append({"first_id": run[0]["id"], "last_id": run[-1]["id"], "count": len(run)})
        run = []
    return periods


# ----------------------------------------------------------------------------
# A new record from a run.json

def timestamp(now):
    """ISO 8601 UTC, to the second: 2026-11-21T03:14:15Z."""
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def decide_status(run_status, val_bpb, baseline_bpb, override=None):
    """(status, reason). Run status fail (NaN or exploding loss) becomes crash; the run's own status stays
    in the record's run_status."""
    if override:
        if override not in STATUSES:
            raise UserError(f"--status {override!r} is not one of {', '.join(STATUSES)}")
        if override in ("keep", "discard") and val_bpb is None:
            raise UserError(f"--status {override}: the run has no val_bpb (its status is {run_status}); "
                            "use crash or early_abort")
        return override, "set by --status"
    if run_status in ("crash", "fail"):
        return "crash", f"the run ended with status {run_status}"
    if run_status == "early_abort":
        return "early_abort", "the early-abort gate stopped the run"
    if baseline_bpb is None:
        return "keep", "the first run with these settings and dataset: it is the baseline"
    if val_bpb < baseline_bpb:
        return "keep", f"val_bpb {val_bpb:.6f} beats the baseline {baseline_bpb:.6f}"
    return "discard", f"val_bpb {val_bpb:.6f} does not beat the baseline {baseline_bpb:.6f}"


def already_logged(records, run):
    """The record that already holds this run (same commit and run time), or None."""
    if not run.get("time") or not run.get("commit"):
        return None
    for r in reversed(records):
        if r.get("run_time") == run["time"] and r.get("commit") == run["commit"]:
            return r
    return None


def _checked_bpb(run):
    bpb = run["summary"].get("val_bpb")
    if bpb is not None and not (math.isfinite(bpb) and bpb > 0):
        raise UserError(f"run.json: val_bpb is {bpb!r}, expected a finite positive number or null; "
                        "rerun train.py to rewrite it")
    return bpb


def _non_finite(value):
    """True when a NaN or an infinity hides anywhere in value (JSON cannot hold them)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (dict, list)):
        return any(_non_finite(v) for v in (value.values() if isinstance(value, dict) else value))
    return False


def record_from_run(records, run, dimension, change, *, rationale=None, status=None, now):
    """(record, reason, baseline record): a new experiment for `run` (a validated run.json dict),
    compared with the best kept run of `records` with the same settings and dataset. `now` is an
    aware datetime. The record's id is set when it is appended."""
    val = _checked_bpb(run)
    settings, dataset = group_settings(run), run["dataset"]
    base = best_kept(records, settings, dataset)
    base_bpb = base["val_bpb"] if base else None
    status, reason = decide_status(run["status"], val, base_bpb, status)
    improvement = None if val is None or base_bpb is None else round(base_bpb - val, 9)
    floor = noise_floor(records, settings, dataset)
    summary = run["summary"]
    values = {
        "time": timestamp(now),
        "commit": run.get("commit"), "dimension": dimension, "change": change, "rationale": rationale,
        "status": status, "run_status": run["status"], "val_bpb": val, "baseline_bpb": base_bpb,
        "baseline_id": base["id"] if base else None, "improvement": improvement,
        "within_noise": None if floor is None or improvement is None else abs(improvement) < floor["std"],
        "noise_floor": round(floor["std"], 9) if floor else None,
        "peak_vram_mb": summary.get("peak_vram_mb"), "mfu_percent": summary.get("mfu_percent"),
        "num_steps": summary.get("num_steps"), "training_seconds": summary.get("training_seconds"),
        "settings": settings, "dataset": dataset, "device": run.get("device"), "profile": run.get("profile"),
        "run_time": run.get("time"), "gate": run.get("gate"),
        # Only kept runs can be the gate's reference, so only they keep their curve (it is most of a record).
        "loss_curve": run.get("loss_curve") if status == "keep" else None,
        "error": run.get("error"), "oom": run.get("oom"),  # a crash's reason; what an out-of-memory one showed
        "source": "log",
    }
    bad = next((k for k in RECORD_KEYS if _non_finite(values.get(k))), None)
    if bad:
        raise UserError(f"run.json: {bad} holds NaN or infinity; rerun train.py to rewrite it")
    return {k: values.get(k) for k in RECORD_KEYS}, reason, base
