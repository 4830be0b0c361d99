"""Whose code a line is (profiling/profile/trace/whose.py, issue #41): the script's folder whatever the cwd, more
roots through Profiler(code_roots=...), and installed model code shown as its library's lines -- a fake
installed package driven through a framework-like entry, and a real transformers Llama in a plain loop."""
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

import profiling
from profiling.profile.capture import provenance
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.tables.lines import Provenance
from profiling.profile.trace import whose

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS = "tests/profile/test_whose.py"
FAST = dict(warmup_steps=1, timed_steps=2, active_steps=2)
SITE = "/venv/lib/python3.11/site-packages/"


@pytest.mark.parametrize("path, function, kind", [
    (SITE + "transformers/models/llama/modeling_llama.py", "apply_rotary_pos_emb", whose.MODEL),
    (SITE + "timm/models/resnet.py", "forward", whose.MODEL),           # a module's forward, any file name
    (SITE + "torchvision/models/resnet.py", "forward", whose.MODEL),
    (SITE + "timm/models/resnet.py", "_create_resnet", None),           # a helper outside modeling_*.py
    (SITE + "transformers/trainer.py", "train", None),                  # the framework's loop
    (SITE + "transformers/integrations/sdpa_attention.py", "sdpa_attention_forward", None),
    (SITE + "torch/nn/modules/linear.py", "forward", None),             # torch's own modules
    (SITE + "torch/_dynamo/eval_frame.py", "_fn", None),
    (SITE + "lightning/pytorch/overrides/base.py", "forward", None),    # a framework's wrapper
    ("/proj/train.py", "main", whose.USER),
    ("/proj/.venv/lib/python3.11/site-packages/timm/layers/mlp.py", "forward", whose.MODEL),
    ("/elsewhere/train.py", "main", None),
    ("<string>", "forward", None),
])
def test_kinds(path, function, kind):
    assert whose.Code(["/proj"]).kind(path, function) == kind


def test_names_are_relative_to_the_deepest_root_or_the_package():
    code = whose.Code(["/proj", "/proj/src"])
    assert code.name("/proj/src/model.py") == "model.py" and code.name("/proj/train.py") == "train.py"
    assert code.name(SITE + "transformers/models/llama/modeling_llama.py") == \
        "transformers/models/llama/modeling_llama.py"
    assert code.name("/elsewhere/lib/x.py") == "lib/x.py" and code.name("<string>") == "<string>"
    assert code.label("/proj/train.py", 3, "main") == "train.py:3 main"


def test_the_script_root_is_the_scripts_folder_not_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    main = types.ModuleType("__main__")
    main.__file__ = str(tmp_path / "train.py")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.chdir(ROOT)
    assert whose.script_root() == os.path.realpath(tmp_path)
    main.__file__, main.__spec__ = str(tmp_path / "pkg" / "train.py"), types.SimpleNamespace(name="pkg.train")
    assert whose.script_root() == os.path.realpath(tmp_path)  # python -m pkg.train: the folder holding pkg
    del main.__file__  # an interactive session, python -c
    monkeypatch.setattr(sys, "argv", ["-c"])
    assert whose.script_root() == ROOT
    main.__file__ = os.path.join(os.path.dirname(sys.executable), "pytest")  # a launcher: the cwd
    assert whose.script_root() == ROOT


def test_code_roots_are_checked_and_added(tmp_path):
    for bad in ("src", [str(tmp_path / "missing")], [3]):
        with pytest.raises(ValueError, match="code_roots"):
            profiling.Profiler(code_roots=bad)
    try:
        assert whose.use([tmp_path]) == [str(tmp_path)] and str(tmp_path) in whose.current().roots
    finally:
        whose.use(None)
    assert str(tmp_path) not in whose.current().roots


def test_a_compiled_kernel_lands_on_the_installed_models_line_not_torchs_nor_the_loops(tmp_path):
    model = SITE + "transformers/models/llama/modeling_llama.py"
    frames = [(SITE + "torch/nn/modules/linear.py", 125, "forward", "return F.linear(x)"),
              (model, 160, "forward", "down_proj = self.down_proj(x)"),
              (SITE + "transformers/trainer.py", 3000, "training_step", "loss = self.compute_loss()"),
              (str(tmp_path / "train.py"), 12, "<module>", "trainer.train()")]
    c = provenance.Collector(str(tmp_path), running=False)
    c.emit(types.SimpleNamespace(metadata={"inductor_output_code": {}},
                                 payload="# [Provenance debug handles] extern_kernels.mm:1\n"))
    trace = "".join(f'  File "{p}", line {n}, in {fn}\n    {t}\n' for p, n, fn, t in reversed(frames))
    c.emit(types.SimpleNamespace(metadata={"artifact": {"name": provenance.STACKS}},
                                 payload=json.dumps({"extern_kernels.mm:1": [trace]})))
    c.emit(types.SimpleNamespace(metadata={"artifact": {"name": "fx_graph_cache_miss"}},
                                 payload='{"key": "k"}'))
    record = c.result()
    assert {f[0]: f[4] for f in record["frames"]} == {
        "torch/nn/modules/linear.py": False, "transformers/models/llama/modeling_llama.py": True,
        "transformers/trainer.py": False, "train.py": True}
    assert Provenance(record).graphs["k"][0][0][1] == (("transformers/models/llama/modeling_llama.py", 160),)


