#!/usr/bin/env bash
# GPU job list v2: every job in parallel (compiles on the CPU side by side), timed one at a time (--lock).
cd "$(dirname "$0")/.."
R=${R:-/tmp/gpu}; mkdir -p $R
export TORCHINDUCTOR_COMPILE_THREADS=${CT:-2} PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
B="${PY:-python3} -m tome_bench --device ${DEV:-cuda} --lock $R/lock"
S1=${S1:-1024}; S2=${S2:-2048}; ST=${ST:-10}
job() { n=$1; shift; ( echo "== $n start $(date +%T)" >> $R/progress
  $B "$@" --out $R/$n > $R/$n.log 2>&1; echo "== $n rc=$? end $(date +%T)" >> $R/progress ) & }
C="--compile --variants baseline --repeats 3 --warmup 1"
for p in quality balanced fast fastest; do job c-sd15-$S1-$p $C --arch sd15 --sizes $S1 --presets $p; done
job c-sd15-$S2-qb $C --arch sd15 --sizes $S2 --presets quality,balanced
job c-sd15-$S2-ff $C --arch sd15 --sizes $S2 --presets fast,fastest
job c-sdxl-$S1-qb $C --arch sdxl --sizes $S1 --presets quality,balanced
job c-sdxl-$S1-ff $C --arch sdxl --sizes $S1 --presets fast,fastest
job c-sdxl-$S2-qb $C --arch sdxl --sizes $S2 --presets quality,balanced
job c-sdxl-$S2-ff $C --arch sdxl --sizes $S2 --presets fast,fastest
G="--compile --steps $ST --scheduler dpm++2m --seed 11 --variants baseline --latents noise --repeats 2 --warmup 1"
job g-sd15-$S1-qb $G --arch sd15 --sizes $S1 --presets quality,balanced
job g-sd15-$S1-ff $G --arch sd15 --sizes $S1 --presets fast,fastest
job ro-sd15-$S1 --compile reduce-overhead --variants baseline --repeats 3 --warmup 1 --arch sd15 --sizes $S1 --presets balanced,fastest
( while sleep 20; do echo "-- $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) mem $(free -g | awk '/Mem/{print $3}')G gpu $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null)" >> $R/progress; done ) &
mon=$!
wait $(jobs -p | grep -v "^$mon$")
kill $mon
echo "== all done $(date +%T)" >> $R/progress
