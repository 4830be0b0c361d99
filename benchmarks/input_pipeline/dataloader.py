"""
Benchmark: builtin preparation from scratch, and make_dataloader throughput at the training shape.

    uv run python benchmarks/input_pipeline/dataloader.py                  # or: python3
    benchmarks/input_pipeline/dataloader.py uv run python benchmarks/input_pipeline/dataloader.py --device
    cuda    # include the host-to-GPU copies

1. Prepares the builtin corpus and trains a VOCAB 8192 tokenizer in a fresh temporary cache, timing both.
2. Times make_dataloader (B=128, T=2048, train split) after one warm-up batch, on the active dataset of
   AUTORESEARCH_CACHE when that holds a prepared dataset with an 8192 tokenizer, else on the fresh cache.
Prints a Markdown table (copy it into benchmarks/input_pipeline/dataloader_results.md). Needs torch, tiktoken,
pyarrow, numpy (and rustbpe for step 1); not uv, requests or tabulate.
"""

import argparse
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import prepare

VOCAB = 8192
GPU_TOKENS_PER_S = 1.7e6  # what the H100 consumes at the default config


class CountingTokenizer:
    """Counts the tokens the loader encodes, to show how many it throws away when cropping."""

    def __init__(self, tokenizer):
        self.tokenizer, self.encoded = tokenizer, 0

    def get_bos_token_id(self):
        return self.tokenizer.get_bos_token_id()

    def encode(self, texts, prepend=None):
        ids = self.tokenizer.encode(texts, prepend=prepend)
        self.encoded += sum(map(len, ids))
        return ids


def time_preparation(cache):
    t0 = time.time()
    prepare.prepare_builtin(cache, prepare.DEFAULT_NUM_SHARDS)
    t1 = time.time()
    prepare.train_tokenizer("builtin", VOCAB, cache)
    t2 = time.time()
    manifest = prepare.read_manifest("builtin", cache)
    return {"shards_s": t1 - t0, "tokenizer_s": t2 - t1, "documents": manifest["documents"],
            "files": manifest["files"]}


def loader_cache(fresh):
    """(cache, dataset) to time the loader on: AUTORESEARCH_CACHE's active dataset if it has a VOCAB
    tokenizer, else the fresh builtin cache (None when there is none)."""
    env = os.environ.get("AUTORESEARCH_CACHE")
    if env and prepare.active_dataset(env) and os.path.isdir(prepare.tokenizer_dir(None, VOCAB, env)):
        return env, prepare.active_dataset(env)
    return (fresh, "builtin") if prepare.read_manifest("builtin", fresh) else (None, None)


def time_loader(cache, name, B, T, batches, device):
    tok = CountingTokenizer(prepare.Tokenizer.from_directory(prepare.tokenizer_dir(name, VOCAB, cache)))
    loader = prepare.make_dataloader(tok, B, T, "train", device=device, dataset=name, cache=cache)
    next(loader)  # warm-up: fills the 1000-document buffer
    encoded0, t0 = tok.encoded, time.time()
    for _ in range(batches):
        x, _, epoch = next(loader)
    if x.is_cuda:
        import torch
        torch.cuda.synchronize()
    dt = time.time() - t0
    return {"dataset": name, "tokens_per_s": batches * B * T / dt, "s_per_batch": dt / batches,
            "encoded_per_emitted": (tok.encoded - encoded0) / (batches * B * T), "epoch": epoch}


def table(rows):
    width = max(len(r[0]) for r in rows)
    lines = [f"| {'measure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    return "\n".join(lines + [f"| {k.ljust(width)} | {v} |" for k, v in rows])


def main():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--batches", type=int, default=20, help="timed batches after the warm-up (default 20)")
    p.add_argument("-B", type=int, default=128, help="rows per batch (default 128)")
    p.add_argument("-T", type=int, default=2048, help="tokens per row (default 2048)")
    p.add_argument("--device", default="cpu", help="where batches go (default cpu)")
    p.add_argument("--skip-prepare", action="store_true",
                   help="only time the loader (needs AUTORESEARCH_CACHE)")
    args = p.parse_args()
    rows = [("machine", f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")]
    with tempfile.TemporaryDirectory(prefix="autoresearch-bench-") as fresh:
        if not args.skip_prepare:
            prep = time_preparation(fresh)
            rows += [(f"builtin shards from scratch ({prep['files']} files -> {prep['documents']} documents)",
                      f"{prep['shards_s']:.1f} s"),
                     (f"tokenizer training, vocab {VOCAB}", f"{prep['tokenizer_s']:.1f} s")]
        cache, name = loader_cache(fresh)
        if cache is None:
            sys.exit(f"no {VOCAB}-token tokenizer to time: set AUTORESEARCH_CACHE or drop --skip-prepare")
        r = time_loader(cache, name, args.B, args.T, args.batches, args.device)
    keeps_up = "yes" if r["tokens_per_s"] >= GPU_TOKENS_PER_S else "no"
    rows += [(f"make_dataloader, {r['dataset']} train, B={args.B} T={args.T}, {args.device}",
              f"{r['tokens_per_s'] / 1e6:.2f} M tokens/s ({r['s_per_batch'] * 1e3:.0f} ms/batch)"),
             ("tokens encoded per token emitted (cropping loss)", f"{r['encoded_per_emitted']:.2f}"),
             (f"keeps up with the GPU's {GPU_TOKENS_PER_S / 1e6:.1f} M tokens/s", keeps_up)]
    print(table(rows))


if __name__ == "__main__":
    main()
