"""What torch.compile recovers on public models nobody planted a mistake in, against launch_bound's price (#56).

launch_bound prices its first remedy on an eager model, torch.compile, by the kernels compiling would no longer
launch (findings/idle.py FUSED_SHARE, measured on one GPT-2-small loop) at the host's time per launch. This
holds it against models it was not fitted on: each case is a public architecture built from its library's own
config (no weights downloaded), trained at a small batch in bf16 autocast with a fused AdamW, in one fresh
process:

    1. eager: warm-up, then a profile (profiling.Profiler's defaults): the trace whose launch_bound is priced;
    2. the model's forward compiled (torch.compile, default mode): warm-up, then a profile of it (its kernels);
    3. BLOCKS alternated blocks of STEPS steps, eager then compiled, each between two syncs (one process, so a
       host whose pace drifts between processes moves both alike): ms/step of each block; for the conv net, the
       same again with the model and its input in channels_last (conv_layout's remedy); with --graphs, a third
       form in each round, the forward compiled with mode="reduce-overhead" (CUDA graphs).

    python3 benchmarks/findings/live/compile_price.py run OUT [--cases ...]   # the GPU
    uv run python benchmarks/findings/live/compile_price.py report OUT        # anywhere: the table

`run` writes OUT/results.jsonl (a line per case) and OUT/<case>.tar of <case>/{eager,compiled}-{trace.json.gz,report.md}
(`tar xf` them before `report`);
`report` reads the eager traces with today's rules.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
WARMUP, STEPS, BLOCKS = 8, 15, 6


def _sync(dev):
    import torch
    if dev == "cuda":
        torch.cuda.synchronize()


def resnet50(dev, small):
    import torch
    import torchvision
    model = torchvision.models.resnet50(num_classes=100)
    b, s = (2, 64) if small else (16, 224)
    batch = {"x": torch.randn(b, 3, s, s, device=dev), "y": torch.randint(0, 100, (b,), device=dev)}

    def channels_last():  # conv_layout's remedy, timed after the main blocks
        model.to(memory_format=torch.channels_last)
        batch["x"] = batch["x"].contiguous(memory_format=torch.channels_last)
    model.channels_last = channels_last
    return model, lambda m: torch.nn.functional.cross_entropy(m(batch["x"]), batch["y"]), None


def vit_small(dev, small):
    import timm
    import torch
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=100,
                              **({"img_size": 64} if small else {}))
    b, s = (2, 64) if small else (32, 224)
    x, y = torch.randn(b, 3, s, s, device=dev), torch.randint(0, 100, (b,), device=dev)
    return model, lambda m: torch.nn.functional.cross_entropy(m(x), y), None


def hf_gpt2(dev, small):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2) if small else GPT2Config()
    model = GPT2LMHeadModel(cfg)
    b, t = (2, 32) if small else (8, 256)
    ids = torch.randint(0, cfg.vocab_size, (b, t), device=dev)
    return model, lambda m: m(input_ids=ids, labels=ids).loss, b * t


def hf_bert(dev, small):
    import torch
    from transformers import BertConfig, BertForMaskedLM
    cfg = (BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128) if small
           else BertConfig())
    model = BertForMaskedLM(cfg)
    b, t = (2, 32) if small else (16, 128)
    ids = torch.randint(0, cfg.vocab_size, (b, t), device=dev)
    return model, lambda m: m(input_ids=ids, labels=ids).loss, b * t


def mobilenet_v3(dev, small):
    """torchvision's MobileNetV3-Small: depthwise convolutions, BatchNorm, hardswish, many tiny kernels."""
    import torch
    import torchvision
    model = torchvision.models.mobilenet_v3_small(num_classes=100)
    b, s = (2, 64) if small else (32, 224)
    x, y = torch.randn(b, 3, s, s, device=dev), torch.randint(0, 100, (b,), device=dev)
    return model, lambda m: torch.nn.functional.cross_entropy(m(x), y), None


