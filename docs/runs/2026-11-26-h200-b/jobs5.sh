#!/usr/bin/env bash
# GPU job list v5 (2026-11-26, third session): CUDA graphs (mode="reduce-overhead") per preset at 1024 px after the
# fix that keeps the patch's tensors out of the graph's inputs. One process per (arch, preset), started in two
# waves so that the later ones find the unpatched UNet's graph in inductor's cache; all time one by one after all
# have compiled (--lock-after).
cd "$(dirname "$0")/.."
R=${R:-/tmp/gpu}; mkdir -p $R
export TORCHINDUCTOR_COMPILE_THREADS=${CT:-2} PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
N=6
job() { n=$1; shift; ( echo "== $n start $(date +%T)" >> $R/progress
  "$@" --out $R/$n > $R/$n.log 2>&1; echo "== $n rc=$? end $(date +%T)" >> $R/progress ) & }
B="python3 -m tome_bench --device cuda --lock $R/lock --lock-after $N --compile reduce-overhead --variants baseline --repeats 5 --warmup 1 --sizes 1024"
job ro-sd15-quality $B --arch sd15 --presets quality
job ro-sdxl-balanced $B --arch sdxl --presets balanced
( while sleep 20; do echo "-- $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) warm $(ls $R/lock.warm.* 2>/dev/null | wc -l) gpu $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null)" >> $R/progress; done ) &
mon=$!
sleep 70
job ro-sd15-balanced $B --arch sd15 --presets balanced
job ro-sd15-fast $B --arch sd15 --presets fast
job ro-sd15-fastest env TORCH_LOGS=cudagraphs $B --arch sd15 --presets fastest
sleep 35
job ro-sdxl-fastest $B --arch sdxl --presets fastest
wait $(jobs -p | grep -v "^$mon$")
kill $mon
echo "== all done $(date +%T)" >> $R/progress
