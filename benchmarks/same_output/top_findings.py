"""Every fixture's top finding as `research profile` reads it, for diagnoses_results.md's before/after table.

    uv run python benchmarks/same_output/top_findings.py [TRACE ...] > top.csv

Prints `fixture, step ms, top kind, top ms` for every tests/data/*.json.gz and tests/data/foreign/*.json.gz
(or the traces named), each read by `summarize(load_trace(path))`, as `research profile` reads one file. Run
it in two checkouts (the script copied into the older one) and compare the two outputs: a rule change that
moves a fixture's top finding shows as a changed row. A trace that fails to load prints its error as the
kind, so a traceback in one does not hide the others.
"""
import glob
import os
import sys

from profiling.profile.report.summary import load_trace, summarize

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data")


def fixtures():
    """The fixtures' paths: tests/data's traces, then the foreign corpus's."""
    return (sorted(glob.glob(os.path.join(DATA, "*.json.gz")))
            + sorted(glob.glob(os.path.join(DATA, "foreign", "*.json.gz"))))


def name(path):
    """A fixture's short name: foreign traces keep their folder, '.trace.json.gz' goes."""
    base = os.path.basename(path).removesuffix(".json.gz").removesuffix(".trace")
    return "foreign/" + base if os.path.basename(os.path.dirname(path)) == "foreign" else base


def line(path):
    """One CSV line: the fixture, its step, its top finding's kind and ms per step ('-' where none)."""
    try:
        s = summarize(load_trace(path))
    except Exception as e:  # a fixture that no longer loads is a result, not a reason to stop
        return f"{name(path)}, -, error: {type(e).__name__}, -"
    top = s["findings"][0] if s["findings"] else None
    kind, ms = (top["kind"], f"{top.get('ms_per_step') or 0.0:.1f}") if top else ("-", "-")
    return f"{name(path)}, {s['step_ms']:.1f}, {kind}, {ms}"


def main():
    print("fixture, step ms, top kind, top ms")
    for path in sys.argv[1:] or fixtures():
        print(line(path), flush=True)


if __name__ == "__main__":
    main()
