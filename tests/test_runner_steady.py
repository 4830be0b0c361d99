"""runner.steady_steps, unprofiled_reference and Run.profile_due: train.py's profile is checked against the loop's
steady steps only. A reference of cold or warm-up steps is no reference: the CPU's first run (issue #57) timed
steps of 4,501, 2,013 and 379 ms and called their mean, 2,297.50 ms, the unprofiled step of a 434.05 ms one."""
import types

import pytest

from profiling import runner


def test_cold_and_warm_up_steps_are_left_out():
    assert runner.steady_steps([4.501, 2.013, 0.379]) == [0.379]  # the three steps
    assert runner.steady_steps([31.0, 9.2, 0.310, 0.309, 0.311]) == [0.310, 0.309, 0.311]  # CUDA: 2 compiling
    assert runner.steady_steps([900, 700, 500, 400, 380]) == [400, 380]  # a loader filling its queue, step by step


def test_steady_steps_and_noise_stay():
    assert runner.steady_steps([380, 420, 390, 410]) == [380, 420, 390, 410]  # within SETTLE_RATIO: noise
    assert runner.steady_steps([100, 200, 300]) == [100, 200, 300]  # rising is not cold
    assert runner.steady_steps([380, 2000, 381, 382]) == [381, 382]  # a slow step: the steady ones after it
    assert runner.steady_steps([0.5]) == [0.5] and runner.steady_steps([]) == []


def test_the_reference_is_the_steady_steps_mean_in_ms_outliers_left_out():
    ms, each, outliers = runner.unprofiled_reference([4.501, 2.013, 0.379, 0.381, 0.380])
    assert each == pytest.approx([379, 381, 380]) and ms == pytest.approx(380) and outliers == []
    ms, each, outliers = runner.unprofiled_reference([0.380, 0.381, 0.382, 0.379, 2.0])  # a last slow step: gc
    assert len(each) == 5 and ms == pytest.approx(380.5)  # kept in the list, left out of the mean
    assert [(r["step"], r["ms"]) for r in outliers] == [(5, 2000.0)]  # the header names it


def run(profiling=True, profiled=False):
    return types.SimpleNamespace(profiling=profiling, profiled=profiled, ranks=types.SimpleNamespace(world_size=1))


def test_the_loop_profiles_once_its_steps_are_steady_and_at_the_last_step_whatever_they_are():
    due = runner.Run.profile_due
    cold = [4.501, 2.013, 0.379, 0.380]
    assert not due(run(), 4, cold + [0.381], 5, 10)  # before the first step it may
    assert not due(run(), 6, cold, 5, 10)  # two steady steps: not yet
    assert due(run(), 7, cold + [0.381], 5, 10)
    assert due(run(), 10, [4.5, 2.0, 1.0, 0.5], 5, 10)  # never steady: at the last step all the same
    assert not due(run(profiled=True), 7, cold + [0.381], 5, 10)  # once
    assert not due(run(profiling=False), 10, cold, 5, 10)  # --no-profile
