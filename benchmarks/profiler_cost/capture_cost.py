"""What a profiled step costs (issue #50): this profiler's window, device-only and full, against torch.profiler's
own CUDA-only and CPU+CUDA sessions and the unprofiled step, in one process, alternating.

    python benchmarks/profiler_cost/capture_cost.py OUT --workloads gpt2 hf_gpt2 transformer12 t5_small
    resnet18_w8 resnet50 python benchmarks/profiler_cost/capture_cost.py OUT --size tiny --device cpu --reps 1
    --steps 2   # a smoke run python benchmarks/profiler_cost/capture_cost.py OUT --workloads t5_small
    --variants unprofiled torch_cuda device   # a subset

Workloads (bf16 autocast on CUDA):
    gpt2           GPT-2 124M as nanoGPT's train.py trains it (benchmarks/profiler_cost/profiler_cost.py:
    compiled, 4 micro-batches
                   of 12 x 1024, fused AdamW, clipping, the loss read with .item() every step)
    hf_gpt2        transformers' GPT2LMHeadModel (124M), eager, batch 8 x 512, AdamW (a plain loop, not the Trainer)
    transformer12  a 12-layer GPT (width 512, 8 heads, vocab 8192) eager, batch 16 x 256, AdamW (a plain loop, not
                   Lightning)
    t5_small       transformers' T5 at t5-small's sizes, eager, batch 32, 512 -> 128 tokens
                   (benchmarks/findings/live/host_side_cases.py)
    resnet18_w8    torchvision's ResNet-18, channels_last, a Dataset decoding JPEGs in Python, 8 loader workers
                   (benchmarks/findings/live/host_side_cases.py)
    resnet50       torchvision's ResNet-50, compiled, channels_last, batch 128
    (benchmarks/profiler_cost/profiler_cost.py)

Each repetition times --steps steps, in turn: unprofiled; under torch.profiler with CUDA activity alone
(`torch_cuda`) and with CPU and CUDA activity (`torch_cpu_cuda`; no shapes, no stacks), each session's first
step left out; this profiler's window with ops="device" (`device`, the default) and ops="full" (`full`), after
its one warm-up step (--variants: a subset). Every timing runs between two device syncs. Writes
OUT/<workload>-<process>.json and appends each to OUT/all.jsonl.

TEARDOWN_CUPTI=1 (unless set): kineto then releases CUPTI when each session ends; without it the steps after a
session run slower (profiling/profile/capture/cupti.py), and the next repetition's unprofiled steps with them;
this profiler holds it at "0" through its own sessions and puts it back. After each session one untimed step
(`settle`) lets the teardown finish before the next session starts.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402
from benchmarks.findings.live import host_side_cases  # noqa: E402
from benchmarks.profiler_cost import profiler_cost  # noqa: E402

VARIANTS = ("unprofiled", "torch_cuda", "torch_cpu_cuda", "device", "full")


def hf_gpt2(size, device):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config() if size == "gpu" else GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=128)
    model = GPT2LMHeadModel(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq = (8, 512) if size == "gpu" else (2, 16)
    ids = torch.randint(config.vocab_size, (batch, seq), device=device)

    def step():
        with common.autocast(device):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


def transformer12(size, device):
    vocab, d, layers, heads, batch, seq = (8192, 512, 12, 8, 16, 256) if size == "gpu" else (128, 32, 2, 2, 2, 16)
    model = host_side_cases.SmallGPT(vocab, d, layers, heads).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    idx = torch.randint(vocab, (batch, seq + 1), device=device)

    def step():
        with common.autocast(device):
            loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


def from_cases(case, variant):
    def make(size, device):
        args = argparse.Namespace(batch=None, side=None, images=None)
        w = case(variant, size, device, args)
        return w.model, w.step
    return make


WORKLOADS = {"gpt2": lambda s, d: profiler_cost.gpt2(s, d)[:2], "hf_gpt2": hf_gpt2, "transformer12": transformer12,
             "t5_small": from_cases(host_side_cases.t5_small, "default"),
             "resnet18_w8": from_cases(host_side_cases.resnet18_pydecode, "workers_8"),
             "resnet50": lambda s, d: profiler_cost.resnet50(s, d)[:2]}


def under_torch(step, n, device, activities):
    """ms/step of n steps inside a torch.profiler session (its first step left out)."""
    from torch.profiler import profile
    with profile(activities=activities):
        step()
        ms = common.timed(step, n, device)
    return ms


def settle(step, device):
    """One untimed step after a session: CUDA calls, in one of which kineto's CUPTI teardown (TEARDOWN_CUPTI=1)
    finalizes; a next session configured before it waits for it."""
    common.timed(step, 1, device)


class _NoSampler:
    """A stand-in for the window's stack sampler (--no-sampler: what the sampler costs)."""

    def __init__(self, *args, **kwargs):
        from profiling.profile.capture.sampler import StackSampler
        self._real = StackSampler()

    def start(self): pass

    def stop(self): pass

    def step(self, index): pass

    def __getattr__(self, name):
        return getattr(self._real, name)


