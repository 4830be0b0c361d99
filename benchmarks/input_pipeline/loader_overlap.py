"""Benchmark: how long the training loop waits in next(loader) while it is busy with its own work.

    uv run python benchmarks/input_pipeline/loader_overlap.py [--batches 12] [-B 128] [-T 2048] [--busy 2.0]

On the active dataset of AUTORESEARCH_CACHE (8192-token tokenizer; `uv run prepare.py --dataset builtin`
prepares one). First times the loader's host work alone (packed_batches: read, tokenize, pack) per batch,
M ms. Then, for each loader, a consumer takes a batch and is busy `--busy` x M ms before the next: either
holding the GIL (a pure-Python loop, as the training loop's kernel launches and autograd do) or asleep
(GIL released). Reported per batch, as shares of M: the mean wait in next(), and what the loader cost
the consumer in all (its batch's wall time minus its busy work alone: the wait plus the time a thread's
GIL use took from the Python loop). Loaders:

- inline: the batches made on the consumer's thread (make_dataloader before issue #25);
- thread: made ahead by a background thread, a queue LOADER_DEPTH deep (tokenizing releases the GIL,
  reading and packing do not);
- worker: prepare.make_dataloader as it is, one DataLoader worker process LOADER_DEPTH deep.
Prints a Markdown table (benchmarks/input_pipeline/loader_results.md keeps the measured ones).
"""
import argparse
import os
import platform
import queue
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
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


def spin(n):
    """n iterations of a pure-Python loop: fixed work, so time taken from it by other threads shows."""
    x = 0
    for i in range(n):
        x += i
    return x


def calibrate(seconds):
    t0 = time.perf_counter()
    spin(1_000_000)
    return int(1_000_000 * seconds / (time.perf_counter() - t0))


def waits(loader, batches, busy_s, spins):
    """(mean wait in next(), mean cost per batch beyond the consumer's own work), in seconds."""
    work = (lambda: spin(spins)) if spins else (lambda: time.sleep(busy_s))
    next(loader)  # start-up (a worker's fork, the first batch) is not the steady state
    work()
    waited, t_start = 0.0, time.perf_counter()
    for _ in range(batches):
        t0 = time.perf_counter()
        next(loader)
        waited += time.perf_counter() - t0
        work()
    return waited / batches, (time.perf_counter() - t_start) / batches - busy_s


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
    rows, busy_s = [], args.busy * make
    spins = calibrate(busy_s)
    for name, make_loader in (("inline", inline), ("thread", threaded), ("worker", worker)):
        for hold_gil in (True, False):
            wait, cost = waits(make_loader(tok, args.B, args.T), args.batches, busy_s, spins if hold_gil else 0)
            rows.append((name, "Python loop (GIL held)" if hold_gil else "sleep (GIL released)",
                         f"{1e3 * wait:.1f}", f"{100 * wait / make:.0f}%", f"{100 * cost / make:.0f}%"))
    print(f"{platform.node() and 'this machine'}: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}; B={args.B} T={args.T}; making one batch alone: {1e3 * make:.0f} ms; "
          f"consumer busy {args.busy:g}x that per batch; {args.batches} batches each\n")
    print("| loader | consumer busy with | wait in next() ms | wait / making time | cost to the consumer / making time |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
