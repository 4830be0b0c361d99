"""Helpers shared by the benchmark scripts: a CUDA-event timer and the printed/JSON result block."""
import json


def cuda_median_ms(fn, reps=10, warmup=3):
    """Median over `reps` runs of fn() in milliseconds, timed with CUDA events after `warmup` runs."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def report(results, json_path=None, omit=()):
    """Print `key: value` lines (all but `omit`); write every result to json_path when one is given."""
    for k, v in results.items():
        if k not in omit:
            print(f"{k}: {v}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
