"""The public profiling API: profile any training loop, the way torch.profiler's users already write it.

    import profiling

    prof = profiling.Profiler(model, tokens_per_step=batch * seq_len)   # before the first compiled call
    for batch in loader:
        train_step(batch)
        prof.step()                  # after every step; free once the profile is done
        if prof.done:
            break                    # or keep training: step() does nothing more
    print(prof.report)               # the Markdown report; prof.summary: the --json content; prof.folder

    result = profiling.profile_steps(lambda: train_step(next(batches)), model, tokens_per_step=...)
    print(result.report)             # the function form: it calls the step function itself

`Profiler` also works as a context manager (`with profiling.Profiler(...) as prof:`), which says at its exit
when the loop ended before the profile was done. train.py's `--profile` goes through this same class.

What the steps are, in order (the defaults: 3 + 5 + 1 + 5 + 1 + 1 = 16 steps; each trains the model as usual):
    warmup_steps            untimed: compilation, autotuning, the allocator settling
    timed_steps             unprofiled, timed between two device syncs: the step time the report checks the
                            profiled one against (or give `unprofiled_step_ms` and set timed_steps=0)
    profiler_warmup_steps   under torch.profiler, not recorded (its own start-up)
    active_steps            the profiled window: kernels, operators, the host's Python stack every 2 ms, the
                            process's settings
    1 more                  operator input shapes and the Python lines of host syncs (recording them in the
                            profiled steps slowed them: benchmarks/profiler_cost_results.md)
    1 more                  records the lines of the eager operators (off with AUTORESEARCH_EAGER_LINES=0)
    1 more                  CUDA only (off with memory=False): GPU memory at the step's peak by category, and
                            with micro_batch the largest micro-batch predicted to fit
                            (profiling/profile/memory_capture.py, gpu_memory.py)

Lines of compiled code: the compiler records which source lines each kernel came from only for graphs
compiled after the Profiler was created; create it before the first call of a torch.compile'd function (the
report says when it was not). Without torch.compile everything works the same, from the operators' lines.

Every argument is checked on creation: a bad one raises ValueError naming it. Importing `profiling` does not
import torch; creating a Profiler does.
"""
import os
import sys
import time
import warnings
from typing import NamedTuple

from profiling.profile import whose

PROFILER_WARMUP = 1   # torch.profiler's own start-up step, not recorded


class ProfileResult(NamedTuple):
    report: str       # the Markdown report (None on ranks other than 0 of a several-process run)
    summary: dict     # the numbers of the report (`research profile --json`), None on other ranks
    folder: str       # where report.md, summary.json and the trace were written
    seconds_after: float  # spent after the profiled window: the line-record step, export, summary, report


