"""A benchmark of diagnoses: plant one slowdown at a time in a copy of train.py, profile it, and check that the
profile's findings name the planted cause.

    python3 benchmarks/diagnoses.py capture OUT [--cases a,b,...]   # on the GPU: plant, profile, keep traces
    uv run python benchmarks/diagnoses.py report OUT [--markdown FILE] [--json FILE]   # anywhere, from traces

`capture` writes, per case, `OUT/<case>.trace.json.gz` (the profile's trace, with what the live run recorded
in its metadata) and `OUT/<case>.log` (train.py's output), and `OUT/device.json` (the GPU, one timed bf16
8192^3 matmul before and after: a braked or shared GPU shows there). Each case runs
`train.py --profile` (2 warm-up + 5 profiled steps, as an agent runs it) in its own copy under
.bench/diagnoses/<case>/, the edit applied by exact text replacement: an edit whose text is no longer in
train.py stops the benchmark instead of silently planting nothing.

`report` reads the traces as `research profile` does and writes one row per case: the unprofiled and
profiled ms/step, the slowdown against the baseline's unprofiled step, the top finding, and whether the
planted cause is named: by the top finding, or by a finding whose cost is at least half the measured
slowdown (the acceptance line of issue #16). Failing rows stay in the results.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# 50 ms of Python per micro-batch in the input pipeline (the plants hidden_host_work and sync_exposes_host)
HOST_WORK_50MS = [
    ("            batch = next(loader)  # the next batch is prepared while the GPU works\n",
     "            batch = preprocess(next(loader))  # planted\n"),
    ("def make_train_step(", ("def preprocess(batch):  # planted: Python work on every batch\n"
                             "    t0 = time.perf_counter()\n    while time.perf_counter() - t0 < 0.05:\n"
                             "        pass\n    return batch\n\n\ndef make_train_step(")),
    ("import math\n", "import math\nimport time  # planted\n")]

# name -> (what is planted, finding kinds that name it, [(text in train.py, replacement)], background load)
CASES = {
    "baseline": ("nothing: the default train.py", (), [], None),
    "host_sync": (
        "the loss read with .item() after every micro-batch's backward (a host sync before the next batch)",
        ("host_sync",),
        [("                (loss / grad_accum_steps).backward()\n",
          ("                (loss / grad_accum_steps).backward()\n"
           "            last_loss = loss.item()  # planted\n"))],
        None),
    "nan_check": (
        "a NaN check after every block (`if torch.isnan(x).any(): raise`): graph breaks and host syncs",
        ("graph_break", "host_sync"),
        [("        return x + self.mlp(norm(x))\n",
          ("        x = x + self.mlp(norm(x))\n        if torch.isnan(x).any():  # planted\n"
           "            raise FloatingPointError('NaN in a block')\n        return x\n"))],
        None),
    "fp32_mlp": (
        "the MLP left in float32 (autocast off around it)",
        ("fp32_matmul", "fp32_intermediate"),
        [("        return self.c_proj(F.relu(self.c_fc(x)).square())\n",
          ("        with torch.autocast(x.device.type, enabled=False):  # planted\n"
           "            return self.c_proj(F.relu(self.c_fc(x.float())).square())\n"))],
        None),
    "dense_mask": (
        "the sliding window as a dense boolean mask passed to scaled_dot_product_attention",
        ("attention_fallback",),
        [("        self.masks = kernels.attention_masks(self.window_sizes, self.config.sequence_len, "
          "self.cos.device)\n",
          ("        T, device = self.config.sequence_len, self.cos.device  # planted: dense boolean masks\n"
           "        self.masks = {w: kernels.dense_mask(w, T, device) if w < T else None\n"
           "                      for w in set(self.window_sizes)}\n"))],
        None),
    "small_batch": (
        "DEVICE_BATCH_SIZE 16 instead of 128 (16 micro-batches of small kernels per step)",
        ("launch_bound",),
        [("DEVICE_BATCH_SIZE = 128 ", "DEVICE_BATCH_SIZE = 16  ")],
        None),
    "slow_input": (
        "200 ms of Python preprocessing per micro-batch in the input pipeline",
        ("gpu_waits_on_host",),
        [("            batch = next(loader)  # the next batch is prepared while the GPU works\n",
          "            batch = preprocess(next(loader))  # planted\n"),
         ("def make_train_step(", ("def preprocess(batch):  # planted: slow Python work on every batch\n"
                                  "    t0 = time.perf_counter()\n    while time.perf_counter() - t0 < 0.2:\n"
                                  "        pass\n    return batch\n\n\ndef make_train_step(")),
         ("import math\n", "import math\nimport time  # planted\n")],
        None),
    "shared_gpu": (
        "another process running bf16 matmuls on the same GPU (the GPU is slow, not the code)",
        ("slow_device",),
        [],
        "import torch\na = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\nwhile True:\n    a @ a\n"),
    # issue #26: causes no rule was written for when they were planted
    "eager_model": (
        "the model left uncompiled (the optimizer's update functions stay compiled)",
        ("eager_code", "regression"),
        [("    forward = torch.compile(ddp, dynamic=False) if COMPILE else ddp\n",
          "    forward = ddp  # planted: no torch.compile\n")],
        None),
    "eager_optimizer": (
        "the optimizer's update functions left uncompiled",
        ("eager_code", "regression"),
        [("maybe_compile = torch.compile(dynamic=False, fullgraph=True) if COMPILE else (lambda f: f)\n",
          "maybe_compile = lambda f: f  # planted: the optimizer runs eagerly\n")],
        None),
    "fp32_logits": (
        "the loss as plain F.cross_entropy over float32 soft-capped logits (the reference path)",
        ("regression", "over_bound"),
        [("        return kernels.head_loss(x.view(-1, x.size(-1)), self.lm_head.weight, targets.view(-1), "
          "reduction,\n                                 cap=SOFTCAP)\n",
          ("        logits = SOFTCAP * torch.tanh(self.lm_head(x).float() / SOFTCAP)  # planted\n"
           "        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), "
           "reduction=reduction)\n"))],
        None),
    "sync_per_step": (
        "the loss read with .item() once per step, before the optimizer step",
        ("host_sync", "regression"),
        [("        set_schedules(optimizer, step, progress)\n",
          "        last_loss = loss.item()  # planted: one sync per step\n"
          "        set_schedules(optimizer, step, progress)\n")],
        None),
    "odd_mlp_width": (
        "the MLP's hidden width 4 x width + 1 instead of 4 x width (GEMMs on a misaligned shape)",
        ("over_bound", "regression"),
        [("        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)\n"
          "        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)\n",
          ("        hidden = 4 * config.n_embd + 1  # planted: not a multiple of 8\n"
           "        self.c_fc = nn.Linear(config.n_embd, hidden, bias=False)\n"
           "        self.c_proj = nn.Linear(hidden, config.n_embd, bias=False)\n"))],
        None),
    "checkpoint_blocks": (
        "activation checkpointing around every block (its forward recomputed in the backward)",
        ("regression", "over_bound"),
        [("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.utils.checkpoint  # planted\n"),
         ("            x = block(x, ve, cos_sin, self.masks[self.window_sizes[i]])\n",
          ("            x = torch.utils.checkpoint.checkpoint(  # planted\n"
           "                block, x, ve, cos_sin, self.masks[self.window_sizes[i]], use_reentrant=False)\n"))],
        None),
    "hidden_host_work": (
        "50 ms of Python work per micro-batch in the input pipeline, nothing else (hidden behind the GPU)",
        (),
        HOST_WORK_50MS,
        None),
    "sync_exposes_host": (
        "hidden_host_work plus the loss read with .item() after each micro-batch's backward: the sync "
        "drains the GPU's queue, so the 50 ms run while the GPU waits (root cause: the sync)",
        ("host_sync",),
        [("                (loss / grad_accum_steps).backward()\n",
          "                (loss / grad_accum_steps).backward()\n"
          "                last_loss = loss.item()  # planted\n")] + HOST_WORK_50MS,
        None),
    # after the rules recompute and misaligned_shapes (2026-11-24): cases none of the rules were written on
    "checkpoint_mlp": (
        "activation checkpointing around the MLP only (its forward recomputed in the backward)",
        ("recompute", "regression"),
        [("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.utils.checkpoint  # planted\n"),
         ("        return x + self.mlp(norm(x))\n",
          "        return x + torch.utils.checkpoint.checkpoint(self.mlp, norm(x), use_reentrant=False)  # planted\n")],
        None),
    "eager_attention": (
        "the attention module excluded from torch.compile (@torch.compiler.disable on its forward)",
        ("graph_break", "eager_code", "regression"),
        [("    def forward(self, x, ve, cos_sin, mask):\n        B, T, C = x.size()\n",
          "    @torch.compiler.disable  # planted\n    def forward(self, x, ve, cos_sin, mask):\n"
          "        B, T, C = x.size()\n")],
        None),
    "clip_grad_sync": (
        "gradient clipping each step with a finiteness check on the host (clip_grad_norm_ + .item())",
        ("host_sync", "eager_code", "regression"),
        [("        set_schedules(optimizer, step, progress)\n",
          "        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # planted\n"
          "        if not math.isfinite(grad_norm.item()):  # planted\n"
          "            raise FloatingPointError('non-finite gradient')\n"
          "        set_schedules(optimizer, step, progress)\n")],
        None),
    "eval_forward": (
        "a second forward under torch.no_grad each step (the train loss of the last micro-batch, for logging)",
        ("forward_without_backward", "regression"),
        [("        set_schedules(optimizer, step, progress)\n",
          "        with torch.no_grad(), autocast:  # planted: a no-grad forward each step\n"
          "            forward(x, y)\n"
          "        set_schedules(optimizer, step, progress)\n")],
        None),
    "sync_microbatch": (
        "torch.cuda.synchronize() after every micro-batch's backward",
        ("host_sync", "regression"),
        [("                (loss / grad_accum_steps).backward()\n",
          "                (loss / grad_accum_steps).backward()\n"
          "                torch.cuda.synchronize()  # planted\n")],
        None),
    "mlp_width_1344": (
        "the MLP's hidden width 1344 (8/3 x width rounded down to a multiple of 64): mlp_width_1365's reference",
        (),
        [("        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)\n"
          "        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)\n",
          ("        hidden = 1344  # planted: 8/3 x 512 rounded to a multiple of 64\n"
           "        self.c_fc = nn.Linear(config.n_embd, hidden, bias=False)\n"
           "        self.c_proj = nn.Linear(hidden, config.n_embd, bias=False)\n"))],
        None),
    "mlp_width_1365": (
        "the MLP's hidden width int(8/3 x width) = 1365 (a SwiGLU-style ratio, not rounded)",
        ("misaligned_shapes", "regression"),
        [("        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)\n"
          "        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)\n",
          ("        hidden = int(8 / 3 * config.n_embd)  # planted: 1365, not a multiple of 8\n"
           "        self.c_fc = nn.Linear(config.n_embd, hidden, bias=False)\n"
           "        self.c_proj = nn.Linear(hidden, config.n_embd, bias=False)\n"))],
        None),
}


# ---------------------------------------------------------------------------------------------------------
# capture (GPU)
# ---------------------------------------------------------------------------------------------------------

def plant(case, source):
    """train.py's text with the case's edits applied; SystemExit when an edit's text is missing."""
    for old, new in CASES[case][2]:
        if source.count(old) != 1:
            sys.exit(f"diagnoses: case {case}: the text to replace is in train.py {source.count(old)} times "
                     f"(expected once): {old.strip()[:60]!r}; update CASES")
        source = source.replace(old, new)
    return source


