"""Issue #57 item 2, second half: a window whose batches split into fast ones and slow ones waiting on the loader's
workers (findings/input.py `_pace`). On real traces: the own H200 ResNet-18 whose 4 workers were still starting
(tests/data/foreign/own-h200-nomarkers-resnet18-loader-4-workers-startup: waits 187, 0.03, 49.5, 0.03, 6.6, 0.05 ms)
against the H100 ResNet-18s whose loader is steadily too slow (h100-host-resnet18-workers0/-workers2); the
patterns no committed trace holds (pytorch/examples' imagenet, the waits growing at the window's end; batches in
bursts) on the rule's own batch-by-batch reading."""
import copy
import os
from types import SimpleNamespace

import pytest

from profiling.profile.findings import input as input_pipeline
from profiling.profile.report import render
from profiling.profile.report.summary import load_trace, summarize

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
STARTUP = os.path.join(DATA, "foreign", "own-h200-nomarkers-resnet18-loader-4-workers-startup.json.gz")
WORKERS2 = os.path.join(DATA, "h100-host-resnet18-workers2.trace.json.gz")


@pytest.fixture(scope="module")
def startup():
    return summarize(load_trace(STARTUP))


@pytest.fixture(scope="module")
def workers2():
    return load_trace(WORKERS2)


def loader(s):
    return [f for f in s["findings"] if f["kind"] == "input_bound"]


def test_workers_still_starting_are_said_once_not_priced_per_step(startup):
    """Before: input_bound 40.5 ms/step first, "the workers cannot keep up ... more of them". The later batches
    came without a wait: the steady state pays none of it."""
    assert not loader(startup)
    (row,) = [r for r in startup["one_off"] if r["kind"] == input_pipeline.STARTUP]
    assert row["step"] is None and 240 < row["ms"] < 246  # the window's GPU idle under the waits, said once
    text = row["text"]
    assert "187.1, 0.03, 49.5, 0.03, 6.6, 0.05 (after the last step: 0.04) ms" in text
    assert "the waits shrank batch by batch" in text
    assert "~0 ms/step" in text and "profile later in the run" in text and "persistent_workers=True" in text
    assert "more of them" not in text
    md = render.to_markdown(startup)
    assert "one-off, not per step: the DataLoader's workers not yet steady, 243.2 ms" in md
    assert all("more of them" not in f["fix"] for f in startup["findings"])


def test_the_start_up_wait_is_claimed_so_no_other_rule_prices_it(startup):
    """The loader's gaps stay claimed: the host's dispatch (launch_bound, 12.2 ms of the 14 ms steady steps) leads,
    and no host-wait finding takes the 243 ms."""
    assert startup["findings"][0]["kind"] == "launch_bound"
    assert sum(f["ms_per_step"] for f in startup["findings"] if f["kind"] != "launch_bound") < 1.0


@pytest.mark.parametrize("name", ["h100-host-resnet18-workers2", "h100-host-resnet18-workers0"])
def test_a_loader_steadily_too_slow_keeps_its_price_and_its_fix(name):
    """Every batch waited (2 workers: 61-138 ms each; 0 workers: the training thread decodes): no split, the
    window's mean is the price, as before (81.3 and 227.9 ms/step)."""
    s = summarize(load_trace(os.path.join(DATA, f"{name}.trace.json.gz")))
    top = s["findings"][0]
    assert top["kind"] == "input_bound" and top["ms_per_step"] > (80 if name.endswith("2") else 220)
    assert "not yet steady" not in top["evidence"] and "uneven" not in top["evidence"]
    assert not [r for r in s["one_off"] if r["kind"] == input_pipeline.STARTUP]
    assert ("more of them" in top["fix"]) == name.endswith("2")


@pytest.mark.parametrize("cores, words", [(16, "N at most 15 (this process may run on 16 cores"),
                                          (2, "this process may run on 2 cores, none spare for more workers")])
def test_more_workers_are_never_advised_past_the_spare_cores(workers2, cores, words):
    """The live capture records the cores (api._cpu_threads, CUDA runs too): the fix caps N at them less the
    training thread's; with none spare it advises cheaper per-sample work only."""
    t = copy.deepcopy(workers2)
    t.setdefault("autoresearch", {})["cpu_threads"] = {"intra_op": 8, "inter_op": 8, "cores": cores,
                                                       "load_average": 1.0}
    top = summarize(t)["findings"][0]
    assert top["kind"] == "input_bound" and words in top["fix"]
    assert ("more of them" in top["fix"]) == (cores > 3) and "make the per-sample work cheaper" in top["fix"]


def test_without_a_core_count_the_fix_still_bounds_the_workers(workers2):
    fix = summarize(copy.deepcopy(workers2))["findings"][0]["fix"]
    assert "no more than the CPU cores you can spare" in fix and "compete with it and slow the step" in fix


# ---------------------------------------------------------------------------------------------------------
# The batch-by-batch reading on the patterns no committed trace holds
# ---------------------------------------------------------------------------------------------------------

def timeline(steps_ms, waits_ms, idle_ms=None):
    """A stand-in timeline: steps of these durations, one next-batch span at each step's start waiting these
    ms, and under each the GPU idle `idle_ms` (the wait itself by default)."""
    t, windows, spans, gaps = 0.0, [], [], []
    for k, (d, w) in enumerate(zip(steps_ms, waits_ms)):
        windows.append((t, t + d * 1e3))
        spans.append((t, t + w * 1e3, {}))
        idle = (idle_ms or waits_ms)[k]
        if idle:
            gaps.append(SimpleNamespace(start=t, end=t + idle * 1e3))
        t += d * 1e3
    return SimpleNamespace(loader=spans, windows=windows, n=len(steps_ms)), gaps


def pace(steps_ms, waits_ms, idle_ms=None):
    tl, gaps = timeline(steps_ms, waits_ms, idle_ms)
    return input_pipeline._pace(tl, gaps, {"scale": 1.0})


def test_imagenets_waits_growing_at_the_windows_end_are_not_yet_steady():
    """pytorch/examples' imagenet main.py --dummy (4 workers) at steps 13-17: 121, 122, 142, 209, 333 ms while the
    workers' queue filled; steady, the step is 122.8 ms with the GPU busy 117.9: the fast steps' ~0 wait."""
    p = pace([121, 122, 142, 209, 333], [0.02, 0.03, 20, 87, 211])
    assert p["uneven"] is False and p["steady_ms"] < 0.05
    assert "the last 3 of 5 batches waited" in p["text"] and "~0 ms/step" in p["text"]


def test_a_start_up_whose_fast_batches_still_wait_is_priced_at_their_wait():
    p = pace([300, 40, 40, 40, 40], [260, 3, 2, 3, 2], idle_ms=[260, 2, 1, 2, 1])
    assert p["uneven"] is False and p["steady_ms"] == pytest.approx(1.5)
    assert "the first 1 of 5 batches waited" in p["text"]


def test_batches_in_bursts_are_uneven_and_keep_the_windows_mean():
    """4 workers each slower than the GPU's step: one batch in four waits, the others come at once."""
    p = pace([180, 20, 20, 20, 180, 20], [160, 0.1, 0.1, 0.1, 150, 0.1])
    assert p["uneven"] is True and "uneven: its next-batch waits" in p["text"]


@pytest.mark.parametrize("waits", [[60, 70, 65, 80], [0.1, 0.1, 0.2, 0.1], [60, 70]])
def test_waits_alike_or_too_few_batches_do_not_split(waits):
    assert pace([100] * len(waits), waits) is None
