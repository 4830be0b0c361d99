"""Does a profile leave the run as it found it, and keep its report, whatever happens after its steps? (issue #55)

A GPT-2 (6 layers, bf16 autocast on CUDA) fed by a Dataset that tokenizes text in Python, read with
num_workers=0 (the Dataset and the collate run in the training thread, a common first loop), profiled through
the API (`with profiling.Profiler(...)`) or through `profiling.HFCallback()` under a Hugging Face Trainer. Each
run is one fresh process; the step is timed from one step's end to the next (`loss.item()` ends each step in
the API loop; a synchronize in the timing callback under the Trainer), with nothing else changed:

    plain   the loop just goes on after the profile
    slow    the step right after the profiled ones also saves a checkpoint and waits, ~30x a step in all
    raise   the step right after the profiled ones raises; the program catches it and trains on (the API: a
            new loop without the profiler; the Trainer: a second train() without the profiler's callback)

The form "none" is the API loop with a stand-in that does nothing but count the steps a profile would take:
the same save, the same exception at the same step, no profiler. It measures what the host's own drift and
the case itself do to the steps after, against which the other forms' "after" is read. `--pin CORE` runs each
process on one CPU core (taskset), which steadies the host on machines whose cores run at different speeds.

Each run prints one JSON line: whether the report is there (prof.report / the callback's report), the median
of the NEAR unprofiled steps just before the window opens and of the steps after the profile is done (its first
SETTLE left out), their ratio, every step's time, and what of the capture is still on after it (leftovers()).
After every step (outside its time) one SHA-256 of 1 MiB is timed: C code that no tracer, mode or CUPTI
subscription the capture could leave slows, so its median after over before is the host core's own change of
speed; `after_vs_before_host_speed` is the steps' ratio divided by it.
The host's speed drifts within a process on these machines (a loop's unprofiled steps ran 25 ms, then 33 ms
20 steps later, in one H200 process): so the steps just before the window, not the first ones, are the base.

    python3 benchmarks/profiler_cost/leaves_no_trace.py --all --reps 3 --out results.jsonl   # the H100 run
    python3 benchmarks/profiler_cost/leaves_no_trace.py api slow                             # one run
On the CPU (no GPU) it runs too, smaller, in float32: a check of the script, not a measurement.
"""
import argparse
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORMS, CASES = ("api", "hf", "none"), ("plain", "slow", "raise")
BEFORE = 20            # steps before the profiler exists; the first SETTLE of them left out
AFTER = 40             # steps after the profile is done; the first SETTLE of them left out
SETTLE = 5
NEAR = 12              # the unprofiled steps just before the window that the steps after are held against
SLOW_X = 30            # the slow step: a checkpoint save, then a wait up to this many median steps in all
REF = bytes(range(256)) * 4096  # 1 MiB: the host's speed, timed after every step (host_speed below)
WORDS = ("the quick brown fox jumps over a lazy dog while profilers count every launch of each kernel "
         "and data loaders tokenize text in python one character at a time").split()


class Words:
    """A map-style Dataset whose __getitem__ tokenizes text in Python: words hashed character by character."""

    def __init__(self, seq_len, vocab):
        self.seq_len, self.vocab = seq_len, vocab

    def __len__(self):
        return 10_000_000

    def __getitem__(self, i):
        import torch
        ids, k = [], i
        while len(ids) < self.seq_len + 1:
            word = WORDS[k % len(WORDS)] + WORDS[(k * 7) % len(WORDS)]
            h = 0
            for ch in word:
                h = (h * 131 + ord(ch)) % self.vocab
            ids.append(h)
            k += 3
        ids = torch.tensor(ids[:self.seq_len + 1])
        return {"input_ids": ids[:-1], "labels": ids[1:]}


def setup():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    cuda = torch.cuda.is_available()
    torch.manual_seed(0)
    if cuda:
        config, batch, seq = GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=256), 16, 256
    else:
        config, batch, seq = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=512), 4, 64
    model = GPT2LMHeadModel(config).to("cuda" if cuda else "cpu")
    return model, Words(seq, config.vocab_size), batch, seq, cuda


def median_ms(times):
    return round(1e3 * statistics.median(times), 3) if times else None


def host_speed(refs):
    """Time one SHA-256 of 1 MiB (~0.6 ms; C code a Python tracer, a dispatch mode or CUPTI cannot slow) and append
    it to `refs`: the host core's own speed at that step, against which its steps' drift is read."""
    start = time.perf_counter()
    hashlib.sha256(REF).digest()
    refs.append(time.perf_counter() - start)
    return time.perf_counter()


