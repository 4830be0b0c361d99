"""CUPTI held through the capture's sessions and released after them (profiling/profile/capture/cupti.py): the
environment as kineto reads it at each point, on the CPU with a stand-in for torch.profiler's session."""
import contextlib
import os

import pytest
import torch.profiler

from profiling.profile.capture import cupti, window  # window before any test patches torch.profiler.profile
from profiling.profile.trace import settings


@pytest.fixture
def sessions(monkeypatch):
    """The TEARDOWN_CUPTI value each (stand-in) profiler session saw as it was configured."""
    seen = []

    @contextlib.contextmanager
    def profile(activities):
        seen.append((os.environ.get(cupti.VAR), tuple(activities)))
        yield

    monkeypatch.setattr(torch.profiler, "profile", profile)
    unset(monkeypatch)
    return seen


def unset(monkeypatch):
    """Both variables unset, and put back as they were after the test (set first, so monkeypatch records them)."""
    for name in (cupti.VAR, cupti.GRAPHS):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_held_through_the_capture_then_released_and_left_set(sessions):
    hold = cupti.Hold()
    assert os.environ[cupti.VAR] == "0"  # the window's session ending does not tear CUPTI down under the next
    hold.release()
    assert sessions == [("1", (torch.profiler.ProfilerActivity.CPU,))]  # one empty session tears it down
    # left "1": unset, the teardown's end would subscribe CUPTI's callbacks again (kineto's lazy re-init off)
    assert os.environ[cupti.VAR] == "1" and hold.sets
    hold.release()
    assert len(sessions) == 1  # once only


def test_the_setting_it_leaves_is_named_as_the_profilers(sessions):
    hold = cupti.Hold()
    record = {"values": {}, "defaults": {}}
    record["profiler"] = window.own_settings(record, cuda=True, hold=hold)
    row = next(r for r in settings.differing(record) if r["name"] == "env." + cupti.VAR)
    assert (row["value"], row["by"]) == ("1", "profiler")
    assert "TEARDOWN_CUPTI=1 (profiler, from the capture on)" in settings.text(settings.summary(record))
    hold.release()


def test_the_users_own_values(sessions, monkeypatch):
    monkeypatch.setenv(cupti.VAR, "1")
    hold = cupti.Hold()
    assert os.environ[cupti.VAR] == "0" and not hold.sets  # the user's own "1": not the profiler's setting
    hold.release()
    assert os.environ[cupti.VAR] == "1" and len(sessions) == 1
    monkeypatch.setenv(cupti.VAR, "0")  # the user keeps CUPTI: never torn down
    hold = cupti.Hold()
    hold.release()
    assert os.environ[cupti.VAR] == "0" and len(sessions) == 1


def test_cuda_graphs_that_need_cupti_keep_it(sessions, monkeypatch):
    hold = cupti.Hold()
    monkeypatch.setenv(cupti.GRAPHS, "1")  # torch.profiler's mark, set as a session started
    hold.release()
    assert sessions == [] and cupti.VAR not in os.environ and not hold.sets


def test_a_failing_release_never_stops_the_run(monkeypatch):
    unset(monkeypatch)

    def broken(activities):
        raise RuntimeError("kineto")
    monkeypatch.setattr(torch.profiler, "profile", broken)
    hold = cupti.Hold()
    hold.release()
    assert os.environ[cupti.VAR] == "1"
