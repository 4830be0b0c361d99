"""Loops whose steps are not alike, profiled through the API and both callbacks (issue #57, acceptance 1).

Three loops of a small eager conv net (bf16 autocast on CUDA), each through three harnesses, each (loop,
harness) in a fresh process with profiling's defaults (on CUDA: device-only timed steps, operators joined
from the untimed step after them):

    loop             what makes its steps unlike each other
    eval_in_window   an eval pass (eval_forwards forwards, model.eval(), no_grad) every EVAL_EVERY steps, so
                     one falls inside the profiled window: the API loop runs it in its steps 2, 7, 12, 17 (the
                     window's third step, also after a settling round moves the window by 5); the Trainer
                     (eval_strategy="steps") and Lightning (val_check_interval) after their steps 5, 10, 15
    random_branch    a per-sample random branch in forward: each sample, with p=BRANCH_P, gets an extra
                     residual conv of its own (a Python loop over the batch: the launches differ every step)
    varying_size     each batch cropped to a new random side (`sides`) by the collator: new shapes every step

    harness    api (profiling.Profiler in a loop of its own), hf (transformers.Trainer +
               profiling.HFCallback), lightning (lightning.Trainer + profiling.LightningCallback)

    python3 benchmarks/findings/live/uneven_steps.py run OUT               # the GPU (one call, ~4-5 minutes)
    uv run python benchmarks/findings/live/uneven_steps.py run OUT --cpu-smoke --loops eval_in_window \
        --harnesses api                                                     # a CPU smoke test (tiny sizes)
    uv run python benchmarks/findings/live/uneven_steps.py report OUT      # anywhere: the table, re-read
    uv run python benchmarks/findings/live/uneven_steps.py report OUT --rejoin  # ... each trace joined again

`run` writes OUT/results.jsonl (a row per process: loop, harness, the share of device time joined to
operators, the one-off steps named, the top 3 findings, step_ms, the window and where the evals fell, or the
failure) and each profile's folder (trace, report.md, summary.json) as <loop>-<harness>/ in
OUT/profiles-<k>.tar (few files, each under 16 MiB: what a device call returns). `report` unpacks those tars
when needed and summarizes each trace again with today's code; with --rejoin it first joins each trace's steps
again with today's join (the copied operators taken out, the best-joined like step in the untimed step's place:
benchmarks/same_output/join_fixtures.py `as_captured`). Results: uneven_steps_results.md. Without CUDA (or with --cpu-smoke) every size
is tiny.
"""
import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

LOOPS = ("eval_in_window", "random_branch", "varying_size")
HARNESSES = ("api", "hf", "lightning")

# ---------------------------------------------------------------------------------------------------------
# Sizes (GPU: a conv net busy a few ms per step on an H100/H200; CPU: tiny, for a smoke test)
# ---------------------------------------------------------------------------------------------------------

GPU = {"width": 64, "batch": 128, "side": 64, "sides": (48, 96), "classes": 100, "pool": 1024,
       "eval_forwards": 20, "steps": 45}
CPU = {"width": 8, "batch": 4, "side": 16, "sides": (12, 24), "classes": 10, "pool": 64, "eval_forwards": 2,
       "steps": 18}
EVAL_EVERY = 5        # steps between eval passes: one in every window of 5 profiled steps
EVAL_AT = 1           # the API loop evaluates in its steps i % EVAL_EVERY == EVAL_AT (0-based): 2, 7, 12, 17
BRANCH_P = 0.5        # each sample's chance of the extra conv (random_branch)
SIDE_STEP = 8         # varying_size: sides from sides[0] to sides[1] in steps of this
TAR_LIMIT = 15 * 2**20  # bytes of profile folders per tar
ROW = "uneven-steps row: "  # the child's result line, told apart from what the frameworks print


def _torch():
    import torch
    return torch, torch.nn, torch.nn.functional


# ---------------------------------------------------------------------------------------------------------
# The model and its data (shared by the three harnesses)
# ---------------------------------------------------------------------------------------------------------

