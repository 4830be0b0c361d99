"""Benchmark: how long the training loop waits in next(loader) while it is busy with its own work.

    uv run python benchmarks/loader_overlap.py [--batches 12] [-B 128] [-T 2048] [--busy 2.0]

On the active dataset of AUTORESEARCH_CACHE (8192-token tokenizer; `uv run prepare.py --dataset builtin`
prepares one). First times the loader's host work alone (packed_batches: read, tokenize, pack) per batch,
M ms. Then, for each loader, a consumer takes a batch and is busy `--busy` x M ms before the next: either
holding the GIL (a pure-Python loop, as the training loop's kernel launches and autograd do) or asleep
(GIL released). Reported: the mean wait in next() as a share of M. Loaders:

- inline: the batches made on the consumer's thread (make_dataloader before issue #25);
- thread: made ahead by a background thread, a queue LOADER_DEPTH deep (tokenizing releases the GIL,
  reading and packing do not);
- worker: prepare.make_dataloader as it is, one DataLoader worker process LOADER_DEPTH deep.
Prints a Markdown table (benchmarks/loader_overlap_results.md keeps the measured ones).
"""
import argparse
import os
import platform
import queue
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import prepare  # noqa: E402


def inline(tok, B, T):
    for pair, epoch in prepare.packed_batches(tok, B, T, "train"):
        pair = torch.from_numpy(pair)
        yield pair[0], pair[1], epoch


def threaded(tok, B, T):
    q = queue.Queue(prepare.LOADER_DEPTH)

    def fill():
        for item in prepare.packed_batches(tok, B, T, "train"):
            q.put(item)

    threading.Thread(target=fill, daemon=True).start()
    while True:
        pair, epoch = q.get()
        pair = torch.from_numpy(pair)
        yield pair[0], pair[1], epoch


def worker(tok, B, T):
    return prepare.make_dataloader(tok, B, T, "train")


def busy(seconds, hold_gil):
    if not hold_gil:
        time.sleep(seconds)
        return
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


def waits(loader, batches, busy_s, hold_gil):
    next(loader)  # start-up (a worker's fork, the first batch) is not the steady state
    busy(busy_s, hold_gil)
    total = 0.0
    for _ in range(batches):
        t0 = time.perf_counter()
        next(loader)
        total += time.perf_counter() - t0
        busy(busy_s, hold_gil)
    return total / batches


def main():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("-B", type=int, default=128)
    p.add_argument("-T", type=int, default=2048)
    p.add_argument("--busy", type=float, default=2.0, help="consumer busy time per batch, x the making time")
    args = p.parse_args()
    tok = prepare.Tokenizer.from_directory()
    gen = prepare.packed_batches(tok, args.B, args.T, "train")
    next(gen)
    t0 = time.perf_counter()
    for _ in range(args.batches):
        next(gen)
    make = (time.perf_counter() - t0) / args.batches
    rows = []
    for name, make_loader in (("inline", inline), ("thread", threaded), ("worker", worker)):
        for hold_gil in (True, False):
            wait = waits(make_loader(tok, args.B, args.T), args.batches, args.busy * make, hold_gil)
            rows.append((name, "Python loop (GIL held)" if hold_gil else "sleep (GIL released)",
                         f"{1e3 * wait:.1f}", f"{100 * wait / make:.0f}%"))
    print(f"{platform.node() and 'this machine'}: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}; B={args.B} T={args.T}; making one batch alone: {1e3 * make:.0f} ms; "
          f"consumer busy {args.busy:g}x that per batch; {args.batches} batches each\n")
    print("| loader | consumer busy with | wait in next() ms | wait / making time |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
