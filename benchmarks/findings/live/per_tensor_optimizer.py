"""Is the per_tensor_optimizer finding priced at what fused=True recovers? (issue #56, the CPU's new-user loop with
an unfused optimizer). Each run is a fresh process: an MLP trained by AdamW as CPU tensors get it by default (tensor
by tensor), its unprofiled step timed against the same loop with fused=True (alternating blocks of steps, medians),
then the default loop profiled through profiling.profile_steps and the finding's price read.

    python benchmarks/findings/live/per_tensor_optimizer.py --runs 3          # both shapes, a table
    python benchmarks/findings/live/per_tensor_optimizer.py --one 64 24        # one run, its JSON line
CPU only (on CUDA, AdamW defaults to foreach and this finding is not the CPU's rule).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SHAPES = ((64, 24), (256, 12))   # (width, blocks): 98 and 50 parameter tensors
BLOCKS, STEPS = 5, 20            # alternating blocks of unprofiled steps per variant


def one(width, depth):
    sys.path.insert(0, ROOT)
    import torch
    import torch.nn as nn

    import profiling
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())],
                          nn.Linear(width, 10))
    x, y = torch.randn(32, width), torch.randint(0, 10, (32,))
    opts = {"default": torch.optim.AdamW(model.parameters(), lr=1e-4),
            "fused": torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)}

    def step(opt):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    times = {k: [] for k in opts}
    for k in opts:
        for _ in range(5):
            step(opts[k])
    for _ in range(BLOCKS):
        for k, opt in opts.items():
            for _ in range(STEPS):
                start = time.perf_counter()
                step(opt)
                times[k].append(1e3 * (time.perf_counter() - start))
    ms = {k: statistics.median(v) for k, v in times.items()}
    with tempfile.TemporaryDirectory() as out:
        summary = profiling.profile_steps(lambda: step(opts["default"]), model, out_dir=out).summary
    found = [f for f in summary["findings"] if f["kind"] == "per_tensor_optimizer"]
    price = found[0]["ms_per_step"] if found else None
    gain = ms["default"] - ms["fused"]
    return {"width": width, "blocks": depth, "default_ms": round(ms["default"], 3), "fused_ms": round(ms["fused"], 3),
            "gain_ms": round(gain, 3), "price_ms": price, "price_vs_gain": round(price / gain, 3) if price else None,
            "top": summary["findings"][0]["kind"] if summary["findings"] else None,
            "load": round(os.getloadavg()[0], 2)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--one", nargs=2, type=int, metavar=("WIDTH", "BLOCKS"))
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(one(*a.one)), flush=True)
        return 0
    print("| width x blocks | default ms | fused ms | gain | price | price/gain | top finding | load |")
    print("|---|--:|--:|--:|--:|--:|---|--:|")
    for _ in range(a.runs):
        for width, depth in SHAPES:
            run = subprocess.run([sys.executable, __file__, "--one", str(width), str(depth)], capture_output=True,
                                 text=True, timeout=600)
            r = json.loads(run.stdout.strip().splitlines()[-1])
            print(f"| {width} x {depth} | {r['default_ms']} | {r['fused_ms']} | {r['gain_ms']} | {r['price_ms']} | "
                  f"{r['price_vs_gain']} | {r['top']} | {r['load']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
