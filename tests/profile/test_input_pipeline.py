"""Issue #48 items 1 and 3: the GPU waiting on the input pipeline (findings/input.py), and evidence a trace with
Python stacks still records. On real traces: Kineto's V100 ResNet-50 (num_workers=0, tests/data/foreign), its
4-worker twin, H100 traces of this repository's train.py (a DataLoader with one worker that keeps up), and CPU runs
of a DataLoader whose Dataset decodes in Python (tests/data/make_cpu_loader_traces.py)."""
import copy
import os

import pytest

from profiling.profile.findings import input as input_pipeline
from profiling.profile.report import render
from profiling.profile.report.summary import load_trace, summarize

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
RESNET = os.path.join(DATA, "foreign", "kineto-v100-resnet50-train.json.gz")
WORKERS = os.path.join(DATA, "foreign", "kineto-v100-resnet50-4-loader-workers.json.gz")


@pytest.fixture(scope="module")
def resnet():
    return load_trace(RESNET)


def by_kind(s, kind):
    return [f for f in s["findings"] if f["kind"] == kind]


def with_stacks(trace):
    """As torch 2.x marks a trace recorded with with_stack=True; no unprofiled step (a plain trace's case)."""
    t = copy.deepcopy(trace)
    t["with_stack"] = 1
    return t


def test_a_starved_gpu_is_blamed_on_the_dataloader_not_the_sync_it_exposes(resnet):
    """num_workers=0: the loader's __next__ (68.7 ms of a 147 ms step) covers the long gap; the pageable copy's
    sync right after it only exposes it. Before #48 the top was host_sync 34.0 ms with a pin_memory fix."""
    s = summarize(copy.deepcopy(resnet))
    top = by_kind(s, "input_bound")[0]  # first of the idle findings (float32 convolutions lead: +46 ms with AMP)
    kinds = [f["kind"] for f in s["findings"] if f["kind"] in ("input_bound", "host_sync", "cuda_sync")]
    assert kinds[0] == "input_bound" and 25 < top["ms_per_step"] < 30  # the idle it covers, not 68.7
    assert "_SingleProcessDataLoaderIter.__next__" in top["evidence"] and "num_workers=0" in top["evidence"]
    assert "took 68.7 ms/step" in top["evidence"] and "aten::_cat" in top["evidence"]  # the collate's cat
    assert "num_workers=N" in top["fix"] and "persistent_workers=True" in top["fix"] and "pin_memory" in top["fix"]
    # host_sync no longer prices the loader's gap: what is left to it is the copies' own idle
    assert all(f["ms_per_step"] < 15 for f in s["findings"] if f["kind"] in ("host_sync", "cuda_sync"))
    assert sum(f["ms_per_step"] for f in s["findings"]) <= s["step_ms"]


def test_its_price_is_the_idle_the_spans_cover_never_more_than_the_idle(resnet):
    s = summarize(copy.deepcopy(resnet))
    top = by_kind(s, "input_bound")[0]
    assert top["ms_per_step"] <= s["idle_ms"] and "% of the GPU idle" in top["evidence"]


def test_workers_that_keep_up_or_a_loader_the_gpu_never_waits_on_is_no_finding():
    """The 4-worker twin (its __next__ 4.3 ms, no GPU idle under it) and this repository's train.py (one worker
    ahead of a busy GPU): no input_bound."""
    for path in (WORKERS, os.path.join(DATA, "h100-plant33-baseline.trace.json.gz"),
                 os.path.join(DATA, "h100-lightning-compiled-callback.trace.json.gz")):
        assert not by_kind(summarize(load_trace(path)), "input_bound"), path


def test_with_python_stacks_the_dataloader_wait_is_still_priced_and_the_stacks_are_named(resnet):
    """Item 3: the spans are recorded events; with_stack only says their idle may be inflated."""
    s = summarize(with_stacks(resnet))
    top = by_kind(s, "input_bound")[0]
    assert top["ms_per_step"] == by_kind(summarize(copy.deepcopy(resnet)), "input_bound")[0]["ms_per_step"]
    assert "with_stack=True" in top["evidence"] and "--unprofiled-ms" in top["evidence"]
    idle = [u for u in s["unknown"] if u["rule"] == "GPU idle"]
    assert idle and "beside the" in idle[0]["what"] and idle[0]["ms_per_step"] < s["idle_ms"] - top["ms_per_step"] + 0.1


def test_pageable_copies_keep_their_device_time_in_a_trace_with_stacks():
    """h100-cudacalls-pageable (4 pageable 64 MB copies a step): with stacks and no unprofiled step, the copies'
    device time over pinned memory is priced (24.8 ms), not the idle after them, which goes to unknown."""
    s = summarize(with_stacks(load_trace(os.path.join(DATA, "h100-cudacalls-pageable.trace.json.gz"))))
    f = by_kind(s, "cuda_sync")[0]
    assert 20 < f["ms_per_step"] < 30 and "device time is priced, not the idle after them" in f["evidence"]
    assert "pin_memory=True" in f["fix"]
    assert [u for u in s["unknown"] if u["rule"] == "GPU idle"]


