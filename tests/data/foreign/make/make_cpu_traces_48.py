"""Makes the own CPU traces added for issue #48 (tests/data/foreign/SOURCES.md): cases the public traces lack, made
the way users profile (a schedule with ProfilerStep markers, record_shapes), plain torch.profiler, no project code.

    .venv/bin/python tests/data/foreign/make/make_cpu_traces_48.py tests/data/foreign [NAME ...]

- a conv net trained from a DataLoader whose Dataset decodes and augments each sample in Python, with
  num_workers=0 and num_workers=2;
- torch.compile inside the profiled window: the first steps of a compiled training loop, a recompile when the batch
  size changes, a compiled inference with a graph break, a compiled step fed by a DataLoader, a compiled train-step
  function (forward, backward and optimizer);
- inference on 2 ranks (gloo), one trace per rank: a tensor-parallel MLP whose partial outputs are all-reduced, and
  a data-parallel evaluation that all-gathers predictions and all-reduces the accuracy.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_cpu_traces import save  # noqa: E402 (the gzipped Chrome trace, as the first corpus pass wrote it)

# a 4-step window after 1 wait and 1 warm-up step, as torch.profiler's docs recipe does; compile cases start at 0
WAIT, WARMUP, ACTIVE = 1, 1, 2


def profiler(path, wait=WAIT, warmup=WARMUP, active=ACTIVE):
    return profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                   schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                   on_trace_ready=lambda p: save(p, path))


class DecodedImages(torch.utils.data.Dataset):
    """Each sample 'decoded' from bytes and augmented in Python: the per-sample work of a real image pipeline."""

    def __init__(self, n=512, side=48):
        g = torch.Generator().manual_seed(0)
        self.raw = [torch.randint(0, 256, (3 * side * side,), dtype=torch.uint8, generator=g).numpy().tobytes()
                    for _ in range(n)]
        self.side = side

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, i):
        x = torch.frombuffer(bytearray(self.raw[i]), dtype=torch.uint8).view(3, self.side, self.side).float() / 255
        top, left = (i * 7) % 9, (i * 5) % 9
        x = x[:, top:top + 40, left:left + 40]  # random crop
        if i % 2:
            x = x.flip(-1)  # horizontal flip
        x = (x - 0.5) / 0.25
        for _ in range(3):  # a slow Python-side colour jitter: the cost a loader worker pays per sample
            x = x * 1.01 + 0.001
        return x, i % 10


def convnet():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def train_from_loader(path, workers, model=None, steps=WAIT + WARMUP + ACTIVE, **sched):
    """A conv net's SGD steps from a DataLoader (batch 32), profiled with a schedule."""
    torch.manual_seed(0)
    model = model or convnet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(DecodedImages(), batch_size=32, shuffle=True, num_workers=workers,
                                         persistent_workers=workers > 0)
    with profiler(path, **sched) as prof:
        for step, (x, y) in enumerate(loader):
            if step == steps:
                break
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))


