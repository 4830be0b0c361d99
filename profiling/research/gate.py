"""The early-abort gate: stop a clearly worse run early, and never lose a good one. Pure Python, no torch.

At each checkpoint (a fraction of TIME_BUDGET; default DUSE's 30%) train.py compares its smoothed training
loss with the reference curve at the same fraction: the loss curve of the best kept run in the memory with
the same settings and dataset. The run aborts when its loss is above THRESHOLD x the reference (default
DUSE's 1.05). No reference, or a memory that cannot be read: the gate is off, said once, training goes on.
Switches: `uv run train.py --no-gate`, or AUTORESEARCH_GATE=off.
"""
import bisect
import os

from profiling.errors import UserError
from profiling.research import experiments, history

CHECKPOINTS = (0.3,)  # fractions of TIME_BUDGET
THRESHOLD = 1.05      # abort when loss > THRESHOLD x reference loss at the same fraction
EXIT_CODE = 3         # train.py's exit status for an early abort (0 ok, 1 fail/crash, 2 bad config)


def curve_at(curve, fraction):
    """The reference loss at `fraction`, linearly interpolated; None outside the recorded fractions."""
    xs, ys = curve["fractions"], curve["loss"]
    if not xs or fraction < xs[0] - 1e-9 or fraction > xs[-1] + 1e-9:
        return None
    i = bisect.bisect_left(xs, fraction - 1e-9)
    if xs[i] <= fraction + 1e-9 or i == 0:
        return ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (fraction - x0) / (x1 - x0)


def decide(loss, fraction, reference, threshold=THRESHOLD):
    """The gate's numbers at one checkpoint: {fraction, loss, reference_loss, ratio, threshold, abort}."""
    ref = curve_at(reference["loss_curve"], fraction)
    if ref is None or ref <= 0:
        return None
    ratio = loss / ref
    return {"fraction": fraction, "loss": round(loss, 6), "reference_loss": round(ref, 6),
            "ratio": round(ratio, 4), "threshold": threshold, "abort": ratio > threshold,
            "reference_id": reference.get("id"), "reference_commit": reference.get("commit")}


def find_reference(memory_path, settings, dataset):
    """(reference record, None) or (None, why the gate is off). Never raises for a bad memory."""
    if os.environ.get("AUTORESEARCH_GATE", "").lower() in ("0", "off", "false", "no"):
        return None, "off (AUTORESEARCH_GATE=off)"
    try:
        records = experiments.load(memory_path)["experiments"]
    except UserError as e:
        return None, f"off: the memory cannot be read ({e})"
    best = history.best_kept(records, settings, dataset)
    if best is None:
        return None, f"off: no kept run in {memory_path} with these settings and dataset"
    curve = best.get("loss_curve")
    if not curve or not curve.get("fractions"):
        return None, f"off: the best kept run (#{best.get('id')}) has no loss curve"
    return best, None


class Gate:
    """Stateful wrapper for the training loop: `check(progress, loss)` is cheap and returns the decision
    dict at the checkpoint it crossed (or None); it looks only at checkpoints, never at every step."""

    def __init__(self, reference, checkpoints=CHECKPOINTS, threshold=THRESHOLD):
        self.reference, self.threshold = reference, threshold
        self.pending = sorted(checkpoints)
        self.decisions = []

    def describe(self):
        ref = self.reference
        points = ", ".join(f"{100 * c:.0f}%" for c in self.pending)
        return (f"on: reference #{ref.get('id')} ({ref.get('commit')}, val_bpb {ref.get('val_bpb')}); "
                f"abort if loss > {self.threshold}x reference at {points} of the time budget")

    def check(self, progress, loss):
        if not self.pending or progress < self.pending[0]:
            return None
        fraction = self.pending.pop(0)
        decision = decide(loss, fraction, self.reference, self.threshold)
        if decision is not None:
            self.decisions.append(decision)
        return decision
