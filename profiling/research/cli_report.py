"""`research report [--out DIR]`: the morning report, report.md and progress.png, from the memory.

A thin layer: profiling.research.report computes the numbers and the Markdown, profiling.research.plot draws the PNG (matplotlib
is imported only here, inside the handler, so no other command pays for it). The main CLI (profiling/cli.py)
registers it with `add_subparser` and turns a UserError into `research: error: <message>` and exit status 2.

Bad input: a missing, unreadable or invalid memory file is an error (exit 2, nothing written); a memory
with no experiments yet gives a report that says so and a PNG with a "no experiments yet" note (exit 0).
"""
import argparse
import os

from profiling.errors import UserError
from profiling.research import experiments

REPORT, IMAGE = "report.md", "progress.png"


def add_subparser(subparsers):
    """Register `report [--out DIR] [--memory PATH]` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "report", help="the morning report: write report.md and progress.png",
        description="Summarize the memory for a person: best val_bpb and its commit, pace, keep rate, "
                    "early aborts, the per-dimension table, top improvements, stagnation periods and the "
                    f"noise floor ({REPORT}), and val_bpb per experiment ({IMAGE}). With several "
                    "settings/dataset groups, it reports the largest. An empty memory gives a report that "
                    "says there is nothing yet.")
    p.add_argument("--out", metavar="DIR", default=".",
                   help="the directory to write them to, created if missing (default: the current directory)")
    p.add_argument("--memory", metavar="PATH", default=argparse.SUPPRESS,
                   help="the memory file (default: $AUTORESEARCH_MEMORY, else ./experiments.json)")
    p.set_defaults(func=handler)
    return p


def _load(path):
    if not os.path.exists(path):
        raise UserError(f"{path}: no such memory file; pass --memory PATH or set AUTORESEARCH_MEMORY")
    return experiments.load(path)


def _write(path, data):
    try:
        experiments.atomic_write(path, data)
    except OSError as e:
        raise UserError(f"{path}: cannot write it ({e.strerror or e})") from None


def handler(args):
    """Write report.md and progress.png into args.out; print where. Returns 0; bad input raises UserError."""
    from profiling.research import report
    try:
        from profiling.research import plot
    except ImportError:  # matplotlib is the trainer's dependency, not the package's: report.md without a plot
        plot = None

    path = experiments.default_path(getattr(args, "memory", None))
    data = report.summarize(_load(path))
    text = report.to_markdown(data, path, IMAGE if plot else None)
    png = plot.png_bytes(data["series"], report.plot_title(data), report.plot_labels(data)) if plot else None
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {args.out}: cannot create the directory ({e.strerror or e})") from None
    md_path, png_path = os.path.join(args.out, REPORT), os.path.join(args.out, IMAGE)
    _write(md_path, text)
    print(f"wrote {md_path} ({data['experiments']} experiments)")
    if plot is None:
        print(f"no {IMAGE}: matplotlib is not installed (pip install matplotlib)")
        return 0
    _write(png_path, png)
    print(f"wrote {png_path} ({plot.WIDTH_IN * plot.DPI}x{plot.HEIGHT_IN * plot.DPI} px)")
    return 0
