"""Whose code a source frame is: the user's, an installed model's, or neither (issue #41). Stdlib only.

The lines table (profiling/profile/tables/lines.py, from provenance.py and eager_record.py), the host samples
(sampler.py) and the lines of host syncs name the lines of two kinds of code:
- USER: a file under one of the code roots, not in an installed package (site-packages, dist-packages). The
  roots: the running script's folder (`python /path/train.py` -> /path, whatever the cwd; `python -m
  pkg.train` -> the folder holding pkg; the cwd for an interactive session, `python -c`, or a launcher such
  as pytest or ipykernel), plus those given as `Profiler(code_roots=[...])` (`use`).
- MODEL: installed model code: a `forward` method in an installed package, or any line of a `modeling_*.py`
  file (transformers' model files: their helpers such as `apply_rotary_pos_emb` too). torch's own packages
  (torch/nn/modules/*.py, torch/_*) and the training frameworks' (Lightning, accelerate, DeepSpeed) never
  count; transformers' Trainer defines no `forward`, so its loop never counts either.
An operator's line is the innermost frame of either kind: an HF Trainer run's kernels land on the lines of
modeling_llama.py that called them, not on `trainer.train()`, and a model in the user's folder keeps its own
lines (the innermost frame that calls torch is the user's). A library model's forward called from the user's
model shows the library's lines: it is deeper.

Labels: a USER file relative to its root (`train.py`), an installed file from its package folder
(`transformers/models/llama/modeling_llama.py`), anything else by its last two parts. The roots used go into
the trace metadata (`code_roots`); every record names its frames when it is made, so `research profile` of a
saved trace places the lines as the live run did.
"""
import os
import sys
import sysconfig

USER, MODEL = "user", "model"
INSTALLED = ("site-packages", "dist-packages")
INTERNAL = frozenset({"torch", "functorch", "torchgen", "triton"})   # torch itself: never the line
FRAMEWORKS = frozenset({"lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "deepspeed"})
PYTHON = tuple({os.path.join(p, "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})  # installations
MODEL_FILE = "modeling_"   # transformers names every model's file so (models/llama/modeling_llama.py)

_extra = []   # the roots given as Profiler(code_roots=...), absolute


def use(roots):
    """Set the roots `current` adds to the script's folder (Profiler(code_roots=...)); None: none. ValueError
    for anything but a list of existing folders. Returns them, absolute."""
    if roots is None:
        roots = []
    if isinstance(roots, (str, os.PathLike)) or not isinstance(roots, (list, tuple)):
        raise ValueError(f"code_roots must be a list of folders, not {roots!r}; e.g. code_roots=['src']")
    for r in roots:
        if not isinstance(r, (str, os.PathLike)) or not os.path.isdir(r):
            raise ValueError(f"code_roots: {r!r} is not a folder; give the folders of your own code")
    _extra[:] = [os.path.abspath(r) for r in roots]
    return list(_extra)


def current():
    """The Code of this process: the script's folder and the roots given to `use`."""
    return Code([script_root()] + _extra)


def of(root):
    """A Code for `root`: a Code as it is, a folder, or a list of folders."""
    if isinstance(root, Code):
        return root
    return Code([root] if isinstance(root, (str, os.PathLike)) else list(root))


def script_root():
    """The running script's folder (resolved); for a module run with -m, the folder holding its top package;
    the cwd when there is no script or it is a launcher in the Python installation (pytest, ipykernel)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and not _launcher(path):
        folder = os.path.dirname(os.path.realpath(path))
        name = getattr(getattr(main, "__spec__", None), "name", None) or ""
        for _ in range(name.count(".")):   # pkg.train -> the folder above pkg/
            folder = os.path.dirname(folder)
        return folder
    script = sys.argv[0] if sys.argv else ""   # python -m cProfile train.py: __main__ is cProfile
    if script.endswith(".py") and os.path.isfile(script) and not _launcher(script):
        return os.path.dirname(os.path.realpath(script))
    return os.getcwd()


def _launcher(path):
    """True for a file of the Python installation: an installed package, the standard library, a console
    script (bin/pytest)."""
    path = os.path.realpath(path)
    if any(p in path.split(os.sep) for p in INSTALLED):
        return True
    places = {os.path.realpath(p) for p in sysconfig.get_paths().values()}
    return any(path.startswith(p + os.sep) for p in places)


class Code:
    """Whose code the files are, for a list of code roots (absolute; resolved forms matched too)."""

    def __init__(self, roots):
        self.roots = []
        for r in roots:
            r = os.path.abspath(r)
            if r not in self.roots:
                self.roots.append(r)
        prefixes = {r.rstrip(os.sep) + os.sep for r in self.roots}
        prefixes |= {os.path.realpath(r).rstrip(os.sep) + os.sep for r in self.roots}
        self.prefixes = tuple(sorted(prefixes, key=len, reverse=True))   # the deepest root names a file
        self.kinds = {}

    def kind(self, path, function=""):
        """USER, MODEL or None for a frame running `function` in file `path`. Given an absolute path (or
        `<string>`), string operations and C calls only: the eager line tracer calls it inside compiled
        regions (eager_record.py)."""
        key = (path, function)
        k = self.kinds.get(key, "")
        if k == "":
            k = self.kinds[key] = self._kind(path, function)
        return k

    def _kind(self, path, function):
        if not path.startswith(("<", os.sep)):
            path = os.path.abspath(path)
        parts = path.split(os.sep)
        i = len(parts) - 1
        while i >= 0 and parts[i] not in INSTALLED:   # loops, not comprehensions: no frames (see `kind`)
            i -= 1
        if i < 0:  # never the Python installation's own files (a venv inside the project: its bin/ scripts)
            return USER if path.startswith(self.prefixes) and not path.startswith(PYTHON) else None
        if i + 1 >= len(parts) or parts[i + 1] in INTERNAL or parts[i + 1] in FRAMEWORKS:
            return None
        if function == "forward" or parts[-1].startswith(MODEL_FILE) and parts[-1].endswith(".py"):
            return MODEL
        return None

    def owns(self, path, function=""):
        """True for a frame of the user's code or of installed model code (see the module's docstring)."""
        return self.kind(path, function) is not None

    def name(self, path):
        """The file as labels show it: relative to its root, from its package folder, else its last two
        parts."""
        if path.startswith("<"):   # <string>, <frozen os>: no file
            return path
        absolute = os.path.abspath(path)
        parts = absolute.split(os.sep)
        for i in range(len(parts) - 1, -1, -1):
            if parts[i] in INSTALLED:
                return "/".join(parts[i + 1:])
        for prefix in self.prefixes:
            if absolute.startswith(prefix):
                return absolute[len(prefix):]
        return "/".join(parts[-2:])

    def label(self, path, line, function=""):
        """`file:line function` (see `name`)."""
        return f"{self.name(path)}:{line} {function}".strip()
