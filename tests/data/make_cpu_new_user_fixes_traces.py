"""Regenerate the CPU traces of issue #56's new-user loops (benchmarks/findings/live/new_user_fixes_cpu.py's,
smaller), each through the public API as a user would, on one torch thread (on this shared 2-core host two
threads spin against the other processes: a 16-block MLP recorded with two led with cpu_threads):

    OMP_NUM_THREADS=1 .venv/bin/python tests/data/make_cpu_new_user_fixes_traces.py [NAME ...]

- cpu-mlp16-adamw-foreach-off.trace.json.gz: nn.Sequential of 16 blocks (Linear(64, 64), LayerNorm, GELU) and a
  head, AdamW(foreach=False), profiling.Profiler with 2 profiled steps: a stack of layers on one line (16 times a
  block of 3 operators, each Linear with a weight of its own) and an optimizer that updates tensor by tensor.
- cpu-hf-gpt2-dropout.trace.json.gz: a 4-layer GPT-2 from a GPT2Config (dropout at its default 0.1, nothing
  downloaded) in transformers' Trainer with profiling.HFCallback(active_steps=2): GPT-2's Conv1D line
  (transformers/pytorch_utils.py, `torch.addmm(self.bias, x, self.weight)`) run 16 times a step, a weight of
  its own each time.
- cpu-varlen-steps.trace.json.gz: a 2-block causal transformer given a new sequence length every step
  (LENGTHS: a 512-token step among the timed ones; the 3 profiled steps of 96, 320 and 512 tokens, none 2x
  their median, the longest over 2x the shortest), through
  profiling.profile_steps(active_steps=3).
- cpu-varlen-one-line-step.trace.json.gz: the benchmark's varlen loop itself (4 blocks of width 128, 32 to 512
  tokens a step, AdamW as CPU tensors get it: tensor by tensor) driven by `profile_steps(lambda: step(), ...)`
  from this script, so that one line of the user's code runs the forward, the backward and the update (the
  step's code lies outside this script's folder), with the default schedule: the steps timed after the window.
- cpu-hf-gpt2-faults.trace.json.gz: the benchmark's hf loop itself (a 4-layer GPT-2 of width 128, 8 x 128
  tokens a step, the Trainer's defaults) with profiling.HFCallback(active_steps=2): its timed steps' page faults
  (glibc's malloc handing freed memory back every step) and what one costs on this host (capture/faults.py).

Deterministic in shape (operator names and counts), not in timings. Each a few hundred KB at most.
"""
import glob
import os
import shutil
import sys
import tempfile

import torch
from torch import nn

DATA = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(DATA))
sys.path.insert(0, ROOT)
# the lengths of the varlen loop's steps, in order: 3 warm-up, 5 timed (one 512), 1 profiler warm-up, 3 profiled
LENGTHS = (128, 64, 256, 96, 512, 128, 160, 192, 128, 96, 320, 512, 128, 128)


def _keep(folder, name):
    path = glob.glob(os.path.join(folder, "*", "trace.json.gz"))[0]
    shutil.copyfile(path, os.path.join(DATA, name))
    print(f"wrote {name} ({os.path.getsize(os.path.join(DATA, name))} bytes)")


def mlp(tmp):
    import profiling
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()) for _ in range(16)],
                          nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x, y = torch.randn(64, 64), torch.randint(10, (64,))
    prof = profiling.Profiler(model, samples_per_step=64, active_steps=2, out_dir=tmp)
    for _ in range(prof.total_steps):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        prof.step()
    prof.close()
    _keep(tmp, "cpu-mlp16-adamw-foreach-off.trace.json.gz")


def hf(tmp):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator

    import profiling
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from hf_trainer import RandomTokens
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=4, n_head=4))
    args = TrainingArguments(output_dir=os.path.join(tmp, "trainer"), max_steps=20, per_device_train_batch_size=4,
                             use_cpu=True, report_to="none", save_strategy="no", seed=0)
    Trainer(model=model, args=args, train_dataset=RandomTokens(80, 64, 512), data_collator=default_data_collator,
            callbacks=[profiling.HFCallback(active_steps=2, out_dir=tmp)]).train()
    _keep(tmp, "cpu-hf-gpt2-dropout.trace.json.gz")


def varlen(tmp):
    import profiling
    from benchmarks.findings.live.new_user_fixes_cpu import TinyGPT
    torch.manual_seed(0)
    model = TinyGPT.build(vocab=512, width=64, depth=2, heads=2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(512, (4, 513))
    lengths = iter(LENGTHS * 4)

    def step():
        t = next(lengths)
        ids = data[:, :t + 1]
        loss = nn.functional.cross_entropy(model(ids[:, :-1]).reshape(-1, 512), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    profiling.profile_steps(step, model, active_steps=3, out_dir=tmp, max_timed_steps=5)  # LENGTHS' steps only
    _keep(tmp, "cpu-varlen-steps.trace.json.gz")


def one_line(tmp):
    import profiling
    from benchmarks.findings.live.new_user_fixes_cpu import lengths_of, varlen_parts
    model, step = varlen_parts("mistake", lengths_of(0))
    profiling.profile_steps(lambda: step(), model, out_dir=tmp)  # the step's code outside this script's folder
    _keep(tmp, "cpu-varlen-one-line-step.trace.json.gz")


def faults(tmp):
    from benchmarks.findings.live.new_user_fixes_cpu import hf_run
    hf_run("mistake", 30, tmp, profiled=True, before=0, options={"active_steps": 2})
    _keep(tmp, "cpu-hf-gpt2-faults.trace.json.gz")


MAKERS = {"mlp": mlp, "hf": hf, "varlen": varlen, "one_line": one_line, "faults": faults}

if __name__ == "__main__":
    for name in sys.argv[1:] or MAKERS:
        with tempfile.TemporaryDirectory() as tmp:
            MAKERS[name](tmp)
