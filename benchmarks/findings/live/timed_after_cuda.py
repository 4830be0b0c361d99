"""The per-step figure of profiling.Profiler on CUDA, with the steps after the window timed too (issue #56's
"per-step figure within 10% of the loop's measured mean step"): an MLP (1024 -> 4096 -> 1024, fused AdamW) given a
batch of 512, 4096, 16384 or 32768 rows drawn at random every step ("varying"), then of 16384 every step
("steady"); each profiled with the defaults, then 300 more steps timed one by one with CUDA events in the same
process. Prints one JSON line per loop: the steps the profile took, the report's title and its note on the timed
steps, the unprofiled step and the 300 steps' mean. Needs CUDA.

    OUT=/tmp/timed_after python3 benchmarks/findings/live/timed_after_cuda.py

Results: timed_after_results.md.
"""
import json
import os
import random
import time

import torch

import profiling

out = os.environ.get("OUT", "/tmp/timed_after")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters(), fused=True)


def step(n):
    x = torch.randn(n, 1024, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()


for name, sizes in (("varying", [512, 4096, 16384, 32768]), ("steady", [16384])):
    rng = random.Random(0)
    prof = profiling.Profiler(model, out_dir=os.path.join(out, name))
    steps, t0 = 0, time.perf_counter()
    while not prof.done:
        step(rng.choice(sizes))
        prof.step()
        steps += 1
    wall = time.perf_counter() - t0
    ms = []
    for _ in range(300):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(rng.choice(sizes))
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    with open(os.path.join(prof.folder, "summary.json")) as f:
        summary = json.load(f)
    lines = prof.report.splitlines()
    print(json.dumps({"loop": name, "steps": steps, "wall_s": round(wall, 1),
                      "title": next(x for x in lines if x.startswith("# Profile")),
                      "notes": [x for x in lines if x.startswith("note: unprofiled step")],
                      "unprofiled_ms": summary.get("unprofiled_step_ms"), "after_mean_ms": sum(ms) / len(ms),
                      "seconds_after": prof.result.seconds_after}), flush=True)
