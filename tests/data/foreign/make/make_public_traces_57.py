"""Makes #57's traces from PUBLIC, UNMODIFIED training scripts (tests/data/foreign/SOURCES.md): pytorch/examples'
imagenet/main.py (--dummy), word_language_model/main.py and dcgan/main.py (--dataset fake), each run in a fresh
process profiled from outside by public_harness/sitecustomize.py (torch.profiler started at the interpreter's start,
no schedule, so no ProfilerStep markers; stopped after N top-level module forwards). Three kinds: `cold` (CPU + CUDA
from the process's start: first launches, cudaFuncGetAttributes, lazy module loads), `cpuactivity` (CPU activity
only, the model on the GPU), `stack-cold` (cold with with_stack=True), and `warm` (CPU + CUDA from the first
forward after WARM_AFTER iterations to WARM_AFTER + 5: a loop's steady state, still without markers). Before the first forward the host works
for seconds outside the GPU's span: imports, model building, DataLoader workers starting, wlm's tokenizing.

    python3 tests/data/foreign/make/make_public_traces_57.py OUTDIR [--examples .public/examples] [NAME|GLOB ...]
        [--small] [--budget S] [--no-trim] [--trim-only] [--tag TAG] [--list]

OUTDIR gets raw/NAME.json.gz (the harness's trace), NAME.json.gz (trimmed by trim.py SRC DST 0 to fit ~280 KB,
flows then Python frames dropped when the cut would lose the last iterations), logs/NAME.log and results.jsonl;
at the end everything but results.jsonl is packed into at most 4 tar files (TAG-trimmed.tar, TAG-raw-K.tar, each
under 15 MB; raw traces that fit no tar are left out, listed in results.jsonl) and the loose files removed.
`--budget S`: start no run with less than 60 s of S left, and skip trimming with less than 90 s left (trim later
with --trim-only, OUTDIR holding raw/). `--small`: tiny sizes, for a check on a CPU machine.

Needs torch (torchvision for imagenet and dcgan), and orjson importable (trim.py reads traces through
profiling.profile.trace.traceio). Nothing is downloaded: random weights (no --pretrained), synthetic images.
The scripts are pytorch/examples at commit 77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause), extracted
to .public/examples (git-ignored, never committed). Its snapshot lacked word_language_model's train.txt (10.8 MB,
over the 4 MiB limit), so wlm reads a stand-in made here from WikiText-2's own valid.txt and test.txt: train.txt
is (valid + test) x 4 (9.5 MB, near the real 10.8 MB, so tokenizing costs the host about as much), and in all
three files every WLM_JOIN lines are joined into one: Corpus.tokenize makes one tensor per line (6 aten events
each), and the real 45,000 lines would fill the corpus's 280 KB before the first iteration.
"""
import argparse
import concurrent.futures
import fnmatch
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
HARNESS = os.path.join(HERE, "public_harness")
TRIM = os.path.join(HERE, "trim.py")
COMMIT = "77f55b912142e11fcfdf5b530231fb9c52f181e8"
TIMEOUT = 180      # seconds a run may take
HARD_CAP = 100     # PUB_PROF_SECONDS: the harness stops at the first top-level forward after this
WLM_JOIN = 50      # wlm stand-in: lines joined into one
TAR_MAX = 15_000_000
COVER = 0.98       # a trim is accepted when its host events reach this share of the raw trace's host span

# Top-level module forwards per training iteration (what the harness counts): imagenet: DataParallel(model),
# CrossEntropyLoss = 2; wlm: RNNModel/TransformerModel, NLLLoss = 2; dcgan: netD(real), BCELoss, netG(noise),
# netD(fake.detach()), BCELoss, netD(fake), BCELoss = 7, and iteration 0 one more (netG(fixed_noise), i % 100 == 0).
WARM_AFTER = 10    # `warm`: the window starts after this many iterations (each script's first ones are cold)


def forwards(script, iters):
    return {"imagenet": 2 * iters, "wlm": 2 * iters, "dcgan": 7 * iters + 1}[script]


