"""research: the experiment memory, the UCB1 selector and the rescue pool, as one command.

    research log --dimension D --change "..."   append the last run (every number read from run.json)
    research next                               which dimension to try next (UCB1), and why
    research show                               the experiments and the per-dimension summary
    research rescue add|list                    ideas worth another try later
    research import-tsv FILE / export-tsv       a results.tsv in (any layout its header names), upstream's out
    research dimension add NAME                 a new research dimension
    research report [--out DIR]                 the morning report: report.md and progress.png

The memory is ./experiments.json unless --memory PATH or $AUTORESEARCH_MEMORY names another. Bad input
exits 2 with one line, `research: error: ...`, on stderr (import-tsv adds one line per bad row). No torch
here: this starts in ~0.1 s.
"""
import argparse
import json
import os
import re
import sys
from datetime import datetime, timezone

from profiling.errors import UserError
from profiling.research import experiments


def _now():
    return datetime.now(timezone.utc)


def _path(args):
    return experiments.default_path(getattr(args, "memory", None))


def _label(path):
    """The memory's path, for a command that only reads it."""
    return path if os.path.exists(path) else f"{path} (no file yet: the first `research log` creates it)"


def _print_json(data):
    print(json.dumps(data, indent=2, allow_nan=False))


def _check_dimension(mem, dimension):
    if dimension in mem["dimensions"] or dimension == experiments.BASELINE_DIMENSION:
        return
    raise UserError(f"unknown dimension {dimension!r}; valid: {', '.join(mem['dimensions'])} (or "
                    f"{experiments.BASELINE_DIMENSION}, for a rerun of the unchanged baseline); add one with "
                    f"`research dimension add NAME`")


# ----------------------------------------------------------------------------
# Commands

def cmd_log(args):
    from profiling import runfile
    from profiling.research import history, render

    if not args.change.strip():
        raise UserError("--change is empty; describe the change in a few words")
    run, path, now = runfile.read_run(args.run), _path(args), _now()

    def change(mem):
        _check_dimension(mem, args.dimension)
        done = history.already_logged(mem["experiments"], run)
        if done:
            raise UserError(f"{args.run} (commit {run['commit']}, run at {run['time']}) is already experiment "
                            f"{done['id']}; run train.py again before logging")
        record, reason, base = history.record_from_run(
            mem["experiments"], run, args.dimension, args.change.strip(), rationale=args.rationale,
            status=args.status, now=now)
        return (record, reason, base), [record]

    record, reason, base = experiments.update(path, change)
    if args.json:
        _print_json(record)
    else:
        print(render.log_text(record, reason, base, path))
    return 0


def cmd_next(args):
    from profiling.research import history, render, ucb1

    if args.c < 0 or not args.reward_scale > 0:
        raise UserError("--c must be >= 0 and --reward-scale > 0")
    path = _path(args)
    mem = experiments.load(path)
    records = mem["experiments"]
    sel = ucb1.select(records, mem["dimensions"], c=args.c, scale=args.reward_scale)
    stag = history.stagnation(records)
    rescue = [e for e in mem["rescue_pool"] if e["dimension"] == sel["choice"]]
    if args.json:
        rows = [{**r, "score": None if r["bonus"] is None else r["score"], "untried": r["bonus"] is None}
                for r in sel["rows"]]
        _print_json({"memory": path, "choice": sel["choice"], "reason": sel["reason"], "c": sel["c"],
                     "reward_scale": sel["reward_scale"], "reward_rule": ucb1.reward_rule(args.reward_scale),
                     "total_trials": rows[0]["total_trials"] if rows else 0, "dimensions": rows,
                     "stagnation": stag, "rescue": rescue})
    else:
        print(render.next_text(sel, stag, rescue, _label(path), len(records)))
    return 0


def cmd_show(args):
    from profiling.research import history, render, ucb1

    if args.last < 0:
        raise UserError("--last must be >= 0 (0 shows every experiment)")
    path = _path(args)
    mem = experiments.load(path)
    records = mem["experiments"]
    view = {"count": len(records), "experiments": records[-args.last:] if args.last else records,
            "best": history.best_per_group(records), "dimensions": ucb1.dimension_stats(records, mem["dimensions"]),
            "noise_floors": history.noise_floors(records), "early_aborts": history.early_abort_savings(records),
            "rescue_entries": len(mem["rescue_pool"])}
    if args.json:
        _print_json({"memory": path, **view})
    else:
        print(render.show_text(view, _label(path)))
    return 0


