"""Record tests/data/h100-cudacalls-<mode>.trace.json.gz: real CUDA traces of a small MLP trainer, one per
way the host can spend its time inside CUDA calls (profiling/profile/tables/cuda_calls.py reads them).

    python3 tests/data/make_cuda_calls_traces.py OUT_DIR     # on a CUDA machine; writes one trace per mode

Modes (each one process, so CUDA_LAUNCH_BLOCKING is read at CUDA's start):
    base      the clean loop: pinned input copied without blocking, one optimizer step
    blocking  the same with CUDA_LAUNCH_BLOCKING=1: every launch waits for its kernel
    churn     torch.cuda.empty_cache() every step: the allocator frees and re-mallocs its blocks
    sync      loss.item() after every micro-batch: the host waits for the queue to drain
    pageable  the input copied from pageable host memory (non_blocking=True does not help there)
Profiled like profiling/profile/capture/window.py: sync, 2 warm-up + 3 active steps, sync before the last prof.step().
"""
import gzip
import os
import subprocess
import sys

MODES = ("base", "blocking", "churn", "sync", "pageable")
D, H, LAYERS, TOKENS, MICRO = 1024, 4096, 8, 16384, 4


def run(mode, out):
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.GELU(), torch.nn.Linear(H, D)) for _ in range(LAYERS)]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x_host = torch.randn(MICRO, TOKENS, D)
    x_host = x_host if mode == "pageable" else x_host.pin_memory()

    def step():
        for m in range(MICRO):
            x = x_host[m].to("cuda", non_blocking=True)
            with torch.autocast("cuda", torch.bfloat16):
                loss = model(x).float().square().mean()
            loss.backward()
            if mode == "sync":
                loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mode == "churn":
            torch.cuda.empty_cache()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    path = os.path.join(out, f"{mode}.json")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 schedule=schedule(wait=0, warmup=2, active=3, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for i in range(5):
            step()
            if i == 4:
                torch.cuda.synchronize()
            prof.step()
    with open(path, "rb") as f:
        data = f.read()
    with open(os.path.join(out, f"h100-cudacalls-{mode}.trace.json.gz"), "wb") as f:
        f.write(gzip.compress(data, compresslevel=9, mtime=0))
    os.remove(path)


def main():
    out = sys.argv[1]
    if len(sys.argv) > 2:
        return run(sys.argv[2], out)
    for mode in MODES:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1" if mode == "blocking" else "0")
        subprocess.run([sys.executable, __file__, out, mode], env=env, check=True)


if __name__ == "__main__":
    main()
