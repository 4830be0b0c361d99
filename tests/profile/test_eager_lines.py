"""tables/eager_lines, trace/eager_ops and capture/eager_record: the lines of eager operators, from one more
recorded step.

A real capture on the CPU (profiling.profile.capture.window.capture) of a small eager model defined here: an MLP, a
custom autograd.Function, a loss, AdamW; 2 warm-up + 2 active steps, then the line-record step. Its "Lines"
table must place the operators on this file's lines, backward ones on their forward lines, and a step whose
sequence of operators differs from the recorded step's must not get wrong lines. The fixture traces in
tests/data were recorded without a line record; the pure tests build records by hand.
"""
import os
import re
import sys

import pytest

from profiling.profile.report.render import to_markdown
from profiling.profile.report.summary import summarize
from profiling.profile.tables import eager_lines, lines
from profiling.profile.trace import eager_ops
from profiling.profile.trace.traceio import by_thread, index, parents

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.relpath(os.path.abspath(__file__), ROOT)
ODD_STEP = 3   # calls of the step function: 0-1 warm-up, 2-3 active, 4 the line record


def source_line(marker):
    """The number of the line of this file that ends with `# <marker>`."""
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}"))


def make_step():
    import torch

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    torch.manual_seed(0)
    fc, proj = torch.nn.Linear(128, 512), torch.nn.Linear(512, 128)
    params = list(fc.parameters()) + list(proj.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)
    x, calls = torch.randn(256, 128), []
    spare = torch.ones(4)  # the odd step's operand: tiny, so that a stall of a busy machine stays small

    def step():
        h = fc(x)  # FC
        h = torch.relu(h).square()  # SQUARE
        if len(calls) == ODD_STEP:  # one profiled step calls one more operator, one the TANH line calls too
            torch.tanh(spare)  # ODD
        y = Twice.apply(proj(h))  # TWICE
        z = torch.tanh(y @ y.T)  # TANH
        loss = (z @ y).square().mean()  # LOSS
        loss.backward()  # BACKWARD
        opt.step()  # OPTIMIZER
        opt.zero_grad()
        calls.append(1)

    return step, calls


@pytest.fixture(scope="module")
def captured():
    from profiling.profile.capture import window

    step, calls = make_step()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)  # the project's own files: those under the folder the run starts in
        mp.delenv("AUTORESEARCH_EAGER_LINES", raising=False)
        trace, _ = window.capture(step, warmup=2, active=2, metadata={})
    assert len(calls) == 2 + 2 + 1 + 1  # the shape step and the line-record step train like any other
    return trace


@pytest.fixture(scope="module")
def table(captured):
    return summarize(captured)["lines"]


def placer(trace):
    ix = index(trace["traceEvents"])
    threads = by_thread(ix.cpu_ops)
    parent = parents(threads)
    return ix, lines.Placer(trace["autoresearch"], ix.graph_calls, threads, parent, ix.steps)


def steps(trace, ix, p):
    """(the normal profiled step's window, the odd one's): the odd step has one more top-level operator."""
    main = p.eager.main
    counts = [len(eager_ops.tops(main, p.calls.parent, start, end)) for start, end, _ in ix.steps]
    normal, odd = sorted(range(2), key=lambda k: counts[k])
    assert counts[normal] == len(trace["autoresearch"]["eager_lines"]["ops"]) == counts[odd] - 1
    return ix.steps[normal][:2], ix.steps[odd][:2]


def test_the_record_names_this_files_lines_in_call_order(captured):
    record = captured["autoresearch"]["eager_lines"]
    assert record["version"] == 1 and record["seconds"] > 0
    named = {(f, n) for f, n, _ in record["lines"]}
    assert (HERE, source_line("FC")) in named and (HERE, source_line("ODD")) not in named
    assert not any(f.startswith("profiling/") or "torch/" in f for f, _, _ in record["lines"])
    ops = [(name, tuple(record["lines"][i][:2]) if i >= 0 else None) for name, i in record["ops"]]
    assert ops[0] == ("aten::linear", (HERE, source_line("FC")))
    assert ("Twice", (HERE, source_line("TWICE"))) in ops
    assert record["backward"] == [record["lines"].index([HERE, source_line("BACKWARD"), "loss.backward()  # BACKWARD"])]


def test_nine_tenths_of_the_operator_time_is_on_this_files_lines(table):
    assert table["missing"] is None and table["graphs"] == 0
    assert table["placed_percent"] >= 90
    assert set(table["files"]) == {HERE}
    assert table["eager"]["steps"] == 2 and table["eager"]["steps_matching"] == 1  # the odd step differs
    assert all(r["eager_ms"] == pytest.approx(r["ms_per_step"], abs=2e-4) for r in table["rows"])


