"""The variant's own process of benchmarks/findings/live/host_side.py (issue #48): build the workload, profile
it through the public API, time it, and write its part of host_side.json into the work folder.

    run_variant(case, variant, args) -> 0     # the part: work/parts/<case>-<variant>[-rank<k>].json
    time_steps(step, warmup, reps, n, device) # every step timed at its edges (CUDA events, no sync)
"""
import gzip
import itertools
import json
import os
import shutil
import statistics
import time

DDP = "lightning_ddp"
# case -> (warm-up steps, timed steps a rep) by default: enough steps for a steady state at each step's cost
STEPS = {"resnet18_pydecode": (5, 10), "convnext_fp32": (3, 5), "t5_small": (3, 10),
         "compile_in_window": (3, 10), DDP: (20, 50)}
# the Profiler's default schedule: warm-up, timed, its own warm-up, active, then shapes, lines, memory
PROFILE_STEPS = 3 + 5 + 1 + 5 + 3


def sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()


def marker(device):
    """A step edge: a CUDA event (read after the run's closing sync; no sync of its own), else the clock."""
    import torch
    if device.type == "cuda":
        def mark():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return mark, lambda a, b: a.elapsed_time(b)
    return time.perf_counter, lambda a, b: 1e3 * (b - a)


def time_steps(step, warmup, reps, n, device):
    """Every step timed at its edges: the warm-up's steps, then `reps` runs of n steps, each between two syncs
    (its ms/step: the run's wall time / n)."""
    mark, ms = marker(device)
    sync(device)
    marks = [mark()]
    for _ in range(warmup):
        step()
        marks.append(mark())
    sync(device)
    out = {"warmup_steps": warmup, "warmup_ms_each": _each(marks, ms), "timed_steps": n,
           "reps_ms_per_step": [], "ms_each": []}
    for _ in range(reps):
        t0 = time.perf_counter()
        marks = [mark()]
        for _ in range(n):
            step()
            marks.append(mark())
        sync(device)
        out["reps_ms_per_step"].append(round(1e3 * (time.perf_counter() - t0) / n, 4))
        out["ms_each"].append(_each(marks, ms))
    return out


def _each(marks, ms):
    return [round(ms(a, b), 4) for a, b in itertools.pairwise(marks)]


def profile(workload, name, args, **options):
    """Profile through the public API from the loop's current step; what host_side.json keeps of it."""
    import profiling
    root = os.path.join(args.work, "profiles", name)
    t0 = time.perf_counter()
    prof = profiling.Profiler(workload.model, out_dir=root, samples_per_step=workload.samples_per_step,
                              tokens_per_step=workload.tokens_per_step,
                              metadata={"benchmark": f"benchmarks/findings/live/host_side.py {name}"}, **options)
    with prof:
        while not prof.done:
            workload.step()
            prof.step()
    out = {"seconds": round(time.perf_counter() - t0, 2), "options": options, "folder": prof.folder}
    return dict(out, **_profile_result(prof.folder, prof.summary, prof.report, name, args))


def _profile_result(folder, summary, report, name, args):
    """The profile's figures and top findings; its trace(s) copied into OUT."""
    if folder is None:
        return {"error": "the profile wrote nothing (see the log)"}
    traces = sorted(f for f in os.listdir(folder) if f.endswith("trace.json.gz"))
    if len(traces) == 1:
        kept = [f"{name}.trace.json.gz"]
        shutil.copy(os.path.join(folder, traces[0]), os.path.join(args.out, kept[0]))
    else:  # a rank folder: its files keep their names, in a folder `research profile` reads whole
        os.makedirs(os.path.join(args.out, name.split("-")[0]), exist_ok=True)
        kept = [os.path.join(name.split("-")[0], f) for f in traces]
        for f, k in zip(traces, kept):
            shutil.copy(os.path.join(folder, f), os.path.join(args.out, k))
    summary = summary or {}
    with gzip.open(os.path.join(args.out, kept[0])) as f:  # what the live capture recorded beside the events
        meta = json.load(f).get("autoresearch") or {}
    sizes = [round(os.path.getsize(os.path.join(args.out, k)) / 2**20, 2) for k in kept]
    return {"traces": kept, "trace_mb": sizes,
            "step_ms": summary.get("step_ms"), "unprofiled_step_ms": summary.get("unprofiled_step_ms"),
            "timed_step_ms_each": meta.get("timed_step_ms_each"), "step_ms_each": summary.get("step_ms_each"),
            "idle_ms": summary.get("idle_ms"),
            "findings": [{k: f.get(k) for k in ("kind", "ms_per_step", "pct_of_step", "fix", "evidence")}
                         for f in (summary.get("findings") or [])[:6]], "report": report}


