"""What recording the compiled kernels' source lines costs (issue #20): compilation and step time of
`train.py --profile` with the record (profiling/profile/capture/provenance.py) and without it (AUTORESEARCH_PROVENANCE=0).

    python3 benchmarks/profiler_cost/provenance_cost.py [--variants 1,0] [--out DIR] [--json results.json]

Each variant gets an inductor cache of its own (TORCHINDUCTOR_CACHE_DIR under --out) and runs twice: cold
(everything compiles, Triton included) and warm (the FX graph and Triton caches hit). Read from train.py's
output: step 0's dt (compilation: the model's forward and backward and the optimizer's fused steps), the
mean dt of steps 2-4 (unprofiled steps, compiled), the profiled ms/step, the share of device time the
report's "Lines of train.py" places, and the whole run's wall time. Each run's log, report and trace stay
under --out/<variant>-<cold|warm>/.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP = re.compile(r"step (\d+) .*?\| dt: (\d+)ms")
PROFILE = re.compile(r"^# Profile: ([\d.]+) ms/step", re.M)
PLACED = re.compile(r"([\d.>]+)% of (?:device|operator) time placed on source lines")


def run(variant, label, out):
    folder = os.path.join(out, f"provenance{variant}-{label}")
    os.makedirs(folder, exist_ok=True)
    env = dict(os.environ, AUTORESEARCH_PROVENANCE=variant,
               TORCHINDUCTOR_CACHE_DIR=os.path.join(out, f"inductor-provenance{variant}"),
               AUTORESEARCH_PROFILE_DIR=os.path.join(folder, "profiles"))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "train.py", "--profile"], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    wall = time.time() - t0
    text = proc.stdout + proc.stderr
    with open(os.path.join(folder, "run.log"), "w") as f:
        f.write(text)
    dts = {int(n): int(ms) for n, ms in STEP.findall(text.replace("\r", "\n"))}
    steady = [dts[n] for n in (2, 3, 4) if n in dts]
    latest = os.path.join(folder, "profiles", "latest")
    if os.path.exists(os.path.join(latest, "trace.json.gz")):
        shutil.copy(os.path.join(latest, "trace.json.gz"), os.path.join(folder, "trace.json.gz"))
        shutil.copy(os.path.join(latest, "report.md"), os.path.join(folder, "report.md"))
    profiled, placed = PROFILE.search(text), PLACED.search(text)
    return {"variant": f"provenance={variant}", "cache": label, "exit": proc.returncode,
            "compile_step_s": dts.get(0, 0) / 1e3 if 0 in dts else None,
            "steady_step_ms": sum(steady) / len(steady) if steady else None,
            "profiled_step_ms": float(profiled.group(1)) if profiled else None,
            "lines_placed_percent": placed.group(1) if placed else None, "wall_s": round(wall, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="1,0", help="AUTORESEARCH_PROVENANCE values, in order (default 1,0)")
    p.add_argument("--out", default="provenance-cost", help="folder for caches, logs, reports and traces")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    out = os.path.abspath(args.out)
    results = []
    for variant in args.variants.split(","):
        for label in ("cold", "warm"):
            r = run(variant, label, out)
            print(json.dumps(r), flush=True)
            results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
