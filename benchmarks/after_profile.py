"""Is a loop slower after a profile, and after which part of it? One fresh process per mode (issue #50).

    python benchmarks/after_profile.py MODE [WORKLOAD]     # appends one JSON line to $OUT/all.jsonl
    DEV=cpu SIZE=tiny python benchmarks/after_profile.py prof_device   # a smoke run

Times the loop (benchmarks/capture_cost.py's workloads, transformer12 by default) unprofiled, 3 x 10 steps,
then does MODE once, then times it again (5 x 10 steps). Modes: none; settrace (a line tracer on and off for
one step); lines_only (this profiler's line-record step); torch_cuda, torch_cpu_cuda (a bare torch.profiler
session of 10 steps: CUDA activity alone, CPU and CUDA); cpu_only_prof (a CPU-only session of one step);
window_device, window_full (this profiler's capture, 8 steps); prof_device, prof_full, prof_device_mem (the
public Profiler, ops="device"/"full", memory off unless `mem`). Results: benchmarks/capture_cost_results.md.
"""
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import capture_cost  # noqa: E402
import profiler_cost  # noqa: E402


def act(mode, model, step, dev, res):
    from torch.profiler import ProfilerActivity as A
    if mode.startswith("prof_"):
        import profiling
        prof = profiling.Profiler(model, out_dir="/tmp/after-" + mode, ops="full" if "full" in mode else "device",
                                  memory="mem" in mode)
        while not prof.done:
            step()
            prof.step()
        res["report_head"] = [line[:300] for line in prof.report.splitlines()
                              if line.startswith(("Recorded", "CHECK", "| profiled vs")) or "note: profiled" in line]
    elif mode in ("torch_cuda", "torch_cpu_cuda"):
        res["in"] = capture_cost.under_torch(step, 10, dev, [A.CUDA] if mode == "torch_cuda" else [A.CPU, A.CUDA])
    elif mode == "lines_only":
        from profiling.profile.capture import eager_record
        eager_record.record(step, lambda: profiler_cost.sync(dev))
    elif mode == "settrace":
        sys.settrace(lambda *a: None)
        step()
        sys.settrace(None)
    elif mode.startswith("window_"):
        res["in"] = capture_cost.under_window(step, 8, dev, mode.split("_")[1])[0]
    elif mode == "cpu_only_prof":
        with torch.profiler.profile(activities=[A.CPU]):
            step()
    elif mode != "none":
        raise SystemExit(f"unknown mode {mode!r}; see this script's docstring")


def main():
    mode = sys.argv[1]
    workload = sys.argv[2] if len(sys.argv) > 2 else "transformer12"
    dev = torch.device(os.environ.get("DEV", "cuda"))
    torch.manual_seed(0)
    model, step = capture_cost.WORKLOADS[workload](os.environ.get("SIZE", "gpu"), dev)
    for _ in range(5):
        step()

    def timed():
        return round(profiler_cost.timed(step, 10, dev), 2)
    res = {"mode": mode, "workload": workload, "env": {k: os.environ[k] for k in ("TEARDOWN_CUPTI",
                                                                                   "AUTORESEARCH_EAGER_LINES")
                                                        if k in os.environ},
           "before": [timed() for _ in range(3)]}
    t0 = time.perf_counter()
    act(mode, model, step, dev, res)
    res["action_s"] = round(time.perf_counter() - t0, 1)
    res["after"] = [timed() for _ in range(5)]
    print(json.dumps(res), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "all.jsonl"), "a") as f:
        f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
