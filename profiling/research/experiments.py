"""experiments.json: the research memory on disk. Load, validate, append; never corrupt, never lose a record.

Shape (top-level keys in this order; `experiments` last so that an append never re-encodes old records):

    {"version": 1, "dimensions": [...], "rescue_pool": [...], "experiments": [...]}

Storage rules:
- Every read-modify-write holds an exclusive flock(2) on `<memory>.lock`.
- Every write is atomic: a temp file in the same directory, fsync, os.replace, fsync of the directory.
  Readers (`next`, `show`, the gate) therefore take no lock: they see the old file or the new one.
- A file that cannot be parsed or validated is never overwritten: the command stops with exit 2.
- Experiment records are append-only; ids are unique and increase down the file.
Pure Python, no torch. See docs/memory.md for what the lock relies on across hosts.
"""
import contextlib
import errno
import fcntl
import json
import math
import os
import time

from profiling.errors import UserError
from profiling.files import atomic_write, is_temp_of

VERSION = 1
DEFAULT_DIMENSIONS = (
    "optimizer", "architecture", "attention", "normalization", "schedule", "regularization", "batching",
)
# Accepted by `research log --dimension` without being in the file: the unchanged baseline and its
# reruns (how the noise floor gets measured). UCB1 never selects or counts it.
BASELINE_DIMENSION = "baseline"
UNLABELED_DIMENSION = "unlabeled"  # imported TSV rows without a `[dimension]` prefix
RESERVED_DIMENSIONS = (BASELINE_DIMENSION, UNLABELED_DIMENSION)
STATUSES = ("keep", "discard", "crash", "early_abort")
TOP_KEYS = ("version", "dimensions", "rescue_pool", "experiments")
# One experiment, keys in the order they are written. See docs/memory.md for each field.
RECORD_KEYS = (
    "id", "time", "commit", "dimension", "change", "rationale", "status", "run_status",
    "val_bpb", "baseline_bpb", "baseline_id", "improvement", "within_noise", "noise_floor",
    "peak_vram_mb", "mfu_percent", "num_steps", "training_seconds",
    "settings", "dataset", "device", "profile", "run_time", "gate", "loss_curve", "error", "oom", "source",
)
RESCUE_KEYS = ("id", "time", "from_experiment", "dimension", "mechanism", "reuse_signal")
LOCK_TIMEOUT_S = 120.0
LOCK_POLL_S = 0.005
_FIX = "fix it by hand or restore it (e.g. `git checkout -- FILE`); research never overwrites a file it cannot read"
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def default_path(cli_value=None):
    """The memory file: --memory, else $AUTORESEARCH_MEMORY, else ./experiments.json."""
    return cli_value or os.environ.get("AUTORESEARCH_MEMORY") or "experiments.json"


def empty_memory(dimensions=DEFAULT_DIMENSIONS):
    return {"version": VERSION, "dimensions": list(dimensions), "rescue_pool": [], "experiments": []}


# ----------------------------------------------------------------------------
# Validation: cheap per record (a 10,000-record file is checked in a few ms)

_NUMBERS = (int, float)
_NUMBER_FIELDS = ("val_bpb", "baseline_bpb", "improvement", "noise_floor", "training_seconds")


def _id_problem(item, prev_id):
    if type(item) is not dict:
        return "is not an object"
    rid = item.get("id")
    if type(rid) is not int or rid <= prev_id:
        return f"id {rid!r} is not an integer above the previous id {prev_id}"
    return None


def _record_problem(rec, prev_id):
    """The first problem with one experiment record, or None. Checks what the commands compute with."""
    problem = _id_problem(rec, prev_id)
    if problem:
        return problem
    if rec.get("status") not in STATUSES:
        return f"status {rec.get('status')!r} is not one of {', '.join(STATUSES)}"
    dim = rec.get("dimension")
    if type(dim) is not str or not dim:
        return f"dimension {dim!r} is not a non-empty string"
    for key in _NUMBER_FIELDS:
        value = rec.get(key)
        if value is not None and (type(value) not in _NUMBERS or not math.isfinite(value)):
            return f"{key} {value!r} is not a finite number or null"
    bpb = rec.get("val_bpb")
    if bpb is not None and bpb <= 0:
        return f"val_bpb {bpb!r} is not positive"
    settings = rec.get("settings")
    if settings is not None and type(settings) is not dict:
        return "settings is not an object or null"
    return None


