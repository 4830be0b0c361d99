"""Regions from torch's module scopes (profiling/profile/tables/regions.py `Modules`): a plain torch.profiler trace
(with_stack=True, no parameter metadata) of a small GPT-style model of this test's own, recorded on the CPU."""
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule

from profiling.profile.report import render
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.tables import regions


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in self.qkv(x).split(d, dim=2))
        return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))


class MLP(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = (torch.nn.LayerNorm(d), CausalSelfAttention(d, heads),
                                                   torch.nn.LayerNorm(d), MLP(d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Tiny(torch.nn.Module):
    def __init__(self, vocab=128, d=64, heads=4, layers=2):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))

    def forward(self, idx):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return x @ self.tok.weight.t()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain") / "trace.json"
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters())
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(4):
            idx = torch.randint(0, 128, (4, 32))
            F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return load_trace(str(path))


def test_a_plain_trace_gets_regions_from_its_module_scopes(trace):
    s = summarize(trace)
    assert s["recorded"]["stacks"] and s["recorded"]["by"] == "torch.profiler"
    table = s["regions"]
    rows = {r["region"]: r for r in table["rows"]}
    for region in ("attention", "MLP", "norms and residuals"):
        # forward by the scopes around the operator, backward through the autograd sequence number
        assert rows[region]["forward_ms"] > 0 and rows[region]["backward_ms"] > 0, region
    assert rows["embedding"]["ms_per_step"] > 0
    assert table["notes"] == [regions.BY_MODULES]
    assert table["attributed_percent"] >= 70
    assert "placed by the nn.Module it ran in" in render.to_markdown(s)


def test_without_module_scopes_the_same_trace_leaves_its_gemms_unattributed(trace):
    bare = dict(trace, traceEvents=[e for e in trace["traceEvents"] if e.get("cat") != "python_function"],
                with_stack=0)
    s = summarize(bare)
    assert s["regions"]["notes"] == [regions.NO_PARAMETERS]
    assert s["regions"]["attributed_percent"] < summarize(trace)["regions"]["attributed_percent"]


def scope(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "python_function", "name": f"nn.Module: {name}", "ts": ts, "dur": dur, "tid": tid}


def op(name, ts, tid=1, seq=None):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": 1, "tid": tid,
            "args": {} if seq is None else {"Sequence number": seq}}


def test_modules_innermost_named_first_and_backward_through_the_sequence_number():
    fwd_mm, inner_mm, outside = op("aten::mm", 12, seq=7), op("aten::mm", 22, seq=8), op("aten::add", 95)
    node = op("autograd::engine::evaluate_function: MmBackward0", 200, tid=2, seq=7)
    grad = op("aten::mm", 201, tid=2)
    scopes = [scope("Net_0", 0, 100), scope("MLP_0", 10, 20), scope("Linear_0", 11, 5),
              scope("CausalSelfAttention_1", 20, 10), scope("Linear_3", 21, 5)]
    m = regions.Modules(scopes, [fwd_mm, inner_mm, outside, node, grad], {id(grad): node})
    assert m.region(fwd_mm) == "MLP"           # Linear names nothing: the MLP around it does
    assert m.region(inner_mm) == "attention"   # the scope opened last is the innermost
    assert m.region(outside) is None           # inside Net only
    assert m.region(grad) == "MLP"             # its node's sequence number 7 is fwd_mm's
