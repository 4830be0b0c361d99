"""How long `research next` and `research log` take on large memories, process start included.

    .venv/bin/python benchmarks/research_memory/memory_speed.py [--sizes 0 1000 10000 100000] [--repeats 7]
    [--env both]

Generates a memory of each size (0: start-up and imports alone; a month of eight agents is ~10,000
records: 15% keep with a loss curve, 65% discard, 12% crash, 8% early abort, three rescue-pool entries),
then runs the environment's own `research` executable (`.venv/bin/research`, what `uv run research`
starts, minus uv's own ~0.1 s) as a fresh process, `--repeats` times each, and prints the median and min
wall time as a Markdown table.
Before every `log` the memory is restored, so each run appends to a file of exactly that size.
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from profiling import runfile
from profiling.research import experiments

SETTINGS = {"preset": "default", "MAX_SEQ_LEN": 2048, "TIME_BUDGET": 300, "EVAL_TOKENS": 40 * 524288,
            "VOCAB_SIZE": 8192}
STATUS_MIX = (("keep", 0.15), ("discard", 0.65), ("crash", 0.12), ("early_abort", 0.08))


def fake_record(i, rng, best):
    status = rng.choices([s for s, _ in STATUS_MIX], [w for _, w in STATUS_MIX])[0]
    val = None if status in ("crash", "early_abort") else round(best + rng.uniform(-0.002, 0.01), 6)
    if status == "keep":
        val = round(best - rng.uniform(0.0, 0.003) * (best - 0.8), 6)
    rec = dict.fromkeys(experiments.RECORD_KEYS)
    rec.update(id=i, time=f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:00:00Z", commit=f"{rng.getrandbits(28):07x}",
               dimension=rng.choice(experiments.DEFAULT_DIMENSIONS), status=status, run_status="ok",
               change=f"try variant {i} of an idea: change a constant and see what happens", val_bpb=val,
               baseline_bpb=best, baseline_id=max(1, i - 3), improvement=None if val is None else round(best - val, 9),
               peak_vram_mb=45060.2, mfu_percent=39.8, num_steps=953, training_seconds=300.1,
               settings=SETTINGS, dataset="climbmix", device="NVIDIA H100 80GB HBM3", run_time=rec["time"],
               source="log")
    if status == "early_abort":
        rec.update(run_status="early_abort", training_seconds=90.2)
    if status == "keep":
        rec["loss_curve"] = {"fractions": runfile.curve_fractions(),
                             "loss": [round(4.0 - 0.1 * k + rng.uniform(0, 0.01), 4) for k in range(20)]}
    return rec, (val if status == "keep" else best)


def make_memory(n, seed=0):
    rng, best, mem = random.Random(seed), 1.0, experiments.empty_memory()
    for i in range(1, n + 1):
        rec, best = fake_record(i, rng, best)
        mem["experiments"].append(rec)
    mem["rescue_pool"] = [{"id": k, "time": "2026-11-02T00:00:00Z", "from_experiment": k * 7,
                           "dimension": experiments.DEFAULT_DIMENSIONS[k], "mechanism": "a near miss worth combining",
                           "reuse_signal": "when this dimension comes up again"} for k in (1, 2, 3)]
    return mem


def write_run(path):
    summary = dict.fromkeys(runfile.SUMMARY_FIELDS)
    summary.update(val_bpb=0.9995, training_seconds=300.1, total_seconds=330.0, peak_vram_mb=45060.2,
                   mfu_percent=39.8, num_steps=953)
    curve = {"fractions": runfile.curve_fractions(), "loss": [4.0 - 0.1 * k for k in range(20)]}
    runfile.write_run(path, runfile.make_run("ok", summary, SETTINGS, "climbmix", commit="abc1234",
                                             time="2026-11-21T12:00:00+0000", loss_curve=curve))


def timed(cmd, env, before=None):
    if before:
        before()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def environments(workdir, which):
    """"as is": this environment unchanged (in this sandbox PYTHONDONTWRITEBYTECODE=1 and no .pyc beside
    site-packages or profiling/, so every start compiles tabulate, filelock and profiling/ from source).
    "bytecode cached": Python's .pyc cache on (in a private PYTHONPYCACHEPREFIX), as on a normal install
    after the first run, or after `uv sync --compile-bytecode`."""
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
    envs = {"as is": dict(os.environ), "bytecode cached": cached}
    return {k: v for k, v in envs.items() if which in ("both", k.split()[0])}


def bench(exe, n, repeats, workdir, env):
    path, pristine, run = (os.path.join(workdir, name) for name in (f"m{n}.json", f"m{n}.orig", "run.json"))
    with open(pristine, "w", encoding="utf-8") as f:
        f.write(experiments.dumps(make_memory(n)))
    shutil.copyfile(pristine, path)
    write_run(run)
    size_mb = os.path.getsize(path) / 1e6

    def restore():
        shutil.copyfile(pristine, path)

    cmds = {"next": [exe, "--memory", path, "next"],
            "log": [exe, "--memory", path, "log", "--dimension", "optimizer", "--change", "bench", "--run", run]}
    out = {}
    for name, cmd in cmds.items():
        timed(cmd, env, restore)  # warm the page cache (and the bytecode cache)
        times = [timed(cmd, env, restore if name == "log" else None) for _ in range(repeats)]
        out[name] = (statistics.median(times), min(times))
    return size_mb, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[0, 1000, 10000, 100000])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--env", choices=("as", "bytecode", "both"), default="both",
                    help="as: the environment as is; bytecode: with the .pyc cache on; both")
    ap.add_argument("--exe", default=os.path.join(ROOT, ".venv", "bin", "research"))
    args = ap.parse_args()
    print("| environment | records | file MB | next median ms | next min ms | log median ms | log min ms |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        envs = environments(workdir, args.env)
        for label, env in envs.items():
            for n in args.sizes:
                repeats = args.repeats if n <= 10000 else max(3, args.repeats // 2)
                size, r = bench(args.exe, n, repeats, workdir, env)
                print(f"| {label} | {n:,} | {size:.1f} | {r['next'][0] * 1e3:.0f} | {r['next'][1] * 1e3:.0f} "
                      f"| {r['log'][0] * 1e3:.0f} | {r['log'][1] * 1e3:.0f} |", flush=True)
    print(f"\nload average while measuring: {os.getloadavg()[0]:.2f} (2-core machine)")


if __name__ == "__main__":
    main()
