#!/usr/bin/env bash
# Issue #43's GPU acceptance in one device call (items 1-4), with the machine's plain python3:
#   a1  the default config profiled (`train.py --profile`): its `fits` recommends a micro-batch
#   a2  a short training run at that micro-batch (train.py accepts it: exit 0), logged as the kept run
#   b   a copy whose backward keeps each micro-batch's graph alive (retain_graph=True, by sed) at the kept
#       run's micro-batch, with AUTORESEARCH_MEMORY_HISTORY=1: must end in the OOM line that names the kept
#       run, both figures, the growth by category and the lines that grew
#   c   the default config profiled with PYTORCH_NO_CUDA_MEMORY_CACHING=1: its peak against a1's
#   d   train.py copied to another folder with a line added at its top, profiled on a1's Inductor cache: its
#       memory lines must name the copy's file, one line lower than a1's
#     bash benchmarks/gpu_memory/memory_advice.sh [OUT]      # OUT: default $OUT; the logs, run.json and summaries go there
# Everything else stays under .bench/memory_advice/ (profiles, memory, Inductor cache; the data cache too unless
# AUTORESEARCH_CACHE names a prepared one: the builtin corpus is prepared on first use, offline, in seconds).
# LIMIT (default 540) is the seconds the whole script may take: a step that cannot start with 30 s left is
# skipped and says so. The digest at the end is what to read.
set -uo pipefail
out=${1:-${OUT:?usage: memory_advice.sh OUT (or set OUT)}}
root=$(cd "$(dirname "$0")/.." && pwd)
bench=$root/.bench/memory_advice
rm -rf "$bench/profiles" "$bench/experiments.json" "$bench/runs"
mkdir -p "$out" "$bench/runs"
deadline=$(( $(date +%s) + ${LIMIT:-540} ))
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
export AUTORESEARCH_CACHE=${AUTORESEARCH_CACHE:-$bench/cache}
export AUTORESEARCH_PROFILE_DIR=$bench/profiles AUTORESEARCH_MEMORY=$bench/experiments.json
export TORCHINDUCTOR_CACHE_DIR=$bench/inductor          # shared: a2..d reuse a1's compiled graphs
export AUTORESEARCH_TIME_BUDGET=${BUDGET:-20} AUTORESEARCH_EVAL_TOKENS=${EVAL_TOKENS:-1048576}  # all runs: one settings group

# run NAME CAP SOURCE [ENV=VALUE...] -- [train.py flags]: SOURCE (train.py or a copy under runs/NAME) runs with
# cwd=root for at most CAP seconds (less if the limit is nearer); its log and run.json go to OUT/NAME.*
run() {
    local name=$1 cap=$2 source=$3; shift 3
    local envs=() left
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    left=$(( deadline - $(date +%s) - 10 ))
    if [ "$left" -lt 30 ]; then echo "$name: skipped (the time limit)" | tee "$out/$name.log"; return 1; fi
    [ "$cap" -gt "$left" ] && cap=$left
    local t0; t0=$(date +%s)
    env ${envs[@]+"${envs[@]}"} timeout "$cap" python3 "$source" --run-file "$bench/runs/$name.run.json" "$@" \
        >"$out/$name.log" 2>&1
    local code=$?
    echo "$name: exit $code in $(( $(date +%s) - t0 )) s" | tee -a "$out/steps.txt"
    cp "$bench/runs/$name.run.json" "$out/$name.run.json" 2>/dev/null  # none for --profile runs
    return $code
}

# the profile a run just wrote (its run.json's `profile`, else the `(profile files: ...)` line of a --profile log)
keep_profile() {
    local name=$1 folder
    folder=$(sed -n 's/^(profile files: \([^;]*\);.*/\1/p' "$out/$name.log" | tail -1)
    if [ -n "$folder" ] && [ -d "$folder" ]; then
        cp "$folder/summary.json" "$out/$name.summary.json"; cp "$folder/report.md" "$out/$name.report.md"
    fi
}

copy_of() {  # copy_of NAME SED-SCRIPT: train.py under runs/NAME/ edited by sed; prints its path
    mkdir -p "$bench/runs/$1"
    sed "$2" "$root/train.py" >"$bench/runs/$1/train.py"
    echo "$bench/runs/$1/train.py"
}

cd "$root" || exit 1
: >"$out/steps.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__)" >>"$out/gpu.txt" 2>&1

# a1: the default config's profile and what it recommends
run a1 240 train.py -- --profile
keep_profile a1
rec=$(python3 -c "import json; f=json.load(open('$out/a1.summary.json'))['gpu_memory']['fits']; \
print(f['recommended_micro_batch'])" 2>/dev/null || echo 128)

