"""profiling.profile.tables.lines and profiling.profile.capture.provenance: the step by source line ("Lines of train.py"), on a real trace of
our GPT compiled on the CPU with its source-line record, variants of it (a graph without a record, a call
recorded twice), older traces without a record, and the collector fed the structured-trace records inductor
emits (a slow test compiles for real)."""
import copy
import json
import os
import subprocess
import sys
import types

import pytest

from profiling.profile.capture import provenance
from profiling.profile.report.render import to_json, to_markdown
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.tables import lines
from profiling.profile.trace.classify import CATEGORIES
from profiling.profile.trace.traceio import by_thread, index, parents

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
CPU_COMPILED = os.path.join(DATA, "cpu-compiled-gpt-2steps.trace.json.gz")
CPU_EAGER = os.path.join(DATA, "cpu-gpt-2steps.trace.json.gz")
H200 = os.path.join(DATA, "h200-default-gpt-5steps.trace.json.gz")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP_LINE = "return self.c_proj(F.relu(self.c_fc(x)).square())"


@pytest.fixture(scope="module")
def trace():
    return load_trace(CPU_COMPILED)


@pytest.fixture(scope="module")
def cpu(trace):
    return summarize(trace)


def line_of(text, trace=None):
    """The line number of a line of train.py's source text, as the fixture's record has it (train.py was
    another version when the fixture was made, so its line numbers are the record's, not today's file's)."""
    frames = (trace or load_trace(CPU_COMPILED))["autoresearch"]["provenance"]["frames"]
    return next(line for file, line, _, source, _ in frames if file == "train.py" and source == text)


# ---------------------------------------------------------------------------------------------------------
# The real CPU trace: our GPT compiled, 2 steps
# ---------------------------------------------------------------------------------------------------------

def test_compiled_calls_are_all_placed_and_only_eager_work_is_not(cpu):
    table = cpu["lines"]
    assert table["missing"] is None and table["graphs"] == 2  # forward and backward
    ops_ms = sum(cpu["categories"].get(c, 0.0) for c in CATEGORIES)  # communication only where there is some
    assert table["placed_ms"] + table["unplaced_ms"] == pytest.approx(ops_ms, abs=1e-3)
    assert table["placed_percent"] == pytest.approx(100 * table["placed_ms"] / ops_ms, abs=1e-3)
    assert 30 < table["placed_percent"] < 70  # on the CPU the optimizer runs eager: about half of the step
    assert {u["reason"] for u in table["unplaced"]} == {"eager (outside the compiled graphs)"}
    assert {u["name"] for u in table["unplaced"]} >= {"aten::mul", "aten::bmm"}  # Muon's Polar Express


def test_rows_add_up_and_never_count_a_kernel_twice(trace, cpu, monkeypatch):
    assert len(cpu["lines"]["rows"]) == lines.TOP < cpu["lines"]["rows_total"]
    monkeypatch.setattr(lines, "TOP", 1000)
    table = summarize(trace)["lines"]
    rows = table["rows"]
    assert table["rows_total"] == len(rows)
    assert sum(r["ms_per_step"] for r in rows) == pytest.approx(table["placed_ms"], abs=1e-3)
    assert len({r["where"] for r in rows}) == len(rows)
    assert [r["ms_per_step"] for r in rows] == sorted((r["ms_per_step"] for r in rows), reverse=True)
    for r in rows:
        assert r["forward_ms"] + r["backward_ms"] == pytest.approx(r["ms_per_step"], abs=2e-4)
        assert r["pct_of_step"] == pytest.approx(100 * r["ms_per_step"] / cpu["step_ms"], abs=1e-3)
        assert r["fused"] == (len(r["lines"]) > 1)
        assert all(x["file"] == "train.py" and x["text"] for x in r["lines"])
    assert table["files"] == {"train.py": pytest.approx(table["placed_ms"], abs=1e-3)}


def test_the_mlp_line_is_on_top_with_its_backward(cpu):
    top = cpu["lines"]["rows"][0]
    mlp = line_of(MLP_LINE)
    assert top["where"] == f"train.py:{mlp}" and not top["fused"]
    assert top["lines"] == [{"file": "train.py", "line": mlp, "text": MLP_LINE}]
    assert 0 < top["forward_ms"] < top["backward_ms"]  # backward kernels land on the line they differentiate
    assert top["top_kernel"] == "aten::mm"


