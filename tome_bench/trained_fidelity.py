"""The DiT presets on the trained DiT (tome_bench.trained_dit): how much each changes a whole generation, beside the
references, at the step counts people run (4 and 8: the distilled models; 12: the stand-in panel's).

    python -m tome_bench trained-fidelity [--steps 4,8,12] [--samples 4] [--out DIR]

Per step count, from the same noise and label: the unpatched generation; each preset (the Flux.1 family's, on its
2 double + 4 single blocks and 32x32 grid), and each preset without each query's own key (the kept keys alone, as
the own key's cost-benefit question asks); the naive port (keys/values 2x2 in every block, no own key); and the step
saving users accept: as many fewer steps as save no more time than the preset at Flux.1-dev 1024² (the speed
table). Where a step count leaves no step to drop for the time saved (4 steps at a 1.14x speed-up: ceil(4 / 1.14) =
4), the step reference is the unchanged generation and the figure stands against the naive port alone. The change is
the relative L2 distance of the final latents (`tome_bench.dit_standin.change`), averaged over the samples.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import tome_core
from tome_bench.dit_standin import change
from tome_bench.trained_dit import TrainedDiT, load
from tome_core import figures
from tome_core.dit import DitState
from tome_core.patch import STATE_ATTR

#: The size whose estimated speed-up the step references save: Flux.1-dev at 1024².
SIZE = (1024, 1024, 1)
SIDE = 64  # latent pixels a side: 32x32 tokens, the trained model's profile grid


@torch.no_grad()
def generate(model: TrainedDiT, noise: torch.Tensor, labels: torch.Tensor, steps: int) -> torch.Tensor:
    """The final latent [N, 3, H, W] of a flow-matching Euler sampling of `steps` steps (sigma 1 -> 0) from `noise`,
    conditioned on `labels` [N] (no guidance: the distilled models' way)."""
    x = noise
    sigmas = torch.linspace(1.0, 0.0, steps + 1).tolist()
    for step in range(steps):
        tome_core.set_step(model.transformer, step, steps)
        sigma = torch.full((len(x),), sigmas[step])
        x = x + (sigmas[step + 1] - sigmas[step]) * model(x, sigma, labels)
    return x


def _patched(model: TrainedDiT, own_key: bool, **settings: Any) -> Callable[[], None]:
    """Patch the model's transformer (`settings`: a preset or fields); the own key off where asked. Returns the
    removal."""
    tome_core.apply_patch(model.transformer, **settings)
    state = model.transformer.__dict__.get(STATE_ATTR)
    if not own_key and isinstance(state, DitState):
        state.own_key = False
    return lambda: tome_core.remove_patch(model.transformer)


def panel(steps: Sequence[int], samples: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every preset (with and without the own key), the naive port and the step references at each step count."""
    model = load()
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(samples, 3, SIDE, SIDE, generator=g)
    labels = torch.arange(samples) % model.null  # one photograph each
    rows: list[dict[str, Any]] = []
    for n in steps:
        base = generate(model, noise, labels, n)
        port = _measure(model, noise, labels, n, base, {"mode": "kv", "sx": 2, "sy": 2}, own_key=False)
        rows.append({"steps": n, "name": "naive port (kv 2x2, every block)", "change": port})
        log(f"{n:2} steps  naive port                        {port:.4f}")
        for preset in tome_core.presets():
            found = figures.speed("flux", preset.name, *SIZE)
            speed = found.speedup if found is not None else 1.0
            fewer = max(1, math.ceil(n / speed - 1e-9))
            step_ref = change(generate(model, noise, labels, fewer), base) if fewer < n else None
            own = _measure(model, noise, labels, n, base, {"preset": preset.name}, own_key=True)
            alone = _measure(model, noise, labels, n, base, {"preset": preset.name}, own_key=False)
            rows.append(
                {
                    "steps": n,
                    "name": preset.name,
                    "change": own,
                    "without own key": alone,
                    "speedup": speed,
                    "fewer steps": fewer,
                    "step change": step_ref,
                }
            )
            ref = "no step to drop" if step_ref is None else f"{fewer} steps {step_ref:.4f}"
            log(f"{n:2} steps  {preset.name:9} own key {own:.4f}  kept keys alone {alone:.4f}  ({speed:.2f}x: {ref})")
    return {"steps": list(steps), "samples": samples, "size": list(SIZE), "rows": rows}


def _measure(
    model: TrainedDiT,
    noise: torch.Tensor,
    labels: torch.Tensor,
    steps: int,
    base: torch.Tensor,
    settings: dict,
    own_key: bool,
) -> float:
    remove = _patched(model, own_key, **settings)
    try:
        out = generate(model, noise, labels, steps)
    finally:
        remove()
    return change(out, base)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tome_bench trained-fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="4,8,12", help="step counts, comma-separated (default 4,8,12)")
    parser.add_argument("--samples", type=int, default=4, help="generations averaged per figure (default 4)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("bench-out/trained-fidelity"))
    a = parser.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = panel([int(s) for s in a.steps.split(",")], a.samples)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "trained-fidelity.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
