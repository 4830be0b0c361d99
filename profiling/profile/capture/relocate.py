"""Source frames recorded by a compile, mapped to the code this process runs (issue #33). Stdlib only.

Inductor's on-disk caches (the FX graph cache and the AOTAutograd cache, under TORCHINDUCTOR_CACHE_DIR) key a
graph by its code without node metadata, so neither a file's path nor its line numbers are part of the key
(torch 2.11: torch/_inductor/codecache.py `FxGraphCachePickler._reduce_graph_module` pickles the graph's
generated code, which carries no stack comments; `FxGraphHashDetails` leaves `node.meta` out). The compiled
graph is pickled with the provenance record of the run that compiled it
(`CompiledFxGraph.inductor_provenance_stack_traces_str`), and a cache hit hands that record out again
(`FxGraphCache._lookup_graph`, reached from `AOTAutogradCache` through `FxGraphCacheLoadable.load`): a second
checkout in another folder, or the same file with a line added at its top, gets stacks naming the first
folder's file and the old line numbers.

So each recorded frame is checked against the running code: the file this process loaded whose path ends
most like the recorded one (its own train.py before another checkout's), and the line that still holds the
recorded source text, in a function of the recorded name. A text found on several lines takes the shift the
file's other frames moved by, else the nearest line. A frame whose text is nowhere in the running files is
kept as recorded and reported as not found, never silently moved.
"""
import ast
import linecache
import os
import sys
from collections import Counter

from profiling.profile.trace import whose


def running_files():
    """The absolute paths of the Python files this process has loaded (its modules and the script)."""
    out = set()
    for module in list(sys.modules.values()):
        try:
            path = getattr(module, "__file__", None)
        except Exception:  # a lazy module may fail to load on access: it ran no code either
            continue
        if isinstance(path, str) and path.endswith(".py"):
            out.add(os.path.abspath(path))
    return out


def relocate(frames, root, files=None):
    """For each recorded frame (path, line, function, text): (path, line, found) in the running code.
    found is False where the text is in no running file (the recorded path and line kept); frames that name
    no file (`<string>`) pass as they are. root: the user's code roots (a whose.Code, a folder or folders);
    files: the running files (default: this process's)."""
    src = Sources(running_files() if files is None else files, whose.of(root))
    hits = [src.locate(*frame) for frame in frames]
    shifts = {}  # recorded path -> Counter of line shifts that only one line could explain
    for (path, line, _, _), hit in zip(frames, hits):
        if hit and len(hit[1]) == 1:
            shifts.setdefault(path, Counter())[hit[1][0] - line] += 1
    out = []
    for (path, line, _, text), hit in zip(frames, hits):
        if hit is None:  # kept; found only for what names no file, or a running file with no text to check
            out.append((path, line, not os.path.isabs(path) or not text and path in src.files))
            continue
        usual = shifts.get(path, Counter()).most_common(1)
        shift = usual[0][0] if usual else None
        best = min(hit[1], key=lambda n: (n - line != shift, abs(n - line), n))
        out.append((hit[0], best, True))
    return out


class Sources:
    """The running files, indexed by file name, with their lines and function spans read once each."""

    def __init__(self, files, code):
        self.files, self.code = set(files), code
        self.by_name, self.texts, self.spans = {}, {}, {}
        for path in self.files:
            self.by_name.setdefault(os.path.basename(path), []).append(path)

    def locate(self, path, line, function, text):
        """(running file, [lines holding `text`]) for a recorded frame, or None where it cannot be found
        (no text recorded, no file of that name running, the text in none of them)."""
        if not text or not os.path.isabs(path):
            return None
        if path in self.files and self.line(path, line) == text:  # the usual case: a fresh compile
            return path, [line]
        for candidate in self.candidates(path):
            found = [n for n, t in enumerate(self.lines(candidate), 1)
                     if t == text and self.inside(candidate, n, function)]
            if found:
                return candidate, found
        return None

    def candidates(self, path):
        """Running files of the same name, the one sharing most trailing path parts first, then those under
        the user's code roots (the checkout that runs)."""
        parts = path.split(os.sep)

        def rank(other):
            theirs, same = other.split(os.sep), 0
            while same < min(len(parts), len(theirs)) and parts[-1 - same] == theirs[-1 - same]:
                same += 1
            return -same, self.code.kind(other) != whose.USER, other

        return sorted(self.by_name.get(os.path.basename(path), []), key=rank)

    def lines(self, path):
        if path not in self.texts:
            self.texts[path] = [t.strip() for t in linecache.getlines(path)]
        return self.texts[path]

    def line(self, path, n):
        lines = self.lines(path)
        return lines[n - 1] if 0 < n <= len(lines) else None

    def inside(self, path, n, function):
        """True when line n is in a function named `function` (any line where the file defines none by that
        name, or the frame is not a def: `<module>`, `<lambda>`)."""
        if path not in self.spans:
            self.spans[path] = _spans("".join(linecache.getlines(path)))
        spans = self.spans[path].get(function)
        return not spans or any(a <= n <= b for a, b in spans)


def _spans(source):
    """{function name: [(first line, last line)]} of every def in a file's source; {} if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.setdefault(node.name, []).append((first, node.end_lineno or node.lineno))
    return out
