"""Regenerate tests/data/cpu-closure-{lightning,lbfgs,sgd}.trace.json.gz: real CPU traces of training steps
whose forward and backward run inside `optimizer.step(closure)`.

    uv run python tests/data/make_cpu_closure_traces.py [lightning|lbfgs|sgd ...]

One tiny language model (an embedding, one attention block, an MLP, a norm and a head, named as GPT-2 names
its modules) trained three ways: by Lightning 2.x's automatic optimization (which wraps training_step and
backward in a closure passed to SGD's step), and by a plain loop calling `torch.optim.LBFGS(...).step(closure)`
(max_iter=3: the closure runs up to four times per step, between the optimizer's own work) and
`torch.optim.SGD(...).step(closure)`. Each profiles 1 warm-up + 2 active steps with CPU activity and
record_shapes=True (schedule wait=0, repeat=1; prof.step() after each step), and writes the parameter shapes
into the trace metadata as profiling.profile.capture.window does (`autoresearch.parameters`), so GEMMs are placed by
the weights they multiply. Deterministic in shape (op names and counts), not in timings.
"""
import gzip
import json
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, schedule

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, DIM, HEADS, B, T = 64, 32, 2, 4, 16
WARMUP, ACTIVE = 1, 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.attn = torch.nn.ModuleDict({"c_attn": torch.nn.Linear(DIM, 3 * DIM), "c_proj": torch.nn.Linear(DIM, DIM)})
        self.mlp = torch.nn.Sequential()
        self.mlp.c_fc, self.mlp.act, self.mlp.c_proj = (torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(),
                                                        torch.nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        q, k, v = self.attn["c_attn"](self.ln_1(x)).split(DIM, dim=-1)
        q, k, v = (t.view(B, T, HEADS, DIM // HEADS).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn["c_proj"](y.transpose(1, 2).reshape(B, T, DIM))
        return x + self.mlp(self.ln_2(x))


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.h, self.ln_f = torch.nn.Embedding(VOCAB, DIM), Block(), torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def loss(self, x):
        logits = self.lm_head(self.ln_f(self.h(self.wte(x[:, :-1]))))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))


def _batches(n):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (B, T + 1), generator=gen) for _ in range(n)]


def _profiler(raw):
    return profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                   schedule=schedule(wait=0, warmup=WARMUP, active=ACTIVE, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(raw))


def _loop(make_opt, raw):
    torch.manual_seed(0)
    model = LM()
    opt = make_opt(model.parameters())

    def step(x):
        def closure():
            opt.zero_grad(set_to_none=True)
            loss = model.loss(x)
            loss.backward()
            return loss
        opt.step(closure)

    for x in _batches(3):  # first calls are slow (oneDNN kernel selection): keep them out of the trace
        step(x)
    with _profiler(raw) as prof:
        prof.add_metadata_json("autoresearch", json.dumps(_meta(model)))
        for x in _batches(WARMUP + ACTIVE):
            step(x)
            prof.step()


def _lightning(raw):
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = LM()

        def training_step(self, batch, _):
            return self.model.loss(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    class Profile(L.Callback):  # torch.profiler around the optimizer steps after three warm ones
        def __init__(self):
            self.prof = None

        def on_train_batch_start(self, trainer, module, *_):
            if trainer.global_step == 3:
                self.prof = _profiler(raw).__enter__()
                self.prof.add_metadata_json("autoresearch", json.dumps(_meta(module.model, "model.")))

        def on_train_batch_end(self, trainer, *_):
            if self.prof is not None:
                self.prof.step()
                if trainer.global_step == 3 + WARMUP + ACTIVE:
                    self.prof.__exit__(None, None, None)
                    self.prof = None

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(_batches(3 + WARMUP + ACTIVE), batch_size=None)
    trainer = L.Trainer(max_steps=3 + WARMUP + ACTIVE, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[Profile()])
    trainer.fit(Module(), data)


def _meta(model, prefix=""):
    return {"version": 1, "tokens_per_step": B * T, "device": "CPU", "torch": torch.__version__,
            "parameters": {prefix + n: list(p.shape) for n, p in model.named_parameters()}}


MAKERS = {
    "lightning": _lightning,
    "lbfgs": lambda raw: _loop(lambda ps: torch.optim.LBFGS(ps, lr=0.1, max_iter=3), raw),
    "sgd": lambda raw: _loop(lambda ps: torch.optim.SGD(ps, lr=1e-2), raw),
}


def main(names):
    torch.set_num_threads(1)
    for name in names or MAKERS:
        out = os.path.join(HERE, f"cpu-closure-{name}.trace.json.gz")
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "trace.json")
            MAKERS[name](raw)
            with open(raw, "rb") as f:
                data = f.read()
        with open(out, "wb") as f:
            f.write(gzip.compress(data, compresslevel=9, mtime=0))
        print(f"wrote {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
