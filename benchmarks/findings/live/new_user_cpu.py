"""Issue #49's second acceptance line, tried as a new user would on the CPU: four loops, each profiled through
the public API or a callback exactly as its documentation shows, each in a subprocess of its own, then each
report read for what the acceptance asks.

    python benchmarks/findings/live/new_user_cpu.py                     # the four loops once, a Markdown
    table python benchmarks/findings/live/new_user_cpu.py --runs 3 --json out.json
    python benchmarks/findings/live/new_user_cpu.py --loop plain --dir /tmp/x   # one loop, in this process
    (what a child runs)

The loops (the default schedule: 3 warm-up + 5 timed, profiler warm-up at step 9, steps 10-14 profiled, the
shape step 15, the line-record step 16):
- hf: a tiny GPT-2 from a config through transformers' Trainer with profiling.HFCallback(),
  logging_steps=10 and save_steps=5 (a log at step 10, checkpoints at 5, 10, 15, 20: one of each in the
  window), the Trainer's output in a temporary folder;
- lightning: an MLP in nn.Sequential through L.Trainer with profiling.LightningCallback(), validation every 12
  training batches (val_check_interval=12: the validation loop runs between steps 12 and 13, inside the
  window), log_every_n_steps=10, the default logger and progress bar;
- plain: a tiny GPT (examples/lightning_train.py's) in a loop of its own with profiling.Profiler, an evaluation
  of 100 forward batches after step 12;
- lbfgs: a regression MLP trained by torch.optim.LBFGS, `optimizer.step(closure)`, with profiling.Profiler.

What each report is read for (the acceptance: "no CHECK FAILED that the same loop without the profiler would
not also trip; the per-step figures within 10% of the median of the like steps; no cut locations"):
- the `CHECK FAILED:` lines. Every check the report makes is on the profiler's window (its steps' operator
  counts, the profiled step against the timed ones, ...): the same loop without the profiler has no window, so
  it trips none of them, and any CHECK FAILED fails the line;
- the report's ms/step against the median of the like steps (the profiled steps' own durations, read from the
  trace's ProfilerStep events, less the steps the report names one-off), and its samples/s or tokens/s against
  the same median: within 10%;
- one-off lines (`one-off, not per step:`): the eval, the save, the log flush, named;
- cut locations: a file:line in the lines table written with `,...`, or a path cut (not ending in
  `.py:LINE`, or with `...` in its middle).
torch keeps its default thread count (a new user sets none); the load average is printed with each run.
"""
import argparse
import glob
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LOOPS = ("hf", "lightning", "plain", "lbfgs")
WITHIN = 0.10           # the acceptance's "within 10% of the median of the like steps"
STEPS = 20              # training steps: past the default schedule's 16, so the profile ends by itself
EVAL_AFTER = 12         # the plain loop's eval follows this (1-based) step: inside the window (steps 10-14)
EVAL_BATCHES = 100      # the eval: 100 batches of forwards


# ---------------------------------------------------------------------------------------------------------
# The loops (each runs in a child process: `--loop NAME --dir DIR`; its last line is `profile: <folder>`)
# ---------------------------------------------------------------------------------------------------------

def load_example(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def hf_loop(work, profiled=True):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator

    import profiling
    torch.manual_seed(0)
    seq_len, vocab, batch = 64, 512, 4
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=64, n_layer=2, n_head=4))
    data = load_example("hf_trainer").RandomTokens(STEPS * batch, seq_len, vocab)
    args = TrainingArguments(output_dir=os.path.join(work, "trainer"), max_steps=STEPS,
                             per_device_train_batch_size=batch, use_cpu=True, report_to="none",
                             logging_steps=10, save_steps=5, seed=0)
    callbacks = [profiling.HFCallback()] if profiled else []
    Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
            callbacks=callbacks).train()
    return callbacks[0].folder if callbacks else None


