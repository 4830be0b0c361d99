"""Text for the memory commands: `key: value` lines and GitHub Markdown tables. Pure: plain data in, a
string out."""
from profiling.research.history import group_settings
from profiling.research.ucb1 import reward_rule

CHANGE_WIDTH = 80


def table(rows, headers):
    """The text of tabulate(rows, headers, tablefmt="github", disable_numparse=True), as the profile report
    renders its tables (a test pins the equality). Written out because importing tabulate takes ~40 ms on an
    idle 2-core machine and 75-130 ms on a busy one, the largest part of `research next` after the parse."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h) + 2] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(values):
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), rule, *map(line, cells)])


def cell(text, width=CHANGE_WIDTH):
    """One Markdown table cell: one line, no bare pipes, at most `width` characters."""
    text = " ".join(str(text or "").split()).replace("|", "\\|")
    return text if len(text) <= width else text[:width - 1] + "…"


def fmt(value, spec=".6f", none="-"):
    return none if value is None else format(value, spec)


def group_label(settings, dataset):
    if settings is None and dataset is None:
        return "imported (no settings, no dataset)"
    preset, hardware = (settings or {}).get("preset"), (settings or {}).get("hardware")
    label = f"dataset {dataset}, " + (f"preset {preset}" if preset else f"settings {settings}")
    return label + (f", {hardware}" if hardware and preset else "")


# ----------------------------------------------------------------------------
# research log

def advice(record, baseline):
    """What to do next, in one line."""
    status, imp = record["status"], record["improvement"]
    rerun = baseline is not None and record["commit"] and record["commit"] == baseline.get("commit")
    if status == "keep":
        if imp is None:
            text = "keep the commit: this run is the baseline later runs with these settings must beat"
        elif imp > 0:
            text = f"keep the commit: the branch advances; {record['val_bpb']:.6f} is the new best for these settings"
        else:
            text = f"keep the commit (kept by --status); the baseline stays {record['baseline_bpb']:.6f}"
        if record["within_noise"]:
            text += "; the improvement is within noise: rerun it to confirm before building on it"
        return text
    if status == "discard":
        if rerun:
            return "nothing to reset: this was a rerun of the baseline's commit"
        return ("discard the change: `git reset --keep HEAD~1` (back to the last kept commit; --keep, not "
                "--hard, keeps the memory's new records)")
    if status == "crash":
        return ("read the end of the run's log; fix and rerun if it was a simple bug, "
                "else give up on the idea: `git reset --keep HEAD~1`")
    return "the early-abort gate stopped it: `git reset --keep HEAD~1` and try something else"


def log_text(record, reason, baseline, path):
    imp, rel = record["improvement"], None
    if imp is not None and record["baseline_bpb"]:
        rel = imp / record["baseline_bpb"]
    noise = "unknown (no repeated runs of one commit yet)" if record["noise_floor"] is None else (
        f"{record['noise_floor']:.6f} (std of repeated runs); within noise: "
        + ("n/a" if record["within_noise"] is None else "yes" if record["within_noise"] else "no"))
    lines = [
        f"logged: experiment {record['id']} in {path}",
        f"status: {record['status']} ({reason})",
        f"dimension: {record['dimension']}",
        f"change: {record['change']}",
        f"commit: {record['commit'] or 'n/a'}",
        f"val_bpb: {fmt(record['val_bpb'], '.6f', 'n/a')}",
        f"baseline_bpb: {fmt(record['baseline_bpb'], '.6f', 'n/a')}"
        + (f" (experiment {baseline['id']})" if baseline else ""),
        f"improvement: {fmt(imp, '+.6f', 'n/a')}" + (f" ({rel:+.3%})" if rel is not None else ""),
        f"noise_floor: {noise}",
        f"peak_vram_mb: {fmt(record['peak_vram_mb'], '.1f', 'n/a')}",
        f"mfu_percent: {fmt(record['mfu_percent'], '.2f', 'n/a')}",
        f"num_steps: {fmt(record['num_steps'], 'd', 'n/a')}",
        f"next: {advice(record, baseline)}",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# research next

def next_text(selection, stagnation, rescue, path, n_records):
    rows = selection["rows"]
    body = [[r["dimension"], r["trials"], r["keeps"], fmt(r["mean_reward"], ".4f"), fmt(r["bonus"], ".4f"),
             "untried (+inf)" if r["bonus"] is None else f"{r['score']:.4f}"] for r in rows]
    total = rows[0]["total_trials"] if rows else 0
    lines = [
        f"memory: {path} ({n_records} experiments; {total} trials over {len(rows)} dimensions)",
        f"score: mean reward + c * sqrt(ln N / n), c = {selection['c']:.4g}, N = {total}",
        f"reward: {reward_rule(selection['reward_scale'])}",
        "",
        table(body, ["dimension", "trials", "keeps", "mean reward", "bonus", "score"]),
        "",
        f"choice: {selection['choice']}",
        f"why: {selection['reason']}",
        f"stagnation: {'YES' if stagnation['stagnant'] else 'no'} ({stagnation['reason']})",
    ]
    if stagnation["stagnant"]:
        lines.append("hint: stagnating: try a bolder change, combine near misses, or reuse a rescue-pool entry")
    lines.append(f"rescue pool for {selection['choice']}: {len(rescue)} entries")
    if rescue:
        lines += ["", rescue_table(rescue)]
    return "\n".join(lines)


def rescue_table(entries):
    body = [[e["id"], e.get("from_experiment") if e.get("from_experiment") is not None else "-",
             e["dimension"], cell(e["mechanism"]), cell(e.get("reuse_signal"))] for e in entries]
    return table(body, ["id", "from", "dimension", "mechanism", "reuse signal"])


# ----------------------------------------------------------------------------
# research show

def experiments_table(records):
    body = [[r["id"], r["dimension"], cell(r.get("change")), fmt(r.get("val_bpb")),
             fmt(r.get("improvement"), "+.6f") + ("*" if r.get("within_noise") else ""), r["status"]]
            for r in records]
    return table(body, ["id", "dimension", "change", "val_bpb", "delta", "status"])


def dimensions_table(stats):
    body = [[s["dimension"] + ("" if s["listed"] else " (not listed)"), s["trials"], s["keeps"],
             fmt(s["best_improvement"], "+.6f"), fmt(s["mean_reward"], ".4f")] for s in stats]
    return table(body, ["dimension", "trials", "keeps", "best delta", "mean reward"])


def show_text(view, path):
    """`view`: what cmd_show gathered (see profiling.cli)."""
    records, shown = view["count"], view["experiments"]
    head = f"memory: {path}: {records} experiments, rescue pool: {view['rescue_entries']}"
    if len(shown) < records:
        head += f" (showing the last {len(shown)}; --last 0 for all)"
    lines = [head]
    lines += [f"best: {b['val_bpb']:.6f} (experiment {b['id']}, commit {b.get('commit') or 'n/a'}; "
              f"{group_label(group_settings(b), b.get('dataset'))})" for b in view["best"]]
    if shown:
        lines += ["", experiments_table(shown),
                  "delta = baseline_bpb - val_bpb (positive is better); * = within the noise floor"]
    lines += ["", "per dimension:", "", dimensions_table(view["dimensions"]), ""]
    if view["noise_floors"]:
        lines += [f"noise floor: {n['std']:.6f} (std of val_bpb over {n['runs']} repeated runs of "
                  f"{n['commits']} commit{'s' if n['commits'] > 1 else ''}; "
                  f"{group_label(n['settings'], n['dataset'])})" for n in view["noise_floors"]]
    else:
        lines.append("noise floor: unknown (no repeated runs of one commit yet: rerun the baseline and "
                     "`research log --dimension baseline --change rerun`)")
    ab = view["early_aborts"]
    lines.append(f"early aborts: {ab['count']}, device time saved ~{ab['saved_seconds']:.0f} s "
                 f"(TIME_BUDGET - training_seconds, summed over the {ab['timed']} with both numbers)")
    return "\n".join(lines)
