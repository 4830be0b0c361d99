"""Time load + summarize + render of a profile trace (the pure part of `--profile` and `research profile`).

    uv run python benchmarks/report_speed/profile_summary.py [TRACE] [--repeat N]

Default TRACE: the H100 fixture (compiled 8-layer GPT, 2 warm-up + 5 active steps). Also times a trace four
times its size (four time-shifted copies of it: 20 steps), to show how the cost grows. Results are noted in
benchmarks/report_speed/profile_summary_results.md.
"""
import argparse
import gzip
import json
import os
import statistics
import tempfile
import time

from profiling.profile.report import render, summary

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "h100-compiled-gpt-5steps.trace.json.gz")


def scaled(trace, copies):
    """`copies` time-shifted copies of the trace's events, with fresh correlations and step numbers."""
    events = trace["traceEvents"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    shift = max(ts) - min(ts) + 1000.0
    out = []
    for i in range(copies):
        for e in events:
            e = json.loads(json.dumps(e))
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += i * shift
            if isinstance(e.get("args"), dict) and "correlation" in e["args"]:
                e["args"]["correlation"] += i * 10_000_000
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + 100 * i}"
            if e.get("cat") != "Trace":
                out.append(e)
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
            "ts": min(ts) - 1.0, "dur": copies * shift}
    return {**trace, "traceEvents": out + [span]}


def timed(path, repeat):
    stages = {"load": [], "summarize": [], "render": [], "total": []}
    for _ in range(repeat):
        t0 = time.perf_counter()
        trace = summary.load_trace(path)
        t1 = time.perf_counter()
        s = summary.summarize(trace)
        t2 = time.perf_counter()
        render.to_markdown(s, previous=s)
        render.to_json(s)
        t3 = time.perf_counter()
        for key, dt in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
            stages[key].append(dt)
    return {k: (1e3 * statistics.median(v), 1e3 * min(v)) for k, v in stages.items()}, len(trace["traceEvents"])


def report(label, path, repeat):
    stats, n = timed(path, repeat)
    size = os.path.getsize(path) / 1e6
    cells = ", ".join(f"{k} {med:.0f} ms (min {lo:.0f})" for k, (med, lo) in stats.items())
    print(f"{label}: {n} events, {size:.2f} MB gzip: {cells}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=FIXTURE)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    report(os.path.basename(args.trace), args.trace, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        big = os.path.join(tmp, "x4.trace.json.gz")
        with gzip.open(big, "wt", compresslevel=1) as f:
            json.dump(scaled(summary.load_trace(args.trace), 4), f)
        report("same trace x4 (20 steps)", big, max(1, args.repeat // 2))


if __name__ == "__main__":
    main()
