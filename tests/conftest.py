"""Shared fixtures. prepare.py reads its constants from the environment at import, so the test-scale
defaults are set here, before any test module imports it (a value already in the environment wins)."""
import os
import signal
import tempfile

import pytest

os.environ.setdefault("AUTORESEARCH_PRESET", "cpu")
os.environ.setdefault("AUTORESEARCH_VOCAB_SIZE", "512")  # trains in about a second
# Inductor's CPU ISA check: without this, every process that compiles first builds six probe programs and
# starts a `python -c "import torch"` to load each (~15 s of a fresh compile's ~35 s on the 2-core CPU,
# tests/profile/test_lines.py's). "1" takes the ISAs the CPU reports (cpuid) without the probe builds; the
# avx512-bf16/vnni sub-checks still build. No test here is about the ISA check; the kernels are the same.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# No pool of compile workers in any process the tests start or run: starting one costs ~10 s of a 2-core CPU
# per compiling process, more than the few kernels a test compiles take on one thread. A value set outside wins.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# One OpenMP thread in every process the tests start (train.py, the example scripts, the compiling and
# profiling subprocesses): on a 2-core CI machine running two xdist workers, a subprocess with torch's default
# of a thread per core spins against the other worker, and a loaded shared machine makes it worse: a tiny
# `train.py` (test_rehearsal's) took 14-48 s with two threads against 8 s with one, here. No test is about the
# thread count (tests/profile/test_settings.py leaves the variable out of its fresh process; the in-process
# tests already run one thread a worker, pytest_configure below). A value set outside wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Compiled bytecode for the processes the tests start (train.py, the workers, the compiling scripts: each
# imports torch) where the environment turns it off (PYTHONDONTWRITEBYTECODE=1, as on the machine this was
# measured on): there every such process compiled again the ~580 modules of torch and networkx the venv holds
# no .pyc for, and this checkout's own, ~1 s of CPU a process that imports torch._inductor. The .pyc files go
# to a folder of their own (PYTHONPYCACHEPREFIX), never into the checkout or the venv, and are reused by the
# next run (Python checks each against its source). A PYTHONPYCACHEPREFIX set outside wins.
if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(),
                                                     f"autoresearch-tests-pycache-{os.getuid()}")
    del os.environ["PYTHONDONTWRITEBYTECODE"]


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """No test touches the user's real cache: AUTORESEARCH_CACHE starts as an empty session directory.
    A test that needs an empty cache of its own sets one with monkeypatch."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTORESEARCH_CACHE", str(tmp_path_factory.mktemp("empty-cache")))
        yield


@pytest.fixture(autouse=True)
def _sigint_kept():
    """Each test leaves Ctrl-C as it found it: Lightning ignores SIGINT for good once a fit is interrupted
    (lightning/pytorch/trainer/call.py), and a process started later in the same worker inherits the ignore
    (a later test's Ctrl-C then never arrived)."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not handler and handler is not None:
        signal.signal(signal.SIGINT, handler)


@pytest.fixture(scope="session")
def prepared_cache(tmp_path_factory, _isolated_cache):
    """A cache holding the builtin corpus and its tokenizer (VOCAB_SIZE from the environment, 512 by
    default), prepared once per session. Sets AUTORESEARCH_CACHE to it and returns the path."""
    import prepare

    cache = str(tmp_path_factory.mktemp("prepared-cache"))
    prepare.prepare("builtin", cache=cache)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTORESEARCH_CACHE", cache)
        yield cache


def pytest_configure(config):
    """Under pytest-xdist (pyproject's addopts), one torch thread per worker's share of the cores: with several
    workers each running torch's default of one thread per core, OpenMP's threads spin against each other and
    an in-process training test ran ~5x slower (tests/test_train_e2e.py, 2 cores, 2 workers). Subprocesses
    the tests start run one thread (OMP_NUM_THREADS above)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
