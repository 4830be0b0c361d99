"""Fixtures of the profile's tests: the real traces in tests/data, each read from disk once per session."""
import functools
import gzip
import os

import pytest

from profiling.profile.trace import traceio

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


@functools.lru_cache(maxsize=None)
def _trace_json(name):
    """The decompressed JSON text of tests/data/<name>.trace.json.gz, or of tests/data/<name> when the name is a
    file's (`foreign/<file>.json.gz`); a few MB at most."""
    with open(_path(name), "rb") as f:
        return gzip.decompress(f.read())


def _path(name):
    return os.path.join(DATA, name if name.endswith(".json.gz") else f"{name}.trace.json.gz")


@pytest.fixture(scope="session")
def data_trace():
    """data_trace(name) -> a fresh copy of tests/data/<name>.trace.json.gz, for a test to change at will.
    Parsed anew from the text kept in memory: about twice as fast as copy.deepcopy of a parsed trace."""
    def get(name):
        path = _path(name)
        trace = traceio.parse_json(_trace_json(name), path)
        traceio.check_trace(trace, source=path)
        return trace
    return get
