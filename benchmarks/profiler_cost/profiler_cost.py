"""The profiler's own cost on scripts this project did not write (issue #41): profiled vs unprofiled step time,
and where the difference goes, one workload per process (a fresh compile each).

Workloads (compiled, bf16 autocast on CUDA; `--size tiny` shrinks each for a CPU smoke run):
    gpt2      GPT-2 124M as nanoGPT's train.py trains it: batch 12 x 1024 tokens, 4 micro-batches a step, fused
              AdamW, gradients clipped to 1.0, the batch copied from pinned host memory, and the loss read with
              .item() every step (nanoGPT's log_interval 1): one sync a step
    resnet50  torchvision's ResNet-50, batch 128 x 3 x 224 x 224, channels_last, SGD with momentum
    bert      transformers' BertForMaskedLM at BERT-base size, batch 32 x 512 tokens, fused AdamW

Each repetition times, in the same process and in turn:
    unprofiled   --timed steps between two device syncs, as the Profiler's timed steps do
    <variant>    the Profiler's window (profiling.profile.capture.window.Window: 1 profiler warm-up step, then --active
                 recorded steps), timed the same way between two syncs, with parts of the capture switched on or
                 off to see what each costs: full (as shipped), before (record_shapes and CUDA's sync debug mode
                 in the recorded steps, as the capture did before issue #41; now they are the untimed step
                 after them), no_sampler (the host stack sampler off), bare (the sampler off: torch.profiler
                 alone), cuda_only and cpu_only (bare with one kind of activity), sampler_5ms (every 5 ms, not 2)
and then runs the public Profiler (defaults) --api times: the report's own profiled-vs-unprofiled figures.
--fresh K runs each workload in K processes: a script profiles once per process, so its first profile counts.

    python benchmarks/profiler_cost/profiler_cost.py OUT --workloads gpt2 resnet50 bert     # on the GPU
    python benchmarks/profiler_cost/profiler_cost.py OUT --size tiny --device cpu --reps 1  # a smoke run

Writes OUT/<workload>.json (every timing) and OUT/<workload>-report.md (the first API profile's report).
"""
import argparse
import contextlib
import functools
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.common import autocast, sync, timed  # noqa: E402,F401  (also used by capture_cost.py)
VARIANTS = ("full", "before", "no_sampler", "bare", "cuda_only", "cpu_only", "sampler_5ms", "no_launch_records",
            "full_no_launch_records")


