"""A profiled window the loop left open closes itself (issue #49 item 2). Stdlib only.

A loop that stops stepping inside the window without close() (it breaks out, returns, or an exception is
caught outside it) would otherwise be profiled until the process exits: every operator it runs after is
recorded, the trace and the profiler's memory grow, and torch.profiler, the stack sampler, the compiler's
settings and the launch-record switch stay on (issue #49: 10,000 eval forwards after such a loop grew the
trace from 30 KB to 8.4 MB and the exit from 2 s to 13 s). A daemon thread looks every POLL_S at how the loop
steps:

    stopped       no step() for longer than any step seen could take: max(LIMIT_FLOOR_S, LIMIT_STEPS x the
                  slowest step since the warm-up); none is measured before two steps after it
    left          the function the loop runs in (the innermost regular frame common to every step() call's
                  stack; a frame that was on two stacks was on it in between) is no longer on the thread's
                  stack, nor a new call of it: it returned or raised; then the limit is max(LEFT_FLOOR_S,
                  LEFT_STEPS x the slowest step)

When one holds, the window must be stopped on the thread that started it: torch.profiler's state is that
thread's (kineto keeps it in the thread's debug info; stopping it from another thread fails), and so are the
line tracer and the sync debug mode. The watchdog asks the interpreter to run the close on the main thread
at its next Python-level check (Py_AddPendingCall: between two bytecodes, as a signal handler runs, without
installing one), where it is re-checked: a step() in between, or the profiler's own code running, cancels it.
Only a loop on the main thread can be closed so (CPython runs pending calls there only); elsewhere the
window closes at exit as before. The thread costs the loop nothing: it never takes the main thread's time
unless the loop has stopped, and each step() only notes the time and the ids of its caller's frames.
"""
import ctypes
import sys
import threading
import time
import weakref

POLL_S = 0.05         # how often the thread looks: a stopped loop is closed within this of its limit
# A pause in a loop that still steps is an eval, a checkpoint save or a log flush: issue #49's eval of 100
# batches inside the window took 14x a step (0.4 s on the CPU), a save 1.8x; 20x leaves room for those, the
# floor for a fast step's pauses (a garbage collection, a first DataLoader batch). Longer costs: all that runs
# until the close is recorded, and stopping torch.profiler reads it all back (tiny eval forwards on the loaded
# 2-core CPU: 630k events a second recorded, about 6 s to stop and read back per second recorded).
LIMIT_STEPS, LIMIT_FLOOR_S = 20, 1.0
# Once the loop's function has returned and no new call of it runs, nothing steps again but a later call
# (a loop in `train_epoch`, called again after an eval between epochs): a short wait.
LEFT_STEPS, LEFT_FLOOR_S = 3, 0.25
# CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR: frames off the stack while they wait
GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200


