#!/usr/bin/env bash
# What a process's first profile pays (issue #41): one fresh process per (workload, variant of the first
# profile), each profiling twice through the API; traces kept. Run on the GPU machine:
#   bash benchmarks/profiler_cost/first_profile.sh OUT "gpt2:full,no_provenance,no_sampler,prewarm resnet50:full,bare"
set -u
out=${1:?OUT}; plan=${2:?'"workload:variant,variant ..."'}
mkdir -p "$out"
nvidia-smi -q -d PERFORMANCE | grep -iE "active|slowdown|brake" | head -20 > "$out/clocks.txt"
python3 -c "
import torch,time
a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16);b=a@a;torch.cuda.synchronize()
t=time.perf_counter()
for _ in range(20): b=a@a
torch.cuda.synchronize();print(f'bf16 8192^3 matmul: {20*2*8192**3/(time.perf_counter()-t)/1e12:.0f} TFLOP/s')
" | tee "$out/matmul.txt"
for item in $plan; do
  w=${item%%:*}
  for v in ${item#*:}; do
    v=${v//,/ }
    for one in $v; do
      python3 benchmarks/profiler_cost/profiler_cost.py "$out/runs" --workloads "$w" --reps 0 --warmup 0 --api 2 \
        --first "$one" --keep-traces 2>&1 | grep -v "^W1\|UserWarning\|warnings.warn" | tee -a "$out/log.txt"
    done
  done
done
