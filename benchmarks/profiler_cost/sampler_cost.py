"""What the host stack sampler costs the main thread per sample, against what it counts (issue #50).

    python benchmarks/profiler_cost/sampler_cost.py                                   # a host-bound eager
    loop on the CPU python benchmarks/profiler_cost/sampler_cost.py --workload transformer12 --device cuda   
    # capture_cost's eager GPT

The sampler (profiling/profile/capture/sampler.py) counts each sample's own time as its thread's CPU time plus
SWITCH_S for the GIL's two hand-offs, and paces itself on MAIN_PAYS times that count. This times the loop with
the sampler off and on at fixed periods (alternating, --reps times, --steps steps each) and paced at the module's
OWN_SHARE (once per --main-pays): the main thread's real cost per sample is the step's growth over the samples
taken in it. Prints one line per setting and appends them as JSON to OUT/all.jsonl when $OUT is set. Results:
benchmarks/profiler_cost/capture_cost_results.md, section 7.
"""
import argparse
import json
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.common import append_line, timed  # noqa: E402

from profiling.profile.capture import sampler as S  # noqa: E402


def deep_mlp(size, device):
    """A host-bound eager loop: 24 small residual blocks, AdamW (thousands of tiny operators a step)."""
    layers = [torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.ReLU())
              for _ in range(24)]
    model = torch.nn.ModuleList(layers).to(device)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(4, 16, device=device)

    def step():
        h = x
        for layer in model:
            h = h + layer(h)
        h.sum().backward()
        opt.step()
        opt.zero_grad()
    return model, step


def workloads():
    import capture_cost
    return dict(capture_cost.WORKLOADS, deep_mlp=deep_mlp)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="deep_mlp")
    p.add_argument("--device", default="cpu")
    p.add_argument("--size", default="gpu", choices=("gpu", "tiny"))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--periods-ms", type=float, nargs="+", default=[1, 2, 5])
    p.add_argument("--main-pays", type=float, nargs="+", default=[S.MAIN_PAYS],
                   help="paced settings to time, each with this MAIN_PAYS (the module's is the capture's)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    _, step = workloads()[args.workload](args.size, device)
    for _ in range(5):
        step()
    settings = (["off"] + [f"every {ms:g} ms" for ms in args.periods_ms]
                + [f"paced {S.OWN_SHARE:g} x{pays:g}" for pays in args.main_pays])
    module_pays = S.MAIN_PAYS
    got = {k: [] for k in settings}
    for _ in range(args.reps):
        for k in settings:
            if k == "off":
                got[k].append((timed(step, args.steps, device), 0, 0))
                continue
            paced = k.startswith("paced")
            S.MAIN_PAYS = float(k.split("x")[-1]) if paced else module_pays
            s = S.StackSampler(interval=S.INTERVAL_S if paced else float(k.split()[1]) / 1e3, paced=paced)
            s.start()
            s.step(0)
            step()  # its first walks fill the label caches (the capture's warm-up step does the same)
            before, own_before = len(s.samples), s.own_s
            ms = timed(step, args.steps, device)
            taken, own = len(s.samples) - before, s.own_s - own_before
            s.stop()
            S.MAIN_PAYS = module_pays
            got[k].append((ms, taken / args.steps, 1e6 * own / max(1, taken)))
    base = statistics.median(ms for ms, _, _ in got["off"])
    rows = []
    for k in settings:
        ms = statistics.median(r[0] for r in got[k])
        per = statistics.median(r[1] for r in got[k])
        row = {"workload": args.workload, "device": args.device, "setting": k, "ms_per_step": round(ms, 3),
               "over_off_percent": round(100 * (ms / base - 1), 1), "samples_per_step": round(per, 2),
               "main_us_per_sample": round(1e3 * (ms - base) / per) if per else None,
               "counted_us_per_sample": round(statistics.median(r[2] for r in got[k])) if per else None,
               "switch_s": S.SWITCH_S, "python": sys.version.split()[0]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if os.environ.get("OUT"):
        for r in rows:
            append_line(os.path.join(os.environ["OUT"], "all.jsonl"), r)


if __name__ == "__main__":
    main()
