"""profiling.profile.tables.closures: forward and backward run inside `optimizer.step(closure)` count as the
model's, on real CPU traces of Lightning, LBFGS and SGD with a closure (tests/data/make_cpu_closure_traces.py)
and on small synthetic windows."""
import os

import pytest

from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.tables import closures

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
MAIN, ENGINE = (1, 1), (1, 2)  # (pid, tid): the main thread, the autograd engine's thread (CUDA)
GEMMS = {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul"}


@pytest.fixture(scope="module", params=["lightning", "sgd", "lbfgs"])
def traced(request):
    path = os.path.join(DATA, f"cpu-closure-{request.param}.trace.json.gz")
    return request.param, summarize(load_trace(path))


def _rows(s):
    return {r["region"]: r for r in s["regions"]["rows"]}


def test_closure_gemms_are_the_models(traced):
    name, s = traced
    gemms = [k for k in s["kernels"] if k["raw_name"] in GEMMS]
    assert gemms and all(k["category"] == "GEMM" for k in gemms), name
    rows = _rows(s)
    for region in ("attention", "MLP", "head and loss"):  # each multiplies its weights forward and backward
        assert rows[region]["forward_ms"] > 0 and rows[region]["backward_ms"] > 0, (name, region)
    assert closures.NOTE in s["regions"]["notes"]


def test_closure_optimizer_is_its_own_work(traced):
    name, s = traced
    optimizer = {k["raw_name"] for k in s["kernels"] if k["category"] == "optimizer"}
    assert not optimizer & (GEMMS | {"aten::embedding", "aten::scaled_dot_product_attention"})
    assert not any(n.startswith("autograd::") for n in optimizer)
    if name == "lbfgs":  # LBFGS's own work: dot products, flat gradient, line search between closure calls
        assert {"aten::dot", "aten::add_", "aten::cat"} <= optimizer
    else:  # SGD's update of 16 parameters; all the ops were optimizer before (27% of the step, Lightning 38%)
        assert "aten::add_" in optimizer
        assert s["categories"]["optimizer"] < 0.05 * s["step_ms"]


def _op(name, ts, dur, thread=MAIN, seq=None):
    args = {} if seq is None else {"Sequence number": seq}
    return {"name": name, "ts": ts, "dur": dur, "pid": thread[0], "tid": thread[1], "args": args}


def _mark(ts, dur, name="Optimizer.step#SGD.step"):
    return {"name": name, "ts": ts, "dur": dur, "pid": MAIN[0], "tid": MAIN[1]}


BACKWARD = "autograd::engine::evaluate_function: MmBackward0"


def test_no_backward_in_the_window_leaves_it_whole():
    ops = [_op("aten::mm", 10, 5, seq=1), _op(BACKWARD, 20, 5), _op("aten::add_", 110, 5)]
    assert closures.own_windows([_mark(100, 50)], ops) == [(100, 150)]


def test_closure_calls_are_cut_and_the_work_between_kept():
    # LBFGS: closure (forward, backward), its own work, closure again, its own work
    ops = [_op("aten::mm", 101, 9, seq=1), _op("aten::item", 111, 1), _op(BACKWARD, 112, 8),
           _op("aten::dot", 125, 5), _op("aten::mm", 131, 4, seq=2), _op(BACKWARD, 136, 4),
           _op("aten::add_", 142, 5)]
    assert closures.closure_calls([o for o in ops if o["args"] or o["name"] == BACKWARD], MAIN) == [
        (101, 120), (131, 140)]
    own = closures.own_windows([_mark(100, 50)], ops)
    assert own == [(100, 101 - closures.EDGE_US), (120, 131 - closures.EDGE_US), (140, 150)]


def test_backward_on_the_engine_thread_and_a_nested_zero_grad():
    # CUDA: backward on the engine's thread; Lightning: zero_grad inside the closure stays optimizer
    ops = [_op("aten::linear", 101, 9, seq=1), _op(BACKWARD, 115, 20, thread=ENGINE),
           _op("aten::linear", 116, 2, thread=ENGINE, seq=9)]  # a forward on another thread: not a new call
    marks = [_mark(100, 50), _mark(111, 2, "Optimizer.zero_grad#SGD.zero_grad")]
    assert closures.own_windows(marks, ops) == [(100, 101 - closures.EDGE_US), (111, 113), (135, 150)]


def test_a_forward_without_backward_after_it_stays_optimizer():
    # an optimizer that forgets no_grad records Sequence numbers after the closure's backward
    ops = [_op("aten::mm", 101, 9, seq=1), _op(BACKWARD, 112, 8), _op("aten::add_", 125, 5, seq=7)]
    assert closures.own_windows([_mark(100, 50)], ops) == [(100, 101 - closures.EDGE_US), (120, 150)]
