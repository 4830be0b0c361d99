"""Makes the own GPU traces added for issue #57 (tests/data/foreign/SOURCES.md): the kinds of trace the issue's public
ones showed and the corpus lacked, recorded the way people record them (plain torch.profiler, no project code):

- cold first calls: a model's first iterations profiled from its first call (first launches, cudaFuncGetAttributes,
  cuBLAS/cuDNN handles and lazy module loads), with and without a schedule;
- traces without ProfilerStep markers whose host works for seconds outside the GPU's active span: a DataLoader
  whose Dataset decodes in Python, workers starting up, a tokenizer run before the loop, a checkpoint save;
- CPU-only activity of a CUDA model (`activities=[ProfilerActivity.CPU]`: `aten::cudnn_convolution` on the host
  timeline, no kernel events);
- a model that ran on the CPU in a trace listing a GPU (the model and batch never moved to the device).

    python3 tests/data/foreign/make/make_gpu_traces_57.py OUTDIR [NAME ...]

Run on one GPU (an H200 here, torch 2.11, torchvision's models with random weights: nothing downloaded).
"""
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from make_cpu_traces import save  # this folder's: the Chrome trace, gzipped, as torch.profiler writes it
from torch.profiler import ProfilerActivity, profile, schedule

CPU, CUDA = ProfilerActivity.CPU, ProfilerActivity.CUDA
DEV = "cuda"


def resnet(depth=18, classes=10):
    import torchvision
    return getattr(torchvision.models, f"resnet{depth}")(num_classes=classes)


def gpt(layers=4, dim=256, vocab=8192):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=dim, n_head=4, vocab_size=vocab, n_positions=256))


def vit():
    import torchvision
    return torchvision.models.vit_b_16(num_classes=10)


class SlowImages(torch.utils.data.Dataset):
    """Each sample 'decoded' from bytes in pure Python (as PIL's decoders run: no operator the profiler records),
    then made a tensor: a real image pipeline's per-sample cost on the host, `passes` Python passes over it."""

    def __init__(self, n=256, side=56, passes=2):
        g = torch.Generator().manual_seed(0)
        self.raw = [torch.randint(0, 256, (3 * side * side,), dtype=torch.uint8, generator=g).numpy().tobytes()
                    for _ in range(n)]
        self.side, self.passes = side, passes

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, i):
        px = self.raw[i]
        for _ in range(self.passes):  # the decode: pure Python, the host busy, nothing recorded
            px = bytes(b ^ 0x5A for b in px)
        x = torch.frombuffer(bytearray(px), dtype=torch.uint8).view(3, self.side, self.side).float()
        return x.sub_(127.5).div_(64.0), i % 10


def train_steps(model, batches, opt, prof=None):
    for x, y in batches:
        x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if prof is not None:
            prof.step()


# ---- cold first calls -------------------------------------------------------------------------------------------

def cold_resnet18_224_first_train_steps_no_steps(path):
    """ResNet-18 at 224 px (float32, SGD) profiled from its first training step, 3 steps, no schedule: the first
    holds cuDNN's and cuBLAS's first calls, the kernels' first launches and module loads."""
    model = resnet(18).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = [(torch.randn(32, 3, 224, 224), torch.randint(0, 10, (32,))) for _ in range(3)]
    with profile(activities=[CPU, CUDA]) as prof:
        train_steps(model, data, opt)
        torch.cuda.synchronize()
    save(prof, path)


def cold_resnet18_first_train_steps(path):
    """ResNet-18 (float32, AdamW) under a schedule that starts at step 0 (wait=0, warmup=0, active=3): the first
    ProfilerStep is the model's first call, the other two warm."""
    model = resnet(18).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(torch.randn(64, 3, 64, 64), torch.randint(0, 10, (64,))) for _ in range(4)]
    with profile(activities=[CPU, CUDA], schedule=schedule(wait=0, warmup=0, active=3, repeat=1),
                 on_trace_ready=lambda p: save(p, path)) as prof:
        train_steps(model, data, opt, prof)


def cold_gpt_first_train_steps(path):
    """A 4-layer GPT-2 (transformers, random weights, bf16 autocast, AdamW) profiled from its first step with a
    schedule of 3 active steps: the first holds the first launches of every kernel."""
    model = gpt().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = [torch.randint(0, 8192, (8, 256)) for _ in range(4)]
    with profile(activities=[CPU, CUDA], schedule=schedule(wait=0, warmup=0, active=3, repeat=1),
                 on_trace_ready=lambda p: save(p, path)) as prof:
        for x in ids:
            x = x.to(DEV)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()


def cold_vit_first_inference_no_steps(path):
    """ViT-B/16 inference (fp16 autocast, no_grad): the process's first forward and two more, no schedule."""
    model = vit().to(DEV).eval()
    x = torch.randn(16, 3, 224, 224, device=DEV)
    with profile(activities=[CPU, CUDA], record_shapes=True) as prof, torch.no_grad():
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.float16):
                model(x).argmax(-1).cpu()
    save(prof, path)