def runs(small):
    """[(name, script folder, argv, env)]: the 20 runs (names: `pub-examples-SCRIPT-MODEL-VARIANT-no-steps`)."""
    out = []
    def add(script, model, folder, argv, iters, variants):
        for v in variants:
            start = forwards(script, WARM_AFTER) if v == "warm" else 0
            env = {"PUB_PROF_ACTIVITY": "cpu" if v == "cpuactivity" else "cuda",
                   "PUB_PROF_STACK": "1" if v == "stack-cold" else "0",
                   "PUB_PROF_FORWARDS": str(start + forwards(script, iters) - (script == "dcgan" and start > 0)),
                   "PUB_PROF_SECONDS": str(HARD_CAP), **({"PUB_PROF_START": str(start)} if start else {})}
            out.append((f"pub-examples-{script}-{model}-{v}-no-steps", folder, argv, env))
    for arch, batch, iters, stack, warm in [("resnet18", 32, 5, True, True), ("resnet50", 32, 5, True, True),
                                            ("mobilenet_v3_small", 32, 5, True, False),
                                            ("densenet121", 16, 4, False, False)]:
        argv = ["--dummy", "-a", arch, "-b", str(2 if small else batch), "-j", "1" if small else "2", "--gpu", "0"]
        add("imagenet", arch.replace("_", ""), "imagenet", argv, 2 if small else iters,
            ["cold", "cpuactivity"] + (["stack-cold"] if stack else []) + (["warm"] if warm else []))
    for model in ["LSTM", "GRU", "Transformer"]:
        argv = ["--accel", "--model", model, "--epochs", "1", "--data", "{wlm_data}", "--save", "{tmp}/model.pt"]
        argv += ["--emsize", "32", "--nhid", "32", "--batch_size", "4", "--bptt", "10"] if small else []
        add("wlm", model.lower(), "word_language_model", argv, 2 if small else 5,
            ["cold", "cpuactivity"] + (["warm"] if model != "GRU" else []))
    argv = ["--dataset", "fake", "--accel", "--niter", "1", "--manualSeed", "1", "--outf", "{tmp}"]
    argv += ["--batchSize", "4", "--ngf", "8", "--ndf", "8", "--workers", "0"] if small else [
        "--batchSize", "64", "--workers", "2"]
    add("dcgan", "fake", "dcgan", argv, 2 if small else 5, ["cold", "cpuactivity", "stack-cold", "warm"])
    return out


def wlm_data(examples, dst, small):
    """The stand-in WikiText-2 folder (module docstring): the real train.txt when present, else (valid + test) x 4;
    every WLM_JOIN lines joined."""
    src = os.path.join(examples, "word_language_model", "data", "wikitext-2")
    read = lambda n: open(os.path.join(src, n), encoding="utf8").read().splitlines()
    valid, test = read("valid.txt"), read("test.txt")
    train = read("train.txt") if os.path.exists(os.path.join(src, "train.txt")) else (valid + test) * 4
    if small:
        train, valid, test = train[:400], valid[:100], test[:100]
    os.makedirs(dst, exist_ok=True)
    for name, lines in [("train.txt", train), ("valid.txt", valid), ("test.txt", test)]:
        with open(os.path.join(dst, name), "w", encoding="utf8") as f:
            for k in range(0, len(lines), WLM_JOIN):
                f.write(" ".join(x.strip() for x in lines[k:k + WLM_JOIN]) + "\n")
    return dst


def tail(text, n=3000):
    return text[-n:]


