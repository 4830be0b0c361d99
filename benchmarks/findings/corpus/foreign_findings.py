"""The top findings of every foreign trace (tests/data/foreign, SOURCES.md), for foreign_results.md.

    uv run python benchmarks/findings/corpus/foreign_findings.py [TRACE ...] [--kernels N] [--all-findings]

Prints one Markdown table row per trace: its device, steps and step time, the findings' sum against the
step (issue #42: they must never sum past it), and the top finding (kind, ms per step, its fix cut short).
`--kernels N` also lists each trace's N costliest kernels (name, category, ms per step), the evidence a
verdict on the top finding is checked against; `--all-findings` lists every finding, not only the top.
Rerun it after the rules change and compare with the verdicts in
benchmarks/findings/corpus/foreign_results.md.
"""
import argparse
import glob
import os

from profiling.profile.report.summary import load_trace, summarize

FOREIGN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "data", "foreign")
FIX_CHARS = 90  # a table cell: the fix's first words, enough to tell one remedy from another


def findings_ms(s):
    """The findings' claimed ms per step, summed: what a ledger must keep at or under the step."""
    return sum(f.get("ms_per_step") or 0.0 for f in s["findings"])


def short(text, n=FIX_CHARS):
    text = " ".join(str(text or "").split()).replace("|", "/")
    return text if len(text) <= n else text[:n - 1] + "…"


def row(name, s):
    """One table row: what the trace is, what the rules claim of it, and the top claim."""
    total = findings_ms(s)
    over = " **over**" if total > s["step_ms"] + 1e-6 else ""
    top = s["findings"][0] if s["findings"] else None
    what = (f"{top['kind']} | {top.get('ms_per_step', 0):.2f} | {short(top.get('fix'))}" if top
            else f"— | — | {short(s.get('no_findings') or 'no finding')}")
    return (f"| {name} | {s['device'] or '?'} ({s['kind']}) | {s['steps']} x {s['step_ms']:.2f} | "
            f"{total:.2f} ({len(s['findings'])}){over} | {what} |")


def details(s, kernels, every):
    """The lines under a row: the other findings, the costliest kernels."""
    out = []
    if every:
        out += [f"    - {f['kind']}: {f.get('ms_per_step', 0):.2f} ms — {short(f.get('evidence'), 160)}"
                for f in s["findings"]]
    out += [f"    - kernel {k['ms_per_step']:.3f} ms x{k['calls_per_step']:g} [{k['category']}] "
            f"{short(k['name'], 100)}" for k in s["kernels"][:kernels]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--kernels", type=int, default=0, help="list each trace's N costliest kernels")
    ap.add_argument("--all-findings", action="store_true", help="list every finding, not only the top one")
    args = ap.parse_args()
    paths = args.traces or sorted(glob.glob(os.path.join(FOREIGN, "*.json.gz")))
    print("| trace | device (kind) | steps x ms | findings ms (n) | top finding | ms/step | fix |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        s = summarize(load_trace(path))
        print(row(os.path.basename(path).removesuffix(".json.gz"), s))
        for line in details(s, args.kernels, args.all_findings):
            print(line)


if __name__ == "__main__":
    main()
