#!/usr/bin/env bash
# Render every fixture's report and --json summary at two commits and diff them (issue #47: a pure move keeps
# every output byte-identical). Usage:
#     benchmarks/same_output/render_fixtures.sh [--ignore-stage-paths] BEFORE [AFTER, default: the work tree]
# Each commit is checked out into a temporary worktree and rendered there with this checkout's environment
# and this checkout's benchmarks/same_output/render_fixtures.py. Exit 0 when every file is identical.
# --ignore-stage-paths: reports name the module of a rule (`rules: profiling/profile/tables/bound.py`); across
# issue #47's move into stage folders, `profiling/profile/<stage>/` is read as `profiling/profile/` in AFTER's
# output, so only the folder is forgiven (a renamed file, a changed word or number still differs).
set -euo pipefail
strip=""
if [ "${1:-}" = "--ignore-stage-paths" ]; then strip=1; shift; fi
here=$(cd "$(dirname "$0")/.." && pwd)
python=$here/.venv/bin/python
tmp=$(mktemp -d)
trap 'git -C "$here" worktree remove --force "$tmp/before" >/dev/null 2>&1 || true;
      git -C "$here" worktree remove --force "$tmp/after" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
render() {  # render <source folder> <out folder>
    (cd "$1" && PYTHONPATH="$1" "$python" "$here/benchmarks/same_output/render_fixtures.py" "$2" 2>/dev/null)
}
git -C "$here" worktree add --detach --quiet "$tmp/before" "$1"
if [ $# -ge 2 ]; then git -C "$here" worktree add --detach --quiet "$tmp/after" "$2"; after=$tmp/after
else after=$here; fi
render "$tmp/before" "$tmp/out-before" &
render "$after" "$tmp/out-after"
wait
if [ -n "$strip" ]; then
    sed -i -E 's#profiling/profile/(capture|trace|tables|report)/#profiling/profile/#g' "$tmp"/out-after/*
fi
n=$(ls "$tmp/out-before" | wc -l)
if diff -r "$tmp/out-before" "$tmp/out-after" > "$tmp/diff"; then
    echo "identical: $n files ($1 vs ${2:-work tree})"
else
    echo "DIFFERENT ($1 vs ${2:-work tree}):"; head -50 "$tmp/diff"; exit 1
fi
