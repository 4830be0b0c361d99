"""One rank of tests/test_train_ddp.py's torchrun runs (not a test module): `torchrun ... ddp_worker.py MODE OUT`.

    params  train a few steps of the cpu-preset model with DDP and two micro-batches per rank (the no_sync
            path); write every parameter's checksum and the first loss to OUT/rank-<k>.json
    eval    evaluate_bpb of the seeded, untrained model, split over however many ranks there are; OUT/rank-<k>.json
    crash   train, and raise on rank 1 at its third step
    hang    train, and kill rank 1 (SIGKILL) at its third step while rank 0 waits in the gradient all-reduce
"""
import json
import os
import signal
import sys

import torch

import prepare
import train
from profiling import runner


def main(mode, out):
    ranks = runner.Ranks(cuda=False)
    ranks.join()
    torch.manual_seed(42)
    tokenizer = prepare.Tokenizer.from_directory()
    model = train.build_model(tokenizer.get_vocab_size(), torch.device("cpu"))
    result = {}
    if mode == "eval":
        model.eval()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            result["val_bpb"] = prepare.evaluate_bpb(model, tokenizer, 2)
    else:
        B = 2
        accum = train.TOTAL_BATCH_SIZE // (B * prepare.MAX_SEQ_LEN * ranks.world_size)
        loader = prepare.make_dataloader(tokenizer, B, prepare.MAX_SEQ_LEN, "train")
        step_fn, _ = train.make_train_step(model, train.make_optimizer(model), loader, accum,
                                           torch.autocast("cpu", dtype=torch.bfloat16), ranks)
        losses = []
        for step in range(4):
            if mode in ("crash", "hang") and ranks.rank == 1 and step == 2:
                if mode == "crash":
                    raise RuntimeError("planted failure on rank 1")
                os.kill(os.getpid(), signal.SIGKILL)
            losses.append(step_fn(step, 0.0).item())
        result = {"micro_batches": accum, "losses": losses,
                  "params": {n: [p.double().sum().item(), p.double().square().sum().item()]
                             for n, p in model.named_parameters()}}
    with open(os.path.join(out, f"rank-{ranks.rank}.json"), "w") as f:
        json.dump(result, f)
    ranks.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
