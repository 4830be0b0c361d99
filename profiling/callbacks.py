"""Ready callbacks for the trainers people use: one line, and the profile comes out of the usual run.

    from transformers import Trainer
    trainer = Trainer(model, args, train_dataset=..., callbacks=[profiling.HFCallback()])

    import lightning as L
    trainer = L.Trainer(max_steps=100, callbacks=[profiling.LightningCallback()])

Each one drives a `profiling.Profiler` (profiling/api.py) the way the framework drives its step (DESIGN.md,
pitfall 15): a step is an optimizer step, never a micro-batch. Hugging Face's `on_step_end` runs once per
optimizer step, after gradient accumulation; Lightning's `on_train_batch_end` runs after every micro-batch, so
the Lightning callback steps the profile when `trainer.global_step` (optimizer steps) moves.

What it takes from the framework: the model; samples per step = per-device batch x gradient accumulation x
processes; tokens per step = samples x the sequence length of the batch's `input_ids` (a dict's, or a 2-D
integer tensor's) where the batch shows one; the output folder (`args.output_dir` or
`trainer.default_root_dir`) + "profiles". The Profiler is created at train begin (Lightning: the first
batch's start), before the first call of a compiled model, and closed at train end (Lightning: and on an
exception; Hugging Face has no exception event, the Profiler's own exit handling covers it). Rank 0 prints
where the report is.

Keyword arguments go to the Profiler unchanged (warmup_steps, active_steps, out_dir, tokens_per_step, ...): a
name it does not take is a ValueError at construction. The classes are made on first use, from the
framework's own base class (transformers.TrainerCallback; lightning.pytorch.Callback, else
pytorch_lightning's), so `import profiling` imports neither framework, nor torch.
"""
import inspect
import os

OWN = ("model",)  # what the callback gives the Profiler itself


def check_options(cls_name, options):
    """The keyword arguments a callback passes to the Profiler, checked when the callback is made (before the
    trainer makes its folders or runs a batch): a one-line ValueError for a name the Profiler does not take,
    or a value it refuses (the Profiler's own check, profiling/api.py check_arguments)."""
    from profiling import api
    known = set(inspect.signature(api.Profiler).parameters) - set(OWN)
    known.add("samples_per_step")  # passed on once the Profiler takes it (issue #41: samples/s)
    bad = sorted(set(options) - known)
    if bad:
        raise ValueError(f"{cls_name} got {', '.join(map(repr, bad))}, which the Profiler does not take; "
                         f"give some of: {', '.join(sorted(known))}")
    try:
        api.check_arguments(**options)
    except ValueError as e:
        raise ValueError(f"{cls_name}: {e}") from None
    return dict(options)


def batch_shape(batch):
    """(samples, sequence length or None) of one batch as a framework hands it over: a tensor, a dict (its
    `input_ids`, else its first tensor), or a list/tuple (its first tensor); (None, None) when none shows.
    The sequence length is read only from `input_ids` or a 2-D integer tensor (token ids), never guessed from
    a float tensor's second dimension (features, channels)."""
    if isinstance(batch, dict):
        ids = batch.get("input_ids")
        if _is_tensor(ids):
            return ids.shape[0], ids.shape[1] if ids.dim() == 2 else None
        batch = next((v for v in batch.values() if _is_tensor(v)), None)
    elif isinstance(batch, (list, tuple)):
        batch = next((v for v in batch if _is_tensor(v)), None)
    if not _is_tensor(batch) or batch.dim() == 0:
        return None, None
    tokens = batch.dim() == 2 and not batch.is_floating_point() and not batch.is_complex()
    return batch.shape[0], batch.shape[1] if tokens else None


def _is_tensor(x):
    return hasattr(x, "shape") and callable(getattr(x, "dim", None))


class ProfiledRun:
    """One Profiler driven by a framework's events: created with what the framework told, stepped once per
    optimizer step, closed at the end; rank 0 prints where the report went."""

    def __init__(self, model, options, *, out_dir, samples_per_step, seq_len, micro_batch, first, framework,
                 loop_frames=True):
        from profiling import api
        options = dict(options)
        options.setdefault("out_dir", out_dir)
        options.setdefault("micro_batch", micro_batch)
        if seq_len and samples_per_step:
            options.setdefault("tokens_per_step", samples_per_step * seq_len)
        samples = options.pop("samples_per_step", samples_per_step)
        if "samples_per_step" in inspect.signature(api.Profiler).parameters:
            options["samples_per_step"] = samples
        options["metadata"] = {"framework": framework, **(options.get("metadata") or {})}
        self.samples_per_step, self.first = samples, first
        self.prof = api.Profiler(model, **options)
        if not loop_frames:  # the framework says when training ends (profiling/profile/capture/watchdog.py)
            self.prof.watch_loop_frames(False)

    def learn_seq_len(self, seq_len):
        """Tokens per step from a sequence length seen after creation (Hugging Face: the first forward's
        input_ids); the Profiler reads tokens_per_step when its window opens, so this is in time unless the
        window opened at creation (warmup_steps + timed_steps == 0)."""
        if seq_len and self.samples_per_step and self.prof.tokens_per_step is None and not self.prof.done:
            self.prof.tokens_per_step = self.samples_per_step * seq_len

    def step(self):
        if self.prof.done:
            return
        self.prof.step()
        if self.prof.done:
            self._say()

    def close(self, exception=None):
        """Stop the Profiler. exception: the one that ended training (Lightning's on_exception), kept as the
        `with` block's exit keeps it: the report of the steps recorded notes it (never "the loop stopped")."""
        done = self.prof.done
        if exception is not None and not done:
            self.prof.__exit__(type(exception), exception, None)
        self.prof.close()
        if not done:
            self._say()

    def _say(self):
        folder = self.prof.folder
        if self.first and folder:
            print(f"profiling: report in {os.path.join(folder, 'report.md')}", flush=True)