def test_backward_operators_land_on_their_forward_lines(captured):
    ix, p = placer(captured)
    (start, end), _ = steps(captured, ix, p)
    expected = {"aten::tanh_backward": "TANH", "TwiceBackward": "TWICE", "aten::threshold_backward": "SQUARE",
                "torch::autograd::AccumulateGrad": "BACKWARD"}
    seen = set()
    for op in ix.cpu_ops:
        name = str(op["name"])
        if name in expected and start <= op["ts"] <= end:
            placed, why = p.place(op, op)[:2]
            assert placed == ((HERE, source_line(expected[name])),), (name, why)
            seen.add(name)
    assert seen == set(expected)


def test_a_step_that_differs_gets_no_wrong_line(captured):
    """The odd step calls one more `aten::tanh` (a name the TANH line calls too): it is not placed, and every
    other operator of that step, forward or backward, gets the line its twin in the normal step gets."""
    ix, p = placer(captured)
    placed = []
    for start, end in steps(captured, ix, p):
        ops = eager_ops.tops(p.eager.main, p.calls.parent, start, end)
        placed.append([(str(op["name"]), p.place(op, op)[:2]) for op in ops])
    normal, odd = placed
    assert len(odd) == len(normal) + 1 and all(where is not None for _, (where, _) in normal)
    assert [x for x in odd if x[1][0] is None] == [
        ("aten::tanh", (None, "eager, not in the recorded step's sequence of operators"))]
    assert [x for x in odd if x[1][0] is not None] == normal
    _, (start, end) = steps(captured, ix, p)
    backward = [p.place(op, op)[:2] for op in ix.cpu_ops
                if op["name"] == "aten::tanh_backward" and start <= op["ts"] <= end]
    assert backward == [(((HERE, source_line("TANH")),), None)]


def test_the_report_shows_the_lines(captured):
    md = to_markdown(summarize(captured))
    section = md.split("### Lines of ")[1].split("## 2.")[0]
    assert "eager rows: work outside the compiled graphs, placed by the lines of one more step" in section
    assert re.search(r"\(\d+ operators a step; 1 of 2 profiled steps called the same sequence\)", section)
    assert "eager | `loss = (z @ y).square().mean()  # LOSS` |" in section


# ---------------------------------------------------------------------------------------------------------
# Pure: alignment and records made by hand
# ---------------------------------------------------------------------------------------------------------

def test_align_equal_sequences_one_to_one():
    assert eager_lines.align(["a", "b", "a"], ["a", "b", "a"]) == [0, 1, 2]


def test_align_skips_an_inserted_operator_and_keeps_the_runs_around_it():
    recorded = ["a", "b", "c", "d", "e", "f"]
    assert eager_lines.align(recorded, ["a", "b", "c", "x", "d", "e", "f"]) == [0, 1, 2, None, 3, 4, 5]


def test_align_places_nothing_on_a_short_coincidence():
    assert eager_lines.align(["a", "b", "c", "d"], ["x", "a", "b", "y"]) == [None] * 4


def test_a_trace_without_a_record_has_no_lines_as_before(captured):
    import copy
    t = copy.deepcopy(captured)
    del t["autoresearch"]["eager_lines"]
    t["autoresearch"].pop("provenance", None)  # a compiled graph of an earlier test in this process leaves one
    assert "no source-line record" in summarize(t)["lines"]["missing"]


def test_a_record_of_another_thread_places_nothing(captured):
    import copy
    t = copy.deepcopy(captured)
    t["autoresearch"]["eager_lines"]["tid"] = -1
    table = summarize(t)["lines"]
    assert table["placed_ms"] == 0 and {u["reason"] for u in table["unplaced"]} == {
        "eager (the line record's thread is not in this trace)"}


def test_turned_off_runs_no_extra_step(monkeypatch):
    from profiling.profile.capture import eager_record
    monkeypatch.setenv("AUTORESEARCH_EAGER_LINES", "0")
    assert eager_record.record(lambda: pytest.fail("no step"), lambda: None) is None


@pytest.mark.slow
def test_a_compiled_part_stays_with_provenance_and_the_extra_step_does_not_recompile(tmp_path):
    """A compiled MLP inside an eager model: compiled kernels are placed by provenance, eager ones by the
    record, and the traced step neither compiles anything nor prints Dynamo's warnings. The script is a file
    of the folder it runs in (its own file, as train.py is)."""
    import subprocess
    script = tmp_path / "partly_compiled.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {ROOT!r})
import torch
from profiling.profile.capture import provenance, window
from profiling.profile.report.summary import summarize
from torch._dynamo.utils import counters
provenance.start()
torch.manual_seed(0)
class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.proj = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)
    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)).square())
