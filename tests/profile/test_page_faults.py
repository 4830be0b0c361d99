"""Memory faulted in again every step (findings/cpu.py page_faults): the Profiler counts the host's page faults in
each timed step and, where they are many, times what one costs on this machine (capture/faults.py); the rule
prices the two and names glibc's settings that keep freed memory. A real CPU trace of the benchmark's HF GPT-2 (Trainer's defaults:
4,000-13,000 faults a step on this project's 2-core host), and live Profilers whose step maps fresh memory."""
import copy
import ctypes
import mmap
import os
import sys
import time

import pytest
import torch

import profiling
from profiling.profile.capture import faults
from profiling.profile.report.summary import summarize
from profiling.profile.trace.traceio import load_trace

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page faults counted by getrusage on Linux")
FAST = dict(warmup_steps=1, timed_steps=5, active_steps=2, memory=False, max_timed_steps=5)


@pytest.fixture(scope="module")
def hf():
    return load_trace(os.path.join(DATA, "cpu-hf-gpt2-faults.trace.json.gz"))


def test_an_hf_loops_faults_are_its_first_finding_priced_at_their_count_and_cost(hf):
    meta = hf["autoresearch"]
    each, us = meta["timed_step_faults_each"], meta["page_fault_us"]
    s = summarize(copy.deepcopy(hf))
    top = s["findings"][0]
    assert top["kind"] == "page_faults"
    median = sorted(each)[len(each) // 2]
    assert top["ms_per_step"] == pytest.approx(median * us / 1e3, abs=0.01)
    assert f"{median:,} minor page faults each" in top["evidence"] and f"{us:.2f} us a fault" in top["evidence"]
    assert "MALLOC_MMAP_MAX_=0" in top["fix"] and "MALLOC_TRIM_THRESHOLD_=1073741824" in top["fix"]
    assert "memory faulted in again every step" in s["not_run"]  # the CPU rules' one sentence


def test_without_a_measured_cost_or_below_a_hundredth_of_the_step_there_is_no_finding(hf):
    for change in ({"page_fault_us": None}, {"timed_step_faults_each": [0, 0, 0, 0, 0]},
                   {"timed_step_faults_each": [100] * 5}):  # 100 faults x 1.2 us: 0.1% of a 118 ms step
        t = copy.deepcopy(hf)
        t["autoresearch"].update(change)
        assert "page_faults" not in [f["kind"] for f in summarize(t)["findings"]], change


def test_the_price_never_exceeds_half_the_step(hf):
    t = copy.deepcopy(hf)
    t["autoresearch"]["timed_step_faults_each"] = [10 ** 6] * 5
    top = summarize(t)["findings"][0]
    assert top["kind"] == "page_faults"
    assert top["ms_per_step"] == pytest.approx(t["autoresearch"]["unprofiled_step_ms"] / 2, abs=0.01)


@LINUX
def test_a_faults_cost_is_measured_on_fresh_pages_of_its_own():
    before = faults.count()
    us = faults.cost_us(2)
    assert faults.count() - before >= faults.PROBE_BYTES // mmap.PAGESIZE  # its own pages, faulted in
    assert us is not None and 0.01 < us < 1000


A, C = torch.ones(256, 256), torch.empty(256, 256)


def work():
    torch.mm(A, A, out=C)  # the step's operator, writing memory it holds (a fresh 256 KiB could be mapped anew)
    time.sleep(0.01)


class Fresh:
    """A step that maps PAGES fresh pages, writes them and hands them back, as a trimmed heap does, then works."""
    PAGES = 2048

    def __call__(self):
        region = mmap.mmap(-1, self.PAGES * mmap.PAGESIZE)
        view = ctypes.c_char.from_buffer(region)
        ctypes.memset(ctypes.addressof(view), 1, self.PAGES * mmap.PAGESIZE)
        del view
        region.close()
        work()


def _profile(step, tmp_path):
    prof = profiling.Profiler(None, out_dir=tmp_path, **FAST)
    while not prof.done:
        step()
        prof.step()
    return prof


@LINUX
def test_a_loop_that_maps_fresh_memory_every_step_is_told_so(tmp_path):
    prof = _profile(Fresh(), tmp_path)
    f = next(f for f in prof.summary["findings"] if f["kind"] == "page_faults")
    assert f["ms_per_step"] > 0 and "MALLOC_MMAP_MAX_=0" in f["fix"]
    meta = load_trace(os.path.join(prof.folder, "trace.json.gz"))["autoresearch"]
    assert sorted(meta["timed_step_faults_each"])[2] >= Fresh.PAGES  # its pages, and whatever the step adds


@LINUX
def test_a_loop_that_keeps_its_memory_pays_no_probe_and_gets_no_finding(tmp_path):
    prof = _profile(work, tmp_path)
    assert "page_faults" not in [f["kind"] for f in prof.summary["findings"]]
    meta = load_trace(os.path.join(prof.folder, "trace.json.gz"))["autoresearch"]
    assert sorted(meta["timed_step_faults_each"])[2] < 100 and "page_fault_us" not in meta


