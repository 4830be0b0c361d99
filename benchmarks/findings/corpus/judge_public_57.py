"""What a verdict on #57's public-script traces needs (tests/data/foreign/make/make_public_traces_57.py), per trace:

    PYTHONPATH=. python benchmarks/findings/corpus/judge_public_57.py TRACE [TRACE ...]

The summary's step, idle and one-off time, its checks, notes and every finding (kind, ms per step, evidence and fix
cut short), then the trace's span: its first and last host event, its first and last device event (ms from the
first host event), the host's busy time before and after the device's span, and the longest host gaps there (no
host event running): the seconds a cold, marker-less trace spends outside the GPU's active span.
"""
import sys

from profiling.profile.report.ranks import summarize_path
from profiling.profile.trace.traceio import DEVICE_CATS, read_json

GAPS = 5


def cut(text, n):
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[:n - 1] + "…"


def merged(intervals):
    """The union of (start, end) intervals, sorted."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def span(path):
    """Lines on the trace's host and device spans, in ms from its first host event."""
    evs = [e for e in read_json(path)["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
           and isinstance(e.get("ts"), (int, float))]
    cat = lambda e: str(e.get("cat", "")).lower()
    host = [(e["ts"], e["ts"] + (e.get("dur") or 0)) for e in evs
            if cat(e) not in DEVICE_CATS and not cat(e).startswith("gpu_") and cat(e) != "trace"]
    dev = [(e["ts"], e["ts"] + (e.get("dur") or 0)) for e in evs if cat(e) in DEVICE_CATS]
    if not host:
        return ["  span: no host events"]
    t0 = min(a for a, _ in host)
    ms = lambda t: f"{(t - t0) / 1e3:,.1f}"
    h_end = max(b for _, b in host)
    lines = [f"  host: {len(host)} events, first {ms(t0)} .. last start {ms(max(a for a, _ in host))}, "
             f"end {ms(h_end)} ms"]
    busy = merged(host)
    if not dev:
        lines.append("  device: no device events")
        lo, hi = h_end, h_end
    else:
        lo, hi = min(a for a, _ in dev), max(b for _, b in dev)
        lines.append(f"  device: {len(dev)} events, first {ms(lo)} .. last end {ms(hi)} ms "
                     f"(active span {(hi - lo) / 1e3:,.1f} ms)")
    for what, a, b in (("before the device span", t0, lo), ("after the device span", hi, h_end)):
        if b <= a:
            continue
        on = sum(max(0, min(y, b) - max(x, a)) for x, y in busy)
        lines.append(f"  {what}: {(b - a) / 1e3:,.1f} ms, host events running {on / 1e3:,.1f} ms of it")
    gaps = [(y[0] - x[1], x[1], y[0]) for x, y in zip(busy, busy[1:])]
    outside = sorted((g for g in gaps if g[2] <= lo or g[1] >= hi), reverse=True)[:GAPS]
    lines += [f"  host gap outside the device span: {g / 1e3:,.1f} ms ({ms(a)} .. {ms(b)})" for g, a, b in outside]
    inside = sorted((g for g in gaps if g[1] >= lo and g[2] <= hi), reverse=True)[:2]
    lines += [f"  (host gap inside the device span: {g / 1e3:,.1f} ms ({ms(a)} .. {ms(b)}))" for g, a, b in inside]
    return lines


def judge(path):
    s = summarize_path(path)
    print(f"## {path}")
    print(f"  {s['kind']} on {s['device']}, window {s.get('window')}, {s['steps']} step(s) x {s['step_ms']:,.2f} ms, "
          f"idle {s.get('idle_ms')} ms ({s.get('idle_percent')}%)")
    for n in s.get("notes") or []:
        print(f"  note: {cut(n, 300)}")
    for o in s.get("one_off") or []:
        print(f"  one-off: {cut(o, 300)}")
    for c in s.get("checks") or []:
        print(f"  check {'ok' if c.get('ok') else 'FAILED'}: {c.get('name')}: {cut(c.get('detail'), 200)}")
    for f in s["findings"]:
        print(f"  finding {f['kind']}: {f.get('ms_per_step') or 0:,.2f} ms/step")
        print(f"    evidence: {cut(f.get('evidence'), 300)}")
        print(f"    fix: {cut(f.get('fix'), 200)}")
    if not s["findings"]:
        print(f"  no findings: {cut(s.get('no_findings'), 300)}")
    for u in s.get("unknown") or []:
        print(f"  unknown ({u.get('rule')}): {u.get('ms_per_step')} ms/step, missing {u.get('missing')}")
    for line in span(path):
        print(line)
    print()


if __name__ == "__main__":
    for p in sys.argv[1:]:
        judge(p)
