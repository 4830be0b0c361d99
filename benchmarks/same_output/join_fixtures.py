"""Every GPU fixture read as today and read through the join (issue #50): are its findings and tables the same?

    uv run python benchmarks/same_output/join_fixtures.py [TRACE ...] [--markdown]

A live capture's timed steps now record the device only (kernels, copies and the runtime calls that launch
them), and their operators come from one untimed step after them (profiling/profile/trace/join.py). The
fixtures were recorded with every operator in their timed steps, so each can be replayed as a device-only
capture: `as_device_only` keeps its kernels, copies, runtime calls and ProfilerStep annotations (with the ids
CUDA activity alone records: no External id) and takes the host events, runtime calls and device events of
its last step as the untimed step's; `join.join` then puts operators back. This prints, per fixture: the
joined share of device time, the top finding before and after, every finding's kind and ms/step that moved
by more than MOVED (relative), and whether the step budget, the model regions and the source lines match.
"""
import argparse
import copy
import glob
import os
import sys

from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.trace import join
from profiling.profile.trace.traceio import DEVICE_CATS, LAUNCH_CATS, STEP_PREFIX, corr

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data")
MOVED = 0.05  # a finding whose ms/step changed by more than this share (or appeared, or went) is listed


def steps_of(events):
    return sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") == "user_annotation"
                  and str(e.get("name", "")).startswith(STEP_PREFIX))


def as_device_only(trace):
    """(the trace as a device-only capture records it, the donor step's events), or None without GPU steps."""
    events = trace["traceEvents"]
    steps = steps_of(events)
    if len(steps) < 2 or not any(e.get("cat") == "kernel" for e in events):
        return None
    start, end = steps[-1]
    donor, kept = [], []
    for e in events:
        cat, ts = e.get("cat"), e.get("ts")
        is_step = cat == "user_annotation" and str(e.get("name", "")).startswith(STEP_PREFIX)
        if cat in join.HOST_CATS and not is_step:
            if isinstance(ts, (int, float)) and start <= ts < end:
                donor.append(e)
            continue
        if cat in LAUNCH_CATS or cat in DEVICE_CATS:
            e = dict(e, args={k: v for k, v in (e.get("args") or {}).items() if k != "External id"})
        if cat in ("fwdbwd",):
            continue
        kept.append(e)
    last = {corr(e) for e in kept if e.get("cat") in LAUNCH_CATS and start <= e.get("ts", -1) < end}
    donor += [e for e in events if e.get("cat") in LAUNCH_CATS | DEVICE_CATS and corr(e) in last - {None}]
    out = dict(trace, traceEvents=kept)
    out.pop("record_shapes", None)
    return out, donor


def as_captured(trace):
    """(the trace before its join, the donor step's events) of a live capture whose device-only timed steps were
    joined already (benchmarks/findings/live/uneven_steps.py's traces): the copied host events taken out, the
    launches' External ids with them; the donor is the like step that joined best (the fewest unjoined device
    time among the steps of the commonest launch count, or of the most launches where every count differs; the
    last of equals): its copies, launches and device
    events stand in for the untimed step after the window, which the trace does not keep. None when the trace
    holds no join."""
    meta = trace.get("autoresearch") or {}
    events = trace["traceEvents"]
    steps = steps_of(events)
    if meta.get("capture_ops") != "device" or len(steps) < 2:
        return None
    device = join._launched(events)
    launches = [e for e in events if e.get("cat") in LAUNCH_CATS and isinstance(e.get("ts"), (int, float))]
    per = [[0, 0.0] for _ in steps]  # launches, unjoined device us
    for e in launches:
        k = next((i for i, (a, b) in enumerate(steps) if a <= e["ts"] < b), None)
        if k is not None:
            per[k][0] += 1
            if "External id" not in (e.get("args") or {}):
                per[k][1] += sum(x.get("dur", 0) for x in device.get(corr(e), []))
    counts = [n for n, _ in per]
    common = max(set(counts), key=lambda n: (counts.count(n), n))  # all apart (a random branch): the most
    k = min((i for i in range(len(steps)) if counts[i] == common), key=lambda i: (per[i][1], -i))
    start, end = steps[k]
    lent = {corr(t) for t in launches if start <= t["ts"] < end} - {None}
    donor, kept = [], []
    for e in events:
        cat, ts = e.get("cat"), e.get("ts")
        is_step = cat == "user_annotation" and str(e.get("name", "")).startswith(STEP_PREFIX)
        inside = isinstance(ts, (int, float)) and start <= ts < end
        if cat in join.HOST_CATS and not is_step:
            if inside:
                donor.append(e)
            continue
        if (cat in LAUNCH_CATS and inside) or (cat in DEVICE_CATS and corr(e) in lent):
            donor.append(copy.deepcopy(e))
        if cat in LAUNCH_CATS or cat in DEVICE_CATS:
            e = dict(e, args={k: v for k, v in (e.get("args") or {}).items() if k != "External id"})
        kept.append(e)
    out = dict(trace, traceEvents=kept)
    out.pop("record_shapes", None)
    return out, donor


