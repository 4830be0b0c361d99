"""The host's page faults: how many a step takes, and what one costs on this machine. Stdlib only.

A CPU loop whose memory is handed back to the OS at the end of a step faults it in again in the next: glibc's
malloc trims its heap and unmaps its large chunks once they are free, below thresholds it raises as it sees
larger frees (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). A tiny GPT-2 under HF's Trainer took 4,000-13,000 minor faults
a step on this project's 2-core CPU, each costing the loop 0.9-1.6 us there and on an H200 machine's CPU (the
thresholds switched inside one process: benchmarks/findings/live/new_user_fixes_cpu_results.md, run 8).
findings/cpu.py's page_faults prices them from the two figures here.
"""
import ctypes
import mmap
import os
import statistics
import sys
import threading
import time

PROBE_BYTES = 4 << 20   # fresh pages written once to time their faults: 1,024 pages of 4 KiB, shared by the threads
PROBES = 5              # their median (run 8 took the least of 3 of 8 MiB: a busy machine slows either pass)
MANY = 100              # faults a timed step (their median) from which one's cost is timed, on a Linux CPU run


def timed_meta(each, cuda, threads):
    """The trace metadata of the timed steps' faults (each step's count, in order): `timed_step_faults_each`,
    and `page_fault_us` on a Linux CPU run whose median step takes MANY (the fix findings/cpu.py names is
    glibc's; on a GPU the host's faults count only where the host bounds the step, which nothing here prices)."""
    if not each or None in each:
        return {}
    meta = {"timed_step_faults_each": list(each)}
    if not cuda and sys.platform.startswith("linux") and sorted(each)[len(each) // 2] >= MANY:
        meta["page_fault_us"] = cost_us(threads)
    return meta


def count():
    """The process's minor page faults so far (all its threads), None where the OS does not say (Windows)."""
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, OSError, AttributeError):
        return None


def cost_us(threads=1):
    """What one minor fault costs the step here, in us of wall time: anonymous pages mapped by this function
    (never malloc's, whose thresholds it would move) written twice by `threads` threads at once (the loop's
    intra-op threads, at most one a core, which write a step's fresh tensors together), the first pass's extra
    time over the faults it took; the median of PROBES. None where faults are not counted or none were taken."""
    each = [us for us in (_probe(max(1, min(threads, _cores()))) for _ in range(PROBES)) if us is not None]
    return statistics.median(each) if each else None


def _cores():
    """The cores this process may run on: more threads than these take their faults no faster."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _probe(threads):
    before = count()
    if before is None:
        return None
    size = max(mmap.PAGESIZE, PROBE_BYTES // threads // mmap.PAGESIZE * mmap.PAGESIZE)
    regions = [mmap.mmap(-1, size) for _ in range(threads)]
    views = [ctypes.c_char.from_buffer(r) for r in regions]
    try:
        addresses = [ctypes.addressof(v) for v in views]
        first = _write(addresses, size, 1)  # every page faulted in, then written (ctypes lets go of the GIL)
        faults = count() - before
        again = _write(addresses, size, 2)  # the same writes, no fault
    finally:
        del views
        for r in regions:
            r.close()
    extra = first - again
    return extra / faults * 1e6 if faults > 0 and extra > 0 else None


def _write(addresses, size, value):
    """Seconds for len(addresses) threads to each write `size` bytes at one of them."""
    workers = [threading.Thread(target=ctypes.memset, args=(a, value, size)) for a in addresses]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - t0