class Profiler:
    """Profile a few steps of a training loop that calls `step()` after each one (see the module's docstring).

    model: the nn.Module being trained, several (a list, or a dict of name -> module), or None (then the
        report has no regions of the model, and says so). Its parameters' names and shapes place the GEMMs.
    tokens_per_step: tokens one optimizer step processes (for tokens/s), or None.
    samples_per_step: samples (images, sequences) one optimizer step processes (for samples/s), or None.
    flops_per_token: model FLOPs per token (for MFU), or None: then MFU is computed from the FLOPs the trace
        shows (GEMMs and attention, from their recorded shapes).
    warmup_steps, timed_steps, profiler_warmup_steps, active_steps: the schedule above.
    unprofiled_step_ms: a step time you measured yourself, instead of the timed steps.
    out_dir: where each profile's folder goes (default: $AUTORESEARCH_PROFILE_DIR, else ./profiles).
    reference: a profile's summary.json to look for a regression against, or None.
    metadata: more JSON-able facts for the trace's metadata (e.g. {"commit": "abc123"}).
    micro_batch: sequences per forward/backward (for what fits), or None.
    memory: the GPU-memory step after the window (None: on with CUDA; never without it).
    code_roots: folders of your own code besides the script's folder (profiling/profile/whose.py), or None.
    top: rows of the kernel table. ranks: an object with rank, world_size, first, barrier(), from_first(obj)
        for a several-process run (default: torch.distributed's world when it is initialized).
    """

    def __init__(self, model=None, *, tokens_per_step=None, flops_per_token=None, warmup_steps=3, timed_steps=5,
                 profiler_warmup_steps=PROFILER_WARMUP, active_steps=5, unprofiled_step_ms=None, out_dir=None,
                 reference=None, metadata=None, top=10, ranks=None, micro_batch=None, memory=None,
                 samples_per_step=None, code_roots=None):
        self.parameters = _parameters(model)
        _check_count("tokens_per_step", tokens_per_step, minimum=1, optional=True)
        _check_count("samples_per_step", samples_per_step, minimum=1, optional=True)
        self.samples_per_step = samples_per_step
        _check_count("micro_batch", micro_batch, minimum=1, optional=True)
        if memory not in (None, True, False):
            raise ValueError(f"memory must be True, False or None, not {memory!r}")
        _check_number("flops_per_token", flops_per_token)
        for name, value, minimum in (("warmup_steps", warmup_steps, 0), ("timed_steps", timed_steps, 0),
                                     ("profiler_warmup_steps", profiler_warmup_steps, 0),
                                     ("active_steps", active_steps, 1), ("top", top, 1)):
            _check_count(name, value, minimum)
        _check_number("unprofiled_step_ms", unprofiled_step_ms)
        if timed_steps == 0 and unprofiled_step_ms is None:
            raise ValueError("timed_steps=0 needs unprofiled_step_ms (the step time measured without the "
                             "profiler); give it, or time at least one step")
        if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
            raise ValueError(f"out_dir must be a folder path, not {type(out_dir).__name__}")
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError(f"metadata must be a dict, not {type(metadata).__name__}")
        if isinstance(reference, (str, os.PathLike)) and not os.path.isfile(reference):
            raise ValueError(f"reference {reference!r} is not a file; give a profile's summary.json")
        whose.use(code_roots)  # whose lines the report names; ValueError for anything but folders

        import torch
        from profiling.profile import provenance
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.warmup, self.timed, self.profiler_warmup = warmup_steps, timed_steps, profiler_warmup_steps
        self.active, self.unprofiled_ms, self.top = active_steps, unprofiled_step_ms, top
        self.out_dir = os.fspath(out_dir) if out_dir is not None else None
        self.reference = os.fspath(reference) if isinstance(reference, os.PathLike) else reference
        self.metadata = dict(metadata or {})
        self.ranks = ranks if ranks is not None else _dist_ranks(torch)
        self.compiled_before = 0 if provenance.started() or not provenance.enabled() else _graphs_compiled()
        provenance.start()  # before the first compile: the lines of compiled kernels
        self.cuda = torch.cuda.is_available()
        self.micro_batch, self.memory_asked = micro_batch, memory is not False  # without CUDA: said, not run
        self.memory = self.memory_asked and self.cuda
        self.model = model
        self.steps, self.done, self.result, self._window = 0, False, None, None
        if warmup_steps + timed_steps == 0:  # the window begins with the next step
            self._window = self._open_window()

    # the results, once done
    report = property(lambda self: self.result.report if self.result else None)
    summary = property(lambda self: self.result.summary if self.result else None)
    folder = property(lambda self: self.result.folder if self.result else None)

    @property
    def total_steps(self):
        """Steps the profile takes, the line-record and memory steps included."""
        from profiling.profile import eager_record
        return (self.warmup + self.timed + self.profiler_warmup + self.active + 1 + int(eager_record.enabled())
                + int(self.memory))

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None and not self.done:
            self.close()
        return False

    def step(self):
        """Call after each training step: it moves the profile on (timing, recording, and after the last
        step writing the report). Nothing once done."""
        if self.done:
            return
        self.steps += 1
        start = self.warmup  # the timed steps begin after the warm-up
        if self.steps == start and self.timed:
            self._sync()
            self._t0 = time.perf_counter()
        if self.steps == start + self.timed:
            if self.timed:
                self._sync()
                self.unprofiled_ms = 1e3 * (time.perf_counter() - self._t0) / self.timed
            self._window = self._open_window()
        elif self._window is not None:
            trace = self._window.step()
            if trace is not None:
                self._finish(trace, self._window.t_end)

    def close(self):
        """Stop a profile the loop left unfinished (warns how many steps it needed); the context manager's
        exit calls it."""
        if self._window is not None:
            self._window.abandon()
            self._window = None
        if not self.done:
            warnings.warn(f"profiling: the loop ended after {self.steps} steps, before the profile was done: it "
                          f"takes {self.total_steps} (warmup_steps {self.warmup} + timed_steps {self.timed} + "
                          f"profiler_warmup_steps {self.profiler_warmup} + active_steps {self.active} + the "
                          "shape, line-record and memory steps); run more steps or lower those", stacklevel=2)
            self.done = True

    def _sync(self):
        if self.cuda:
            import torch
            torch.cuda.synchronize()

    def _open_window(self):
        from profiling.profile import capture
        return capture.Window(self.profiler_warmup, self.active, self._metadata(), self.memory_asked,
                              _tensors(self.model) if self.memory else ())

    def _metadata(self):
        import torch
        from profiling.profile import hardware, settings
        device = torch.cuda.get_device_name() if self.cuda else "cpu"
        n = self.ranks.world_size if self.ranks else 1
        meta = dict(device=device, torch=torch.__version__, peak_flops=hardware.peak_flops(device) if self.cuda
                    else None, unprofiled_step_ms=self.unprofiled_ms,
                    peak_memory_mb=torch.cuda.max_memory_allocated() / 1024**2 if self.cuda else None,
                    parameters=self.parameters, compiled_before_profiler=self.compiled_before,
                    code_roots=whose.current().roots)
        if self.micro_batch:
            meta["micro_batch"] = self.micro_batch
        if self.tokens_per_step:
            meta["tokens_per_step"] = self.tokens_per_step // n  # a rank's trace: its share
        if self.samples_per_step:
            meta["samples_per_step"] = self.samples_per_step // n
        if self.flops_per_token and self.tokens_per_step:
            meta["flops_per_step"] = self.flops_per_token * self.tokens_per_step / n
        meta.update(self.metadata)
        if "settings" not in meta:
            meta["settings"] = settings.snapshot()
        if n > 1:
            meta.update(rank=self.ranks.rank, world_size=n)
        return meta

    def _finish(self, trace, t_end):
        from profiling.profile import capture
        self._window = None
        reference = (self.reference, f"the profile {self.reference}") if isinstance(self.reference, str) \
            else self.reference  # train.py's: (path, "the best kept run, ...")
        report, folder, summary = capture.save(trace, self.ranks, reference, self.top, self.out_dir)
        self.result = ProfileResult(report, summary, folder, time.perf_counter() - t_end)
        self.done = True


