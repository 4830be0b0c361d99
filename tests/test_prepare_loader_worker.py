"""make_dataloader's background worker (issue #25): the same batches as the inline loader it replaced, errors
as one-line PrepareErrors, and no hang or orphan process at exit, on Ctrl-C, an early abort or a crash."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import prepare
from prepare import PrepareError, Tokenizer, make_dataloader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def inline_loader(tokenizer, B, T, split, buffer_size=1000):
    """make_dataloader as it was before the worker (commit c64cda3), on the CPU: the reference."""
    bos = tokenizer.get_bos_token_id()
    batches = prepare.document_batches(split)
    token_batches = ((tokenizer.encode(texts, prepend=bos), epoch) for texts, epoch in batches)
    for rows, epoch in prepare.best_fit_rows(token_batches, B, T + 1, buffer_size):
        rows = torch.from_numpy(rows)
        yield rows[:, :-1].contiguous(), rows[:, 1:].contiguous(), epoch


@pytest.fixture(scope="module")
def tok(prepared_cache):
    return Tokenizer.from_directory()


@pytest.mark.parametrize("split,B,T,n", [("train", 16, 256, 40), ("val", 64, 256, 80)])
def test_same_batches_in_the_same_order_as_the_inline_loader(tok, split, B, T, n):
    new, old = make_dataloader(tok, B, T, split, buffer_size=100), inline_loader(tok, B, T, split, 100)
    epochs = set()
    for _ in range(n):
        (x, y, e), (rx, ry, re) = next(new), next(old)
        assert torch.equal(x, rx) and torch.equal(y, ry) and e == re
        epochs.add(e)
    assert split == "train" or len(epochs) > 1  # the val split wraps: epochs follow the reference too


@pytest.fixture
def broken_cache(prepared_cache, tmp_path, monkeypatch):
    """A copy of the prepared cache whose second training shard is garbage."""
    cache = tmp_path / "cache"
    shutil.copytree(prepared_cache, cache)
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    manifest = prepare.read_manifest("builtin", str(cache))
    (cache / "builtin" / manifest["train"][1]).write_bytes(b"<html>rate limited</html>" * 100)
    return cache


def test_a_corrupt_shard_is_a_one_line_error_from_the_worker(broken_cache):
    loader = make_dataloader(Tokenizer.from_directory(), 32, 256, "train")
    with pytest.raises(PrepareError) as e:
        for _ in range(1000):
            next(loader)
    assert "is unreadable" in str(e.value) and "\n" not in str(e.value) and "Traceback" not in str(e.value)


def test_an_unprepared_dataset_is_a_one_line_error(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    with pytest.raises(PrepareError, match="is not prepared") as e:
        next(make_dataloader(tok, 2, 16, "train", dataset="builtin", cache=str(tmp_path)))
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_train_py_exits_2_with_the_one_line_error(broken_cache):
    """The run's exit status and message are the runner's for a PrepareError, as before the worker."""
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET="5", AUTORESEARCH_GATE="off")
    p = subprocess.run([sys.executable, "train.py", "--no-profile", "--run-file", str(broken_cache / "run.json")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "is unreadable" in errors[0] and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------------------------
# Ends: every way the consumer can stop leaves no process behind, within seconds
# ---------------------------------------------------------------------------------------------------------

CONSUMER = textwrap.dedent("""
    import multiprocessing, os, signal, sys, time
    sys.path.insert(0, {root!r})
    import prepare
    loader = prepare.make_dataloader(prepare.Tokenizer.from_directory(), 8, 64, "train")
    next(loader)
    print(" ".join(str(c.pid) for c in multiprocessing.active_children()), flush=True)
    how = sys.argv[1]
    if how == "return":
        sys.exit(0)
    if how == "early_abort":
        sys.exit(3)
    if how == "crash":
        raise RuntimeError("a bug in the training loop")
    time.sleep(60)  # the test interrupts (Ctrl-C) or kills this process while it sleeps
""")


def _gone(pid):
    """True when pid is no running process (an unreaped zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]


def _terminal_signals():
    """The child's Ctrl-C as a terminal's process gets it, whatever the test runner's process inherited (an
    ignored SIGINT stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how,code", [("return", 0), ("early_abort", 3), ("crash", 1), ("ctrl_c", -signal.SIGINT),
                                      ("killed", -signal.SIGKILL)])
def test_no_hang_and_no_orphan_worker(prepared_cache, how, code):
    p = subprocess.Popen([sys.executable, "-c", CONSUMER.format(root=ROOT), how], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=_terminal_signals)
    workers = [int(pid) for pid in p.stdout.readline().split()]
    assert len(workers) == 1  # one worker process
    if how == "ctrl_c":  # as a terminal does: SIGINT to the whole foreground process group, worker included
        os.killpg(p.pid, signal.SIGINT)
    elif how == "killed":
        p.kill()
    try:
        p.wait(timeout=30)  # a hang at exit fails here
    finally:
        p.kill()
    assert p.returncode == code, p.stderr.read()[-2000:]
    # at exit the worker is stopped at once; a killed parent is noticed by the worker's watchdog (5 s polls)
    assert _wait_gone(workers, 15) == []


def test_worker_batches_are_not_shared_memory_views_of_each_other(tok):
    loader = make_dataloader(tok, 4, 32, "train")
    first = [next(loader)[0] for _ in range(prepare.LOADER_DEPTH + 2)]
    copies = [x.clone() for x in first]
    for _ in range(prepare.LOADER_DEPTH * 2):
        next(loader)
    assert all(torch.equal(a, b) for a, b in zip(first, copies))  # kept batches never change under us
    assert len({tuple(np.asarray(x).ravel()[:32]) for x in first}) == len(first)
