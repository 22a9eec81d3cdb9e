"""The fidelity panel of the DiT presets beside their references, on the stand-ins (tome_bench.dit_standin).

The panel (`python -m tome_bench dit-fidelity`): per family (Flux.1, Chroma, Flux.2, Qwen-Image, Z-Image, Lumina 2,
SD3.5, Wan, HunyuanVideo, LTX-Video, LTX-2; each fed as its diffusers pipeline feeds it) and variant (random, stand-in,
sharper, softer), how much each preset changes the output beside the references a DiT user can reproduce: the naive
port (keys/values subsampled 2x2 in every block) and a step saving users accept (the same generation with fewer steps,
as many fewer as save no more time than the preset: `ceil(steps / speed-up)`), one call and whole generations
(flow-matching Euler from white noise), side by side in one process.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tome_core
from tome_bench.dit_standin import FAMILIES, build, change, generate, one_call
from tome_bench.refit import VARIANTS
from tome_core import figures
from tome_core.dit import DitState
from tome_core.patch import STATE_ATTR, find_model


@dataclass(frozen=True)
class Variant:
    """One thing measured: a preset or a config (`fields`), or the unpatched model with fewer steps (`steps`)."""

    name: str
    fields: dict[str, Any] | None = None
    preset: str | None = None
    speedup: float | None = None  # the step-saving reference: the time the preset saves, as fewer steps
    published: bool = False  # as published: each query without its own key (`tome_core.dit.DitState.own_key`)

    def apply(self, model: nn.Module) -> None:
        if self.preset is not None:
            tome_core.apply_patch(model, preset=self.preset)
        elif self.fields is not None:
            tome_core.apply_patch(model, **self.fields)
        state = find_model(model).__dict__.get(STATE_ATTR)
        if self.published and isinstance(state, DitState):
            state.own_key = False


def variants(family: str, size: tuple[int, int, int], speeds: dict[str, float] | None = None) -> list[Variant]:
    """The presets, the naive port, and per preset its step-saving reference at the preset's own speed-up at the
    family's size users run (`speeds`, else `tome_core.figures`: estimated on the full-size architecture)."""
    out = [Variant(p.name, preset=p.name) for p in tome_core.presets()]
    out.append(Variant("naive port (kv 2x2, every block)", fields={"mode": "kv", "sx": 2, "sy": 2}, published=True))
    for preset in tome_core.presets():
        speed = (speeds or {}).get(preset.name)
        if speed is None:
            found = figures.speed(family, preset.name, *size)
            speed = None if found is None else found.speedup
        if speed is not None:
            out.append(Variant(f"fewer steps ({preset.name}'s {speed:.2f}x)", speedup=speed))
    return out


#: The size whose speed-up a preset's step-saving reference saves, per family: what users run (Qwen-Image's native
#: 1328 px square; HunyuanVideo's, LTX-Video's and LTX-2's: the sizes their presets were chosen at).
SIZES = {name: (1024, 1024, 1) for name in FAMILIES} | {
    "qwen": (1328, 1328, 1),
    "wan": (832, 480, 81),
    "hunyuanvideo": (1280, 720, 129),
    "ltx": (768, 512, 121),
    "ltx2": (1280, 720, 121),
}


def panel(
    names: Sequence[str],
    steps: int,
    seeds: int,
    out: Path | None,
    log: Callable[[str], None] = print,
    speeds: dict[str, dict[str, float]] | None = None,
    kinds: Sequence[str] = tuple(VARIANTS),
) -> dict:
    """Every variant of every family and stand-in variant (`kinds`), one call and whole generations; the rows as a
    dict. `speeds`: family -> preset -> speed-up for the step-saving references, instead of the speed table's."""
    rows: dict[str, Any] = {"steps": steps, "seeds": seeds, "rows": []}
    for name in names:
        family = FAMILIES[name]
        for variant in kinds:
            model = build(family, VARIANTS[variant])
            base_call = [one_call(model, family, s) for s in range(seeds)]
            base_gen = [generate(model, family, steps, s) for s in range(seeds)]
            for v in variants(name, SIZES[name], (speeds or {}).get(name)):
                start = time.time()
                if v.speedup is not None:
                    # As many fewer steps as save no more time than the preset: the reference users accept.
                    fewer = max(1, math.ceil(steps / v.speedup - 1e-9))
                    gen = [change(generate(model, family, fewer, s), b) for s, b in enumerate(base_gen)]
                    one = None
                else:
                    v.apply(model)
                    one = sum(change(one_call(model, family, s), b) for s, b in enumerate(base_call)) / seeds
                    gen = [change(generate(model, family, steps, s), b) for s, b in enumerate(base_gen)]
                    tome_core.remove_patch(model)
                row = {"family": name, "variant": variant, "name": v.name, "call": one, "generation": sum(gen) / seeds}
                rows["rows"].append(row)
                log(
                    f"{name:5} {variant:9} {v.name:40} call {one if one is None else round(one, 4)!s:8}"
                    f" generation {row['generation']:.4f}  [{time.time() - start:.0f} s]"
                )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "dit-fidelity.json").write_text(json.dumps(rows, indent=1))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tome_bench dit-fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--families", default="flux,wan", help=f"comma-separated, of {', '.join(FAMILIES)} (default flux,wan)"
    )
    parser.add_argument("--steps", type=int, default=12, help="steps of a whole generation (default 12)")
    parser.add_argument("--seeds", type=int, default=2, help="samples averaged per figure (default 2)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)} (default all)")
    parser.add_argument("--speeds", default=None, help="a JSON file: family -> preset -> speed-up (default: the table)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("bench-out/dit-fidelity"))
    a = parser.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    speeds = json.loads(Path(a.speeds).read_text()) if a.speeds else None
    panel(a.families.split(","), a.steps, a.seeds, a.out, speeds=speeds, kinds=a.variants.split(","))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
