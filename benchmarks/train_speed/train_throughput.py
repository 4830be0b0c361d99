"""Training throughput of train.py at its current config: tokens/s and MFU, compilation excluded.

    python3 benchmarks/train_speed/train_throughput.py [--steps 60] [--warmup 10] [--train OLD/train.py]

Builds the model, optimizer and dataloader exactly as train.py does, runs `--warmup` steps (compilation),
then times `--steps` steps with the device synchronized at both ends. FLOPs accounting (as upstream):

    FLOPs/token = 6 x (parameters - token embedding - value embeddings - per-layer scalars)
                  + sum over layers of 12 x heads x head_dim x min(window, sequence length)
    MFU = FLOPs/token x tokens/s / peak bf16 FLOP/s (989.5 TFLOP/s on an H100 SXM)
"""
import argparse
import importlib.util
import inspect
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from benchmarks.common import report  # noqa: E402

import prepare  # noqa: E402
from profiling import runner  # noqa: E402
from profiling.profile.trace import hardware  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--train", metavar="PATH",
                   help="time this copy of train.py instead (e.g. the version before a change, same machine)")
    p.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                   help="set a torch._inductor.config option for this run (experiments)")
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("train", args.train or os.path.join(ROOT, "train.py"))
    train = sys.modules["train"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    for item in args.inductor:
        import torch._inductor.config as inductor_config
        key, value = item.split("=", 1)
        setattr(inductor_config, key, {"True": True, "False": False}.get(value, value))
    device = torch.device(train.DEVICE_TYPE)
    if train.DEVICE_TYPE == "cuda":
        torch.set_float32_matmul_precision("high")
    dataset = prepare.ensure_data()
    tokenizer = prepare.Tokenizer.from_directory()
    torch.manual_seed(42)  # as train.py: two versions' losses compare step by step
    model = train.build_model(tokenizer.get_vocab_size(), device)
    optimizer = train.make_optimizer(model)
    loader = prepare.make_dataloader(tokenizer, train.DEVICE_BATCH_SIZE, prepare.MAX_SEQ_LEN, "train", device=device)
    autocast = torch.autocast(device_type=train.DEVICE_TYPE, dtype=torch.bfloat16)
    if "ranks" in inspect.signature(train.make_train_step).parameters:  # since issue #27 (DDP)
        step_fn, _ = train.make_train_step(model, optimizer, loader, train.check_batch_sizes(1), autocast,
                                           runner.Ranks(train.DEVICE_TYPE == "cuda"))
    else:  # an older train.py (--train)
        step_fn, _ = train.make_train_step(model, optimizer, loader, train.check_batch_sizes(), autocast)
    sync = torch.cuda.synchronize if train.DEVICE_TYPE == "cuda" else (lambda: None)

    t0 = time.time()
    for step in range(args.warmup):
        step_fn(step, 0.0).item()
    sync()
    warmup_s = time.time() - t0
    t0 = time.time()
    prev, losses = None, []
    for step in range(args.warmup, args.warmup + args.steps):
        loss = step_fn(step, 0.0)
        if prev is not None:
            losses.append(prev.item())  # as train.py: step n's loss is read after step n + 1 is launched
        prev = loss
    loss = loss.item()
    losses.append(loss)
    sync()
    elapsed = time.time() - t0

    name = torch.cuda.get_device_name() if train.DEVICE_TYPE == "cuda" else "cpu"
    peak = hardware.peak_flops(name)
    fpt = model.flops_per_token()
    tok_s = train.TOTAL_BATCH_SIZE * args.steps / elapsed
    result = dict(
        device=name, torch=torch.__version__, dataset=dataset, depth=train.DEPTH,
        device_batch_size=train.DEVICE_BATCH_SIZE, total_batch_size=train.TOTAL_BATCH_SIZE,
        seq_len=prepare.MAX_SEQ_LEN, num_params=sum(p.numel() for p in model.parameters()),
        flops_per_token=fpt, steps=args.steps, warmup_steps=args.warmup, warmup_seconds=round(warmup_s, 1),
        step_ms=round(1000 * elapsed / args.steps, 2), tokens_per_s=round(tok_s),
        mfu_percent=round(100 * fpt * tok_s / peak, 2) if peak else None,
        peak_memory_mb=round(torch.cuda.max_memory_allocated() / 2**20, 1) if train.DEVICE_TYPE == "cuda" else None,
        train_file=args.train or "train.py", last_loss=round(loss, 4), date=time.strftime("%Y-%m-%d"),
    )
    result["losses"] = [round(x, 6) for x in losses]  # every timed step's loss (constant LR: progress 0)
    report(result, args.json, omit=("losses",))


if __name__ == "__main__":
    main()