def _rescue_problem(entry, prev_id):
    problem = _id_problem(entry, prev_id)
    if problem:
        return problem
    if type(entry.get("dimension")) is not str or type(entry.get("mechanism")) is not str:
        return "dimension and mechanism must be strings"
    return None


def validate(memory, path="experiments.json"):
    """Raise UserError naming the first problem; return `memory` when it is a valid memory."""
    def fail(what):
        raise UserError(f"{path}: not a valid research memory ({what}); {_FIX.replace('FILE', str(path))}")
    if type(memory) is not dict:
        fail("the top level is not an object")
    missing = [k for k in TOP_KEYS if k not in memory]
    if missing:
        fail(f"missing key {missing[0]!r}")
    if memory["version"] != VERSION:
        fail(f"version {memory['version']!r}, this tool reads version {VERSION}")
    dims = memory["dimensions"]
    if type(dims) is not list or not all(type(d) is str and d for d in dims) or len(set(dims)) != len(dims):
        fail("dimensions must be a list of distinct non-empty strings")
    for key, check in (("experiments", _record_problem), ("rescue_pool", _rescue_problem)):
        items = memory[key]
        if type(items) is not list:
            fail(f"{key} is not a list")
        prev = 0
        for i, item in enumerate(items):
            problem = check(item, prev)
            if problem:
                fail(f"{key}[{i}] {problem}")
            prev = item["id"]
    return memory


def next_id(items):
    """Ids increase down a list (validated), so the next one is the last plus one."""
    return items[-1]["id"] + 1 if items else 1


# ----------------------------------------------------------------------------
# Encoding: indented, stable key order, nested values (settings, curves) on one line

def _ordered(item, keys):
    out = {k: item.get(k) for k in keys}
    out.update((k, v) for k, v in item.items() if k not in out)  # keys a person added by hand stay
    return out


def _encode_item(item, keys):
    lines = [f"      {_encode(k)}: {_encode(v)}" for k, v in _ordered(item, keys).items()]
    return "    {\n" + ",\n".join(lines) + "\n    }"


def _encode_items(items, keys):
    if not items:
        return "[]"
    return "[\n" + ",\n".join(_encode_item(x, keys) for x in items) + "\n  ]"


def dumps(memory):
    """The canonical text of a memory (what every write produces)."""
    dims = "[]" if not memory["dimensions"] else (
        "[\n" + ",\n".join(f"    {_encode(d)}" for d in memory["dimensions"]) + "\n  ]")
    extra = [f"  {_encode(k)}: {_encode(v)}" for k, v in memory.items() if k not in TOP_KEYS]
    parts = [f'  "version": {_encode(memory["version"])}', f'  "dimensions": {dims}', *extra,
             f'  "rescue_pool": {_encode_items(memory["rescue_pool"], RESCUE_KEYS)}',
             f'  "experiments": {_encode_items(memory["experiments"], RECORD_KEYS)}']
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _skip_back(raw, end, char):
    """The index of `char` ending raw[:end] after trailing whitespace, or -1."""
    i = end - 1
    while i >= 0 and raw[i] in b" \t\r\n":
        i -= 1
    return i if i >= 0 and raw[i] == ord(char) else -1


