"""Issue #56's CPU acceptance line, tried as a new user would: three loops, each profiled in a fresh process through
the public API or the HF callback, each report's top finding held against the measured gain of ITS OWN fix.

    loop     what it is                                              profiled through
    hf       a tiny GPT-2 from a config (no download), dropout at    transformers' Trainer + profiling.HFCallback()
             the config's default (0.1), Trainer's defaults
    unfused  a deep MLP of many small tensors (24 blocks of width    profiling.Profiler in a loop of its own
             64) trained by AdamW(foreach=False)
    varlen   a tiny causal transformer whose sequence length is a     profiling.profile_steps
             new random one every step (32..512 tokens)

The acceptance ("the top finding's price within 0.5-1.5x of its fix's measured gain, and the per-step figure
within 10% of the loop's measured mean step"), read for each loop:
- the report's top finding (kind, ms/step, fix text) from the profiled process's summary.json;
- the report's per-step figure (its title's `# Profile: N ms/step`) against the loop's measured mean step: the
  mean of the profiled process's own TIMED_STEPS unprofiled steps after its profile (the same process, the
  same load), and of the mistake's fresh processes; for varlen, whose steps differ by length, the mean over every
  length 32..512 of a quadratic fit of the unprofiled steps' ms over their length;
- the fix: the variant that applies the top finding's own fix text (FIXES maps a fix's words to a variant; a fix
  with no variant here is said, not timed), timed unprofiled in fresh processes, alternated with the mistake over
  ROUNDS rounds (this 2-core host is shared and drifts: a process's step is the median of its steps, the gain
  the median of the mistake's rounds less the fix's), and the ratio price / gain.

    uv run python benchmarks/findings/live/new_user_fixes_cpu.py run OUT [--loops hf,unfused,varlen] [--rounds 3]
    uv run python benchmarks/findings/live/new_user_fixes_cpu.py report OUT     # the table, each trace read again
                                                                                  # with today's code
    uv run python benchmarks/findings/live/new_user_fixes_cpu.py time OUT --loop hf --variants mistake,compiled
    uv run python benchmarks/findings/live/new_user_fixes_cpu.py time OUT --loop varlen --variants mistake,malloc \
        --after 300                                                # each process's steps 0-299 after its warm-up
    uv run python benchmarks/findings/live/new_user_fixes_cpu.py inprocess --loop varlen --fix fused  # one process
    uv run python benchmarks/findings/live/new_user_fixes_cpu.py inprocess --loop hf --fix nodropout
    uv run python benchmarks/findings/live/new_user_fixes_cpu.py faultcost    # a page fault's cost to hf, one process
    uv run python benchmarks/findings/live/new_user_fixes_cpu.py steps OUT --processes 3 --after 200 --before 200
        # the per-step figure alone: each loop profiled in fresh processes, each timing 200 more steps before
        # the profile and 200 after it

`run` writes OUT/results.jsonl (a row per process: loop, variant, profiled or timed, the step times, the top
findings) and OUT/<loop>/ (the profile's folder). OMP_NUM_THREADS is left as a new user leaves it (unset: torch's
default, one thread a core). Results: new_user_fixes_cpu_results.md.
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LOOPS = ("hf", "unfused", "varlen")
ROUNDS = 3            # mistake/fix rounds, alternated (the host drifts)
TIMED_STEPS = 40      # unprofiled steps timed in a process, after WARMUP
WARMUP = 5
HF_WARMUP = 3         # the Profiler's own warm-up steps (its default), which the HF callback's options move
PROFILED_STEPS = 60   # steps the profiled process runs before its own timed ones (the default schedule takes
                      # 21-22, more where the steps after the window are timed on)
WITHIN_STEP = 0.10    # the acceptance's "within 10% of the loop's measured mean step"
PRICE_RANGE = (0.5, 1.5)
FAULTS = []           # the process's page faults after each step (the row's `faults`: its timed steps' median)
MIN_LEN, MAX_LEN = 32, 512

# ---------------------------------------------------------------------------------------------------------
# The loops: each builds its model and returns step() (one training step); `variant` applies a fix
# ---------------------------------------------------------------------------------------------------------


def _compile_if(model, variant):
    import torch
    return torch.compile(model) if variant == "compiled" else model


def hf_parts(variant):
    """(model, Trainer args' extras) of the HF loop: GPT-2 with dropout at the config's default."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=2048, n_positions=128, n_embd=128, n_layer=4, n_head=4)
    if variant == "nodropout":  # not an admissible fix (the model changes): timed only to show what dropout costs
        config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    extras = {"torch_compile": True} if variant == "compiled" else {}
    if variant == "unfused_optim":
        extras["optim"] = "adamw_torch"
    return GPT2LMHeadModel(config), extras


def hf_run(variant, steps, folder, profiled, before=0, options=None):
    """The HF loop run for `steps` steps; [ms of each step] from on_step_end to on_step_end, the profile's folder;
    `before`: steps the profiler leaves alone before its own warm-up (timed here like the others); `options`: the
    HFCallback's own (a schedule)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

    import profiling
    from profiling.profile.capture import faults
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from hf_trainer import RandomTokens

    times = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter())
            FAULTS.append(faults.count())

    model, extras = hf_parts(variant)
    seq_len, batch = 128, 8
    args = TrainingArguments(output_dir=os.path.join(folder, "trainer"), max_steps=steps,
                             per_device_train_batch_size=batch, use_cpu=True, report_to="none",
                             save_strategy="no", seed=0, **extras)
    options = dict({"warmup_steps": HF_WARMUP + before} if before else {}, **options or {})
    callbacks = [Clock()] + ([profiling.HFCallback(out_dir=folder, **options)] if profiled else [])
    Trainer(model=model, args=args, train_dataset=RandomTokens(steps * batch, seq_len, 2048),
            data_collator=default_data_collator, callbacks=callbacks).train()
    return [1e3 * (b - a) for a, b in zip(times, times[1:])], (callbacks[-1].folder if profiled else None)


def hf_step_parts(variant):
    """(model, step) of the HF loop's training step without the Trainer around it, for `inprocess`: what the
    Trainer's step does with its defaults (the loss, backward, clip_grad_norm_ at 1.0, its fused AdamW, a linear
    schedule, zero_grad), on the same model and batch size; the Trainer's own per-step overhead is the same in
    both variants, so the gain between them is the model's."""
    import torch
    model, _ = hf_parts(variant)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: max(0.0, 1 - i / 1e6))
    ids = torch.randint(2048, (8, 128), generator=torch.Generator().manual_seed(0))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return model, step


