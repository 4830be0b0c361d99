"""Tokens/s of train.py on 1 GPU and on N GPUs (torchrun + DDP), one machine, one call, runs in turn.

    python3 benchmarks/train_speed/ddp_throughput.py [--gpus 2] [--budget 20] [--before OLD/train.py] [--json
    OUT]

Each run is a real `train.py --no-profile --no-gate` (under `torchrun --standalone --nproc_per_node=N` for
N GPUs) with AUTORESEARCH_TIME_BUDGET=--budget seconds of counted training; its tokens/s is from run.json:
TOTAL_BATCH_SIZE x counted steps / training_seconds (the first EXCLUDED_STEPS steps, compilation, are not
counted), and the median of the counted steps' `dt` on the progress lines (the slowest rank's step time
under torchrun). Runs, in this order:
    1gpu_before   --before (train.py before the change), 1 GPU (when given)
    1gpu          train.py, 1 GPU
    Ngpu          train.py on N GPUs: torch.compile of the DDP-wrapped model (DDP's graph splitting)
    Ngpu_inner    a copy on N GPUs with the inner model compiled and then wrapped in DDP
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUTER = ("    ddp = ranks.distribute(model)  # DistributedDataParallel under torchrun, else the model itself\n"
         "    forward = torch.compile(ddp, dynamic=False) if COMPILE else ddp\n")
INNER = ("    ddp = ranks.distribute(torch.compile(model, dynamic=False) if COMPILE else model)\n"
         "    forward = ddp  # variant: the inner model compiled, then wrapped in DDP\n")


def gpu_state():
    """nvidia-smi's SM clock, power and clock event reasons right after a run (None without nvidia-smi)."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=index,clocks.sm,clocks.max.sm,power.draw,power.limit,"
                               "clocks_event_reasons.active", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None


def run(name, train_py, gpus, budget, work):
    folder = os.path.join(work, name)
    os.makedirs(folder, exist_ok=True)
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=str(budget), PYTHONPATH=ROOT, PYTHONUNBUFFERED="1",
               AUTORESEARCH_MEMORY=os.path.join(folder, "experiments.json"))
    launch = [sys.executable] if gpus == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    t0 = time.time()
    proc = subprocess.run(launch + [train_py, "--no-profile", "--no-gate"], cwd=folder, env=env,
                          capture_output=True, text=True)
    with open(os.path.join(folder, "log.txt"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode:
        print(f"{name}: failed (exit {proc.returncode}); see {folder}/log.txt", flush=True)
        return {"name": name, "gpus": gpus, "error": proc.stderr[-1500:]}
    with open(os.path.join(folder, "run.json")) as f:
        record = json.load(f)
    s, hp = record["summary"], record["hyperparameters"]
    counted = s["num_steps"] - hp["EXCLUDED_STEPS"]
    steps = [int(ms) for n, ms in re.findall(r"step (\d+) .*?dt: (\d+)ms", proc.stdout.replace("\r", "\n"))
             if int(n) >= hp["EXCLUDED_STEPS"]]
    median_ms = statistics.median(steps)
    out = {"name": name, "gpus": gpus, "tokens_per_s": round(hp["TOTAL_BATCH_SIZE"] * counted / s["training_seconds"]),
           "tokens_per_s_median_step": round(hp["TOTAL_BATCH_SIZE"] / median_ms * 1000), "median_step_ms": median_ms,
           "mean_step_ms": round(1000 * s["training_seconds"] / counted, 2), "mfu_percent": s["mfu_percent"],
           "counted_steps": counted, "val_bpb": s["val_bpb"], "peak_vram_mb": s["peak_vram_mb"],
           "gpu_state": gpu_state(), "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(out), flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--budget", type=float, default=20)
    p.add_argument("--before", help="train.py before the change, timed on 1 GPU first")
    p.add_argument("--runs", default="1gpu_before,1gpu,Ngpu,Ngpu_inner", help="which runs, in order")
    p.add_argument("--work", default=os.path.join(ROOT, ".bench", "ddp"))
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    train_py = os.path.join(ROOT, "train.py")
    source = open(train_py).read()
    if source.count(OUTER) != 1:
        sys.exit("ddp_throughput: train.py's make_train_step changed; update OUTER")
    os.makedirs(args.work, exist_ok=True)
    inner = os.path.join(ROOT, ".bench", "train_ddp_inner.py")
    with open(inner, "w") as f:
        f.write(source.replace(OUTER, INNER))
    plan = {"1gpu_before": (args.before and os.path.abspath(args.before), 1), "1gpu": (train_py, 1), "Ngpu": (train_py, args.gpus),
            "Ngpu_inner": (inner, args.gpus)}
    results = [run(name, *plan[name], args.budget, args.work) for name in args.runs.split(",")
               if plan[name][0]]
    ok = {r["name"]: r for r in results if "error" not in r}
    if "1gpu" in ok and "Ngpu" in ok:
        print(f"speedup {args.gpus} GPUs vs 1: {ok['Ngpu']['tokens_per_s'] / ok['1gpu']['tokens_per_s']:.3f}x "
              f"(median steps: {ok['1gpu']['median_step_ms'] / ok['Ngpu']['median_step_ms']:.3f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"budget_s": args.budget, "runs": results}, f, indent=2)


if __name__ == "__main__":
    main()