def run_variant(case, variant, args):
    """One case's variant in this process; its part of the JSON is written to the work folder."""
    import torch
    from host_side_cases import CASES, SkipVariant
    device = torch.device(args.device)
    torch.manual_seed(0)
    part = {"case": case, "variant": variant, "size": args.size, "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    t0 = time.perf_counter()
    try:
        if case == DDP:
            return _run_ddp(variant, args, part, device)
        workload = CASES[case].build(variant, args.size, device, args)
        part["info"] = workload.info
        warmup, timed = steps(case, workload.info, args)
        name = f"{case}-{variant}"
        profiled = variant in CASES[case].profiled and not args.no_profile
        if profiled and args.profile_at == "start":
            part["profile"] = profile(workload, name, args, **_profile_options(case, variant, args))
        part["timing"] = time_steps(workload.step, warmup, args.reps, timed, device)
        if profiled and args.profile_at == "steady":
            part["profile"] = profile(workload, name, args, **_profile_options(case, variant, args))
        _times(part, workload.samples_per_step)
    except SkipVariant as e:
        part["skipped"] = str(e)
    part["seconds"] = round(time.perf_counter() - t0, 1)
    _write_part(part, args)
    return 0


def steps(case, info, args):
    """(warm-up, timed) steps: the flags, else the case's; with loader workers the warm-up outlasts twice the
    prefetch queue (pitfall 17), so the timed steps see the steady state."""
    warmup, timed = STEPS[case]
    warmup = args.warmup if args.warmup is not None else warmup
    loader = info.get("loader") or {}
    if loader.get("num_workers") and args.warmup is None:
        warmup = max(warmup, 2 * loader["num_workers"] * loader["prefetch_factor"] + 4)
    return warmup, args.timed if args.timed is not None else timed


def _profile_options(case, variant, args):
    if (case, variant) != ("compile_in_window", "in_window"):
        return {}
    if not args.unprofiled_ms:
        raise SystemExit("compile_in_window in_window needs --unprofiled-ms (the warm variant's step time: "
                         "run the case through the driver, which runs warm first)")
    return {"warmup_steps": 0, "timed_steps": 0, "profiler_warmup_steps": 0,
            "unprofiled_step_ms": args.unprofiled_ms}


def _times(part, samples):
    reps = part["timing"]["reps_ms_per_step"]
    if reps:
        part["ms_per_step_median"] = round(statistics.median(reps), 4)
        part["samples_per_step"] = samples
        part["samples_per_s"] = round(1e3 * samples / part["ms_per_step_median"], 1)


def _run_ddp(variant, args, part, device):
    from host_side_ddp import lightning_ddp
    warmup, timed = steps(DDP, {}, args)
    total = PROFILE_STEPS + warmup + args.reps * timed
    rank, records, folder, info = lightning_ddp(variant, args.size, device, args, total, args.work)
    part.update(rank=rank, info=info, records=records, warmup_steps=warmup)
    if rank == 0 and folder:
        with open(os.path.join(folder, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(folder, "report.md")) as f:
            report = f.read()
        kept = _profile_result(folder, summary, report, f"{DDP}-{variant}", args)
        part["profile"] = dict(folder=folder, **kept)
    _write_part(part, args, suffix=f"-rank{rank}")
    return 0


def _write_part(part, args, suffix=""):
    path = os.path.join(args.work, "parts", f"{part['case']}-{part['variant']}{suffix}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(part, f, indent=1)
    os.replace(path + ".tmp", path)