def make_net(size, branch, seed=0):
    """A small ResNet-like conv net on uint8 images; forward(pixel_values, labels) -> {"loss", "logits"} (what
    the Trainer reads). With `branch`, each training sample gets an extra residual conv with p=BRANCH_P."""
    torch, nn, F = _torch()

    def conv(cin, cout, stride=1):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            w = size["width"]
            self.features = nn.Sequential(conv(3, w), conv(w, 2 * w, 2), conv(2 * w, 2 * w),
                                          conv(2 * w, 4 * w, 2), conv(4 * w, 4 * w))
            self.extra = conv(4 * w, 4 * w) if branch else None
            self.head = nn.Sequential(conv(4 * w, 4 * w), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                      nn.Linear(4 * w, size["classes"]))
            self.rng = random.Random(seed)  # the branch's choices, on the host (no sync)
            self.train_forwards, self.evals = 0, []  # where the eval passes fell, for the results row

        def forward(self, pixel_values, labels=None):
            if self.training:
                self.train_forwards += 1
            elif not self.evals or self.evals[-1] != self.train_forwards:
                self.evals.append(self.train_forwards)
            x = self.features(pixel_values.float() / 255)
            if self.extra is not None and self.training:  # per sample: the branch taken or not
                x = torch.stack([s + self.extra(s[None])[0] if self.rng.random() < BRANCH_P else s
                                 for s in x.unbind(0)])
            logits = self.head(x)
            out = {"logits": logits}
            if labels is not None:
                out["loss"] = F.cross_entropy(logits.float(), labels)
            return out

    torch.manual_seed(seed)
    return Net()


class Images:
    """`n` random uint8 images with labels (a pool of size["pool"], repeated), at the largest side."""

    def __init__(self, size, n, seed=0):
        torch, _, _ = _torch()
        g = torch.Generator().manual_seed(seed)
        side = max(size["side"], size["sides"][1])
        self.x = torch.randint(0, 256, (size["pool"], 3, side, side), dtype=torch.uint8, generator=g)
        self.y = torch.randint(0, size["classes"], (size["pool"],), generator=g)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"pixel_values": self.x[i % len(self.x)], "labels": self.y[i % len(self.x)]}


class Collate:
    """Stacks a batch cropped to one side: size["side"] always, or (vary) a new random side each batch."""

    def __init__(self, size, vary, seed=0):
        self.side, self.vary, self.rng = size["side"], vary, random.Random(seed)
        self.sides = list(range(size["sides"][0], size["sides"][1] + 1, SIDE_STEP))

    def __call__(self, items):
        torch, _, _ = _torch()
        s = self.rng.choice(self.sides) if self.vary else self.side
        return {"pixel_values": torch.stack([it["pixel_values"][:, :s, :s] for it in items]),
                "labels": torch.stack([it["labels"] for it in items])}


def data(size, loop, steps):
    """(train set, eval set or None, collate function) of a loop."""
    b = size["batch"]
    evals = Images(size, size["eval_forwards"] * b, seed=1) if loop == "eval_in_window" else None
    return Images(size, steps * b), evals, Collate(size, vary=loop == "varying_size")


# ---------------------------------------------------------------------------------------------------------
# The harnesses: each trains `loop` and returns (the Profiler, the model)
# ---------------------------------------------------------------------------------------------------------

