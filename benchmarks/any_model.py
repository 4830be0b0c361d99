"""Findings on models this project did not write (issue #42): a ViT-B/16 (timm), a ResNet-50 (torchvision) and a
BERT-base (transformers), compiled, bf16 autocast, profiled through the public API; then each candidate fix
applied and timed, so every top finding's claimed gain can be checked against what its fix recovers.

    python benchmarks/any_model.py OUT                       # on the GPU (timm, torchvision, transformers)
    python benchmarks/any_model.py OUT --models bert --size tiny --device cpu --reps 1   # a smoke run

Per model, in its own process (a fresh compile each): the baseline is profiled once (OUT/<model>.trace.json.gz,
OUT/<model>-report.md), then the baseline and each variant (a candidate fix: `VARIANTS` below) are timed in turn,
unprofiled, `--reps` times `--timed` steps between two syncs, each variant compiled afresh in the same process.
OUT/<model>.json holds every timing: ms per step and ms per sample (a variant may change the batch).
`research profile OUT/<model>.trace.json.gz` reads the trace again with today's rules; benchmarks/any_model_results.md
pairs each top finding with the variant that applies its fix.
"""
import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# the candidate fixes, per model: name -> options given to its builder (the baseline is {})
VARIANTS = {
    "vit": {"fused_adamw": {"fused": True}, "batch_x2": {"batch_scale": 2}},
    "resnet50": {"fused_sgd": {"fused": True}, "batch_x2": {"batch_scale": 2}},
    "bert": {"sdpa": {"attn": "sdpa"}, "no_attention_dropout": {"attention_dropout": 0.0},
             "vocab_64": {"vocab_multiple": 64}, "batch_x2": {"batch_scale": 2}},
}


def autocast(device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def vit(size, device, fused=False, batch_scale=1, **_):
    import timm
    name = "vit_base_patch16_224" if size == "gpu" else "vit_tiny_patch16_224"
    model = timm.create_model(name, pretrained=False, num_classes=1000).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=fused and device.type == "cuda")
    batch = (64 if size == "gpu" else 2) * batch_scale
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(1000, (batch,), device=device)
    return model, opt, (lambda m: F.cross_entropy(m(x), y)), batch


def resnet50(size, device, fused=False, batch_scale=1, **_):
    import torchvision
    model = torchvision.models.resnet50().to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                          **({"fused": True} if fused else {}))
    batch, side = ((128, 224) if size == "gpu" else (2, 64))
    batch *= batch_scale
    x = torch.randn(batch, 3, side, side, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(1000, (batch,), device=device)
    return model, opt, (lambda m: F.cross_entropy(m(x), y)), batch


def bert(size, device, attn=None, vocab_multiple=None, batch_scale=1, attention_dropout=None, **_):
    from transformers import BertConfig, BertForMaskedLM
    kw = {} if size == "gpu" else dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=128)
    config = BertConfig(**kw, **({"attn_implementation": attn} if attn else {}))
    if attention_dropout is not None:  # a diagnosis, not a fix: it changes the training
        config.attention_probs_dropout_prob = attention_dropout
    if vocab_multiple:
        config.vocab_size = -(-config.vocab_size // vocab_multiple) * vocab_multiple
    model = BertForMaskedLM(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    batch, seq = (32, 512) if size == "gpu" else (2, 64)
    batch *= batch_scale
    ids = torch.randint(30522, (batch, seq), device=device)
    labels = torch.where(torch.rand(batch, seq, device=device) < 0.15, ids, -100)
    return model, opt, (lambda m: m(input_ids=ids, labels=labels).loss), batch


MODELS = {"vit": vit, "resnet50": resnet50, "bert": bert}


def build(name, size, device, options):
    model, opt, loss_of, batch = MODELS[name](size, device, **options)
    forward = torch.compile(model)

    def step():
        with autocast(device):
            loss = loss_of(forward)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step, batch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(step, n, device):
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return 1e3 * (time.perf_counter() - t0) / n


def run(name, args):
    import profiling
    device = torch.device(args.device)
    torch.manual_seed(0)
    out = {"model": name, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "timings": {}}
    model, step, batch = build(name, args.size, device, {})
    tmp = tempfile.mkdtemp(prefix="any-model-")
    prof = profiling.Profiler(model, out_dir=tmp, samples_per_step=batch)
    while not prof.done:
        step()
        prof.step()
    shutil.copy(os.path.join(prof.folder, "report.md"), os.path.join(args.out, f"{name}-report.md"))
    shutil.copy(os.path.join(prof.folder, "trace.json.gz"), os.path.join(args.out, f"{name}.trace.json.gz"))
    out["profile"] = {k: prof.summary.get(k) for k in ("step_ms", "unprofiled_step_ms")}
    out["profile"]["findings"] = [{k: f.get(k) for k in ("kind", "ms_per_step", "fix")}
                                  for f in prof.summary["findings"]]
    shutil.rmtree(tmp, ignore_errors=True)
    steps = {"baseline": (step, batch)}
    for variant, options in VARIANTS[name].items():
        torch._dynamo.reset()  # each variant compiles afresh, as a user's edited script would
        _, vstep, vbatch = build(name, args.size, device, options)
        for _ in range(args.warmup):
            vstep()
        steps[variant] = (vstep, vbatch)
    for rep in range(args.reps):  # in turn, so the machine's drift falls on all alike
        for variant, (fn, n) in steps.items():
            ms = timed(fn, args.timed, device)
            out["timings"].setdefault(variant, []).append({"ms_per_step": ms, "ms_per_sample": ms / n})
    out["median_ms_per_sample"] = {v: statistics.median(t["ms_per_sample"] for t in ts)
                                   for v, ts in out["timings"].items()}
    base = out["median_ms_per_sample"]["baseline"]
    out["change_percent"] = {v: round(100 * (ms / base - 1), 1) for v, ms in out["median_ms_per_sample"].items()}
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{name}: profiled {out['profile']['step_ms']:.2f} ms/step; findings "
          + "; ".join(f"{f['kind']} {f['ms_per_step']:.2f}" for f in out["profile"]["findings"][:4])
          + f"; per-sample change by variant: {out['change_percent']}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--size", choices=("gpu", "tiny"), default="gpu")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--timed", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5, help="steps of each variant before timing (compile, autotune)")
    p.add_argument("--in-process", action="store_true")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.in_process:
        for name in args.models:
            run(name, args)
        return 0
    rc = 0
    for name in args.models:
        rc |= subprocess.call([sys.executable, os.path.abspath(__file__), args.out, "--models", name, "--size",
                               args.size, "--device", args.device, "--reps", str(args.reps), "--timed",
                               str(args.timed), "--warmup", str(args.warmup), "--in-process"])
    return rc


if __name__ == "__main__":
    sys.exit(main())
