"""`research profile TRACE`: where each training step's time goes, from any torch.profiler Chrome trace.

TRACE may be a profile folder: one trace per rank (rank-<k>.trace.json.gz, rank-<k>.json as Holistic Trace
Analysis reads, or tensorboard_trace_handler's <worker>.<time_ns>.pt.trace.json[.gz]) gives one report for all ranks (profiling/profile/report/ranks.py); a folder with trace.json.gz, that trace.
A thin layer over profiling.profile.report.summary, profiling.profile.report.ranks and profiling.profile.report.render; the main CLI (profiling/cli.py) registers it with
`add_subparser` and turns a UserError into `research: error: <message>` and exit status 2.
"""
import argparse

from profiling.profile.report import ranks, regression, render, summary

DEFAULT_TOP = 10


def _count(text):
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of kernels, 1 or more, got {text!r}")
    return n


def _milliseconds(text):
    try:
        ms = float(text)
    except ValueError:
        ms = 0.0
    if not 0 < ms < float("inf"):
        raise argparse.ArgumentTypeError(f"expected the unprofiled step time in ms, a number above 0, got {text!r}")
    return ms


def add_subparser(subparsers):
    """Register `profile TRACE [--top N] [--json] [--previous TRACE_OR_JSON]` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "profile", help="summarize a torch.profiler trace: where each step's time goes",
        description="Summarize a torch.profiler Chrome trace (gzip or plain JSON, from any script, on any "
                    "machine): per-step time by category, GPU idle, top kernels and checks, as Markdown. A profile "
                    "folder with one trace per rank (torchrun) gives one report for all ranks.")
    p.add_argument("trace", metavar="TRACE", help="the trace file (.json or .json.gz), or a profile folder: "
                   "rank-<k>.trace.json.gz or rank-<k>.json[.gz] per rank, tensorboard_trace_handler's "
                   "<worker>.<time>.pt.trace.json[.gz], or trace.json.gz")
    p.add_argument("--top", type=_count, metavar="N",
                   help=f"list the top N kernels (default {DEFAULT_TOP} in Markdown, all in JSON)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of Markdown")
    p.add_argument("--previous", "--against", metavar="TRACE_OR_JSON",
                   help="an earlier trace, or a summary saved with --json (e.g. the best run's): what changed "
                        "since, and a `regression` finding when the step grew")
    p.add_argument("--unprofiled-ms", type=_milliseconds, metavar="MS",
                   help="your step time without the profiler, in ms (e.g. from your own log): checks the profiled "
                        "step against it and prices GPU idle at its share of it; needed to price idle in a trace "
                        "recorded with with_stack=True, whose Python stacks slow the host")
    p.set_defaults(func=handler)
    return p


def handler(args):
    """Print the report (or the JSON summary) for args.trace; bad input raises UserError. Returns 0."""
    result = ranks.summarize_path(args.trace, unprofiled_ms=args.unprofiled_ms)
    previous = summary.load_summary(args.previous) if args.previous else None
    if previous is not None:
        regression.add(result, previous, f"the profile {args.previous}")
    if args.json:
        if previous is not None:
            result["changes"] = summary.diff(previous, result)
        if args.top is not None:
            result["kernels"] = result["kernels"][:args.top]
        print(render.to_json(result))
    else:
        print(render.to_markdown(result, previous=previous, top=args.top or DEFAULT_TOP))
    return 0
