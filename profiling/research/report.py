"""The morning report: the memory in, numbers and Markdown out. Pure: no I/O, no clock, no matplotlib.

    summarize(mem)           -> a dict of plain numbers (what `research report` writes, and what tests check)
    to_markdown(data, path)  -> report.md's text
    series(records)          -> what profiling.research.plot draws as progress.png

Results are comparable only within one group of identical settings and dataset. The report covers one
group: the largest (most experiments; on a tie, the one holding the latest experiment), and says so when
the memory holds others, which it lists with their best run.

Definitions (each is also spelled out in the report):
- pace: (experiments with a time - 1) / hours from the first to the last time stamp, i.e. one experiment per
  interval between consecutive log times (all agents writing the memory together);
- keep rate: keeps / attempts, where attempts are the group's experiments of every status except reruns of
  the unchanged baseline (dimension `baseline`, which are noise measurements, not ideas);
- delta (improvement): baseline_bpb - val_bpb, against the best kept run when the experiment was logged.
"""
import json
from collections import Counter
from datetime import datetime, timezone
from itertools import pairwise

from profiling.research import history, ucb1
from profiling.research.experiments import BASELINE_DIMENSION, STATUSES
from profiling.research.render import cell, fmt, group_label, table

TOP = 5                 # top improvements listed (and annotated in the plot)
STAGNATION = history.STAGNANT_NOT_KEPT


# ----------------------------------------------------------------------------
# Groups and times

def groups(records):
    """[{"settings", "dataset", "label", "records"}] for every settings/dataset group, in order of first
    use."""
    out = {}
    for r in records:
        key = (json.dumps(r.get("settings"), sort_keys=True), r.get("dataset"))
        if key not in out:
            label = group_label(history.group_settings(r), r.get("dataset"))
            twin = next((g for g in out.values() if g["label"] == label), None)
            if twin:  # the same preset with other settings: name what differs
                settings, other = r.get("settings") or {}, twin["settings"] or {}
                label += ", " + ", ".join(f"{k} {v}" for k, v in sorted(settings.items())
                                          if other.get(k) != v)
            out[key] = {"settings": r.get("settings"), "dataset": r.get("dataset"), "label": label,
                        "records": []}
        out[key]["records"].append(r)
    return list(out.values())


def largest(groups_):
    """The group with the most experiments; on a tie, the one with the latest experiment (the current
    work)."""
    return max(groups_, key=lambda g: (len(g["records"]), g["records"][-1]["id"])) if groups_ else None


