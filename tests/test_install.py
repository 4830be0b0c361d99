"""The package installed into another project: a fresh virtual environment with only what the profiler needs
(the trainer's dependencies stay out), then a small trainer of its own, not train.py's model, profiled through
the public API (profiling.Profiler). Needs uv (CI installs it); torch comes from uv's cache, pinned to the
version running here."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UV = shutil.which("uv") or os.path.expanduser("~/.local/bin/uv")

TRAINER = '''
import sys

import torch
import torch.nn as nn

import profiling


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ffn = nn.Sequential(nn.Linear(width, 2 * width), nn.SiLU(), nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.ffn(self.norm(x))


class Tagger(nn.Module):
    def __init__(self, vocab=64, width=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(2))
        self.classifier = nn.Linear(width, vocab)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.classifier(h)


if sys.argv[1:] == ["bad"]:
    try:
        profiling.Profiler(Tagger(), tokens_per_step=-5)
    except ValueError as e:
        print(f"refused: {e}")
    sys.exit(0)
torch.manual_seed(0)
model = Tagger()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
prof = profiling.Profiler(model, tokens_per_step=8 * 16, warmup_steps=1, timed_steps=2, active_steps=2)
while not prof.done:
    x = torch.randint(0, 64, (8, 16))
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    prof.step()
print(prof.report)
'''


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not os.path.exists(UV):
        pytest.skip("needs uv (CI installs it)")
    where = tmp_path_factory.mktemp("elsewhere")
    env_dir = where / "venv"
    subprocess.run([UV, "venv", "-q", str(env_dir), "--python", sys.executable], check=True)
    python = str(env_dir / "bin" / "python")
    version = torch.__version__.split("+")[0]
    subprocess.run([UV, "pip", "install", "-q", "--python", python, ROOT, f"torch=={version}"], check=True,
                   timeout=900)
    return where, python


def test_the_package_installs_without_the_trainers_dependencies(venv):
    where, python = venv
    code = textwrap.dedent("""
        import importlib.util, profiling
        for m in ("rustbpe", "tiktoken", "pyarrow", "requests", "matplotlib", "cudnn", "prepare"):
            assert importlib.util.find_spec(m) is None, m
        assert importlib.util.find_spec("profiling.runner") is None  # train.py's plumbing stays here
        import tabulate, orjson
        print(profiling.__file__)
    """)
    out = subprocess.run([python, "-c", code], cwd=where, capture_output=True, text=True, check=True).stdout
    assert "site-packages" in out and ROOT not in out
    help_text = subprocess.run([os.path.join(os.path.dirname(python), "research"), "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "profile" in help_text


def test_a_trainer_of_its_own_is_profiled_through_the_api(venv):
    where, python = venv
    (where / "tagger.py").write_text(TRAINER)
    env = dict(os.environ, AUTORESEARCH_PROFILE_DIR=str(where / "profiles"))
    env.pop("PYTHONPATH", None)
    run = subprocess.run([python, "tagger.py"], cwd=where, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    md = run.stdout
    assert "### Lines of tagger.py" in md and "train.py" not in md
    # its own lines, the innermost of its files that called the operators
    assert "| tagger.py:17, eager | `return x + self.ffn(self.norm(x))`" in md and "tagger.py:48, eager" in md
    assert "| MLP " in md and "| embedding " in md and "| head and loss " in md  # its regions, by its names
    assert os.path.isfile(where / "profiles" / "latest" / "report.md")
    bad = subprocess.run([python, "tagger.py", "bad"], cwd=where, env=env, capture_output=True, text=True)
    assert bad.stdout.strip() == "refused: tokens_per_step must be an integer of at least 1, not -5"
