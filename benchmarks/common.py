"""Helpers shared by the benchmark scripts, imported as `benchmarks.common` (a script puts the repository root on
sys.path first): the repository root, step timing (between two syncs, or CUDA events), a bf16 autocast on CUDA,
and the result files (printed `key: value` lines and a JSON file, or one JSON line appended)."""
import contextlib
import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------

def autocast(device):
    """bf16 autocast on CUDA, nothing elsewhere (device: a torch.device)."""
    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def sync(device):
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def timed(step, n, device):
    """ms/step of n steps between two syncs."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return 1e3 * (time.perf_counter() - t0) / n


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


# ---------------------------------------------------------------------------------------------------------
# Result files
# ---------------------------------------------------------------------------------------------------------

def report(results, json_path=None, omit=()):
    """Print `key: value` lines (all but `omit`); write every result to json_path when one is given."""
    for k, v in results.items():
        if k not in omit:
            print(f"{k}: {v}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)


def append_line(path, record):
    """Append one JSON line to path (a .jsonl of results, one per fresh process), creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
