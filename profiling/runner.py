"""train.py's run plumbing: its flags, run.json, the printed summary, the early-abort gate, the profile and
the step clock. Fixed: the agent never edits it. Imports torch (CUDA events and memory), and only train.py
imports it; the rest of the package stays torch-free.

    run = runner.Run(argv, __file__, DEVICE_TYPE, hyperparameters)  # flags; run.json: "crash" until the end
    return run.execute(lambda: train_and_evaluate(run))            # exit code; run.json and the summary

Inside, train.py calls run.start() (data, header lines, the gate), run.describe_model(), run.distribute()
and run.grad_sync() around the model, run.agree() and run.track() for each step, run.profile() at the step
run.profile_due() picks (once the steps timed before it are steady: their time is the report's reference), and
fills run.summary.

Under torchrun (`torchrun --standalone --nproc_per_node=N train.py`) the Run is one of N ranks: it joins the
process group (NCCL on CUDA, gloo on the CPU), wraps the model in DistributedDataParallel, and keeps the
ranks in step on the host: every rank uses the same step time and loss (run.agree), so they stop, diverge
and abort together, and the gate's decision is made on rank 0 and sent to the others. Only rank 0 prints
and writes run.json. Those host-side messages go over a gloo group, never over the GPU stream.
"""
import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import weakref

import torch
import torch.distributed as dist

import prepare
from profiling import runfile
from profiling.errors import UserError
from profiling.profile.capture import faults, provenance, settings
from profiling.profile.report import oom
from profiling.profile.trace import hardware, irregular
from profiling.research import experiments, gate, history

# What train.py sets on purpose (train_and_evaluate, train): TF32 GEMMs on CUDA, and the gc collected, frozen
# and disabled after step 0 (its stalls). The report labels a setting equal to one of these "train.py", not
# the user's; changed to anything else, it is the user's (profiling/profile/trace/settings.py).
TRAIN_PY_SETTINGS = {"float32_matmul_precision": "high", "gc.enabled": False, "gc.frozen": True}


class ConfigError(ValueError):
    """A configuration train.py refuses (exit 2, before any compute)."""


class Diverged(Exception):
    """NaN or exploding training loss."""


class EarlyAbort(Exception):
    """The early-abort gate found this run clearly worse than the reference run."""

    def __init__(self, decision):
        super().__init__(f"early abort: {decision}")
        self.decision = decision


# ---------------------------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------------------------

def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, instead of the usage text and the error
        self.exit(2, f"train.py: error: {message} (see --help)\n")


def parse_args(argv):
    p = ArgumentParser(prog="train.py", description="Train the GPT for TIME_BUDGET seconds and report "
                       "val_bpb. Every run also profiles a few steps after compilation (outside the budget).")
    p.add_argument("--profile", action="store_true",
                   help="only profile: warm up, profile, print the report, exit (no TIME_BUDGET spent)")
    p.add_argument("--warmup-steps", type=int, default=2, metavar="W",
                   help="profiler warm-up steps (default 2)")
    p.add_argument("--active-steps", type=positive_int, default=5, metavar="A",
                   help="profiled steps (default 5)")
    p.add_argument("--profile-ops", choices=("device", "full"), default="device",
                   help="what the profiled steps record: the device only, operators joined from one untimed "
                        "step after them (default, cheapest), or every operator inside them (full)")
    p.add_argument("--no-profile", action="store_true", help="skip the profile of a normal training run")
    p.add_argument("--no-gate", action="store_true",
                   help="never abort early (default: abort a run clearly worse than the best kept one)")
    p.add_argument("--run-file", default="run.json", help="where to write the run summary (default run.json)")
    args = p.parse_args(argv)
    if args.warmup_steps < 0:
        p.error("--warmup-steps must be 0 or more")
    if args.profile and args.no_profile:
        p.error("--profile and --no-profile contradict each other; pick one")
    return args


# ---------------------------------------------------------------------------------------------------------
# What a run records
# ---------------------------------------------------------------------------------------------------------

def knobs(namespace):
    """The UPPER_CASE knobs of a module's namespace (numbers, strings, tuples of numbers), for run.json;
    prepare.py's constants (MAX_SEQ_LEN, TIME_BUDGET) are recorded as settings instead."""
    def knob(v):
        numbers = isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v)
        return isinstance(v, (int, float, str)) or numbers
    imported = ("MAX_SEQ_LEN", "TIME_BUDGET")
    return {k: v for k, v in namespace.items() if k.isupper() and k not in imported and knob(v)}


