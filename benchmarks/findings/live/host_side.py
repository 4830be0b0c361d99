"""The host side of the step (issue #48): real GPU traces of input-bound, precision-bound, compiling and DDP
runs, profiled through the public API, and the unprofiled step time of each candidate fix, each variant in a
fresh process, so each finding's claimed gain can be checked against what its fix recovers.

    python3 benchmarks/findings/live/host_side.py OUT --all                    # cases 1-4 on one GPU (about
    6-7 min) python3 benchmarks/findings/live/host_side.py OUT --cases lightning_ddp --devices 2    # case 5
    on two GPUs (~2 min) python3 benchmarks/findings/live/host_side.py OUT --all --size tiny --device cpu
    --reps 1   # a smoke run on a CPU

Cases and variants (benchmarks/findings/live/host_side_cases.py, host_side_ddp.py; a variant's process:
host_side_variant.py; the first variant is the baseline; * = profiled too). The times are estimates for an
H100 host (16 cores): ~5-10 s of imports and CUDA start in each process, compiles ~30 s; none was measured
on a GPU when this was written.
    resnet18_pydecode  torchvision ResNet-18, channels_last, bf16 autocast, SGD momentum, batch 64, fed by
                       a map-style Dataset of 256 JPEGs (256x256, made at start with PIL) that decodes, crops
                       (RandomResizedCrop to 224), flips and normalizes each sample in PIL/numpy (~2 ms a
                       sample on one core): workers_0* (the DataLoader's defaults), workers_2* (too few
                       workers for that cost), workers_8, pin_memory (workers 0, pinned batches,
                       non_blocking copies). One DataLoader iterator feeds the whole run, the Profiler's
                       steps and then the timed ones (no restart, no epoch end). With workers the prefetch
                       queue (num_workers x prefetch_factor batches) fills at start and drains in the first
                       steps (DESIGN.md pitfall 17): the warm-up is then at least twice that many steps, and
                       every step's time is kept, warm-up included, to show the steady state.
                       ~90 s: 4 processes; workers_0 ~120 ms/step.
    convnext_fp32      torchvision ConvNeXt-T in float32, AdamW, a synthetic batch 64 x 3 x 224 x 224 on the
                       GPU: fp32*, bf16_channels_last (autocast bf16 + channels_last model and input: the
                       fix), bf16, channels_last, cudnn_benchmark (cudnn.benchmark=True on fp32).
                       ~90 s: 5 processes; fp32 ~0.2 s/step.
    t5_small           transformers T5ForConditionalGeneration at t5-small's sizes (a T5Config: no download),
                       not compiled, bf16 autocast, AdamW, batch 32 x 512 encoder / 128 decoder tokens:
                       default* (the attention transformers picks: SDPA in transformers 5, which passes T5's
                       relative position bias as SDPA's float attn_mask), eager_attention
                       (attn_implementation="eager"). ~45 s: 2 processes; ~60 ms/step.
    compile_in_window  a 4-layer transformer (width 384, batch 32 x 256 tokens) under torch.compile: warm*
                       (the Profiler's defaults, created before the first compiled call: the compile falls
                       in its warm-up steps), then in_window* (warmup_steps=0, timed_steps=0,
                       profiler_warmup_steps=0: the first compile falls in the first profiled step;
                       unprofiled_step_ms is warm's measured median). Each process compiles cold (a fresh
                       TORCHINDUCTOR_CACHE_DIR); on a CPU the backend is aot_eager (no C++ build).
                       ~130 s: 2 processes, ~30-50 s of compile each.
    lightning_ddp      only with --devices 2 or more: a residual MLP (24 x Linear(256, 256)), batch 32 a
                       rank, Lightning strategy="ddp", precision "bf16-mixed" (host-bound: the launches
                       dominate): unprofiled, profiled* (profiling.LightningCallback). Each rank records
                       every step's host timestamps (batch start, before and after backward, batch end; one
                       CLOCK_MONOTONIC for the ranks of a host) and a CUDA event; host_side.json gives per
                       rank and window (the profiled steps; the unprofiled ones after them) the median step,
                       forward, backward and optimizer times and how late the rank reaches backward (where
                       DDP's all-reduce waits) after the first one: a straggler shows there.
                       ~90 s: 2 launches of 2 processes (Lightning import, NCCL start).
A profiled variant is profiled first, from its loop's start as a user's script is (--profile-at steady:
after the timed steps), then timed in the same process on the same iterator. Timing: --warmup steps, then
--reps runs of --timed steps, each run between two device syncs (its ms/step: wall time / steps), and each
step timed by CUDA events at its edges (no sync).

At the start: the GPU's state (nvidia-smi: name, SM clock, max SM clock, power, clock event reasons; idle and
under load) and the TFLOP/s of a bf16 8192^3 matmul, so a throttled GPU is seen. NCCL_NVLS_ENABLE=0 is set
when absent.

Writes into OUT at most 8 files, at most one folder down (what a device call brings back):
    OUT/host_side.json              device, torch, date, the GPU check, and per case and variant: ms/step
                                    (the median of the reps, every rep, every step), samples/s, the
                                    variant's settings, and where profiled: its report (Markdown), top
                                    findings, profiled and unprofiled step, trace file; on error, the log's
                                    last lines
    OUT/<case>-<variant>.trace.json.gz        each profile's trace (`research profile` reads it again)
    OUT/lightning_ddp/rank-<k>.trace.json.gz  the DDP profile's (`research profile OUT/lightning_ddp`)
The profiles' folders, each process's log and its part of the JSON go to --work (default: a new folder in
/tmp). Each variant's process may run --variant-timeout seconds, and none runs past --budget seconds from
the start (host_side.json is rewritten after every variant: what ran is kept).
"""
import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [ROOT, HERE]  # `profiling` from this working tree; host_side_*.py beside this file

