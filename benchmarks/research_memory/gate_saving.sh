#!/usr/bin/env bash
# The early-abort gate on a GPU: what it saves on a clearly bad change, and that a baseline rerun passes.
#   bash benchmarks/research_memory/gate_saving.sh baseline OUT   full baseline run, logged as the kept reference
#   bash benchmarks/research_memory/gate_saving.sh bad OUT        MATRIX_LR x10 (in a copy of train.py), logged
#   bash benchmarks/research_memory/gate_saving.sh rerun OUT      the unchanged baseline again, logged
# The memory is OUT/experiments.json (or $AUTORESEARCH_MEMORY). Uses python3 directly (no uv needed).
set -uo pipefail
phase=$1 out=$2
export PYTHONUNBUFFERED=1 AUTORESEARCH_MEMORY=${AUTORESEARCH_MEMORY:-$out/experiments.json}
work=$(mktemp -d)
cp -r train.py prepare.py profiling "$work"/
cd "$work" || exit 1
git init -q && git add -A && git -c user.email=bench@local -c user.name=bench commit -qm baseline
if [ "$phase" = bad ]; then
    sed -i 's/^MATRIX_LR = 0.04 /MATRIX_LR = 0.4  /' train.py
    grep -q '^MATRIX_LR = 0.4 ' train.py || { echo "could not edit MATRIX_LR"; exit 1; }
    git -c user.email=bench@local -c user.name=bench commit -qam "MATRIX_LR x10"
fi
start=$(date +%s.%N)
python3 train.py > "$out/$phase.log" 2>&1
rc=$?
wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
echo "$phase: exit $rc, wall ${wall}s"
tr '\r' '\n' < "$out/$phase.log" | grep -E "^(Early|val_bpb|training_seconds|total_seconds|num_steps|mfu_percent|peak_vram_mb|status|gate_)"
cp run.json "$out/$phase.run.json"
dim=$([ "$phase" = bad ] && echo optimizer || echo baseline)
python3 -m profiling log --dimension "$dim" --change "$phase" | tail -4
