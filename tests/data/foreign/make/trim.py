"""Trims a torch.profiler trace for the corpus (SOURCES.md): its first steps, or its first host events when it has
no ProfilerStep markers, with the device events they launched; top-level metadata kept; gzip level 9.

    python trim.py SRC DST STEPS   # STEPS: 0 = no markers, cut the host timeline; "copy" = whole, re-gzipped
    DROP_FLOWS=1 ...             # also drop flow arrows and instant events (the summary reads neither)
    DROP_PY=1 ...                # also drop python_function frames other than nn.Module scopes, and
                                 # cpu_instant_event (for one-step traces too big with them)
    LIMIT=150000 ...             # gzipped bytes to fit (default 280,000)
    DROP_PY=2 ...                # as DROP_PY=1, but the Python frames inside DataLoader spans are kept (the
                                 # input pipeline's own lines: the dataset's __getitem__, transforms, collate)
    FROM_STEP=3 ...              # start at the 3rd ProfilerStep (host events before it dropped): a later,
                                 # steadier window than the first
    CUT_MS=500 ...               # end the window 500 ms after the first kept step's start, and clip the step
                                 # markers there (a one-step trace too big whole: its first iterations kept)
"""
import gzip
import json
import os
import sys

from profiling.profile.trace.traceio import DEVICE_CATS, read_json

DROP_FLOWS = bool(os.environ.get("DROP_FLOWS"))
DROP_PY = int(os.environ.get("DROP_PY") or 0)
FROM_STEP = int(os.environ.get("FROM_STEP") or 1)
CUT_MS = float(os.environ.get("CUT_MS") or 0)
LIMIT = int(os.environ.get("LIMIT", 280_000))

def dev(e):
    return str(e.get("cat", "")).lower() in DEVICE_CATS

def corr(e):
    a = e.get("args")
    return a.get("correlation") if isinstance(a, dict) else None

def cut(trace, end, start=float("-inf")):
    """Host events starting in [start, end]; device events launched by them; flows within the kept span."""
    evs = trace["traceEvents"]
    keep, corrs, hi = [], set(), end
    for e in evs:
        if not isinstance(e, dict): continue
        ph = e.get("ph")
        if ph == "M" or str(e.get("cat", "")).lower() == "trace":
            keep.append(e); continue
        if ph == "X" and not dev(e) and not str(e.get("cat","")).lower().startswith("gpu_"):
            if isinstance(e.get("ts"), (int, float)) and start <= e["ts"] <= end:
                keep.append(e)
                if corr(e) is not None: corrs.add(corr(e))
    for e in evs:
        if isinstance(e, dict) and e.get("ph") == "X" and dev(e) and (corr(e) in corrs if corr(e) is not None else start <= e.get("ts", 0) <= end):
            keep.append(e); hi = max(hi, e["ts"] + (e.get("dur") or 0))
    lo = start if start == float("-inf") else min([start] + [e["ts"] for e in keep if dev(e)])
    for e in evs:
        if isinstance(e, dict) and e.get("ph") not in ("X", "M") and isinstance(e.get("ts"), (int, float)) and lo <= e["ts"] <= hi:
            keep.append(e)
        elif isinstance(e, dict) and e.get("ph") == "X" and str(e.get("cat","")).lower().startswith("gpu_") and lo <= e.get("ts", 0) <= hi:
            keep.append(e)
    if DROP_FLOWS:  # flow arrows (ac2g, fwdbwd) and instant events: the summary reads neither
        keep = [e for e in keep if e.get("ph") in ("X", "M")]
    if DROP_PY:  # Python frames: only the module scopes (regions read them) are kept
        loads = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in keep if DROP_PY == 2 and e.get("ph") == "X"
                 and "DataLoader" in str(e.get("name", "")) and e.get("cat") != "python_function"]
        def frame(e):
            if e.get("cat") != "python_function" or str(e.get("name", "")).startswith("nn.Module:"):
                return False
            return not any(a <= e.get("ts", 0) <= b for a, b in loads)
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
    if steps and marks and CUT_MS:
        start = marks[FROM_STEP - 1][0]
        end = start + CUT_MS * 1000
        r = cut(t, end, start if FROM_STEP > 1 else float("-inf"))
        for e in r["traceEvents"]:  # the step markers end where the window ends
            if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X" and e["ts"] < end < e["ts"] + e["dur"]:
                e["dur"] = round(end - e["ts"], 3)
        s = size(r)
        how = f"step {FROM_STEP} of {len(marks)} cut at {CUT_MS:g} ms (its marker clipped there)"
    elif steps and marks:
        first = FROM_STEP - 1
        start = marks[first][0] if first else float("-inf")
        for k in range(min(steps, len(marks) - first), 0, -1):
            r = cut(t, marks[first + k - 1][1], start); s = size(r)
            if s <= limit: break
        how = (f"steps {first + 1}-{first + k}" if first else f"first {k}") + f" of {len(marks)} ProfilerStep windows"
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
