"""Steps whose inputs change size (issue #56 item 3): a loop whose sequence length changes every step runs the same
operators in every step, longer on longer inputs. Those steps are the loop's own work, kept in every per-step
figure and said in the check; a step that stalled (its operators took their usual time) is still a one-off.
Real captures on the CPU through the public API."""
import os
import time

import pytest
import torch
import torch.nn as nn

import profiling

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = dict(warmup_steps=1, timed_steps=5, active_steps=5)


def run(lengths, pause_at=None, out=None):
    """Profile a small encoder over token batches of `lengths` (cycled); `pause_at`: a profiled step (1-based among
    the profiled ones) that also sleeps. Returns (the Profiler, the profiled steps' wall times in ms)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(128, 4, 256, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.Embedding(500, 128), nn.TransformerEncoder(layer, 2), nn.Linear(128, 500))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = profiling.Profiler(model, out_dir=out, **FAST)
    first = FAST["warmup_steps"] + FAST["timed_steps"] + 1  # steps before the profiled ones
    walls, i = [], 0
    while not prof.done:
        x = torch.randint(0, 500, (4, lengths[i % len(lengths)]))
        start = time.perf_counter()
        nn.functional.cross_entropy(model(x).view(-1, 500), x.view(-1)).backward()
        opt.step()
        opt.zero_grad()
        if pause_at is not None and i == first + pause_at - 1:
            time.sleep(0.4)
        walls.append(1e3 * (time.perf_counter() - start))
        i += 1
        prof.step()
    return prof, walls[first:first + FAST["active_steps"]]


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    return tmp_path / "profiles"


def test_longer_inputs_are_the_loops_own_work(out):
    # 1 warm-up and 5 timed steps, 1 profiler warm-up, then the profiled ones run 32, 512, 32, 512, 48 tokens
    prof, walls = run([32, 512, 32, 48, 32, 512, 32] + [32, 512, 32, 512, 48] + [32] * 6, out=out)
    s = prof.summary
    gone = [r["position"] for r in s.get("one_off") or () if r.get("step")]  # a loaded host may stall a short one
    assert 2 not in gone and 4 not in gone and s["steps"] + len(gone) == 5, s["one_off"]
    kept = [ms for i, ms in enumerate(walls, 1) if i not in gone]
    assert s["step_ms"] == pytest.approx(sum(kept) / len(kept), rel=0.25)  # the CPU profiler's own cost at most
    check = next(c for c in s["checks"] if c["name"] == "profiled steps alike")
    assert check.get("varies") and "not alike by design" in check["detail"]
    assert any("the same work on larger inputs" in n for n in s["notes"]), s["notes"]


def test_a_step_that_stalled_is_still_a_one_off(out):
    prof, _ = run([32], pause_at=2, out=out)  # the same input every step; the 2nd profiled step sleeps 0.4 s
    one_off = [r for r in prof.summary.get("one_off") or () if r.get("step")]
    assert 2 in [r["position"] for r in one_off], one_off  # (a loaded host may stall another one as well)
    assert not prof.summary.get("notes") or not any("larger inputs" in n for n in prof.summary["notes"])