def cold_mlp_first_call_no_steps(path):
    """A 6-layer MLP's first forward and backward on the GPU, one call, no schedule: the commonest public trace
    (a profile around `model(inputs)` with no warm-up)."""
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(1024, 1024), torch.nn.GELU())]).to(DEV)
    x = torch.randn(256, 1024, device=DEV)
    with profile(activities=[CPU, CUDA], record_shapes=True) as prof:
        model(x).square().mean().backward()
        torch.cuda.synchronize()
    save(prof, path)


def cold_encoder_sdpa_first_call_no_steps(path):
    """A 6-layer nn.TransformerEncoder (batch_first, SDPA) inference, first call then 4 more, no schedule, with
    with_modules: five forwards of which the first is cold."""
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(DEV).eval()
    x = torch.randn(32, 128, 512, device=DEV)
    with profile(activities=[CPU, CUDA], with_modules=True) as prof, torch.inference_mode():
        for _ in range(5):
            model(x)
        torch.cuda.synchronize()
    save(prof, path)


def cold_bert_first_inference_no_steps(path):
    """A 4-layer BERT (transformers, random weights) inference under no_grad: the process's first 10 forwards,
    no schedule, with_stack (the first cold, the other nine warm)."""
    from transformers import BertConfig, BertModel
    model = BertModel(BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                 intermediate_size=1024)).to(DEV).eval()
    x = torch.randint(0, 30000, (16, 128), device=DEV)
    with profile(activities=[CPU, CUDA], with_stack=True) as prof, torch.no_grad():
        for _ in range(10):
            model(input_ids=x).last_hidden_state.mean().item()
    save(prof, path)


# ---- no markers, the host busy outside the GPU's span -------------------------------------------------------------

def nomarkers_resnet18_loader_0_workers(path):
    """An epoch's 8 batches of ResNet-18 training from a DataLoader with num_workers=0 whose Dataset decodes
    each sample in Python, the whole loop inside one profile (no schedule, no prof.step())."""
    model = resnet(18).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in [(torch.randn(64, 3, 56, 56), torch.randint(0, 10, (64,)))]:  # warm: the loader is the story
        train_steps(model, [(x, y)], opt)
    loader = torch.utils.data.DataLoader(SlowImages(n=512), batch_size=64, num_workers=0)
    with profile(activities=[CPU, CUDA]) as prof:
        train_steps(model, loader, opt)
        torch.cuda.synchronize()
    save(prof, path)


def nomarkers_resnet18_loader_4_workers_startup(path):
    """The same loop with num_workers=4 (not persistent): the profile holds the workers' start-up, the first
    __next__ waiting for them, then batches as they come."""
    model = resnet(18).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_steps(model, [(torch.randn(64, 3, 56, 56), torch.randint(0, 10, (64,)))], opt)
    loader = torch.utils.data.DataLoader(SlowImages(n=512, passes=8), batch_size=64, num_workers=4)
    with profile(activities=[CPU, CUDA]) as prof:
        train_steps(model, loader, opt)
        torch.cuda.synchronize()
    save(prof, path)


def nomarkers_gpt_tokenize_then_train(path):
    """A loop that tokenizes its text on the host first (a Python character-level encoder over 2 MB, ~1-2 s)
    then runs 5 training steps of the GPT-2 above: no markers; the GPU idle while the host tokenizes."""
    model = gpt().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    text = ("the quick brown fox jumps over the lazy dog " * 50_000)[:2_000_000]
    x = torch.randint(0, 8192, (8, 256), device=DEV)
    model(x, labels=x).loss.backward()  # warm
    with profile(activities=[CPU, CUDA]) as prof:
        vocab = {c: i for i, c in enumerate(sorted(set(text)))}
        ids = torch.tensor([vocab[c] for c in text], dtype=torch.long)
        for k in range(5):
            x = ids[k * 2048:(k + 1) * 2048].view(8, 256).to(DEV)
            loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    save(prof, path)


def nomarkers_resnet18_checkpoint_save(path):
    """6 training steps of ResNet-18, the state saved to disk with torch.save after the third (a checkpoint: host
    work with the GPU idle), no markers."""
    model = resnet(18).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(torch.randn(64, 3, 64, 64), torch.randint(0, 10, (64,))) for _ in range(6)]
    train_steps(model, data[:1], opt)
    with tempfile.TemporaryDirectory() as tmp, profile(activities=[CPU, CUDA]) as prof:
        for k, batch in enumerate(data):
            train_steps(model, [batch], opt)
            if k == 2:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(tmp, "ckpt.pt"))
        torch.cuda.synchronize()
    save(prof, path)


def nomarkers_vit_inference_eval_loader(path):
    """An evaluation loop (ViT-B/16 under inference_mode, fp16 autocast) over a 0-worker DataLoader that decodes in
    Python, 6 batches, `.cpu()` of the predictions per batch: no markers."""
    model = vit().to(DEV).eval()
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        model(torch.randn(32, 3, 224, 224, device=DEV))
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(BigImages(), range(192)), batch_size=32)
    with profile(activities=[CPU, CUDA]) as prof, torch.inference_mode():
        for x, _ in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                model(x.to(DEV)).argmax(-1).cpu()
    save(prof, path)


