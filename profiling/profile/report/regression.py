"""Pure: the `regression` finding: where the step grew since a reference profile (the best kept run's, or
the one named with --previous/--against). It localizes any cause, with or without a rule. Stdlib only.

    f = regression(previous_summary, current_summary, label="experiment 4 (5c1d0a2)")   # a finding or None

The growth is the device time's (the kernels' time per step: the unprofiled step of one commit moved 13.5 ms
between two runs on a host that could not feed the GPU, its kernels' time 1 ms); the step's own change is in
the evidence (unprofiled when both have one). A host-side regression (a sync, a slow loader) leaves the
kernels' time alone: host_sync and gpu_waits_on_host name those. The evidence lists the regions, lines of train.py (matched by their text, so an edit that
moves lines still matches) and kernels (profiling/profile/report/kernel_match.py: renumbered kernels match; new and
gone ones show as such) that grew most.
"""
from profiling.profile.findings.contract import finding, rule
from profiling.profile.report import render
from profiling.profile.report.summary import diff

MIN_GROWTH = 0.015  # of the reference step: two fresh compiles of one commit (h100-compile-a/-b): kernel time
                    # within 1 ms; one commit's unprofiled step 308.9-311.0 ms over six H100 runs in one call
SHOWN = 3


def _step(s):
    u = s.get("unprofiled_step_ms")
    return (u, "unprofiled") if isinstance(u, (int, float)) and u > 0 else (s.get("step_ms"), "profiled")


def _lines(previous, current):
    """[(where, change ms)] of the lines of train.py, matched by their source text."""
    def table(s):
        return {tuple(x["text"] for x in r["lines"]): r for r in (s.get("lines") or {}).get("rows", [])}
    before, now = table(previous), table(current)
    return sorted(((r["where"], r["ms_per_step"] - (before[k]["ms_per_step"] if k in before else 0.0))
                   for k, r in now.items()), key=lambda x: -x[1])


@rule("regression", needs=("device", "reference"))
def regression(previous, current, label=None):
    """A finding when the step grew by MIN_GROWTH of the reference or more; None otherwise (or when the two
    profiles are of different devices or kinds)."""
    if previous.get("kind") != current.get("kind") or previous.get("device") != current.get("device"):
        return None
    before, now = previous.get("device_ms"), current.get("device_ms")
    (step_b, how_b), (step_n, how_n) = _step(previous), _step(current)
    if how_b != how_n:
        step_b, step_n, how_n = previous.get("step_ms"), current.get("step_ms"), "profiled"
    if not before or not now or not step_b or now - before < MIN_GROWTH * step_b:
        return None
    d = diff(previous, current, top=20)
    regions = [f"{r['name']} {r['change_ms']:+.1f}" for r in d["regions"] if r["change_ms"] > 0][:SHOWN]
    lines = [f"{where} {ms:+.1f}" for where, ms in _lines(previous, current) if ms > 0.5][:SHOWN]
    kernels = [f"`{k['name']}` {k['change_ms']:+.1f}" + (" (new)" if not k["previous"] else "")
               for k in sorted(d["kernels"], key=lambda k: -k["change_ms"]) if k["change_ms"] > 0][:SHOWN]
    gone = [f"`{k['name']}`" for k in d["kernels"] if k["previous"] and not k["current"]][:2]
    since = label or (f"commit {previous.get('commit')}" if previous.get("commit") else "the reference profile")
    evidence = (f"the kernels' time grew {now - before:+.1f} ms/step ({before:.1f} -> {now:.1f}) since {since}, the "
                f"{how_n} step {step_n - step_b:+.1f} ms ({step_b:.1f} -> {step_n:.1f})"
                + (f"; regions (ms/step): {', '.join(regions)}" if regions else "")
                + (f"; lines: {', '.join(lines)}" if lines else "")
                + (f"; kernels: {', '.join(kernels)}" if kernels else "")
                + (f"; gone: {', '.join(gone)}" if gone else ""))
    if d["gpu_memory"]:
        evidence += "; " + render.memory_line(d["gpu_memory"])
    changed = settings_changed(previous, current)
    evidence += f"; process settings changed since then: {', '.join(changed)}" if changed else ""
    where = f"the change at {lines[0].rsplit(' ', 1)[0]}" if lines else "what changed since then"
    where = f"the settings that changed ({', '.join(changed)}), then {where}" if changed else where
    return finding("regression", now - before, {"step": current["step_ms"]}, evidence,
                   f"undo or rework {where} (the lines and kernels above are where the time went), unless what "
                   "it buys is worth the time")


def _clock(s):
    state = (s.get("device_state") or {}).get("end") or {}
    return state.get("sm_mhz")


def bound_settings(previous, current, label=None):
    """A `setting` finding whose setting changed since the reference claims at most the step's growth since
    then: the reference ran without it, so undoing it cannot save more than the step grew (when nothing else made
    the step faster). The estimate from one trace can be higher: it models the clock a GPU left idle by the
    setting gives back once busy (findings/power.py) but not, say, a kernel mix that draws less power."""
    (step_b, how_b), (step_n, how_n) = _step(previous), _step(current)
    if how_b != how_n or not step_b or not step_n or step_n <= step_b:
        return
    growth = step_n - step_b
    names = [c.split(" ", 1)[0] for c in settings_changed(previous, current)]
    since = label or (f"commit {previous.get('commit')}" if previous.get("commit") else "the reference profile")
    clocks = (_clock(current), _clock(previous))
    for f in current.get("findings", []):
        if f["kind"] != "setting" or f["ms_per_step"] <= growth or not f["evidence"].startswith(
                tuple(n + "=" for n in names)):  # a setting finding opens with name=value (settings._phrase)
            continue
        f["evidence"] += (f"; at most the {how_n} step's growth since {since}, which ran without it: "
                          f"{growth:.1f} ms/step (from this trace alone {f['ms_per_step']:.1f} ms"
                          + (f"; SM clock {clocks[0]} MHz here, {clocks[1]} MHz then: kernels run faster on a GPU "
                             "the setting leaves idle" if all(clocks) else "") + ")")
        f["pct_of_step"] = round(f["pct_of_step"] * growth / f["ms_per_step"], 1)
        f["ms_per_step"] = round(growth, 2)


def add(current, previous, label=None):
    """current["findings"] with the regression finding (if any) in its place by cost, a setting that changed
    since the reference bounded by the step's growth (bound_settings); returns current."""
    bound_settings(previous, current, label)
    f = regression(previous, current, label)
    if f:
        found = [x for x in current.get("findings", []) if x["kind"] != "profiler_overhead"]
        rest = [x for x in current.get("findings", []) if x["kind"] == "profiler_overhead"]
        current["findings"] = sorted(found + [f], key=lambda x: -x["ms_per_step"]) + rest
    return current


def settings_changed(previous, current):
    """`name old -> new` for each process setting the user set (profiling/profile/trace/settings.py) whose value
    differs between the two profiles; [] when either recorded none."""
    def own(s):
        record = s.get("settings") or {}
        if not record.get("recorded"):
            return None
        return {r["name"]: r["value"] for r in record.get("differs") or () if r.get("by") == "user"}
    before, now = own(previous), own(current)
    if before is None or now is None:
        return []
    return [f"{name.removeprefix('env.')} {before.get(name, 'default')} -> {now.get(name, 'default')}"
            for name in sorted(set(before) | set(now)) if before.get(name) != now.get(name)]