ONE_GPU = ("resnet18_pydecode", "convnext_fp32", "t5_small", "compile_in_window")
DDP = "lightning_ddp"
MATMUL_N = 8192
SMI_FIELDS = "name,clocks.sm,clocks.max.sm,power.draw,clocks_event_reasons.active"
SMI_FIELDS_OLD = SMI_FIELDS.replace("clocks_event_reasons", "clocks_throttle_reasons")  # drivers before 535


# ------------------------------------------------------------------------------------------------------------
# The driver: the GPU check, then one process per variant


def gpu_check(device):
    """nvidia-smi's view of the GPU idle and under a bf16 matmul, and the matmul's TFLOP/s."""
    import torch
    out = {"nvidia_smi_idle": _smi()}
    if device != "cuda" or not torch.cuda.is_available():
        return dict(out, matmul="no CUDA device: not measured")
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    look = (f"sleep 1; nvidia-smi --query-gpu={SMI_FIELDS} --format=csv,noheader || "
            f"nvidia-smi --query-gpu={SMI_FIELDS_OLD} --format=csv,noheader")
    smi = subprocess.Popen(["sh", "-c", look],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, t0 = 0, time.perf_counter()
    start.record()
    while time.perf_counter() - t0 < 2.5:  # long enough for nvidia-smi to look in the middle
        for _ in range(20):
            a @ b
        n += 20
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    busy = (smi.communicate(timeout=30)[0] or "").strip()
    tflops = 2 * MATMUL_N ** 3 * n / (start.elapsed_time(end) / 1e3) / 1e12
    del a, b
    torch.cuda.empty_cache()  # the variants' processes get the GPU's memory
    return dict(out, nvidia_smi_under_matmul=busy, matmul_bf16_tflops=round(tflops, 1))


def _smi():
    for fields in (SMI_FIELDS, SMI_FIELDS_OLD):
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True,
                               text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"nvidia-smi: {e}"
        if r.returncode == 0:
            return " | ".join(r.stdout.strip().splitlines())
    return f"nvidia-smi failed: {r.stderr.strip()[:200]}"


def run_child(case, variant, args, timeout, extra=()):
    """The variant in a fresh process (its own session, so a timeout ends it and its workers and ranks); its
    part(s) of the JSON, or an error with the log's tail."""
    log = os.path.join(args.work, "logs", f"{case}-{variant}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), args.out, f"--in-process={case}:{variant}",
           "--work", args.work]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in _passed(args).items()] + list(extra)
    cmd += ["--no-profile"] if args.no_profile else []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cache = None
    if case == "compile_in_window":  # a cold compile in each process, as a user's first run has
        cache = tempfile.mkdtemp(prefix="inductor-", dir=args.work)
        env.update(TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    t0 = time.perf_counter()
    with open(log, "w") as f:
        child = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the group started here: the variant, its workers, ranks
            child.wait()
            rc = f"killed after {timeout:.0f} s (--variant-timeout or --budget)"
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
    parts = _read_parts(case, variant, args)
    wall = round(time.perf_counter() - t0, 1)
    if not parts or rc != 0:
        with open(log) as f:
            tail = f.read().splitlines()[-40:]
        return {"case": case, "variant": variant, "error": f"exit {rc}", "log_tail": tail, "wall_s": wall,
                **(_merge(parts) if parts else {})}
    return dict(_merge(parts), wall_s=wall)


def _passed(args):
    keys = ("size", "device", "reps", "warmup", "timed", "batch", "side", "images", "devices", "profile_at")
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def _read_parts(case, variant, args, wait_s=30):
    """The variant's part, or its ranks' parts (DDP: rank 1 may finish a moment after rank 0's process)."""
    folder = os.path.join(args.work, "parts")
    if case != DDP:
        path = os.path.join(folder, f"{case}-{variant}.json")
        return [_load(path)] if os.path.exists(path) else []
    deadline = time.monotonic() + wait_s
    while True:
        paths = [os.path.join(folder, f"{case}-{variant}-rank{k}.json") for k in range(args.devices)]
        if all(map(os.path.exists, paths)) or time.monotonic() > deadline:
            return [_load(p) for p in paths if os.path.exists(p)]
        time.sleep(1)


def _load(path):
    with open(path) as f:
        return json.load(f)


def _merge(parts):
    if len(parts) == 1 and "rank" not in parts[0]:
        return parts[0]
    from host_side_ddp import ddp_stats
    return ddp_stats(parts)


def variants(case, args):
    from host_side_cases import CASES
    from host_side_ddp import DDP_VARIANTS
    every = DDP_VARIANTS if case == DDP else CASES[case].variants
    return [v for v in every if not args.variants or v in args.variants]


def drive(args):
    import torch
    t_start = time.monotonic()
    check = gpu_check(args.device)
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "gpu_check": check, "args": vars(args), "cases": {}, "skipped": []}
    print(f"gpu: {check['nvidia_smi_idle']} || under matmul: {check.get('nvidia_smi_under_matmul')} || bf16 "
          f"{MATMUL_N}^3 matmul: {check.get('matmul_bf16_tflops', check.get('matmul'))} TFLOP/s", flush=True)
    print(f"work folder (profiles, logs): {args.work}", flush=True)
    cases = list(args.cases or ONE_GPU)
    if args.all and args.devices >= 2 and DDP not in cases:
        cases.append(DDP)
    rc = 0
    for case in cases:
        if case == DDP and (args.devices < 2 or (args.device == "cuda" and torch.cuda.device_count() < 2)):
            why = f"{DDP}: skipped: it needs --devices 2 and 2 GPUs (--devices {args.devices}, " \
                  f"{torch.cuda.device_count()} GPUs visible)"
            result["skipped"].append(why)
            print(why, flush=True)
            continue
        for variant in variants(case, args):
            rc |= _drive_one(case, variant, args, result, t_start)
            _write_result(result, args)
    _write_result(result, args)
    path = os.path.join(args.out, "host_side.json")
    print(f"done in {time.monotonic() - t_start:.0f} s: {path}", flush=True)
    return rc


