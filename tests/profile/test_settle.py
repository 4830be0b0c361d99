"""The profile waits for the steady state (issue #48): timed steps whose time still rises are warm-up, and the
window's first steps after the pause that opened it are not recorded while they run far under the unprofiled
step. The loop here is a DataLoader-like queue: `ahead` batches ready (fast steps), then each batch costs `slow`
seconds to make, and a pause refills the queue, as a DataLoader's workers do (H100 ResNet-18, 2 workers: timed
28, 29, 92, 101, 93 ms; the window, opened after a pause, profiled 42 ms steps)."""
import time

import torch

import profiling
from profiling.profile.trace import irregular


class Queue:
    """next() is instant while batches are ready; else it takes `slow` s. A pause refills the queue (workers)."""

    def __init__(self, ahead, slow):
        self.ahead, self.ready, self.slow, self.last = ahead, ahead, slow, time.perf_counter()

    def next(self):
        now = time.perf_counter()
        self.ready = min(self.ahead, self.ready + int((now - self.last) / self.slow))  # made while we were away
        if self.ready > 0:
            self.ready -= 1
        else:
            time.sleep(self.slow)
        self.last = time.perf_counter()


def test_rising_times_are_warm_up_and_flat_or_noisy_ones_are_not():
    assert irregular.rising([28.2, 28.9, 92.2, 100.6, 93.0])
    assert not irregular.rising([93.0, 95.1, 92.2, 100.6, 93.0])
    assert not irregular.rising([150.0, 30.1, 29.2, 30.6, 29.0])   # a slow first step is an outlier, not a trend
    assert not irregular.rising([0.2, 0.2, 0.5, 0.6, 0.5])          # sub-ms jitter


def test_a_draining_queue_is_profiled_at_its_steady_state(tmp_path):
    queue = Queue(ahead=2, slow=0.04)
    prof = profiling.Profiler(None, out_dir=tmp_path, warmup_steps=0, timed_steps=4, active_steps=3, memory=False)
    assert not prof.settle  # on CUDA only (a CPU step's time swings too much): turned on here to test it
    prof.settle = True
    while not prof.done:
        queue.next()
        torch.ones(64).mul(2).sum()  # the step's own work (a trace needs operators)
        prof.step()
    s = prof.result.summary
    timed = s.get("timed_step_ms_each") or prof.metadata["timed_step_ms_each"]
    assert min(timed) > 30, timed               # the timing started again once the queue ran dry
    assert s["step_ms"] > 30, s["step_ms"]       # and the profiled steps are the steady ones, not the refilled queue's
    assert "taken as warm-up" in prof.result.report


def test_the_window_records_no_step_of_a_refilled_queue():
    """The window's own warm-up grows while its steps run under 70% of the unprofiled step."""
    from profiling.profile.capture import window

    queue = Queue(ahead=3, slow=0.04)
    time.sleep(0.2)  # the pause before the window: the queue is full
    w = window.Window(1, 2, {"settings": {"recorded": False}}, steady_ms=40.0)
    trace, steps = None, 0
    while trace is None:
        queue.next()
        torch.ones(64).mul(2).sum()
        trace, steps = w.step(), steps + 1
    assert trace["autoresearch"]["window_settle_steps"] == 3  # the 3 ready batches, then the first slow step
    assert "began 3 step(s) late" in " ".join(irregular.notes(trace["autoresearch"]))


def test_a_steady_loop_is_timed_once_and_recorded_at_once(tmp_path):
    prof = profiling.Profiler(None, out_dir=tmp_path, warmup_steps=0, timed_steps=4, active_steps=3, memory=False)
    while not prof.done:
        time.sleep(0.02)
        torch.ones(64).mul(2).sum()
        prof.step()
    assert "settling" not in prof.metadata and "window_settle_steps" not in prof.metadata
    assert "taken as warm-up" not in prof.result.report