class _Results:
    """`folder` and `report` of the last profile a callback made, read from its Profiler: there as soon as it
    wrote them, whatever ended the profile (train end, an exception, the watchdog), None before."""
    _latest = None  # the last ProfiledRun
    folder = property(lambda self: self._latest.prof.folder if self._latest else None)
    report = property(lambda self: self._latest.prof.report if self._latest else None)


class _HFHooks(_Results):
    """Profile the steps of a Hugging Face `Trainer`: `Trainer(..., callbacks=[profiling.HFCallback()])`.
    Keyword arguments go to profiling.Profiler (see profiling/callbacks.py)."""

    def __init__(self, **profiler_options):
        self.options = check_options(type(self).__name__, profiler_options)
        self.run, self._hook, self._ids = None, None, None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.close()  # a second train() call profiles afresh
        samples = args.train_batch_size * args.gradient_accumulation_steps * args.world_size
        self.run = ProfiledRun(model, self.options, out_dir=os.path.join(args.output_dir, "profiles"),
                               samples_per_step=samples, seq_len=None,
                               micro_batch=args.per_device_train_batch_size,
                               first=state.is_world_process_zero, framework=_framework("transformers"))
        self._latest = self.run
        if model is not None and "tokens_per_step" not in self.options:
            self._hook = model.register_forward_pre_hook(self._see_batch, with_kwargs=True)

    def _see_batch(self, module, args, kwargs):
        """Each forward's token ids, kept for the first step's end to read. A compiled model traces this
        hook: it only stores a reference (nothing dynamo cannot trace: no graph break), and it stays until
        train end (removing it would change the module's hooks, which dynamo guards: a recompilation)."""
        self._ids = kwargs.get("input_ids", args[0] if args else None)

    def on_step_end(self, args, state, control, **kwargs):
        if self.run:
            if self._ids is not None:
                self.run.learn_seq_len(batch_shape(self._ids)[1])
            self.run.step()

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self):
        """Stop the profile (train end; safe to call any time)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook, self._ids = None, None
        if self.run:
            self.run.close()
            self.run = None


class _LightningHooks(_Results):
    """Profile the steps of a Lightning `Trainer`:
    `L.Trainer(..., callbacks=[profiling.LightningCallback()])`. Keyword arguments go to profiling.Profiler
    (see profiling/callbacks.py)."""

    def __init__(self, **profiler_options):
        self.options = check_options(type(self).__name__, profiler_options)
        self.run, self._optimizer_steps = None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.run is not None:
            return
        per_device, seq_len = batch_shape(batch)
        samples = per_device * trainer.accumulate_grad_batches * trainer.world_size if per_device else None
        self.run = ProfiledRun(pl_module, self.options,
                               out_dir=os.path.join(trainer.default_root_dir, "profiles"),
                               samples_per_step=samples, seq_len=seq_len, micro_batch=per_device,
                               first=trainer.is_global_zero,
                               framework=_framework(type(trainer).__module__.split(".")[0]),
                               loop_frames=False)  # its epoch loop returns each epoch: on_train_end says
        self._latest = self.run
        self._optimizer_steps = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        """Once per micro-batch: a step of the profile only where an optimizer step happened."""
        if self.run and trainer.global_step != self._optimizer_steps:
            self._optimizer_steps = trainer.global_step
            self.run.step()

    def on_train_end(self, trainer, pl_module):
        self.close()

    def on_exception(self, trainer, pl_module, exception):
        self.close(exception)

    def close(self, exception=None):
        """Stop the profile (train end, an exception; safe to call any time)."""
        if self.run:
            self.run.close(exception)
            self.run = None


def _framework(package):
    """'package version' for the trace's metadata, read without importing it."""
    from importlib import metadata
    try:
        return f"{package} {metadata.version(package)}"
    except (metadata.PackageNotFoundError, ValueError):
        return package


def _hf_class():
    from transformers import TrainerCallback
    return _HFHooks, TrainerCallback


def _lightning_class():
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback
    return _LightningHooks, Callback


_MAKERS = {"HFCallback": _hf_class, "LightningCallback": _lightning_class}


def __getattr__(name):
    """HFCallback and LightningCallback, made on first use on the framework's base class."""
    if name not in _MAKERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    hooks, base = _MAKERS[name]()
    cls = type(name, (hooks, base), {"__module__": __name__, "__doc__": hooks.__doc__, "__qualname__": name})
    globals()[name] = cls
    return cls
