#!/usr/bin/env bash
# The framework examples on a GPU, each profiled through its one-line callback (issue #41): Hugging Face's Trainer
# (examples/hf_trainer.py, a Llama built from a config) and Lightning (examples/lightning_train.py), at their
# `gpu` sizes, 20 optimizer steps. Each run's log, report.md and summary.json go to OUT/<run>/, its trace to
# OUT/<run>.trace.json.gz.
#     bash benchmarks/findings/live/frameworks_capture.sh OUT                       # the four plain runs (eager, compiled)
#     bash benchmarks/findings/live/frameworks_capture.sh OUT "NAME EXAMPLE FLAGS..." ...   # runs of your own, e.g. a fix applied:
#     bash benchmarks/findings/live/frameworks_capture.sh OUT "lightning-pinned lightning_train --compile --pin-memory"
# Results and what was read from them: benchmarks/findings/live/frameworks_results.md.
set -uo pipefail
out=${1:?usage: frameworks_capture.sh OUT [\"NAME EXAMPLE FLAGS...\" ...]}
shift
runs=("$@")
if [ ${#runs[@]} -eq 0 ]; then
    runs=("hf-eager hf_trainer" "hf-compiled hf_trainer --compile"
          "lightning-eager lightning_train" "lightning-compiled lightning_train --compile")
fi
mkdir -p "$out"
for spec in "${runs[@]}"; do
    read -r name example flags <<<"$spec"
    run="$out/$name"
    mkdir -p "$run"
    start=$(date +%s)
    # shellcheck disable=SC2086 (the flags are words)
    python3 "examples/$example.py" --size gpu --steps 20 --profile "$run/profiles" --output-dir "$run/output" \
        $flags >"$run/log" 2>&1
    echo "$name: exit $? in $(( $(date +%s) - start )) s"
    folder=$(sed -n 's/^profile: //p' "$run/log" | tail -1)
    if [ -n "$folder" ] && [ -d "$folder" ]; then
        cp "$folder/report.md" "$folder/summary.json" "$run/"
        cp "$folder/trace.json.gz" "$out/$name.trace.json.gz"
    fi
    rm -rf "$run/output" "$run/profiles"
done
