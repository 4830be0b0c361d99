"""The workloads of benchmarks/findings/live/host_side.py (issue #48): each builds a model, its optimizer and
one training step for one variant, the way a user's script would, and returns them as a Workload. Nothing here
times or profiles.

    Workload(model, step, samples_per_step, tokens_per_step, info)
    CASES[case] = Case(build, variants, profiled)     # build(variant, size, device, args) -> Workload
    SkipVariant                                       # raised where a variant cannot apply (said, not failed)

Sizes: "gpu" is the size the issue measured on the H100; "tiny" runs on a CPU in seconds (the same code,
small images and models). Without torchvision (the project's CPU environment), the tiny image cases use a
small CNN of their own, and say so in their info; the GPU size needs torchvision.
"""
import contextlib
import io
import math
import random
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Workload(NamedTuple):
    model: nn.Module
    step: Callable            # one training step (the batch included)
    samples_per_step: int
    tokens_per_step: int      # or None
    info: dict                # what the variant is, for the JSON


class Case(NamedTuple):
    build: Callable           # (variant, size, device, args) -> Workload
    variants: tuple           # the first is the baseline
    profiled: tuple           # the variants profiled through the API (the rest are only timed)


class SkipVariant(Exception):
    """The variant cannot apply here (e.g. an attention implementation this transformers lacks)."""


def autocast(device, on=True):
    return torch.autocast(device.type, dtype=torch.bfloat16) if on else contextlib.nullcontext()


# ------------------------------------------------------------------------------------------------------------
# 1. ResNet-18 fed by a Dataset that decodes and augments in Python

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # torchvision's Normalize for ImageNet
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
VIRTUAL_LENGTH = 10 ** 7  # the Dataset's length: no epoch ends in a run (a new epoch refills the queue)


class JpegDataset(torch.utils.data.Dataset):
    """A map-style Dataset of JPEG byte strings made at start from random smooth images (PIL), each
    __getitem__ decoding one with PIL and applying RandomResizedCrop + a flip + ToTensor + Normalize in
    Python/numpy, as torchvision's ImageNet recipe does per sample. Index i reads image i % n."""

    def __init__(self, n, side, crop, seed=0):
        from PIL import Image
        rng = np.random.default_rng(seed)
        self.jpegs, self.crop = [], crop
        for _ in range(n):
            coarse = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8)  # photo-like: smooth
            img = Image.fromarray(coarse).resize((side, side), Image.BICUBIC)
            grain = rng.integers(-12, 13, (side, side, 3))  # and some texture, so decoding does real work
            img = Image.fromarray(np.clip(np.asarray(img, dtype=np.int16) + grain, 0, 255).astype(np.uint8))
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            self.jpegs.append(buf.getvalue())

    def __len__(self):
        return VIRTUAL_LENGTH

    def __getitem__(self, i):
        from PIL import Image
        rng = random.Random(i)
        img = Image.open(io.BytesIO(self.jpegs[i % len(self.jpegs)])).convert("RGB")
        img = img.resize((self.crop, self.crop), Image.BILINEAR, box=crop_box(*img.size, rng))
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = (np.asarray(img, dtype=np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), i % 1000


def crop_box(w, h, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """RandomResizedCrop's box (torchvision.transforms.RandomResizedCrop.get_params, in plain Python)."""
    for _ in range(10):
        area = w * h * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            return (x, y, x + cw, y + ch)
    return (0, 0, w, h)


LOADERS = {  # variant -> DataLoader options (the baseline: the DataLoader's defaults)
    "workers_0": {},
    "workers_2": {"num_workers": 2},
    "workers_8": {"num_workers": 8},
    "pin_memory": {"pin_memory": True},
}


def vision_model(name, size):
    """torchvision's model (weights=None); at the tiny size, ConvNeXt with two one-block stages (its code,
    a CPU's size), and without torchvision a small CNN (said in info)."""
    try:
        import torchvision
    except ImportError:
        if size != "tiny":
            raise
        return tiny_cnn(), "a small CNN (torchvision is not installed)"
    if name == "convnext_tiny" and size == "tiny":
        from torchvision.models.convnext import CNBlockConfig, ConvNeXt
        stages = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)]
        return ConvNeXt(stages), "torchvision ConvNeXt, 2 small stages"
    return getattr(torchvision.models, name)(weights=None), f"torchvision {name}"


def tiny_cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 16, 1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 1000))


def resnet18_pydecode(variant, size, device, args):
    gpu = size == "gpu"
    batch = args.batch or (64 if gpu else 4)
    side, crop = (args.side or 256, 224) if gpu else (40, 32)
    data = JpegDataset(args.images or (256 if gpu else 16), side, crop)
    options = LOADERS[variant]
    cost = per_sample_ms(data)  # before any worker starts
    loader = torch.utils.data.DataLoader(data, batch_size=batch, **options)
    model, what = vision_model("resnet18", size)
    model = model.to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    batches = iter(loader)  # one iterator for the whole run: the Profiler's steps and the timed ones
    blocking = not options.get("pin_memory")

    def step():
        x, y = next(batches)
        x = x.to(device, non_blocking=not blocking).to(memory_format=torch.channels_last)
        y = y.to(device, non_blocking=not blocking)
        with autocast(device):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    info = {"model": what, "batch": batch, "image_side": side, "crop": crop, "images": len(data.jpegs),
            "loader": {"num_workers": options.get("num_workers", 0),
                       "pin_memory": bool(options.get("pin_memory")),
                       "prefetch_factor": 2 if options.get("num_workers") else None},  # its default
            "per_sample_ms_one_core": cost}
    return Workload(model, step, batch, None, info)


