"""An optimizer updating tensor by tensor (issue #56 item 2, a mechanism): AdamW(foreach=False) over a deep MLP's 98
parameter tensors (as CPU tensors get by default: foreach is CUDA's default only) is named as such, with fused=True
as its fix and a price from its own annotation; foreach=True and fused=True are not. Real captures on the CPU
through the public API."""
import os

import pytest
import torch
import torch.nn as nn

import profiling

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def profile(out, **adamw):
    torch.manual_seed(0)
    blocks = [m for _ in range(24) for m in (nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU())]
    model = nn.Sequential(*blocks, nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **adamw)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step():
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return profiling.profile_steps(step, model, out_dir=out, warmup_steps=2, timed_steps=3, active_steps=3)


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    return tmp_path / "profiles"


def test_a_tensor_by_tensor_update_is_named_with_its_fix(out):
    summary = profile(out, foreach=False).summary
    (f,) = [f for f in summary["findings"] if f["kind"] == "per_tensor_optimizer"]
    assert "`Optimizer.step#AdamW.step`" in f["evidence"] and "98 parameter tensors" in f["evidence"]
    assert f["fix"].startswith("AdamW(..., fused=True)")
    assert 0 < f["ms_per_step"] < summary["step_ms"]
    eager = [u for u in summary["unknown"] if u["rule"] == "eager_code"]  # on the CPU, named and not priced
    assert not eager or "the optimizer" not in eager[0]["what"]  # its chains are not counted twice


@pytest.mark.parametrize("option", ["foreach", "fused"])
def test_a_foreach_or_fused_update_is_not(out, option):
    summary = profile(out, **{option: True}).summary
    assert not [f for f in summary["findings"] if f["kind"] == "per_tensor_optimizer"]


@pytest.mark.parametrize("name", ["cpu-closure-lightning", "cpu-closure-lbfgs", "cpu-closure-sgd",
                                  "cpu-lightning-sequential"])
def test_a_closure_or_a_waiting_host_is_not_priced_as_the_update(data_summary, name):
    """Lightning's and L-BFGS's closures run forward and backward inside `Optimizer.step#`: cut out of its window,
    they are no update's cost; a host whose threads wait for cores (the Lightning MLP's 6 tensors, 31 ms a step in
    its annotation) is priced at most what the update's calls take on a healthy host, under any finding's floor."""
    assert not [f for f in data_summary(name)["findings"] if f["kind"] == "per_tensor_optimizer"]
