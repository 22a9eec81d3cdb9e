"""The attention profile of the video stand-ins (tome_bench.attention_profile's figures and tables), each laid out
by its family's `dit_standin.Family.joint_layout` (attention_profile.standin lays a stand-in out by its name: text
first but for SD3.5 and Z-Image, none in Wan's, a 2x2 patch; HunyuanVideo puts its text last, LTX-Video's patch is
one latent cell and its text is cross-attended).

    PYTHONPATH=. python docs/runs/2026-12-06-refit-video/video_profile.py --models trained,hunyuanvideo,ltx \
        --variants stand-in,refit,calibrated --out docs/runs/2026-12-06-refit-video/profile.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from tome_bench import attention_profile as ap


@torch.no_grad()
def standin(name: str, sigmas: list[float], seed: int = 0, variant: str = "stand-in") -> dict[str, Any]:
    from tome_bench.dit_standin import FAMILIES, build, call, sample_inputs
    from tome_bench.refit import VARIANTS

    family = FAMILIES[name]
    model = build(family, VARIANTS[variant], seed)
    before, grid, text = family.joint_layout()
    layout = ap.Layout(before, grid, text)
    noise, natural, states = sample_inputs(family, seed)
    out: dict[str, Any] = {"grid": grid[1] if grid[0] == 1 else list(grid)}
    for sigma in sigmas:
        with ap.Profile(layout) as profile:
            call(model, family, (1 - sigma) * natural + sigma * noise, sigma, states)
        out[str(sigma)] = {"mean": ap.summary(profile.rows), "blocks": profile.rows}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="trained,hunyuanvideo,ltx")
    parser.add_argument("--variants", default="stand-in,refit,calibrated")
    parser.add_argument("--sigmas", default="0.9,0.5,0.1")
    parser.add_argument("--out", type=Path, default=None)
    a = parser.parse_args()
    torch.set_num_threads(1)
    sigmas = [float(s) for s in a.sigmas.split(",")]
    results = {}
    for name in a.models.split(","):
        for variant in ["trained"] if name == "trained" else a.variants.split(","):
            start = time.time()
            key = name if variant in ("trained", "stand-in") else f"{name} {variant}"
            results[key] = ap.trained(sigmas) if name == "trained" else standin(name, sigmas, variant=variant)
            print(f"{key}: done [{time.time() - start:.0f} s]", flush=True)
    print(ap.table(results))
    if "trained" in results:
        print()
        print(ap.factors(results))
    print(ap.blocks_log(results))
    if a.out is not None:
        a.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
