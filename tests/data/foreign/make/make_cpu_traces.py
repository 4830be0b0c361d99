"""Makes the corpus's own CPU traces (tests/data/foreign/SOURCES.md): plain torch.profiler, no project code.

    .venv/bin/python tests/data/foreign/make/make_cpu_traces.py tests/data/foreign
"""
import gzip
import os
import shutil
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def save(prof, path):
    """The Chrome trace, gzipped, as torch.profiler writes it."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)


def inference_with_shapes(path):
    """A tiny conv net's inference under inference_mode, record_shapes, a schedule: 2 ProfilerSteps."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 30 * 30, 10)).eval()
    x = torch.randn(4, 3, 32, 32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: save(p, path)) as prof, torch.inference_mode():
        for _ in range(4):
            model(x).softmax(-1)
            prof.step()


def training_without_schedule(path):
    """A tiny MLP's training steps profiled with no schedule and no prof.step(): no ProfilerStep markers."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    save(prof, path)


def annotated_without_schedule(path):
    """An embedding model's inference with record_function blocks, memory and stacks, no schedule."""
    model = torch.nn.Sequential(torch.nn.Embedding(100, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 100))
    tokens = torch.randint(0, 100, (8, 16))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                 with_stack=True) as prof, torch.no_grad():
        for i in range(2):
            with record_function(f"request_{i}"):
                model(tokens).argmax(-1)
    save(prof, path)


if __name__ == "__main__":
    out = sys.argv[1]
    torch.manual_seed(0)
    inference_with_shapes(os.path.join(out, "own-cpu-inference-shapes-2steps.json.gz"))
    training_without_schedule(os.path.join(out, "own-cpu-train-no-schedule.json.gz"))
    annotated_without_schedule(os.path.join(out, "own-cpu-inference-annotated-no-schedule.json.gz"))
