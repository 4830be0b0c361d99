#!/usr/bin/env bash
# Does the project's own main job, and `--profile`, pass its own checks? (issue #57, "checks a user can act on")
# Runs `train.py` and `train.py --profile` N times each in a fresh process (here: `uv run`; on the GPU machine,
# PY=python3 with the data cache prepared), keeps each log in OUT, and prints each run's step-time check line and
# every CHECK FAILED. The main job's time budget is the preset's unless AUTORESEARCH_TIME_BUDGET says otherwise.
#   bash benchmarks/profiler_cost/own_checks.sh OUT [N]                      # this machine, uv run
#   PY=python3 bash benchmarks/profiler_cost/own_checks.sh OUT 1             # the GPU machine
set -u
out=${1:?OUT}; n=${2:-3}; py=${PY:-uv run}
mkdir -p "$out"
export AUTORESEARCH_MEMORY=${AUTORESEARCH_MEMORY:-$out/experiments.json}
export AUTORESEARCH_PROFILE_DIR=${AUTORESEARCH_PROFILE_DIR:-$out/profiles}
for i in $(seq 1 "$n"); do
  for mode in train profile; do
    log="$out/$mode$i.log"
    start=$(date +%s)
    if [ "$mode" = train ]; then $py train.py --run-file "$out/run$i.json" > "$log" 2>&1; else $py train.py --profile > "$log" 2>&1; fi
    rc=$?
    echo "$mode $i: exit $rc, $(( $(date +%s) - start )) s, load $(cut -d' ' -f1 /proc/loadavg)"
    grep -h "profiled vs unprofiled step time" "$log" | head -1
    grep -h "^CHECK FAILED" "$log" || echo "  no CHECK FAILED"
  done
done