def profile_steps(step_fn, model=None, **options):
    """Call `step_fn()` (one training step) as many times as a Profiler needs and return its ProfileResult;
    options: Profiler's."""
    if not callable(step_fn):
        raise ValueError(f"step_fn must be a function that runs one training step, not {type(step_fn).__name__}")
    prof = Profiler(model, **options)
    with prof:
        while not prof.done:
            step_fn()
            prof.step()
    return prof.result


def _parameters(model):
    """{name: shape} of every parameter of the model(s), None for no model; ValueError for anything else."""
    if model is None:
        return None
    if isinstance(model, dict):
        models = list(model.items())
    elif isinstance(model, (list, tuple)):
        models = [(f"{i}", m) for i, m in enumerate(model)] if len(model) > 1 else [("", m) for m in model]
    else:
        models = [("", model)]
    out = {}
    for prefix, m in models:
        named = getattr(m, "named_parameters", None)
        if not callable(named):
            raise ValueError(f"model must be a torch.nn.Module (or a list or dict of them, or None), not "
                             f"{type(m).__name__}")
        for name, p in named():
            for wrapper in ("_orig_mod.", "module."):  # torch.compile's and DDP's wrappers
                name = name.replace(wrapper, "")
            out[f"{prefix}.{name}" if prefix else name] = list(p.shape)
    return out


def _tensors(model):
    """The parameters of the model(s) (checked by _parameters), for the memory step's tags."""
    models = [] if model is None else list(model.values()) if isinstance(model, dict) else \
        list(model) if isinstance(model, (list, tuple)) else [model]
    return [p for m in models for p in m.parameters()]


def _check_count(name, value, minimum, optional=False):
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer of at least {minimum}, not {value!r}")


def _check_number(name, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a positive number or None, not {value!r}")


def _graphs_compiled():
    """Graphs torch.compile made in this process so far (their kernels have no source-line record)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters.get("stats", {}).get("unique_graphs", 0)) if utils else 0


class _DistRanks:
    """torch.distributed's default group, as the capture needs it."""

    def __init__(self, dist):
        self.dist, self.rank, self.world_size = dist, dist.get_rank(), dist.get_world_size()
        self.first = self.rank == 0

    def barrier(self):
        self.dist.barrier()

    def from_first(self, obj):
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]


def _dist_ranks(torch):
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return _DistRanks(dist)
    return None
