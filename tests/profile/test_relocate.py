"""profiling.profile.capture.relocate and the provenance record it corrects: the source frames of compiled graphs that
Inductor's on-disk cache hands back, recorded by another checkout or an older version of the file, name the
files and lines that run (issue #33). Fast tests feed recorded frames and files on disk; a slow test compiles
a script in one folder, then a copy with a line added at its top in another, both sharing one Inductor cache.
"""
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from profiling.profile.capture import provenance, relocate
from profiling.profile.report.render import to_markdown
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.tables import lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU_COMPILED = os.path.join(ROOT, "tests", "data", "cpu-compiled-gpt-2steps.trace.json.gz")

SOURCE = textwrap.dedent("""\
    import torch


    class MLP(torch.nn.Module):
        def forward(self, x):
            h = torch.relu(self.fc(x))
            return self.proj(h * h)

        def other(self, x):
            h = torch.relu(self.fc(x))
            return h
""")
RELU, PROJ = 6, 7   # the lines of `h = torch.relu(...)` and `return self.proj(...)` in forward
H, OUT = "h = torch.relu(self.fc(x))", "return self.proj(h * h)"


def checkout(folder, top=""):
    """train.py in `folder` (created), with `top` lines added above SOURCE; its absolute path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "train.py")
    with open(path, "w") as f:
        f.write(top + SOURCE)
    return path


def test_a_fresh_compiles_frames_stay_as_they_are(tmp_path):
    b = checkout(tmp_path / "b")
    frames = [(b, RELU, "forward", H), ("<string>", 3, "<module>", "")]
    assert relocate.relocate(frames, str(tmp_path / "b"), files={b}) == \
        [(b, RELU, True), ("<string>", 3, True)]


def test_another_folders_frames_name_the_running_file_and_its_shifted_lines(tmp_path):
    a = checkout(tmp_path / "a")
    b = checkout(tmp_path / "b", top="# one line added\n\n")
    frames = [(a, RELU, "forward", H), (a, PROJ, "forward", OUT)]
    # a still exists on disk but is not running: b's train.py is
    assert relocate.relocate(frames, str(tmp_path / "b"), files={b}) == \
        [(b, RELU + 2, True), (b, PROJ + 2, True)]


def test_the_running_checkout_wins_over_another_loaded_file_of_the_same_name(tmp_path):
    other = checkout(tmp_path / "lib" / "x")
    b = checkout(tmp_path / "b", top="\n")
    frames = [(str(tmp_path / "a" / "train.py"), RELU, "forward", H)]
    assert relocate.relocate(frames, str(tmp_path / "b"), files={other, b}) == [(b, RELU + 1, True)]


def test_a_line_found_twice_takes_its_functions_copy_and_the_files_shift(tmp_path):
    a = str(tmp_path / "a" / "train.py")
    b = checkout(tmp_path / "b", top="\n\n\n")
    frames = [(a, RELU, "forward", H), (a, RELU + 4, "other", H), (a, PROJ, "forward", OUT)]  # H: twice
    assert [n for _, n, _ in relocate.relocate(frames, str(tmp_path / "b"), files={b})] == \
        [RELU + 3, RELU + 7, PROJ + 3]
    # with no function to tell them apart, the shift of the file's other frames decides
    frames = [(a, RELU + 4, "<lambda>", H), (a, PROJ, "forward", OUT), (a, 1, "<module>", "import torch")]
    assert [n for _, n, _ in relocate.relocate(frames, str(tmp_path / "b"), files={b})] == \
        [RELU + 7, PROJ + 3, 4]


def test_a_line_the_running_code_lacks_is_kept_and_not_found(tmp_path):
    a = str(tmp_path / "a" / "train.py")
    b = checkout(tmp_path / "b")
    frames = [(a, 5, "forward", "x = gone(x)"), (b, 5, "forward", "x = gone(x)"), (b, 6, "forward", ""),
              (a, 6, "forward", "")]
    assert relocate.relocate(frames, str(tmp_path / "b"), files={b}) == \
        [(a, 5, False), (b, 5, False), (b, 6, True), (a, 6, False)]


# ---------------------------------------------------------------------------------------------------------
# The collector's record: frames mapped when it is read, the report's note for those not found
# ---------------------------------------------------------------------------------------------------------

def emit_graph(c, key, traces):
    """Feeds the collector one compiled graph's records, one call `k:N` per stack trace."""
    code = "".join(f"# [Provenance debug handles] k:{n}\n" for n in range(len(traces)))
    c.emit(types.SimpleNamespace(metadata={"inductor_output_code": {}}, payload=code))
    for name, payload in ((provenance.STACKS, {f"k:{n}": [t] for n, t in enumerate(traces)}),
                          ("fx_graph_cache_hit", {"key": key})):
        c.emit(types.SimpleNamespace(metadata={"artifact": {"name": name}}, payload=json.dumps(payload)))


