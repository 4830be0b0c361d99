"""Every fixture's report and `--json` summary as `research profile` prints them, one file each, for checking
that a change meant to keep the output (a move, a refactor) keeps it byte for byte.

    uv run python benchmarks/same_output/render_fixtures.py OUT_DIR [TRACE ...]
    benchmarks/same_output/render_fixtures.sh BEFORE_COMMIT [AFTER_COMMIT]    # both commits rendered and
    diffed

Writes OUT_DIR/<fixture>.md and OUT_DIR/<fixture>.json for every trace under tests/data (files and rank
folders), tests/data/foreign and ../shared/fixtures, through `profiling.cli.main(["profile", ...])`, the
command's own path. Only the CLI is called, so the script runs unchanged at older commits. A fixture the
command refuses writes its error message instead (exit status and message are output too).
"""
import contextlib
import glob
import io
import os
import sys

from profiling import cli

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def fixtures():
    """(name, path) of every fixture: tests/data's traces and rank folders, the foreign corpus, ../shared's."""
    data = os.path.join(ROOT, "tests", "data")
    paths = (sorted(glob.glob(os.path.join(data, "*.json.gz")))
             + sorted(p for p in glob.glob(os.path.join(data, "cpu-ddp-*")) if os.path.isdir(p))
             + sorted(glob.glob(os.path.join(data, "foreign", "*.json.gz")))
             + sorted(glob.glob(os.path.join(ROOT, "..", "shared", "fixtures", "*.json.gz"))))
    return [(os.path.relpath(p, ROOT).replace(os.sep, "__").removeprefix("..__").removesuffix(".json.gz"), p)
            for p in paths]


def render(argv):
    """What `research profile ARGV` prints (stdout, then stderr and the exit status when it fails)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    return out.getvalue() + ("" if code == 0 else f"\n[exit {code}]\n{err.getvalue()}")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    chosen = [(os.path.basename(p), p) for p in sys.argv[2:]] or fixtures()
    for i, (name, path) in enumerate(chosen, 1):
        for suffix, extra in ((".md", []), (".json", ["--json"])):
            with open(os.path.join(out, name + suffix), "w", encoding="utf-8") as f:
                f.write(render(["profile", path, *extra]))
        print(f"[{i}/{len(chosen)}] {name}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