SCRIPT = '''
import json, sys
import torch, torch.nn as nn
import profiling

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
prof = profiling.Profiler(model, out_dir=sys.argv[1], warmup_steps=1, timed_steps=2, active_steps=2)
while not prof.done:
    loss = model(torch.randn(64, 32)).square().mean()  # the loss line
    loss.backward()
    opt.step()
    opt.zero_grad()
    prof.step()
print(json.dumps({"rows": prof.summary["lines"]["rows"]}))
'''


@pytest.mark.slow
def test_a_script_run_from_another_folder_has_its_lines(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "run_me.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, str(project / "run_me.py"), str(tmp_path / "profiles")],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    assert {x["file"] for r in rows for x in r["lines"]} == {"run_me.py"}
    assert "loss = model(torch.randn(64, 32)).square().mean()  # the loss line" in \
        {x["text"] for r in rows for x in r["lines"]}


FOO = '''
import torch.nn as nn
from somelib.layers import Block


class FooModel(nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.block = Block(width)

    def forward(self, x):
        h = self.embed(x).relu()  # foo embed
        return self.block(h)
'''
LAYERS = '''
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return self.down(self.up(x).tanh())  # block mlp
'''
TRAINER = '''
import torch


class Trainer:
    """A framework's loop: the user calls train(), it calls the model and the callback."""

    def __init__(self, model, callback):
        self.model, self.callback = model, callback
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(self):
        while not self.callback.done:
            loss = self.model(torch.randn(256, 128)).square().mean()  # the model's matmuls outweigh the step
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            self.callback.step()
'''


@pytest.fixture
def somelib(tmp_path, monkeypatch):
    """A fake installed package: site-packages/somelib, with modeling_foo.py, layers.py and trainer.py."""
    lib = tmp_path / "venv" / "site-packages" / "somelib"
    lib.mkdir(parents=True)
    for name, text in (("__init__", ""), ("modeling_foo", FOO), ("layers", LAYERS), ("trainer", TRAINER)):
        (lib / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(lib.parent))
    monkeypatch.chdir(ROOT)  # under pytest the cwd is the user's folder: this file is the user's code
    yield
    for name in [m for m in sys.modules if m == "somelib" or m.startswith("somelib.")]:
        del sys.modules[name]


def test_an_installed_models_lines_replace_the_framework_entry(somelib, tmp_path):
    from somelib.modeling_foo import FooModel
    from somelib.trainer import Trainer

    torch.manual_seed(0)
    model = FooModel()
    prof = profiling.Profiler(model, out_dir=tmp_path / "profiles", **FAST)
    Trainer(model, prof).train()  # the user's only line
    rows = prof.summary["lines"]["rows"]
    time_in = {}
    for r in rows:
        for x in r["lines"]:
            time_in[x["file"]] = time_in.get(x["file"], 0.0) + r["ms_per_step"] / len(r["lines"])
    texts = {x["text"] for r in rows for x in r["lines"]}
    assert "h = self.embed(x).relu()  # foo embed" in texts
    assert "return self.down(self.up(x).tanh())  # block mlp" in texts
    assert "somelib/trainer.py" not in time_in
    model_ms = time_in["somelib/modeling_foo.py"] + time_in["somelib/layers.py"]
    assert model_ms > time_in.get(THIS, 0.0), time_in  # the forward and its backward: the model's lines, not train()
    assert "somelib/modeling_foo.py" in prof.report
    trace = load_trace(os.path.join(prof.folder, "trace.json.gz"))  # research profile: the same lines
    assert trace["autoresearch"]["code_roots"] == [ROOT]
    assert [r["where"] for r in summarize(trace)["lines"]["rows"]] == [r["where"] for r in rows]


@pytest.mark.slow
def test_a_transformers_llama_in_a_plain_loop_shows_modeling_llama_lines(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                      max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = profiling.Profiler(model, out_dir=tmp_path / "profiles", **FAST)
    while not prof.done:
        x = torch.randint(0, 64, (2, 16))
        model(input_ids=x, labels=x).loss.backward()  # the user's line
        opt.step()
        opt.zero_grad()
        prof.step()
    rows = prof.summary["lines"]["rows"]
    llama = "transformers/models/llama/modeling_llama.py"
    on_llama = sum(r["ms_per_step"] for r in rows if any(x["file"] == llama for x in r["lines"]))
    on_this = sum(r["ms_per_step"] for r in rows if any(x["file"] == THIS for x in r["lines"]))
    assert on_llama > on_this
    texts = {x["text"] for r in rows for x in r["lines"] if x["file"] == llama}
    assert any("self.down_proj(" in t for t in texts) and any("attention_interface(" in t for t in texts)