class Pace:
    """How the loop steps, noted by step() on the loop's thread: the end of the last step() call, the slowest
    step since the warm-up, and the frames common to every step() call's stack."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.last = None          # perf_counter when the last step() returned
        self.slowest = None       # seconds: the slowest step measured (from one step() to the next)
        self.steps = 0            # step() calls seen
        self.common = None        # [(id(frame), code)], outermost first: on every step() call's stack
        self.busy = 0             # the profiler's own code is running: never close then

    def stepped(self, caller, measured):
        """At the start of step(), on the loop's thread. caller: step()'s caller frame; measured: whether the
        step that just ended counts for the limit (not a warm-up step: compilation)."""
        now = time.perf_counter()
        self.thread = threading.get_ident()
        if measured and self.last is not None:
            self.slowest = max(self.slowest or 0.0, now - self.last)
        self.steps += 1
        stack = []
        frame = caller
        while frame is not None:
            stack.append((id(frame), frame.f_code))
            frame = frame.f_back
        stack.reverse()
        if self.common is None:
            self.common = stack
        else:
            n = 0
            for a, b in zip(self.common, stack):
                if a[0] != b[0] or a[1] is not b[1]:
                    break
                n += 1
            del self.common[n:]

    def returned(self):
        self.last = time.perf_counter()

    def loop_frame(self):
        """(id, code) of the innermost regular frame on every step() call's stack (a generator's frame is off
        the stack while it waits), or None before two calls."""
        if self.steps < 2 or not self.common:
            return None
        for entry in reversed(self.common):
            if not entry[1].co_flags & GENERATOR_FLAGS:
                return entry
        return None

    def limit(self, left):
        if self.slowest is None:
            return None
        steps, floor = (LEFT_STEPS, LEFT_FLOOR_S) if left else (LIMIT_STEPS, LIMIT_FLOOR_S)
        return max(floor, steps * self.slowest)

    def stopped(self, watch_frames=True):
        """Why the loop has stopped, in words, or None while it may still step. Read from any thread."""
        if self.busy or self.last is None:
            return None
        idle = time.perf_counter() - self.last
        frame = self.loop_frame() if watch_frames else None
        left = frame is not None and not _on_stack(self.thread, frame)
        limit = self.limit(left)
        if limit is None or idle <= limit:
            return None
        if left:
            code = frame[1]
            where = f"{_short(code.co_filename)}:{code.co_firstlineno}"
            return f"its function {code.co_name} ({where}) returned, no step() for {idle:.1f} s"
        return (f"no step() for {idle:.1f} s (the limit: {LIMIT_STEPS}x its slowest step, "
                f"{1e3 * self.slowest:.0f} ms, or {LIMIT_FLOOR_S:.0f} s at least)")


def _on_stack(thread, entry):
    """Whether the loop's frame, or a new call of its function (the next epoch's), is on the thread's
    stack."""
    frame = sys._current_frames().get(thread)
    while frame is not None:
        if frame.f_code is entry[1]:
            return True
        frame = frame.f_back
    return False


def _short(path):
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


class Watchdog:
    """The thread that closes a stopped loop's window: `close(reason)` is called on the loop's thread (the
    main one) when `pace.stopped()` holds there too; it returns False where it cannot close there (the call
    is made again at the next look). Holds `close` weakly (a bound method of the Profiler:
    a dropped Profiler is closed by its own guard)."""

    def __init__(self, pace, close, watch_frames=True):
        self.pace, self.watch_frames = pace, watch_frames
        self._close = weakref.WeakMethod(close)
        self._stop = threading.Event()
        self._thread = None
        self._queued = False      # a pending call asked for and not run yet
        self.scheduled = 0        # pending calls asked for (none while the loop steps)

    @staticmethod
    def possible(pace):
        """Whether a window on this thread can be closed from the watchdog: the main thread, in CPython."""
        return _ADD_PENDING is not None and pace.thread == threading.main_thread().ident

    def start(self):
        if not self.possible(self.pace):
            return
        _live.add(self)
        self._thread = threading.Thread(target=self._run, name="autoresearch-watchdog", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        _live.discard(self)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    def _run(self):
        while not self._stop.wait(POLL_S):
            if self._queued or self.pace.stopped(self.watch_frames) is None:
                continue
            self._queued = _ADD_PENDING(_PENDING, None) == 0  # -1: the queue is full, asked again next time
            self.scheduled += self._queued

    def fire(self):
        """On the main thread, from the pending call: close the window if the loop is still stopped."""
        self._queued = False
        if self._stop.is_set():
            return
        reason = self.pace.stopped(self.watch_frames)
        close = self._close()
        if reason is None or close is None or close(reason) is False:  # False: not here, asked again
            return
        self.stop()


_live = weakref.WeakSet()   # the watchdogs running (a pending call finds its own among them)


def _run_pending(_):
    """The pending call, on the main thread between two bytecodes: fire each running watchdog. Never raises
    (an exception here would appear in the user's code); a Ctrl-C that lands in it is given back."""
    try:
        for dog in list(_live):
            dog.fire()
    except KeyboardInterrupt:
        import _thread
        _thread.interrupt_main()
    except BaseException:  # noqa: BLE001 (the profiler must never change how the run goes)
        pass
    return 0


def _pending_api():
    """(Py_AddPendingCall, the callback), or (None, None) outside CPython. The callback lives as long as the
    module: a pending call may run after the watchdog that asked for it is gone."""
    try:
        if sys.implementation.name != "cpython":
            return None, None
        kind = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
        add = ctypes.pythonapi.Py_AddPendingCall
        add.argtypes, add.restype = [kind, ctypes.c_void_p], ctypes.c_int
        return add, kind(_run_pending)
    except (AttributeError, OSError):
        return None, None


_ADD_PENDING, _PENDING = _pending_api()
