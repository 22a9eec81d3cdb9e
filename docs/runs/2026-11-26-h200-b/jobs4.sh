#!/usr/bin/env bash
# GPU job list v4 (2026-11-26, third session): the eager kernel profile per preset first (holding the timing lock),
# beside it the CUDA-graph diagnosis and SDXL Fastest (today's preset) compiled at 2048 px compile, then time.
cd "$(dirname "$0")/.."
R=${R:-/tmp/gpu}; mkdir -p $R
export TORCHINDUCTOR_COMPILE_THREADS=${CT:-4} PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
job() { n=$1; shift; ( echo "== $n start $(date +%T)" >> $R/progress
  "$@" > $R/$n.log 2>&1; echo "== $n rc=$? end $(date +%T)" >> $R/progress ) & }
job eager python3 .gpu/tome_gpu_profile.py $R/prof eager $R/lock
sleep 5
job ro env TORCH_LOGS=cudagraphs,perf_hints python3 .gpu/tome_gpu_profile.py $R/prof ro $R/lock
job c-sdxl-2048-fastest python3 -m tome_bench --device cuda --lock $R/lock --compile --variants baseline --repeats 3 --warmup 1 --arch sdxl --sizes 2048 --presets fastest --out $R/c-sdxl-2048-fastest
( while sleep 20; do echo "-- $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) gpu $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null)" >> $R/progress; done ) &
mon=$!
wait $(jobs -p | grep -v "^$mon$")
kill $mon
echo "== all done $(date +%T)" >> $R/progress
