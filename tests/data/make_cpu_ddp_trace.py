"""Regenerate tests/data/cpu-ddp-{2ranks,straggler,comm}/: real 2-rank DDP profiles on the CPU.

    uv run python tests/data/make_cpu_ddp_trace.py

Two processes (torch.multiprocessing), the gloo backend, a tiny MLP language model wrapped in
DistributedDataParallel (small buckets, so several gradient all-reduces per step) and trained with AdamW.
Each rank profiles 1 warm-up + 2 active steps with CPU activity and record_shapes=True, as
profiling.profile.capture.window does (schedule wait=0, repeat=1; prof.step() after each step), and writes
OUT/rank-<k>.trace.json.gz with an `autoresearch` metadata dict (rank, world_size, device, tokens_per_step,
unprofiled_step_ms, ...). Variants: `2ranks` balanced (compute hides most of the all-reduces); `straggler` the
same with 4 extra 1024x1024 matmuls per step on rank 1 only, so rank 0 waits for it in the all-reduces;
`comm` a batch of one row, so the all-reduces outlast the compute. Deterministic in shape (op names and
counts), not in timings. `... make_cpu_ddp_trace.py cpu-ddp-comm` makes one variant; `--out DIR` writes elsewhere.
Timings are noisy: the committed folders come from an idle 16-vCPU virtual machine (`python3
make_cpu_ddp_trace.py --out DIR`, torch 2.11.0) whose cores differed up to 1.5x in the time of one matmul, so
two ranks doing the same work differed by 9% of the step in the balanced folder (9-34% over seven runs there,
with or without pinning ranks to cores). On a 2-core machine shared with other work they differ far more: make them on an idle one.
"""
import gzip
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule

HERE = os.path.dirname(os.path.abspath(__file__))
# folder -> (rows per rank, extra matmuls per step on rank 1)
VARIANTS = {"cpu-ddp-2ranks": (256, 0), "cpu-ddp-straggler": (256, 4), "cpu-ddp-comm": (1, 0)}
WORLD = 2
VOCAB, DIM, LAYERS, T = 256, 128, 4, 32
BUCKET_MB = 0.15          # DDP bucket size: 7 gradient all-reduces per step for this model
WARMUP, ACTIVE, TIMED = 1, 2, 5


def _model():
    layers = [torch.nn.Embedding(VOCAB, DIM)]
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(DIM, 4 * DIM), torch.nn.ReLU(), torch.nn.Linear(4 * DIM, DIM)]
    return torch.nn.Sequential(*layers, torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, VOCAB))


def _worker(rank, port, out, rows, straggle):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=BUCKET_MB)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    extra = torch.randn(DIM * 8, DIM * 8) if straggle and rank == 1 else None

    def step():
        x = torch.randint(0, VOCAB, (rows, T + 1), generator=gen)
        if extra is not None:
            for _ in range(straggle):
                torch.mm(extra, extra)
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # first calls are slow (oneDNN kernel selection, DDP's bucket rebuild)
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(TIMED):
        step()
    unprofiled = (time.perf_counter() - t0) / TIMED * 1e3
    dist.barrier()
    raw = os.path.join(out, f".rank-{rank}.json")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=WARMUP, active=ACTIVE, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
        for _ in range(WARMUP + ACTIVE):
            step()
            prof.step()
    with open(raw, encoding="utf-8") as f:
        trace = json.load(f)
    os.remove(raw)
    for key in ("traceName", "ERROR"):  # this machine's temp path; kineto's no-GPU error line
        trace.pop(key, None)
    trace["autoresearch"] = {
        "version": 1, "rank": rank, "world_size": WORLD, "device": "cpu", "torch": torch.__version__,
        "tokens_per_step": rows * T * WORLD, "unprofiled_step_ms": round(unprofiled, 3),
        "warmup_steps": WARMUP, "active_steps": ACTIVE, "micro_batches": 1,
    }
    with gzip.GzipFile(os.path.join(out, f"rank-{rank}.trace.json.gz"), "wb", compresslevel=9, mtime=0) as f:
        f.write(json.dumps(trace).encode())
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(args):
    root = args[args.index("--out") + 1] if "--out" in args else HERE  # --out DIR: write the folders there
    names = [a for a in args if a in VARIANTS]
    for name in names or VARIANTS:
        out = os.path.join(root, name)
        os.makedirs(out, exist_ok=True)
        mp.spawn(_worker, args=(_free_port(), out, *VARIANTS[name]), nprocs=WORLD, join=True)
        for k in range(WORLD):
            path = os.path.join(out, f"rank-{k}.trace.json.gz")
            print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