# a2: a short run at the recommended micro-batch, logged: the kept run
a2=$(copy_of a2 "s/^DEVICE_BATCH_SIZE = 128 /DEVICE_BATCH_SIZE = $rec /")
run a2 200 "$a2" -- --no-gate
keep_profile a2
python3 -m profiling log --run "$bench/runs/a2.run.json" --dimension baseline --change "default, micro-batch $rec" \
    >"$out/a2.research-log.txt" 2>&1

# b: each micro-batch's graph kept alive, at the kept run's micro-batch; the history on for the lines
b=$(copy_of b "s/^DEVICE_BATCH_SIZE = 128 /DEVICE_BATCH_SIZE = $rec /;
s/(loss \/ grad_accum_steps).backward()/(loss \/ grad_accum_steps).backward(retain_graph=True)/")
grep -c "retain_graph=True" "$b" >"$out/b.edit.txt"
run b 180 "$b" AUTORESEARCH_MEMORY_HISTORY=1 -- --no-gate
python3 -m profiling log --run "$bench/runs/b.run.json" --dimension architecture --change "retain_graph=True" \
    >"$out/b.research-log.txt" 2>&1
cp "$AUTORESEARCH_MEMORY" "$out/experiments.json" 2>/dev/null

# c: the caching allocator off, profiled
run c 200 train.py PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- --profile
keep_profile c

# d: another folder, a line added at the top, a1's Inductor cache
d=$(copy_of d "1i # a line added at the top (issue #43: memory lines through the compile-cache mapping)")
run d 150 "$d" -- --profile
keep_profile d

echo "=== digest ===" | tee "$out/digest.txt"
python3 - "$out" "$rec" <<'EOF' | tee -a "$out/digest.txt"
import json, os, re, sys
out, rec = sys.argv[1], sys.argv[2]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None
def line(name, pattern):
    try:
        return next((l.strip() for l in open(os.path.join(out, name)) if re.search(pattern, l)), None)
    except OSError:
        return None
print(open(os.path.join(out, "steps.txt")).read().strip())
a1 = load("a1.summary.json") or {}
fits = (a1.get("gpu_memory") or {}).get("fits") or {}
print("(a) fits:", {k: fits.get(k) for k in ("max_micro_batch", "recommended_micro_batch", "sequences_per_step",
                                             "grad_accum_steps")})
print("(a) report:", line("a1.log", r"largest micro-batch predicted to fit"))
a2 = load("a2.run.json") or {}
print(f"(a) run at DEVICE_BATCH_SIZE={rec}: status {a2.get('status')}, peak_vram_mb "
      f"{(a2.get('summary') or {}).get('peak_vram_mb')}; logged:", line("a2.research-log.txt", r"^status:"))
print("(b) FAIL:", line("b.log", r"^FAIL: "))
b = (load("b.run.json") or {}).get("oom") or {}
print("(b) fitted:", json.dumps(b.get("fitted"))[:1500])
ex = (load("experiments.json") or {}).get("experiments") or [{}]
print("(b) experiments.json keeps it:", bool((ex[-1].get("oom") or {}).get("fitted")))
c = load("c.summary.json") or {}
on, off = a1.get("peak_memory_mb"), c.get("peak_memory_mb")
print(f"(c) peak with caching on {on} MB (allocator); off: peak_memory_mb {off}, caching_allocator "
      f"{c.get('caching_allocator')}, memory_in_use_mb {c.get('memory_in_use_mb')}, gpu_memory "
      f"{json.dumps(c.get('gpu_memory'))[:300]}")
if on and off:
    print(f"(c) off / on = {off / on:.3f} (within 10%: {abs(off / on - 1) <= 0.10})")
else:
    print("(c) caching off: the peak is", "unknown (said so)" if off is None else off)
print("(c) header:", line("c.log", r"peak memory"))
d = load("d.summary.json") or {}
lines = {name: [r["where"] for r in (s.get("gpu_memory") or {}).get("lines") or []] for name, s in (("a1", a1), ("d", d))}
print("(d) a1 memory lines:", lines["a1"])
print("(d) d memory lines:", lines["d"])
def own(ws):
    return [(w.split(":")[0].split("/")[0], int(re.search(r":(\d+)", w).group(1))) for w in ws
            if re.search(r"train\.py:\d+", w)]
a_lines, d_lines = own(lines["a1"]), own(lines["d"])
print("(d) every train.py memory line of d in the copy's folder, one lower than a1's:",
      bool(d_lines) and all(f == "d" for f, _ in d_lines)
      and sorted(n for _, n in d_lines) == sorted(n + 1 for _, n in a_lines))
EOF
