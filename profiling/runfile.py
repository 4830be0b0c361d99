"""run.json: the machine-readable twin of train.py's printed summary. Defined once, here.

train.py writes it beside the `---` block; `research log` and the early-abort gate read it, so no
number is ever copied by hand. Pure Python, no torch.
"""
import json
import math

from profiling.errors import UserError
from profiling.files import atomic_write

VERSION = 1

# The printed summary block, in order (upstream's fields). Values are numbers.
SUMMARY_FIELDS = (
    "val_bpb", "training_seconds", "total_seconds", "peak_vram_mb", "mfu_percent",
    "total_tokens_M", "num_steps", "num_params_M", "depth", "world_size",
)
STATUSES = ("ok", "crash", "fail", "early_abort")  # fail: NaN or exploding loss
# Top-level keys, in the order they are written. `summary` holds SUMMARY_FIELDS; `settings` the effective
# evaluation protocol from prepare.py (runs compare only when settings and dataset are equal);
# `hyperparameters` train.py's knobs; `loss_curve` {"fractions": [...], "loss": [...]} of TIME_BUDGET.
RUN_KEYS = (
    "version", "status", "time", "commit", "device", "torch", "dataset", "summary", "settings",
    "hyperparameters", "loss_curve", "profile", "gate", "error", "oom",
)
# `oom`: what an out-of-memory crash showed (profiling/profile/report/oom.py `explain`), else null; absent in older files.
OPTIONAL_KEYS = ("oom",)
LOSS_CURVE_POINTS = 20  # at least this many evenly spaced fractions of the time budget


# How each summary field is printed (upstream's formats); None prints as n/a.
SUMMARY_FORMATS = {
    "val_bpb": ".6f", "training_seconds": ".1f", "total_seconds": ".1f", "peak_vram_mb": ".1f",
    "mfu_percent": ".2f", "total_tokens_M": ".1f", "num_steps": "d", "num_params_M": ".1f", "depth": "d",
    "world_size": "d",
}


def format_summary(summary, status="ok", extra=()):
    """The `---` block the agent greps: one `key: value` per line, keys padded so values align.

    `extra` is a sequence of (key, value) lines printed after the summary fields (e.g. the gate's numbers).
    """
    lines = ["---"]
    rows = [(k, summary.get(k), SUMMARY_FORMATS[k]) for k in SUMMARY_FIELDS]
    rows += [(k, v, "") for k, v in extra] + [("status", status, "")]
    width = max(len(k) for k, _, _ in rows) + 2
    for key, value, fmt in rows:
        text = "n/a" if value is None else format(value, fmt)
        lines.append(f"{key + ':':<{width}}{text}")
    return "\n".join(lines)


def curve_fractions(points=LOSS_CURVE_POINTS):
    """The fractions of TIME_BUDGET at which the loss curve is sampled: 1/points, 2/points, ..., 1."""
    return [round((i + 1) / points, 6) for i in range(points)]


def make_run(status, summary, settings, dataset, **extra):
    """A run record with every key present, in the documented order."""
    run = dict.fromkeys(RUN_KEYS)
    run.update(version=VERSION, status=status, summary=summary, settings=settings, dataset=dataset, **extra)
    problems = validate_run(run)
    if problems:
        raise ValueError("invalid run record: " + "; ".join(problems))
    return run


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def validate_run(run):
    """Return a list of problems (empty when `run` is a valid run record)."""
    if not isinstance(run, dict):
        return ["not a JSON object"]
    problems = [f"missing key {k!r}" for k in RUN_KEYS if k not in run and k not in OPTIONAL_KEYS]
    if problems:
        return problems
    if run["version"] != VERSION:
        problems.append(f"version {run['version']!r}, expected {VERSION}")
    if run["status"] not in STATUSES:
        problems.append(f"status {run['status']!r} is not one of {', '.join(STATUSES)}")
    summary = run["summary"]
    if not isinstance(summary, dict):
        return problems + ["summary is not an object"]
    for key in SUMMARY_FIELDS:
        value = summary.get(key)
        if value is not None and not _is_number(value):
            problems.append(f"summary.{key} is not a number: {value!r}")
    if run["status"] == "ok":
        bpb = summary.get("val_bpb")
        if not _is_number(bpb) or not math.isfinite(bpb) or bpb <= 0:
            problems.append(f"status ok but val_bpb is {bpb!r} (expected a finite positive number)")
    if not isinstance(run["settings"], dict):
        problems.append("settings is not an object")
    if not isinstance(run["dataset"], str):
        problems.append("dataset is not a string")
    if run.get("oom") is not None and not isinstance(run["oom"], dict):
        problems.append("oom is not an object or null")
    curve = run["loss_curve"]
    if curve is not None:
        if not (isinstance(curve, dict) and isinstance(curve.get("fractions"), list)
                and isinstance(curve.get("loss"), list) and len(curve["fractions"]) == len(curve["loss"])):
            problems.append("loss_curve must be {fractions: [...], loss: [...]} of equal lengths")
    return problems


def read_run(path):
    """Load and validate a run.json; raise UserError with a one-line reason otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path}: no such run file; run `uv run train.py` first, or pass --run PATH") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e}); rerun train.py to rewrite it") from None
    problems = validate_run(run)
    if problems:
        raise UserError(f"{path}: not a valid run.json ({problems[0]}); rerun train.py to rewrite it")
    return run


def write_run(path, run):
    problems = validate_run(run)
    if problems:
        raise ValueError("invalid run record: " + "; ".join(problems))
    atomic_write(path, json.dumps(run, indent=2, allow_nan=False) + "\n")