def api(loop, size, dev, work):
    torch, _, _ = _torch()
    import profiling
    model = make_net(size, loop == "random_branch").to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev == "cuda")
    train, evals, collate = data(size, loop, size["steps"])
    loader = torch.utils.data.DataLoader(train, batch_size=size["batch"], collate_fn=collate,
                                         pin_memory=dev == "cuda")
    eval_loader = None if evals is None else torch.utils.data.DataLoader(evals, batch_size=size["batch"],
                                                                         collate_fn=collate)
    autocast = torch.autocast(dev, torch.bfloat16, enabled=dev == "cuda")

    def on(batch):
        return {k: v.to(dev, non_blocking=True) for k, v in batch.items()}

    def evaluate():
        model.eval()
        total = torch.zeros((), device=dev)
        with torch.no_grad(), autocast:
            for batch in eval_loader:
                total += model(**on(batch))["loss"]
        model.train()
        return (total / len(eval_loader)).item()  # the eval loss, read as a loop logs it

    prof = profiling.Profiler(model, samples_per_step=size["batch"], out_dir=work)
    i, batches = 0, iter(loader)
    while not prof.done:
        batch = next(batches, None)
        if batch is None:
            batches = iter(loader)
            batch = next(batches)
        with autocast:
            loss = model(**on(batch))["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if eval_loader is not None and i % EVAL_EVERY == EVAL_AT:
            evaluate()
        prof.step()
        i += 1
    return prof, model, 0  # the API loop's eval falls in the step that ran it


def hf(loop, size, dev, work):
    from transformers import Trainer, TrainingArguments

    import profiling
    cuda = dev == "cuda"
    model = make_net(size, loop == "random_branch")
    train, evals, collate = data(size, loop, size["steps"])
    extra = {"eval_strategy": "steps", "eval_steps": EVAL_EVERY, "per_device_eval_batch_size": size["batch"],
             "prediction_loss_only": True} if evals is not None else {}
    args = TrainingArguments(
        output_dir=os.path.join(work, "hf"), max_steps=size["steps"],
        per_device_train_batch_size=size["batch"], learning_rate=1e-3, bf16=cuda, use_cpu=not cuda, seed=0,
        optim="adamw_torch_fused" if cuda else "adamw_torch", report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, dataloader_pin_memory=cuda,
        **extra)
    callback = profiling.HFCallback(out_dir=work)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evals, data_collator=collate,
                      callbacks=[callback])
    trainer.train()
    return callback._latest.prof, model, 1  # the Trainer evaluates after on_step_end: in the next step


def lightning(loop, size, dev, work):
    torch, _, _ = _torch()
    import lightning as L

    import profiling
    cuda = dev == "cuda"
    net = make_net(size, loop == "random_branch")

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            return self.net(**batch)["loss"]

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.net(**batch)["loss"])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=self.device.type == "cuda")

    train, evals, collate = data(size, loop, size["steps"])
    loader = torch.utils.data.DataLoader(train, batch_size=size["batch"], collate_fn=collate, pin_memory=cuda)
    val = None if evals is None else torch.utils.data.DataLoader(evals, batch_size=size["batch"],
                                                                 collate_fn=collate)
    every = {"check_val_every_n_epoch": None, "val_check_interval": EVAL_EVERY,
             "limit_val_batches": size["eval_forwards"]} if val is not None else {}
    callback = profiling.LightningCallback(out_dir=work)
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, max_steps=size["steps"],
                        precision="bf16-mixed" if cuda else "32-true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=work, callbacks=[callback], num_sanity_val_steps=0, **every)
    trainer.fit(Module(), loader, val)
    return callback._latest.prof, net, 1  # Lightning validates after on_train_batch_end: in the next step


RUNS = {"api": api, "hf": hf, "lightning": lightning}


# ---------------------------------------------------------------------------------------------------------
# One process: one (loop, harness), its row
# ---------------------------------------------------------------------------------------------------------

