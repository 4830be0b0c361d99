"""Regenerate tests/data/cpu-loader-workers{0,2}.trace.json.gz: real torch.profiler traces of a CPU run fed by a
DataLoader whose Dataset does slow Python work per sample (issue #48: input-bound steps).

    uv run python tests/data/make_cpu_loader_traces.py

A small conv net trained with SGD on 32x32 "images" that the Dataset decodes in pure Python (a loop over the
pixels per sample, ~1-2 ms each), batch 8, profiled with CPU activity only under the schedule wait=1, warmup=1,
active=3, repeat=1: three ProfilerStep windows, each opening with the DataLoader's
`enumerate(DataLoader)#..._DataLoaderIter.__next__`. With num_workers=0 the decoding and the collate run in the
training thread (`_SingleProcessDataLoaderIter`); with num_workers=2 the main thread waits on two workers
(`_MultiProcessingDataLoaderIter`) that cannot keep up. Deterministic in shape, not in timings.
"""
import gzip
import os
import shutil
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, schedule

DATA = os.path.dirname(os.path.abspath(__file__))
SIDE, BATCH, CLASSES = 32, 8, 10
DECODE_PASSES = 6  # ~2-3 ms of Python per sample on this machine: the loader, not the model, sets the step


class Decoding(torch.utils.data.Dataset):
    """Samples made by a slow Python decode: every pixel computed in the interpreter, as a Dataset that decodes
    and augments images with Python code does."""

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        pixels = [((i * 31 + j * 17) % 255) / 255.0 for j in range(3 * SIDE * SIDE)]  # the per-sample work:
        for _ in range(DECODE_PASSES):                                               # a decode, then augments
            pixels = [min(1.0, p * 1.01) for p in pixels]
        return torch.tensor(pixels).view(3, SIDE, SIDE), i % CLASSES


def model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, CLASSES))


def train_step(net, opt, x, y):
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def record(workers, out):
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one intra-op thread: on a shared machine more only contend
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Decoding(), batch_size=BATCH, num_workers=workers,
                                         persistent_workers=workers > 0)
    batches = iter(loader)
    for _ in range(3):  # first calls are slow (oneDNN kernel selection, the workers' start): keep them out
        train_step(net, opt, *next(batches))
    tmp = tempfile.mkdtemp()
    raw = os.path.join(tmp, "trace.json")
    sched = schedule(wait=1, warmup=1, active=3, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched,
                 on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
        for x, y in batches:
            train_step(net, opt, x, y)
            prof.step()
            if prof.step_num >= 5:
                break
    with open(raw, "rb") as src, gzip.GzipFile(out, "wb", compresslevel=9, mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    shutil.rmtree(tmp)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


def main():
    for workers in (0, 2):
        record(workers, os.path.join(DATA, f"cpu-loader-workers{workers}.trace.json.gz"))


if __name__ == "__main__":
    main()
