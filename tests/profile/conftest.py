"""Fixtures of the profile's tests: the real traces in tests/data, each read once per session."""
import copy
import os

import pytest

from profiling.profile.summary import load_trace

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


@pytest.fixture(scope="session")
def data_trace():
    """data_trace(name) -> a fresh copy of tests/data/<name>.trace.json.gz, for a test to change at will."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load_trace(os.path.join(DATA, f"{name}.trace.json.gz"))
        return copy.deepcopy(cache[name])
    return get