def _drive_one(case, variant, args, result, t_start):
    left = args.budget - (time.monotonic() - t_start)
    extra = []
    if (case, variant) == ("compile_in_window", "in_window"):
        warm = result["cases"].get(case, {}).get("warm", {})
        if not warm.get("ms_per_step_median"):
            return _skip(result, f"{case} {variant}: skipped: warm gave no step time to compare with")
        extra = [f"--unprofiled-ms={warm['ms_per_step_median']}"]
    if left < 20:
        return _skip(result, f"{case} {variant}: skipped: the budget of {args.budget} s is spent")
    print(f"{case} {variant}: running (timeout {min(args.variant_timeout, left):.0f} s)", flush=True)
    part = run_child(case, variant, args, min(args.variant_timeout, left), extra)
    result["cases"].setdefault(case, {})[variant] = part
    print(summary_line(part), flush=True)
    return 1 if part.get("error") else 0


def _skip(result, why):
    result["skipped"].append(why)
    print(why, flush=True)
    return 0


def summary_line(part):
    """One progress line: the timing, the profile's figures and its top finding."""
    head = f"{part['case']} {part['variant']}"
    if part.get("error"):
        return f"{head}: FAILED ({part['error']}): " + " / ".join(part.get("log_tail", [])[-3:])
    if part.get("skipped"):
        return f"{head}: skipped: {part['skipped']}"
    if part.get("timing"):
        reps = ", ".join(f"{x:.2f}" for x in part["timing"]["reps_ms_per_step"])
        text = (f"{head}: {_r(part.get('ms_per_step_median'))} ms/step (reps {reps}), "
                f"{part.get('samples_per_s')} samples/s")
    else:
        text = f"{head}: {part.get('ranks_summary')}"
    prof = part.get("profile")
    if prof and not prof.get("error"):
        top = prof["findings"][0] if prof.get("findings") else {}
        text += (f"; profile: {_r(prof.get('step_ms'))} ms/step vs unprofiled "
                 f"{_r(prof.get('unprofiled_step_ms'))}, top: {top.get('kind')} {top.get('ms_per_step')} ms "
                 f"({', '.join(prof['traces'])}, {sum(prof.get('trace_mb') or [])} MB)")
    return text + f"; {part.get('wall_s')} s"


