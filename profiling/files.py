"""Atomic file writes, shared by the memory, run.json and the profiler's files. Pure Python."""
import os
import re


def tmp_prefix(path):
    """Temp files for `path` are named `.<name>.<pid>.<random>.tmp` in its directory."""
    return f".{os.path.basename(path)}."


def is_temp_of(path, name):
    """Whether the file name `name` is one of atomic_write's temp files for `path` (and not, say, one for
    `<path>.run0.json`, whose name starts the same)."""
    return re.fullmatch(re.escape(tmp_prefix(path)) + r"\d+\.[^.]+\.tmp", name) is not None


def atomic_write(path, *chunks):
    """Replace `path` with the concatenated chunks (str or bytes-like): readers see the old file or the
    new one, never a mix, even after a crash or kill -9 at any point. The file keeps its permissions."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    tmp = os.path.join(directory, f"{tmp_prefix(path)}{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as f:
            f.writelines(c.encode("utf-8") if isinstance(c, str) else c for c in chunks)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
