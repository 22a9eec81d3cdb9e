"""Keys/values subsampled with each query's own key, the kept keys weighing as their cells (2026-11-29, CPU): every
family, cells of 2 to 8 from three starts, the H200 estimate on the full-size config and the stand-in's change of a
whole generation (12 flow-matching Euler steps, one sample) beside dropping 1-4 steps.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-proportional/sweep.py estimate flux,flux2
    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-proportional/sweep.py fidelity flux,flux2 [stand-in] [seeds]

STARTS=0.1,0.4 and CELLS=2,3 in the environment sweep those instead (the second round).
"""

from __future__ import annotations

import os
import sys

import torch

import tome_core
from tome_bench.dit_standin import FAMILIES, VARIANTS, build, change, generate


def settings(family: str) -> dict[str, dict[str, object]]:
    """name -> TomeConfig fields."""
    out: dict[str, dict[str, object]] = {}
    starts = [float(v) for v in os.environ.get("STARTS", "0.35,0.2,0.0").split(",")]
    for start in starts:
        for cells in [int(v) for v in os.environ.get("CELLS", "2,3,4,6,8").split(",")]:
            out[f"kv {cells}x{cells} from {start}"] = {"mode": "kv", "sx": cells, "sy": cells, "block_start": start}
            if family == "wan" and cells <= 4:
                fields = {"mode": "kv", "sx": cells, "sy": cells, "st": 2, "block_start": start}
                out[f"kv {cells}x{cells}x2 from {start}"] = fields
    if family == "flux" and "STARTS" not in os.environ:
        fields = {"mode": "merge", "ratio": 0.75, "sx": 2, "sy": 2, "block_start": 0.75, "pool_kv": True}
        out["merge 2x2 from 0.75, kv 2x2 before"] = fields
    return out


def estimates(families: list[str]) -> None:
    from tome_bench import dit_archs
    from tome_bench.gpu_estimate import GPUS, estimate

    print("| family | size | setting | less GPU time | launching ops added |\n|---|---|---|---:|---:|", flush=True)
    for family in families:
        arch = dit_archs.DIT_ARCHS[dit_archs.TABLE_ARCH[family]]
        model = arch.build()
        for size in arch.sizes:
            base = estimate(dit_archs.trace_call(arch, model, size), GPUS["h200"])
            text = "x".join(str(v) for v in size if v != 1) if size[2] == 1 else "x".join(map(str, size))
            for name, fields in settings(family).items():
                found = estimate(
                    dit_archs.trace_call(arch, model, size, lambda m, f=fields: tome_core.apply_patch(m, **f)),
                    GPUS["h200"],
                )
                added = found.launching / base.launching - 1
                print(f"| {family} | {text} | {name} | {base.gpu_ms / found.gpu_ms:.3f} | {added:+.1%} |", flush=True)


def fidelity(families: list[str], variant: str, seeds: int, steps: int = 12) -> None:
    for name in families:
        family = FAMILIES[name]
        model = build(family, VARIANTS[variant])
        base = [generate(model, family, steps, s) for s in range(seeds)]
        for fewer in (steps - 1, steps - 2, steps - 3, steps - 4):
            ref = sum(change(generate(model, family, fewer, s), b) for s, b in enumerate(base)) / seeds
            print(f"{name} {variant} {fewer} steps: {ref:.4f}", flush=True)
        for setting, fields in settings(name).items():
            tome_core.apply_patch(model, **fields)
            got = sum(change(generate(model, family, steps, s), b) for s, b in enumerate(base)) / seeds
            tome_core.remove_patch(model)
            print(f"{name} {variant} {setting}: {got:.4f}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    names = sys.argv[2].split(",")
    if sys.argv[1] == "estimate":
        estimates(names)
    else:
        fidelity(names, sys.argv[3] if sys.argv[3:] else "stand-in", int(sys.argv[4]) if sys.argv[4:] else 1)
