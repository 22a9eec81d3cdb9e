"""The own key added at settings other than the presets', on Z-Image and Lumina 2: the H200 estimate (full-size
config, meta trace) at 1024² and 1536², and the stand-in's change of a whole generation beside dropping steps.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-own-key/settings.py estimate zimage,lumina2
    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-own-key/settings.py fidelity zimage,lumina2 [stand-in]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import own  # this folder's prototype: it replaces the core's interception on import

import tome_core
from tome_bench.dit_standin import FAMILIES, VARIANTS, build, change, generate

#: name -> TomeConfig fields
SETTINGS = {
    "kv 2x2 from 0.35": {"mode": "kv", "sx": 2, "sy": 2, "block_start": 0.35},
    "kv 2x2 from 0.2": {"mode": "kv", "sx": 2, "sy": 2, "block_start": 0.2},
    "kv 2x2 every block": {"mode": "kv", "sx": 2, "sy": 2},
    "kv 3x3 every block": {"mode": "kv", "sx": 3, "sy": 3},
    "kv 4x4 every block": {"mode": "kv", "sx": 4, "sy": 4},
    "kv 6x6 every block": {"mode": "kv", "sx": 6, "sy": 6},
    "kv 8x8 every block": {"mode": "kv", "sx": 8, "sy": 8},
}


def estimates(families: list[str]) -> None:
    from tome_bench import dit_archs
    from tome_bench.gpu_estimate import GPUS, estimate

    for family in families:
        arch = dit_archs.DIT_ARCHS[dit_archs.TABLE_ARCH[family]]
        model = arch.build()
        for size in ((1024, 1024, 1), (1536, 1536, 1)):
            base = estimate(dit_archs.trace_call(arch, model, size), GPUS["h200"])
            for name, fields in SETTINGS.items():
                for mode in ("plain", "own"):
                    own.MODE["attention"] = mode
                    found = estimate(
                        dit_archs.trace_call(arch, model, size, lambda m, f=fields: tome_core.apply_patch(m, **f)),
                        GPUS["h200"],
                    )
                    added = found.launching / base.launching - 1
                    print(
                        f"{family} {size[0]} {name} {mode}: {base.gpu_ms / found.gpu_ms:.3f}x, launching ops {added:+.1%}",
                        flush=True,
                    )


def fidelity(families: list[str], variant: str, steps: int = 12, seeds: int = 2) -> None:
    for name in families:
        family = FAMILIES[name]
        model = build(family, VARIANTS[variant])
        base = [generate(model, family, steps, s) for s in range(seeds)]
        for fewer in (steps - 1, steps - 2, steps - 3, steps - 4):
            ref = sum(change(generate(model, family, fewer, s), b) for s, b in enumerate(base)) / seeds
            print(f"{name} {variant} {fewer} steps: {ref:.4f}", flush=True)
        for setting, fields in SETTINGS.items():
            own.MODE["attention"] = "own"
            tome_core.apply_patch(model, **fields)
            got = sum(change(generate(model, family, steps, s), b) for s, b in enumerate(base)) / seeds
            tome_core.remove_patch(model)
            print(f"{name} {variant} {setting} own: {got:.4f}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    names = sys.argv[2].split(",")
    if sys.argv[1] == "estimate":
        estimates(names)
    else:
        fidelity(names, sys.argv[3] if sys.argv[3:] else "stand-in")
