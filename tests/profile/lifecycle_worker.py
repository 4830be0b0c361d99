"""Training runs that end in a chosen way, for the lifecycle tests (tests/profile/test_lifecycle.py) and the
framework callbacks' tests (tests/test_callbacks.py): the Profiler must never change how the run ends
(DESIGN.md pitfall 14, STYLE.md habit 17).

    python tests/profile/lifecycle_worker.py FORM STEPS END OUT
        one run, in this process: its exit code and stderr are the run's own (a real uncaught exception, a
        real KeyboardInterrupt)
    python tests/profile/lifecycle_worker.py --matrix FORMS COUNTS ENDS OUT
        one forked child per case (FORM x STEPS x END), the case "FORM STEPS END"
    python tests/profile/lifecycle_worker.py open STEPS AFTER OUT
        a loop that stops stepping after STEPS steps without close() and goes on with something else
        (AFTER: "evals", "return", "backward", "hook"; see left_open); its last line is a JSON of what it saw
    python tests/profile/lifecycle_worker.py --callbacks hf|lightning OUT
        one forked child per callback case (CALLBACK_CASES, and "example": the example script, tiny), and
        the framework's matrix cases at CI_COUNTS

Both forking modes import torch (and transformers or lightning, ~10 s) once, then fork; a child ends as the
interpreter ends a script (atexit and finalization run): 0, or 1 with the traceback. They print one JSON line
{case: exit code (negative: killed by that signal)}; each child's output is in OUT/<case>.log (spaces as
dashes), what a callback case returned in OUT/<case>.json.

FORM: how the loop drives the profiler -- a key of FORMS: "none" (no profiler, the exit code Python gives),
"loop" (prof.step() in a plain loop), "with" (the same inside `with Profiler(...)`), "drop" (the Profiler is
dropped inside a function, never closed), "hf" and "lightning" (a tiny model through the framework's Trainer,
`max_steps=STEPS`, with the profiler's callback) and "hf-none", "lightning-none" (the same without it).
BASELINES names the form each one's exit code must equal. END: "done" (the run stops after STEPS steps),
"raise" (RuntimeError in step STEPS), "interrupt" (KeyboardInterrupt there), "close" (prof.close() after
STEPS steps; the loop forms). COUNTS: "1-20" or "3,10,12".
"""
import faulthandler
import gc
import importlib.util
import json
import os
import sys
import threading
import time

if __name__ == "__main__":  # a run of its own (the tests import this module only for its constants)
    # One thread per run: on a loaded 2-core machine torch's default two threads spin against each other and
    # the other processes (a tiny Trainer step: ~15 ms with one thread, 0.1-1.6 s with two). How a run ends
    # does not depend on it; a value set outside wins.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the checkout's profiling/, whatever the current folder
import profiling  # noqa: E402

# The framework runs: batch 2, gradient accumulation 2 (a step is an optimizer step, not a micro-batch).
BATCH, ACCUMULATION = 2, 2
# The callback cases' short schedule (warm-up 1, timed 1, profiler warm-up 1, active 2, the shape step 1, the
# line record 1: the window is steps 4-5, the profile done after step 7), so each case takes seconds.
QUICK = dict(warmup_steps=1, timed_steps=1, active_steps=2)
DONE_AFTER = 7
INSIDE = 4        # a step inside the profiled window


def fail(end):
    """What the last step does for this way of ending."""
    if end == "raise":
        raise RuntimeError("the user's own error")
    if end == "interrupt":
        raise KeyboardInterrupt