def _r(x):
    return None if x is None else round(x, 2)


def _write_result(result, args):
    path = os.path.join(args.out, "host_side.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


def main(argv=None):
    from host_side_cases import CASES
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--all", action="store_true", help="cases 1-4, and lightning_ddp with --devices 2")
    p.add_argument("--cases", nargs="+", choices=list(CASES) + [DDP])
    p.add_argument("--variants", nargs="+", help="only these variants of the cases (default: all)")
    p.add_argument("--size", choices=("gpu", "tiny"), default="gpu")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--devices", type=int, default=1, help="GPUs (or CPU processes) for lightning_ddp")
    p.add_argument("--reps", type=int, default=3, help="timed runs of each variant")
    p.add_argument("--timed", type=int, help="steps a timed run (default: the case's, STEPS)")
    p.add_argument("--warmup", type=int, help="steps before the timed runs (default: the case's, STEPS)")
    p.add_argument("--batch", type=int, help="batch size (default: the case's)")
    p.add_argument("--side", type=int, help="resnet18_pydecode: the JPEGs' side (default 256)")
    p.add_argument("--images", type=int, help="resnet18_pydecode: JPEGs made at start (default 256)")
    p.add_argument("--profile-at", choices=("start", "steady"), default="start",
                   help="profile from the loop's start (as a user would) or after the timed steps")
    p.add_argument("--no-profile", action="store_true", help="time only")
    p.add_argument("--budget", type=float, default=480, help="seconds after which no variant starts")
    p.add_argument("--variant-timeout", type=float, default=180, help="seconds a variant's process may run")
    p.add_argument("--work", help="profiles' folders, logs, parts (default: a new folder in /tmp)")
    p.add_argument("--unprofiled-ms", type=float, help=argparse.SUPPRESS)  # in_window's: warm's step time
    p.add_argument("--in-process", help=argparse.SUPPRESS)  # case:variant, run in this process
    args = p.parse_args(argv)
    if not (args.all or args.cases or args.in_process):
        p.error("give --all or --cases")
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off on the lent machines (pitfall 10)
    os.makedirs(args.out, exist_ok=True)
    args.work = args.work or tempfile.mkdtemp(prefix="host-side-")
    if args.in_process:
        from host_side_variant import run_variant
        case, variant = args.in_process.split(":")
        return run_variant(case, variant, args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
