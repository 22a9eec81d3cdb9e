#!/usr/bin/env bash
# Install the carried wheels, start the compiled parts in the background, run eager then gen, pack what exists.
# Next GPU session: mkdir .gpu; cp docs/runs/2026-11-26-h100-e/{gpu_job.py,run.sh} .gpu/ (as job2.py, run2.sh);
# download the wheels into .whl (diffusers 0.35.2, importlib_metadata, tomesd 0.1.3); run `bash .gpu/run2.sh 400`
# with carry [.whl, .gpu], timeout_s 450. The eager part waits for the compiled parts to warm up first.
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True TORCHINDUCTOR_COMPILE_THREADS=4
export WARM_PARTS=3 WARM_WAIT=200
R=/tmp/g2; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
END=$((SECONDS + ${1:-380}))
for p in c-ro-sd15 c-default-sd15 c-ro-sdxl; do
  ( timeout $(( ${1:-380} - 10 )) python3 .gpu/job2.py $R $p > $R/$p.out 2>&1 ) &
done
timeout $(( ${1:-380} - 15 )) python3 .gpu/job2.py $R eager 2>&1 | grep -v USDT | tail -40
left=$(( END - SECONDS - 12 ))
[ $left -gt 20 ] && timeout $left python3 .gpu/job2.py $R gen 2>&1 | grep -v USDT | tail -40
while [ $SECONDS -lt $((END - 8)) ] && pgrep -f "job2.py $R c-" >/dev/null; do sleep 3; done
pkill -f "job2.py $R c-"
for p in c-ro-sd15 c-default-sd15 c-ro-sdxl; do echo "## $p"; grep -v "USDT\|^ \|^\[" $R/$p.out | tail -6; done
cd $R && tar czf $OUT/g2.tgz *.json *.log *.out
