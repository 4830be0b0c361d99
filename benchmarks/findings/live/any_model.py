"""Findings on models this project did not write (issue #42): a ViT-B/16 (timm), a ResNet-50 (torchvision) and a
BERT-base (transformers), compiled, bf16 autocast, profiled through the public API; then each candidate fix
applied and timed, so every top finding's claimed gain can be checked against what its fix recovers.

    python benchmarks/findings/live/any_model.py OUT                       # on the GPU (timm, torchvision,
    transformers) python benchmarks/findings/live/any_model.py OUT --models bert --size tiny --device cpu
    --reps 1   # a smoke run

Per model, in its own process (a fresh compile each): the baseline is profiled once (OUT/<model>.trace.json.gz,
OUT/<model>-report.md), then the baseline and each variant (a candidate fix: `VARIANTS` below) are timed in turn,
unprofiled, `--reps` times `--timed` steps between two syncs, each variant compiled afresh in the same process.
OUT/<model>.json holds every timing: ms per step and ms per sample (a variant may change the batch).
`research profile OUT/<model>.trace.json.gz` reads the trace again with today's rules;
benchmarks/findings/live/any_model_results.md pairs each top finding with the variant that applies its fix.
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

import torch
import torch.nn.functional as F


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

from benchmarks.common import autocast, timed  # noqa: E402

# the candidate fixes, per model: name -> options given to its builder (the baseline is {})
VARIANTS = {
    "vit": {"fused_adamw": {"fused": True}, "batch_x2": {"batch_scale": 2}},
    "resnet50": {"fused_sgd": {"fused": True}, "batch_x2": {"batch_scale": 2}},
    "bert": {"no_attention_dropout": {"attention_dropout": 0.0}, "fused_attention_only": {},
             "vocab_64": {"vocab_multiple": 64}, "mask_contiguous": {"mask": "contiguous"},
             "no_mask": {"mask": "none"}},
}


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


def bert(size, device, attn=None, vocab_multiple=None, batch_scale=1, attention_dropout=None, mask=None, **_):
    from transformers import BertConfig, BertForMaskedLM
    kw = {} if size == "gpu" else dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=128)
    config = BertConfig(**kw, **({"attn_implementation": attn} if attn else {}))
    if attention_dropout is not None:  # a diagnosis, not a fix: it changes the training
        config.attention_probs_dropout_prob = attention_dropout
    if vocab_multiple:
        config.vocab_size = -(-config.vocab_size // vocab_multiple) * vocab_multiple
    model = BertForMaskedLM(config).to(device)
    if mask:
        _sdpa_mask(mask)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    batch, seq = (32, 512) if size == "gpu" else (2, 64)
    batch *= batch_scale
    ids = torch.randint(30522, (batch, seq), device=device)
    labels = torch.where(torch.rand(batch, seq, device=device) < 0.15, ids, -100)
    return model, opt, (lambda m: m(input_ids=ids, labels=labels).loss), batch


def _sdpa_mask(how):
    """SDPA's attn_mask as the library passes it, changed: "contiguous" (transformers expands its all-true mask
    to [B, 1, T, T] with stride 0 in the last dimension, which every fused CUDA kernel refuses) or "none" (no
    sequence here is padded: the same attention without a mask)."""
    sdpa = F.scaled_dot_product_attention

    def changed(q, k, v, attn_mask=None, *args, **kw):
        if attn_mask is not None:
            attn_mask = None if how == "none" else attn_mask.contiguous()
        return sdpa(q, k, v, attn_mask, *args, **kw)
    F.scaled_dot_product_attention = changed


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


def run(name, variant, args):
    """One model and one variant in this process: timed unprofiled (`--reps` x `--timed` steps between two
    syncs, after `--warmup`), then, for the baseline with --profile, profiled through the API."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    out = {"model": name, "variant": variant, "device": torch.cuda.get_device_name() if device.type == "cuda"
           else "cpu", "torch": torch.__version__}
    options = {} if variant == "baseline" else VARIANTS[name][variant]
    try:
        with fused_attention_only() if variant == "fused_attention_only" else contextlib.nullcontext():
            model, step, batch = build(name, args.size, device, options)
            for _ in range(args.warmup):
                step()
            out["ms_per_step"] = [timed(step, args.timed, device) for _ in range(args.reps)]
    except Exception as e:  # noqa: BLE001 (a variant that cannot run says why: itself a finding's check)
        out["error"] = f"{type(e).__name__}: {e}"[:500]
        print(f"{name} {variant}: {out['error']}", flush=True)
        return _write(out, args)
    out["samples_per_step"] = batch
    out["ms_per_sample"] = statistics.median(out["ms_per_step"]) / batch
    print(f"{name} {variant}: {[round(x, 2) for x in out['ms_per_step']]} ms/step, "
          f"{1e3 * out['ms_per_sample']:.1f} us/sample", flush=True)
    if variant == "baseline" and args.profile:
        import profiling
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
    return _write(out, args)


@contextlib.contextmanager
def fused_attention_only():
    """SDPA without its math backend: a model whose attention cannot run fused fails, and says why."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        yield


def _write(out, args):
    with open(os.path.join(args.out, f"{out['model']}-{out['variant']}.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--size", choices=("gpu", "tiny"), default="gpu")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--timed", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5, help="steps of each variant before timing (compile, autotune)")
    p.add_argument("--variants", nargs="*", help="which variants (default: the baseline and all of the model's)")
    p.add_argument("--profile", action="store_true", help="profile the baseline through the API after timing it")
    p.add_argument("--in-process", help=argparse.SUPPRESS)  # the variant this process runs
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.in_process:
        return run(args.models[0], args.in_process, args)
    rc = 0
    for name in args.models:  # one process per variant: a fresh compile each, as an edited script gets
        for variant in args.variants or ["baseline", *VARIANTS[name]]:
            if variant != "baseline" and variant not in VARIANTS[name]:
                continue
            rc |= subprocess.call([sys.executable, os.path.abspath(__file__), args.out, "--models", name,
                                   "--size", args.size, "--device", args.device, "--reps", str(args.reps),
                                   "--timed", str(args.timed), "--warmup", str(args.warmup),
                                   f"--in-process={variant}"] + (["--profile"] if args.profile else []))
    return rc


if __name__ == "__main__":
    sys.exit(main())