def compile_first_steps(path):
    """A compiled conv net trained on random batches, profiled from its first step: dynamo and Inductor inside."""
    torch.manual_seed(0)
    model = torch.compile(convnet())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 3, 40, 40), torch.randint(0, 10, (16,))
    with profiler(path, wait=0, warmup=0, active=3) as prof:
        for _ in range(3):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def compile_recompile(path):
    """A compiled MLP whose batch size changes at the 3rd step: the first compile and a recompile (dynamic shapes)
    inside the profiled window."""
    torch.manual_seed(0)
    model = torch.compile(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with profiler(path, wait=0, warmup=0, active=4) as prof:
        for step in range(4):
            x = torch.randn(64 if step < 2 else 48, 256)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def compile_graph_break(path):
    """A compiled inference with a graph break (a Python branch on a tensor's value), from its first call."""
    torch.manual_seed(0)
    net = mlp().eval()

    def forward(x):
        h = net(x)
        if h.mean() > 0:  # data-dependent branch: dynamo breaks the graph here
            h = h * 2
        return h.softmax(-1)

    fn = torch.compile(forward)
    x = torch.randn(32, 256)
    with profiler(path, wait=0, warmup=0, active=3) as prof, torch.inference_mode():
        for _ in range(3):
            fn(x)
            prof.step()


def compile_with_loader(path):
    """A compiled conv net fed by a 0-worker DataLoader, profiled from the first batch: compile and input together."""
    train_from_loader(path, 0, model=torch.compile(convnet()), steps=3, wait=0, warmup=0, active=3)


def compile_train_step(path):
    """A whole train step (forward, backward, optimizer) under torch.compile, profiled from its first call."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)  # one layer: the traced ops of a bigger step pass the corpus's size limit
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    @torch.compile
    def train_step(x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    x = torch.randn(64, 256)
    with profiler(path, wait=0, warmup=0, active=3) as prof:
        for _ in range(3):
            train_step(x)
            prof.step()


def tp_rank(rank, world, port, out):
    """One rank of a 2-way tensor-parallel MLP: a column shard, a row shard, an all-reduce of the partial sums."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    up = torch.nn.Linear(512, 2048 // world)  # column-parallel: each rank holds half the hidden units
    down = torch.nn.Linear(2048 // world, 512, bias=False)  # row-parallel: partial outputs to sum
    x = torch.randn(8, 128, 512)
    path = os.path.join(out, f"own-cpu-tp2-mlp-inference-rank{rank}-of-2.json.gz")
    with profiler(path) as prof, torch.inference_mode():
        for _ in range(WAIT + WARMUP + ACTIVE):
            y = down(torch.nn.functional.gelu(up(x)))
            dist.all_reduce(y)
            y.argmax(-1)
            prof.step()
    dist.destroy_process_group()


def tp_inference(out):
    mp.spawn(tp_rank, args=(2, 29511, out), nprocs=2)


def dp_eval_rank(rank, world, port, out):
    """One rank of a data-parallel evaluation: each rank scores its shard, predictions all-gathered, accuracy
    all-reduced (what DDP users do in their eval loop)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = convnet().eval()
    path = os.path.join(out, f"own-cpu-dp2-convnet-eval-rank{rank}-of-2.json.gz")
    with profiler(path) as prof, torch.no_grad():
        for step in range(WAIT + WARMUP + ACTIVE):
            x, y = torch.randn(32, 3, 40, 40), torch.randint(0, 10, (32,))
            pred = model(x).argmax(-1)
            gathered = [torch.empty_like(pred) for _ in range(world)]
            dist.all_gather(gathered, pred)
            correct = (pred == y).sum()
            dist.all_reduce(correct)
            prof.step()
    dist.destroy_process_group()


def dp_eval(out):
    mp.spawn(dp_eval_rank, args=(2, 29512, out), nprocs=2)


CASES = {
    "own-cpu-convnet-train-loader-0-workers.json.gz": lambda p: train_from_loader(p, 0),
    "own-cpu-convnet-train-loader-2-workers.json.gz": lambda p: train_from_loader(p, 2),
    "own-cpu-compile-convnet-first-steps.json.gz": compile_first_steps,
    "own-cpu-compile-mlp-recompile-batch-size.json.gz": compile_recompile,
    "own-cpu-compile-inference-graph-break.json.gz": compile_graph_break,
    "own-cpu-compile-convnet-loader-first-steps.json.gz": compile_with_loader,
    "own-cpu-compile-train-step-function.json.gz": compile_train_step,
}

if __name__ == "__main__":
    out, names = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(1)  # a shared 2-core machine: one thread keeps the traces comparable
    for name, make in CASES.items():
        if not names or name in names:
            make(os.path.join(out, name))
    if not names or "tp2" in names:
        tp_inference(out)
    if not names or "dp2" in names:
        dp_eval(out)