def trace_of(path, line, function, text):
    return f'  File "{path}", line {line}, in {function}\n    {text}\n'


def test_the_record_names_the_running_lines_and_keeps_each_once(tmp_path, monkeypatch):
    a = str(tmp_path / "a" / "train.py")
    b = checkout(tmp_path / "b", top="\n")
    monkeypatch.setattr(relocate, "running_files", lambda: {b})
    c = provenance.Collector(str(tmp_path / "b"))
    emit_graph(c, "fcached", [trace_of(a, RELU, "forward", H), trace_of(a, 3, "forward", "y = removed(x)")])
    emit_graph(c, "ffresh", [trace_of(b, RELU + 1, "forward", H)])
    r = c.result()
    assert r["frames"] == [["train.py", RELU + 1, "forward", H, True],
                           ["a/train.py", 3, "forward", "y = removed(x)", True]]  # not found: kept, own
    assert r["stacks"] == [[0], [1]] and r["relocated"] == 1 and r["unmapped"] == [[1, f"{a}:3"]]
    assert [g["kernels"] for g in r["graphs"]] == [[["k", [0]], ["k", [1]]], [["k", [0]]]]
    note, = lines.notes(r)
    assert note.startswith("1 source lines of the compiled graphs are not in the running code and are "
                           f"shown as recorded ({a}:3): Inductor's cache")


def test_the_lines_table_notes_lines_not_in_the_running_code():
    trace = load_trace(CPU_COMPILED)
    record = trace["autoresearch"]["provenance"]
    assert "unmapped" not in record and summarize(trace)["lines"]["notes"] == []  # an older record: no note
    i = next(i for i, f in enumerate(record["frames"]) if f[4])
    record["unmapped"] = [[i, "/elsewhere/baseline/train.py:122"]]
    s = summarize(trace)
    assert "(/elsewhere/baseline/train.py:122)" in s["lines"]["notes"][0]
    assert "\nnote: 1 source lines of the compiled graphs are not in the running code" in to_markdown(s)


# ---------------------------------------------------------------------------------------------------------
# The GPU memory lines: the allocator's frames of a cached graph mapped as the time lines' (#43)
# ---------------------------------------------------------------------------------------------------------

GENERATED = {"filename": "/tmp/torchinductor_u/ab/cabcdef.py", "line": 90, "name": "call"}


def memory_snapshot(*stacks):
    """An allocator snapshot with one 1 MB allocation per stack (frames innermost first) and nothing freed: the
    peak holds them all."""
    trace = [{"action": "alloc", "addr": 4096 * (i + 1) << 20, "size": 1 << 20, "frames": frames}
             for i, frames in enumerate(stacks)]
    return {"segments": [], "device_traces": [trace]}


def graph_frames(path, line, function="forward"):
    """An allocation inside a compiled graph: the generated code's frame, then the FX node's source frame
    (torch's PyCodeCache.stack_frames_for_code: the record of the run that compiled the graph)."""
    return [GENERATED, {"filename": path, "line": line, "name": function}]


def memory_lines(snapshot, placement):
    from profiling.profile.trace import allocator
    return {r["where"] for r in allocator.reduce(snapshot, {}, where=allocator.placed(placement))["lines"]}


def test_memory_lines_of_a_cached_graph_name_the_copys_file_and_shifted_lines(tmp_path, monkeypatch):
    """train.py copied to another folder with a line added at its top, sharing the compile cache: the memory
    step's allocator frames come from the cached graph (baseline's path and lines), as the provenance record's
    do; both go through relocate, so the memory lines name the copy's file and the shifted lines. A line the
    record has no frame for (PROJ here) takes the file's shift; the copy's own live frames are left alone."""
    a = checkout(tmp_path / "baseline")
    b = checkout(tmp_path / "copy", top="# one line added\n")
    monkeypatch.setattr(relocate, "running_files", lambda: {b})
    c = provenance.Collector(str(tmp_path / "copy"))
    emit_graph(c, "fcached", [trace_of(a, RELU, "forward", H)])
    monkeypatch.setattr(provenance, "_collector", c)
    placement = provenance.placement()
    assert placement == {"frames": {(a, RELU, "forward"): (b, RELU + 1)}, "files": {a: (b, 1)}}
    live = [{"filename": b, "line": 12, "name": "train_step"}]
    snap = memory_snapshot(graph_frames(a, RELU), graph_frames(a, PROJ), live)
    assert memory_lines(snap, {}) == {f"baseline/train.py:{RELU} (compiled graph)",
                                      f"baseline/train.py:{PROJ} (compiled graph)", "copy/train.py:12"}
    assert memory_lines(snap, placement) == {f"copy/train.py:{RELU + 1} (compiled graph)",
                                             f"copy/train.py:{PROJ + 1} (compiled graph)", "copy/train.py:12"}


