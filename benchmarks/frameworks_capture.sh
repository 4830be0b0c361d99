#!/usr/bin/env bash
# The framework examples on a GPU, each profiled through its one-line callback (issue #41): Hugging Face's Trainer
# (examples/hf_trainer.py, a Llama built from a config) and Lightning (examples/lightning_train.py), eager and
# compiled, at their `gpu` sizes. Each run's log, report.md, summary.json and trace go to OUT/<run>/.
#     bash benchmarks/frameworks_capture.sh OUT [extra flags for both examples...]
# Results and what was read from them: benchmarks/frameworks_results.md.
set -uo pipefail
out=${1:?usage: frameworks_capture.sh OUT [flags...]}
shift
mkdir -p "$out"
for example in hf_trainer lightning_train; do
    for mode in eager compiled; do
        run="$out/${example%_*}-$mode"
        mkdir -p "$run"
        flags=(--size gpu --steps 20 --profile "$run/profiles" --output-dir "$run/output" "$@")
        [ "$mode" = compiled ] && flags+=(--compile)
        start=$(date +%s)
        python3 "examples/$example.py" "${flags[@]}" >"$run/log" 2>&1
        echo "$example $mode: exit $? in $(( $(date +%s) - start )) s"
        folder=$(sed -n 's/^profile: //p' "$run/log" | tail -1)
        if [ -n "$folder" ]; then
            cp "$folder/report.md" "$folder/summary.json" "$run/"
            cp "$folder"/*.trace.json.gz "$run/" 2>/dev/null
        fi
        rm -rf "$run/output"
    done
done