def test_projection_and_loss_lines_are_placed(cpu):
    rows = {r["where"]: r for r in cpu["lines"]["rows"]}
    q = line_of("q = self.c_q(x).view(B, T, self.n_head, self.head_dim)")
    assert rows[f"train.py:{q}"]["backward_ms"] > 0
    loss = line_of("return head_loss(x.view(-1, x.size(-1)), self.lm_head.weight, targets.view(-1), reduction)")
    head = [r for r in rows.values() if any(x["line"] == loss for x in r["lines"])]
    assert head and head[0]["forward_ms"] > 0 and head[0]["backward_ms"] > 0


def test_markdown_section(cpu):
    md = to_markdown(cpu)
    section = md.split("### Lines of train.py")[1].split("## 2.")[0]
    assert f"| train.py:{line_of(MLP_LINE)} " in section
    assert "| line " in section and "| forward ms " in section and "| backward ms " in section
    assert section.count("\n| train.py:") == 8  # the top 8
    assert "% of operator time placed on source lines" in section
    assert "not placed: " in section and "eager (outside the compiled graphs)" in section
    assert ", fused |" in section


def test_json_has_the_lines(cpu):
    data = json.loads(to_json(cpu))
    assert data["lines"]["rows"][0]["where"] == cpu["lines"]["rows"][0]["where"]


# ---------------------------------------------------------------------------------------------------------
# Variants: a graph without a record, a call recorded more often than made; traces without a record
# ---------------------------------------------------------------------------------------------------------

def test_a_graph_without_a_record_is_not_placed_and_says_so(trace):
    t = copy.deepcopy(trace)
    graphs = t["autoresearch"]["provenance"]["graphs"]
    graphs[1]["key"] = "not-this-one"  # the backward graph's calls now match no record
    table = summarize(t)["lines"]
    assert all(r["backward_ms"] == 0 for r in table["rows"])
    reasons = {u["reason"] for u in table["unplaced"]}
    assert "a compiled graph without a source-line record" in reasons


def test_a_call_recorded_twice_is_not_guessed(trace, cpu):
    t = copy.deepcopy(trace)
    kernels = t["autoresearch"]["provenance"]["graphs"][0]["kernels"]
    i = next(i for i, (name, _) in enumerate(kernels) if name == "extern_kernels.mm")
    kernels.insert(i, ["extern_kernels.mm", kernels[-1][1]])  # an extra mm call site, from another line
    table = summarize(t)["lines"]
    assert any("`aten::mm` called" in u["reason"] for u in table["unplaced"])
    assert table["placed_ms"] < cpu["lines"]["placed_ms"]


def record_from_calls(trace):
    """A source-line record made from a trace's own graph calls: each graph's calls as its first call ran
    them, named as inductor names them, every name on a line of its own (`train.py:N`, text: the name)."""
    ix = index(trace["traceEvents"])
    threads = by_thread(ix.cpu_ops)
    calls = lines.Calls(ix.graph_calls, threads, parents(threads), lines.Provenance({}))
    graphs, frames, ids = {}, [], {}
    for e in sorted(ix.graph_calls, key=lambda e: e["ts"]):
        key = lines.GRAPH_CALL.match(e["name"]).group(1)
        if key in graphs:
            continue
        graphs[key] = []
        for op in calls._tops(e):
            name = str(op["name"])
            if name in ("aten::mm", "aten::bmm"):
                name = "extern_kernels." + name[6:]
            elif "::" in name:
                name = "torch.ops." + name.replace("::", ".") + ".default"
            if name not in ids:
                ids[name] = len(frames)
                frames.append(["train.py", len(frames) + 1, "f", name, True])
            graphs[key].append([name, [ids[name]]])
    return {"version": 1, "frames": frames, "stacks": [[i] for i in range(len(frames))],
            "graphs": [{"key": k, "kernels": v} for k, v in graphs.items()], "without": 0}


def test_gpu_trace_every_kernel_of_a_compiled_graph_is_placed():
    """The H200 trace's structure (Triton kernels' own records, cuBLAS GEMMs under aten::mm, the backward on
    the autograd thread) with a record matching its graphs: all device time inside graph calls is placed."""
    t = load_trace(H200)
    t["autoresearch"] = dict(t["autoresearch"], provenance=record_from_calls(t))
    s = summarize(t)
    table = s["lines"]
    assert table["graphs"] == 9 and table["placed_percent"] > 99.7
    assert {u["reason"] for u in table["unplaced"]} == {"eager (outside the compiled graphs)"}
    assert table["placed_ms"] + table["unplaced_ms"] == pytest.approx(s["device_ms"], abs=1e-3)
    rows = {r["lines"][0]["text"]: r for r in table["rows"]}
    assert rows["extern_kernels.mm"]["forward_ms"] > 0 and rows["extern_kernels.mm"]["backward_ms"] > 0
    flex_bwd = [r for text, r in rows.items() if "flex_attention_backward" in text]
    assert flex_bwd and all(r["forward_ms"] == 0 and r["backward_ms"] > 0 for r in flex_bwd)


