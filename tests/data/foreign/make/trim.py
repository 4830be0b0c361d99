"""Trims a torch.profiler trace for the corpus (SOURCES.md): its first steps, or its first host events when it has
no ProfilerStep markers, with the device events they launched; top-level metadata kept; gzip level 9.

    python trim.py SRC DST STEPS   # STEPS: 0 = no markers, cut the host timeline; "copy" = whole, re-gzipped
    DROP_FLOWS=1 ...             # also drop flow arrows and instant events (the summary reads neither)
    DROP_PY=1 ...                # also drop python_function frames other than nn.Module scopes, and
                                 # cpu_instant_event (for one-step traces too big with them)
    LIMIT=150000 ...             # gzipped bytes to fit (default 280,000)
"""
import gzip
import json
import os
import sys

from profiling.profile.trace.traceio import DEVICE_CATS, read_json

DROP_FLOWS = bool(os.environ.get("DROP_FLOWS"))
DROP_PY = bool(os.environ.get("DROP_PY"))
LIMIT = int(os.environ.get("LIMIT", 280_000))

def dev(e):
    return str(e.get("cat", "")).lower() in DEVICE_CATS

def corr(e):
    a = e.get("args")
    return a.get("correlation") if isinstance(a, dict) else None

def cut(trace, end):
    """Host events starting before `end`; device events launched by them; flows within the kept span."""
    evs = trace["traceEvents"]
    keep, corrs, hi = [], set(), end
    for e in evs:
        if not isinstance(e, dict): continue
        ph = e.get("ph")
        if ph == "M" or str(e.get("cat", "")).lower() == "trace":
            keep.append(e); continue
        if ph == "X" and not dev(e) and not str(e.get("cat","")).lower().startswith("gpu_"):
            if isinstance(e.get("ts"), (int, float)) and e["ts"] <= end:
                keep.append(e)
                if corr(e) is not None: corrs.add(corr(e))
    for e in evs:
        if isinstance(e, dict) and e.get("ph") == "X" and dev(e) and (corr(e) in corrs if corr(e) is not None else e.get("ts", 0) <= end):
            keep.append(e); hi = max(hi, e["ts"] + (e.get("dur") or 0))
    for e in evs:
        if isinstance(e, dict) and e.get("ph") not in ("X", "M") and isinstance(e.get("ts"), (int, float)) and e["ts"] <= hi:
            keep.append(e)
        elif isinstance(e, dict) and e.get("ph") == "X" and str(e.get("cat","")).lower().startswith("gpu_") and e.get("ts", 0) <= hi:
            keep.append(e)
    if DROP_FLOWS:  # flow arrows (ac2g, fwdbwd) and instant events: the summary reads neither
        keep = [e for e in keep if e.get("ph") in ("X", "M")]
    if DROP_PY:  # Python frames: only the module scopes (regions read them) are kept
        def frame(e):
            return e.get("cat") == "python_function" and not str(e.get("name", "")).startswith("nn.Module:")
        keep = [e for e in keep if not (e.get("cat") == "cpu_instant_event" or frame(e))]
    out = {k: v for k, v in trace.items() if k != "traceEvents"}
    out["traceEvents"] = keep
    return out

def size(t):
    return len(gzip.compress(json.dumps(t, separators=(",", ":")).encode(), 9))

def main(src, dst, steps, limit=LIMIT):
    t = read_json(src)
    evs = [e for e in t["traceEvents"] if isinstance(e, dict)]
    marks = sorted((e["ts"], e["ts"] + e["dur"]) for e in evs if e.get("ph") == "X" and str(e.get("name","")).startswith("ProfilerStep#") and not str(e.get("cat","")).startswith("gpu_"))
    if steps and marks:
        for k in range(min(steps, len(marks)), 0, -1):
            r = cut(t, marks[k - 1][1]); s = size(r)
            if s <= limit: break
        how = f"first {k} of {len(marks)} ProfilerStep windows"
    else:
        host = sorted(e["ts"] for e in evs if e.get("ph") == "X" and not dev(e) and isinstance(e.get("ts"), (int, float)) and str(e.get("cat","")).lower() != "trace")
        lo, hi = 0, len(host) - 1
        while lo < hi:  # the most host events that fit
            mid = (lo + hi + 1) // 2
            if size(cut(t, host[mid])) <= limit: lo = mid
            else: hi = mid - 1
        r = cut(t, host[lo]); s = size(r)
        how = f"host events up to the {lo + 1}th of {len(host)} by start"
    with open(dst, "wb") as f:
        f.write(gzip.compress(json.dumps(r, separators=(",", ":")).encode(), 9))
    print(dst, s, how, f"{len(r['traceEvents'])} of {len(t['traceEvents'])} events")

def copy(src, dst):
    t = read_json(src)
    with open(dst, "wb") as f:
        f.write(gzip.compress(json.dumps(t, separators=(",", ":")).encode(), 9))
    print(dst, size(t), "whole", len(t["traceEvents"]))

if __name__ == "__main__":
    if sys.argv[3] == "copy": copy(sys.argv[1], sys.argv[2])
    else: main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
