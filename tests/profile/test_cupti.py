"""CUPTI held through the capture's sessions and released after them (profiling/profile/capture/cupti.py): the
environment as kineto reads it at each point, on the CPU with a stand-in for torch.profiler's session."""
import contextlib
import os

import pytest
import torch.profiler

from profiling.profile.capture import cupti


@pytest.fixture
def sessions(monkeypatch):
    """The TEARDOWN_CUPTI value each (stand-in) profiler session saw as it was configured."""
    seen = []

    @contextlib.contextmanager
    def profile(activities):
        seen.append((os.environ.get(cupti.VAR), tuple(activities)))
        yield

    monkeypatch.setattr(torch.profiler, "profile", profile)
    monkeypatch.delenv(cupti.VAR, raising=False)
    monkeypatch.delenv(cupti.GRAPHS, raising=False)
    return seen


def test_held_through_the_capture_then_released_and_unset_again(sessions):
    hold = cupti.Hold()
    assert os.environ[cupti.VAR] == "0"  # the window's session ending does not tear CUPTI down under the next
    hold.release()
    assert sessions == [("1", (torch.profiler.ProfilerActivity.CPU,))]  # one empty session tears it down
    assert cupti.VAR not in os.environ  # nothing left changed
    hold.release()
    assert len(sessions) == 1  # once only


def test_the_users_own_values(sessions, monkeypatch):
    monkeypatch.setenv(cupti.VAR, "1")
    hold = cupti.Hold()
    assert os.environ[cupti.VAR] == "0"
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
    assert sessions == [] and cupti.VAR not in os.environ


def test_a_failing_release_never_stops_the_run(monkeypatch):
    monkeypatch.delenv(cupti.VAR, raising=False)
    monkeypatch.delenv(cupti.GRAPHS, raising=False)

    def broken(activities):
        raise RuntimeError("kineto")
    monkeypatch.setattr(torch.profiler, "profile", broken)
    hold = cupti.Hold()
    hold.release()
    assert cupti.VAR not in os.environ
