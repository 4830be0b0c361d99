"""A small GPT-like language model trained by Lightning on random tokens, profiled by adding one callback:
`L.Trainer(..., callbacks=[profiling.LightningCallback()])`. The LightningModule is written the way
Lightning's own tutorials write one (training_step returns the loss, configure_optimizers returns AdamW), so
Lightning runs forward and backward inside `optimizer.step(closure)`, as it does for its users.

The model: pre-LayerNorm blocks (causal self-attention through scaled_dot_product_attention(is_causal=True),
a 4x GELU MLP), learned positions, the head tied to the embedding. Sizes: `tiny` (CPU tests) and `gpu`
(GPT-2 small's shape: 12 layers, 768 wide, 12 heads, 1024 tokens, vocab 50304; batch 16, bf16-mixed).

    python examples/lightning_train.py --size tiny --steps 3 --device cpu
    python examples/lightning_train.py --size gpu --profile profiles   # the report via LightningCallback
    python examples/lightning_train.py --size gpu --compile --accumulation 2 --profile profiles

With --profile the last line printed is `profile: <folder>` (report.md, summary.json and the trace).
"""
import argparse
import os
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Size:
    layers: int
    dim: int
    heads: int
    seq_len: int
    vocab: int
    batch: int  # per device, per micro-batch


SIZES = {
    "tiny": Size(layers=2, dim=64, heads=4, seq_len=64, vocab=512, batch=4),
    # GPT-2 small's shape: at batch 16 x 1024 a step is ~100-150 ms on an H100 (bf16-mixed, eager)
    "gpu": Size(layers=12, dim=768, heads=12, seq_len=1024, vocab=50304, batch=16),
}


class SelfAttention(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.heads = size.heads
        self.qkv, self.proj = nn.Linear(size.dim, 3 * size.dim), nn.Linear(size.dim, size.dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.fc, self.proj = nn.Linear(size.dim, 4 * size.dim), nn.Linear(4 * size.dim, size.dim)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.attn_norm, self.attn = nn.LayerNorm(size.dim), SelfAttention(size)
        self.mlp_norm, self.mlp = nn.LayerNorm(size.dim), MLP(size)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(size.vocab, size.dim), nn.Embedding(size.seq_len, size.dim)
        self.blocks = nn.ModuleList(Block(size) for _ in range(size.layers))
        self.norm = nn.LayerNorm(size.dim)
        self.head = nn.Linear(size.dim, size.vocab, bias=False)
        self.head.weight = self.tok_emb.weight
        for name, p in self.named_parameters():  # GPT-2's initialization: N(0, 0.02) weights, zero biases
            if "norm" in name:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=0.02) if p.dim() == 2 else nn.init.zeros_(p)

    def forward(self, ids):
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(ids.size(1), device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(model, inputs, targets):
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


def lightning_module(size, compile_model, compile_loss=False):
    import lightning as L

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = GPT(size)
            if compile_model:
                self.model.compile()  # in place: the parameters keep their names
            self.loss = torch.compile(lm_loss) if compile_loss else lm_loss

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            loss = self.loss(self.model, inputs, targets)
            self.log("loss", loss, prog_bar=False)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                     fused=self.device.type == "cuda")

    return LM()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=SIZES, default="tiny")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (max_steps; a profile takes 16-17)")
    p.add_argument("--batch", type=int, help="sequences per device per micro-batch (default: the size's)")
    p.add_argument("--accumulation", type=int, default=1, help="accumulate_grad_batches")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--compile-loss", action="store_true", help="torch.compile the model and its loss together")
    p.add_argument("--pin-memory", action="store_true", help="DataLoader(pin_memory=True)")
    p.add_argument("--profile", metavar="DIR", help="add profiling.LightningCallback, writing into DIR")
    p.add_argument("--output-dir", default=os.path.join("out", "lightning"), help="default_root_dir")
    args = p.parse_args(argv)
    if args.steps < 1 or args.accumulation < 1:
        p.error("--steps and --accumulation need 1 or more")
    return args


def main(argv=None):
    args = parse_args(argv)
    import lightning as L
    torch.manual_seed(0)
    size = SIZES[args.size]
    batch, cuda = args.batch or size.batch, args.device.startswith("cuda")
    module = lightning_module(size, args.compile, args.compile_loss)
    tokens = torch.randint(size.vocab, (args.steps * batch * args.accumulation, size.seq_len + 1))
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])  # inputs, next-token targets
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, pin_memory=args.pin_memory)
    callbacks = []
    if args.profile:
        import profiling
        callbacks.append(profiling.LightningCallback(out_dir=args.profile))
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, max_steps=args.steps,
                        accumulate_grad_batches=args.accumulation,
                        precision="bf16-mixed" if cuda else "32-true",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=args.output_dir, callbacks=callbacks)
    params = sum(p.numel() for p in module.parameters()) / 1e6
    print(f"GPT {args.size} (Lightning): {params:.1f}M parameters, batch {batch} x {args.accumulation} x "
          f"{size.seq_len} tokens on {args.device}" + (", compiled" if args.compile else "")
          + (", model and loss compiled" if args.compile_loss else "") + (", pinned batches" if args.pin_memory else ""))
    t0 = time.perf_counter()
    trainer.fit(module, loader)
    ms = 1e3 * (time.perf_counter() - t0) / max(trainer.global_step, 1)
    print(f"loss {trainer.callback_metrics['loss'].item():.4f} after {trainer.global_step} steps; "
          f"{ms:.2f} ms/step over all")
    if callbacks:
        print(f"profile: {callbacks[0].folder}")
    return trainer


if __name__ == "__main__":
    main()
