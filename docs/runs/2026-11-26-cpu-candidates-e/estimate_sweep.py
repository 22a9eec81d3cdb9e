"""Ops added and estimated GPU work per candidate config: python estimate_sweep.py ARCH SIZES CANDIDATES.json [GPU]"""

import json
import sys
from pathlib import Path

from tome_bench.gpu_estimate import GPUS, estimate, meta_unet, trace_call
from tome_core import apply_patch


def main() -> None:
    arch, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    cands = json.loads(Path(sys.argv[3]).read_text())
    gpu = GPUS[sys.argv[4] if len(sys.argv) > 4 else "h200"]
    unet = meta_unet(arch)
    for size in sizes:
        eb = estimate(trace_call(unet, arch, size), gpu)
        print(f"{arch} {size}: baseline {eb.launching} ops, {eb.gpu_ms:.2f} ms")
        for name, fields in cands.items():
            e = estimate(trace_call(unet, arch, size, lambda u, f=fields: apply_patch(u, **f)), gpu)
            print(
                f"   {name:28s} ops {100 * (e.launching / eb.launching - 1):+5.1f}%  gpu x{eb.gpu_ms / e.gpu_ms:5.2f}"
                f"  flops x{eb.flops / e.flops:5.2f}"
            )


if __name__ == "__main__":
    main()
