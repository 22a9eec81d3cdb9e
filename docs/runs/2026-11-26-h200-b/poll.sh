#!/usr/bin/env bash
# Wait up to $1 seconds (less if all jobs are done), then pack the results into $OUT.
end=$((SECONDS + ${1:-520}))
while [ $SECONDS -lt $end ] && ! grep -q "all done" /tmp/gpu/progress 2>/dev/null; do sleep 5; done
cat /tmp/gpu/progress; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
for f in /tmp/gpu/*.log; do echo "## $f"; tail -c 400 $f | tr '\r' '\n' | tail -3; done
tar czf $OUT/gpu.tgz -C /tmp gpu
