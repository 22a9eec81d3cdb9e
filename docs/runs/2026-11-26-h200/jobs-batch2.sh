#!/usr/bin/env bash
# GPU job list v3: the launch-bound size, quiet: every job compiles side by side, then they time one by one only
# once all have warmed up (--lock-after), so no compile shares the CPU with a timed run.
cd "$(dirname "$0")/.."
R=${R:-/tmp/gpu}; mkdir -p $R
export TORCHINDUCTOR_COMPILE_THREADS=${CT:-2} PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
B="python3 -m tome_bench --device cuda --lock $R/lock"
job() { n=$1; shift; ( echo "== $n start $(date +%T)" >> $R/progress
  $B "$@" --out $R/$n > $R/$n.log 2>&1; echo "== $n rc=$? end $(date +%T)" >> $R/progress ) & }
C="--compile --variants baseline --repeats 5 --warmup 1 --lock-after 5"
for p in quality balanced fast fastest; do job q-sd15-1024-$p $C --arch sd15 --sizes 1024 --presets $p; done
job q-sdxl-1024-qb $C --lock-after 2 --arch sdxl --sizes 1024 --presets quality,balanced
job q-sdxl-1024-ff $C --lock-after 2 --arch sdxl --sizes 1024 --presets fast,fastest
job q-ro-sd15-1024 --compile reduce-overhead --variants baseline --repeats 5 --warmup 1 --lock-after 5 --arch sd15 --sizes 1024 --presets balanced,fastest
( while sleep 20; do echo "-- $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) warm $(ls $R/lock.warm.* 2>/dev/null | wc -l) gpu $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null)" >> $R/progress; done ) &
mon=$!
wait $(jobs -p | grep -v "^$mon$")
kill $mon
echo "== all done $(date +%T)" >> $R/progress