def unfused_parts(variant):
    """(model, optimizer, step) of the deep MLP with AdamW(foreach=False)."""
    import torch
    from torch import nn
    torch.manual_seed(0)
    width, depth, batch = 64, 24, 64
    blocks = [nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()) for _ in range(depth)]
    model = nn.Sequential(*blocks, nn.Linear(width, 10))
    kw = {"fused": True} if variant == "fused" else {"foreach": True} if variant == "foreach" else {"foreach": False}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **kw)
    x, y = torch.randn(batch, width), torch.randint(10, (batch,))
    run = _compile_if(model, variant)

    def step():
        loss = nn.functional.cross_entropy(run(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, step


class TinyGPT:
    """A small causal transformer (pre-norm blocks, SDPA) over any length up to MAX_LEN."""

    @staticmethod
    def build(vocab=2048, width=128, depth=4, heads=4):
        import torch
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
                self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
                self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

            def forward(self, x):
                b, t, c = x.shape
                q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, c // heads).transpose(1, 3).unbind(2)
                y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
                return x + self.mlp(self.ln2(x))

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(MAX_LEN, width)
                self.blocks = nn.ModuleList(Block() for _ in range(depth))
                self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

            def forward(self, ids):
                x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
                for block in self.blocks:
                    x = block(x)
                return self.head(self.ln(x))
        return Model()


def varlen_parts(variant, lengths):
    """(model, step) of the varying-length loop: each step a batch of 4 sequences of the next length."""
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = TinyGPT.build()
    vocab = 2048
    kw = {"fused": True} if variant == "fused" else {"foreach": True} if variant == "foreach" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, **kw)
    run = _compile_if(model, variant)
    data = torch.randint(vocab, (4, MAX_LEN + 1))

    def step():
        t = next(lengths)
        if variant == "bucketed":  # a fix some reports give: the lengths padded to a few sizes
            t = min(MAX_LEN, 128 * -(-t // 128))
        ids = data[:, :t + 1]
        logits = run(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return t
    return model, step


def lengths_of(seed=0):
    """The varlen loop's lengths: a new random one every step, MIN_LEN..MAX_LEN (the same in every process)."""
    rng = random.Random(seed)
    while True:
        yield rng.randint(MIN_LEN, MAX_LEN)


def own_loop(loop, variant, steps, folder, profiled, before=0):
    """The plain loops (unfused, varlen): [ms of each step], [length of each step], the profile's folder, and the
    same two lists of the `before` steps run (after WARMUP) before the profile."""
    import profiling
    seen = []
    lengths = lengths_of()
    if loop == "unfused":
        model, step = unfused_parts(variant)
    else:
        model, raw = varlen_parts(variant, lengths)
        step = lambda: seen.append(raw())  # noqa: E731
    out, ahead = None, ([], [])
    if before:  # the loop's own steps before the profile, timed as those after it
        for _ in range(WARMUP):
            step()
        del seen[:]
        ahead = (_timed(step, before), list(seen))
        del seen[:]
    if profiled and loop == "unfused":
        prof = profiling.Profiler(model, samples_per_step=64, out_dir=folder)
        for _ in range(PROFILED_STEPS):
            step()
            prof.step()
        prof.close()
        out = prof.folder
    elif profiled:
        out = profiling.profile_steps(step, model, out_dir=folder).folder
    if profiled:  # the same process's unprofiled steps after the profile: WARMUP of them dropped, as unprofiled
        del seen[:]
    return _timed(step, steps), seen, out, ahead


def _timed(step, steps):
    """[ms] of `steps` calls of step()."""
    from profiling.profile.capture import faults
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t0))
        FAULTS.append(faults.count())
    return times


def child(loop, variant, mode, folder, after=TIMED_STEPS, before=0):
    """One process's work: a JSON line on stdout (the step times, or the profile's folder); `after`: the steps
    timed after the warm-up (after the profile, in a profiled process); `before`: in a profiled process, the
    steps timed before the profile too."""
    profiled = mode == "profile"
    if variant == "threads1":  # cpu_threads' fix: the intra-op pool on one core (it changes nothing computed)
        import torch
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    ahead = ([], [])
    if loop == "hf":  # the profiled Trainer runs on past its profile: its last `after` steps are timed
        times, out = hf_run(variant, (PROFILED_STEPS + before if profiled else WARMUP) + after, folder, profiled,
                            before)
        # before: the steps ahead of the profiler's own (its warm-up's, HF_WARMUP, left out), WARMUP left out
        ahead, times, seen = (times[WARMUP:before], []), times[-after:], []
    else:
        times, seen, out, ahead = own_loop(loop, variant, WARMUP + after, folder, profiled, before)
        times, seen = times[WARMUP:], seen[WARMUP:]
    row = {"loop": loop, "variant": variant, "mode": mode, "seconds": round(time.perf_counter() - t0, 1),
           "load": os.getloadavg()[0], "threads": _threads(), "folder": out,
           "ms": [round(t, 3) for t in times], "lengths": seen,
           "faults_each": [b - a for a, b in zip(FAULTS[-len(times) - 1:], FAULTS[-len(times):])]
           if len(FAULTS) > len(times) else None}
    row["faults"] = statistics.median(row["faults_each"]) if row["faults_each"] else None
    if before:
        row.update(before_ms=[round(t, 3) for t in ahead[0]], before_lengths=ahead[1])
    print("RESULT " + json.dumps(row), flush=True)


def _threads():
    import torch
    return torch.get_num_threads()


# ---------------------------------------------------------------------------------------------------------
# Driving the processes
# ---------------------------------------------------------------------------------------------------------

def spawn(out, loop, variant, mode, timeout=900, after=TIMED_STEPS, before=0):
    folder = os.path.join(out, loop) if mode == "profile" else tempfile.mkdtemp(prefix=f"nufc-{loop}-")
    os.makedirs(folder, exist_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), "child", "--loop", loop, "--variant", variant, "--mode", mode,
           "--dir", folder, "--after", str(after), "--before", str(before)]
    env = dict(os.environ, **MALLOC_ENV[variant]) if variant in MALLOC_ENV else None  # read at start-up
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    if mode != "profile":
        shutil.rmtree(folder, ignore_errors=True)
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("RESULT ")), None)
    row = json.loads(line[len("RESULT "):]) if line else {
        "loop": loop, "variant": variant, "mode": mode, "error": (done.stdout + done.stderr)[-3000:]}
    row["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    if row.get("folder"):
        row["folder"] = os.path.relpath(row["folder"], out)
        row["top"] = tops(os.path.join(out, row["folder"]))
    with open(os.path.join(out, "results.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"{loop} {variant} {mode}: " + (f"mean {statistics.mean(row['ms']):.2f} ms" if row.get("ms") else
                                          json.dumps(row.get("top") or row.get("error", ""))[:400]), flush=True)
    return row


def tops(folder, n=3):
    with open(os.path.join(folder, "summary.json")) as f:
        s = json.load(f)
    with open(os.path.join(folder, "report.md")) as f:
        title = title_ms(f.read())
    return {"step_ms": s["step_ms"], "title_ms": title, "findings": [{k: f[k] for k in ("kind", "ms_per_step", "fix", "evidence")}
                                                  for f in s["findings"][:n]]}


def run(out, loops, rounds, variants):
    os.makedirs(out, exist_ok=True)
    for loop in loops:
        prof = spawn(out, loop, "mistake", "profile")
        fix = variants.get(loop) or fix_variant(loop, (prof.get("top") or {}).get("findings"))
        for _ in range(rounds):
            for variant in ["mistake"] + ([fix] if fix else []):
                spawn(out, loop, variant, "time")
    return 0


def steps_figure(out, loops, processes, after, before=0):
    """The CPU line's per-step clause: in each of `processes` fresh processes per loop, the report's title figure
    against the mean of the `after` unprofiled steps the same process then ran, and the `before` it ran before
    the profile (varlen: the mean over 32..512 of a quadratic in the length fitted to them, the loop's mean step
    whatever lengths those steps drew); and against the `before` steps alone, the loop as the profiler found it
    (after the report glibc's thresholds are the report's: results run 8)."""
    os.makedirs(out, exist_ok=True)
    rows = []
    for _ in range(processes):
        for loop in loops:
            row = spawn(out, loop, "mistake", "profile", after=after, before=before)
            title = (row.get("top") or {}).get("title_ms")
            ahead = (row.get("before_ms") or [], row.get("before_lengths") or [])
            mean = loop_mean(loop, ahead[0] + (row.get("ms") or []), ahead[1] + (row.get("lengths") or []))
            rows.append((loop, title, mean, loop_mean(loop, *ahead), row.get("load")))
            print(f"  {loop}: title {title} ms/step, the steps timed around it: mean {mean and round(mean, 2)}"
                  f" -> {title / mean if title and mean else float('nan'):.3f}", flush=True)
    print("| loop | title ms/step | mean of the steps before and after (varlen: their fit's, over 32..512) | "
          "title / mean | within 10% | title / the steps before alone | load |")
    print("|---|--:|--:|--:|---|--:|--:|")
    for loop, title, mean, ahead, load in rows:
        ok = title and mean and abs(title / mean - 1) <= WITHIN_STEP
        print(f"| {loop} | {title} | {mean:.2f} | {title / mean:.3f} | {'yes' if ok else 'no'} | "
              + (f"{title / ahead:.3f}" if ahead else "") + f" | {load:.2f} |" if title and mean else
              f"| {loop} | {title} | {mean} | | no | | |")
    return 0


def loop_mean(loop, ms, lengths):
    """The loop's mean step from steps it ran: their mean; varlen's, whose steps differ by length, the mean over
    every length 32..512 (uniform) of a quadratic in the length fitted to them. None without steps."""
    if not ms:
        return None
    return statistics.fmean(ms) if loop != "varlen" else over_lengths([{"ms": ms, "lengths": lengths}])


# The fix's words -> the variant that applies them (checked in this order; the first that matches)
FIXES = (("MALLOC_MMAP_MAX_", "malloc"), ("set_num_threads", "threads1"), ("fused=True", "fused"),
         ("foreach=True", "foreach"), ("dropout", "nodropout"), ("torch.compile", "compiled"), ("bucket", "bucketed"))


# The `malloc` variant: page_faults' fix, glibc's settings in the child's environment (the values its fix names;
# run 8 timed the first fix's, MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864: `malloc32`)
MALLOC_ENV = {"malloc": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1073741824"},
              "malloc32": {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "67108864"}}


def fix_variant(loop, findings):
    if not findings:
        return None
    text = findings[0]["fix"]
    return next((v for words, v in FIXES if words in text), None)


# ---------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------

TITLE = re.compile(r"^# Profile: ([\d,.]+) ms/step", re.M)


def title_ms(report_md):
    """The report's per-step figure: its title's (the unprofiled step where the title shows it)."""
    m = TITLE.search(report_md)
    return float(m.group(1).replace(",", "")) if m else None


def fit(rows):
    """ms as a quadratic in the length, over every unprofiled step of these rows (numpy's least squares)."""
    import numpy as np
    x = [t for r in rows for t in r["lengths"]]
    y = [m for r in rows for m in r["ms"]]
    return np.poly1d(np.polyfit(x, y, 2))


def over_lengths(rows):
    """The loop's mean step over every length MIN_LEN..MAX_LEN (uniform), from the fit of these rows' steps."""
    curve = fit(rows)
    return statistics.fmean(float(curve(t)) for t in range(MIN_LEN, MAX_LEN + 1))


def summarize_loop(out, loop, rows, again):
    """One loop's figures: the report's step and top finding, the measured steps, the fix's gain."""
    prof = next(r for r in rows if r["mode"] == "profile" and r["loop"] == loop)
    folder = os.path.join(out, prof["folder"])
    top = tops_again(folder) if again else prof["top"]
    timed = {}
    for r in rows:
        if r["loop"] == loop and r["mode"] == "time" and r.get("ms"):
            timed.setdefault(r["variant"], []).append(r)
    # a process's step: the median of its timed steps (a burst of the shared host's other work, 121 ms against
    # 8 for a whole process once, moves a mean); the rounds' step: their median
    mistake = [statistics.median(r["ms"]) for r in timed.get("mistake", ())]
    first = top["findings"][0] if top["findings"] else None
    fix = fix_variant(loop, top["findings"])
    fixed = [statistics.median(r["ms"]) for r in timed.get(fix, ())] if fix else []
    d = {"loop": loop, "step_ms": top["title_ms"], "rounds_ms": statistics.mean(
            statistics.mean(r["ms"]) for r in timed["mistake"]) if mistake else None,
         "same_ms": statistics.mean(prof["ms"]) if prof.get("ms") else None, "mistake_rounds": mistake,
         "top": first, "fix_variant": fix, "fix_rounds": fixed, "load": prof.get("load")}
    d["measured_ms"] = d["same_ms"] or d["rounds_ms"]
    if loop == "varlen":  # the loop's mean step: a fit of ms over the length, averaged over MIN_LEN..MAX_LEN
        d["measured_ms"] = over_lengths([prof] + timed.get("mistake", []))
    if mistake and fixed:
        d["gain_ms"] = statistics.median(mistake) - statistics.median(fixed)
        d["ratio"] = first["ms_per_step"] / d["gain_ms"] if d["gain_ms"] > 0 else None
    return d


def tops_again(folder):
    from profiling.profile.report.ranks import summarize_path
    from profiling.profile.report.render import to_markdown
    s = summarize_path(folder)
    return {"step_ms": s["step_ms"], "title_ms": title_ms(to_markdown(s)), "findings": [{k: f[k] for k in ("kind", "ms_per_step", "fix", "evidence")}
                                                  for f in s["findings"][:3]]}


def verdicts(d):
    step = d["step_ms"] / d["measured_ms"] if d.get("measured_ms") else None
    ok_step = step is not None and abs(step - 1) <= WITHIN_STEP
    ok_price = d.get("ratio") is not None and PRICE_RANGE[0] <= d["ratio"] <= PRICE_RANGE[1]
    return step, ok_step, ok_price


def report(out, again=False):
    with open(os.path.join(out, "results.jsonl")) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    lines = ["| loop | report ms/step | measured: same process after the profile; alternated processes | report / "
             "measured (within 10%?) | top finding: price | its fix | fix timed (rounds) | mistake (rounds) | gain "
             "| price / gain (0.5-1.5?) |", "|---|--:|---|---|---|---|---|---|--:|---|"]
    out_rows = []
    for loop in dict.fromkeys(r["loop"] for r in rows if r["mode"] == "profile"):
        d = summarize_loop(out, loop, rows, again)
        out_rows.append(d)
        step, ok_step, ok_price = verdicts(d)
        top = d["top"] or {}
        rounds = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
        measured = f"{d['same_ms']:.2f}" if d.get("same_ms") else "-"
        if loop == "varlen":
            measured += f" (all lengths {MIN_LEN}..{MAX_LEN}, from a fit of every unprofiled step: {d['measured_ms']:.2f})"
        measured += f"; {d['rounds_ms']:.2f}" if d.get("rounds_ms") else ""
        gain = f"{d['gain_ms']:.2f}" if d.get("gain_ms") is not None else "-"
        ratio = "-" if d.get("ratio") is None else f"{d['ratio']:.2f}"
        lines.append(
            f"| {loop} | {d['step_ms']:.2f} | {measured} | {step:.3f} ({'yes' if ok_step else 'NO'}) | "
            f"{top.get('kind', '-')}: {top.get('ms_per_step', 0):.2f} | {_cell(top.get('fix', '-'))} | "
            f"{d['fix_variant'] or 'none applies'} ({rounds(d['fix_rounds'])}) | {rounds(d['mistake_rounds'])} | "
            f"{gain} | {ratio} ({'yes' if ok_price else 'NO'}) |")
    print("\n".join(lines))
    return out_rows


def _cell(text, n=220):
    text = re.sub(r"\s+", " ", text).replace("|", "/")
    return text if len(text) <= n else text[:n] + "..."


class _Feed:
    """The varlen loop's lengths for the block being timed: each variant runs the same ones."""

    def __init__(self):
        self.xs = iter(())

    def __next__(self):
        return next(self.xs)


def inprocess(loop, fix, blocks, steps):
    """The mistake and the fix in ONE process, each its own model (the same init), timed in alternated blocks of
    `steps` steps (the order flipped every block; varlen's blocks each a new draw of lengths, the same for both):
    the host's drift between processes, which buried these gains in `run`'s fresh processes, moves both alike.
    Prints and returns {variant: [ms/step of each block]}."""
    feed, rng, variants = _Feed(), random.Random(0), ("mistake", fix)
    parts = {"hf": hf_step_parts, "unfused": unfused_parts, "varlen": lambda v: varlen_parts(v, feed)}[loop]
    step = {v: parts(v)[1] for v in variants}
    times = {v: [] for v in variants}
    for b in range(blocks + 1):  # block 0: the warm-up
        xs = [rng.randint(MIN_LEN, MAX_LEN) for _ in range(steps)]
        for v in variants if b % 2 else variants[::-1]:
            feed.xs = iter(xs)
            t = time.perf_counter()
            for _ in range(steps):
                step[v]()
            if b:
                times[v].append(round((time.perf_counter() - t) / steps * 1e3, 3))
    med = {v: statistics.median(ms) for v, ms in times.items()}
    print(json.dumps({"loop": loop, "fix": fix, "blocks": times, "median_ms": med,
                      "gain_ms": round(med["mistake"] - med[fix], 3)}))
    return times


def fault_cost(blocks, steps):
    """What a page fault costs the hf loop, inside one process: glibc's thresholds switched (mallopt) between
    128 KiB (every large chunk mapped and trimmed anew: many faults) and 32 MiB / 64 MiB (`malloc32`'s: few),
    in alternated blocks of `steps` steps; the slope (ms a step over faults a step between them) against
    capture/faults.py's probe with 1 thread and with the loop's threads, taken in the same process. Linux only.
    Prints and returns the JSON row."""
    import ctypes

    import torch

    from profiling.profile.capture import faults
    libc, m_trim, m_mmap = ctypes.CDLL("libc.so.6"), -1, -3
    _, step = hf_step_parts("mistake")
    for _ in range(WARMUP):
        step()
    runs = {"low": [], "fix": []}
    for b in range(blocks):
        for mode in ("low", "fix") if b % 2 else ("fix", "low"):
            mmap_t, trim_t = (128 << 10, 128 << 10) if mode == "low" else (32 << 20, 64 << 20)
            assert libc.mallopt(m_mmap, mmap_t) == 1 and libc.mallopt(m_trim, trim_t) == 1
            for _ in range(3):  # the heap settles to the new thresholds
                step()
            f0, t0 = faults.count(), time.perf_counter()
            for _ in range(steps):
                step()
            runs[mode].append(((time.perf_counter() - t0) / steps * 1e3, (faults.count() - f0) / steps))
    ms = {k: statistics.median(a for a, _ in v) for k, v in runs.items()}
    fl = {k: statistics.median(b for _, b in v) for k, v in runs.items()}
    threads = torch.get_num_threads()
    row = {"loop": "hf", "blocks": {k: [[round(a, 2), round(b)] for a, b in v] for k, v in runs.items()},
           "median_ms": ms, "median_faults": fl, "threads": threads,
           "loop_us_per_fault": round((ms["low"] - ms["fix"]) / (fl["low"] - fl["fix"]) * 1e3, 3),
           "probe_us_1_thread": [round(faults.cost_us(1), 3) for _ in range(3)],
           "probe_us_loop_threads": [round(faults.cost_us(threads), 3) for _ in range(3)],
           "load": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    print("RESULT " + json.dumps(row), flush=True)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="profile each loop, then time the mistake and the top finding's fix")
    r.add_argument("out")
    r.add_argument("--loops", default=",".join(LOOPS))
    r.add_argument("--rounds", type=int, default=ROUNDS)
    r.add_argument("--fix", action="append", default=[], help="LOOP=VARIANT: time this fix, not the report's")
    t = sub.add_parser("time", help="time variants of one loop, alternated, unprofiled")
    t.add_argument("out")
    t.add_argument("--loop", choices=LOOPS, required=True)
    t.add_argument("--variants", default="mistake")
    t.add_argument("--rounds", type=int, default=ROUNDS)
    t.add_argument("--after", type=int, default=TIMED_STEPS, help="steps timed a process, after its warm-up")
    s = sub.add_parser("report", help="the table from OUT/results.jsonl")
    s.add_argument("out")
    s.add_argument("--again", action="store_true", help="each trace summarized again with today's code")
    fc = sub.add_parser("faultcost", help="hf's cost of a page fault in one process (glibc's thresholds switched) "
                        "against capture/faults.py's probe")
    fc.add_argument("--blocks", type=int, default=8)
    fc.add_argument("--steps", type=int, default=15)
    i = sub.add_parser("inprocess", help="the mistake and a fix alternated in blocks inside one process")
    i.add_argument("--loop", choices=LOOPS, required=True)
    i.add_argument("--fix", default="fused")
    i.add_argument("--blocks", type=int, default=10)
    i.add_argument("--steps", type=int, default=20)
    c = sub.add_parser("child", help="one process's work (what run spawns)")
    c.add_argument("--loop", choices=LOOPS, required=True)
    c.add_argument("--variant", default="mistake")
    c.add_argument("--mode", choices=("profile", "time"), required=True)
    c.add_argument("--dir", required=True)
    c.add_argument("--after", type=int, default=TIMED_STEPS)
    c.add_argument("--before", type=int, default=0)
    f = sub.add_parser("steps", help="the per-step figure: profile each loop in fresh processes, each then timing "
                       "AFTER more steps; the report's title against their mean")
    f.add_argument("out")
    f.add_argument("--loops", default=",".join(LOOPS))
    f.add_argument("--processes", type=int, default=3)
    f.add_argument("--after", type=int, default=200)
    f.add_argument("--before", type=int, default=0, help="steps timed before the profile too, in the mean")
    a = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    if a.cmd == "faultcost":
        fault_cost(a.blocks, a.steps)
        return 0
    if a.cmd == "inprocess":
        inprocess(a.loop, a.fix, a.blocks, a.steps)
        return 0
    if a.cmd == "child":
        return child(a.loop, a.variant, a.mode, a.dir, a.after, a.before) or 0
    if a.cmd == "steps":
        return steps_figure(a.out, a.loops.split(","), a.processes, a.after, a.before)
    if a.cmd == "run":
        return run(a.out, a.loops.split(","), a.rounds, dict(x.split("=", 1) for x in a.fix))
    if a.cmd == "time":
        os.makedirs(a.out, exist_ok=True)
        for _ in range(a.rounds):
            for v in a.variants.split(","):
                spawn(a.out, a.loop, v, "time", after=a.after)
        return 0
    report(a.out, a.again)
    return 0


if __name__ == "__main__":
    sys.exit(main())
