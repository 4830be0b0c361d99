"""GPU memory at the peak and what fits, checked on the GPU (issue #35): train.py's own memory step against
arithmetic, against a second micro-batch, and its predictions against runs that fit or run out of memory.

    python3 benchmarks/gpu_memory/gpu_memory_capture.py capture OUT [--budget S]   # GPU, one device call
    uv run python benchmarks/gpu_memory/gpu_memory_capture.py report OUT [--markdown FILE]   # anywhere

`capture` runs, each `train.py --profile` in its own copy under .bench/gpu_memory/<run>/ (the knobs edited by
exact text replacement, run.json, profiles and the memory file kept in that folder):
    b128     the default config (DEVICE_BATCH_SIZE 128): the categories, `fits` and the DEPTH estimate
    b64      DEVICE_BATCH_SIZE 64: activations must be about half b128's
    fit      DEVICE_BATCH_SIZE = b128's max_micro_batch B, TOTAL_BATCH_SIZE one micro-batch: must run
    over     B + 8, one micro-batch: must run out of memory; its run.json is then logged with
             `python3 -m profiling log` into that folder's experiments.json (what an agent's loop does)
    depth    DEPTH = b128's max_depth at micro-batch 128: must run
and, in a separate process, the arithmetic: train.py's model and optimizer built on the GPU, one optimizer step
on zero gradients, then the bytes of the parameters, the gradients and the optimizer's state from each tensor's
count and dtype (numel x element size), to compare with the categories the allocator's blocks gave. Each run's
log, run.json and profile summary.json go to OUT; b128's trace too (a fixture for tests/data).
`--budget S` starts no run that would not end within S seconds of the call's start (the longest so far).

`report` prints (and writes with --markdown) the checks: categories sum vs the allocated peak (within 5%),
parameters/gradients/optimizer state vs the arithmetic (within 5% each), activations at 64 vs 128 (within 10%
of proportional), fit ran, over ran out of memory with its message and records, depth ran.
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
BENCH = os.path.join(ROOT, ".bench", "gpu_memory")
SEQ = 2048  # MAX_SEQ_LEN of the full preset
KNOBS = {"DEPTH": "DEPTH = 8 ", "DEVICE_BATCH_SIZE": "DEVICE_BATCH_SIZE = 128 ",
         "TOTAL_BATCH_SIZE": "TOTAL_BATCH_SIZE = 2**19 "}


def edit(source, **knobs):
    """train.py with the given knobs set (each must be in train.py once at its default)."""
    for name, value in knobs.items():
        old = KNOBS[name]
        if source.count(old) != 1:
            sys.exit(f"gpu_memory_capture: {old.strip()!r} is in train.py {source.count(old)} times (expected "
                     "once); update KNOBS")
        source = source.replace(old, f"{name} = {value} ")
    return source


def run(name, out, timeout, **knobs):
    """`train.py --profile` on a copy with `knobs`: {name, exit, seconds} (files copied to OUT/<name>.*)."""
    folder = os.path.join(BENCH, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with open(os.path.join(ROOT, "train.py"), encoding="utf-8") as f:
        source = edit(f.read(), **knobs)
    with open(os.path.join(folder, "train.py"), "w", encoding="utf-8") as f:
        f.write(source)
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, AUTORESEARCH_PROFILE_DIR=os.path.join(folder, "profiles"),
               AUTORESEARCH_MEMORY=os.path.join(folder, "experiments.json"))
    t0 = time.time()
    with open(os.path.join(out, f"{name}.log"), "w") as log:
        try:
            code = subprocess.run([sys.executable, os.path.join(folder, "train.py"), "--profile", "--run-file",
                                   os.path.join(folder, "run.json")], cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {timeout:.0f} s"
    for src, dst in (("run.json", f"{name}.run.json"), ("profiles/latest/summary.json", f"{name}.summary.json")):
        if os.path.exists(os.path.join(folder, src)):
            shutil.copy(os.path.join(folder, src), os.path.join(out, dst))
    result = {"name": name, "knobs": knobs, "exit": code, "seconds": round(time.time() - t0, 1)}
    print(json.dumps(result), flush=True)
    return result


def log_oom(name, out):
    """What an agent's loop does after a crash: `research log` of its run.json into the folder's memory."""
    folder = os.path.join(BENCH, name)
    env = dict(os.environ, AUTORESEARCH_MEMORY=os.path.join(folder, "experiments.json"),
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-m", "profiling", "log", "--run", os.path.join(folder, "run.json"),
                           "--dimension", "baseline", "--change", "micro-batch past what fits"], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    with open(os.path.join(out, f"{name}.research-log.txt"), "w") as f:
        f.write(f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    if os.path.exists(env["AUTORESEARCH_MEMORY"]):
        shutil.copy(env["AUTORESEARCH_MEMORY"], os.path.join(out, f"{name}.experiments.json"))


ARITHMETIC = r"""
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("train_copy", sys.argv[1])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
from prepare import Tokenizer
model = train.build_model(Tokenizer.from_directory().get_vocab_size(), torch.device("cuda" if torch.cuda.is_available() else "cpu"))
optimizer = train.make_optimizer(model)
for p in model.parameters():
    p.grad = torch.zeros_like(p)
optimizer.step()
def mb(ts):
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor)) / 2**20
params = list(model.parameters())
print(json.dumps({"parameters": mb(params), "gradients": mb(p.grad for p in params),
                  "optimizer_state": mb(v for s in optimizer.state.values() for v in s.values()),
                  "count": sum(p.numel() for p in params),
                  "dtypes": sorted({str(p.dtype) for p in params})}))
