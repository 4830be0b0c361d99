"""A profiled window the loop left open closes itself (issues #49, #55). Stdlib only.

A loop that stops stepping inside the window without close() (it breaks out, returns, or an exception is
caught outside it) would otherwise be profiled until the process exits: every operator it runs after is
recorded, the trace and the profiler's memory grow, and torch.profiler, the compiler's settings and the
launch-record switch stay on (issue #49: 10,000 eval forwards after such a loop grew the trace from 30 KB to
8.4 MB and the exit from 2 s to 13 s). A daemon thread looks every POLL_S at where the loop is:

    the loop's frame   the innermost regular frame common to every step() call's stack (a frame that was on
                       two stacks was on it in between), and in it the outermost loop (a backward jump of its
                       bytecode) around every place it called step() from
    stopped            that frame returned or raised (no frame of its function is on the thread's stack: a
                       new call of it, the next epoch's, is the same loop), or it runs past its loop (the
                       line it is at lies outside the loop's lines: it broke out, or the loop ended), for
                       max(LEFT_FLOOR_S, LEFT_STEPS x the slowest step)

A slow step is no stopped loop (issue #55): a checkpoint save, an eval or a log flush inside the loop, or a
Dataset that a record step after the window slows, never closes the window, however long it takes (the rule
it replaces, no step() for 20x the slowest step, lost the report of a loop whose 14th step saved for 3 s).
Where no loop encloses the step() calls (they come from straight-line code), only a return closes it.

When one holds, the window must be stopped on the thread that started it: torch.profiler's state is that
thread's (kineto keeps it in the thread's debug info; stopping it from another thread fails), and so are the
line tracer and the sync debug mode. The watchdog asks the interpreter to run the close on the main thread
at its next Python-level check (Py_AddPendingCall: between two bytecodes, as a signal handler runs, without
installing one), where it is re-checked: a step() in between, or the profiler's own code running, cancels it.
Only a loop on the main thread can be closed so (CPython runs pending calls there only); elsewhere the
window closes at exit as before. The thread costs the loop nothing: it never takes the main thread's time
unless the loop has stopped, and each step() only notes the time and its caller's frames.
"""
import contextlib
import ctypes
import dis
import functools
import os
import sys
import threading
import time
import weakref

POLL_S = 0.05         # how often the thread looks: a stopped loop is closed within this of its limit
# Once the loop's frame has left its loop, or returned while its caller runs outside any loop around that call,
# nothing steps again: a short wait, for the frames to settle. Longer costs: all that runs until the close is
# recorded (tiny eval forwards on the loaded 2-core CPU: 630k events a second), and stopping torch.profiler
# reads it all back.
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
        self.calls = {}           # id(frame) of a common frame -> the bytecode offsets it called step() from
        self.busy = 0             # the profiler's own code is running: never close then

    def stepped(self, caller, measured):
        """At the start of step(), on the loop's thread. caller: step()'s caller frame; measured: whether the
        step that just ended counts for the limit (not a warm-up step: compilation)."""
        now = time.perf_counter()
        self.thread = threading.get_ident()
        if measured and self.last is not None:
            self.slowest = max(self.slowest or 0.0, now - self.last)
        self.steps += 1
        stack, offsets = [], []
        frame = caller
        while frame is not None:
            stack.append((id(frame), frame.f_code))
            offsets.append(frame.f_lasti)
            frame = frame.f_back
        stack.reverse()
        offsets.reverse()
        if self.common is None:
            self.common = stack
        else:
            n = 0
            for a, b in zip(self.common, stack):
                if a[0] != b[0] or a[1] is not b[1]:
                    break
                n += 1
            del self.common[n:]
        kept = {entry[0] for entry in self.common}
        self.calls = {key: seen for key, seen in self.calls.items() if key in kept}
        for (key, _), offset in zip(self.common, offsets):
            self.calls.setdefault(key, set()).add(offset)

    def returned(self):
        self.last = time.perf_counter()

    def loop_frame(self):
        """(id, code) of the innermost regular frame on every step() call's stack (a generator's frame is off
        the stack while it waits), or None before two calls."""
        regular = self._regular()
        return regular[-1] if regular else None

    def _regular(self):
        """The regular frames on every step() call's stack, outermost first; none before two calls."""
        if self.steps < 2 or not self.common:
            return []
        return [entry for entry in self.common if not entry[1].co_flags & GENERATOR_FLAGS]

    def limit(self):
        return max(LEFT_FLOOR_S, LEFT_STEPS * (self.slowest or 0.0))

    def stopped(self, watch_frames=True):
        """How the loop has stopped, in words, or None while it may still step. Read from any thread.

        The innermost frame of those on every step() call's stack that still runs decides: the loop's own
        frame has stopped the loop once it runs past the loop that called step(); a frame further out, the
        loop's having returned, unless it runs inside a loop around the call that led to step() (an epoch
        loop calling `train_epoch()` again after an eval)."""
        if self.busy or self.last is None or not watch_frames:
            return None
        idle = time.perf_counter() - self.last
        regular = self._regular()
        if not regular or idle <= self.limit():
            return None
        running = _running(self.thread)
        code = regular[-1][1]
        for depth, entry in enumerate(reversed(regular)):
            frame = running.get(entry[0])
            if frame is None or frame.f_code is not entry[1]:
                continue
            span = loop_lines(entry[1], frozenset(self.calls.get(entry[0], ())))
            line = frame.f_lineno
            if line is None or (span is not None and span[0] <= line <= span[1]):
                return None  # inside the loop that steps, or around the call that leads to it
            if depth == 0 and span is None:
                return None  # straight-line code steps until it returns
            if depth == 0:
                return (f"its loop in {code.co_name} (lines {span[0]}-{span[1]} of {_short(code.co_filename)}) "
                        f"went on to line {line}, no step() for {idle:.1f} s")
            break
        return (f"its function {code.co_name} ({_short(code.co_filename)}:{code.co_firstlineno}) returned, "
                f"no step() for {idle:.1f} s")