def git_commit(path):
    """The short commit of HEAD, with "-dirty" when `path` (train.py) has uncommitted changes; None outside
    a git repository."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", path], capture_output=True,
                               text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def sample_curve(points, fractions):
    """The smoothed loss at the first step that reached each fraction of the budget (reached ones only)."""
    out, j = [], 0
    for f in fractions:
        while j < len(points) and points[j][0] < f - 1e-9:
            j += 1
        if j == len(points):
            break
        out.append(round(points[j][1], 6))
    return {"fractions": fractions[:len(out)], "loss": out}


STEADY_STEPS = 3     # steady timed steps the profile waits for: its unprofiled reference
SETTLE_RATIO = 1.25  # a step over this x the median of the steps after it is a cold or warm-up one (compiling,
                     # a loader filling its queue: a CPU run's first steps took 4,501, 2,013 then 379 ms)


def steady_steps(times):
    """The steady tail of the loop's step times (any unit): the steps after the last one slower than
    SETTLE_RATIO x the median of those after it (a cold step, a warm-up one). A reference made of those is no
    reference: the CPU's 3 steps of 4,501, 2,013 and 379 ms gave 2,297.50 against a profiled 434.05 ms."""
    start = 0
    for i in range(len(times) - 1):
        if times[i] > SETTLE_RATIO * statistics.median(times[i + 1:]):
            start = i + 1
    return list(times[start:])


def unprofiled_reference(times):
    """(ms, the steady steps in ms, the outliers left out) from the loop's step times in seconds: the steady tail
    (steady_steps), its outliers left out as the API leaves out its timed ones (profiling/profile/trace/irregular.py:
    the report's header names them)."""
    each = [1000 * t for t in steady_steps(times)]
    ms, outliers = irregular.timed(each)
    return ms, each, outliers


class StepClock:
    """Seconds per step without a host sync per step. A mark is taken right after each step is launched:
    on CUDA an event (the GPU's own time between step ends), on the CPU the host time (steps run
    synchronously there, so the step is done when its launch returns). `times` holds every step's seconds,
    `faults` the host's page faults between the same marks (the profile's page_faults finding on a CPU)."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.times, self.faults = [], []
        self.restart()

    def restart(self):
        self.last = self.mark()
        self.counted = faults.count()
        if self.cuda:
            self.last.synchronize()

    def mark(self):
        if not self.cuda:
            return time.time()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed(self, mark):
        """Seconds from the previous mark to this one (waits for it)."""
        if self.cuda:
            mark.synchronize()
            dt = self.last.elapsed_time(mark) / 1000
        else:
            dt = mark - self.last
        self.last = mark
        self.times.append(dt)
        counted, self.counted = self.counted, faults.count()
        self.faults.append(None if counted is None else self.counted - counted)
        return dt


# ---------------------------------------------------------------------------------------------------------
# Several processes (torchrun)
# ---------------------------------------------------------------------------------------------------------

def world_size():
    """The number of ranks this run trains on: torchrun's WORLD_SIZE, 1 without torchrun."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class Ranks:
    """This process's place among the ranks (`rank`, `world_size`, `local_rank`, from torchrun's
    environment) and, once joined, `control`: a gloo group for the host-side messages (step time, loss, the
    gate), so they never wait behind the GPU's queue."""

    def __init__(self, cuda):
        self.cuda, self.world_size = cuda, world_size()
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.control = None

    def join(self):
        """Join the process group (NCCL on CUDA, gloo on the CPU); nothing on one rank."""
        if self.world_size == 1:
            return
        if self.cuda:
            if self.local_rank >= torch.cuda.device_count():
                raise ConfigError(f"rank {self.rank} needs GPU {self.local_rank} but this machine has "
                                  f"{torch.cuda.device_count()}; lower --nproc_per_node")
            torch.cuda.set_device(self.local_rank)
            dist.init_process_group("nccl", device_id=torch.device("cuda", self.local_rank))
            self.control = dist.new_group(backend="gloo")
        else:
            dist.init_process_group("gloo")
            self.control = dist.group.WORLD

    @property
    def first(self):
        return self.rank == 0

    def barrier(self):
        if self.control is not None:
            dist.barrier(group=self.control)

    def gather(self, values):
        """Every rank's list of floats, in rank order (the host's all-gather; [values] on one rank)."""
        if self.control is None:
            return [list(values)]
        mine = torch.tensor(values, dtype=torch.float64)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine, group=self.control)
        return [t.tolist() for t in out]

    def from_first(self, obj):
        """Rank 0's `obj`, on every rank."""
        if self.control is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def distribute(self, model):
        """The model in DistributedDataParallel under torchrun (gradients averaged over the ranks in
        backward); the model itself on one rank."""
        if self.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[self.local_rank] if self.cuda else None,
                                       broadcast_buffers=False)  # the buffers (rotary tables) are constants

    def grad_sync(self, model, last):
        """Context for one micro-batch's forward and backward: gradients are averaged over the ranks only in
        the last micro-batch of a step (DDP's no_sync for the others)."""
        if last or not hasattr(model, "no_sync"):
            return contextlib.nullcontext()
        return model.no_sync()

    def agree(self, loss, seconds):
        """(loss, seconds) of a finished step as every rank will use them: the mean loss over the ranks and
        the slowest rank's time, so all ranks keep the same budget, stop at the same step and see a NaN
        together. Unchanged on one rank."""
        if self.world_size == 1:
            return loss, seconds
        rows = self.gather([loss, seconds])
        return sum(r[0] for r in rows) / len(rows), max(r[1] for r in rows)

    def close(self):
        """Leave the process group; only where every rank gets to (a crashed rank just exits: torchrun
        then stops the others)."""
        if dist.is_initialized():
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------