def parse_time(text):
    """A record's ISO 8601 time as an aware UTC datetime, or None (missing or unreadable)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def pace(records):
    """Experiments per hour from the records' time stamps: {"timed", "first", "last", "hours", "per_hour",
    "longest_gap_minutes", "gap_before_id"}; per_hour None with under 2 time stamps or a zero span."""
    times = sorted((t, r["id"]) for t, r in ((parse_time(r.get("time")), r) for r in records) if t)
    out = {"timed": len(times), "first": None, "last": None, "hours": None, "per_hour": None,
           "longest_gap_minutes": None, "gap_before_id": None}
    if len(times) < 2 or times[-1][0] == times[0][0]:
        return out
    hours = (times[-1][0] - times[0][0]).total_seconds() / 3600
    gap, before = max(((b[0] - a[0]).total_seconds(), b[1]) for a, b in pairwise(times))
    out.update(first=times[0][0].strftime("%Y-%m-%d %H:%M"), last=times[-1][0].strftime("%Y-%m-%d %H:%M"),
               hours=hours, per_hour=(len(times) - 1) / hours, longest_gap_minutes=gap / 60,
               gap_before_id=before)
    return out


# ----------------------------------------------------------------------------
# The numbers

def outcomes(records):
    """Status counts, and the keep rate over attempts (reruns of the baseline excluded)."""
    attempts = [r for r in records if r["dimension"] != BASELINE_DIMENSION]
    keeps = sum(r["status"] == "keep" for r in attempts)
    counts = Counter(r["status"] for r in records)
    return {"experiments": len(records), "status": {s: counts[s] for s in STATUSES},
            "attempts": len(attempts), "attempt_keeps": keeps,
            "baseline_reruns": len(records) - len(attempts),
            "keep_rate": keeps / len(attempts) if attempts else None}


def _brief(record):
    if record is None:
        return None
    return {k: record.get(k) for k in ("id", "commit", "dimension", "change", "val_bpb", "time")}


def progress(records, settings, dataset):
    """The best kept run, the first kept run, and the distance between them."""
    best = history.best_kept(records, settings, dataset)
    first = next((r for r in records if r["status"] == "keep" and r.get("val_bpb") is not None), None)
    gain = None if best is None else first["val_bpb"] - best["val_bpb"]
    return {"best": _brief(best), "first": _brief(first), "gain": gain,
            "gain_relative": None if gain is None else gain / first["val_bpb"]}


def top_improvements(records, n=TOP):
    """The kept runs with the largest positive delta, largest first (the earlier one on a tie)."""
    kept = [r for r in records if r["status"] == "keep" and (r.get("improvement") or 0) > 0]
    kept.sort(key=lambda r: (-r["improvement"], r["id"]))
    return [{**_brief(r), "improvement": r["improvement"], "relative": history.relative_improvement(r)}
            for r in kept[:n]]


def dimension_rows(records, dimensions):
    """ucb1.dimension_stats plus crashes, early aborts and the keep rate per dimension."""
    counts = Counter((r["dimension"], r["status"]) for r in records)
    rows = ucb1.dimension_stats(records, dimensions)
    for s in rows:
        d = s["dimension"]
        s.update(crashes=counts[(d, "crash")], early_aborts=counts[(d, "early_abort")],
                 keep_rate=s["keeps"] / s["trials"] if s["trials"] else None)
    return rows


def stagnation_periods(records):
    """history.stagnation_periods, each with its start and end time and duration when known."""
    by_id = {r["id"]: parse_time(r.get("time")) for r in records}
    out = []
    for p in history.stagnation_periods(records, STAGNATION):
        start, end = by_id.get(p["first_id"]), by_id.get(p["last_id"])
        out.append({**p, "start": start and start.strftime("%Y-%m-%d %H:%M"),
                    "end": end and end.strftime("%Y-%m-%d %H:%M"),
                    "hours": (end - start).total_seconds() / 3600 if start and end else None})
    return out


def noise(records, settings, dataset):
    """The noise floor and how many kept deltas lie below it, or None without repeated runs."""
    floor = history.noise_floor(records, settings, dataset)
    if floor is None:
        return None
    deltas = [r["improvement"] for r in records if r["status"] == "keep" and r.get("improvement") is not None]
    return {**floor, "keeps_with_delta": len(deltas), "keeps_below": sum(d < floor["std"] for d in deltas)}


def summarize(mem):
    """Everything report.md says, as plain data: {"experiments", "groups", "group", ..., "series" (what
    the plot draws)}; for an empty memory {"experiments": 0, "groups": [], "group": None, "series"}."""
    all_groups = groups(mem["experiments"])
    g = largest(all_groups)
    data = {"experiments": len(mem["experiments"]), "groups": [
        {"label": x["label"], "experiments": len(x["records"]), "largest": x is g,
         "best": _brief(history.best_kept(x["records"], x["settings"], x["dataset"]))} for x in all_groups],
        "group": None, "series": series([])}
    if g is None:
        return data
    recs, settings, dataset = g["records"], g["settings"], g["dataset"]
    data.update(group=g["label"], outcomes=outcomes(recs), progress=progress(recs, settings, dataset),
                pace=pace(recs), early_aborts=history.early_abort_savings(recs),
                dimensions=dimension_rows(recs, mem["dimensions"]), top=top_improvements(recs),
                stagnation_periods=stagnation_periods(recs), stagnation_now=history.stagnation(recs),
                noise=noise(recs, settings, dataset), series=series(recs))
    return data


# ----------------------------------------------------------------------------
# What progress.png draws

def series(records):
    """Plot data: (id, val_bpb) points by status, the ids of runs without val_bpb (crashes, early aborts),
    the running best as a step line [(id, best)] ending at the last id, and stagnation spans (first id,
    last id)."""
    out = {"keep": [], "discard": [], "crash": [], "early_abort": [], "best": [], "stagnation": []}
    best = None
    for r in records:
        status, val = r["status"], r.get("val_bpb")
        if status in ("crash", "early_abort"):
            out[status].append(r["id"])
            continue
        if val is None:  # a keep or discard without val_bpb: only a hand-edited memory holds one
            continue
        out[status].append((r["id"], val))
        if status == "keep" and (best is None or val < best):
            best = val
            out["best"].append((r["id"], val))
    if out["best"] and records[-1]["id"] != out["best"][-1][0]:
        out["best"].append((records[-1]["id"], best))
    out["stagnation"] = [(p["first_id"], p["last_id"])
                         for p in history.stagnation_periods(records, STAGNATION)]
    return out


def plot_title(data):
    if not data["group"]:
        return "no experiments yet"
    o, p = data["outcomes"], data["progress"]
    title = f"{o['experiments']} experiments, {o['status']['keep']} kept"
    if p["best"]:
        title += f": val_bpb {p['first']['val_bpb']:.6f} -> {p['best']['val_bpb']:.6f}"
        if p["gain_relative"]:
            title += f" ({-p['gain_relative']:+.2%})"
    if len(data["groups"]) > 1:
        title += f"\n{data['group']} (the largest of {len(data['groups'])} groups)"
    return title


def plot_labels(data, width=34):
    """[(id, val_bpb, text)] for the top improvements, for the plot to label."""
    return [(t["id"], t["val_bpb"], f"#{t['id']} {cell(t['change'], width)}") for t in data.get("top") or []]


# ----------------------------------------------------------------------------
# report.md

def _summary_lines(data):
    o, p, pc, ab = data["outcomes"], data["progress"], data["pace"], data["early_aborts"]
    best = p["best"]
    lines = ["- best val_bpb: none yet (no kept run)"]
    if best:
        lines = [(f"- **best val_bpb: {best['val_bpb']:.6f}** (experiment {best['id']}, commit "
                  f"`{best['commit'] or 'n/a'}`; {best['dimension']}: {cell(best['change'])})")]
    if best and best["id"] != p["first"]["id"]:
        lines.append(f"- progress: {p['first']['val_bpb']:.6f} (experiment {p['first']['id']}, the first "
                     f"kept) -> {best['val_bpb']:.6f}: {-p['gain']:+.6f} ({-p['gain_relative']:+.2%})")
    if pc["per_hour"] is not None:
        lines.append(f"- pace: **{pc['per_hour']:.1f} experiments per hour**: {pc['timed']} time stamps from "
                     f"{pc['first']} to {pc['last']} UTC ({pc['hours']:.2f} h, {pc['timed'] - 1} intervals); "
                     f"longest gap {pc['longest_gap_minutes']:.1f} min (before experiment "
                     f"{pc['gap_before_id']})")
    else:
        lines.append(f"- pace: unknown ({pc['timed']} of {o['experiments']} experiments have a time stamp; "
                     "it takes two different ones)")
    rate = "n/a" if o["keep_rate"] is None else f"{o['keep_rate']:.1%}"
    reruns = f"; {o['baseline_reruns']} runs of the unchanged baseline not counted" \
        if o["baseline_reruns"] else ""
    lines.append(f"- keep rate: **{rate}** ({o['attempt_keeps']} of {o['attempts']} attempts{reruns})")
    s = o["status"]
    lines.append(f"- outcomes: {s['keep']} kept, {s['discard']} discarded, {s['crash']} crashed, "
                 f"{s['early_abort']} stopped early")
    lines.append(_abort_line(ab))
    lines.append(_noise_line(data["noise"]))
    stag = data["stagnation_now"]
    lines.append(f"- stagnating now: {'**yes**' if stag['stagnant'] else 'no'} ({stag['reason']})")
    return lines


def _duration(seconds):
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _abort_line(ab):
    if not ab["count"]:
        return "- early aborts: none"
    line = f"- early aborts: {ab['count']}; device time saved: "
    if not ab["timed"]:
        return line + "unknown (none carries TIME_BUDGET and training_seconds; imported rows do not)"
    line += f"~{_duration(ab['saved_seconds'])} (TIME_BUDGET - training_seconds"
    return line + (f", over the {ab['timed']} that carry both)" if ab["timed"] < ab["count"] else ")")


def _noise_line(n):
    if n is None:
        return ("- noise floor: unknown (no repeated runs of one commit: rerun the baseline and "
                "`research log --dimension baseline --change rerun`)")
    return (f"- noise floor: {n['std']:.6f} (std of val_bpb over {n['runs']} runs of {n['commits']} "
            f"commit{'s' if n['commits'] > 1 else ''}); kept deltas smaller than it: {n['keeps_below']} of "
            f"{n['keeps_with_delta']} (rerun those before building on them)")


def _dimension_table(rows):
    body = [[s["dimension"] + ("" if s["listed"] else " (not listed)"), s["trials"], s["keeps"],
             fmt(s["keep_rate"], ".0%"), s["crashes"], s["early_aborts"], fmt(s["best_improvement"], "+.6f"),
             fmt(s["mean_reward"], ".4f")] for s in rows]
    return table(body, ["dimension", "trials", "keeps", "keep rate", "crashes", "early aborts", "best delta",
                        "mean reward"])


def _top_table(top):
    body = [[i, t["id"], t["dimension"], cell(t["change"], 60), f"{t['val_bpb']:.6f}",
             f"{t['improvement']:+.6f}", fmt(t["relative"], "+.3%"), t["commit"] or "-"]
            for i, t in enumerate(top, 1)]
    return table(body, ["rank", "id", "dimension", "change", "val_bpb", "delta", "relative", "commit"])


def _stagnation_table(periods):
    body = [[f"{p['first_id']}-{p['last_id']}", p["count"], p["start"] or "-", p["end"] or "-",
             fmt(p["hours"], ".2f")] for p in periods]
    return table(body, ["experiments", "attempts without a keep", "from (UTC)", "to (UTC)", "hours"])


def _groups_table(groups_):
    body = [[g["label"] + (" (this report)" if g["largest"] else ""), g["experiments"],
             fmt(g["best"] and g["best"]["val_bpb"]), g["best"]["id"] if g["best"] else "-",
             (g["best"] and g["best"]["commit"]) or "-"] for g in groups_]
    return table(body, ["group", "experiments", "best val_bpb", "experiment", "commit"])


NO_PLOT = "(no progress.png: matplotlib is not installed; `pip install matplotlib` draws it)"


def to_markdown(data, path, image="progress.png"):
    """report.md's text for summarize()'s `data`; `path` names the memory, `image` the plot beside it (None:
    none drawn)."""
    if not data["group"]:
        return (f"# Research report: nothing yet\n\nmemory: `{path}`: no experiments yet. Run train.py and "
                "`research log --dimension D --change \"...\"` (or `research import-tsv results.tsv`), then "
                f"`research report` again.\n" + (f"\n![progress]({image})\n" if image else ""))
    out = [f"# Research report: {data['experiments']} experiments", "",
           f"memory: `{path}`; group: {data['group']}"]
    if len(data["groups"]) > 1:
        out[-1] += (f": the largest of {len(data['groups'])} groups, {data['outcomes']['experiments']} "
                    "experiments. Results are comparable only within one group (same settings and dataset), "
                    "so every number below is this group's; see `Other groups`.")
    out += ["", *_summary_lines(data), "", f"![progress]({image})" if image else NO_PLOT, "",
            "## Per dimension", "", _dimension_table(data["dimensions"]), "",
            ("delta = baseline_bpb - val_bpb against the best kept run at the time (positive is better); "
             "mean reward: UCB1's (`research next`)"), "", f"## Top {TOP} improvements", ""]
    out.append(_top_table(data["top"]) if data["top"] else "none yet: no kept run has beaten a baseline")
    out += ["", "## Stagnation periods", "",
            f"{STAGNATION} or more attempts in a row without a keep (reruns of the baseline skipped):", ""]
    out.append(_stagnation_table(data["stagnation_periods"]) if data["stagnation_periods"] else "none")
    if len(data["groups"]) > 1:
        out += ["", "## Other groups", "", _groups_table(data["groups"])]
    return "\n".join(out) + "\n"