def matmul_tflops():
    """One bf16 8192^3 matmul, median of 10 after 3 warm-ups, in TFLOP/s (a healthy H100: ~780)."""
    import torch
    from common import cuda_median_ms
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = cuda_median_ms(lambda: a @ a)
    return round(2 * 8192**3 / (ms / 1e3) / 1e12, 1)


def run_case(case, out, timeout):
    folder = os.path.join(ROOT, ".bench", "diagnoses", case)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with open(os.path.join(ROOT, "train.py"), encoding="utf-8") as f:
        source = plant(case, f.read())
    with open(os.path.join(folder, "train.py"), "w", encoding="utf-8") as f:
        f.write(source)
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, AUTORESEARCH_PROFILE_DIR=os.path.join(folder, "profiles"))
    hog = CASES[case][3] and subprocess.Popen([sys.executable, "-c", CASES[case][3]])
    t0 = time.time()
    try:
        with open(os.path.join(out, f"{case}.log"), "w") as log:
            code = subprocess.run([sys.executable, os.path.join(folder, "train.py"), "--profile"], cwd=ROOT,
                                  env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False).returncode
    finally:
        if hog:
            hog.kill()
            hog.wait()
    trace = os.path.join(folder, "profiles", "latest", "trace.json.gz")
    if code == 0 and os.path.exists(trace):
        shutil.copy(trace, os.path.join(out, f"{case}.trace.json.gz"))
    print(f"{case}: exit {code}, {time.time() - t0:.0f} s", flush=True)


