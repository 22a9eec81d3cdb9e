"""The DiT presets on the trained DiT (tome_bench.trained_dit): how much each changes a whole generation, beside the
references, at the step counts people run (4 and 8: the distilled models; 12: the stand-in panel's).

    python -m tome_bench trained-fidelity [--steps 4,8,12] [--samples 4] [--out DIR]
    python -m tome_bench trained-fidelity --model wan [--sweep]

Per step count, from the same noise and label: the unpatched generation; each preset (the Flux.1 family's, on its
2 double + 4 single blocks and 32x32 grid), and each preset without each query's own key (the kept keys alone, as
the own key's cost-benefit question asks); the naive port (keys/values 2x2 in every block, no own key); and the step
saving users accept: as many fewer steps as save no more time than the preset at Flux.1-dev 1024² (the speed
table). Where a step count leaves no step to drop for the time saved (4 steps at a 1.14x speed-up: ceil(4 / 1.14) =
4), the step reference is the unchanged generation and the figure stands against the naive port alone. The change is
the relative L2 distance of the final latents (`tome_bench.dit_standin.change`), averaged over the samples.

`--model wan`: the same on the trained Wan-class video model (tome_bench.trained_video: 5 latent frames of 16x16
tokens), the presets resolved for Wan's family (the model's class picks it), the step references at Wan 2.1 14B
832x480x81. `--sweep`: instead, SWEEP's settings (other rungs a Wan ladder could take) at the same step counts, each
with its estimated speed-up there (the GPU estimate's trace of the full-size model, a step window's share of the steps
at that speed-up, as the speed table prices the presets) and the change of dropping steps for the same time,
interpolated between whole steps dropped.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tome_core
from tome_bench.dit_standin import change
from tome_bench.trained_dit import load
from tome_core import figures
from tome_core.dit import DitState
from tome_core.patch import STATE_ATTR

#: The size whose estimated speed-up the step references save: Flux.1-dev at 1024².
SIZE = (1024, 1024, 1)
SIDE = 64  # latent pixels a side: 32x32 tokens, the trained model's profile grid


@dataclass(frozen=True)
class Trained:
    """A trained model the panel runs: its module (`load`), the family whose speed table prices the step references,
    at `size`, and one sample's latent shape."""

    module: str
    family: str
    size: tuple[int, int, int]
    latent: tuple[int, ...]
    arch: str  # tome_bench.dit_archs' full-size model (the sweep's estimate)


MODELS: Mapping[str, Trained] = {
    "flux": Trained("trained_dit", "flux", SIZE, (3, SIDE, SIDE), "flux-dev"),
    # Wan 2.1 14B at 480p, 81 frames; the trained model's 5 latent frames of 16x16 tokens (its evaluation grid).
    "wan": Trained("trained_video", "wan", (832, 480, 81), (3, 5, 32, 32), "wan-14b"),
}
#: The sweep's settings on the video model: Wan's rungs (kv 2x2 and 3x3 in every block) at other step windows, other
#: cells, a frame stride (st 2), later blocks only. Merging ("merge" mode) does not run on diffusers' Wan.
SWEEP: tuple[Mapping[str, Any], ...] = (
    *({"mode": "kv", "sx": c, "sy": c, "step_start": w} for c in (2, 3) for w in (0.75, 0.5, 0.25)),
    {"mode": "kv", "sx": 4, "sy": 4, "step_start": 0.5},
    {"mode": "kv", "sx": 2, "sy": 1, "step_start": 0.5},
    *({"mode": "kv", "sx": 2, "sy": 2, "st": 2, "step_start": w} for w in (0.75, 0.5, 0.25)),
    {"mode": "kv", "sx": 3, "sy": 3, "st": 2, "step_start": 0.75},
    {"mode": "kv", "sx": 2, "sy": 2, "block_start": 0.5, "step_start": 0.25},
    {"mode": "kv", "sx": 2, "sy": 2, "step_start": 0.0},
)


