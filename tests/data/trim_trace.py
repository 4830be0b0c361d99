"""Cut a recorded torch.profiler trace down to its first N profiled steps, for a small test fixture.

    uv run python tests/data/trim_trace.py IN.trace.json.gz OUT.trace.json.gz [--steps 2]

Keeps, unchanged: the metadata, the CPU events (operators, runtime calls, annotations) inside the kept
ProfilerStep windows, the device events launched from them (by correlation), and the host samples of those
steps. Drops flow arrows. The data stays real; there is just less of it.

`--thin-first`: also drops the first profiled step's operators, runtime calls and the device events they launched,
keeping its annotations (Dynamo's and Inductor's compile spans among them) and its length: a step profiled while
it compiles holds ~80,000 events of tracing and autotuning, too many for a fixture; the compile is still there.
"""
import argparse
import gzip
import json


HOST = ("cpu_op", "cuda_runtime", "cuda_driver", "python_function")


def thin_first(events):
    """The events without the first ProfilerStep's host operators and calls and what they launched."""
    lo, hi = min((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X"
                 and str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    inside = {id(e) for e in events if e.get("ph") == "X" and e.get("cat") in HOST and lo <= e.get("ts", -1) <= hi}
    gone = {(e.get("args") or {}).get("correlation") for e in events if id(e) in inside} - {None}
    return [e for e in events if id(e) not in inside and not (
        e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and (e.get("args") or {}).get("correlation") in gone)]


def trim(trace, steps, thin=False):
    events = thin_first(trace["traceEvents"]) if thin else trace["traceEvents"]
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X"
                     and str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    lo, hi = windows[0][0], windows[steps - 1][1]
    kept, correlations = [], set()
    device = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
    for e in events:
        if e.get("ph") == "M" or e.get("cat") == "Trace":
            kept.append(e)
        elif e.get("ph") == "X" and e.get("cat") not in device and lo <= e.get("ts", -1) <= hi:
            kept.append(e)
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                correlations.add(c)
    last = max((e["ts"] + e.get("dur", 0) for e in kept if e.get("ph") == "X" and e.get("cat") != "Trace"), default=hi)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and (e.get("args") or {}).get("correlation") in correlations:
            kept.append(e)
            last = max(last, e["ts"] + e["dur"])
        elif e.get("cat") == "gpu_user_annotation" and lo <= e.get("ts", -1) <= hi:
            kept.append(e)
    out = dict(trace, traceEvents=kept)
    meta = dict(trace.get("autoresearch") or {})
    host = meta.get("host_samples")
    if host:
        meta["host_samples"] = dict(host, samples=[s for s in host["samples"] if s[0] < steps])
    if meta.get("syncs"):  # counted over all the profiled steps: keep them per step
        meta["syncs"] = [dict(x, count=round(x["count"] * steps / len(windows))) for x in meta["syncs"]]
    out["autoresearch"] = meta
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--thin-first", action="store_true", help="drop the first step's host events (a compile's)")
    args = p.parse_args()
    with gzip.open(args.input, "rt") as f:
        trace = json.load(f)
    data = json.dumps(trim(trace, args.steps, args.thin_first), separators=(",", ":")).encode()
    with open(args.output, "wb") as f:
        f.write(gzip.compress(data, compresslevel=9, mtime=0))


if __name__ == "__main__":
    main()