def cmd_rescue_add(args):
    from profiling.research import history

    if args.from_experiment is None and args.dimension is None:
        raise UserError("give --from ID (the experiment the idea came from) or --dimension D")

    def change(mem):
        dimension = args.dimension
        if args.from_experiment is not None:
            source = next((r for r in mem["experiments"] if r["id"] == args.from_experiment), None)
            if source is None:
                raise UserError(f"--from {args.from_experiment}: no experiment has that id "
                                "(see `research show`)")
            dimension = dimension or source["dimension"]
        _check_dimension(mem, dimension)
        entry = {"id": experiments.next_id(mem["rescue_pool"]), "time": history.timestamp(_now()),
                 "from_experiment": args.from_experiment, "dimension": dimension,
                 "mechanism": args.mechanism, "reuse_signal": args.reuse_signal}
        mem["rescue_pool"].append(entry)
        return entry, []

    entry = experiments.update(_path(args), change)
    print(f"added rescue entry {entry['id']} for {entry['dimension']}: {entry['mechanism']}")
    return 0


def cmd_rescue_list(args):
    from profiling.research import render

    entries = experiments.load(_path(args))["rescue_pool"]
    if args.dimension:
        entries = [e for e in entries if e["dimension"] == args.dimension]
    if args.json:
        _print_json(entries)
    elif entries:
        print(render.rescue_table(entries))
    else:
        print("rescue pool: empty" + (f" for {args.dimension}" if args.dimension else ""))
    return 0


def cmd_import_tsv(args):
    from profiling.research import history, tsv

    try:
        with open(args.file, encoding="utf-8-sig") as f:
            rows, bad = tsv.read(f.read())
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{args.file}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except UserError as e:
        raise UserError(f"{args.file}: {e}") from None
    if bad and not args.skip_bad:
        print(f"research: error: {len(bad)} bad row{'s' if len(bad) > 1 else ''} in {args.file} (nothing "
              f"imported; --skip-bad imports the other {len(rows)}):", file=sys.stderr)
        print("\n".join("  " + line for line in tsv.bad_rows_text(bad)), file=sys.stderr)
        return 2
    path = _path(args)

    def change(mem):
        base = history.best_kept(mem["experiments"], None, None)
        records = tsv.records_from_rows(tsv.new_rows(mem["experiments"], rows), base and base["val_bpb"])
        unlisted = sorted({r["dimension"] for r in records} - set(mem["dimensions"]))
        return (records, unlisted), records

    records, unlisted = experiments.update(path, change)
    skipped = f", {len(bad)} bad skipped" if bad else ""
    print(f"imported {len(records)} of {len(rows) + len(bad)} rows from {args.file} into {path} "
          f"({len(rows) - len(records)} already there{skipped})")
    if bad:
        print("skipped (not imported):\n" + "\n".join("  " + line for line in tsv.bad_rows_text(bad)))
    if unlisted:
        print(f"note: dimensions not listed in the memory, so UCB1 ignores them: {', '.join(unlisted)} "
              "(`research dimension add NAME` to list one)")
    return 0


