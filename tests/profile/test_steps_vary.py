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
from profiling.profile.report import render
from profiling.profile.trace import irregular

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
    assert not check["ok"] and check["result"] == irregular.NOT_ALIKE  # never "ok"
    assert any("the same work on larger inputs" in n for n in s["notes"]), s["notes"]


def test_a_step_that_stalled_is_still_a_one_off(out):
    prof, _ = run([32], pause_at=2, out=out)  # the same input every step; the 2nd profiled step sleeps 0.4 s
    one_off = [r for r in prof.summary.get("one_off") or () if r.get("step")]
    assert 2 in [r["position"] for r in one_off], one_off  # (a loaded host may stall another one as well)
    assert not prof.summary.get("notes") or not any("larger inputs" in n for n in prof.summary["notes"])


def plain_capture(lengths, path):
    """A plain torch.profiler capture (record_shapes=True: each step's own shapes) of the encoder over `lengths`,
    one step each after one warm-up step; summarize()'s summary of the exported trace."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from profiling.profile.report.summary import load_trace, summarize
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.Embedding(500, 64), nn.TransformerEncoder(layer, 1), nn.Linear(64, 500))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=len(lengths) - 1, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for n in lengths:
            x = torch.randint(0, 500, (4, n))
            nn.functional.cross_entropy(model(x).view(-1, 500), x.view(-1)).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return summarize(load_trace(str(path)))


def test_a_plain_capture_says_which_shapes_changed(tmp_path):
    """Each step's own input dims (record_shapes in every step): the check names the operator and its inputs per
    step, with each shape's first step against its repeats, and never says ok. Every step stays: both 256-token
    steps were left out as "unnamed" one-offs in most runs while only the growth of the median operator (under 2x
    for this tiny model) could tell the same work on larger inputs (irregular._larger_inputs)."""
    s = plain_capture([32, 32, 256, 32, 256, 64], tmp_path / "t.json")
    check = next(c for c in s["checks"] if c["name"] == irregular.CHECK)
    assert not check["ok"] and check["result"] == irregular.NOT_ALIKE
    shapes = check["unlike"]["shapes"]
    assert shapes["what"] in ("`aten::random_`'s inputs", "`aten::embedding`'s inputs")  # the batch made, or used
    assert [x.endswith(f"[4, {n}]]") for x, n in zip(shapes["labels"], [32, 256, 32, 256, 64])] == [True] * 5
    assert shapes["spread"] == 8.0 and "the largest 8.0x the smallest" in check["detail"]
    assert "shapes differ (3 shapes in 5 steps)" in check["detail"]
    assert "in steps 1, 3 (" in check["detail"] and "a shape's first step in the window took" in check["detail"]
    md = render.to_markdown(s)
    assert "note: profiled steps alike: not alike: shapes differ" in md and "| not alike |" in md


def test_a_plain_capture_of_one_shape_stays_alike(tmp_path):
    s = plain_capture([64] * 5, tmp_path / "t.json")
    check = next(c for c in s["checks"] if c["name"] == irregular.CHECK)
    assert check["ok"] and "unlike" not in check and "result" not in check, check


# Real traces from an H200 (tests/data): device-only timed steps, so their operators' shapes are one untimed step's,
# lent to each; what each step ran shows in its own kernels and copies

def alike(s):
    return next(c for c in s["checks"] if c["name"] == irregular.CHECK)


def test_a_new_length_each_step_with_the_autotuner_on_is_not_alike(data_summary):
    """A Conv1d net given a new input length every step, cudnn.benchmark on: steps of 7.7 to 1,031 ms. The check
    said "ok" (none over 2x the median); the kernels every step launched ran on other grids, and cuDNN's autotuner
    launched 58 kernels not in every step."""
    s = data_summary("h200-eager-cudnn-benchmark-varlen")
    check = alike(s)
    assert not check["ok"] and check["result"] == irregular.NOT_ALIKE
    shapes = check["unlike"]["shapes"]
    assert shapes["what"].startswith("the grids of 10 of the 26 kernels every step launched")
    assert len(set(shapes["labels"])) == 5 and shapes["spread"] > 2.5  # a new length each step, 2.6x apart
    assert check["unlike"]["kernels"] == [58, 90]
    assert "shapes differ (5 shapes in 5 steps)" in check["detail"]
    assert "58 of the 90 kernels the steps ran are not in every step" in check["detail"]
    assert "(7.73 ms)" in check["detail"] and "(1,031.1 ms)" in check["detail"]  # each step's time beside its shape
    assert check["detail"].endswith("the like steps took 7.73 ms to 1,031.1 ms (133.3x)")  # not "none over 2x"
    assert "note: profiled steps alike: not alike: shapes differ" in render.to_markdown(s)


def test_a_new_image_side_is_said_with_its_first_time_cost(data_summary):
    """A new image side each step: the batch copied in says each step's size; step 2, a cold first call left out
    of the per-step figures, is still one of the shapes, and its 39.3 ms is set against that size's repeat."""
    check = alike(data_summary("h200-uneven-varying_size-api"))
    assert not check["ok"] and check["result"] == irregular.NOT_ALIKE
    shapes = check["unlike"]["shapes"]
    assert shapes["what"] == "the bytes copied to the device" and shapes["steps"] == [1, 2, 3, 4, 5]
    assert shapes["labels"] == ["2.46 MB", "1.21 MB", "2.46 MB", "1.21 MB", "1.57 MB"]
    assert "1.21 MB in steps 2, 4 (39.3 ms, 10.3 ms)" in check["detail"]
    assert "a shape's first step in the window took 25.9 ms on average, its repeats 11.4 ms" in check["detail"]
    assert "a cold first call" in check["detail"]  # the one-off's line stays


@pytest.mark.parametrize("name", ["h200-default-gpt-5steps", "h100-compiled-gpt-5steps", "cpu-hf-gpt2-logging",
                                  "cpu-one-off-save"])
def test_steps_that_are_alike_stay_ok(data_summary, name):
    """The same shapes and kernels every step (a log's 2 operators in one step, a save left out as a one-off)."""
    check = alike(data_summary(name))
    assert check["ok"] and "unlike" not in check and "result" not in check, check