def per_sample_ms(data, n=20):
    """The Dataset's own cost per sample on this process's core (decode, crop, flip, normalize)."""
    import time
    t0 = time.perf_counter()
    for i in range(n):
        data[i]
    return round(1e3 * (time.perf_counter() - t0) / n, 3)


# ------------------------------------------------------------------------------------------------------------
# 2. ConvNeXt-T in float32, and the precision and layout fixes

CONVNEXT = {  # variant -> (bf16 autocast, channels_last, cudnn.benchmark)
    "fp32": (False, False, False),
    "bf16_channels_last": (True, True, False),
    "bf16": (True, False, False),
    "channels_last": (False, True, False),
    "cudnn_benchmark": (False, False, True),
}


def convnext_fp32(variant, size, device, args):
    bf16, channels_last, bench = CONVNEXT[variant]
    torch.backends.cudnn.benchmark = bench
    gpu = size == "gpu"
    batch, side = (args.batch or 64, 224) if gpu else (2, 32)
    model, what = vision_model("convnext_tiny", size)
    model = model.to(device)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=layout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    x = torch.randn(batch, 3, side, side, device=device).to(memory_format=layout)
    y = torch.randint(1000, (batch,), device=device)

    def step():
        with autocast(device, bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    info = {"model": what, "batch": batch, "side": side, "bf16_autocast": bf16,
            "channels_last": channels_last, "cudnn_benchmark": bench, "optimizer": "AdamW"}
    return Workload(model, step, batch, None, info)


# ------------------------------------------------------------------------------------------------------------
# 3. T5-small (transformers, not compiled): its float attention mask carries the relative position bias

# t5-small's config.json, written out (no download), and its special tokens (the labels shift right from 0)
T5_SMALL = {"d_model": 512, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": 6, "num_heads": 8,
            "d_kv": 64, "vocab_size": 32128, "feed_forward_proj": "relu"}
T5_TINY = {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 2, "d_kv": 32,
           "vocab_size": 512}
T5_TOKENS = {"decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}
T5_ATTENTION = {"default": None, "eager_attention": "eager"}  # None: the implementation transformers picks


def t5_small(variant, size, device, args):
    from transformers import T5Config, T5ForConditionalGeneration
    attn = T5_ATTENTION[variant]
    config = T5Config(**(T5_SMALL if size == "gpu" else T5_TINY), **T5_TOKENS)
    try:
        chosen = {"attn_implementation": attn} if attn else {}
        model = T5ForConditionalGeneration._from_config(config, **chosen)
    except (ValueError, ImportError) as e:
        raise SkipVariant(f"transformers cannot build T5 with attn_implementation={attn!r}: {e}") from None
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, enc, dec = (args.batch or 32, 512, 128) if size == "gpu" else (2, 32, 16)
    ids = torch.randint(config.vocab_size, (batch, enc), device=device)
    mask = torch.ones_like(ids)  # what a tokenizer hands over for unpadded sequences
    labels = torch.randint(config.vocab_size, (batch, dec), device=device)

    def step():
        with autocast(device):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    import transformers
    info = {"model": "T5ForConditionalGeneration (t5-small's sizes)" if size == "gpu" else "T5 (tiny)",
            "attn_implementation": model.config._attn_implementation,
            "transformers": transformers.__version__,
            "batch": batch, "encoder_len": enc, "decoder_len": dec}
    return Workload(model, step, batch, batch * (enc + dec), info)


# ------------------------------------------------------------------------------------------------------------
# 4. A compiled small transformer, profiled while it compiles and after

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class SmallGPT(nn.Module):
    def __init__(self, vocab, d, layers, heads):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.norm(x)).flatten(0, 1).float(), targets.flatten())


def compile_in_window(variant, size, device, args):
    gpu = size == "gpu"
    vocab, d, layers, heads, batch, seq = (8192, 384, 4, 6, 32, 256) if gpu else (256, 32, 1, 2, 2, 16)
    model = SmallGPT(vocab, d, layers, heads).to(device)
    # compiled at its first call (the caller creates the Profiler before it); on a CPU, Dynamo and AOTAutograd
    # without Inductor's C++ build, which takes minutes on a small shared CPU
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    forward = torch.compile(model, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    idx = torch.randint(vocab, (batch, seq + 1), device=device)

    def step():
        with autocast(device):
            loss = forward(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    info = {"model": f"SmallGPT {layers} layers, width {d}, torch.compile (backend {backend}, default mode)",
            "batch": batch, "seq": seq}
    return Workload(model, step, batch, batch * seq, info)


CASES = {
    "resnet18_pydecode": Case(resnet18_pydecode, tuple(LOADERS), ("workers_0", "workers_2")),
    "convnext_fp32": Case(convnext_fp32, tuple(CONVNEXT), ("fp32",)),
    "t5_small": Case(t5_small, tuple(T5_ATTENTION), ("default",)),
    "compile_in_window": Case(compile_in_window, ("warm", "in_window"), ("warm", "in_window")),
}