def train_step(model, opt):
    loss = model(torch.randn(8, 64)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def no_profiler(steps, end, out):
    model, opt = setup()
    for i in range(steps):
        train_step(model, opt)
        if i == steps - 1:
            fail(end)


def plain_loop(steps, end, out):
    model, opt = setup()
    prof = profiling.Profiler(model, tokens_per_step=64, out_dir=out, max_timed_steps=5)
    for i in range(steps):
        train_step(model, opt)
        if i == steps - 1:
            fail(end)
        prof.step()
    if end == "close":
        prof.close()
    return prof


def with_block(steps, end, out):
    model, opt = setup()
    with profiling.Profiler(model, tokens_per_step=64, out_dir=out, max_timed_steps=5) as prof:
        for i in range(steps):
            train_step(model, opt)
            if i == steps - 1:
                fail(end)
            prof.step()
    return prof


# The window left open (tests/profile/test_lifecycle.py): eval forwards of a wider model (about 1 ms each on
# the 2-core CPU, so the seconds recorded before the watchdog's close are quick to read back), EVAL_S seconds
# at most: once the watchdog has closed the window, AFTER_CLOSE_S more (what runs after the close must not be
# recorded, and whatever the close left running would still be running then); a window never closed (the
# watchdog broken, or "-unwatched") runs the whole EVAL_S.
EVAL_S, AFTER_CLOSE_S, WIDTH = 6.0, 1.0, 512


class SlowBackward(torch.autograd.Function):
    """A backward that runs Python for a while, called by autograd's C++ engine: the watchdog's close may land
    inside it, with the engine's own records open."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        deadline = time.perf_counter() + EVAL_S / 2
        while time.perf_counter() < deadline:
            sum(range(1000))  # Python bytecodes: where the interpreter runs the pending close
        return grad * 2


def left_open(steps, after, out):
    """A loop that stops stepping after `steps` steps, inside the window, without close(); then, for up to
    EVAL_S seconds (AFTER_CLOSE_S after the watchdog's close): "evals" (eval forwards in the same function, past
    the loop that stepped), "return" (the loop's function returned first), "backward" (a Python backward called
    by autograd's engine) or "hook" (eval forwards whose forward hook runs Python). Prints a JSON line of what it saw after:
    whether the profiler, the sampler and the watchdog still run, the settings put back, the close's
    thread."""
    from profiling import api
    from profiling.profile.capture import provenance, watchdog
    if after.endswith("-unwatched"):  # as before the watchdog (benchmarks/profiler_cost/lifecycle_results.md's comparison)
        watchdog.Watchdog.start = lambda self: None
        after = after.removesuffix("-unwatched")
    closed_on = []  # the thread of each call of the watchdog's close (a deferred one included)
    stopped = api.Profiler._stopped
    api.Profiler._stopped = lambda self, reason: (closed_on.append(threading.current_thread().name),
                                                  stopped(self, reason))[1]
    model, opt = setup()
    prof = profiling.Profiler(model, tokens_per_step=64, out_dir=out, max_timed_steps=5)

    def loop():
        for _ in range(steps):
            train_step(model, opt)
            prof.step()
    if after == "return":
        loop()
    else:
        for _ in range(steps):
            train_step(model, opt)
            prof.step()
    seen, start = {}, time.perf_counter()
    wide = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
    if after == "hook":
        wide.register_forward_hook(lambda module, args, output: sum(range(100)) and None)
    if after == "backward":
        x = torch.randn(8, requires_grad=True)
        SlowBackward.apply(x).sum().backward()
        seen["grad_ok"] = bool((x.grad == 2).all())  # d(sum(2x))/dx: the backward ran whole
    end = EVAL_S
    with torch.no_grad():
        while time.perf_counter() - start < end:
            wide(torch.randn(16, WIDTH))
            if closed_on and end == EVAL_S:  # closed: AFTER_CLOSE_S more evals, then look
                end = min(EVAL_S, time.perf_counter() - start + AFTER_CLOSE_S)
    names = {t.name for t in threading.enumerate()}
    import torch._inductor.config as config
    from torch._inductor.runtime import triton_heuristics
    seen.update(profiler=bool(torch.autograd.profiler._is_profiler_enabled),
                sampler="autoresearch-stack-sampler" in names, watchdog="autoresearch-watchdog" in names,
                provenance=provenance.started() or config.trace.provenance_tracking_level != 0,
                launch_records=triton_heuristics.autograd_profiler is torch.autograd.profiler,
                closed_on=closed_on, done=prof.done, at=time.time())
    print(json.dumps(seen), flush=True)


def dropped(steps, end, out):
    """The Profiler is a local of a function that returns without closing it: collected mid-window."""
    plain_loop(steps, end, out)


def collected_elsewhere(steps, end, out):
    """The same Profiler in a reference cycle, so that the collector frees it, and the collector run on another
    thread (as it runs wherever an allocation triggers it: the stack sampler's thread, found by a crash at exit);
    the main thread then goes on with Python for a while."""
    gc.disable()  # the collection happens on the other thread, not at the next allocation here
    prof = plain_loop(steps, end, out)
    prof.cycle = prof
    del prof
    collector = threading.Thread(target=gc.collect)
    collector.start()
    collector.join()
    gc.enable()
    sum(range(100_000))


def load(name):
    """An example script (examples/NAME.py) as a module; its framework loads only in its main()."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def hf_train(out, steps, *, fail_at=None, end="done", save_at=None, schedule=None):
    """A tiny Llama (from a config) through transformers' Trainer, `max_steps=steps`, with
    HFCallback(**schedule) (none if schedule is None); fail(end) at the end of optimizer step `fail_at`,
    before the profiler's callback counts it (the user's callback runs first)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator
    example = load("hf_trainer")
    size = example.SIZES["tiny"]

    class Fail(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == fail_at:
                fail(end)

    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=BATCH,
                             gradient_accumulation_steps=ACCUMULATION, use_cpu=True, report_to="none",
                             disable_tqdm=True, logging_strategy="no", seed=0,
                             save_strategy="steps" if save_at else "no", save_steps=save_at or 500)
    callback = None if schedule is None else profiling.HFCallback(**schedule)
    data = example.RandomTokens(steps * BATCH * ACCUMULATION, size.seq_len, size.vocab)
    callbacks = [Fail()] + ([callback] if callback else [])
    Trainer(model=example.build_model(size), args=args, train_dataset=data,
            data_collator=default_data_collator, callbacks=callbacks).train()
    return {"folder": callback and callback.folder, "seq_len": size.seq_len,
            "checkpoints": sorted(os.listdir(out))}


def lightning_train(out, steps, *, fail_at=None, end="done", save_at=None, schedule=None):
    """A tiny GPT through Lightning, `max_steps=steps`, with LightningCallback(**schedule) (none if schedule
    is None); fail(end) in the first training_step of optimizer step `fail_at`: inside
    optimizer.step(closure), inside the profiled window when the step is."""
    import lightning as L
    example = load("lightning_train")
    size = example.SIZES["tiny"]
    module = example.lightning_module(size, compile_model=False)
    step = module.training_step

    def training_step(batch, batch_idx):
        if module.trainer.global_step + 1 == fail_at:  # global_step counts the optimizer steps done
            fail(end)
        return step(batch, batch_idx)

    module.training_step = training_step
    tokens = torch.randint(size.vocab, (steps * BATCH * ACCUMULATION, size.seq_len + 1))
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    callback = None if schedule is None else profiling.LightningCallback(**schedule)
    saver = [L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(out, "checkpoints"), save_top_k=-1,
                                                 every_n_train_steps=save_at)] if save_at else []
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=ACCUMULATION,
                        logger=False, enable_checkpointing=bool(save_at), enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=out,
                        callbacks=([callback] if callback else []) + saver)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=BATCH))
    saved = sorted(os.listdir(os.path.join(out, "checkpoints"))) if save_at else []
    return {"folder": callback and callback.folder, "seq_len": size.seq_len, "checkpoints": saved}


TRAIN = {"hf": hf_train, "lightning": lightning_train}


def framework_form(framework, profiled):
    """A FORMS entry: the framework trains `steps` steps and fails in the last one; profiled with the default
    schedule, or not at all (the baseline)."""
    def form(steps, end, out):
        TRAIN[framework](out, steps, fail_at=steps, end=end, schedule={} if profiled else None)
    return form


FORMS = {"none": no_profiler, "loop": plain_loop, "with": with_block, "drop": dropped, "elsewhere": collected_elsewhere,
         "open": left_open,
         "hf": framework_form("hf", True), "hf-none": framework_form("hf", False),
         "lightning": framework_form("lightning", True), "lightning-none": framework_form("lightning", False)}
BASELINES = {"loop": "none", "with": "none", "drop": "none", "elsewhere": "none", "hf": "hf-none", "lightning": "lightning-none"}
# The framework forms' cases run with the callback cases in CI: max_steps ending in the default schedule's
# first profiled step (10) and in its shape step (15), and raising there (the whole 1-20: --matrix).
CI_COUNTS, ENDS = (10, 15), ("done", "raise")


def expected(codes):
    """{case: its baseline's exit code} for each case of a form with a baseline in `codes` ("FORM N END"):
    what the same run gives without the profiler, at the same count and end."""
    split = [case.split(" ", 1) for case in codes]
    return {f"{form} {rest}": codes[f"{BASELINES[form]} {rest}"] for form, rest in split if form in BASELINES}


def problems(codes, logs):
    """The cases that end otherwise than their baseline: another exit code, or the user's traceback missing
    from an exit 1 (or shown in an exit 0), read from the case's log in the folder `logs`."""
    found = []
    for case, want in expected(codes).items():
        with open(os.path.join(logs, case.replace(" ", "-") + ".log")) as f:
            shown = "RuntimeError: the user's own error" in f.read()
        if codes[case] != want or shown != (want == 1):
            crash = ""
            if codes[case] < 0:  # killed by a signal: faulthandler's stacks, where it wrote them
                with open(os.path.join(logs, case.replace(" ", "-") + ".log")) as f:
                    text = f.read()
                crash = "; " + text[text.find("Fatal Python error"):][:3000] if "Fatal Python error" in text else ""
            found.append(f"{case}: exit {codes[case]} (without the profiler {want}), traceback: {shown}{crash}")
    return found

CALLBACK_CASES = {
    "full": dict(steps=DONE_AFTER + 1),           # the profile done, training goes on after it
    "early": dict(steps=INSIDE),                  # max_steps ends inside the profiled window
    "raise": dict(steps=DONE_AFTER + 1, fail_at=INSIDE, end="raise"),
    "save": dict(steps=DONE_AFTER + 1, save_at=INSIDE),
}


def example_run(framework, out):
    """The example script itself, tiny, with --profile and the default schedule."""
    module = load("hf_trainer" if framework == "hf" else "lightning_train")
    module.main(["--size", "tiny", "--device", "cpu", "--steps", "16", "--accumulation", "2",
                 "--profile", os.path.join(out, "profiles"), "--output-dir", out])
    return {}


def callback_case(framework, case, out):
    folder = os.path.join(out, case)
    if case == "example":
        return example_run(framework, folder)
    return TRAIN[framework](folder, **CALLBACK_CASES[case], schedule=QUICK)


def counts(text):
    if "-" in text:
        lo, hi = map(int, text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def run_one(form, steps, end, out):
    FORMS[form](steps, end, out)
    print("finished", form, steps, end, flush=True)


def child(case, run, out):
    """In a forked child: run the case, end as the interpreter would (atexit and finalization run)."""
    name = case.replace(" ", "-")
    log = os.open(os.path.join(out, f"{name}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a crash (a signal) leaves its threads' stacks in the log
    try:
        facts = run()
    except BaseException:  # what the interpreter does with an uncaught exception: the traceback, exit 1
        sys.excepthook(*sys.exc_info())
        sys.exit(1)
    if facts is not None:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(facts, f)
    sys.exit(0)


def fork_each(cases, out):
    """{case: exit code}, running each case's function (no arguments) in a forked child, in turn."""
    gc.freeze()  # what is loaded stays out of the children's collections: no copy of it, no walk over it
    codes = {}
    for case, run in cases.items():
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(case, run, out)
        codes[case] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return codes


def preload(forms):
    """What the children import: once, before the forks."""
    import torch._inductor.config  # noqa: F401 (what every child's Profiler imports)
    import torch.profiler  # noqa: F401

    from profiling.profile.capture import window  # noqa: F401
    from profiling.profile.report import render, summary  # noqa: F401
    if any(form.startswith("hf") for form in forms):
        import transformers  # noqa: F401
        import transformers.trainer  # noqa: F401
    if any(form.startswith("lightning") for form in forms):
        import lightning  # noqa: F401


def matrix_cases(forms, steps, ends, out):
    return {f"{form} {n} {end}": (lambda form=form, n=n, end=end:
                                  run_one(form, n, end, os.path.join(out, "profiles", f"{form}-{n}-{end}")))
            for form in forms for n in steps for end in ends}


def matrix(forms, steps, ends, out):
    forms = forms.split(",")
    preload(forms)
    print(json.dumps(fork_each(matrix_cases(forms, counts(steps), ends.split(","), out), out)))


def callbacks(framework, out):
    """The callback cases, the example and the framework's CI lifecycle cases: one import of the framework."""
    preload([framework])
    cases = {case: (lambda case=case: callback_case(framework, case, out))
             for case in [*CALLBACK_CASES, "example"]}
    cases.update(matrix_cases([framework, BASELINES[framework]], CI_COUNTS, ENDS, out))
    print(json.dumps(fork_each(cases, out)))


if __name__ == "__main__":
    if sys.argv[1] == "--matrix":
        matrix(*sys.argv[2:6])
    elif sys.argv[1] == "--callbacks":
        callbacks(*sys.argv[2:4])
    else:
        form, n, end, out = sys.argv[1:5]
        run_one(form, int(n), end, out)