def run_one(name, folder, argv, env, examples, outdir, data_dir):
    """Runs one script under the harness; returns its results.jsonl record."""
    raw = os.path.join(outdir, "raw", f"{name}.json.gz")
    tmp = tempfile.mkdtemp(prefix="pub57-")
    argv = [a.format(wlm_data=data_dir, tmp=tmp) for a in argv]
    e = dict(os.environ, PUB_PROF_OUT=raw, **env)
    e["PYTHONPATH"] = os.pathsep.join([HARNESS] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    cwd = os.path.join(examples, folder)
    rec = {"name": name, "script": f"{folder}/main.py", "argv": argv, "env": env, "commit": COMMIT}
    t = time.time()
    p = subprocess.Popen([sys.executable, "main.py", *argv], cwd=cwd, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT)
        rec["timed_out"] = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the run's own session: its DataLoader workers too
        out, err = p.communicate()
        rec["timed_out"] = True
    rec["seconds"] = round(time.time() - t, 1)
    rec["rc"] = p.returncode
    rec["wrote"] = next((x for x in out.splitlines() if x.startswith("pub-prof: wrote")), None)
    rec["stdout_tail"], rec["stderr_tail"] = tail(out, 1500), tail(err)
    with open(os.path.join(outdir, "logs", f"{name}.log"), "w") as f:
        f.write(f"$ cd {cwd} && {' '.join(argv)}\n{json.dumps(env)}\n--- stdout\n{tail(out, 20000)}\n"
                f"--- stderr\n{tail(err, 20000)}\n")
    shutil.rmtree(tmp, ignore_errors=True)
    try:  # whole: the gzip stream reads to its end
        with gzip.open(raw, "rb") as f:
            rec["raw_json_bytes"] = sum(len(b) for b in iter(lambda: f.read(1 << 22), b""))
        rec["raw_gz_bytes"] = os.path.getsize(raw)
    except (OSError, EOFError) as x:
        rec["raw_error"] = f"{type(x).__name__}: {x}"
    return rec


def host_span(path):
    """(first, last) start of the trace's host events, as trim.py counts them."""
    from profiling.profile.trace.traceio import DEVICE_CATS, read_json
    ts = [e["ts"] for e in read_json(path)["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
          and isinstance(e.get("ts"), (int, float)) and str(e.get("cat", "")).lower() not in DEVICE_CATS
          and not str(e.get("cat", "")).lower().startswith("gpu_") and str(e.get("cat", "")).lower() != "trace"]
    return (min(ts), max(ts)) if ts else (0, 0)


def trim_one(name, outdir, deadline=float("inf")):
    """trim.py SRC DST 0, dropping flows, then Python frames, until the cut keeps COVER of the host span; no
    attempt runs past `deadline` (time.time())."""
    raw, dst = os.path.join(outdir, "raw", f"{name}.json.gz"), os.path.join(outdir, f"{name}.json.gz")
    lo, hi = host_span(raw)
    tries = [{}, {"DROP_FLOWS": "1"}, {"DROP_FLOWS": "1", "DROP_PY": "2"}, {"DROP_FLOWS": "1", "DROP_PY": "1"}]
    env = dict(os.environ, PYTHONPATH=REPO)
    best = None
    for k, extra in enumerate(tries):
        out = f"{dst}.try{k}"
        limit = None if deadline == float("inf") else max(1.0, deadline - time.time())
        try:
            p = subprocess.run([sys.executable, TRIM, raw, out, "0"], env=dict(env, **extra), capture_output=True,
                               text=True, cwd=REPO, timeout=limit)
        except subprocess.TimeoutExpired:
            best = best or {"trim_error": "budget: trimming stopped"}
            break
        if p.returncode:
            best = best or {"trim_error": tail(p.stderr, 1500)}
            continue
        cover = (host_span(out)[1] - lo) / (hi - lo) if hi > lo else 1.0
        r = {"trim_env": extra, "trim_how": p.stdout.strip(), "cover": round(cover, 4), "file": out}
        if best is None or "file" not in best or cover > best["cover"] + 1e-9:
            best = r
        if cover >= COVER:
            break
    if "file" in best:
        os.replace(best.pop("file"), dst)
        best["trimmed_bytes"] = os.path.getsize(dst)
    for k in range(len(tries)):
        if os.path.exists(f"{dst}.try{k}"):
            os.remove(f"{dst}.try{k}")
    return best


def pack(outdir, tag, records):
    """Everything but results.jsonl into at most 4 tars; the loose files removed."""
    small = [os.path.join("logs", n) for n in sorted(os.listdir(os.path.join(outdir, "logs")))]
    small += sorted(n for n in os.listdir(outdir) if n.endswith(".json.gz"))
    raws = sorted((os.path.join("raw", n) for n in os.listdir(os.path.join(outdir, "raw"))),
                  key=lambda n: -os.path.getsize(os.path.join(outdir, n)))
    bins = [[0, []] for _ in range(3)]  # first fit, largest first
    left_out = []
    for n in raws:
        size = os.path.getsize(os.path.join(outdir, n))
        b = next((b for b in bins if b[0] + size <= TAR_MAX), None)
        if b is None:
            left_out.append(n); continue
        b[0] += size; b[1].append(n)
    for r in records:
        r["raw_packed"] = os.path.join("raw", f"{r['name']}.json.gz") not in left_out
    tars = [(f"{tag}-trimmed.tar", small)] + [(f"{tag}-raw-{k + 1}.tar", b[1]) for k, b in enumerate(bins) if b[1]]
    for tar_name, names in tars:
        with tarfile.open(os.path.join(outdir, tar_name), "w") as t:
            for n in names:
                t.add(os.path.join(outdir, n), arcname=n)
    for n in small + raws:
        os.remove(os.path.join(outdir, n))
    for d in ("logs", "raw"):
        shutil.rmtree(os.path.join(outdir, d), ignore_errors=True)
    return [t for t, _ in tars], left_out


def write_results(outdir, records):
    with open(os.path.join(outdir, "results.jsonl.tmp"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(os.path.join(outdir, "results.jsonl.tmp"), os.path.join(outdir, "results.jsonl"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("names", nargs="*", help="run names or globs (default: all)")
    ap.add_argument("--examples", default=os.path.join(REPO, ".public", "examples"))
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--budget", type=float, default=0, help="seconds this call may take (0: no limit)")
    ap.add_argument("--no-trim", action="store_true")
    ap.add_argument("--trim-only", action="store_true", help="trim OUTDIR/raw's traces, run nothing")
    ap.add_argument("--no-pack", action="store_true")
    ap.add_argument("--tag", default="pub57")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_intermixed_args()
    t0 = time.time()
    left = lambda: a.budget - (time.time() - t0) if a.budget else float("inf")
    table = [r for r in runs(a.small) if not a.names or any(fnmatch.fnmatch(r[0], g) for g in a.names)]
    if a.list:
        for name, folder, argv, env in table:
            print(name, f"{folder}/main.py", " ".join(argv), json.dumps(env))
        return
    outdir = os.path.abspath(a.outdir)
    for d in ("raw", "logs"):
        os.makedirs(os.path.join(outdir, d), exist_ok=True)
    examples = os.path.abspath(a.examples)
    records = []
    if a.trim_only:
        records = [{"name": n} for n, *_ in table if os.path.exists(os.path.join(outdir, "raw", f"{n}.json.gz"))]
    else:
        data_dir = wlm_data(examples, tempfile.mkdtemp(prefix="pub57-wikitext-"), a.small)
        for name, folder, argv, env in table:
            if left() < 60:
                records.append({"name": name, "skipped": "budget"}); print(f"{name}: skipped (budget)", flush=True)
                continue
            rec = run_one(name, folder, argv, env, examples, outdir, data_dir)
            records.append(rec)
            write_results(outdir, records)
            print(f"{name}: rc {rec['rc']} in {rec['seconds']} s, raw {rec.get('raw_gz_bytes')} B gz"
                  f"{' TIMED OUT' if rec['timed_out'] else ''} | {rec['wrote'] or tail(rec['stderr_tail'], 300)}",
                  flush=True)
        shutil.rmtree(data_dir, ignore_errors=True)
    todo = [r for r in records if "raw_error" not in r
            and os.path.exists(os.path.join(outdir, "raw", f"{r['name']}.json.gz"))]
    if a.no_trim or left() < 90:
        print("trimming skipped", flush=True)
    else:
        with concurrent.futures.ThreadPoolExecutor(max(1, min(8, (os.cpu_count() or 2) // 2))) as pool:
            futs = {pool.submit(trim_one, r["name"], outdir, time.time() + left() - 30): r for r in todo}
            for f in concurrent.futures.as_completed(futs):
                r = futs[f]
                try:
                    r.update(f.result())
                except Exception as x:  # one trace's failure leaves the others
                    r["trim_error"] = f"{type(x).__name__}: {x}"
                print(f"{r['name']}: trimmed {r.get('trimmed_bytes')} B, cover {r.get('cover')}, "
                      f"{r.get('trim_env')} | {r.get('trim_how') or r.get('trim_error')}", flush=True)
    write_results(outdir, records)
    if not a.no_pack:
        tars, left_out = pack(outdir, a.tag, records)
        write_results(outdir, records)
        print("packed:", ", ".join(tars), "| raw left out:", ", ".join(left_out) or "none", flush=True)
    print(f"done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