def lightning_loop(work, profiled=True):
    import lightning as L
    import torch
    from torch import nn

    import profiling

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                     nn.Linear(512, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)

    def loader(n):
        data = torch.utils.data.TensorDataset(torch.randn(n * 64, 128), torch.randint(10, (n * 64,)))
        return torch.utils.data.DataLoader(data, batch_size=64)

    callbacks = [profiling.LightningCallback()] if profiled else []
    trainer = L.Trainer(accelerator="cpu", max_steps=STEPS, val_check_interval=12, log_every_n_steps=10,
                        default_root_dir=work, callbacks=callbacks)
    trainer.fit(Classifier(), loader(40), loader(30))
    return callbacks[0].folder if callbacks else None


def run_steps(prof, train_step):
    """The loop of the plain and LBFGS runs: train_step(step) for steps 1..STEPS, then `prof.step()` when
    profiled, as profiling.Profiler's documentation shows; the profile's folder after `prof.close()` (None
    unprofiled)."""
    for step in range(1, STEPS + 1):
        train_step(step)
        if prof:
            prof.step()
    if prof:
        prof.close()
        return prof.folder
    return None


def evaluate(model, batches):
    """The held-out batches' forwards, no gradient: what a user's eval does."""
    import torch
    with torch.no_grad():
        for ids in batches:
            model(ids)


