"""Scan keys/values 2x2 from later blocks on, per family: the speed-up estimated on the full-size config at the size
users run, and the stand-in's whole generation (one sample) beside dropping steps for the same time.

Run: PYTHONPATH=. python docs/runs/2026-11-28-dit-fidelity-blocks/scan.py qwen 0.2,0.35,0.45,0.55,0.65
"""

import math
import sys

import torch

import tome_core
from tome_bench import dit_archs
from tome_bench import dit_standin as ds
from tome_bench.gpu_estimate import GPUS, estimate


def main(fam: str, starts: list[float], steps: int = 12) -> None:
    torch.set_num_threads(1)
    size = ds.SIZES[fam]
    arch = dit_archs.DIT_ARCHS[dit_archs.TABLE_ARCH[fam]]
    model = arch.build()
    base = estimate(dit_archs.trace_call(arch, model, size), GPUS["h200"])
    speeds = {}
    for b in starts:
        kv = {"mode": "kv", "sx": 2, "sy": 2, "block_start": b}
        found = estimate(
            dit_archs.trace_call(arch, model, size, lambda m, kv=kv: tome_core.apply_patch(m, **kv)), GPUS["h200"]
        )
        speeds[b] = base.gpu_ms / found.gpu_ms
        print(fam, b, "speed", round(speeds[b], 3), flush=True)
    family = ds.FAMILIES[fam]
    stand_in = ds.build(family, 0.85)
    base_gen = ds.generate(stand_in, family, steps, 0)
    refs: dict[int, float] = {}
    for b in starts:
        fewer = max(1, math.ceil(steps / speeds[b] - 1e-9))
        if fewer not in refs:
            refs[fewer] = ds.change(ds.generate(stand_in, family, fewer, 0), base_gen)
        tome_core.apply_patch(stand_in, mode="kv", sx=2, sy=2, block_start=b)
        ch = ds.change(ds.generate(stand_in, family, steps, 0), base_gen)
        tome_core.remove_patch(stand_in)
        ratio = ch / refs[fewer] if refs[fewer] else float("inf")
        print(fam, b, f"speed {speeds[b]:.3f} steps {fewer} change {ch:.4f} ref {refs[fewer]:.4f} ratio {ratio:.2f}")


if __name__ == "__main__":
    main(sys.argv[1], [float(x) for x in sys.argv[2].split(",")])