def versions():
    from importlib import metadata
    out = {}
    for name in ("torch", "transformers", "lightning"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def window(prof):
    """The profiled window's steps, 1-based (after any settling rounds moved it)."""
    first = prof.warmup + prof.timed + prof.profiler_warmup + 1
    return [first, first + prof.active - 1]


def digest(summary):
    """What a row keeps of a summary: the join, the one-offs, the top findings, step time, failed checks."""
    ops = (summary.get("recorded") or {}).get("ops")
    return {
        "step_ms": summary.get("step_ms"), "unprofiled_step_ms": summary.get("unprofiled_step_ms"),
        "joined": ops.get("joined") if ops else None, "ops": ops,
        "one_off": [{k: r.get(k) for k in ("kind", "position", "of", "ms", "median_ms", "only", "text")}
                    for r in summary.get("one_off") or ()],
        "top": [{"kind": f.get("kind"), "ms_per_step": f.get("ms_per_step")}
                for f in (summary.get("findings") or [])[:3]],
        "failed_checks": [f"{c.get('name')}: {c.get('detail')}" for c in summary.get("checks") or ()
                          if not c.get("ok")],
        "notes": summary.get("notes") or [],
    }


def one(loop, harness, out, cpu_smoke):
    torch, _, _ = _torch()
    dev = "cuda" if torch.cuda.is_available() and not cpu_smoke else "cpu"
    size = GPU if dev == "cuda" else CPU
    work = tempfile.mkdtemp(prefix=f"uneven-{loop}-{harness}-")
    device = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    row = {"loop": loop, "harness": harness, "device": device, **versions(), "size": size}
    prof, model, shift = RUNS[harness](loop, size, dev, work)
    row["window"] = window(prof)
    row["evals_in_step"] = [n + shift for n in model.evals]  # 1-based step whose interval held each eval pass
    row["timed_step_ms_each"] = prof.metadata.get("timed_step_ms_each")
    if prof.folder is None:
        row["failed"] = "no profile folder (the loop ended before the profile was done?)"
        return row
    name = f"{loop}-{harness}"
    shutil.copytree(prof.folder, os.path.join(out, name), dirs_exist_ok=True)
    row["folder"] = name
    row.update(digest(prof.summary or {}))
    shutil.rmtree(work, ignore_errors=True)
    return row


# ---------------------------------------------------------------------------------------------------------
# The driver: every (loop, harness) in a fresh process, then the tars
# ---------------------------------------------------------------------------------------------------------

def progress(row):
    if row.get("failed"):
        return f"{row['loop']:15} {row['harness']:9} FAILED ({row.get('seconds')} s): {row['failed']}"
    joined = "-" if row.get("joined") is None else f"{100 * row['joined']:.1f}%"
    offs = ", ".join(f"{r['kind']} (step {r['position']}, {r['ms']:.1f} ms)"
                     for r in row.get("one_off") or []) or "none"
    top = ", ".join(f"{f['kind']} {f['ms_per_step']:.2f}" for f in row.get("top") or []) or "none"
    return (f"{row['loop']:15} {row['harness']:9} step {row.get('step_ms') or 0:.2f} ms, joined {joined}, "
            f"window {row.get('window')}, evals in {row.get('evals_in_step')}, one-offs: {offs}; top: {top} "
            f"({row.get('seconds')} s)")


def run(out, loops, harnesses, timeout, budget, cpu_smoke):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.jsonl")
    start = time.perf_counter()
    for harness in harnesses:
        for loop in loops:
            if time.perf_counter() - start > budget:
                print(f"budget of {budget:g} s spent: {loop} {harness} not run", flush=True)
                continue
            t = time.perf_counter()
            cmd = [sys.executable, os.path.abspath(__file__), "one", loop, harness, out] + (
                ["--cpu-smoke"] if cpu_smoke else [])
            try:
                p = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True,
                                   timeout=timeout)
                lines = [x[len(ROW):] for x in p.stdout.splitlines() if x.startswith(ROW)]
                row = json.loads(lines[-1]) if p.returncode == 0 and lines else {
                    "loop": loop, "harness": harness,
                    "failed": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:300],
                    "stderr": p.stderr[-3000:]}
            except subprocess.TimeoutExpired:
                row = {"loop": loop, "harness": harness, "failed": f"timeout after {timeout:g} s"}
            row["seconds"] = round(time.perf_counter() - t, 1)
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(progress(row), flush=True)
    pack(out, [f"{loop}-{harness}" for harness in harnesses for loop in loops])
    return 0


def pack(out, names, limit=TAR_LIMIT):
    """The profile folders into OUT/profiles-<k>.tar, each under `limit` bytes where the folders allow (a
    device call returns at most 8 files, each under 16 MiB); the folders removed once packed."""
    def size(name):
        return sum(os.path.getsize(f) for f in glob.glob(os.path.join(out, name, "**"), recursive=True)
                   if os.path.isfile(f))
    groups, total = [], limit
    for name in [n for n in names if os.path.isdir(os.path.join(out, n))]:
        n = size(name)
        if total + n > limit:
            groups.append([])
            total = 0
        groups[-1].append(name)
        total += n
        if n > limit:
            print(f"{name}: {n / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB a file may have",
                  flush=True)
    for k, group in enumerate(groups, 1):
        with tarfile.open(os.path.join(out, f"profiles-{k}.tar"), "w") as tar:
            for name in group:
                tar.add(os.path.join(out, name), arcname=name)
                shutil.rmtree(os.path.join(out, name))


# ---------------------------------------------------------------------------------------------------------
# The table, from what a run brought back (each trace summarized again with today's code)
# ---------------------------------------------------------------------------------------------------------

