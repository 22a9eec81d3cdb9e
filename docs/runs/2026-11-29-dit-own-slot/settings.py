"""Per-slot keys/values at settings other than the presets', on Z-Image: the H200 estimate at 1024² (full-size
config, meta trace) and the stand-in's change of a whole generation beside dropping steps for the same time.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-own-slot/settings.py estimate
    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-own-slot/settings.py fidelity
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import slot  # this folder's prototype: it replaces the core's interception on import

import tome_core
from tome_bench.dit_standin import FAMILIES, VARIANTS, build, change, generate

#: name -> TomeConfig fields
SETTINGS = {
    "kv 2x2 every block": {"mode": "kv", "sx": 2, "sy": 2},
    "kv 2x2 from 0.2 (Balanced)": {"mode": "kv", "sx": 2, "sy": 2, "block_start": 0.2},
    "kv 3x3 every block": {"mode": "kv", "sx": 3, "sy": 3},
    "kv 3x3 from 0.2": {"mode": "kv", "sx": 3, "sy": 3, "block_start": 0.2},
}
MODES = ("plain", "slot", "joint")


def estimates() -> None:
    from tome_bench import dit_archs
    from tome_bench.gpu_estimate import GPUS, estimate

    arch = dit_archs.DIT_ARCHS[dit_archs.TABLE_ARCH["zimage"]]
    model, size = arch.build(), (1024, 1024, 1)
    base = estimate(dit_archs.trace_call(arch, model, size), GPUS["h200"])
    for name, fields in SETTINGS.items():
        for mode in MODES:
            slot.MODE["attention"] = mode
            found = estimate(
                dit_archs.trace_call(arch, model, size, lambda m, f=fields: tome_core.apply_patch(m, **f)), GPUS["h200"]
            )
            added = found.launching / base.launching - 1
            print(
                f"zimage 1024 {name} {mode}: {base.gpu_ms / found.gpu_ms:.3f}x, launching ops {added:+.1%}", flush=True
            )


def fidelity(steps: int = 12, seeds: int = 2) -> None:
    family = FAMILIES["zimage"]
    model = build(family, VARIANTS["stand-in"])
    base = [generate(model, family, steps, s) for s in range(seeds)]
    for fewer in (steps - 1, steps - 2):
        ref = sum(change(generate(model, family, fewer, s), b) for s, b in enumerate(base)) / seeds
        print(f"zimage stand-in {fewer} steps: {ref:.4f}", flush=True)
    for name, fields in SETTINGS.items():
        for mode in ("plain", "slot"):
            slot.MODE["attention"] = mode
            tome_core.apply_patch(model, **fields)
            got = sum(change(generate(model, family, steps, s), b) for s, b in enumerate(base)) / seeds
            tome_core.remove_patch(model)
            print(f"zimage stand-in {name} {mode}: {got:.4f}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "estimate":
        estimates()
    else:
        fidelity()