def plain_loop(work, profiled=True):
    import torch

    import profiling
    example = load_example("lightning_train")
    size = example.SIZES["tiny"]
    torch.manual_seed(0)
    model = example.GPT(size)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(size.vocab, (STEPS, size.batch, size.seq_len + 1))
    held_out = [torch.randint(size.vocab, (size.batch, size.seq_len)) for _ in range(EVAL_BATCHES)]
    prof = profiling.Profiler(model, tokens_per_step=size.batch * size.seq_len,
                              out_dir=os.path.join(work, "profiles")) if profiled else None

    def train_step(step):
        loss = example.lm_loss(model, tokens[step - 1, :, :-1], tokens[step - 1, :, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == EVAL_AFTER:
            evaluate(model, held_out)
    return run_steps(prof, train_step)


def lbfgs_loop(work, profiled=True):
    import torch
    from torch import nn

    import profiling
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    y = torch.sin(x.sum(1, keepdim=True))
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=5)

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    prof = profiling.Profiler(model, samples_per_step=len(x), out_dir=os.path.join(work, "profiles")) \
        if profiled else None
    return run_steps(prof, lambda step: opt.step(closure))


RUN = {"hf": hf_loop, "lightning": lightning_loop, "plain": plain_loop, "lbfgs": lbfgs_loop}


# ---------------------------------------------------------------------------------------------------------
# Reading a report
# ---------------------------------------------------------------------------------------------------------

def trace_steps(folder):
    """[(name, ms)] of the profiled steps, from the trace's ProfilerStep#N events, in order."""
    paths = glob.glob(os.path.join(folder, "*.json.gz")) + glob.glob(os.path.join(folder, "*.json"))
    paths = [p for p in paths if "summary" not in os.path.basename(p)]
    if not paths:
        return []
    opener = gzip.open if paths[0].endswith(".gz") else open
    with opener(paths[0], "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = sorted((e["ts"], e["name"], e["dur"]) for e in events
                   if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X")
    return [(name, dur / 1e3) for _, name, dur in steps]


WHOLE = re.compile(r"^`?(\.\.\./)?[\w.<>/-]+\.py:\d+")   # a location: a path (shortened from the left at most)
                                                           # ending in `.py:LINE`


def cut_locations(report):
    """The locations written cut: any `,...` in the report (a location list cut as the old renderer did), and
    each row of a lines table (a table whose first header is `line`) whose first cell is not a whole
    `path.py:LINE` (a path shortened from the left, `.../gpt2/modeling_gpt2.py:698`, is whole)."""
    cut, in_lines = [], False
    for line in report.splitlines():
        if ",..." in line:
            cut.append(line.strip()[:100])
            continue
        if not line.startswith("|"):
            in_lines = False
            continue
        first = line.split("|")[1].strip()
        if first == "line":
            in_lines = True
        elif in_lines and not set(first) <= set("-") and not WHOLE.match(first):
            cut.append(first[:100])
    return cut


def read(folder):
    """What the acceptance asks of one profile folder."""
    with open(os.path.join(folder, "report.md")) as f:
        report = f.read()
    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    each = trace_steps(folder)
    off = {r["step"] for r in summary.get("one_off") or () if r.get("step")}
    like = [ms for name, ms in each if name not in off]
    median = statistics.median(like) if like else None
    step = summary.get("step_ms")
    rate, per = None, None
    for key, unit in (("samples_per_s", "samples_per_step"), ("tokens_per_second", "tokens_per_step")):
        if summary.get(key) and summary.get(unit) and median:
            rate = summary[key] / (summary[unit] / (median / 1e3))  # the report's rate over the median's
            per = key
            break
    return {
        "failed": [line for line in report.splitlines() if line.startswith("CHECK FAILED")],
        "notes": [line for line in report.splitlines() if line.startswith("note:")],
        "one_off": [line for line in report.splitlines() if line.startswith("one-off")],
        "title": next((line for line in report.splitlines() if line.startswith("# Profile")), ""),
        "step_ms": step, "like_median_ms": median, "each_ms": [round(ms, 2) for _, ms in each],
        "one_off_steps": sorted(off), "step_ratio": step / median if step and median else None,
        "rate_ratio": rate, "rate_key": per, "cut": cut_locations(report),
        "checks": summary.get("checks"), "folder": folder,
    }


# ---------------------------------------------------------------------------------------------------------
# Driving the children and the table
# ---------------------------------------------------------------------------------------------------------

def run_child(loop, work, profiled=True):
    cmd = [sys.executable, os.path.abspath(__file__), "--loop", loop, "--dir", work]
    if not profiled:
        cmd.append("--no-profile")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=work, timeout=900)
    seconds = time.perf_counter() - t0
    folder = next((line.split("profile: ", 1)[1] for line in reversed(done.stdout.splitlines())
                   if line.startswith("profile: ")), None)
    if done.returncode or (profiled and not folder):
        tail = (done.stdout + done.stderr)[-3000:]
        return {"loop": loop, "rc": done.returncode, "error": tail, "seconds": seconds}
    out = read(folder) if profiled else {}
    out.update(loop=loop, rc=done.returncode, seconds=round(seconds, 1),
               load=os.getloadavg()[0], stderr_lines=[x for x in done.stderr.splitlines() if "profil" in x][:5])
    return out


def cell_checks(r):
    if not r["failed"]:
        return "none"
    return "; ".join(x.removeprefix("CHECK FAILED: ")[:160] for x in r["failed"]) + \
        " (without the profiler: no, a check on the profiler's window)"


def verdict(ratio):
    return "-" if ratio is None else f"{ratio:.3f} ({'yes' if abs(ratio - 1) <= WITHIN else 'NO'})"


def table(results):
    rows = ["| run | loop | CHECK FAILED | report ms/step vs median of like steps (within 10%?) | rate vs the "
            "median's (within 10%?) | one-off lines | cut locations |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['run']} | {r['loop']} | run failed (exit {r['rc']}) | | | | |")
            continue
        one_off = "<br>".join(x.removeprefix("one-off, not per step: ")[:200] for x in r["one_off"]) or "none"
        rows.append(f"| {r['run']} | {r['loop']} | {cell_checks(r)} | {r['step_ms']:.2f} vs "
                    f"{r['like_median_ms']:.2f}: {verdict(r['step_ratio'])} | {verdict(r['rate_ratio'])} | "
                    f"{one_off} | {', '.join(r['cut']) or 'none'} |")
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loop", choices=LOOPS, help="run this one loop here (a child's job)")
    p.add_argument("--loops", default=",".join(LOOPS), help="which loops, comma-separated")
    p.add_argument("--dir", help="the child's working folder")
    p.add_argument("--no-profile", action="store_true", help="the same loop without the profiler")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--json", help="write every result here")
    args = p.parse_args(argv)
    if args.loop:
        sys.path.insert(0, ROOT)
        folder = RUN[args.loop](args.dir, profiled=not args.no_profile)
        print(f"profile: {folder}" if folder else "done", flush=True)
        return
    results = []
    for run in range(1, args.runs + 1):
        for loop in args.loops.split(","):
            work = tempfile.mkdtemp(prefix=f"newuser-{loop}-")
            r = run_child(loop, work)
            r["run"] = run
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "checks"}), flush=True)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
