"""Regenerate tests/data/cpu-tiny-mlp-3steps.trace.json.gz: a real torch.profiler trace of a CPU-only run.

    uv run python tests/data/make_cpu_trace.py

A tiny two-layer MLP language model trained with AdamW, profiled with CPU activity only under the schedule
wait=0, warmup=1, active=3, repeat=1, so the trace has three ProfilerStep windows and no device events.
Deterministic in shape (op names and counts), not in timings.
"""
import gzip
import os
import shutil
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, schedule

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu-tiny-mlp-3steps.trace.json.gz")
VOCAB, DIM, B, T = 64, 32, 4, 16


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, 4 * DIM), torch.nn.ReLU(),
        torch.nn.Linear(4 * DIM, DIM), torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, VOCAB),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        x = torch.randint(0, VOCAB, (B, T + 1))
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # first calls are slow (oneDNN kernel selection): keep them out of the trace
        step()
    tmp = tempfile.mkdtemp()
    raw = os.path.join(tmp, "trace.json")
    sched = schedule(wait=0, warmup=1, active=3, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched,
                 on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
        for _ in range(4):
            step()
            prof.step()
    with open(raw, "rb") as src, gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    shutil.rmtree(tmp)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