def rejoin(trace):
    """A live joined trace joined again with today's join (`as_captured`), its record in the metadata; the
    trace unchanged when it holds no join."""
    made = as_captured(trace)
    if made is None:
        return trace
    device, donor = made
    record = join.join(device["traceEvents"], donor)
    device["autoresearch"] = dict(device["autoresearch"], operators=record)
    device["record_shapes"] = 1
    return device


def compare(path):
    """One fixture's row: (name, joined %, top before, top after, moved findings, tables same?) or None."""
    trace = load_trace(path)
    made = as_device_only(copy.deepcopy(trace))
    if made is None:
        return None
    before = summarize(trace)
    device, donor = made
    record = join.join(device["traceEvents"], donor)
    if any((e.get("args") or {}).get("Input Dims") for e in donor):
        device["record_shapes"] = 1
    after = summarize(device)
    share = 1 - record["unjoined_us"] / record["device_us"] if record["device_us"] else 1.0
    return (os.path.basename(path).removesuffix(".json.gz").removesuffix(".trace"), share,
            top(before), top(after), moved(before, after), tables_same(before, after))


def top(s):
    f = s["findings"][0] if s["findings"] else None
    return f"{f['kind']} {f['ms_per_step']:.1f}" if f else "-"


def moved(a, b):
    """The findings whose claim moved by more than MOVED, as `kind a->b`."""
    ka = {f["kind"]: f["ms_per_step"] for f in a["findings"]}
    kb = {f["kind"]: f["ms_per_step"] for f in b["findings"]}
    out = []
    for k in sorted(set(ka) | set(kb)):
        x, y = ka.get(k), kb.get(k)
        if x is None or y is None or abs(x - y) > MOVED * max(abs(x), abs(y), 0.05):
            out.append(f"{k} {'-' if x is None else f'{x:.2f}'}->{'-' if y is None else f'{y:.2f}'}")
    return out


def tables_same(a, b):
    """Which of the step budget, the regions and the lines differ (empty: all the same)."""
    diff = []
    if {k: round(v, 2) for k, v in a["categories"].items()} != {k: round(v, 2) for k, v in b["categories"].items()}:
        diff.append("budget")
    rows = lambda s, key: [(r.get("name") or r.get("region"), round(r.get("ms_per_step", 0), 2))  # noqa: E731
                           for r in (s.get(key) or {}).get("rows", [])]
    for key in ("regions", "lines"):
        if rows(a, key) != rows(b, key):
            diff.append(key)
    return diff


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="*")
    args = p.parse_args(argv)
    paths = args.traces or sorted(glob.glob(os.path.join(DATA, "*.json.gz")))
    print("| fixture | joined | top before | top after | findings moved | tables differ |")
    print("|---|--:|---|---|---|---|")
    for path in paths:
        try:
            row = compare(path)
        except Exception as e:  # noqa: BLE001 (one fixture's failure is a row, not the end)
            print(f"| {os.path.basename(path)} | error | {type(e).__name__}: {e} | | | |")
            continue
        if row is not None:
            name, share, a, b, m, t = row
            print(f"| {name} | {100 * share:.1f}% | {a} | {b} | {'; '.join(m) or '='} | {', '.join(t) or '='} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
