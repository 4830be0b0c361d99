"""Times a public script's warm iterations with and without a report's fix that the script's own flags apply, for
the verdicts on the warm public traces (foreign_results.md; the traces: tests/data/foreign/make/
make_public_traces_57.py `warm`). Each run is the unmodified script under the same harness
(tests/data/foreign/make/public_harness/sitecustomize.py) with PUB_PROF_TIME=1: no profiler, the host's time at
each top-level forward from START to STOP; an iteration's time is FORWARDS_PER_ITERATION forwards apart.
Variants alternate, ROUNDS rounds, in fresh processes.

    python3 benchmarks/findings/corpus/time_public_fixes.py OUT [--examples .public/examples] [--rounds 3]

OUT/results.jsonl: a row per process (case, variant, round, iteration ms); printed: each case's median ms per
iteration by variant (the median of the rounds' medians) and the gain against `base`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
HARNESS = os.path.join(REPO, "tests", "data", "foreign", "make", "public_harness")

# case: (script folder, argv without the variant's, forwards per iteration, first timed iteration, last, variants)
# dcgan: 7 top-level forwards an iteration (+1 in iteration 0); its FakeData has 1,000 images: 15 full batches
# of 64 an epoch, so the timed iterations stay inside the first epoch (its workers start once)
CASES = {
    "dcgan-workers": ("dcgan", ["--dataset", "fake", "--accel", "--niter", "1", "--manualSeed", "1", "--outf", "{tmp}",
                                "--batchSize", "64"], 7, 3, 14,
                      {"base": ["--workers", "2"], "workers4": ["--workers", "4"]}),
    "imagenet-resnet18-workers": ("imagenet", ["--dummy", "-a", "resnet18", "-b", "32", "--gpu", "0"], 2, 5, 30,
                                  {"base": ["-j", "2"], "workers4": ["-j", "4"]}),
}


def forwards_at(per, k):
    """Top-level forwards before iteration k (dcgan's iteration 0 has one more)."""
    return per * k + (1 if per == 7 and k > 0 else 0)


def run(examples, case, variant, rnd, out):
    folder, argv, per, first, last, variants = CASES[case]
    tmp = tempfile.mkdtemp(prefix="pubfix-")
    path = os.path.join(tmp, "times.json")
    env = dict(os.environ, PUB_PROF_OUT=path, PUB_PROF_TIME="1", PUB_PROF_START=str(forwards_at(per, first)),
               PUB_PROF_FORWARDS=str(forwards_at(per, last)), PUB_PROF_SECONDS="300")
    env["PYTHONPATH"] = os.pathsep.join([HARNESS] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, "main.py", *[a.format(tmp=tmp) for a in argv], *variants[variant]]
    p = subprocess.run(cmd, cwd=os.path.join(examples, folder), env=env, capture_output=True, text=True,
                       timeout=400)
    row = {"case": case, "variant": variant, "round": rnd, "argv": cmd[2:], "rc": p.returncode}
    try:
        with open(path) as f:
            t = json.load(f)["forwards"]
        row["iteration_ms"] = [round(1e3 * (b - a), 3) for a, b in zip(t[::per], t[per::per])]
    except (OSError, ValueError, KeyError) as x:
        row["error"] = f"{type(x).__name__}: {x}; " + p.stderr[-1500:]
    with open(os.path.join(out, "results.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--examples", default=os.path.join(REPO, ".public", "examples"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for case in a.cases.split(","):
        meds = {}
        for rnd in range(a.rounds):
            for variant in CASES[case][5]:
                row = run(os.path.abspath(a.examples), case, variant, rnd, a.out)
                ms = row.get("iteration_ms")
                print(case, variant, rnd, f"median {statistics.median(ms):.2f} ms over {len(ms)}" if ms
                      else row.get("error", "")[:300], flush=True)
                if ms:
                    meds.setdefault(variant, []).append(statistics.median(ms))
        base = statistics.median(meds["base"]) if meds.get("base") else None
        for variant, m in meds.items():
            mid = statistics.median(m)
            print(f"{case} {variant}: {mid:.2f} ms/iteration (rounds {', '.join(f'{x:.2f}' for x in m)})"
                  + (f", gain {base - mid:+.2f}" if base and variant != "base" else ""), flush=True)


if __name__ == "__main__":
    main()