def cmd_export_tsv(args):
    from profiling.research import tsv

    text = tsv.export(experiments.load(_path(args))["experiments"], args.columns)
    if args.out:
        experiments.atomic_write(args.out, text)
        print(f"wrote {text.count(chr(10)) - 1} rows to {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_dimension_add(args):
    name = args.name
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", name) or name in experiments.RESERVED_DIMENSIONS:
        raise UserError(f"dimension {name!r}: use lowercase letters, digits, - and _ (starting with a letter), "
                        f"and not {' or '.join(experiments.RESERVED_DIMENSIONS)}")

    def change(mem):
        if name in mem["dimensions"]:
            raise UserError(f"dimension {name!r} is already listed: {', '.join(mem['dimensions'])}")
        mem["dimensions"].append(name)
        return list(mem["dimensions"]), []

    dims = experiments.update(_path(args), change)
    print(f"added dimension {name}; dimensions: {', '.join(dims)}")
    return 0


# ----------------------------------------------------------------------------
# Parser

def _memory_option():
    """--memory, accepted after the subcommand as well as before it."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--memory", metavar="PATH", default=argparse.SUPPRESS,
                        help="the memory file (default: $AUTORESEARCH_MEMORY, else ./experiments.json)")
    return parent


def _add_memory_commands(sub, parent):
    from profiling.research import ucb1

    p = sub.add_parser("log", parents=[parent], help="append the last run to the memory")
    p.add_argument("--dimension", required=True, help="the research dimension the change belongs to")
    p.add_argument("--change", required=True, help="the change, in a few words")
    p.add_argument("--rationale", help="why it should help")
    p.add_argument("--status", choices=experiments.STATUSES,
                   help="override: default keep if val_bpb beats the best kept run with the same settings and "
                        "dataset (or is the first), discard if not; crash/early_abort from the run")
    p.add_argument("--run", default="run.json", metavar="PATH", help="the run summary (default ./run.json)")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.set_defaults(func=cmd_log)

    p = sub.add_parser("next", parents=[parent], help="UCB1: which dimension to try next, and why")
    p.add_argument("--json", action="store_true", help="JSON instead of Markdown")
    p.add_argument("--c", type=float, default=ucb1.C, help="exploration constant (default sqrt 2)")
    p.add_argument("--reward-scale", type=float, default=ucb1.REWARD_SCALE,
                   help="relative improvement that earns the full reward 1 (default 0.01 = 1%%)")
    p.set_defaults(func=cmd_next)

    p = sub.add_parser("show", parents=[parent], help="the experiments and the per-dimension summary")
    p.add_argument("--last", type=int, default=20, metavar="N", help="the last N experiments (0: all; default 20)")
    p.add_argument("--json", action="store_true", help="JSON instead of Markdown")
    p.set_defaults(func=cmd_show)


def _add_other_commands(sub, parent):
    rescue = sub.add_parser("rescue", help="the rescue pool: mechanisms worth another try").add_subparsers(
        dest="rescue_command", metavar="{add,list}", required=True)
    p = rescue.add_parser("add", parents=[parent], help="add an entry")
    p.add_argument("--from", dest="from_experiment", type=int, metavar="ID", help="the experiment it came from")
    p.add_argument("--dimension", help="default: the dimension of --from's experiment")
    p.add_argument("--mechanism", required=True, help="what might work, in a few words")
    p.add_argument("--reuse-signal", required=True, help="when to try it again")
    p.set_defaults(func=cmd_rescue_add)
    p = rescue.add_parser("list", parents=[parent], help="list entries")
    p.add_argument("--dimension", help="only this dimension")
    p.add_argument("--json", action="store_true", help="JSON instead of Markdown")
    p.set_defaults(func=cmd_rescue_list)

    p = sub.add_parser(
        "import-tsv", parents=[parent], help="import a results.tsv: upstream's, or any layout its header names",
        description="Import a results.tsv. A header names the columns in any order (aliases: see "
                    "docs/memory.md); val_bpb and status are required. Without a header: upstream's 5 columns "
                    "(commit, val_bpb, memory_gb, status, description) or the 8-column variant. Rows already "
                    "in the memory are not imported again. A bad row stops the import (every bad row is "
                    "listed, nothing is written) unless --skip-bad.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--skip-bad", action="store_true",
                   help="import the good rows and list the bad ones (default: import nothing if a row is bad)")
    p.set_defaults(func=cmd_import_tsv)
    p = sub.add_parser("export-tsv", parents=[parent], help="export the memory as upstream's results.tsv")
    p.add_argument("--columns", type=int, choices=(5, 8), default=5, help="upstream's 5 columns or the 8-column variant")
    p.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_export_tsv)

    dimension = sub.add_parser("dimension", help="the memory's research dimensions").add_subparsers(
        dest="dimension_command", metavar="{add}", required=True)
    p = dimension.add_parser("add", parents=[parent], help="list a new dimension")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_dimension_add)


# This module's own commands. Commands from other modules (cli_profile: `profile`; cli_report: `report`) are
# registered only when they can be needed: their command is named, no command is, or an unknown one is (so
# --help and argparse's "invalid choice" list them all). Their imports (the trace summary, tabulate: ~130 ms
# measured) would otherwise be paid by every `research log` and `research next`.
OWN_COMMANDS = ("log", "next", "show", "rescue", "import-tsv", "export-tsv", "dimension")


def _command(argv):
    """The subcommand named in argv (the first word that is not an option or --memory's value), or None."""
    words = iter(argv)
    for word in words:
        if word == "--memory":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _add_other_modules(sub, command):
    if command in OWN_COMMANDS:
        return
    if command != "report":
        from profiling.profile.report import cli_profile

        cli_profile.add_subparser(sub)
    if command != "profile":
        from profiling.research import cli_report  # light: matplotlib is imported only when `report` runs

        cli_report.add_subparser(sub)


def build_parser(argv=None):
    """The `research` parser; `argv` (when given) lets it skip importing other modules' commands."""
    parser = argparse.ArgumentParser(
        prog="research", description="Experiment memory, UCB1 dimension selection, rescue pool, profiler.")
    parser.add_argument("--memory", metavar="PATH", default=None,
                        help="the memory file (default: $AUTORESEARCH_MEMORY, else ./experiments.json)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parent = _memory_option()
    _add_memory_commands(sub, parent)
    _add_other_commands(sub, parent)
    _add_other_modules(sub, None if argv is None else _command(argv))
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error argparse has already printed (2)
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except UserError as e:
        print("research: error: " + " ".join(str(e).splitlines()), file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout closed early, e.g. `research show | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