class BigImages(SlowImages):
    def __init__(self):
        super().__init__(n=192, side=224, passes=1)


def nomarkers_mlp_sleepy_host_loop(path):
    """10 training steps of the MLP above with 150 ms of host work between them (a Python metric over the batch
    and a log line: `time.sleep` stands for it), no markers: iterations of ~5 ms of GPU work separated by host
    work."""
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(1024, 1024), torch.nn.GELU())]).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device=DEV)
    model(x).square().mean().backward()
    with profile(activities=[CPU, CUDA], with_modules=True) as prof:
        for _ in range(10):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sum(float(v) for v in loss.detach().cpu().reshape(-1))
            time.sleep(0.15)
        torch.cuda.synchronize()
    save(prof, path)


# ---- CPU-only activity of a CUDA model -------------------------------------------------------------------------

def cpuactivity_cuda_resnet50_train(path):
    """ResNet-50 training on the GPU recorded with activities=[CPU] only, a schedule (wait 1, warm-up 1, active 2):
    `aten::cudnn_convolution` on the host timeline, no kernel or runtime events."""
    model = resnet(50).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = [(torch.randn(32, 3, 224, 224), torch.randint(0, 10, (32,))) for _ in range(4)]
    with profile(activities=[CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: save(p, path)) as prof:
        train_steps(model, data, opt, prof)


def cpuactivity_cuda_gpt_train_no_steps(path):
    """The GPT-2 above trained on the GPU for 3 steps (bf16 autocast) recorded with activities=[CPU], no schedule."""
    model = gpt().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 8192, (8, 256), device=DEV)
    model(x, labels=x).loss.backward()
    with profile(activities=[CPU], record_shapes=True) as prof:
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    save(prof, path)


def cpuactivity_cuda_vit_inference(path):
    """ViT-B/16 inference on the GPU (fp16 autocast) recorded with activities=[CPU], 3 ProfilerSteps."""
    model = vit().to(DEV).eval()
    x = torch.randn(32, 3, 224, 224, device=DEV)
    with profile(activities=[CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=lambda p: save(p, path)) as prof, torch.inference_mode():
        for _ in range(5):
            with torch.autocast("cuda", dtype=torch.float16):
                model(x).argmax(-1).cpu()
            prof.step()


def cpuactivity_cuda_resnet18_loader(path):
    """ResNet-18 training on the GPU from the 0-worker Python-decoding DataLoader above, recorded with
    activities=[CPU], a schedule (wait 1, warm-up 1, active 3)."""
    model = resnet(18).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowImages(n=320), batch_size=64, num_workers=0)
    with profile(activities=[CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=lambda p: save(p, path)) as prof:
        train_steps(model, loader, opt, prof)


# ---- a model on the CPU, a GPU listed -----------------------------------------------------------------------------

def modeloncpu_resnet18_train(path):
    """ResNet-18 training where neither the model nor the batch was moved to the GPU, recorded with
    activities=[CPU, CUDA] on a GPU machine, a schedule of 2 active steps: `mkldnn_convolution`, no kernels."""
    torch.set_num_threads(8)
    model = resnet(18)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))) for _ in range(4)]
    with profile(activities=[CPU, CUDA], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: save(p, path)) as prof:
        for x, y in data:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            prof.step()


def modeloncpu_gpt_train_no_steps(path):
    """The GPT-2 above trained for 3 steps on the CPU of a GPU machine (the model never moved), CPU and CUDA
    activities, no schedule."""
    torch.set_num_threads(8)
    model = gpt(layers=2, dim=128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 8192, (4, 128))
    with profile(activities=[CPU, CUDA]) as prof:
        for _ in range(3):
            loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    save(prof, path)


def modeloncpu_mlp_inference_loader(path):
    """An MLP's inference on the CPU of a GPU machine over a DataLoader (pin_memory=True: the loader's pinned
    copies are the only CUDA work), 3 ProfilerSteps, CPU and CUDA activities."""
    torch.set_num_threads(8)
    model = torch.nn.Sequential(torch.nn.Linear(3 * 56 * 56, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).eval()
    loader = torch.utils.data.DataLoader(SlowImages(n=320, passes=1), batch_size=64, pin_memory=True)
    with profile(activities=[CPU, CUDA], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=lambda p: save(p, path)) as prof, torch.inference_mode():
        for x, _ in loader:
            model(x.flatten(1)).argmax(-1)
            prof.step()


CASES = {name.replace("_", "-"): fn for name, fn in list(globals().items())
         if callable(fn) and name.split("_")[0] in ("cold", "nomarkers", "cpuactivity", "modeloncpu")}


def main():
    out, names = sys.argv[1], sys.argv[2:] or list(CASES)
    os.makedirs(out, exist_ok=True)
    for name in names:
        t = time.time()
        path = os.path.join(out, f"own-h200-{name}.json.gz")
        try:
            CASES[name](path)
            print(f"{name}: {os.path.getsize(path) / 1e3:.0f} KB in {time.time() - t:.1f} s", flush=True)
        except Exception as e:  # one case's failure leaves the others
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