def slow_save(model, step_s):
    """A checkpoint save, then a wait: SLOW_X median steps in all."""
    import torch
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(model.state_dict(), os.path.join(tmp, "checkpoint.pt"))
    time.sleep(max(0.0, SLOW_X * step_s - (time.perf_counter() - start)))


class Stand:
    """The "none" form's stand-in for a Profiler: it counts steps, done when a profile would be, nothing more."""

    def __init__(self, total):
        self.steps, self.total_steps, self.done, self.report, self.folder = 0, total, False, None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def step(self):
        self.steps += 1
        self.done = self.steps >= self.total_steps


def run_api(case, out_dir, profiled=True):
    import torch

    import profiling
    model, data, batch, seq, cuda = setup()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = iter(torch.utils.data.DataLoader(data, batch_size=batch, num_workers=0))
    device = "cuda" if cuda else "cpu"
    times, marks, data = [], {"ref": []}, []

    def train(steps, prof=None):
        """The loop: a step, its loss read, prof.step(); `case` happens in the step after the profiled ones."""
        last = time.perf_counter()
        for _ in range(steps):
            b = next(loader)
            data.append(time.perf_counter() - last)
            with torch.autocast(device, torch.bfloat16, enabled=cuda):
                loss = model(input_ids=b["input_ids"].to(device), labels=b["labels"].to(device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss.item()
            if prof is not None and prof.steps == prof.total_steps - (3 if cuda else 2) and "case" not in marks:
                marks["case"] = len(times)  # the step after the last profiled one (the shape step)
                if case == "slow":
                    slow_save(model, statistics.median(times[SETTLE:BEFORE]))
                elif case == "raise":
                    raise RuntimeError("the user's own error, right after the profiled steps")
            if prof is not None:
                prof.step()
            now = time.perf_counter()
            times.append(now - last)
            last = host_speed(marks["ref"])
            if prof is not None and prof.done and "done" not in marks:
                marks["done"] = len(times)

    train(BEFORE)
    caught = None
    try:
        with (profiling.Profiler(model, tokens_per_step=batch * seq, out_dir=out_dir) if profiled else
              Stand(3 + 5 + 1 + 5 + 2 + int(cuda))) as prof:
            train(prof.total_steps + AFTER, prof)
    except RuntimeError as e:
        caught = str(e)
        marks["done"] = len(times)
        train(AFTER)  # the program goes on without the profiler
    marks["data"] = data  # each step's wait for its batch (the Dataset's Python), beside its whole time
    return prof.report, prof.folder, times, marks, caught


def run_hf(case, out_dir):
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import profiling
    model, data, batch, seq, cuda = setup()
    times, marks = [], {"ref": []}
    profile = profiling.HFCallback(warmup_steps=BEFORE)
    window_end = BEFORE + 5 + 1 + 5  # warm-up, timed, profiler warm-up, active: then the shape step

    class Timer(TrainerCallback):
        last = None

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            if state.global_step == window_end and profile.run is not None and "case" not in marks:
                marks["case"] = len(times)
                if case == "slow":
                    slow_save(model, statistics.median(times[SETTLE:BEFORE]))
                elif case == "raise":
                    raise RuntimeError("the user's own error, right after the profiled steps")
            now = time.perf_counter()
            if self.last is not None:
                times.append(now - self.last)
            self.last = host_speed(marks["ref"]) if self.last is not None else now
            if profile.report is not None and "done" not in marks:
                marks["done"] = len(times)

    def args(steps):
        return TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch, max_steps=steps,
                                 dataloader_num_workers=0, bf16=cuda, use_cpu=not cuda, report_to=[],
                                 logging_strategy="no", save_strategy="no", disable_tqdm=True, seed=0)

    timer = Timer()
    trainer = Trainer(model=model, args=args(window_end + 3 + AFTER), train_dataset=data,
                      callbacks=[profile, timer])
    caught = None
    try:
        trainer.train()
    except RuntimeError as e:
        caught = str(e)
        marks["done"] = len(times)
        trainer.remove_callback(profile)  # the program trains on, without the profiler
        timer.last = None
        trainer.args.max_steps = AFTER
        trainer.train()
    return profile.report, profile.folder, times, marks, caught


def leftovers():
    """What the capture could leave on, where it is still on (tests/profile/test_lifecycle.py checks the same)."""
    import threading
    import warnings

    import torch
    from torch.utils.data import dataloader
    on = {"torch.profiler": torch.autograd.profiler._is_profiler_enabled, "sys.settrace": sys.gettrace() is not None,
          "sys.setprofile": sys.getprofile() is not None,
          "threads": [t.name for t in threading.enumerate() if t.name.startswith("autoresearch")],
          "torch function modes": torch._C._len_torch_function_stack(),
          "dispatch modes": torch._C._len_torch_dispatch_stack(),
          "DataLoader patched": dataloader._BaseDataLoaderIter.__next__.__module__ != dataloader.__name__,
          "sync debug mode": torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0,
          "always-warnings added": [str(f) for f in warnings.filters if f not in FILTERS and f[0] == "always"
                                    and f[2] is Warning]}  # the capture's (detail.py: every warning, recorded);
    # a library's own for its category (scipy.special's SpecialFunctionWarning, added at its import) is not
    return {k: v for k, v in on.items() if v}


FILTERS = []  # the warning filters as the run begins (libraries add their own at import)


def window_start(times):
    """The index of the step that opened the window: the first over 5x the median of those before it."""
    for i in range(BEFORE, len(times)):
        if times[i] > 5 * statistics.median(times[SETTLE:i]):
            return i
    return BEFORE


def one(form, case):
    import warnings
    out_dir = tempfile.mkdtemp(prefix="leaves-no-trace-")
    start = time.perf_counter()
    import transformers  # noqa: F401 (its filters and numpy's, before the run's)
    FILTERS[:] = warnings.filters
    run = {"api": run_api, "hf": run_hf, "none": lambda *a: run_api(*a, profiled=False)}[form]
    report, folder, times, marks, caught = run(case, out_dir)
    done = marks.get("done", len(times))
    opened = window_start(times)
    before, after = times[max(SETTLE, opened - NEAR):opened], times[done + SETTLE:]
    ref = marks.get("ref") or []
    ref_before, ref_after = ref[max(SETTLE, opened - NEAR):opened], ref[done + SETTLE:]
    speed = (statistics.median(ref_after) / statistics.median(ref_before)) if ref_before and ref_after else None
    import torch
    return {"form": form, "case": case, "device": torch.cuda.get_device_name() if torch.cuda.is_available()
            else "cpu", "report": report is not None, "report_head": (report or "").splitlines()[:1],
            "folder": folder, "caught": caught, "before_ms": median_ms(before), "after_ms": median_ms(after),
            "after_vs_before": round(median_ms(after) / median_ms(before), 4) if before and after else None,
            "n_before": len(before), "n_after": len(after), "window_step": opened, "case_step": marks.get("case"),
            "done_step": done, "steps_ms": [round(1e3 * t, 2) for t in times], "left_on": leftovers(),
            "data_before_ms": median_ms(marks["data"][max(SETTLE, opened - NEAR):opened]) if "data" in marks else None,
            "data_after_ms": median_ms(marks["data"][done + SETTLE:]) if "data" in marks else None,
            "ref_before_ms": median_ms(ref_before), "ref_after_ms": median_ms(ref_after),
            "after_vs_before_host_speed": round(median_ms(after) / median_ms(before) / speed, 4)
            if before and after and speed else None,
            "python_objects": len(gc.get_objects()), "os_threads": len(os.listdir("/proc/self/task"))
            if os.path.isdir("/proc/self/task") else None,
            "seconds": round(time.perf_counter() - start, 1)}


def run_all(reps, out, forms, cases, pin=None):
    """Each (form, case) `reps` times, one fresh process each, in turn; one JSON line each to `out`."""
    pinned = ["taskset", "-c", str(pin)] if pin is not None else []
    rows = []
    for rep in range(reps):
        for form in forms:
            for case in cases:
                run = subprocess.run(pinned + [sys.executable, __file__, form, case], cwd=ROOT, capture_output=True,
                                     text=True, timeout=600)
                lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
                row = json.loads(lines[-1]) if run.returncode == 0 and lines else \
                    {"form": form, "case": case, "failed": run.returncode, "stderr": run.stderr[-1500:]}
                row["rep"] = rep
                row["profiling_said"] = [line for line in run.stderr.splitlines() if line.startswith("profiling:")]
                rows.append(row)
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{form:4} {case:6} rep {rep}: report {row.get('report')} before {row.get('before_ms')} ms "
                      f"after {row.get('after_ms')} ms ({row.get('after_vs_before')}; at the host's speed "
                      f"{row.get('after_vs_before_host_speed')}) left on "
                      f"{row.get('left_on')} {row.get('seconds')} s", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("form", nargs="?", choices=FORMS)
    p.add_argument("case", nargs="?", choices=CASES)
    p.add_argument("--all", action="store_true", help="every form and case, fresh processes")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--out", default="leaves_no_trace.jsonl")
    p.add_argument("--pin", type=int, help="run each process on this CPU core (taskset)")
    a = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    if a.all:
        run_all(a.reps, a.out, a.forms.split(","), a.cases.split(","), a.pin)
        return 0
    if not (a.form and a.case):
        p.error("give FORM and CASE, or --all")
    print(json.dumps(one(a.form, a.case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
