"""Fixtures of the profile's tests: the real traces in tests/data, each read from disk once per session."""
import functools
import gzip
import hashlib
import os
import pickle

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


def _shared_folder(tmp_path_factory):
    """A folder every xdist worker of this run sees (the workers' base temp folders share a parent), or this
    process's own without xdist."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "fixture-summaries"
    folder.mkdir(exist_ok=True)
    return folder


class _Computed:
    """Values computed once per test run, shared by the xdist workers through pickles in a folder of this run's
    (written whole, then renamed: a worker reads a file complete or not at all). Each call returns a fresh
    unpickled copy, for a test to change at will. For values that depend on their key alone: the same code on
    the same file gives the same summary (no environment read, no randomness, the same under any hash seed)."""

    def __init__(self, folder):
        self.folder = folder
        self.kept = {}

    def get(self, key, compute):
        if key not in self.kept:
            path = self.folder / (hashlib.md5(repr(key).encode()).hexdigest() + ".pickle")
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                data = pickle.dumps(compute(), protocol=pickle.HIGHEST_PROTOCOL)
                tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                tmp.write_bytes(data)
                os.replace(tmp, path)
            self.kept[key] = data
        return pickle.loads(self.kept[key])


@pytest.fixture(scope="session")
def computed(tmp_path_factory):
    """computed.get(key, compute) -> a fresh copy of compute()'s value, computed once per run for all workers."""
    return _Computed(_shared_folder(tmp_path_factory))


def _summary_and_admitted(path):
    """summarize() of the recorded trace at `path`, and what the ledger admitted on the way (each admitted
    finding's kind, kernels and gaps: keys the summary does not keep; tests/profile/test_ledger.py reads them)."""
    from profiling.profile.findings import ledger
    from profiling.profile.report.summary import summarize

    seen = []
    admit = ledger.admit

    def spy(found, ctx):
        out, notes = admit(found, ctx)
        seen.append([{"kind": f["kind"], "_kernels": list(f["_kernels"]), "_gaps": list(f["_gaps"])} for f in out])
        return out, notes
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ledger, "admit", spy)
        s = summarize(traceio.load_trace(path))
    return {"summary": s, "admitted": seen}


class _DataSummary:
    """data_summary(name) -> summarize() of tests/data/<name>.trace.json.gz (or of tests/data/<name> when the
    name is a file's, or of a path), untouched: a fresh copy of a summary made once per run.
    data_summary.full(name) -> {"summary": ..., "admitted": ...} (_summary_and_admitted). Only for a test that
    changes nothing summarize() reads (no monkeypatch of the profile's code): the summary is the recorded file's."""

    def __init__(self, computed):
        self.computed = computed

    def __call__(self, name):
        return self.full(name)["summary"]

    def full(self, name):
        path = os.path.abspath(name if os.path.isabs(name) else _path(name))
        return self.computed.get(("summary", os.path.relpath(path, DATA)), lambda: _summary_and_admitted(path))


@pytest.fixture(scope="session")
def data_summary(computed):
    """See _DataSummary."""
    return _DataSummary(computed)


@pytest.fixture(scope="session")
def foreign(data_summary):
    """foreign(name) -> the summary of tests/data/foreign/<name>.json.gz (data_summary's: made once per run, a fresh
    copy)."""
    return lambda name: data_summary(os.path.join(DATA, "foreign", f"{name}.json.gz"))
