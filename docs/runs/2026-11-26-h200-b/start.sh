#!/usr/bin/env bash
# First call: install the carried wheels, a sanity check, then the job list in the background (setsid).
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch, diffusers, transformers; print(torch.__version__, diffusers.__version__, transformers.__version__, torch.cuda.get_device_name())'
mkdir -p /tmp/gpu
setsid nohup bash .gpu/${JOBS:-jobs2}.sh > /tmp/gpu/jobs.out 2>&1 < /dev/null &
bash .gpu/poll.sh ${1:-520}
