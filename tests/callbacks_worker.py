"""Runs the framework callbacks' cases for tests/test_callbacks.py, each in a process of its own, as a user's
script would end: `python tests/callbacks_worker.py hf|lightning OUT`.

Importing transformers or lightning takes ~10 s, so the parent imports once, then forks one child per case
and waits for it. A child goes back to the module's top level and runs its case as a script's last
statement, so its exit is a script's: 0 at the end, 1 with the traceback for an exception, -11 for a
segmentation fault (139 in a shell), with atexit and finalization run. OUT gets <case>.log (the child's
output), <case>.json (what the case returned) and results.json ({case: exit code}).
"""
import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout's profiling/, whatever the current folder
# A short schedule (warm-up 1, timed 1, profiler warm-up 1, active 2, the line record 1: the window is steps
# 4-5, the profile done after step 6), so each case takes seconds on a 2-core CPU.
QUICK = dict(warmup_steps=1, timed_steps=1, active_steps=2)
DONE_AFTER = 6
INSIDE = 4        # a step inside the profiled window
BATCH, ACCUMULATION = 2, 2


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def hf_train(out, steps, save_at=None, raise_at=None):
    """A tiny Llama through transformers' Trainer with HFCallback; gradient accumulation 2."""
    from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

    import profiling
    example = load("hf_trainer")
    size = example.SIZES["tiny"]

    class Raise(TrainerCallback):  # the user's code failing inside the profiled window
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == raise_at:
                raise RuntimeError(f"the user's error at step {raise_at}")

    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=BATCH,
                             gradient_accumulation_steps=ACCUMULATION, use_cpu=True, report_to="none",
                             disable_tqdm=True, logging_strategy="no", seed=0,
                             save_strategy="steps" if save_at else "no", save_steps=save_at or 500)
    callback = profiling.HFCallback(**QUICK)
    data = example.RandomTokens(steps * BATCH * ACCUMULATION, size.seq_len, size.vocab)
    Trainer(model=example.build_model(size), args=args, train_dataset=data,
            data_collator=default_data_collator, callbacks=[callback, Raise()]).train()
    return {"folder": callback.folder, "seq_len": size.seq_len, "checkpoints": sorted(os.listdir(out))}


def lightning_train(out, steps, save_at=None, raise_at=None):
    """A tiny GPT through Lightning with LightningCallback; accumulate_grad_batches 2."""
    import lightning as L
    import torch

    import profiling
    example = load("lightning_train")
    size = example.SIZES["tiny"]
    module = example.lightning_module(size, compile_model=False)
    step = module.training_step

    def training_step(batch, batch_idx):  # the user's code failing inside optimizer.step(closure)
        if module.trainer.global_step == raise_at:
            raise RuntimeError(f"the user's error at step {raise_at}")
        return step(batch, batch_idx)

    module.training_step = training_step
    tokens = torch.randint(size.vocab, (steps * BATCH * ACCUMULATION, size.seq_len + 1))
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    callback = profiling.LightningCallback(**QUICK)
    saver = [L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(out, "checkpoints"), save_top_k=-1,
                                                 every_n_train_steps=save_at)] if save_at else []
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=ACCUMULATION,
                        logger=False, enable_checkpointing=bool(save_at), enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=out, callbacks=[callback] + saver)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=BATCH))
    saved = sorted(os.listdir(os.path.join(out, "checkpoints"))) if save_at else []
    return {"folder": callback.folder, "seq_len": size.seq_len, "checkpoints": saved}


def example_run(framework, out):
    """The example script itself, tiny, with --profile and the default schedule."""
    module = load("hf_trainer" if framework == "hf" else "lightning_train")
    module.main(["--size", "tiny", "--device", "cpu", "--steps", "16", "--accumulation", "2",
                 "--profile", os.path.join(out, "profiles"), "--output-dir", out])
    return {}


TRAIN = {"hf": hf_train, "lightning": lightning_train}
CASES = {
    "full": dict(steps=DONE_AFTER + 2),           # the profile done, training goes on after it
    "early": dict(steps=INSIDE),                  # max_steps ends inside the profiled window
    "raise": dict(steps=DONE_AFTER + 2, raise_at=INSIDE),
    "save": dict(steps=DONE_AFTER + 2, save_at=INSIDE),
}


def run_case(framework, case, out):
    folder = os.path.join(out, case)
    facts = example_run(framework, folder) if case == "example" else \
        TRAIN[framework](folder, **CASES[case])
    with open(os.path.join(out, f"{case}.json"), "w") as f:
        json.dump(facts, f)


def fork_cases(framework, out):
    """The parent: one child per case, in turn; returns the case to run in a child, None in the parent."""
    import torch  # noqa: F401  (imported before forking: each child starts with them loaded)
    if framework == "hf":
        import transformers  # noqa: F401
    else:
        import lightning  # noqa: F401
    results = {}
    for case in [*CASES, "example"]:
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            log = os.open(os.path.join(out, f"{case}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1), os.dup2(log, 2)
            return case
        results[case] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f)
    return None


if __name__ == "__main__":
    FRAMEWORK, OUT = sys.argv[1], sys.argv[2]
    CASE = fork_cases(FRAMEWORK, OUT)
    if CASE:
        run_case(FRAMEWORK, CASE, OUT)  # a child: its exit is this script's
