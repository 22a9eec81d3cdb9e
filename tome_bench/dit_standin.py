"""Stand-ins for trained diffusion transformers, and the fidelity panel of the DiT presets beside their references.

A random-weight DiT attends almost uniformly: every query averages all tokens, and subsampling keys/values (which
keeps their spread) looks free there. Trained DiTs attend locally and by content: a query picks out tokens like
itself, nearby ones most (the rotary embedding's phase falls off with distance). The stand-in gets that by weight
surgery on the real architecture (diffusers' class, fewer blocks and channels so that it runs on a CPU): in every
attention the key projection is the query projection (per stream: image and text), and the per-head RMS norms that
follow both are set so that a logit is `LOGIT_SCALE * sharpness` times the cosine similarity of two tokens'
projected features, the scale the UNet stand-ins are fitted at (tome_bench.standin); SD3.5's absolute position table
is centred over the stand-in's grid (`_centre_positions`). Every block of the stand-in then changes its residual stream
by `BLOCK_UPDATE` (`strengthen`): as built, how much a block adds depends on how the family's random modulation
happens to be initialised (Flux.1's blocks add 2-3% to the stream, Chroma's, the same blocks behind another
modulation network, 15-25%), and a model whose blocks add almost nothing passes its input through, so any change
inside attention looked nearly free. Lumina 2's stand-in reads its time as Z-Image's model does (`Family.time_scale`): as
built, its output hardly depended on the time. The families themselves (classes, reduced configs, latents, how each
pipeline feeds its transformer; the video families on five latent frames, LTX-2's audio stream beside its video,
never reduced) are described in tome_bench.dit_families. The tied stand-in is fitted to no trained DiT;
tome_bench.refit re-fits them to the one trained here.

The fidelity panel that runs them beside the references: tome_bench.dit_fidelity.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import tome_core
from tome_bench.archs import natural_latent

# FAMILIES here too: the run folders' scripts read the families from this module.
from tome_bench.dit_families import FAMILIES, Family, pack, unpack  # noqa: F401

#: Logit per unit of cosine similarity at sharpness 1 (the UNet stand-ins' scale, tome_bench.standin).
LOGIT_SCALE = 8.0
#: How much each block of a stand-in changes its residual stream, ||out - in|| / ||in|| averaged over the blocks on
#: one call at sigma 0.5: Chroma's as built (0.15-0.25, with Z-Image's 0.16 and Wan's 0.11 the strongest
#: initialisations of the families), where Flux.1, Flux.2, Qwen-Image and SD3.5 come out at 0.02-0.03.
BLOCK_UPDATE = 0.2
#: The tied variants: uniform attention (random weights as initialised), the stand-in, sharper and softer
#: (tome_bench.refit.VARIANTS adds the stand-in re-fitted to the trained DiT's attention profile).
VARIANTS: dict[str, float | None] = {"random": None, "stand-in": 0.85, "sharper": 1.0, "softer": 0.7}
#: A surgery in place of the tie: (model, family, seed) -> None (`tome_bench.refit.Refit`).
Surgery = Callable[[nn.Module, "Family", int], Any]


def tie(module: nn.Module, head_dim: int, gain: float) -> bool:
    """Ties one attention's query and key projections per stream and sets its q/k norms to `gain`; whether it has
    any. Where a key head serves several query heads (Lumina 2's grouped-query attention, each key head repeated for
    consecutive query heads), those query heads take its projection."""
    found = []
    fused = getattr(module, "to_qkv_mlp_proj", None)  # Flux.2's single blocks: rows [q, k, v, MLP] in one
    if isinstance(fused, nn.Linear):
        inner = module.inner_dim
        fused.weight[inner : 2 * inner].copy_(fused.weight[:inner])
        if fused.bias is not None:
            fused.bias[inner : 2 * inner].copy_(fused.bias[:inner])
        found.append(("norm_q", "norm_k"))
    for q, k, norms in (
        ("to_q", "to_k", ("norm_q", "norm_k")),
        ("add_q_proj", "add_k_proj", ("norm_added_q", "norm_added_k")),
    ):
        wq, wk = getattr(module, q, None), getattr(module, k, None)
        if not isinstance(wq, nn.Linear) or not isinstance(wk, nn.Linear) or wq.in_features != wk.in_features:
            continue
        if wq.weight.shape == wk.weight.shape:
            wk.weight.copy_(wq.weight)
            if wq.bias is not None and wk.bias is not None:
                wk.bias.copy_(wq.bias)
        elif wq.out_features % wk.out_features == 0 and wq.bias is None and wk.bias is None:
            group = wq.out_features // wk.out_features
            wq.weight.copy_(wk.weight.view(-1, head_dim, wk.in_features).repeat_interleave(group, 0).flatten(0, 1))
        else:
            continue
        found.append(norms)
    for name in (n for pair in found for n in pair):
        norm = getattr(module, name, None)
        if getattr(norm, "weight", None) is not None:
            norm.weight.fill_(gain)
    return bool(found)


def _centre_positions(model: nn.Module, family: Family) -> None:
    """SD3's absolute position table (sine-cosine, added to every patch token), less its mean over the grid the
    stand-in runs at. Its slow channels barely change across a grid: a direction every token shares, which tied
    random projections keep (tokens' cosine similarities start near 0.6 and attention stays almost uniform) where a
    trained model's can learn to discount it. Rotary embeddings (every other family) add no such direction."""
    embed = getattr(model, "pos_embed", None)
    table, side = getattr(embed, "pos_embed", None), getattr(embed, "pos_embed_max_size", None)
    if not isinstance(table, torch.Tensor) or not side:
        return
    h, w = (n // embed.patch_size for n in family.latent[-2:])
    top, left = (side - h) // 2, (side - w) // 2  # PatchEmbed's centre crop
    table.sub_(table.view(side, side, -1)[top : top + h, left : left + w].mean(dim=(0, 1)))


@torch.no_grad()
def surgery(model: nn.Module, family: Family, sharpness: float) -> int:
    """The stand-in's weight surgery on `model` in place; how many attention modules it tied."""
    _centre_positions(model, family)
    gain = math.sqrt(LOGIT_SCALE * sharpness / math.sqrt(family.head_dim))
    return sum(tie(module, family.head_dim, gain) for module in model.modules())


def blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of every stack of the model (its top-level ModuleLists: Flux's double- and single-stream blocks,
    Z-Image's refiners and layers)."""
    return [block for stack in model.children() if isinstance(stack, nn.ModuleList) for block in stack]


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]


def _scale_update(gain: list[float]) -> Callable[..., Any]:
    """A forward hook that scales what a block adds to each stream it returns (an output the shape of one of its
    inputs: the image tokens, and the text tokens of a double-stream block) by `gain[0]` (one cell for every block,
    set in place while `strengthen` fits it)."""

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        inputs = _tensors(args, kwargs)

        def scaled(t: Any) -> Any:
            before = next((x for x in inputs if isinstance(t, torch.Tensor) and x.shape == t.shape), None)
            return t if before is None else before + gain[0] * (t - before)

        return tuple(scaled(t) for t in out) if isinstance(out, tuple) else scaled(out)

    return hook


def updates(model: nn.Module, family: Family) -> list[float]:
    """How much each block changes the stream of its first input (the image tokens, or the joint sequence) on one
    call at sigma 0.5: ||out - in|| / ||in||."""
    seen: list[float] = []

    def record(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        before = _tensors(args, kwargs)[0]
        after = [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]
        after = [t for t in after if t.shape == before.shape]
        if after:
            seen.append(float((after[-1] - before).norm() / before.norm()))

    handles = [block.register_forward_hook(record, with_kwargs=True) for block in blocks(model)]
    try:
        one_call(model, family, 0)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def strengthen(model: nn.Module, family: Family, target: float = BLOCK_UPDATE) -> float:
    """Scales what every block adds to the stream (a forward hook per block, kept with the model) so that the
    blocks change it by `target` on average; the gain. Each block's modulation ends differently per family (Flux's
    gates, Chroma's approximator, Wan's table plus time projection), so the scale is put where a block's output
    leaves it. A few rounds: a block's input depends on the gain of the blocks before it."""
    gain = [1.0]
    hook = _scale_update(gain)
    for block in blocks(model):
        block.register_forward_hook(hook, with_kwargs=True)
    for _ in range(3):
        seen = updates(model, family)
        gain[0] *= target / (sum(seen) / len(seen))
    return gain[0]


def _scale_time(model: nn.Module, family: Family) -> None:
    if family.time_scale is not None:
        path, scale = family.time_scale
        model.get_submodule(path).register_forward_pre_hook(lambda module, args: (args[0] * scale, *args[1:]))


@torch.no_grad()
def build(family: Family, sharpness: float | Surgery | None, seed: int = 0) -> nn.Module:
    """The reduced DiT with random weights; with `sharpness`, the stand-in (tied query/key projections per stream,
    their RMS norms scaled so that a logit is LOGIT_SCALE * sharpness times a cosine similarity, and blocks that
    change the stream by BLOCK_UPDATE); with a `Surgery` (a `tome_bench.refit.Refit`), that surgery in place of the
    tie (the stand-in re-fitted to the trained DiT's attention profile), the same blocks' update."""
    import diffusers

    torch.manual_seed(seed)
    model = getattr(diffusers, family.cls)(**family.config).eval().requires_grad_(False)
    if callable(sharpness):
        sharpness(model, family, seed)
        _scale_time(model, family)
        # A surgery may ask for its own block update (tome_bench.refit.Refit.update: the calibrated variant's).
        update = getattr(sharpness, "update", None)
        strengthen(model, family, BLOCK_UPDATE if update is None else update)
        speed = getattr(sharpness, "velocity", None)
        if speed is not None:
            model.__dict__[VELOCITY_ATTR] = speed / velocity_ratio(model, family)
    elif sharpness is not None:
        surgery(model, family, sharpness)
        _scale_time(model, family)
        strengthen(model, family)
    return model


#: The model attribute a surgery sets to narrow the time the model reads (tome_bench.refit.Refit.time): the model is
#: fed TIME_ANCHOR + squeeze * (sigma - TIME_ANCHOR) in place of sigma. Absent (every tied variant): sigma as it is.
TIME_ATTR = "_standin_time_squeeze"
TIME_ANCHOR = 0.5
#: The model attribute a surgery's velocity gain is kept in (tome_bench.refit.Refit.velocity): `call` scales the
#: velocity by it. Absent (every tied variant): 1.
VELOCITY_ATTR = "_standin_velocity_gain"


def call(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """The velocity for `latent` at noise level `sigma`, as the family's diffusers pipeline calls the model and
    steps its scheduler with the output (a surgery's time squeeze, TIME_ATTR, applied to the sigma it reads)."""
    squeeze = model.__dict__.get(TIME_ATTR)
    if squeeze is not None:
        sigma = TIME_ANCHOR + squeeze * (sigma - TIME_ANCHOR)
    return family.feed(model, family, latent, sigma, text) * model.__dict__.get(VELOCITY_ATTR, 1.0)


def velocity_ratio(model: nn.Module, family: Family, seed: int = 0) -> float:
    """||velocity|| / ||input|| of one call at sigma 0.5 (`one_call`'s input: a natural-spectrum latent half noised)."""
    noise, natural, _ = sample_inputs(family, seed)
    return float(one_call(model, family, seed).norm() / (0.5 * noise + 0.5 * natural).norm())


def sample_inputs(family: Family, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(white noise, a natural-spectrum latent, text states) of one sample."""
    g = torch.Generator().manual_seed(seed)
    shape = (1, *family.latent)
    noise = torch.randn(shape, generator=g)
    flat = (1, family.latent[0] * (family.latent[1] if len(family.latent) == 4 else 1), *family.latent[-2:])
    natural = natural_latent(flat, g).view(shape)
    return noise, natural, torch.randn(1, family.text, family.config[family.text_dim], generator=g)


@torch.no_grad()
def generate(model: nn.Module, family: Family, steps: int, seed: int) -> torch.Tensor:
    """The final latent of a flow-matching Euler sampling of `steps` steps from white noise (sigma 1 -> 0)."""
    noise, _, text = sample_inputs(family, seed)
    x = noise
    sigmas = torch.linspace(1.0, 0.0, steps + 1).tolist()
    for step, (sigma, following) in enumerate(itertools.pairwise(sigmas)):
        tome_core.set_step(model, step, steps)
        x = x + (following - sigma) * call(model, family, x, sigma, text)
    return x


@torch.no_grad()
def one_call(model: nn.Module, family: Family, seed: int) -> torch.Tensor:
    """One call at sigma 0.5 from a natural-spectrum latent half noised (the measure of the UNet panels)."""
    noise, natural, text = sample_inputs(family, seed)
    return call(model, family, 0.5 * noise + 0.5 * natural, 0.5, text)


def change(out: torch.Tensor, base: torch.Tensor) -> float:
    return float((out - base).norm() / base.norm())