def hf_t5(dev, small):
    """transformers' T5 at t5-small's config (an encoder-decoder, relative position buckets)."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration
    ids0 = dict(decoder_start_token_id=0, pad_token_id=0)  # t5-small's (a bare config has no start token)
    cfg = T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=2, d_kv=32, **ids0) if small else T5Config(**ids0)
    model = T5ForConditionalGeneration(cfg)
    b, t, u = (2, 32, 8) if small else (8, 128, 32)
    ids = torch.randint(0, cfg.vocab_size, (b, t), device=dev)
    labels = torch.randint(0, cfg.vocab_size, (b, u), device=dev)
    return model, lambda m: m(input_ids=ids, labels=labels).loss, b * (t + u)


CASES = {f.__name__: f for f in (resnet50, vit_small, hf_gpt2, hf_bert, mobilenet_v3, hf_t5)}


def one(case, out, small, graphs=False):
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model, loss_of, tokens = CASES[case](dev, small)
    model = model.to(dev)
    def adamw():
        return torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if dev == "cuda" else {}))
    opt = [adamw()]
    eager = model.forward

    def step():
        with torch.autocast(dev, torch.bfloat16):
            loss = loss_of(model)
        loss.backward()
        opt[0].step()
        opt[0].zero_grad(set_to_none=True)

    def block(n=STEPS):
        _sync(dev)
        t = time.perf_counter()
        for _ in range(n):
            step()
        _sync(dev)
        return round((time.perf_counter() - t) / n * 1e3, 3)

    sys.path.insert(0, ROOT)
    import profiling

    def profile(name):
        work = os.path.join(tempfile.gettempdir(), "compile-price", case, name)
        prof = profiling.Profiler(model, tokens_per_step=tokens, out_dir=work)
        while not prof.done:
            step()
            prof.step()
        os.makedirs(os.path.join(out, case), exist_ok=True)
        for f in ("trace.json.gz", "report.md"):  # a flat folder: a device call returns no deeper one
            shutil.copy(os.path.join(prof.folder, f), os.path.join(out, case, f"{name}-{f}"))
        found = (prof.summary or {}).get("findings") or []
        return [{k: f.get(k) for k in ("kind", "ms_per_step")} for f in found[:3]]

    row = {"case": case, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}
    block(WARMUP)
    row["eager_top"] = profile("eager")
    compiled = torch.compile(eager)
    model.forward = compiled
    t = time.perf_counter()
    step()
    _sync(dev)
    row["compile_s"] = round(time.perf_counter() - t, 1)
    block(WARMUP)
    row["compiled_top"] = profile("compiled")
    graphed = None
    if graphs and dev == "cuda":  # CUDA graphs too (mode="reduce-overhead"): the launches replayed at once
        graphed = torch.compile(eager, mode="reduce-overhead")
        model.forward = graphed
        t = time.perf_counter()
        block(WARMUP)
        row["graphed_compile_s"], row["graphed_ms"] = round(time.perf_counter() - t, 1), []
    row["eager_ms"], row["compiled_ms"] = [], []
    for _ in range(BLOCKS):
        model.forward = eager
        row["eager_ms"].append(block())
        model.forward = compiled
        row["compiled_ms"].append(block())
        if graphed is not None:
            model.forward = graphed
            row["graphed_ms"].append(block())
    if hasattr(model, "channels_last"):  # a conv net: channels_last too, eager and compiled (it recompiles)
        model.channels_last()
        opt[0] = adamw()  # its state in the parameters' new layout (fused AdamW takes one layout)
        row["channels_last_eager_ms"], row["channels_last_compiled_ms"] = [], []
        for form in (eager, compiled):
            model.forward = form
            block(WARMUP)
        for _ in range(BLOCKS):
            model.forward = eager
            row["channels_last_eager_ms"].append(block())
            model.forward = compiled
            row["channels_last_compiled_ms"].append(block())
    return row


def run(out, cases, timeout, small, graphs=False):
    os.makedirs(out, exist_ok=True)
    for case in cases:
        t = time.perf_counter()
        cmd = [sys.executable, os.path.abspath(__file__), "one", case, out] + (["--small"] if small else []) + (
            ["--graphs"] if graphs else [])
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
            row = json.loads(lines[-1]) if p.returncode == 0 and lines else {
                "case": case, "failed": p.returncode, "stderr": p.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            row = {"case": case, "failed": "timeout"}
        row["seconds"] = round(time.perf_counter() - t, 1)
        with open(os.path.join(out, "results.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: row.get(k) for k in ("case", "eager_ms", "compiled_ms", "compile_s", "eager_top",
                                                  "failed", "seconds")}), flush=True)
        folder = os.path.join(out, case)
        if os.path.isdir(folder):  # one file a case: a device call returns few files
            with tarfile.open(folder + ".tar", "w") as tar:
                tar.add(folder, arcname=case)
            shutil.rmtree(folder)


def report(out):
    """The table: each case's measured compile gain (the blocks' medians) against the eager trace's launch_bound
    price with today's rules, and the kernels each form launched a step."""
    sys.path.insert(0, ROOT)
    from profiling.profile.report.ranks import summarize_path
    print("| case | eager ms/step | compiled ms/step | gain | launch_bound: price (price / gain) | top finding | "
          "kernels/step eager -> compiled |")
    print("|---|--:|--:|--:|---|---|---|")
    notes = []
    with open(os.path.join(out, "results.jsonl")) as f:
        for row in map(json.loads, f):
            if row.get("channels_last_eager_ms"):
                cl = [statistics.median(row[f"channels_last_{k}_ms"]) for k in ("eager", "compiled")]
                notes.append(f"{row['case']} in channels_last: eager {cl[0]:.1f}, compiled {cl[1]:.1f} ms/step")
            if row.get("failed") is not None:
                print(f"| {row['case']} | failed ({row['failed']}) | | | | | |")
                continue
            eager, compiled = statistics.median(row["eager_ms"]), statistics.median(row["compiled_ms"])
            gain = eager - compiled
            s = {k: summarize_path(os.path.join(out, row["case"], f"{k}-trace.json.gz")) for k in ("eager", "compiled")}
            found = s["eager"]["findings"]
            lb = next((f for f in found if f["kind"] == "launch_bound"), None)
            kernels = [f"{sum(k['calls_per_step'] for k in s[v]['kernels']):.0f}" for v in ("eager", "compiled")]
            print(f"| {row['case']} | {eager:.1f} | {compiled:.1f} | {gain:.1f} | "
                  + (f"{lb['ms_per_step']:.1f} ({lb['ms_per_step'] / gain:.2f})" if lb and gain > 0 else
                     f"{lb['ms_per_step']:.1f}" if lb else "none")
                  + f" | {found[0]['kind'] + ' ' + format(found[0]['ms_per_step'], '.1f') if found else '-'} | "
                  + " -> ".join(str(k) for k in kernels) + " |")
    for note in notes:
        print(f"\n{note}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="every case: eager and compiled, each profiled, then timed alternated")
    r.add_argument("out")
    r.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    r.add_argument("--timeout", type=float, default=240, help="seconds a case's process may run")
    r.add_argument("--small", action="store_true", help="tiny sizes: a check of the script on a CPU")
    r.add_argument("--graphs", action="store_true", help='CUDA graphs too (mode="reduce-overhead"), timed in the '
                   "same alternation")
    o = sub.add_parser("one", help=argparse.SUPPRESS)
    o.add_argument("case", choices=list(CASES))
    o.add_argument("out")
    o.add_argument("--small", action="store_true")
    o.add_argument("--graphs", action="store_true")
    t = sub.add_parser("report", help="the table of prices against gains, from a run's folder")
    t.add_argument("out")
    a = p.parse_args(argv)
    if a.cmd == "run":
        run(a.out, a.cases, a.timeout, a.small, a.graphs)
    elif a.cmd == "one":
        print(json.dumps(one(a.case, a.out, a.small, a.graphs)))
    else:
        report(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
