"""Capture the two example models this project did not design (examples/gpt2_train.py, examples/llama_train.py),
clean and planted, for a GPU session: what the profiler reports on them, the plain torch.profiler traces an
outside user would record of the same runs, and the unprofiled step time of each, to check both against.

Each model and variant (clean, then the model's plant), every run its own process (a fresh compile, nothing
carried over from the run before), under OUT/<model>/<variant>/:
    timed     --timed-runs unprofiled runs of --steps steps; each one's ms/step (the trainer's last line,
              the second half of its steps) goes to OUT/timings.json; logs timed-<k>.log
    api       --profile api/: profiling.Profiler's report.md, summary.json and trace; log api.log
    plain     --plain-trace plain.trace.json (torch.profiler: wait 1, warmup 1, active 3), then
              `research profile` of it -> plain_report.md; log plain.log

    python benchmarks/findings/live/models_capture.py OUT                     # both models at GPU size,
    compiled (H100) python benchmarks/findings/live/models_capture.py OUT --models llama --variants repeat_kv 
     # one part per command python benchmarks/findings/live/models_capture.py OUT --dry-run           # print
     the commands, run nothing

Both models at GPU size take more than one 10-minute command: run them in parts; timings.json is updated, not
replaced, so the parts add up.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODELS = {  # name: (trainer, its GPU size, its plant)
    "gpt2": ("examples/gpt2_train.py", "124m", "dense_mask"),
    "llama": ("examples/llama_train.py", "small", "repeat_kv"),
}
MS_PER_STEP = re.compile(r"; ([0-9.]+) ms/step over the last (\d+)$", re.M)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="output folder (created)")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--variants", nargs="+", help="clean and/or plant names (default: clean and each model's plant)")
    p.add_argument("--size", choices=("gpu", "tiny"), default="gpu", help="gpu: each model's GPU size")
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-compile", action="store_true", help="eager (default: torch.compile, as on a GPU)")
    p.add_argument("--timed-runs", type=int, default=3, help="unprofiled runs per variant")
    p.add_argument("--steps", type=int, default=40, help="steps of each unprofiled run (the second half timed)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    known = {"clean"} | {plant for _, _, plant in MODELS.values()}
    for v in args.variants or ():
        if v not in known:
            p.error(f"unknown variant {v!r}; known: {', '.join(sorted(known))}")
    if args.timed_runs < 1 or args.steps < 2:
        p.error("--timed-runs needs 1 or more, --steps 2 or more")
    args.out = os.path.abspath(args.out)  # the runs start in the repository's root
    return args


def plan(args):
    """[(model, variant, kind, command, log path)]: every process this capture runs, in order."""
    runs = []
    for model in args.models:
        trainer, gpu_size, plant = MODELS[model]
        for variant in ("clean", plant):
            if args.variants and variant not in args.variants:
                continue
            folder = os.path.join(args.out, model, variant)
            base = [sys.executable, trainer, "--size", gpu_size if args.size == "gpu" else "tiny",
                    "--device", args.device] + ([] if args.no_compile else ["--compile"])
            base += [] if variant == "clean" else ["--plant", variant]
            for k in range(args.timed_runs):
                runs.append((model, variant, "timed", base + ["--steps", str(args.steps)],
                             os.path.join(folder, f"timed-{k}.log")))
            runs.append((model, variant, "api", base + ["--profile", os.path.join(folder, "api")],
                         os.path.join(folder, "api.log")))
            trace = os.path.join(folder, "plain.trace.json")
            runs.append((model, variant, "plain", base + ["--steps", "5", "--plain-trace", trace],
                         os.path.join(folder, "plain.log")))
            runs.append((model, variant, "plain report", [sys.executable, "-m", "profiling", "profile", trace],
                         os.path.join(folder, "plain_report.md")))
    return runs


def ms_per_step(output):
    """The unprofiled ms/step a trainer printed last, or None."""
    found = MS_PER_STEP.findall(output)
    return float(found[-1][0]) if found else None


def environment(args):
    """The facts a timing needs beside it: device, torch, commit, how the runs were made."""
    import torch
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return dict(device=device, torch=torch.__version__, commit=commit, compiled=not args.no_compile,
                size=args.size, steps=args.steps, timed="ms/step over the second half of each run's steps")


def main(argv=None):
    args = parse_args(argv)
    runs = plan(args)
    if args.dry_run:
        for model, variant, kind, cmd, log in runs:
            print(f"{model} {variant} {kind}: {' '.join(cmd)} > {log}")
        return
    path = os.path.join(args.out, "timings.json")
    timings = {}
    if os.path.isfile(path):
        with open(path) as f:
            timings = json.load(f)
    timings["environment"] = environment(args)
    started = set()
    for model, variant, kind, cmd, log in runs:
        os.makedirs(os.path.dirname(log), exist_ok=True)
        print(f"{model} {variant} {kind} ...", flush=True)
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        with open(log, "w") as f:
            f.write(done.stdout + done.stderr)
        if (model, variant) not in started:  # a variant captured again replaces its earlier numbers
            started.add((model, variant))
            timings.setdefault(model, {})[variant] = {"ms_per_step": [], "failed": []}
        entry = timings[model][variant]
        ms = ms_per_step(done.stdout) if kind == "timed" else None
        if done.returncode or (kind == "timed" and ms is None):
            entry["failed"].append(f"{kind}: exit {done.returncode}, see {os.path.relpath(log, args.out)}")
        elif kind == "timed":
            entry["ms_per_step"].append(ms)
            entry["median_ms"] = statistics.median(entry["ms_per_step"])
        with open(path, "w") as f:
            json.dump(timings, f, indent=2)
    print(json.dumps({m: timings[m] for m in args.models if m in timings}, indent=2))


if __name__ == "__main__":
    main()