def _running(thread):
    """{id(frame): frame} of the frames on the thread's stack."""
    frame, frames = sys._current_frames().get(thread), {}
    while frame is not None:
        frames[id(frame)] = frame
        frame = frame.f_back
    return frames


@functools.lru_cache(maxsize=256)
def loop_lines(code, offsets):
    """(first, last) source line of the outermost loop of `code` whose bytecode holds every offset in
    `offsets` (where it called step() from), or None where no loop holds them all. A loop is a backward
    jump: its target to the jump. Lines, not offsets, bound it: an exception handler inside the loop may be
    compiled after it (Python 3.12's cold blocks), its lines stay inside."""
    if not offsets:
        return None
    best = None
    for ins in dis.get_instructions(code):
        target = ins.argval if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs else None
        if isinstance(target, int) and target <= ins.offset and target <= min(offsets) \
                and max(offsets) <= ins.offset and (best is None or ins.offset - target > best[1] - best[0]):
            best = (target, ins.offset)
    if best is None:
        return None
    lines = [line for start, end, line in code.co_lines() if line is not None and start <= best[1]
             and end > best[0]]
    return (min(lines), max(lines)) if lines else None


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
            if self._queued or _exiting() or self.pace.stopped(self.watch_frames) is None:
                continue
            self._queued = _ADD_PENDING(_PENDING, None) == 0  # -1: the queue is full, asked again next time
            self.scheduled += self._queued

    def fire(self):
        """On the main thread, from the pending call: close the window if the loop is still stopped."""
        self._queued = False
        if self._stop.is_set() or _exiting():  # at exit the atexit hook closes it, before torch's own
            return
        if _in_own_code(sys._getframe(1)):  # landed inside the profiler's own code (its line tracer): later
            return
        reason = self.pace.stopped(self.watch_frames)
        close = self._close()
        if reason is None or close is None or close(reason) is False:  # False: not here, asked again
            return
        self.stop()


PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # profiling/


SELF = os.path.abspath(__file__)


def _in_own_code(frame):
    """Whether a frame of the profiler's own code (not this module's) is on the stack from `frame` out: a
    close landing there (inside the line tracer's call, say) would be undone when that code goes on."""
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(PACKAGE) and path != SELF:
            return True
        frame = frame.f_back
    return False


def _exiting():
    """Whether the interpreter is exiting: threading's shutdown has stopped the main thread (it then waits for
    the other threads, running Python where a pending call may land) or finalization has begun. A close
    there failed ("cannot join current thread") and left torch.profiler half-stopped: a segfault at exit."""
    return sys.is_finalizing() or not threading.main_thread().is_alive()


_live = weakref.WeakSet()   # the watchdogs running (a pending call finds its own among them)


_later = []   # (thread id, call): what a finalizer on another thread left for the loop's thread (`later`)


def later(thread, call):
    """Run `call` on the thread `thread` instead of this one: at the main thread's next check (a pending call)
    where that is the main thread, else at exit (`run_later`, from the exit hook)."""
    _later.append((thread, call))
    if _ADD_PENDING is not None and thread == threading.main_thread().ident:
        _ADD_PENDING(_PENDING, None)


def run_later(thread=None):
    """Run what `later` left for `thread` (None: all of it, at exit), each call's failure its own."""
    for item in [x for x in list(_later) if thread is None or x[0] == thread]:
        with contextlib.suppress(ValueError):
            _later.remove(item)
            try:
                item[1]()
            except Exception:  # noqa: BLE001 (the call says its own failures)
                pass


def _run_pending(_):
    """The pending call, on the main thread between two bytecodes: what `later` left for it, then fire each
    running watchdog. Never raises (an exception here would appear in the user's code); a Ctrl-C that lands
    in it is given back."""
    try:
        if _later and not _exiting():  # at exit the exit hook runs them, before torch's own
            run_later(threading.get_ident())
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
