"""Stand-ins for trained diffusion transformers, and the fidelity panel of the DiT presets beside their references.

A random-weight DiT attends almost uniformly: every query averages all tokens, and subsampling keys/values (which
keeps their spread) looks free there. Trained DiTs attend locally and by content: a query picks out tokens like
itself, nearby ones most (the rotary embedding's phase falls off with distance). The stand-in gets that by weight
surgery on the real architecture (diffusers' class, fewer blocks and channels so that it runs on a CPU): in every
attention the key projection is the query projection (per stream: image and text), and the per-head RMS norms that
follow both are set so that a logit is `LOGIT_SCALE * sharpness` times the cosine similarity of two tokens'
projected features, the scale the UNet stand-ins are fitted at (tome_bench.standin). Nothing here is fitted to a
trained DiT (none can be downloaded here): docs/fidelity.md says what is unknown.

The panel (`python -m tome_bench dit-fidelity`): per family (Flux.1, Wan) and variant (random, stand-in, sharper,
softer), how much each preset changes the output beside the references a DiT user can reproduce: the naive port
(keys/values subsampled 2x2 in every block) and a step saving users accept (the same generation with fewer steps,
as many fewer as save no more time than the preset: `ceil(steps / speed-up)`), one call and whole generations
(flow-matching Euler from white noise), side by side in one process.
"""

from __future__ import annotations

import argparse
import itertools
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
from tome_bench.archs import natural_latent
from tome_core import figures

#: Logit per unit of cosine similarity at sharpness 1 (the UNet stand-ins' scale, tome_bench.standin).
LOGIT_SCALE = 8.0
#: The panel's variants: uniform attention (random weights as initialised), the stand-in, sharper and softer.
VARIANTS: dict[str, float | None] = {"random": None, "stand-in": 0.85, "sharper": 1.0, "softer": 0.7}


@dataclass(frozen=True)
class Family:
    """A reduced DiT of one family: its diffusers class and config, the latent it runs on, its timestep scale."""

    name: str
    cls: str
    config: dict[str, Any]
    latent: tuple[int, ...]  # (C, H, W) or (C, F, H, W) of the latent, before packing
    text: int  # text tokens
    timestep_scale: float  # what the model gets for sigma 1 (Flux: 1; Wan: 1000)
    pack: bool  # Flux: 2x2 patches packed into tokens by the caller


FAMILIES: dict[str, Family] = {
    "flux": Family(
        "flux",
        "FluxTransformer2DModel",
        {
            "patch_size": 1,
            "in_channels": 64,
            "num_layers": 4,
            "num_single_layers": 8,
            "attention_head_dim": 128,
            "num_attention_heads": 3,
            "joint_attention_dim": 128,
            "pooled_projection_dim": 64,
            "axes_dims_rope": (16, 56, 56),
        },
        (16, 48, 48),  # 384 px: a 24 x 24 grid of tokens
        32,
        1.0,
        True,
    ),
    "wan": Family(
        "wan",
        "WanTransformer3DModel",
        {
            "patch_size": (1, 2, 2),
            "num_attention_heads": 3,
            "attention_head_dim": 128,
            "in_channels": 16,
            "out_channels": 16,
            "text_dim": 128,
            "freq_dim": 256,
            "ffn_dim": 1024,
            "num_layers": 8,
            "cross_attn_norm": True,
            "qk_norm": "rms_norm_across_heads",
            "rope_max_seq_len": 1024,
        },
        (16, 5, 24, 40),  # 17 frames at 320 x 192 px: 5 x 12 x 20 tokens
        32,
        1000.0,
        False,
    ),
}


@torch.no_grad()
def build(family: Family, sharpness: float | None, seed: int = 0) -> nn.Module:
    """The reduced DiT with random weights; with `sharpness`, the stand-in (tied query/key projections per stream,
    their RMS norms scaled so that a logit is LOGIT_SCALE * sharpness times a cosine similarity)."""
    import diffusers

    torch.manual_seed(seed)
    model = getattr(diffusers, family.cls)(**family.config).eval().requires_grad_(False)
    if sharpness is None:
        return model
    gain = math.sqrt(LOGIT_SCALE * sharpness / math.sqrt(family.config["attention_head_dim"]))
    for module in model.modules():
        for q, k, nq, nk in (
            ("to_q", "to_k", "norm_q", "norm_k"),
            ("add_q_proj", "add_k_proj", "norm_added_q", "norm_added_k"),
        ):
            wq, wk = getattr(module, q, None), getattr(module, k, None)
            if not isinstance(wq, nn.Linear) or not isinstance(wk, nn.Linear) or wq.weight.shape != wk.weight.shape:
                continue
            wk.weight.copy_(wq.weight)
            if wq.bias is not None and wk.bias is not None:
                wk.bias.copy_(wq.bias)
            for name in (nq, nk):
                norm = getattr(module, name, None)
                if getattr(norm, "weight", None) is not None:
                    norm.weight.fill_(gain)
    return model


