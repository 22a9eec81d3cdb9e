"""Round 1: a whole generation's change (12 flow-matching Euler steps, 2 seeds) of keys/values subsampled from
block_start on and from step_start on, on a DiT stand-in, beside dropping one and two steps; only the settings that
save at least one step's worth of GPU work (speeds.json, per step, times the share of steps in the window).

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-28-dit-step-window/fid.py zimage stand-in
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
torch.set_num_threads(1)
speeds = json.loads((HERE / "speeds.json").read_text())
family = FAMILIES[fam]
model = build(family, VARIANTS[variant])
base = [generate(model, family, STEPS, s) for s in range(SEEDS)]
rows = []
for k in (1, 2):
    c = sum(change(generate(model, family, STEPS - k, s), b) for s, b in enumerate(base)) / SEEDS
    print(f"{fam} {variant} drop {k} step(s): {c:.4f}", flush=True)
    rows.append({"drop": k, "change": c})
t0 = time.time()
for key, sp in sorted(speeds.items()):
    f, bs, s = key.split("|")
    if f != fam:
        continue
    for start in (0.0, 0.25, 0.34, 0.5):
        n_in = sum(1 for i in range(STEPS) if i / STEPS >= start - 1e-9)
        gsp = STEPS / ((STEPS - n_in) + n_in / sp)
        if gsp < STEPS / (STEPS - 1) - 1e-9:
            continue
        fields = {"mode": "kv", "sx": int(s), "sy": int(s), "block_start": float(bs), "step_start": start}
        tome_core.apply_patch(model, **fields)
        c = sum(change(generate(model, family, STEPS, i), b) for i, b in enumerate(base)) / SEEDS
        tome_core.remove_patch(model)
        print(
            f"{fam} {variant} bs {bs} {s}x{s} from step {start}: per-step {sp:.3f} gen {gsp:.3f}"
            f" (saves {STEPS - STEPS / gsp:.2f} steps) change {c:.4f} [{time.time() - t0:.0f}s]",
            flush=True,
        )
        rows.append({"fields": fields, "step_speed": sp, "gen_speed": gsp, "change": c})
(HERE / f"fid-{fam}-{variant}.json").write_text(json.dumps(rows, indent=1))