def capture(args):
    import torch
    os.makedirs(args.out, exist_ok=True)
    cases = args.cases.split(",") if args.cases else list(CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.exit(f"diagnoses: unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    device = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "matmul_tflops_before": matmul_tflops()}
    for case in cases:
        run_case(case, args.out, args.timeout)
    device["matmul_tflops_after"] = matmul_tflops()
    with open(os.path.join(args.out, f"device-{cases[0]}.json"), "w") as f:
        json.dump(device, f, indent=2)
    print(json.dumps(device))


# ---------------------------------------------------------------------------------------------------------
# report (anywhere)
# ---------------------------------------------------------------------------------------------------------

def evaluate(case, s, baseline_ms):
    """One result row from a case's summary."""
    findings = s.get("findings", [])
    unprofiled = s.get("unprofiled_step_ms")
    slowdown = unprofiled - baseline_ms if unprofiled is not None and baseline_ms is not None else None
    expected = CASES[case][1] if case in CASES else ()
    top = findings[0] if findings else None
    naming = [f for f in findings if f["kind"] in expected]
    named = bool(naming) and (naming[0] is top or slowdown is not None and naming[0]["ms_per_step"] >= slowdown / 2)
    close = [f for f in naming if slowdown and abs(f["ms_per_step"] - slowdown) <= 0.3 * slowdown]
    big = [f for f in findings if f["ms_per_step"] >= 0.05 * s["step_ms"]]
    return {
        "case": case, "planted": CASES[case][0] if case in CASES else "?",
        "unprofiled_ms": round(unprofiled, 2) if unprofiled is not None else None,
        "profiled_ms": round(s["step_ms"], 2), "slowdown_ms": round(slowdown, 2) if slowdown is not None else None,
        "top_finding": f"{top['kind']} ({top['ms_per_step']:.1f} ms)" if top else "none",
        "naming_finding": f"{naming[0]['kind']} ({naming[0]['ms_per_step']:.1f} ms)" if naming else "none",
        "within_30pct": (f"{close[0]['kind']} ({close[0]['ms_per_step']:.1f} ms)" if close else "no")
        if expected else "",
        "result": ("ok" if not big else "FAIL: " + ", ".join(f["kind"] for f in big)) if not expected
        else ("ok" if named else "FAIL"),
    }


def report(args):
    from tabulate import tabulate

    from profiling.profile import regression, summary
    cases = [c for c in CASES if os.path.exists(os.path.join(args.out, f"{c}.trace.json.gz"))]
    summaries = {c: summary.summarize(summary.load_trace(os.path.join(args.out, f"{c}.trace.json.gz")))
                 for c in cases}
    if args.against_baseline and "baseline" in summaries:  # as a live run does with a kept run in the memory
        for c in cases:
            if c != "baseline":
                regression.add(summaries[c], summaries["baseline"], "the baseline")
    base = summaries.get("baseline", {}).get("unprofiled_step_ms")
    rows = [evaluate(c, summaries[c], base) for c in cases]
    rows += [{"case": c, "planted": CASES[c][0], "result": "FAIL: no trace (see its log)"} for c in CASES
             if c not in cases and os.path.exists(os.path.join(args.out, f"{c}.log"))]
    keys = ["case", "unprofiled_ms", "profiled_ms", "slowdown_ms", "top_finding", "naming_finding", "within_30pct",
            "result"]
    table = tabulate([[r.get(k, "") for k in keys] for r in rows], headers=keys, tablefmt="github")
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "findings": {c: s.get("findings", []) for c, s in summaries.items()}},
                      f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n\n" + "\n".join(f"- `{r['case']}`: {r['planted']}" for r in rows) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture", help="on the GPU: plant each case, profile it, keep the traces")
    c.add_argument("out")
    c.add_argument("--cases", help="comma-separated case names (default: all)")
    c.add_argument("--timeout", type=int, default=240, help="seconds per case (default 240)")
    r = sub.add_parser("report", help="findings per case from the kept traces")
    r.add_argument("out")
    r.add_argument("--json")
    r.add_argument("--markdown")
    r.add_argument("--against-baseline", action="store_true",
                   help="profile each case against the baseline's, as a run whose memory holds the baseline as "
                        "its best kept run (adds the regression finding)")
    args = p.parse_args()
    capture(args) if args.command == "capture" else report(args)


if __name__ == "__main__":
    main()
