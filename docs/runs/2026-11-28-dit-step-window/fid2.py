"""Round 2: as fid.py with windows that end before the last steps; the settings to run are c2-<family>.json
([block_start, sx, step_start, step_end] each).

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-28-dit-step-window/fid2.py zimage stand-in
"""

import json
import sys
import time
from pathlib import Path

import torch

import tome_core
from tome_bench.dit_standin import FAMILIES, VARIANTS, build, change, generate

HERE = Path(__file__).resolve().parent
STEPS, SEEDS = 12, 2
fam, variant = sys.argv[1], sys.argv[2]
cands = json.loads((HERE / f"c2-{fam}.json").read_text())
torch.set_num_threads(1)
speeds = json.loads((HERE / "speeds.json").read_text())
family = FAMILIES[fam]
model = build(family, VARIANTS[variant])
base = [generate(model, family, STEPS, s) for s in range(SEEDS)]
c = sum(change(generate(model, family, STEPS - 1, s), b) for s, b in enumerate(base)) / SEEDS
print(f"{fam} {variant} drop 1 step(s): {c:.4f}", flush=True)
t0 = time.time()
for bs, s, start, end in cands:
    sp = speeds[f"{fam}|{bs}|{s}"]
    n_in = sum(1 for i in range(STEPS) if start - 1e-9 <= i / STEPS < end - 1e-9)
    gsp = STEPS / ((STEPS - n_in) + n_in / sp)
    fields = {"mode": "kv", "sx": s, "sy": s, "block_start": bs, "step_start": start, "step_end": end}
    tome_core.apply_patch(model, **fields)
    c = sum(change(generate(model, family, STEPS, i), b) for i, b in enumerate(base)) / SEEDS
    tome_core.remove_patch(model)
    print(
        f"{fam} {variant} bs {bs} {s}x{s} steps [{start},{end}) n_in {n_in}: gen {gsp:.3f}"
        f" (saves {STEPS - STEPS / gsp:.2f}) change {c:.4f} [{time.time() - t0:.0f}s]",
        flush=True,
    )