def _load(which: str) -> nn.Module:
    import importlib

    return importlib.import_module(f"tome_bench.{MODELS[which].module}").load()


@torch.no_grad()
def generate(model: nn.Module, noise: torch.Tensor, labels: torch.Tensor, steps: int) -> torch.Tensor:
    """The final latent [N, 3, (F,) H, W] of a flow-matching Euler sampling of `steps` steps (sigma 1 -> 0) from
    `noise`, conditioned on `labels` [N] (no guidance: the distilled models' way)."""
    x = noise
    sigmas = torch.linspace(1.0, 0.0, steps + 1).tolist()
    for step in range(steps):
        tome_core.set_step(model.transformer, step, steps)
        sigma = torch.full((len(x),), sigmas[step])
        x = x + (sigmas[step + 1] - sigmas[step]) * model(x, sigma, labels)
    return x


def _patched(model: nn.Module, own_key: bool, **settings: Any) -> Callable[[], None]:
    """Patch the model's transformer (`settings`: a preset or fields); the own key off where asked. Returns the
    removal."""
    tome_core.apply_patch(model.transformer, **settings)
    state = model.transformer.__dict__.get(STATE_ATTR)
    if not own_key and isinstance(state, DitState):
        state.own_key = False
    return lambda: tome_core.remove_patch(model.transformer)


def panel(
    steps: Sequence[int], samples: int, log: Callable[[str], None] = print, which: str = "flux"
) -> dict[str, Any]:
    """Every preset (with and without the own key), the naive port and the step references at each step count, on
    the trained model `which` (MODELS)."""
    spec = MODELS[which]
    model = load() if which == "flux" else _load(which)
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(samples, *spec.latent, generator=g)
    labels = torch.arange(samples) % model.null  # one photograph each
    rows: list[dict[str, Any]] = []
    for n in steps:
        base = generate(model, noise, labels, n)
        port = _measure(model, noise, labels, n, base, {"mode": "kv", "sx": 2, "sy": 2}, own_key=False)
        rows.append({"steps": n, "name": "naive port (kv 2x2, every block)", "change": port})
        log(f"{n:2} steps  naive port                        {port:.4f}")
        for preset in tome_core.presets():
            found = figures.speed(spec.family, preset.name, *spec.size)
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
    out = {"steps": list(steps), "samples": samples, "size": list(spec.size), "rows": rows}
    return out if which == "flux" else {"model": which, **out}


def speedup(which: str, settings: Mapping[str, Any], gpu: str = "h200") -> float:
    """The estimated speed-up of `settings` on MODELS[which]'s full-size model at its size: the reduced call's
    (tome_bench.dit_archs.trace_call, priced on `gpu`) over the step window's share of the steps."""
    from tome_bench import dit_archs
    from tome_bench.gpu_estimate import GPUS, estimate

    spec = MODELS[which]
    arch = dit_archs.DIT_ARCHS[spec.arch]
    cache = _ARCHS.setdefault(spec.arch, {})
    if "model" not in cache:
        cache["model"] = arch.build()
        cache["base"] = estimate(dit_archs.trace_call(arch, cache["model"], spec.size), GPUS[gpu]).gpu_ms
    fields = {k: v for k, v in settings.items() if k not in ("step_start", "step_end")}
    found = estimate(
        dit_archs.trace_call(arch, cache["model"], spec.size, lambda m: tome_core.apply_patch(m, **fields)), GPUS[gpu]
    )
    share = settings.get("step_end", 1.0) - settings.get("step_start", 0.0)  # the steps the reduction runs in
    return 1.0 / (share * found.gpu_ms / cache["base"] + (1 - share))


_ARCHS: dict[str, dict[str, Any]] = {}


