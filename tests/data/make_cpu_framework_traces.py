"""Regenerate tests/data/cpu-{hf,lightning}-*.trace.json.gz: real CPU traces of the Hugging Face Trainer and
Lightning, profiled through their one-line callbacks (profiling.HFCallback / LightningCallback), as a new
user's first run on a laptop makes them (issue #49).

    uv run python tests/data/make_cpu_framework_traces.py [NAME ...]     # default: all of them

- hf-gpt2-logging: GPT-2 (transformers' GPT2LMHeadModel from a tiny GPT2Config, nothing downloaded) under
  `Trainer`, logging every 5 steps: a logging step falls among the timed steps and one among the profiled steps.
- hf-gpt2-save: the same as benchmarks/findings/live/new_user_cpu.py's HF loop, logging every 10 steps and
saving a checkpoint
  every 5: the log and the save of step 10 run in the second profiled step (HF runs them after on_step_end),
  ~1.5x the others on a loaded 2-core CPU; its first 4 profiled steps kept (tests/data/trim_trace.py) to stay
  small.
- hf-gpt2-ended: the same as hf-gpt2-logging, max_steps ending the run after 2 of the 5 profiled steps (before the shape and
  line steps).
- lightning-sequential: a classifier whose MLP is one `nn.Sequential` (parameters `net.0.weight`, ...), a
  CSVLogger writing every 5 steps.
- lightning-gpt-width: a small GPT whose micro-batch (1 x 64 tokens) is as many tokens as the model is wide
  (64), so activations have the shape of the square weights and of the position table.
- lightning-raises: the Sequential classifier, its training_step raising a ValueError in the 2nd profiled step.

Each keeps the callback's defaults (3 warm-up, 5 timed, 1 profiler warm-up, 5 profiled steps, then the shape
and line-record steps). Deterministic in shape, not in timings.
"""
import glob
import gzip
import json
import os
import shutil
import sys
import tempfile
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root: `profiling`

import profiling  # noqa: E402
import trim_trace  # noqa: E402  (tests/data/trim_trace.py, beside this file)

STEPS = 20            # the profile takes 16 (3 + 5 + 1 + 5 + 1 + 1)
ENDED_STEPS = 11      # 3 warm-up + 5 timed + 1 profiler warm-up + 2 of the 5 profiled steps
RAISE_AT = 11         # optimizer steps done when training_step raises: in the 2nd profiled step


def hf(out, max_steps=STEPS, logging_steps=5, save_steps=None):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n):
            self.ids = torch.randint(512, (n, 64), generator=torch.Generator().manual_seed(0))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=64))
    args = TrainingArguments(output_dir=out, max_steps=max_steps, per_device_train_batch_size=4,
                             learning_rate=3e-4, use_cpu=True, report_to="none",
                             save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
                             logging_strategy="steps", logging_steps=logging_steps, disable_tqdm=True,
                             dataloader_num_workers=0, seed=0)
    callback = profiling.HFCallback(out_dir=out)
    Trainer(model=model, args=args, train_dataset=Tokens(max_steps * 4), data_collator=default_data_collator,
            callbacks=[callback]).train()


class Classifier(nn.Module):
    """A plain MLP classifier, as Lightning's tutorials write one: one nn.Sequential."""

    def __init__(self, features=32, hidden=64, classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def lightning(out, which, raise_at=None):
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
    import lightning_train

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = Classifier() if which == "sequential" else lightning_train.GPT(
                lightning_train.Size(layers=2, dim=64, heads=4, seq_len=64, vocab=512, batch=1))

        def training_step(self, batch, batch_idx):
            if raise_at is not None and self.trainer.global_step == raise_at:
                raise ValueError("a bad batch")
            x, y = batch
            out = self.model(x)
            loss = F.cross_entropy(out.flatten(0, -2), y.flatten())
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-4)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if which == "sequential":
        data = torch.utils.data.TensorDataset(torch.randn(STEPS * 16, 32, generator=g),
                                              torch.randint(10, (STEPS * 16,), generator=g))
        batch = 16
    else:
        tokens = torch.randint(512, (STEPS, 65), generator=g)
        data, batch = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:]), 1
    loader = torch.utils.data.DataLoader(data, batch_size=batch)
    callback = profiling.LightningCallback(out_dir=out)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=CSVLogger(out),
                        log_every_n_steps=5, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=out, callbacks=[callback])
    try:
        trainer.fit(Module(), loader)
    except ValueError:
        if raise_at is None:
            raise


MAKERS = {
    "hf-gpt2-logging": lambda out: hf(out),
    "hf-gpt2-save": lambda out: hf(out, logging_steps=10, save_steps=5),
    "hf-gpt2-ended": lambda out: hf(out, ENDED_STEPS),
    "lightning-sequential": lambda out: lightning(out, "sequential"),
    "lightning-gpt-width": lambda out: lightning(out, "gpt"),
    "lightning-raises": lambda out: lightning(out, "sequential", RAISE_AT),
}

KEEP_STEPS = {"hf-gpt2-save": 4}   # profiled steps kept: the save's and 3 like ones (irregular.MIN_STEPS)


def main(names):
    warnings.filterwarnings("ignore")
    for name in names or MAKERS:
        out = tempfile.mkdtemp(prefix=f"{name}-")
        try:
            MAKERS[name](out)
            traces = sorted(glob.glob(os.path.join(out, "**", "trace.json.gz"), recursive=True))
            dest = os.path.join(HERE, f"cpu-{name}.trace.json.gz")
            if name in KEEP_STEPS:
                with gzip.open(traces[-1], "rt") as f:
                    trace = trim_trace.trim(json.load(f), KEEP_STEPS[name])
                with open(dest, "wb") as f:
                    f.write(gzip.compress(json.dumps(trace, separators=(",", ":")).encode(), compresslevel=9, mtime=0))
            else:
                shutil.copy(traces[-1], dest)
            print(f"{dest}: {os.path.getsize(dest) / 1e3:.0f} KB")
        finally:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
