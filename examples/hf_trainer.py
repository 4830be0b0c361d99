"""A Llama trained by Hugging Face's `Trainer` on random tokens, profiled by adding one callback:
`Trainer(..., callbacks=[profiling.HFCallback()])`. The model is `transformers.LlamaForCausalLM` built from a
`LlamaConfig` (nothing downloaded); the Trainer is used as its documentation shows, so the profile is what an
outside Hugging Face user gets. Sizes: `tiny` (CPU tests) and `gpu` (~125M parameters: 12 layers, 768 wide,
12 heads, 4 key/value heads, SwiGLU 2048, Llama 2's vocab of 32000; batch 16 x 1024 tokens, bf16).

    python examples/hf_trainer.py --size tiny --steps 3 --device cpu
    python examples/hf_trainer.py --size gpu --profile profiles                 # the report via HFCallback
    python examples/hf_trainer.py --size gpu --compile --accumulation 2 --profile profiles

With --profile the last line printed is `profile: <folder>` (report.md, summary.json and the trace).
"""
import argparse
import math
import os
import time
from dataclasses import dataclass

import torch


@dataclass
class Size:
    layers: int
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    batch: int  # per device, per micro-batch


SIZES = {
    "tiny": Size(layers=2, dim=64, heads=4, kv_heads=2, ffn=128, vocab=512, seq_len=64, batch=4),
    # Llama-2-like at GPT-2 small's scale: at batch 16 x 1024 a step is ~100 ms on an H100 (bf16, eager)
    "gpu": Size(layers=12, dim=768, heads=12, kv_heads=4, ffn=2048, vocab=32000, seq_len=1024, batch=16),
}


class RandomTokens(torch.utils.data.Dataset):
    """`n` sequences of random token ids (labels = inputs: the model shifts them itself), made up front."""

    def __init__(self, n, seq_len, vocab, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(vocab, (n, seq_len), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build_model(size):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=size.vocab, hidden_size=size.dim, intermediate_size=size.ffn,
                         num_hidden_layers=size.layers, num_attention_heads=size.heads,
                         num_key_value_heads=size.kv_heads, max_position_embeddings=size.seq_len,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=SIZES, default="tiny")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (max_steps; a profile takes 16-17)")
    p.add_argument("--batch", type=int, help="sequences per device per micro-batch (default: the size's)")
    p.add_argument("--accumulation", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    p.add_argument("--no-nan-filter", action="store_true",
                   help="TrainingArguments(logging_nan_inf_filter=False): no isnan/isinf read of the loss each step")
    p.add_argument("--non-blocking", action="store_true",
                   help="batches copied without waiting: accelerator_config non_blocking, pinned by the DataLoader")
    p.add_argument("--profile", metavar="DIR", help="add profiling.HFCallback, writing into DIR")
    p.add_argument("--output-dir", default=os.path.join("out", "hf_trainer"), help="the Trainer's output_dir")
    args = p.parse_args(argv)
    if args.steps < 1 or args.accumulation < 1:
        p.error("--steps and --accumulation need 1 or more")
    return args


def main(argv=None):
    args = parse_args(argv)
    from transformers import Trainer, TrainingArguments, default_data_collator
    torch.manual_seed(0)
    size = SIZES[args.size]
    batch, cuda = args.batch or size.batch, args.device.startswith("cuda")
    model = build_model(size)
    data = RandomTokens(args.steps * batch * args.accumulation, size.seq_len, size.vocab)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=batch,
        gradient_accumulation_steps=args.accumulation, learning_rate=3e-4, weight_decay=0.1, warmup_steps=0,
        bf16=cuda, use_cpu=not cuda, torch_compile=args.compile, seed=0,
        optim="adamw_torch_fused" if cuda else "adamw_torch", report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        logging_nan_inf_filter=not args.no_nan_filter, dataloader_pin_memory=True,
        accelerator_config={"non_blocking": args.non_blocking})
    callbacks = []
    if args.profile:
        import profiling
        callbacks.append(profiling.HFCallback(out_dir=args.profile))
    trainer = Trainer(model=model, args=training, train_dataset=data, data_collator=default_data_collator,
                      callbacks=callbacks)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"Llama {args.size} (transformers Trainer): {params:.1f}M parameters, batch {batch} x "
          f"{args.accumulation} x {size.seq_len} tokens on {args.device}"
          + (", compiled" if args.compile else ""))
    t0 = time.perf_counter()
    out = trainer.train()
    ms = 1e3 * (time.perf_counter() - t0) / max(out.global_step, 1)
    loss = out.training_loss
    print(f"loss {loss:.4f} after {out.global_step} steps; {ms:.2f} ms/step over all "
          f"(ln(vocab) = {math.log(size.vocab):.2f})")
    if callbacks:
        print(f"profile: {callbacks[0].folder}")
    return out


if __name__ == "__main__":
    main()