@pytest.mark.parametrize("path", [H200, CPU_EAGER])
def test_traces_without_a_record_still_work(path):
    s = summarize(load_trace(path))
    assert s["lines"]["rows"] == [] and "train.py --profile" in s["lines"]["missing"]
    assert "### Source lines\nnot available: no source-line record" in to_markdown(s)


def test_an_eager_run_says_nothing_was_compiled(trace):
    t = copy.deepcopy(trace)
    t["autoresearch"]["provenance"]["graphs"] = []
    assert "the model ran eager" in summarize(t)["lines"]["missing"]


@pytest.mark.parametrize("name, op", [
    ("extern_kernels.mm", "aten::mm"), ("extern_kernels.bmm", "aten::bmm"),
    ("torch.ops.aten._scaled_dot_product_cudnn_attention.default", "aten::_scaled_dot_product_cudnn_attention"),
    ("torch.ops.autoresearch.window_attention.default", "autoresearch::window_attention"),
    ("autoresearch.window_attention_backward.default", "autoresearch::window_attention_backward"),
    ("triton_poi_fused_mul_pow_relu_3", "triton_poi_fused_mul_pow_relu_3"),
    ("graph_0_cpp_fused_pow_relu_0", "cpp_fused_pow_relu_0"),
])
def test_canonical_names(name, op):
    assert lines.canonical(name) == op


@pytest.mark.parametrize("group, text", [
    ([("train.py", 427)], "train.py:427"),
    ([("train.py", 427), ("train.py", 426)], "train.py:426-427"),
    ([("train.py", 88), ("train.py", 408), ("train.py", 409), ("train.py", 410), ("prepare.py", 5)],
     "train.py:88,408-410; prepare.py:5"),
])
def test_where(group, text):
    assert lines.where(group) == text


# ---------------------------------------------------------------------------------------------------------
# The collector, fed the records inductor emits on the structured-trace logger
# ---------------------------------------------------------------------------------------------------------

def record(metadata, payload=None):
    return types.SimpleNamespace(metadata=metadata, payload=payload)


def artifact(name, payload):
    return record({"artifact": {"name": name, "encoding": "json"}}, payload)


def stack(*frames):
    return "".join(f'  File "{path}", line {n}, in {fn}\n    {text}\n' for path, n, fn, text in frames)


def test_collector_keeps_each_graphs_own_calls_in_call_order(tmp_path):
    root = str(tmp_path)
    own = os.path.join(root, "train.py")
    lib = "/usr/lib/python3/site-packages/torch/nn/functional.py"
    c = provenance.Collector(root)
    code = "# [Provenance debug handles] extern_kernels.mm:7\n        # [Provenance debug handles] triton_poi_0:6\n"
    stale = stack((own, 1, "f", "stale()"))
    table = {"triton_poi_0:1": [stale],  # left in inductor's table by an earlier graph
             "triton_poi_0:6": [stack((own, 427, "forward", "y = relu(x)"), (lib, 9, "relu", "..."))],
             "extern_kernels.mm:7": [stack((own, 426, "forward", "x = w(x)"))]}
    c.emit(record({"inductor_output_code": {"filename": "x.py"}}, code))
    c.emit(artifact(provenance.STACKS, json.dumps(table)))
    c.emit(artifact("fx_graph_cache_miss", json.dumps({"key": "fabc", "components": ["..."]})))
    r = c.result()
    assert [g["key"] for g in r["graphs"]] == ["fabc"]
    kernels = r["graphs"][0]["kernels"]
    assert [k[0] for k in kernels] == ["triton_poi_0", "extern_kernels.mm"]  # by handle, stale one gone
    frames = [[r["frames"][i] for i in r["stacks"][s]] for s in kernels[0][1]]
    assert frames == [[["torch/nn/functional.py", 9, "relu", "...", False],
                       ["train.py", 427, "forward", "y = relu(x)", True]]]  # innermost first


