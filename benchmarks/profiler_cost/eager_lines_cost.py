"""What recording the eager operators' lines costs (issue #33): `train.py --profile` with the line-record step
(profiling/profile/capture/eager_record.py) and without it (AUTORESEARCH_EAGER_LINES=0), alternating, several runs each.

    python3 benchmarks/profiler_cost/eager_lines_cost.py [--runs 3] [--out DIR] [--json results.json] [--
    train.py args]

Runs from the repository (train.py is then the run's own file), each with a profile folder of its own under
--out. Read per run: the whole process's wall seconds; the seconds train.py reports after the last profiled
step (`export, summary and report took`: the line-record step included); the record's own seconds (trace
metadata `eager_lines.seconds`); the profiled and unprofiled ms/step; the share of time placed on lines.
Without CUDA, train.py runs its cpu preset (the builtin corpus must be prepared: `uv run prepare.py`).
"""
import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AFTER = re.compile(r"export, summary and report took ([\d.]+) s")
PROFILE = re.compile(r"^# Profile: ([\d.]+) ms/step", re.MULTILINE)
PLACED = re.compile(r"([\d.>]+)% of (?:device|operator) time placed on source lines")


def run(variant, k, out, extra):
    folder = os.path.join(out, f"eager{variant}-{k}")
    env = dict(os.environ, AUTORESEARCH_EAGER_LINES=variant,
               AUTORESEARCH_PROFILE_DIR=os.path.join(folder, "profiles"),
               AUTORESEARCH_MEMORY=os.path.join(folder, "experiments.json"))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "train.py", "--profile", *extra], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    wall = time.time() - t0
    text = proc.stdout + proc.stderr
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "run.log"), "w") as f:
        f.write(text)
    meta = {}
    trace = os.path.join(folder, "profiles", "latest", "trace.json.gz")
    if os.path.exists(trace):
        with gzip.open(trace) as f:
            meta = json.load(f).get("autoresearch") or {}
    after, profiled, placed = AFTER.search(text), PROFILE.search(text), PLACED.search(text)
    return {"variant": f"eager_lines={variant}", "run": k, "exit": proc.returncode, "wall_s": round(wall, 1),
            "after_profile_s": float(after.group(1)) if after else None,
            "record_s": (meta.get("eager_lines") or {}).get("seconds"),
            "profiled_step_ms": float(profiled.group(1)) if profiled else None,
            "unprofiled_step_ms": meta.get("unprofiled_step_ms"),
            "lines_placed_percent": placed.group(1) if placed else None}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="runs per variant, alternating (default 3)")
    p.add_argument("--out", default="eager-lines-cost", help="folder for logs, reports and traces")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("train_args", nargs="*", help="more arguments for train.py (after --)")
    args = p.parse_args()
    out = os.path.abspath(args.out)
    results = []
    for k in range(args.runs):
        for variant in ("1", "0"):
            r = run(variant, k, out, args.train_args)
            print(json.dumps(r), flush=True)
            results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
