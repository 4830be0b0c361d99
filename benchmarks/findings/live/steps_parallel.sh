#!/usr/bin/env bash
# The CPU line's per-step figure on a machine of many cores (the lent GPU machine's CPU, CUDA hidden): COPIES
# copies of `new_user_fixes_cpu.py steps`, each pinned to two physical cores of its own (no neighbours on its
# cores), and beside them, on two more, the control: each loop run unprofiled in fresh processes for as many
# steps (BEFORE + AFTER after the warm-up), to show how far the loop's own pace moves between its halves with
# no profiler at all.
#
#     benchmarks/findings/live/steps_parallel.sh OUT [COPIES=3] [PROCESSES=2] [BEFORE=200] [AFTER=200]
#
# Writes OUT/copyN/results.jsonl (the profiled processes, as `steps` writes them), OUT/control.jsonl (a RESULT
# row per unprofiled process) and OUT/cpus.txt (which logical CPUs each copy had).
set -euo pipefail
out=$1; copies=${2:-3}; processes=${3:-2}; before=${4:-200}; after=${5:-200}
here=$(cd "$(dirname "$0")" && pwd)
script=$here/new_user_fixes_cpu.py
mkdir -p "$out"
export CUDA_VISIBLE_DEVICES=""
# one logical CPU per physical core (its first sibling), CPU 0's core left to the system
mapfile -t cpus < <(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -k1,1n | awk -F, '!seen[$2]++ {print $1}')
if (( ${#cpus[@]} < 2 * copies + 3 )); then
    echo "steps_parallel.sh: ${#cpus[@]} physical cores, need $((2 * copies + 3)) for $copies copies and the control;" \
         "pass fewer copies, or run it on a machine of more cores" >&2
    exit 2
fi
pids=()
for ((i = 0; i < copies; i++)); do
    pair="${cpus[1 + 2 * i]},${cpus[2 + 2 * i]}"
    echo "copy$i: cpus $pair" >> "$out/cpus.txt"
    taskset -c "$pair" python3 "$script" steps "$out/copy$i" --processes "$processes" --before "$before" \
        --after "$after" > "$out/copy$i.log" 2>&1 &
    pids+=($!)
done
pair="${cpus[1 + 2 * copies]},${cpus[2 + 2 * copies]}"
echo "control: cpus $pair" >> "$out/cpus.txt"
(
    for loop in unfused unfused unfused varlen hf unfused unfused unfused varlen hf; do
        taskset -c "$pair" python3 "$script" child --loop "$loop" --mode time --dir "$(mktemp -d)" \
            --after $((before + after)) | sed -n 's/^RESULT //p' >> "$out/control.jsonl" || true  # a failed one: none
    done
) > "$out/control.log" 2>&1 &
pids+=($!)
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