def gpt2(size, device):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from gpt2_train import GPT2, SIZES
    cfg = SIZES["124m" if size == "gpu" else "tiny"]
    batch, accum = (12, 4) if size == "gpu" else (2, 2)
    model = GPT2(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    forward = torch.compile(model)
    host = torch.randint(cfg.vocab, (accum, batch, cfg.seq_len + 1))
    if device.type == "cuda":
        host = host.pin_memory()
    log = []

    def step():
        for micro in range(accum):
            tokens = host[micro].to(device, non_blocking=True)
            with autocast(device):
                loss = forward(tokens[:, :-1], tokens[:, 1:]) / accum
            loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        log.append(loss.item() * accum)  # nanoGPT reads the loss at every log_interval (1)

    return model, step, dict(tokens_per_step=accum * batch * cfg.seq_len, samples_per_step=accum * batch)


def resnet50(size, device):
    import torchvision
    model = torchvision.models.resnet50().to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    forward = torch.compile(model)
    batch, side = (128, 224) if size == "gpu" else (2, 64)
    x = torch.randn(batch, 3, side, side, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(1000, (batch,), device=device)

    def step():
        with autocast(device):
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step, dict(samples_per_step=batch)


def bert(size, device):
    from transformers import BertConfig, BertForMaskedLM
    config = BertConfig() if size == "gpu" else BertConfig(hidden_size=64, num_hidden_layers=2,
                                                           num_attention_heads=2, intermediate_size=128)
    model = BertForMaskedLM(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    forward = torch.compile(model)
    batch, seq = (32, 512) if size == "gpu" else (2, 64)
    ids = torch.randint(config.vocab_size, (batch, seq), device=device)
    labels = torch.where(torch.rand(batch, seq, device=device) < 0.15, ids, -100)

    def step():
        with autocast(device):
            loss = forward(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step, dict(tokens_per_step=batch * seq, samples_per_step=batch)


WORKLOADS = {"gpt2": gpt2, "resnet50": resnet50, "bert": bert}


@contextlib.contextmanager
def variant(name):
    """The capture with parts switched on or off (see the module's docstring)."""
    from profiling.profile.capture import window
    saved = window.profile, window.StackSampler, window.Window._before_step, window.Window.step
    if name == "before":  # shapes and the sync debug mode in the recorded steps, as before issue #41
        window.profile = _options(saved[0], name)
        window.Window._before_step, window.Window.step = _watched(saved[2], saved[3])
    if name in ("no_sampler", "bare", "cuda_only", "cpu_only"):
        window.StackSampler = _IdleSampler
    if name in ("cuda_only", "cpu_only"):
        window.profile = _options(saved[0], name)
    if name == "sampler_5ms":
        window.StackSampler = functools.partial(saved[1], interval=0.005)
    if name == "no_launch_records":
        window.StackSampler = _IdleSampler
    stack = contextlib.ExitStack()
    if name.endswith("no_launch_records"):
        stack.enter_context(no_launch_records())
    try:
        with stack:
            yield
    finally:
        window.profile, window.StackSampler, window.Window._before_step, window.Window.step = saved


def _options(profile, name):
    """torch.profiler.profile with shapes (before), or with one kind of activity (cuda_only, cpu_only)."""
    def make(*args, **kw):
        kw["record_shapes"] = name == "before"
        keep = {"cuda_only": "CUDA", "cpu_only": "CPU"}.get(name)
        if keep:
            kw["activities"] = [a for a in kw["activities"] if a.name == keep]
        return profile(*args, **kw)
    return make


def _watched(before_step, step):
    """Window methods that keep CUDA's sync debug mode on during each recorded step."""
    def before(self):
        before_step(self)
        if self.warmup <= self.i < self.warmup + self.active:
            self._bench_watch = contextlib.ExitStack()
            self._bench_watch.enter_context(self.syncs.watch(True))

    def after(self):
        watch = getattr(self, "_bench_watch", None)
        if watch is not None:
            watch.close()
            self._bench_watch = None
        return step(self)
    return before, after


@contextlib.contextmanager
def no_launch_records():
    """Inductor's Triton launcher without its per-launch profiler record (a Python dict and a
    `_RecordFunctionFast` around every kernel launch while a profiler runs): only its module sees the
    profiler as off; the compiled graph's call annotation and the CUDA launch records stay."""
    import types

    from torch._inductor.runtime import triton_heuristics
    saved = triton_heuristics.autograd_profiler
    triton_heuristics.autograd_profiler = types.SimpleNamespace(_is_profiler_enabled=False)
    try:
        yield
    finally:
        triton_heuristics.autograd_profiler = saved


class _IdleSampler:
    root = ROOT

    def start(self):
        pass

    def step(self, index):
        pass

    def stop(self):
        pass

    def result(self):
        return None


GC = {"ms": 0.0, "t": None}


def _gc_clock(phase, info):
    """Python's garbage collections' time (a collection of the oldest generation can take 100s of ms)."""
    if phase == "start":
        GC["t"] = time.perf_counter()
    elif GC["t"] is not None:
        GC["ms"] += 1e3 * (time.perf_counter() - GC["t"])


def window_ms(step, active, device):
    """ms/step of the Window's recorded steps, timed between two syncs (after its one warm-up step)."""
    from profiling.profile.capture import window
    window = window.Window(1, active, {"settings": {"recorded": False}}, memory=False)
    step()
    window.step()  # the profiler's warm-up step: not recorded, not timed
    sync(device)
    t0 = time.perf_counter()
    trace, each, t = None, [], t0
    while trace is None:
        step()
        trace = window.step()
        each.append(1e3 * (time.perf_counter() - t))
        t = time.perf_counter()
    each[-1] = 1e3 * (window.t_end - t0) - sum(each[:-1])  # the last one ends at the window's sync
    return 1e3 * (window.t_end - t0) / active, each


FIRST = ("full", "no_sampler", "no_provenance", "prewarm", "bare", "no_launch_records")


@contextlib.contextmanager
def first_variant(name, step, device):
    """The first public Profiler of a process with one part of it changed, to find what a process's first
    profile pays that later ones do not: no_sampler (the host stack sampler off), no_provenance
    (AUTORESEARCH_PROVENANCE=0), prewarm (one throwaway torch.profiler session of one step first: kineto and
    CUPTI set up), bare (the sampler and provenance off: torch.profiler alone, as far as the API allows)."""
    from profiling.profile.capture import window
    saved_sampler, saved_env = window.StackSampler, os.environ.get("AUTORESEARCH_PROVENANCE")
    if name in ("no_sampler", "bare"):
        window.StackSampler = _IdleSampler
    if name in ("no_provenance", "bare"):
        os.environ["AUTORESEARCH_PROVENANCE"] = "0"
    stack = contextlib.ExitStack()
    if name == "no_launch_records":
        stack.enter_context(no_launch_records())
    if name == "prewarm":
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts):
            step()
            sync(device)
    try:
        with stack:
            yield
    finally:
        window.StackSampler = saved_sampler
        if saved_env is None:
            os.environ.pop("AUTORESEARCH_PROVENANCE", None)
        else:
            os.environ["AUTORESEARCH_PROVENANCE"] = saved_env


def api_profile(model, step, sizes, out):
    import profiling
    prof = profiling.Profiler(model, out_dir=out, tokens_per_step=sizes.get("tokens_per_step"))
    while not prof.done:
        step()
        prof.step()
    s = prof.summary
    return {"step_ms": s["step_ms"], "unprofiled_step_ms": s["unprofiled_step_ms"], "folder": prof.folder,
            "step_ms_each": s.get("step_ms_each"), "idle_ms": s.get("idle_ms"),
            "timed_step_ms_each": (s.get("metadata") or {}).get("timed_step_ms_each"),
            "checks": [c for c in s["checks"] if not c["ok"]], "findings": [
                {k: f.get(k) for k in ("kind", "ms_per_step", "fix")} for f in s["findings"][:5]]}


def run(name, args):
    device = torch.device(args.device)
    torch.manual_seed(0)
    model, step, sizes = WORKLOADS[name](args.size, device)
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync(device)
    print(f"{name}: compiled and warmed in {time.perf_counter() - t0:.1f} s", flush=True)
    import gc
    gc.callbacks.append(_gc_clock)
    out = {"workload": name, "size": args.size, "device": torch.cuda.get_device_name() if device.type == "cuda"
           else "cpu", "torch": torch.__version__, **sizes, "unprofiled": [], "api": []}
    for v in args.variants:
        out[v], out[v + "_steps"] = [], []
    for rep in range(args.reps):
        GC["ms"] = 0.0
        out["unprofiled"].append(timed(step, args.timed, device))
        out.setdefault("unprofiled_gc_ms", []).append(round(GC["ms"], 2))
        for v in args.variants:
            GC["ms"] = 0.0
            with variant(v):
                ms, each = window_ms(step, args.active, device)
            out.setdefault(v + "_gc_ms", []).append(round(GC["ms"], 2))
            out[v].append(ms)
            out[v + "_steps"].append(each)
        print(f"{name} rep {rep}: unprofiled {out['unprofiled'][-1]:.2f} ms; "
              + ", ".join(f"{v} {out[v][-1]:.2f} (median step {statistics.median(out[v + '_steps'][-1]):.2f}, gc {out[v + '_gc_ms'][-1]:.0f})"
                          for v in args.variants), flush=True)
    os.environ["AUTORESEARCH_EAGER_LINES"] = "1"
    tmp = tempfile.mkdtemp(prefix="profiler-cost-")
    for rep in range(args.api):
        with first_variant(args.first if rep == 0 else "full", step, device):
            r = api_profile(model, step, sizes, tmp)
        r["variant"] = args.first if rep == 0 else "full"
        r["after_ms"] = timed(step, args.timed, device)  # unprofiled steps after it: does the process stay slow?
        print(f"{name} api {rep} ({r['variant']}): profiled {r['step_ms']:.2f} vs unprofiled "
              f"{r['unprofiled_step_ms']:.2f} ms (each {r['step_ms_each']}, idle {r['idle_ms']}); "
              f"unprofiled after it {r['after_ms']:.2f}", flush=True)
        if rep == 0:
            shutil.copy(os.path.join(r["folder"], "report.md"), os.path.join(args.out, f"{name}{args.tag}-report.md"))
        if args.keep_traces:
            for f in os.listdir(r["folder"]):
                if f.endswith("trace.json.gz"):
                    shutil.copy(os.path.join(r["folder"], f), os.path.join(args.out, f"{name}{args.tag}-api{rep}-{f}"))
        out["api"].append(r)
    shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(out["unprofiled"] or [math.nan])
    out["median_ms"] = {k: statistics.median(out[k]) for k in ["unprofiled"] + args.variants if out[k]}
    out["median_excess_percent"] = {v: round(100 * (out["median_ms"][v] / base - 1), 1) for v in args.variants
                                    if out[v]}
    out["median_step_excess_percent"] = {  # each step's own time: an outlier step weighs no more than one
        v: round(100 * (statistics.median(x for w in out[v + "_steps"] for x in w) / base - 1), 1)
        for v in args.variants if out[v]}
    if out["api"]:
        excess = [100 * (r["step_ms"] / r["unprofiled_step_ms"] - 1) for r in out["api"]]
        out["api_median_excess_percent"] = round(statistics.median(excess), 1)
    with open(os.path.join(args.out, f"{name}{args.tag}.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{name}: excess over unprofiled (median of {args.reps}): {out['median_excess_percent']}; "
          f"median step: {out['median_step_excess_percent']}; "
          f"API: {out.get('api_median_excess_percent')}%", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--size", choices=("gpu", "tiny"), default="gpu")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=3, help="repetitions of the window variants (0: none)")
    p.add_argument("--warmup", type=int, default=8, help="steps before timing (compilation, autotuning); 0: none, so the Profiler is created before the first compiled call, as its docs advise, and compiles in its own warm-up steps")
    p.add_argument("--timed", type=int, default=10, help="unprofiled steps per repetition")
    p.add_argument("--active", type=int, default=5, help="recorded steps per window")
    p.add_argument("--api", type=int, default=3, help="public Profiler runs per workload")
    p.add_argument("--variants", nargs="*", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--first", choices=FIRST, default="full",
                   help="the first API profile of each process with one part changed (see first_variant)")
    p.add_argument("--keep-traces", action="store_true", help="copy each API profile's trace to OUT")
    p.add_argument("--in-process", action="store_true", help="run the workloads here, not one process each")
    p.add_argument("--fresh", type=int, default=1,
                   help="processes per workload (each compiles afresh and profiles as a user's script would)")
    p.add_argument("--tag", default="", help=argparse.SUPPRESS)  # a process's own suffix for its files
    args = p.parse_args(argv)
    os.environ.setdefault("AUTORESEARCH_EAGER_LINES", "0")  # the window variants: no record step after them
    os.makedirs(args.out, exist_ok=True)
    if args.in_process:
        for name in args.workloads:
            run(name, args)
        return 0
    import subprocess
    rc = 0
    for name in args.workloads:  # one process each: a fresh compile, nothing carried over
        for k in range(args.fresh):
            cmd = [sys.executable, os.path.abspath(__file__), args.out, "--workloads", name, "--size", args.size,
                   "--device", args.device, "--in-process", f"--tag=-{args.first}-{k}"]
            cmd += ["--variants", *args.variants] if args.variants else []
            cmd += ["--keep-traces"] if args.keep_traces else []
            cmd += [f"--{a}={getattr(args, a)}" for a in ("reps", "warmup", "timed", "active", "api", "first")]
            rc |= subprocess.call(cmd)
    return rc


if __name__ == "__main__":
    sys.exit(main())