def _shown(path):
    """A path as the user knows it: relative to the folder the run started in when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _profiled_fits(parameters_mb):
    """{folder, fits} of the newest profile (profiles/latest) when its memory step measured this model (its
    parameters' MB equal to this one's within 1%: a run that changed only the batch), else None."""
    from profiling.profile.report import folder
    root = folder.profile_dir()
    previous = folder.previous_summary(root) or {}
    record = previous.get("gpu_memory") or {}
    measured = (record.get("categories") or {}).get("parameters")
    if not record.get("fits") or not measured or not parameters_mb or abs(measured / parameters_mb - 1) > 0.01:
        return None
    return {"folder": os.path.join(root, "latest"), "fits": record["fits"]}


def _fit_candidates(settings, dataset):
    """(source, folder, its summary) of the kept runs of these settings and dataset whose profile is still on
    disk, newest first, then the last profile (profiles/latest): where a run that fit may have been measured
    (oom.kept_fit picks one of this model at this micro-batch)."""
    from profiling.profile.report.folder import profile_dir
    try:
        records = experiments.load(experiments.default_path())["experiments"]
    except UserError:
        records = []
    out = [(f"the kept run, experiment {r['id']} ({r.get('commit')})", r["profile"])
           for r in reversed(records)
           if r.get("status") == "keep" and r.get("profile") and history.same_group(r, settings, dataset)]
    out.append(("the last profile of this model", os.path.join(profile_dir(), "latest")))
    return [(source, folder, _summary_in(folder)) for source, folder in out]


def _summary_in(folder):
    try:
        with open(os.path.join(folder, "summary.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _held_mb(*holders, grads=True):
    """MB of the distinct CUDA storages a model (parameters and their gradients) and an optimizer (its state)
    hold: what does not grow with the batch, measured from the tensors themselves."""
    seen, total = set(), 0
    tensors = []
    for h in holders:
        if isinstance(h, torch.nn.Module):
            for p in h.parameters():
                tensors += [p, p.grad] if grads else [p]
        elif isinstance(h, torch.optim.Optimizer):
            tensors += [t for state in h.state.values() for t in state.values()]
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total / 2**20


class Run:
    """One run of train.py: its flags (`args`), the summary it prints (`summary`, runfile.SUMMARY_FIELDS) and
    the rest of its run.json (`record`). Until it ends, run.json says it did not: a killed run is a crash."""

    def __init__(self, argv, train_file, device_type, hyperparameters):
        self.args = parse_args(argv)
        self.t_start = time.time()
        self.cuda = device_type == "cuda"
        self.ranks = Ranks(self.cuda)
        n = self.ranks.world_size
        self.device = torch.cuda.get_device_name() if self.cuda else "cpu"
        self.device_peak = hardware.peak_flops(self.device) if self.cuda else None
        self.peak_flops = self.device_peak * n if self.device_peak else None  # all ranks' GPUs
        settings = prepare.settings()
        if self.cuda or n > 1:  # runs on other GPU kinds or numbers of ranks are other groups
            settings["hardware"] = f"{n}x {self.device}"
        self.record = dict(device=self.device, torch=torch.__version__, commit=git_commit(train_file),
                           dataset="unknown", settings=settings, hyperparameters=hyperparameters,
                           loss_curve=None, profile=None)
        self.summary = dict.fromkeys(runfile.SUMMARY_FIELDS)
        self.summary.update(depth=hyperparameters.get("DEPTH"), world_size=n)
        self.gate, self.points, self.model_meta, self.holders, self.profiled = None, [], {}, [], False
        if not self.args.profile:
            self.write("crash", "did not finish: killed, timed out, or crashed before writing its summary")

    @property
    def profile_only(self):
        return self.args.profile

    @property
    def profiling(self):
        """Whether the loop profiles a few steps (every run but --no-profile)."""
        return not self.args.no_profile

    def write(self, status, error=None, oom_info=None):
        if not self.ranks.first:
            return
        self.summary["total_seconds"] = round(time.time() - self.t_start, 1)
        if self.cuda:  # None (n/a), never 0, where the allocator's statistics do not count (caching off)
            from profiling.profile.capture import memory
            self.summary["peak_vram_mb"] = memory.allocator_peak_mb()
        now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        runfile.write_run(self.args.run_file, runfile.make_run(status, self.summary, time=now, error=error,
                                                               oom=oom_info, **self.record))

    def finish(self, status, error=None, code=0, extra=(), oom_info=None):
        """Write run.json, print the summary block; returns the exit code."""
        self.write(status, error, oom_info)
        print(runfile.format_summary(self.summary, status, extra))
        return code

    def execute(self, body):
        """Run body(); returns the exit code: 0 ok, 1 FAIL or crash, 2 a refused configuration, 3 early
        abort. Under torchrun every rank runs it; only rank 0 prints to stdout and writes run.json."""
        if not self.ranks.first:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
        try:
            self.ranks.join()
            body()
            self.ranks.close()
        except (ConfigError, prepare.PrepareError) as e:
            print(f"error: {e}", file=sys.stderr)
            return self.finish("crash", error=str(e), code=2)
        except Diverged as e:
            print(f"\nFAIL: {e}")  # NaN or exploding loss (every rank sees the same loss: run.agree)
            self.ranks.close()
            return self.finish("fail", error=str(e), code=1)
        except EarlyAbort as e:
            d = e.decision
            print(f"\nEarly abort at {100 * d['fraction']:.0f}% of the budget: loss {d['loss']} is "
                  f"{d['ratio']}x the reference {d['reference_loss']} (threshold {d['threshold']}x)")
            keys = ("fraction", "loss", "reference_loss", "ratio", "threshold")
            extra = [(f"gate_{k}", d[k]) for k in keys]
            self.ranks.close()  # every rank got the same decision (run.track)
            return self.finish("early_abort", code=gate.EXIT_CODE, extra=extra)
        except torch.OutOfMemoryError as e:
            info = self.out_of_memory(e)
            msg = oom.message(info, knob="DEVICE_BATCH_SIZE")
            print(f"FAIL: {msg}", file=sys.stderr)
            return self.finish("crash", error=msg, code=1, oom_info=info)
        except Exception as e:  # a bug in an edit: the traceback for the agent, run.json for the memory
            traceback.print_exc()
            return self.finish("crash", error=f"{type(e).__name__}: {e}"[:500], code=1)
        return 0 if self.profile_only else self.finish("ok")

    def start(self):
        """Prepare the data if none is (rank 0, the others wait), print the device, settings and gate lines,
        and arm the gate."""
        if self.ranks.first:
            self.record["dataset"] = prepare.ensure_data()
        self.ranks.barrier()
        if not self.ranks.first:
            self.record["dataset"] = prepare.ensure_data()
        print(f"Device: {self.device} | torch {torch.__version__} | dataset: {self.record['dataset']}")
        print("Settings: " + ", ".join(f"{k}={v}" for k, v in self.record["settings"].items()))
        if self.cuda and os.environ.get(oom.HISTORY_ENV) == "1":  # an out-of-memory failure names its lines
            from profiling.profile.capture import memory
            memory.record_history()
        a = self.args
        reference, why_off = (None, "off (--no-gate)") if a.no_gate or a.profile else \
            gate.find_reference(experiments.default_path(), self.record["settings"], self.record["dataset"])
        self.gate = gate.Gate(reference) if reference and self.ranks.first else None  # decides on rank 0
        self.record["gate"] = {"status": self.gate.describe() if self.gate else why_off, "decisions": []}
        if not a.profile:
            print(f"Early-abort gate: {self.record['gate']['status']}")
        if self.profiling:  # before anything compiles: the report's "Lines of train.py" (profile/provenance.py)
            provenance.start()

    def out_of_memory(self, e):
        """What an out-of-memory error shows (profiling/profile/report/oom.py): its message's figures, the innermost line of the
        user's code, the parameters, gradients and optimizer state still held (measured), the process's cap;
        and when a kept run or the last profile fit this micro-batch with this model, what grew since
        (profiling/profile/capture/memory.py `held_now`)."""
        from profiling.profile.capture import memory
        here = os.path.dirname(os.path.abspath(__file__))
        where = oom.user_line([(f.filename, f.lineno, f.line) for f in traceback.extract_tb(e.__traceback__)
                               if not f.filename.startswith(here)], show=_shown)
        holders = [ref() for ref in self.holders]
        fixed = _held_mb(*holders) if self.holders else None
        model = next((h for h in holders if isinstance(h, torch.nn.Module)), None)
        optimizer = next((h for h in holders if isinstance(h, torch.optim.Optimizer)), None)
        cap = device = None
        if self.cuda:
            device = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**20
            with contextlib.suppress(AttributeError, RuntimeError):
                fraction = torch.cuda.get_per_process_memory_fraction()
                cap = device * fraction if fraction < 1 else None
        micro_batch = self.record["hyperparameters"].get("DEVICE_BATCH_SIZE")
        parameters_mb = _held_mb(model, grads=False) if model is not None else None
        before = oom.kept_fit(_fit_candidates(self.record["settings"], self.record["dataset"]), micro_batch,
                              parameters_mb) if self.cuda else None
        return oom.explain(str(e), micro_batch=micro_batch, fixed_mb=fixed, where=where, cap_mb=cap,
                           device_mb=device,
                           profiled=_profiled_fits(parameters_mb) if model is not None else None,
                           sequences=self.sequences_per_step(), before=before,
                           now=memory.held_now(model, optimizer) if before else None)

    def sequences_per_step(self):
        """The sequences per optimizer step on this rank (TOTAL_BATCH_SIZE / MAX_SEQ_LEN / ranks): every
        micro-batch train.py accepts divides it (train.check_batch_sizes). None when unknown."""
        hp, n = self.record["hyperparameters"], self.ranks.world_size
        if self.model_meta.get("micro_batches") and hp.get("DEVICE_BATCH_SIZE"):
            return self.model_meta["micro_batches"] * hp["DEVICE_BATCH_SIZE"]
        tokens, per_rank = hp.get("TOTAL_BATCH_SIZE"), prepare.MAX_SEQ_LEN * n
        return tokens // per_rank if isinstance(tokens, int) and tokens % per_rank == 0 else None

    def describe_model(self, model, flops_per_token, tokens_per_step, micro_batches, optimizer=None):
        """Record the model's size (the summary, the profile's metadata) and print it. The model and optimizer
        are held weakly, to measure what they hold if the run runs out of memory."""
        self.holders = [weakref.ref(x) for x in (model, optimizer) if x is not None]
        num_params = sum(p.numel() for p in model.parameters())
        self.summary["num_params_M"] = round(num_params / 1e6, 1)
        self.model_meta = dict(tokens_per_step=tokens_per_step, micro_batches=micro_batches,
                               depth=self.record["hyperparameters"].get("DEPTH"),
                               flops_per_step=flops_per_token * tokens_per_step,
                               parameters={name: list(p.shape) for name, p in model.named_parameters()})
        print(f"Parameters: {num_params / 1e6:.1f}M | FLOPs per token: {flops_per_token:.3e}")

    def mfu(self, flops_per_s):
        """Model FLOPs utilization as printed on the progress line ("n/a" for a device of unknown peak)."""
        return f"{100 * flops_per_s / self.peak_flops:.1f}%" if self.peak_flops else "n/a"

    def track(self, progress, loss):
        """A counted step's smoothed loss at `progress`: a point of the loss curve, and the gate's check
        (raises EarlyAbort). The gate decides on rank 0; every rank gets its decision."""
        self.points.append((progress, loss))
        decision = self.gate.check(progress, loss) if self.gate else None
        if self.ranks.world_size > 1:
            decision = self.ranks.from_first(decision)
        if decision:
            self.record["gate"]["decisions"].append(decision)
            if decision["abort"]:
                raise EarlyAbort(decision)

    def loss_curve(self):
        """The tracked loss sampled at runfile's fractions of the time budget, for run.json and the gate."""
        return sample_curve(self.points, runfile.curve_fractions())

    def profile_reference(self):
        """(summary.json path, label) of the best kept run's profile with these settings and dataset, for
        the report's `regression` finding; None when the memory has none or its folder is gone."""
        try:
            records = experiments.load(experiments.default_path())["experiments"]
        except UserError:
            return None
        best = history.best_kept(records, self.record["settings"], self.record["dataset"])
        path = os.path.join(best["profile"], "summary.json") if best and best.get("profile") else None
        if not path or not os.path.exists(path):
            return None
        return path, f"the best kept run, experiment {best['id']} ({best.get('commit')})"

    def train_py_settings(self):
        """TRAIN_PY_SETTINGS as train.py makes them on this device (matmul precision on CUDA only)."""
        return {k: v for k, v in TRAIN_PY_SETTINGS.items() if self.cuda or k != "float32_matmul_precision"}

    def profile_due(self, step, times, first, last):
        """Whether the loop profiles at `step` (once, unless --no-profile): from step `first` on, as soon as the
        loop's step times so far (`times`, seconds) end in STEADY_STEPS steady ones (steady_steps), at step
        `last` whatever they are. Under torchrun rank 0 decides for all."""
        if not self.profiling or self.profiled or step < first:
            return False
        due = step >= last or len(steady_steps(times)) >= STEADY_STEPS
        return self.ranks.from_first(due) if self.ranks.world_size > 1 else due

    def profile(self, train_step, first_step, clock):
        """Profile --warmup-steps W + --active-steps A calls of train_step(step, 0.0) from first_step on, then
        one more that records the lines of the eager operators (profiling/profile/capture/eager_record.py), on CUDA one
        more for GPU memory (profiling/profile/capture/memory.py; DEVICE_BATCH_SIZE for what fits), and print
        the report: the public API (profiling.profile_steps), timed by the training steps already run (`clock`,
        the loop's StepClock: their times and page faults). Returns
        the steps it ran, W + A + 1 (+ 1 on CUDA; - 1 with AUTORESEARCH_EAGER_LINES=0): they train the model
        like any other."""
        from profiling.api import profile_steps
        a, self.profiled = self.args, True
        unprofiled_ms, steady, outliers = unprofiled_reference(clock.times)
        steps = itertools.count(first_step)
        model, n = dict(self.model_meta), self.ranks.world_size
        if n > 1:  # a rank's trace: its own GPU, its share of the step's tokens and FLOPs
            model.update(tokens_per_step=model["tokens_per_step"] // n, flops_per_step=model["flops_per_step"] / n)
        meta = dict(commit=self.record["commit"], trainer="train.py",  # the findings may name its knobs
                    settings=settings.snapshot(self.train_py_settings()),
                    timed_step_ms_each=[round(x, 4) for x in steady],  # the reference's steps: the CPU's check
                    **({"timed_outliers": outliers} if outliers else {}),
                    **faults.timed_meta(clock.faults[len(clock.faults) - len(steady):], self.cuda,
                                        torch.get_num_threads()),  # the same steps' page faults
                    **model)  # tokens_per_step, micro_batches, flops_per_step, parameters
        result = profile_steps(
            lambda: train_step(next(steps), 0.0), None, warmup_steps=0, timed_steps=0,
            unprofiled_step_ms=unprofiled_ms, profiler_warmup_steps=a.warmup_steps,
            active_steps=a.active_steps, metadata=meta, reference=self.profile_reference() if self.ranks.first
            else None, ranks=self.ranks if n > 1 else None, out_dir=None,
            micro_batch=self.record["hyperparameters"].get("DEVICE_BATCH_SIZE"), ops=a.profile_ops)
        if result is None:  # ended before its report (the line above says why and where its trace is)
            self.record["profile"] = None
            return next(steps) - first_step
        self.record["profile"] = result.folder
        print(f"\n{result.report}\n(profile files: {result.folder}; the line-record step, export, summary and "
              f"report took {result.seconds_after:.1f} s)")
        return next(steps) - first_step  # the steps taken, whatever the capture ran
