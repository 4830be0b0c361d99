"""Benchmark (GPU, issue #25): the loader off the main thread, measured inside the step, in one call.

    python3 benchmarks/loader_gpu.py OUT --before OLD_PREPARE.py [--profiles 5] [--steps 40]
        [--parts throughput,profiles,batch16]

OLD_PREPARE.py is prepare.py before the change (`git show c64cda3:prepare.py > .bench/prepare_before.py`).
A copy of this tree with it in place is made under OUT/before-tree, so both versions run on the same machine
in the same call. Parts:

- throughput: benchmarks/train_throughput.py (default config) before, after, before: unprofiled ms/step;
- profiles: `train.py --profile` --profiles times with the new loader: the profile's own check (profiled vs
  unprofiled step), GPU idle as a share of the step, and the share of the main thread's stack samples
  (taken every 2 ms in the profiled steps) with a frame in prepare.py;
- batch16: train_throughput.py at DEVICE_BATCH_SIZE 16 (16 micro-batches per step), before and after.

Writes OUT/loader_gpu_results.md (and prints it) and OUT/loader_gpu.json. Plain python3, no uv.
"""
import argparse
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = ("train.py", "kernels.py", "profiling", "benchmarks")


def before_tree(out, old_prepare):
    tree = os.path.join(out, "before-tree")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    for name in TREE:
        src = os.path.join(ROOT, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(tree, name))
    shutil.copy(old_prepare, os.path.join(tree, "prepare.py"))
    return tree


def batch16_copy(tree, out, label):
    path = os.path.join(out, f"train_b16_{label}.py")
    with open(os.path.join(tree, "train.py")) as f:
        source = f.read()
    assert source.count("DEVICE_BATCH_SIZE = 128 ") == 1, "train.py's DEVICE_BATCH_SIZE line changed"
    with open(path, "w") as f:
        f.write(source.replace("DEVICE_BATCH_SIZE = 128 ", "DEVICE_BATCH_SIZE = 16  "))
    return path


def throughput(tree, out, label, steps, train=None):
    json_path = os.path.join(out, f"throughput-{label}.json")
    cmd = [sys.executable, os.path.join(tree, "benchmarks", "train_throughput.py"), "--steps", str(steps),
           "--json", json_path] + (["--train", train] if train else [])
    t0 = time.time()
    with open(os.path.join(out, f"throughput-{label}.log"), "w") as log:
        code = subprocess.run(cmd, cwd=tree, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if code:
        return {"label": label, "error": f"exit {code}"}
    with open(json_path) as f:
        r = json.load(f)
    print(f"{label}: {r['step_ms']} ms/step ({time.time() - t0:.0f} s)", flush=True)
    return {"label": label, "step_ms": r["step_ms"], "tokens_per_s": r["tokens_per_s"], "mfu": r["mfu_percent"]}


def prepare_share(trace_path):
    """Share of the profiled steps' main-thread stack samples with a frame in prepare.py."""
    with gzip.open(trace_path, "rt") as f:
        meta = json.load(f).get("autoresearch", {})
    host = meta.get("host_samples") or {}
    stacks, samples = host.get("stacks") or [], host.get("samples") or []
    hits = sum(1 for _, _, sid in samples if any(fr.split(":")[0].endswith("prepare.py") for fr in stacks[sid]))
    return 100.0 * hits / len(samples) if samples else None, len(samples)


def profile_run(out, k):
    folder = os.path.join(out, f"profile-{k}")
    env = dict(os.environ, AUTORESEARCH_PROFILE_DIR=folder)
    t0 = time.time()
    with open(os.path.join(out, f"profile-{k}.log"), "w") as log:
        code = subprocess.run([sys.executable, "train.py", "--profile"], cwd=ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT, check=False).returncode
    summaries = glob.glob(os.path.join(folder, "*", "summary.json"))
    if code or not summaries:
        return {"run": k, "error": f"exit {code}"}
    with open(summaries[0]) as f:
        s = json.load(f)
    share, n = prepare_share(os.path.join(os.path.dirname(summaries[0]), "trace.json.gz"))
    check = next(c for c in s["checks"] if c["name"].startswith("profiled vs unprofiled"))
    r = {"run": k, "profiled_ms": round(s["step_ms"], 2), "unprofiled_ms": round(s["unprofiled_step_ms"], 2),
         "check": "ok" if check["ok"] else "FAILED", "idle_pct": round(100 * s["idle_ms"] / s["step_ms"], 2),
         "prepare_samples_pct": round(share, 1) if share is not None else None, "samples": n}
    print(f"profile {k}: {r} ({time.time() - t0:.0f} s)", flush=True)
    return r


def table(rows, keys):
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--before", required=True, help="prepare.py before the change")
    p.add_argument("--profiles", type=int, default=5)
    p.add_argument("--steps", type=int, default=40, help="timed steps per throughput run")
    p.add_argument("--parts", default="throughput,profiles,batch16")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    parts, old = args.parts.split(","), before_tree(args.out, args.before)
    import torch
    res = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    text = [f"{res['device']}, torch {res['torch']}, {res['date']}"]
    if "throughput" in parts:
        res["throughput"] = [throughput(old, args.out, "before-1", args.steps),
                             throughput(ROOT, args.out, "after", args.steps),
                             throughput(old, args.out, "before-2", args.steps)]
        text += ["\nDefault config, unprofiled:\n", table(res["throughput"], ["label", "step_ms", "tokens_per_s", "mfu"])]
    if "profiles" in parts:
        res["profiles"] = [profile_run(args.out, k) for k in range(1, args.profiles + 1)]
        keys = ["run", "profiled_ms", "unprofiled_ms", "check", "idle_pct", "prepare_samples_pct", "samples"]
        text += ["\n`train.py --profile`, new loader:\n", table(res["profiles"], keys)]
    if "batch16" in parts:
        steps = max(10, args.steps // 2)
        res["batch16"] = [throughput(old, args.out, "b16-before", steps, batch16_copy(old, args.out, "before")),
                          throughput(ROOT, args.out, "b16-after", steps, batch16_copy(ROOT, args.out, "after"))]
        text += ["\nDEVICE_BATCH_SIZE 16, unprofiled:\n", table(res["batch16"], ["label", "step_ms", "tokens_per_s", "mfu"])]
    with open(os.path.join(args.out, "loader_gpu.json"), "w") as f:
        json.dump(res, f, indent=2)
    with open(os.path.join(args.out, "loader_gpu_results.md"), "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