def test_collector_counts_graphs_cached_without_a_record(tmp_path):
    c = provenance.Collector(str(tmp_path))
    c.emit(record({"inductor_output_code": {}}, "no handles here"))
    c.emit(artifact(provenance.STACKS, None))  # a cache entry made without provenance
    c.emit(artifact("fx_graph_cache_hit", json.dumps({"key": "fdef"})))
    c.emit(record({"chromium_event": {}}, "{}"))  # others pass by
    c.emit(artifact("fx_graph_cache_hit", "not json"))  # never raises
    c.emit(artifact("fx_graph_cache_miss", json.dumps({"key": "fghi"})))  # a lookup before a compile
    assert c.result()["graphs"] == [] and c.result()["without"] == 1


def test_result_is_none_before_start(monkeypatch):
    monkeypatch.setattr(provenance, "_collector", None)
    assert provenance.result() is None
    monkeypatch.setenv("AUTORESEARCH_PROVENANCE", "0")
    provenance.start()
    assert provenance.result() is None


COMPILE_SCRIPT = """
import json, os, sys
import torch
from profiling.profile.capture import provenance
provenance.start()

def f(x, w):
    h = torch.relu(x @ w)
    return (h * h).sum()

x, w = torch.randn(8, 16), torch.randn(16, 16, requires_grad=True)
torch.compile(f)(x, w).backward()
print(json.dumps(provenance.result()))

def g(x):
    if x.sum() > 0:  # a data-dependent branch: a graph break
        x = x + 1
    return x * 2

torch.compile(g)(torch.ones(4))
print(json.dumps(provenance.result()))
"""


@pytest.mark.slow
def test_a_real_compile_records_forward_and_backward(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(COMPILE_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r, after = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    assert len(r["graphs"]) == 2 and r["without"] == 0 and r["breaks"] == []  # forward, backward
    (stack, count), = after["breaks"]
    innermost = after["frames"][after["stacks"][stack][0]]
    branch = "if x.sum() > 0:  # a data-dependent branch: a graph break"
    line = [x.strip() for x in COMPILE_SCRIPT.splitlines()].index(branch) + 1
    assert innermost[:4] == ["tiny.py", line, "g", branch] and count == 1
    fwd, bwd = ([lines.canonical(name) for name, _ in g["kernels"]] for g in r["graphs"])
    assert fwd[0] == "aten::mm" and bwd.count("aten::mm") == 1  # dw = x.T @ dh (x needs no gradient)
    texts = {(f[0], f[3]) for f in r["frames"]}
    assert ("tiny.py", "h = torch.relu(x @ w)") in texts
    for g in r["graphs"]:
        for _, ids in g["kernels"]:
            assert ids and all(r["frames"][r["stacks"][i][0]][0] == "tiny.py" for i in ids)


# ---------------------------------------------------------------------------------------------------------
# A real H100 trace: the default config compiled with the record (2 steps)
# ---------------------------------------------------------------------------------------------------------
# h100-lines-gpt-2steps: `train.py --profile` at commit 5c9a76d on an H100 with inductor's provenance on; its
# record was built by replaying the same compile's structured trace (TORCH_TRACE) through
# provenance.Collector, the records the in-process handler receives (tests/data/replay_provenance.py).

H100_LINES = os.path.join(DATA, "h100-lines-gpt-2steps.trace.json.gz")


@pytest.fixture(scope="module")
def h100_lines():
    trace = load_trace(H100_LINES)
    return trace, summarize(trace)


def test_h100_default_config_places_at_least_90_percent(h100_lines):
    _, s = h100_lines
    table = s["lines"]
    assert table["placed_percent"] >= 90.0
    assert {u["reason"] for u in table["unplaced"]} <= {"eager (outside the compiled graphs)"}
    assert table["files"].keys() == {"train.py"}


def test_h100_top_lines_are_the_mlp_attention_and_loss(h100_lines):
    trace, s = h100_lines
    rows = s["lines"]["rows"]
    texts = [" · ".join(x["text"] for x in r["lines"]) for r in rows]
    assert rows[0]["lines"] == [{"file": "train.py", "line": line_of(MLP_LINE, trace), "text": MLP_LINE}]
    assert rows[0]["backward_ms"] > rows[0]["forward_ms"] > 30
    assert "window_attention" in texts[1] and rows[1]["backward_ms"] > 30  # attention's backward, next
    loss = next(i for i, t in enumerate(texts) if t.startswith("return (grad @ weight) * scale"))
    assert loss < 5 and rows[loss]["backward_ms"] > 10 > rows[loss]["forward_ms"]  # the head's gradient GEMMs:
    # backward work the compiler runs in the forward graph, counted as backward (as the region table does)
