"""The framework callbacks (profiling/callbacks.py). Fast: what a callback reads from a batch, its options,
and its counting of optimizer steps, against stand-ins for the trainers and the Profiler. Slow: the real
transformers Trainer and Lightning Trainer on tiny models (tests/profile/lifecycle_worker.py --callbacks, one
process per framework forking one child per case): a full profile with gradient accumulation, max_steps
ending inside the profiled window, an exception raised inside it, a checkpoint saved inside it, and the
example scripts. How the real trainers end at other step counts: tests/profile/test_lifecycle.py."""
import gzip
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from profiling import api, callbacks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "profile"))
import lifecycle_worker as worker  # noqa: E402


def test_import_profiling_imports_no_framework():
    code = ("import sys, profiling, profiling.callbacks; profiling.__all__; "
            "print(sorted({'torch', 'transformers', 'lightning', 'pytorch_lightning'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_batch_shape_reads_token_ids_only():
    ids = torch.zeros(4, 64, dtype=torch.long)
    assert callbacks.batch_shape(ids) == (4, 64)
    assert callbacks.batch_shape({"input_ids": ids, "labels": ids}) == (4, 64)
    assert callbacks.batch_shape({"pixel_values": torch.zeros(8, 3, 32, 32)}) == (8, None)
    assert callbacks.batch_shape((ids[:, :-1], ids[:, 1:])) == (4, 63)
    assert callbacks.batch_shape([torch.zeros(5, 10), torch.zeros(5)]) == (5, None)  # features, not tokens
    assert callbacks.batch_shape({"text": ["a"]}) == (None, None)
    assert callbacks.batch_shape(torch.tensor(1.0)) == (None, None)


@pytest.mark.parametrize("hooks", [callbacks._HFHooks, callbacks._LightningHooks])
def test_an_option_the_profiler_does_not_take_is_a_value_error(hooks):
    with pytest.raises(ValueError, match="'warmup'.*does not take"):
        hooks(warmup=3)
    with pytest.raises(ValueError, match="'model'"):
        hooks(model=None)  # the callback gives the framework's model itself
    assert hooks(active_steps=2, samples_per_step=8).options == {"active_steps": 2, "samples_per_step": 8}


@pytest.mark.parametrize("hooks", [callbacks._HFHooks, callbacks._LightningHooks])
@pytest.mark.parametrize("options, said", [
    (dict(active_steps=0), "active_steps must be an integer of at least 1, not 0"),
    (dict(warmup_steps="3"), "warmup_steps must be an integer of at least 0, not '3'"),
    (dict(memory="yes"), "memory must be True, False or None, not 'yes'"),
    (dict(tokens_per_step=-1), "tokens_per_step must be an integer of at least 1, not -1"),
    (dict(timed_steps=0), "timed_steps=0 needs unprofiled_step_ms"),
    (dict(code_roots="src"), "code_roots must be a list of folders"),
    (dict(out_dir=3), "out_dir must be a folder path, not int"),
    (dict(reference="/no/such/summary.json"), "reference '/no/such/summary.json' is not a file"),
])
def test_a_bad_option_value_fails_at_construction(hooks, options, said):
    """Issue #49: a wrong value failed only at the first batch, after the trainer made its folders, with a
    15-frame traceback; now the callback's construction says it in one line naming the option."""
    with pytest.raises(ValueError) as e:
        hooks(**options)
    assert str(e.value).startswith(f"{hooks.__name__}: {said}") and "\n" not in str(e.value), e.value
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_an_out_dir_that_cannot_be_written_fails_at_construction(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="_LightningHooks: out_dir .* is a file; give a folder path"):
        callbacks._LightningHooks(out_dir=tmp_path / "file" / "profiles")


class FakeProfiler:
    """profiling.Profiler's surface as the callbacks use it: done after `steps` step() calls."""
    made = []

    def __init__(self, model=None, *, tokens_per_step=None, out_dir=None, micro_batch=None, metadata=None,
                 active_steps=5):
        self.model, self.tokens_per_step, self.out_dir = model, tokens_per_step, out_dir
        self.micro_batch = micro_batch
        self.metadata, self.steps, self.done, self.closed = metadata, 0, False, False
        self.folder = self.report = None
        self.loop_frames = True
        FakeProfiler.made.append(self)

    def watch_loop_frames(self, on):
        self.loop_frames = on

    def step(self):
        self.steps += 1
        if self.steps == 3:
            self.done, self.folder, self.report = True, "/profiles/x", "# Profile"

    def close(self):
        self.closed = True


class FakeProfilerWithSamples(FakeProfiler):
    def __init__(self, model=None, *, samples_per_step=None, tokens_per_step=None, out_dir=None,
                 micro_batch=None, metadata=None):
        super().__init__(model, tokens_per_step=tokens_per_step, out_dir=out_dir, micro_batch=micro_batch,
                         metadata=metadata)
        self.samples_per_step = samples_per_step


@pytest.fixture
def fake(monkeypatch):
    FakeProfiler.made = []
    monkeypatch.setattr(api, "Profiler", FakeProfiler)
    return FakeProfiler.made


def trainer(global_step=0, accumulate=2, world=2, first=True):
    return SimpleNamespace(global_step=global_step, accumulate_grad_batches=accumulate, world_size=world,
                           is_global_zero=first, default_root_dir="/run")


def test_lightning_steps_once_per_optimizer_step(fake, capsys):
    """accumulate_grad_batches=2: on_train_batch_end runs after each micro-batch, global_step moves every
    second one; a profile step is an optimizer step."""
    cb, t, module = callbacks._LightningHooks(active_steps=2), trainer(), object()
    batch = {"input_ids": torch.zeros(4, 32, dtype=torch.long)}
    for i in range(6):
        cb.on_train_batch_start(t, module, batch, i)
        t.global_step += i % 2  # the optimizer steps after the second micro-batch of each pair
        cb.on_train_batch_end(t, module, None, batch, i)
    (prof,) = fake
    assert prof.steps == 3 and prof.model is module and prof.done
    assert not prof.loop_frames  # its epoch loop returns each epoch; on_train_end and on_exception end it
    assert prof.tokens_per_step == 4 * 2 * 2 * 32  # batch x accumulation x processes x sequence
    assert prof.micro_batch == 4 and prof.out_dir == os.path.join("/run", "profiles")
    assert "profiling: report in /profiles/x/report.md" in capsys.readouterr().out
    cb.on_exception(t, module, RuntimeError())
    assert prof.closed and cb.run is None and cb.folder == "/profiles/x"
    cb.close()  # safe again


def test_lightning_other_ranks_say_nothing(fake, capsys):
    cb, t = callbacks._LightningHooks(), trainer(first=False)
    cb.on_train_batch_start(t, None, torch.zeros(2, 8, dtype=torch.long), 0)
    for _ in range(3):
        t.global_step += 1
        cb.on_train_batch_end(t, None, None, None, 0)
    cb.on_train_end(t, None)
    assert fake[0].done and capsys.readouterr().out == ""


def test_samples_per_step_goes_on_only_where_the_profiler_takes_it(fake, monkeypatch):
    features = torch.zeros(8, 10)  # no sequence: samples only
    run = callbacks.ProfiledRun(None, {}, out_dir="o", samples_per_step=16, seq_len=None, micro_batch=8,
                                first=True, framework="x")
    assert run.prof.tokens_per_step is None and not hasattr(run.prof, "samples_per_step")
    monkeypatch.setattr(api, "Profiler", FakeProfilerWithSamples)
    cb = callbacks._LightningHooks(tokens_per_step=7)
    cb.on_train_batch_start(trainer(accumulate=1, world=1), None, (features,), 0)
    assert cb.run.prof.samples_per_step == 8 and cb.run.prof.tokens_per_step == 7  # the user's figure wins


def test_hf_learns_the_sequence_length_from_the_first_forward(fake):
    model = torch.nn.Embedding(16, 4)
    args = SimpleNamespace(train_batch_size=2, gradient_accumulation_steps=3, world_size=1,
                           per_device_train_batch_size=2, output_dir="/out")
    state = SimpleNamespace(is_world_process_zero=True)
    cb = callbacks._HFHooks()
    cb.on_train_begin(args, state, None, model=model)
    for _ in range(3):
        model(torch.zeros(2, 10, dtype=torch.long))  # 3 micro-batches: one optimizer step
    cb.on_step_end(args, state, None)
    (prof,) = fake
    assert prof.tokens_per_step == 2 * 3 * 10 and prof.steps == 1
    assert prof.loop_frames  # no exception event: the watchdog sees _inner_training_loop end
    assert prof.metadata["framework"].startswith("transformers")
    cb.on_train_end(args, state, None)
    assert prof.closed and not model._forward_pre_hooks  # the hook goes at train end


# The real trainers. Each framework's worker runs once per test session (~1-2 min on a 2-core CPU).

@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    done = {}

    def run(framework):
        if framework not in done:
            out = tmp_path_factory.mktemp(framework)
            run = subprocess.run([sys.executable, worker.__file__, "--callbacks", framework, str(out)],
                                 cwd=ROOT, timeout=600, capture_output=True, text=True)
            assert run.returncode == 0, run.stderr[-2000:]
            done[framework] = out, json.loads(run.stdout.strip().splitlines()[-1])
        return done[framework]
    return run


def case(ran, framework, name):
    out, codes = ran(framework)
    log = (out / f"{name}.log").read_text()
    facts = json.loads((out / f"{name}.json").read_text()) if (out / f"{name}.json").exists() else None
    return codes[name], log, facts


def read_json(path):
    with open(path) as f:
        return json.load(f)


def operators_per_step(folder):
    """CPU operators inside each ProfilerStep of a profile's trace."""
    with gzip.open(os.path.join(folder, "trace.json.gz")) as f:
        events = json.load(f)["traceEvents"]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    ops = [e["ts"] for e in events if e.get("cat") == "cpu_op"]
    return [sum(s["ts"] <= t < s["ts"] + s["dur"] for t in ops) for s in steps]


FRAMEWORKS = ["hf", "lightning"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_full_profile_counts_optimizer_steps(ran, framework):
    code, log, facts = case(ran, framework, "full")
    assert code == 0, log
    folder = facts["folder"]
    assert f"profiling: report in {folder}/report.md" in log
    summary = read_json(os.path.join(folder, "summary.json"))
    assert summary["tokens_per_step"] == worker.BATCH * worker.ACCUMULATION * facts["seq_len"]
    counts = operators_per_step(folder)
    assert len(counts) == worker.QUICK["active_steps"]
    assert len(set(counts)) == 1, counts  # whole optimizer steps: micro-batches would alternate


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_max_steps_inside_the_window_exits_0(ran, framework):
    code, log, _ = case(ran, framework, "early")
    assert code == 0, log


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_exception_inside_the_window_is_the_users(ran, framework):
    code, log, _ = case(ran, framework, "raise")
    assert code == 1, log
    assert "Traceback" in log and "RuntimeError: the user's own error" in log


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_max_steps_and_raising_in_the_default_window_exit_as_without_the_callback(ran, framework):
    """The default schedule; max_steps ending in the first profiled step (10) and in the shape step (15),
    and raising there (from the user's callback; inside Lightning's optimizer.step(closure)): the exit code
    of the same run without the callback. The whole 1-20: test_lifecycle.py's opt-in matrix."""
    out, codes = ran(framework)
    matrix = {case: code for case, code in codes.items() if " " in case}  # "FORM N END"
    assert len(matrix) == 2 * len(worker.CI_COUNTS) * len(worker.ENDS)
    assert not worker.problems(matrix, out)
    assert set(worker.expected(matrix).values()) == {0, 1}
    # the 5 profiled steps recorded before max_steps ended the run: a report
    assert (out / "profiles" / f"{framework}-15-done" / "profiles" / "latest" / "report.md").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_checkpoint_inside_the_window(ran, framework):
    code, log, facts = case(ran, framework, "save")
    assert code == 0, log
    assert os.path.isfile(os.path.join(facts["folder"], "report.md"))
    assert any(str(worker.INSIDE) in name for name in facts["checkpoints"]), facts["checkpoints"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_example_script_profiles_through_its_callback(ran, framework):
    code, log, _ = case(ran, framework, "example")
    assert code == 0, log
    last = log.strip().splitlines()[-1]
    assert last.startswith("profile: "), last
    summary = read_json(os.path.join(last.removeprefix("profile: "), "summary.json"))
    assert summary["tokens_per_step"] == 4 * 2 * 64  # the tiny size: batch 4, accumulation 2, 64 tokens


@pytest.mark.slow  # dynamo's first compile: ~10 s on a 2-core CPU
def test_hf_hook_under_torch_compile_adds_no_graph_break(fake):
    """Trainer(torch_compile=True) compiles the model the hook is on: dynamo traces the hook, which must
    neither break the graph nor cause a recompilation when it is removed."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Embedding(16, 4)
    args = SimpleNamespace(train_batch_size=2, gradient_accumulation_steps=1, world_size=1,
                           per_device_train_batch_size=2, output_dir="/out")
    state = SimpleNamespace(is_world_process_zero=False)
    cb = callbacks._HFHooks()
    cb.on_train_begin(args, state, None, model=model)
    compiled = torch.compile(model, backend="eager")
    for _ in range(3):
        compiled(torch.zeros(2, 10, dtype=torch.long)).sum().backward()
        cb.on_step_end(args, state, None)
    assert fake[0].tokens_per_step == 2 * 10
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("name", ["hf_trainer", "lightning_train"])
def test_example_arguments_are_checked(name):
    example = worker.load(name)  # the frameworks load only in main()
    assert example.parse_args(["--size", "gpu", "--accumulation", "2"]).accumulation == 2
    for bad in (["--steps", "0"], ["--accumulation", "0"], ["--size", "huge"]):
        with pytest.raises(SystemExit):
            example.parse_args(bad)


SETTINGS = """
import json, sys
sys.path.insert(0, {root!r})
import lightning
from profiling.profile.capture import settings
from profiling.profile.trace import settings as view
record = settings.snapshot()
print(json.dumps([view.differing(record), view.text(view.summary(record))]))
"""


@pytest.mark.slow  # imports lightning: ~10 s on the loaded 2-core CPU
@pytest.mark.parametrize("start, by", [(None, "lightning"), ("1", "user"), ("0", "lightning")])
def test_a_variable_lightning_sets_on_import_is_named_as_lightnings(start, by):
    """Issue #49: PYTORCH_NVML_BASED_CUDA_CHECK=1, which `import lightning` sets, was credited to the user.
    Set by the user before the process started (the same value), it stays theirs; another value of theirs is
    overwritten by lightning's import, so the 1 the process runs with is lightning's."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    if start is not None:
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = start
    run = subprocess.run([sys.executable, "-c", SETTINGS.format(root=ROOT)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows, line = json.loads(run.stdout.strip().splitlines()[-1])
    (row,) = [r for r in rows if r["name"] == "env.PYTORCH_NVML_BASED_CUDA_CHECK"]
    assert row["value"] == "1" and row["by"] == by, row
    assert ("PYTORCH_NVML_BASED_CUDA_CHECK=1 (lightning, set on its import)" in line) == (by == "lightning")


@pytest.mark.slow  # two runs of each framework in processes of their own: ~1 min on a 2-core CPU
@pytest.mark.heavy
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_ctrl_c_inside_the_window_exits_as_without_the_callback(tmp_path, framework):
    """Issue #49: Ctrl-C in the window exited 130 where the same HF run without the profiler exits 1 (CPython
    3.11 exits 1 after an uncaught KeyboardInterrupt once a string is exec'd at exit, as torch._dynamo's exit
    hook does importing tabulate; the profiler had imported it when created). Lightning exits 1 itself. A
    KeyboardInterrupt raised in optimizer step 10 (the default window's first profiled step), in a process
    of its own, as a terminal's Ctrl-C raises it."""
    codes = {}
    for form in (framework, worker.BASELINES[framework]):
        run = subprocess.run([sys.executable, worker.__file__, form, "10", "interrupt", str(tmp_path / form)],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert "KeyboardInterrupt" in run.stderr, run.stderr[-2000:]
        codes[form] = run.returncode
    assert codes[framework] == codes[worker.BASELINES[framework]], codes