def under_window(step, n, device, ops, sampler=True):
    """ms/step of this profiler's n recorded steps (after its warm-up step), and the join's record."""
    from profiling.profile.capture import window
    saved = window.StackSampler
    if not sampler:
        window.StackSampler = _NoSampler
    try:
        w = window.Window(1, n, {"settings": {"recorded": False}}, memory=False, ops=ops)
    finally:
        window.StackSampler = saved
    step()
    w.step()  # the profiler's warm-up step: not recorded, not timed
    common.sync(device)
    t0 = time.perf_counter()
    trace = None
    while trace is None:
        step()
        trace = w.step()
    meta = trace["autoresearch"]
    return 1e3 * (w.t_end - t0) / n, {"operators": meta.get("operators"), "sampler_ms": meta["host_samples"].get(
        "own_ms") if meta.get("host_samples") else None, "sample_interval_ms": (meta.get("host_samples") or {}).get(
        "interval_ms")}


def run(name, args):
    from torch.profiler import ProfilerActivity
    device = torch.device(args.device)
    torch.manual_seed(0)
    _, step = WORKLOADS[name](args.size, device)
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    common.sync(device)
    acts = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    both = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out = {"workload": name, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "warm_s": round(time.perf_counter() - t0, 1), "steps": args.steps,
           **{v: [] for v in VARIANTS}, "join": []}
    timers = {"torch_cuda": lambda: under_torch(step, args.steps, device, acts),
              "torch_cpu_cuda": lambda: under_torch(step, args.steps, device, both),
              "device": lambda: under_window(step, args.steps, device, "device"),
              "device_no_sampler": lambda: under_window(step, args.steps, device, "device", sampler=False),
              "full": lambda: under_window(step, args.steps, device, "full")}
    chosen = [v for v in args.variants if v != "unprofiled"] + ["device_no_sampler"] * args.no_sampler
    for _ in range(args.reps):
        out["unprofiled"].append(common.timed(step, args.steps, device))
        for v in chosen:
            got = timers[v]()
            ms, record = got if isinstance(got, tuple) else (got, None)
            out.setdefault(v, []).append(ms)
            if v == "device":
                out["join"].append(record)
            settle(step, device)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    base = statistics.median(out["unprofiled"])
    variants = [v for v in VARIANTS + ("device_no_sampler",) if out.get(v)]
    out["median_ms"] = {v: round(statistics.median(out[v]), 3) for v in variants}
    out["over_unprofiled_percent"] = {v: round(100 * (out["median_ms"][v] / base - 1), 1) for v in variants[1:]}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--process", default="0", help="a label for this process's files (the fresh-process index)")
    p.add_argument("--size", default="gpu", choices=("gpu", "tiny"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                   help="what to time in each repetition (the unprofiled steps always)")
    p.add_argument("--no-sampler", action="store_true",
                   help="also time device mode with the stack sampler left out (`device_no_sampler`)")
    args = p.parse_args(argv)
    os.environ.setdefault("TEARDOWN_CUPTI", "1")  # see the docstring
    os.makedirs(args.out, exist_ok=True)
    for name in args.workloads:
        out = run(name, args)
        with open(os.path.join(args.out, f"{name}-{args.process}.json"), "w") as f:
            json.dump(out, f, indent=1)
        common.append_line(os.path.join(args.out, "all.jsonl"), dict(out, process=args.process))  # every process's
        print(name, args.process, out["median_ms"], out["over_unprofiled_percent"], flush=True)


if __name__ == "__main__":
    main()
