"""Profiles an unmodified training script from outside it (issue #57: tests/data/foreign/SOURCES.md). Python imports
this module at start-up when its folder is on PYTHONPATH; it does nothing unless PUB_PROF_OUT is set:

    PUB_PROF_OUT=trace.json.gz   # where the Chrome trace goes, gzipped (written to a temp name, then renamed)
    PUB_PROF_ACTIVITY=cuda|cpu   # cuda: CPU + CUDA activities (the default); cpu: CPU activity only
    PUB_PROF_STACK=1             # with_stack=True
    PUB_PROF_FORWARDS=N          # stop after N top-level module forwards (a loss module counts as one)
    PUB_PROF_SECONDS=S           # or at the first top-level forward S seconds after start (one done), if sooner
    PUB_PROF_START=M             # start at the M-th top-level forward (M > 0: a warm window), not at import
    PUB_PROF_TIME=1              # no profiler: PUB_PROF_OUT gets {"forwards": [seconds at each top-level
                                 # forward from START on]} as JSON (a fix's unprofiled iteration times)

The profiler starts here, right after `import torch`, with no schedule: one window from the process's start, no
ProfilerStep markers. Global forward hooks count top-level forwards (depth 0, main thread); the stop is checked in
the pre-hook of the next top-level forward, so it falls between iterations. There the pending GPU work is waited
for, the profiler stopped, the trace written, one line printed (`pub-prof: wrote PATH (N forwards, S s)`) and the
process ended with os._exit(0) (DataLoader workers must not keep it alive). If the script ends first, an atexit
handler writes the trace. PUB_PROF_OUT is taken out of the environment, so child interpreters do not profile.
"""
import os

_OUT = os.environ.pop("PUB_PROF_OUT", "")

if _OUT:
    import atexit
    import gzip
    import shutil
    import sys
    import threading
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    _T0 = time.monotonic()
    _PID = os.getpid()
    _CUDA = os.environ.get("PUB_PROF_ACTIVITY", "cuda") != "cpu"
    _FORWARDS = int(os.environ.get("PUB_PROF_FORWARDS") or 0)
    _START = int(os.environ.get("PUB_PROF_START") or 0)
    _SECONDS = float(os.environ.get("PUB_PROF_SECONDS") or 0)
    _state = {"forwards": 0, "done": False}
    _depth = threading.local()

    _TIMES = [] if os.environ.get("PUB_PROF_TIME") == "1" else None
    _prof = None if _TIMES is not None else profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if _CUDA else []), record_shapes=True,
        with_stack=os.environ.get("PUB_PROF_STACK") == "1")
    if not _START and _prof is not None:
        _prof.start()

    def _write():
        """Stops the profiler and writes the gzipped trace; returns False when it was already written."""
        if _state["done"] or os.getpid() != _PID or _START and _state["forwards"] < _START:
            return False  # once, never from a forked DataLoader worker, never before a warm window began
        _state["done"] = True
        if _CUDA and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the last iteration's kernels finished, so recorded
        secs = time.monotonic() - _T0
        if _prof is None:
            import json
            with open(_OUT + ".tmp", "w") as f:
                json.dump({"forwards": _TIMES}, f)
            os.replace(_OUT + ".tmp", _OUT)
            print(f"pub-prof: wrote {_OUT} ({_state['forwards']} forwards, {secs:.1f} s)", flush=True)
            return True
        _prof.stop()
        raw, tmp = (_OUT[:-3] if _OUT.endswith(".gz") else _OUT + ".json"), _OUT + ".tmp"
        _prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.remove(raw)
        os.replace(tmp, _OUT)
        print(f"pub-prof: wrote {_OUT} ({_state['forwards']} forwards, {secs:.1f} s)", flush=True)
        return True

    def _pre(module, args):
        d = getattr(_depth, "d", 0)
        _depth.d = d + 1
        if d or threading.current_thread() is not threading.main_thread():
            return None
        n = _state["forwards"]
        if _START and n == _START and not _state.get("started"):
            _state["started"] = True
            if _CUDA and torch.cuda.is_initialized():
                torch.cuda.synchronize()  # the window begins with nothing of the iterations before it queued
            if _prof is not None:
                _prof.start()
        if _TIMES is not None and n >= _START:
            _TIMES.append(time.monotonic())
        if (_FORWARDS and n >= _FORWARDS) or (_SECONDS and n and time.monotonic() - _T0 >= _SECONDS):
            _write()
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(0)
        return None

    def _post(module, args, output):
        _depth.d = max(getattr(_depth, "d", 1) - 1, 0)
        if _depth.d == 0 and threading.current_thread() is threading.main_thread():
            _state["forwards"] += 1
        return None

    torch.nn.modules.module.register_module_forward_pre_hook(_pre)
    torch.nn.modules.module.register_module_forward_hook(_post)
    atexit.register(_write)
