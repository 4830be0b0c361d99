"""The public profiling API (profiling/api.py) on the CPU: a small training loop of its own, not train.py's, in
the loop form (`Profiler.step()`) and the function form (`profile_steps`), its argument errors, a loop too
short for its schedule, and `import profiling` without torch."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import profiling
from profiling.profile.report import render
from profiling.profile.tables import lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS = "tests/profile/test_api.py"
FAST = dict(warmup_steps=1, timed_steps=2, active_steps=2)


class TinyLM(nn.Module):
    def __init__(self, vocab=128, width=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.mlp(h)
        return self.head(h)


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the test's own file is the project's own code
    return tmp_path / "profiles"


def setup():
    torch.manual_seed(0)
    model = TinyLM()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_the_loop_form_profiles_a_model_of_its_own(out):
    model, opt = setup()
    prof = profiling.Profiler(model, tokens_per_step=4 * 16, out_dir=out, **FAST)
    assert prof.total_steps == 1 + 2 + 1 + 2 + 1 + 1 + 2  # the shape and line-record steps, timed steps again
    steps = 0
    for _ in range(prof.total_steps + 40):
        x = torch.randint(0, 128, (4, 16))
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())  # the loss line
        loss.backward()
        opt.step()
        opt.zero_grad()
        steps += 1
        prof.step()
        if prof.done:
            break
    assert steps >= prof.total_steps  # more timed steps where a loaded host's noise asks for them
    prof.close()  # (where it asked for more than 40: the report with the steps timed so far)
    prof.step()  # nothing once done
    s, md = prof.summary, prof.report
    assert s["tokens_per_step"] == 64 and s["unprofiled_step_ms"] > 0 and s["steps"] == 2
    assert s["gpu_memory"] == {"missing": "no CUDA device: GPU memory is recorded on CUDA only"}  # no step
    assert md.startswith("# Profile:") or "# Profile:" in md
    assert f"### Lines of {THIS}" in md and "train.py" not in md
    texts = {x["text"] for r in s["lines"]["rows"] for x in r["lines"]}
    assert "loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())  # the loss line" in texts
    rows = {r["region"]: r for r in s["regions"]["rows"]}
    assert rows["MLP"]["ms_per_step"] > 0 and rows["embedding"]["ms_per_step"] > 0  # regions from its names
    for name in ("report.md", "summary.json", "trace.json.gz"):
        assert os.path.isfile(os.path.join(prof.folder, name))
    assert os.path.realpath(out / "latest") == os.path.realpath(prof.folder)


def test_the_function_form_and_a_model_of_none(out):
    model, opt = setup()

    def step():
        x = torch.randint(0, 128, (4, 16))
        nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        opt.step()
        opt.zero_grad()

    result = profiling.profile_steps(step, None, out_dir=out, samples_per_step=4, **FAST)
    assert isinstance(result, profiling.ProfileResult) and os.path.isdir(result.folder)
    assert result.summary["regions"]["parameters"] == 0
    assert "no parameter shapes" in result.report and " · 4 samples/step" in result.report
    assert result.summary["samples_per_step"] == 4 and result.summary["samples_per_s"] > 0


def test_a_loop_shorter_than_the_schedule_warns_and_keeps_nothing_half_written(out):
    model, opt = setup()
    with pytest.warns(UserWarning, match=r"the loop ended after 4 steps.*it takes 10"):
        with profiling.Profiler(model, out_dir=out, **FAST) as prof:
            for _ in range(4):
                model(torch.randint(0, 128, (2, 8))).sum().backward()
                prof.step()
    assert prof.done and prof.report is None and not out.exists()


@pytest.mark.parametrize("kwargs, message", [
    (dict(model=3), "model must be a torch.nn.Module"),
    (dict(model=[nn.Linear(2, 2), "x"]), "model must be a torch.nn.Module"),
    (dict(tokens_per_step=0), "tokens_per_step must be an integer of at least 1"),
    (dict(tokens_per_step=2.5), "tokens_per_step must be an integer"),
    (dict(samples_per_step=0), "samples_per_step must be an integer of at least 1"),
    (dict(flops_per_token=-1), "flops_per_token must be a positive number"),
    (dict(active_steps=0), "active_steps must be an integer of at least 1"),
    (dict(warmup_steps=-1), "warmup_steps must be an integer of at least 0"),
    (dict(timed_steps=0), "timed_steps=0 needs unprofiled_step_ms"),
    (dict(unprofiled_step_ms="fast"), "unprofiled_step_ms must be a positive number"),
    (dict(reference="/no/such/summary.json"), "reference '/no/such/summary.json' is not a file"),
    (dict(metadata=[1]), "metadata must be a dict"),
    (dict(micro_batch=0), "micro_batch must be an integer of at least 1"),
    (dict(memory="yes"), "memory must be True, False or None"),
    (dict(ops="cpu"), 'ops must be "device" .* or "full"'),
])
def test_each_bad_argument_is_named_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        profiling.Profiler(**kwargs)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="step_fn must be a function"):
        profiling.profile_steps(None)


def test_several_models_name_their_parameters_apart():
    from profiling.api import _parameters
    a, b = nn.Linear(2, 3), torch.compile(nn.Linear(3, 4))
    assert _parameters({"enc": a, "dec": b}) == {"enc.weight": [3, 2], "enc.bias": [3], "dec.weight": [4, 3],
                                                 "dec.bias": [4]}
    assert _parameters([a]) == {"weight": [3, 2], "bias": [3]}


def test_module_compile_on_a_module_of_torch_s_own_is_recorded():
    """Module.compile() on an nn.Sequential compiles nothing on torch 2.11 (pytorch/pytorch#150915): the capture
    records which modules it was called on whose forward is torch's own; a class of the user's is not one."""
    from profiling.api import _compile_ignored

    class Mine(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(2, 2))

        def forward(self, x):
            return self.body(x)

    seq, mine, plain = nn.Sequential(nn.Linear(2, 2), nn.ReLU()), Mine(), Mine()
    seq.compile()
    mine.compile()
    mine.body.compile()
    assert _compile_ignored(seq) == ["the model (Sequential)"]
    assert _compile_ignored({"a": mine, "b": plain}) == ["body (Sequential)"]
    assert _compile_ignored(plain) == [] and _compile_ignored(None) == []


def test_graphs_compiled_before_the_profiler_are_named_in_the_lines_note():
    table = lines._compiled_before({"rows": [], "missing": "no record", "notes": []},
                                   {"compiled_before_profiler": 2})
    md = "\n".join(render._lines({"lines": table, "step_ms": 1.0}))
    assert "2 compiled graphs were made before profiling.Profiler was created" in md


def test_importing_profiling_does_not_import_torch():
    code = "import sys, profiling; profiling.ProfileResult; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_the_readme_example_runs_as_written(tmp_path):
    """README's "Add --profile to your own training script": the block, saved as mytrain.py, run with and
    without --profile."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Add --profile to your own training script")[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert block.startswith("# mytrain.py")
    (tmp_path / "mytrain.py").write_text(block)
    env = dict(os.environ, PYTHONPATH=ROOT, AUTORESEARCH_PROFILE_DIR=str(tmp_path / "profiles"))
    run = subprocess.run([sys.executable, "mytrain.py", "--profile"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "# Profile:" in run.stdout and "### Lines of mytrain.py" in run.stdout
    assert (tmp_path / "profiles" / "latest" / "report.md").is_file()
    plain = subprocess.run([sys.executable, "mytrain.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
    assert plain.returncode == 0 and plain.stdout == ""


def test_without_model_flops_mfu_comes_from_the_traces_own_flops():
    """h100-plant26-baseline with its flops_per_step removed (as a Profiler without flops_per_token writes it):
    MFU from the GEMM and attention FLOPs the trace's shapes give, near the model-FLOPs figure (40.5%), and
    labelled as such."""
    from profiling.profile.report.summary import load_trace, summarize
    trace = load_trace(os.path.join(ROOT, "tests", "data", "h100-plant26-baseline.trace.json.gz"))
    model = summarize(trace)["mfu_percent"]
    trace["autoresearch"].pop("flops_per_step")
    s = summarize(trace)
    assert s["mfu_basis"] == "trace" and 0.85 * model < s["mfu_percent"] < model
    assert f"MFU {s['mfu_percent']:.1f}% (the trace's GEMM and attention FLOPs" in render.to_markdown(s)