def test_memory_lines_of_the_same_file_with_a_line_added(tmp_path, monkeypatch):
    """The file that compiled the cached graph is the one running, a line added since: the frames the record
    mapped move; others of that path may be live ones (the running file's own lines) and stay."""
    b = checkout(tmp_path / "b", top="\n")
    monkeypatch.setattr(relocate, "running_files", lambda: {b})
    c = provenance.Collector(str(tmp_path / "b"))
    emit_graph(c, "fcached", [trace_of(b, RELU, "forward", H)])
    monkeypatch.setattr(provenance, "_collector", c)
    placement = provenance.placement()
    assert placement == {"frames": {(b, RELU, "forward"): (b, RELU + 1)}, "files": {}}
    snap = memory_snapshot(graph_frames(b, RELU), [{"filename": b, "line": PROJ, "name": "forward"}])
    assert memory_lines(snap, placement) == {f"b/train.py:{RELU + 1} (compiled graph)", f"b/train.py:{PROJ}"}
    monkeypatch.setattr(provenance, "_collector", None)
    assert provenance.placement() == {}


# ---------------------------------------------------------------------------------------------------------
# Acceptance: one Inductor cache, two folders, the second file shifted by a line
# ---------------------------------------------------------------------------------------------------------

SCRIPT = textwrap.dedent("""\
    import json
    import torch
    from profiling.profile.capture import provenance, window
    from profiling.profile.report.render import to_markdown
    from profiling.profile.report.summary import summarize


    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

        def forward(self, x):
            h = torch.relu(self.fc(x))
            return self.proj(h * h).square().mean()


    provenance.start()
    model, x = torch.compile(MLP()), torch.randn(16, 32)
    trace, _ = window.capture(lambda: model(x).backward(), warmup=1, active=1, metadata={})
    s = summarize(trace)
    record = trace["autoresearch"]["provenance"]
    print(json.dumps({"lines": s["lines"], "keys": [g["key"] for g in record["graphs"]],
                      "relocated": record["relocated"], "unmapped": record["unmapped"],
                      "report": to_markdown(s)}))
""")
TEXTS = ("h = torch.relu(self.fc(x))", "return self.proj(h * h).square().mean()")


def run_in(folder, source, cache):
    os.makedirs(folder)
    with open(os.path.join(folder, "train.py"), "w") as f:
        f.write(source)
    env = dict(os.environ, PYTHONPATH=ROOT, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               TORCHINDUCTOR_AUTOGRAD_CACHE="1")  # both on by default (torch 2.11), whatever the caller set
    out = subprocess.run([sys.executable, "train.py"], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.heavy
def test_a_second_checkout_reading_the_cache_names_its_own_file_and_shifted_lines(tmp_path):
    cache = str(tmp_path / "inductor")
    first = run_in(str(tmp_path / "baseline"), SCRIPT, cache)
    second = run_in(str(tmp_path / "candidate"), "# a line added at the top\n" + SCRIPT, cache)
    at = {t: SCRIPT.splitlines().index("        " + t) + 1 for t in TEXTS}
    for run, shift in ((first, 0), (second, 1)):
        placed = {(x["file"], x["line"], x["text"]) for row in run["lines"]["rows"] for x in row["lines"]
                  if not row.get("eager_ms")}  # the compiled graphs' lines (eager rows: the capture's own line)
        assert placed == {("train.py", at[t] + shift, t) for t in TEXTS}
        assert run["unmapped"] == [] and run["lines"]["notes"] == []
    assert second["keys"] == first["keys"] and len(first["keys"]) == 2  # forward, backward: from the cache,
    assert first["relocated"] == 0 < second["relocated"]  # with the first folder's stacks, mapped
    assert "baseline" not in second["report"]