"""


def arithmetic(out):
    """Bytes of train.py's parameters, gradients and optimizer state from the tensors' counts and dtypes."""
    proc = subprocess.run([sys.executable, "-c", ARITHMETIC, os.path.join(ROOT, "train.py")], cwd=ROOT,
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)))
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result = {"error": (proc.stdout + proc.stderr)[-3000:]}
    with open(os.path.join(out, "arithmetic.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result), flush=True)


def capture(args):
    import torch
    os.makedirs(args.out, exist_ok=True)
    t0, longest, runs = time.time(), args.run_estimate, []
    device = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "device_mb": round(torch.cuda.get_device_properties(0).total_memory / 2**20)}

    def go(name, **knobs):
        nonlocal longest
        left = args.budget - (time.time() - t0)
        if left < longest:
            print(f"stopped before {name}: {left:.0f} s left, a run takes up to {longest:.0f} s", flush=True)
            return None
        r = run(name, args.out, min(args.timeout, left), **knobs)
        runs.append(r)
        longest = max(longest, r["seconds"])
        return r

    arithmetic(args.out)
    go("b128")
    memory = _gpu_memory(args.out, "b128")
    fits = memory.get("fits") or {}
    go("b64", DEVICE_BATCH_SIZE=64)
    if fits.get("max_micro_batch"):
        b = fits["max_micro_batch"]
        go("fit", DEVICE_BATCH_SIZE=b, TOTAL_BATCH_SIZE=b * SEQ)
        if go("over", DEVICE_BATCH_SIZE=b + 8, TOTAL_BATCH_SIZE=(b + 8) * SEQ):
            log_oom("over", args.out)
    if fits.get("max_depth"):
        go("depth", DEPTH=fits["max_depth"])
    trace = os.path.join(BENCH, "b128", "profiles", "latest", "trace.json.gz")
    if os.path.exists(trace):
        shutil.copy(trace, os.path.join(args.out, "b128.trace.json.gz"))
    device["runs"] = runs
    with open(os.path.join(args.out, "device.json"), "w") as f:
        json.dump(device, f, indent=2)


def _load(out, name, kind=None):
    path = os.path.join(out, f"{name}.{kind}.json" if kind else f"{name}.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _gpu_memory(out, name):
    return _load(out, name, "summary").get("gpu_memory") or {}


def _within(a, b, tolerance):
    return a is not None and b and abs(a / b - 1) <= tolerance


def report(args):
    rows, out = [], args.out
    arith, device = _load(out, "arithmetic"), _load(out, "device")
    runs = {r["name"]: r for r in device.get("runs", [])}
    m128, m64 = _gpu_memory(out, "b128"), _gpu_memory(out, "b64")
    cats = m128.get("categories") or {}
    total = sum(cats.values())
    peak = m128.get("peak_allocated_mb")
    rows.append(("categories sum vs the allocated peak (b128)", f"{total:,.0f} vs {peak:,.0f} MB" if peak else "-",
                 "ok" if _within(total, peak, 0.05) else "FAIL"))
    for k in ("parameters", "gradients", "optimizer_state"):
        rows.append((f"{k} vs count x element size", f"{cats.get(k, 0):,.1f} vs {arith.get(k, 0):,.1f} MB",
                     "ok" if _within(cats.get(k), arith.get(k), 0.05) else "FAIL"))
    a128, a64 = (m.get("categories", {}).get("activations") for m in (m128, m64))
    if a128 and a64:
        rows.append(("activations at 64 vs half of 128", f"{a64:,.0f} vs {a128 / 2:,.0f} MB ({100 * (a64 / (a128 / 2) - 1):+.1f}%)",
                     "ok" if _within(a64, a128 / 2, 0.10) else "FAIL"))
    fits = m128.get("fits") or {}
    for name, want in (("fit", 0), ("over", 1), ("depth", 0)):
        r = runs.get(name)
        if not r:
            rows.append((f"{name} run", "not run", "FAIL"))
            continue
        log = open(os.path.join(out, f"{name}.log"), errors="replace").read()
        fail = re.findall(r"^FAIL: .*$", log, re.M)
        what = f"{r['knobs']}: exit {r['exit']}" + (f"; {fail[-1]}" if fail else "")
        ok = r["exit"] == want and (want == 0 or "out of memory" in what)
        rows.append((f"{name} run ({'must run' if want == 0 else 'must run out of memory'})", what, "ok" if ok else "FAIL"))
    over = _load(out, "over", "run")
    ex = _load(out, "over", "experiments")
    logged = [e for e in ex.get("experiments", []) if e.get("oom")]
    rows.append(("over: run.json oom / experiments.json oom",
                 f"{'oom' in over and bool(over.get('oom'))} / {bool(logged)}",
                 "ok" if over.get("oom") and logged else "FAIL"))
    lines = [f"{device.get('device')} · torch {device.get('torch')} · {device.get('date')} · "
             f"{device.get('device_mb'):,} MB", "",
             f"b128: peak allocated {peak} MB, reserved {m128.get('reserved_mb')} MB; fits {json.dumps(fits)}; "
             f"max_depth {fits.get('max_depth')}", "",
             "| check | measured | result |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 1 if any(c == "FAIL" for _, _, c in rows) else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture", help="run the checks' training runs (GPU)")
    c.add_argument("out")
    c.add_argument("--budget", type=float, default=560, help="seconds for the whole capture (default 560)")
    c.add_argument("--timeout", type=float, default=240, help="seconds for one run (default 240)")
    c.add_argument("--run-estimate", type=float, default=60, help="seconds a run takes before one is timed")
    r = sub.add_parser("report", help="the checks, from a capture's OUT")
    r.add_argument("out")
    r.add_argument("--markdown", help="also write the table to this file")
    args = p.parse_args(argv)
    return capture(args) if args.command == "capture" else report(args)


if __name__ == "__main__":
    sys.exit(main())