def _pack(latent: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H/2 * W/2, 4C]: Flux's 2x2 patches as tokens."""
    b, c, h, w = latent.shape
    return latent.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)


def _unpack(tokens: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    b, c, h, w = shape
    return tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(shape)


def call(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """The model's velocity for `latent` at noise level `sigma`, as its diffusers pipeline calls it."""
    batch = latent.shape[0]
    timestep = torch.full((batch,), sigma * family.timestep_scale)
    if not family.pack:
        return model(hidden_states=latent, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
    h, w = latent.shape[-2] // 2, latent.shape[-1] // 2
    ids = torch.zeros(h * w, 3)
    ids[:, 1] = torch.arange(h).repeat_interleave(w)
    ids[:, 2] = torch.arange(w).repeat(h)
    out = model(
        hidden_states=_pack(latent),
        encoder_hidden_states=text,
        pooled_projections=torch.zeros(batch, family.config["pooled_projection_dim"]),
        timestep=timestep,
        img_ids=ids,
        txt_ids=torch.zeros(text.shape[1], 3),
        return_dict=False,
    )[0]
    return _unpack(out, tuple(latent.shape))


def _inputs(family: Family, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(white noise, a natural-spectrum latent, text states) of one sample."""
    g = torch.Generator().manual_seed(seed)
    shape = (1, *family.latent)
    noise = torch.randn(shape, generator=g)
    flat = (1, family.latent[0] * (family.latent[1] if len(family.latent) == 4 else 1), *family.latent[-2:])
    natural = natural_latent(flat, g).view(shape)
    width = family.config.get("joint_attention_dim", family.config.get("text_dim"))
    return noise, natural, torch.randn(1, family.text, width, generator=g)


@torch.no_grad()
def generate(model: nn.Module, family: Family, steps: int, seed: int) -> torch.Tensor:
    """The final latent of a flow-matching Euler sampling of `steps` steps from white noise (sigma 1 -> 0)."""
    noise, _, text = _inputs(family, seed)
    x = noise
    sigmas = torch.linspace(1.0, 0.0, steps + 1).tolist()
    for step, (sigma, following) in enumerate(itertools.pairwise(sigmas)):
        tome_core.set_step(model, step, steps)
        x = x + (following - sigma) * call(model, family, x, sigma, text)
    return x


@torch.no_grad()
def one_call(model: nn.Module, family: Family, seed: int) -> torch.Tensor:
    """One call at sigma 0.5 from a natural-spectrum latent half noised (the measure of the UNet panels)."""
    noise, natural, text = _inputs(family, seed)
    return call(model, family, 0.5 * noise + 0.5 * natural, 0.5, text)


def change(out: torch.Tensor, base: torch.Tensor) -> float:
    return float((out - base).norm() / base.norm())


@dataclass(frozen=True)
class Variant:
    """One thing measured: a preset or a config (`fields`), or the unpatched model with fewer steps (`steps`)."""

    name: str
    fields: dict[str, Any] | None = None
    preset: str | None = None
    speedup: float | None = None  # the step-saving reference: the time the preset saves, as fewer steps

    def apply(self, model: nn.Module) -> None:
        if self.preset is not None:
            tome_core.apply_patch(model, preset=self.preset)
        elif self.fields is not None:
            tome_core.apply_patch(model, **self.fields)


def variants(family: str, size: tuple[int, int, int], speeds: dict[str, float] | None = None) -> list[Variant]:
    """The presets, the naive port, and per preset its step-saving reference at the preset's own speed-up at the
    family's size users run (`speeds`, else `tome_core.figures`: estimated on the full-size architecture)."""
    out = [Variant(p.name, preset=p.name) for p in tome_core.presets()]
    out.append(Variant("naive port (kv 2x2, every block)", fields={"mode": "kv", "sx": 2, "sy": 2}))
    for preset in tome_core.presets():
        speed = (speeds or {}).get(preset.name)
        if speed is None:
            found = figures.speed(family, preset.name, *size)
            speed = None if found is None else found.speedup
        if speed is not None:
            out.append(Variant(f"fewer steps ({preset.name}'s {speed:.2f}x)", speedup=speed))
    return out


#: The size whose speed-up a preset's step-saving reference saves, per family: what users run.
SIZES = {"flux": (1024, 1024, 1), "wan": (832, 480, 81)}


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
    sizes = SIZES
    rows: dict[str, Any] = {"steps": steps, "seeds": seeds, "rows": []}
    for name in names:
        family = FAMILIES[name]
        for variant in kinds:
            model = build(family, VARIANTS[variant])
            base_call = [one_call(model, family, s) for s in range(seeds)]
            base_gen = [generate(model, family, steps, s) for s in range(seeds)]
            for v in variants(name, sizes[name], (speeds or {}).get(name)):
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
    parser.add_argument("--families", default="flux,wan", help="comma-separated: flux, wan (default both)")
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
