"""Regenerate the CPU traces of steps and spans that do not repeat (issue #48 item 2 and 5, issue #49 item 1):

    .venv/bin/python tests/data/make_cpu_one_off_traces.py [NAME ...]

- cpu-one-off-eval.trace.json.gz: a plain loop under profiling.Profiler (5 profiled steps) with an evaluation of
  EVAL_BATCHES forwards in `evaluate()` after profiled step 3, inside that step's window.
- cpu-one-off-save.trace.json.gz: the same loop with a checkpoint save (torch.save of a 64 MB state, three times)
  in profiled step 2.
- cpu-compile-in-window.json.gz: plain torch.profiler, no schedule, started before the first call of a
  torch.compile'd MLP: 4 training iterations with a hand-written SGD update (no optimizer annotation, no module
  scopes), the first of which compiles (Dynamo's and Inductor's annotations).
- cpu-loop-100-no-markers.json.gz: plain torch.profiler, no schedule, 100 forwards of an eager MLP (no optimizer,
  no DataLoader, no module scopes): only the operators repeat.
- cpu-one-call-16-forwards.json.gz: plain torch.profiler with modules, no schedule: one `record_function("generate")`
  call whose inner loop runs the model 16 times (a decode loop), after 2 warm-up calls outside the profile.

Deterministic in shape (operator names and counts), not in timings. Each under 300 KB.
"""
import gzip
import os
import shutil
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, record_function

DATA = os.path.dirname(os.path.abspath(__file__))
EVAL_BATCHES = 12   # the eval's forwards: about 4x a training step's time (issue #49: 100.8 against 26.1 ms)
BIG = (16, 1024, 1024)  # the checkpoint's tensor: 64 MB of float32
WIDTH = 256         # the profiled loop's MLP: 256 -> 1024 -> 256 on 256 samples, ~20-30 ms a step on 2 cores


def _model(width=64):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, width))


def _save(prof, path):
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as dst:
            shutil.copyfileobj(src, dst)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def _profiled_loop(name, extra_at, extra):
    """profiling.Profiler over a plain loop (1 warm-up, 3 timed, 1 profiler warm-up, 5 profiled steps); `extra()`
    runs inside profiled step `extra_at` (1-based), before prof.step()."""
    import profiling
    model = _model(WIDTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, WIDTH), torch.randn(256, WIDTH)
    with tempfile.TemporaryDirectory() as tmp:
        prof = profiling.Profiler(model, out_dir=tmp, warmup_steps=1, timed_steps=3, active_steps=5,
                                  samples_per_step=256)
        step = 0
        while not prof.done:
            step += 1
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if step == 5 + extra_at:  # 1 warm-up + 3 timed + 1 profiler warm-up before the first profiled
                extra(model, tmp)
            prof.step()
        src = next(os.path.join(root, f) for root, _, files in os.walk(tmp) for f in files if f == "trace.json.gz")
        shutil.copy(src, os.path.join(DATA, name))
    print(f"wrote {name}")


def evaluate(model, _tmp):
    """An evaluation pass: EVAL_BATCHES forwards under no_grad (as a loop's eval every N steps)."""
    with torch.no_grad():
        for _ in range(EVAL_BATCHES):
            model(torch.randn(256, WIDTH)).sum()


def save_checkpoint(model, tmp):
    """A checkpoint save of a large state (written three times: a slow disk's worth on a fast one)."""
    state = {"model": model.state_dict(), "big": torch.randn(*BIG)}
    for _ in range(3):
        torch.save(state, os.path.join(tmp, "checkpoint.pt"))


def compile_in_window(path):
    model = _model()
    compiled = torch.compile(model)
    x = torch.randn(32, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            compiled(x).square().mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
    _save(prof, path)


def loop_without_markers(path):
    model = _model(32)
    x = torch.randn(8, 32)
    with torch.no_grad():
        for _ in range(3):
            model(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(100):
                model(x).relu().sum()
    _save(prof, path)


def one_call(path):
    model = _model(32)

    def generate(x, tokens=16):
        with record_function("generate"), torch.no_grad():
            for _ in range(tokens):
                x = model(x).tanh()
        return x

    x = torch.randn(4, 32)
    generate(x, 2)
    with profile(activities=[ProfilerActivity.CPU], with_modules=True, with_stack=True) as prof:
        generate(x)
    _save(prof, path)


MAKERS = {
    "cpu-one-off-eval.trace.json.gz": lambda path: _profiled_loop(os.path.basename(path), 3, evaluate),
    "cpu-one-off-save.trace.json.gz": lambda path: _profiled_loop(os.path.basename(path), 2, save_checkpoint),
    "cpu-compile-in-window.json.gz": compile_in_window,
    "cpu-loop-100-no-markers.json.gz": loop_without_markers,
    "cpu-one-call-16-forwards.json.gz": one_call,
}


if __name__ == "__main__":
    for name in sys.argv[1:] or MAKERS:
        MAKERS[name](os.path.join(DATA, name))