def test_blocking_syncs_in_a_trace_with_stacks_are_priced_at_most_the_hosts_wait_in_them():
    """h100-plant-host_sync (.item() twice a step): the count and the wait are recorded; the price is the lesser
    of the syncs' own idle and the host's wait while the GPU ran, never the host's later (inflated) work."""
    trace = load_trace(os.path.join(DATA, "h100-plant-host_sync.trace.json.gz"))
    trace["autoresearch"].pop("unprofiled_step_ms")
    s = summarize(with_stacks(trace))
    f = by_kind(s, "host_sync")[0]
    assert "2 syncs/step: aten::item x2" in f["evidence"] and "the host waited in them" in f["evidence"]
    assert "with the queue drained" not in f["evidence"]  # no exposed host work priced
    assert f["ms_per_step"] <= s["idle_ms"]


def test_a_sync_that_waits_with_the_gpu_idle_proves_nothing():
    """SGLang's MI300X decode window (with_stack): one hipMemcpyWithStream of 463 ms while the GPU idles (it waits
    on another process): no sync finding, the idle stays unknown."""
    s = summarize(load_trace(os.path.join(DATA, "foreign", "tracelens-mi300x-sglang-qwen3-8b-decode-no-steps.json.gz")))
    assert not s["findings"] and s["unknown"][0]["ms_per_step"] > 400


@pytest.mark.parametrize("workers, words", [(0, "making it itself (num_workers=0)"),
                                             (2, "waiting on the workers' queue")])
def test_a_cpu_run_names_the_loaders_share_of_the_step(workers, words):
    """No GPU to idle: the training thread's own time in the loader is the cost. num_workers=0 decodes in the
    training thread; two workers cannot keep up (each sample is ~2 ms of Python)."""
    s = summarize(load_trace(os.path.join(DATA, f"cpu-loader-workers{workers}.trace.json.gz")))
    top = s["findings"][0]
    assert top["kind"] == "input_bound" and top["ms_per_step"] > 0.5 * s["step_ms"] and words in top["evidence"]
    assert "pin_memory" not in top["fix"] and "non_blocking" not in top["fix"]
    assert top["fix"].startswith("the workers cannot keep up") == (workers > 0)
    md = render.to_markdown(s)  # a CPU report shows its findings (section 0) where it has some
    assert "## 0. Findings" in md and "**input_bound**" in md


def test_a_cpu_run_without_a_dataloader_has_no_input_finding():
    s = summarize(load_trace(os.path.join(DATA, "cpu-tiny-mlp-3steps.trace.json.gz")))
    assert not by_kind(s, "input_bound")


def test_host_samples_inside_the_loader_name_the_per_sample_work(resnet):
    """A live capture's samples inside the __next__ span: the Dataset's own line (inside its __getitem__), not
    the loop that asked for the batch; the HF Trainer's knob where the trainer is transformers'."""
    t = copy.deepcopy(resnet)
    from profiling.profile.trace.traceio import index
    ix = index(t["traceEvents"])
    t0, _, _ = ix.steps[1]
    span = next(m for m in ix.cpu_ops if str(m.get("name", "")).startswith("enumerate(DataLoader)") and m["ts"] >= t0)
    decode = ["PIL/Image.py:800 frombytes", "mydata.py:42 decode", "mydata.py:50 __getitem__", "train.py:80 train"]
    wait = ["train.py:80 train"]
    samples = [[1, span["ts"] - t0 + us, 0] for us in range(1000, int(span["dur"]), 2000)]
    t["autoresearch"] = {"framework": "transformers 4.50", "host_samples": {
        "interval_ms": 2.0, "stacks": [decode, wait], "samples": samples,
        "lines": {"mydata.py:42 decode": "img = Image.frombytes(...)"},
        "own": ["mydata.py:42 decode", "mydata.py:50 __getitem__", "train.py:80 train"]}}
    top = by_kind(summarize(t), "input_bound")[0]
    assert "mydata.py:42 decode (100%) `img = Image.frombytes(...)`" in top["evidence"]
    assert "dataloader_num_workers=N" in top["fix"] and "mydata.py:42 decode" in top["fix"]


def test_the_work_of_a_sample_is_inside_the_loader():
    own = {"mydata.py:50 __getitem__", "train.py:80 train"}
    assert input_pipeline._work(["PIL/Image.py:1 load", "mydata.py:50 __getitem__", "train.py:80 train"], own) == \
        "mydata.py:50 __getitem__"
    # a library Dataset (torch's frames kept): its innermost frame, never the loop's line
    assert input_pipeline._work(["PIL/Image.py:1 load", "torchvision/datasets/folder.py:2 __getitem__",
                                 "torch/utils/data/_utils/fetch.py:3 fetch", "train.py:80 train"], own) == \
        "PIL/Image.py:1 load"
    assert input_pipeline._work(["python3.12/threading.py:355 wait", "queues.py:1 get",
                                 "torch/utils/data/dataloader.py:9 _try_get_data"], own) is None