def unpack(out):
    """The tars' profile folders into OUT, where they are not there already."""
    for tar_path in sorted(glob.glob(os.path.join(out, "profiles-*.tar"))):
        with tarfile.open(tar_path) as tar:
            names = {m.name.split("/")[0] for m in tar.getmembers()}
            if not all(os.path.isdir(os.path.join(out, n)) for n in names):
                tar.extractall(out, filter="data")


def report(out, rejoin=False):
    from profiling.profile.report.ranks import summarize_path
    from profiling.profile.report.summary import load_trace, summarize
    from benchmarks.same_output.join_fixtures import rejoin as joined_again
    unpack(out)
    lines = [("| loop | harness | step ms | joined | one-offs (kind: ms, step of window) | "
              "top findings (ms/step) | failed checks |"), "|---|---|--:|--:|---|---|---|"]
    with open(os.path.join(out, "results.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for row in rows:
        folder = row.get("folder") and os.path.join(out, row["folder"])
        if row.get("failed") or not folder or not os.path.isdir(folder):
            failed = str(row.get("failed"))[:120]
            lines.append(f"| {row['loop']} | {row['harness']} | failed: {failed} | | | | |")
            continue
        try:
            d = digest(summarize(joined_again(load_trace(os.path.join(folder, "trace.json.gz")))) if rejoin
                       else summarize_path(folder))
        except Exception as e:  # noqa: BLE001 (one bad trace is a row of the table, not the end of it)
            lines.append(f"| {row['loop']} | {row['harness']} | summary failed: {type(e).__name__}: {e} "
                         "| | | | |")
            continue
        joined = "-" if d["joined"] is None else f"{100 * d['joined']:.1f}%"
        if (d["ops"] or {}).get("joined_all") is not None:  # the like steps' share, then every step's
            joined += f" ({100 * d['ops']['joined_all']:.1f}% all)"
        offs = "; ".join(f"{r['kind']}: {r['ms']:.1f} ({r['position']} of {r['of']})"
                         for r in d["one_off"]) or "-"
        top = "; ".join(f"{t['kind']} {t['ms_per_step']:.2f}" for t in d["top"]) or "-"
        failed = "; ".join(c[:100] for c in d["failed_checks"]) or "-"
        lines.append(f"| {row['loop']} | {row['harness']} | {d['step_ms']:.2f} | {joined} | {offs} | {top} "
                     f"| {failed} |")
    print("\n".join(lines))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="every (loop, harness) profiled in a fresh process")
    r.add_argument("out")
    r.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS))
    r.add_argument("--harnesses", nargs="+", choices=HARNESSES, default=list(HARNESSES))
    r.add_argument("--timeout", type=float, default=90, help="seconds one process may run")
    r.add_argument("--budget", type=float, default=280, help="seconds after which no run starts")
    r.add_argument("--cpu-smoke", action="store_true",
                   help="tiny sizes on the CPU (the default without CUDA)")
    o = sub.add_parser("one", help=argparse.SUPPRESS)
    o.add_argument("loop", choices=LOOPS)
    o.add_argument("harness", choices=HARNESSES)
    o.add_argument("out")
    o.add_argument("--cpu-smoke", action="store_true")
    t = sub.add_parser("report", help="the table, each trace of a run's folder summarized again")
    t.add_argument("out")
    t.add_argument("--rejoin", action="store_true",
                   help="join each trace's steps again with today's join (benchmarks/same_output/join_fixtures.py "
                        "as_captured: the best-joined like step stands in for the untimed step)")
    a = p.parse_args(argv)
    if a.cmd == "run":
        return run(a.out, a.loops, a.harnesses, a.timeout, a.budget, a.cpu_smoke)
    if a.cmd == "one":
        try:
            row = one(a.loop, a.harness, a.out, a.cpu_smoke)
        except Exception as e:  # noqa: BLE001 (the row says what failed; the driver goes on)
            row = {"loop": a.loop, "harness": a.harness, "failed": f"{type(e).__name__}: {e}"[:300],
                   "traceback": traceback.format_exc()[-3000:]}
        print(ROW + json.dumps(row), flush=True)
        return 0
    return report(a.out, a.rejoin)


if __name__ == "__main__":
    sys.exit(main())