def _append_parts(raw, memory, new_records):
    """The file `raw` with `new_records` appended to its experiments, as (old bytes kept, new bytes), so
    an append never re-encodes or even copies the old records. None when the shape does not allow it.

    Works on any valid JSON whose last top-level key is "experiments" (a list of objects): it ends with
    `] }`; the new records go just before that `]`, after the last `}` (or the `[` of an empty list).
    """
    if not raw or list(memory)[-1] != "experiments":
        return None
    close = _skip_back(raw, _skip_back(raw, len(raw), "}"), "]")
    last = _skip_back(raw, close, "}" if memory["experiments"] else "[") if close > 0 else -1
    if last < 0:
        return None
    sep = ",\n" if memory["experiments"] else "\n"
    tail = sep + ",\n".join(_encode_item(r, RECORD_KEYS) for r in new_records) + "\n  ]\n}\n"
    return memoryview(raw)[:last + 1], tail.encode("utf-8")


# ----------------------------------------------------------------------------
# Reading

def parse(text, path="experiments.json"):
    """Parse and validate the text of a memory file."""
    try:
        memory = json.loads(text)
    except ValueError as e:
        raise UserError(f"{path}: not valid JSON ({e}); {_FIX.replace('FILE', str(path))}") from None
    return validate(memory, path)


def _read(path):
    """(memory, raw bytes) for an existing file; (empty memory, None) when there is no file yet."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return empty_memory(), None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory; pass --memory FILE") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 ({e.reason} at byte {e.start}); "
                        f"{_FIX.replace('FILE', str(path))}") from None
    return parse(text, path), raw


def load(path):
    """The memory at `path`, validated (no lock: writes are atomic). A missing file is the empty memory
    with the default dimensions; an unreadable or invalid one raises UserError."""
    return _read(path)[0]


# ----------------------------------------------------------------------------
# Writing

def _remove_stale_temps(path):
    """Temp files left by a writer killed mid-write. Only lock holders write temps, so under the lock
    every temp of this file is stale."""
    directory = os.path.dirname(os.path.abspath(path))
    for entry in os.scandir(directory):
        if is_temp_of(path, entry.name):
            try:
                os.unlink(entry.path)
            except OSError:
                pass


@contextlib.contextmanager
def locked(path, timeout=LOCK_TIMEOUT_S):
    """Hold an exclusive flock(2) on `<path>.lock` (created if missing, never deleted: deleting a lock file
    that someone holds would let the next process lock a new inode). The kernel drops the lock when the
    process dies, kill -9 included. This is what filelock's FileLock does on Unix, without its import
    (~40 ms, a sixth of the start-up budget); unlike its default, a filesystem without flock is an error,
    never a silent fallback to no locking."""
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise UserError(f"{path}: could not lock {path}.lock within {timeout:.0f} s; another "
                                    "research process holds it (see `ps`)") from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock


def update(path, change, timeout=LOCK_TIMEOUT_S):
    """Read-modify-write `path` under its lock; return what `change` returns.

    `change(memory)` gets the validated memory (the empty one when the file does not exist yet). It
    returns (result, new_records): new experiments to append (ids are assigned here, in order) or [];
    it may also edit dimensions and rescue_pool in place, never existing experiments. Nothing is
    written when nothing changed; nothing is written at all if `change` raises.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UserError(f"{path}: directory {directory} does not exist; create it or pass another --memory")
    try:
        with locked(path, timeout):
            memory, raw = _read(path)
            head_before = _head_text(memory)
            result, new_records = change(memory)
            chunks = _new_chunks(memory, raw, head_before, new_records)
            if chunks:
                _remove_stale_temps(path)
                atomic_write(path, *chunks)
            return result
    except OSError as e:
        raise UserError(f"{path}: cannot lock or write it ({e.strerror or e}); check the directory's "
                        "permissions, and that its filesystem supports flock") from None


def _head_text(memory):
    return dumps({**memory, "experiments": []})


def _new_chunks(memory, raw, head_before, new_records):
    """What the file becomes, as chunks, or None when nothing changed."""
    start = next_id(memory["experiments"])
    for i, rec in enumerate(new_records):
        rec["id"] = start + i
    head_changed = _head_text(memory) != head_before
    if not new_records and not head_changed and raw is not None:
        return None
    fast = None if head_changed else _append_parts(raw, memory, new_records)
    memory["experiments"].extend(new_records)
    return fast or (dumps(memory),)