mlp = torch.compile(MLP())
head = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(list(mlp.parameters()) + list(head.parameters()), lr=1e-3)
x = torch.randn(2048, 256)  # the compiled wrapper's own CPU time (~2-3 ms a step) stays small
def step():
    y = mlp(x)
    z = torch.tanh(head(y) @ y.T)
    (z @ y).square().mean().backward()
    opt.step()
    opt.zero_grad()
step()
before = dict(counters["stats"]), sum(counters["graph_break"].values())
trace, _ = window.capture(step, warmup=1, active=2, metadata={{}})
assert (dict(counters["stats"]), sum(counters["graph_break"].values())) == before
table = summarize(trace)["lines"]
assert table["graphs"] >= 2 and table["placed_percent"] >= 90, table
assert set(table["files"]) == {{"partly_compiled.py"}}, table["files"]
mlp = [r for r in table["rows"] if r["lines"][0]["text"].startswith("return self.proj")]
assert mlp and mlp[0]["eager_ms"] == 0 and mlp[0]["backward_ms"] > 0, mlp  # provenance's, forward and backward
assert any(r["eager_ms"] and r["lines"][0]["text"].startswith("z = torch.tanh") for r in table["rows"])
print("ok", table["placed_percent"])
""")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Dynamo does not know how to trace" not in r.stderr
    assert r.stdout.startswith("ok"), r.stdout


# ---------------------------------------------------------------------------------------------------------
# H100 traces (recorded without a line record): a record made from the trace's own first step
# ---------------------------------------------------------------------------------------------------------

def record_from_first_step(trace):
    """A line record as the capture makes it, from the trace's own first profiled step: every top-level
    eager operator of the main thread (the thread of the most) on a line of its own, `train.py:<k>`."""
    ix = index(trace["traceEvents"])
    threads = by_thread(ix.cpu_ops)
    parent = parents(threads)
    calls = lines.Calls(ix.graph_calls, threads, parent, lines.Provenance({}))
    start, end, _ = ix.steps[0]
    key = max(threads, key=lambda k: len(eager_ops.tops(threads[k], parent, start, end)))
    ops = [op for op in eager_ops.tops(threads[key], parent, start, end) if calls.call_of(op) is None]
    return {"version": 1, "tid": key[1], "lines": [["train.py", k + 1, str(op["name"])] for k, op in enumerate(ops)],
            "ops": [[str(op["name"]), k] for k, op in enumerate(ops)], "backward": []}


@pytest.mark.parametrize("name, least", [("h100-fresh-eager_attention", 98), ("h100-plant26-eager_model", 99.9)])
def test_h100_eager_kernels_are_placed_through_the_autograd_thread(name, least, monkeypatch):
    """The backward runs on the autograd engine's own thread there: its kernels reach their forward operators
    through sequence numbers. Left: the engine's sums around a compiled graph's backward (~4 ms of 368)."""
    from profiling.profile.report.summary import load_trace
    trace = load_trace(os.path.join(ROOT, "tests", "data", f"{name}.trace.json.gz"))
    trace["autoresearch"]["eager_lines"] = record_from_first_step(trace)
    monkeypatch.setattr(lines, "TOP", 100000)  # every row
    s = summarize(trace)
    table = s["lines"]
    assert table["placed_percent"] >= least
    assert table["eager"]["steps_matching"] == table["eager"]["steps"] == 2
    accumulate = "gradient accumulation (AccumulateGrad): the engine ran from several lines or none"  # none here
    compiled = "the autograd engine's work around a compiled graph's backward"
    assert {u["reason"] for u in table["unplaced"]} <= {compiled, accumulate}
    assert sum(r["backward_ms"] for r in table["rows"] if r["eager_ms"]) > 0.3 * s["device_ms"]


@pytest.mark.parametrize("name, least", [("h100-plant33-eager_attention", 90), ("h100-plant33-eager_model", 90)])
def test_a_real_h100_record_places_the_eager_work_and_costs_the_profiled_step_nothing(name, least):
    """Recorded by train.py --profile on an H100 (benchmarks/findings/planted/diagnoses.py, 2026-11-25): the
    attention module excluded from torch.compile (98.9% placed), the model uncompiled (100%); the profiled
    steps within 3% of the unprofiled ones, the record being one more step after them."""
    from profiling.profile.report.summary import load_trace
    s = summarize(load_trace(os.path.join(ROOT, "tests", "data", f"{name}.trace.json.gz")))
    table = s["lines"]
    assert table["placed_percent"] >= least
    assert table["eager"]["steps_matching"] == table["eager"]["steps"] == 2
    assert abs(s["step_ms"] / s["unprofiled_step_ms"] - 1) <= 0.03
    assert any(r["where"].endswith("train.py:" + str(r["lines"][0]["line"])) and r["eager_ms"] for r in table["rows"])