def sweep(
    steps: Sequence[int],
    samples: int,
    settings: Sequence[Mapping[str, Any]] = SWEEP,
    log: Callable[[str], None] = print,
    which: str = "wan",
) -> dict[str, Any]:
    """Each of `settings` (own key kept) at each step count beside dropping steps for the same time (interpolated
    between whole steps dropped: the change of n - n / speed-up steps' worth of time) and the naive port; the
    presets' own speed-ups recomputed the same way, beside the speed table's, as a check of the pricing."""
    spec = MODELS[which]
    model = _load(which)
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(samples, *spec.latent, generator=g)
    labels = torch.arange(samples) % model.null
    checks = {}
    for preset in tome_core.presets():
        fields = dict(preset.families[spec.family])
        table = figures.speed(spec.family, preset.name, *spec.size)
        found = checks[preset.name] = {"estimate": speedup(which, fields), "table": table.speedup if table else None}
        log(f"{preset.name:9} estimate {found['estimate']:.3f}x  speed table {found['table']}")
    bases = {n: generate(model, noise, labels, n) for n in steps}
    drops = {n: {k: change(generate(model, noise, labels, k), bases[n]) for k in range(1, n)} | {n: 0.0} for n in steps}
    port = {
        n: _measure(model, noise, labels, n, bases[n], {"mode": "kv", "sx": 2, "sy": 2}, own_key=False) for n in steps
    }
    for n in steps:
        log(
            f"{n:2} steps: naive port {port[n]:.4f}; dropped to k steps "
            + " ".join(f"{k}:{v:.4f}" for k, v in sorted(drops[n].items()))
        )
    rows = []
    for fields in settings:
        speed = speedup(which, fields)
        row: dict[str, Any] = {"settings": dict(fields), "speedup": speed}
        for n in steps:
            saved = n - n / speed  # steps' worth of time saved
            k = math.floor(saved)
            lo, hi = drops[n][n - k], drops[n].get(n - k - 1, drops[n][max(1, n - k - 1)])
            ref = lo + (saved - k) * (hi - lo)
            found = _measure(model, noise, labels, n, bases[n], dict(fields), own_key=True)
            row[str(n)] = {"change": found, "step change": ref, "over steps": found / ref if ref > 0 else None}
            row[str(n)]["over port"] = found / port[n]
        rows.append(row)
        log(
            f"{_name(fields):44} {speed:.3f}x  "
            + "  ".join(f"{n}: {row[str(n)]['change']:.4f} (steps {row[str(n)]['step change']:.4f})" for n in steps)
        )
    return {
        "model": which,
        "steps": list(steps),
        "samples": samples,
        "size": list(spec.size),
        "presets": checks,
        "naive port": {str(n): port[n] for n in steps},
        "dropped steps": {str(n): {str(k): v for k, v in drops[n].items()} for n in steps},
        "rows": rows,
    }


def _name(fields: Mapping[str, Any]) -> str:
    """A setting as the sweep's log names it: "kv 2x2 st2 steps 0.5-" ..."""
    words = [f"{fields['mode']} {fields['sx']}x{fields['sy']}"]
    if fields.get("st", 1) > 1:
        words.append(f"st{fields['st']}")
    if "block_start" in fields:
        words.append(f"blocks {fields['block_start']}-")
    words.append(f"steps {fields.get('step_start', 0.0)}-")
    return " ".join(words)


def _measure(
    model: nn.Module,
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
    parser.add_argument("--model", choices=tuple(MODELS), default="flux", help="the trained model (default flux)")
    parser.add_argument("--sweep", action="store_true", help="SWEEP's settings instead of the presets (sweep.json)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("bench-out/trained-fidelity"))
    a = parser.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    steps = [int(s) for s in a.steps.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    if a.sweep:
        found = sweep(steps, a.samples, which=a.model)
        (a.out / "sweep.json").write_text(json.dumps(found, indent=1))
        return 0
    rows = panel(steps, a.samples, which=a.model)
    (a.out / "trained-fidelity.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
