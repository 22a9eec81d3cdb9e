"""Stand-ins for trained SD UNets: the real SD1.5/SDXL architectures with random weights whose attention behaves
like a trained model's.

A random-weight UNet attends uniformly (self-attention's entropy is ~99% of log N): every query averages all
tokens, so pooling keys/values (which keeps their mean) and merging deep levels look free there. Trained SD1.5/SDXL
self-attention is a local kernel falling off with distance plus a uniform floor (ΔConvFusion, arXiv 2504.21292), and
cross-attention puts 0.9-0.99 of its mass on the prompt's start token. The stand-in gets both by weight surgery on
the random UNet, in every transformer block:

* self-attention: the key projection is the query projection (`to_k = to_q`, scaled by `sharpness`), so a logit is
  the similarity of two tokens' projected features: largest for a token and its neighbours (the features of a
  natural-spectrum latent are spatially smooth) and content-dependent, with the rest of the image as the floor;
* cross-attention: the prompt's first token (`standin_inputs` makes it) is built so that its key lies along the
  component every query shares (the projected bias of the block's LayerNorm), scaled to take `bos_mass` of the
  attention on average.

Nothing here is used by the library; `tome_bench.fidelity` measures presets and references on these models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tome_bench import archs


@dataclass(frozen=True)
class StandIn:
    """The stand-in's knobs and its seed (`FITTED` holds the values fitted per architecture and size)."""

    #: Self-attention logits scale: the tied query/key projections are multiplied by sqrt(sharpness).
    sharpness: float = 1.0
    #: Sharpness gain per level below the first level with attention: level k steps deeper attends with sharpness
    #: times depth_gain**k (trained models' deep levels pick out fewer tokens, and what they drop costs more).
    depth_gain: float = 1.0
    #: Mean share of cross-attention on the prompt's start token.
    bos_mass: float = 0.985
    seed: int = 0

    def replace(self, **changes: Any) -> StandIn:
        from dataclasses import replace

        return replace(self, **changes)


#: Self-attention's logit per unit of correlation between two tokens' features, at sharpness 1.
LOGIT_SCALE = 8.0
#: Norm of the shared component every cross-attention query gets (the LayerNorm bias before cross-attention), in
#: units of the spread of one token's own component along it: large, so that the start token's logit is about the
#: same for every query.
_SHARED = 8.0


@torch.no_grad()
def make_standin(unet: nn.Module, params: StandIn) -> nn.Module:
    """Turn a random-weight diffusers UNet (`archs.build_unet`) into the stand-in `params` describes, in place; the
    text states must carry the start token `start_token` returns (`standin_inputs` puts it first)."""
    from tome_core import transformer_blocks

    gen = torch.Generator().manual_seed(params.seed + 1)
    blocks = transformer_blocks(unet)
    top = min(level for _, level in blocks)
    for block, level in blocks:
        sharpness = params.sharpness * params.depth_gain ** round(math.log2(level / top))
        attn1 = block.attn1
        q = attn1.to_q.weight  # [inner, C]
        # Orthonormal rows: q.k / sqrt(d) is sqrt(d) times the correlation of two tokens' normed features (their
        # cosine similarity within a head's subspace of d channels); scaled to LOGIT_SCALE * sharpness times it at
        # every level, whatever the head's width.
        w = torch.linalg.qr(torch.randn(q.shape[1], q.shape[0], generator=gen, dtype=torch.float64))[0].T
        d = q.shape[0] // attn1.heads
        w = (w * math.sqrt(sharpness * LOGIT_SCALE / math.sqrt(d))).to(q.dtype)
        attn1.to_q.weight.copy_(w)
        attn1.to_k.weight.copy_(w)
        attn2 = getattr(block, "attn2", None)
        if attn2 is None or not attn2.is_cross_attention:
            continue
        channels = block.norm2.bias.numel()
        direction = torch.randn(channels, generator=gen)
        block.norm2.bias.copy_((direction / direction.norm() * _SHARED).to(block.norm2.bias.dtype))
        start = start_token(attn2.to_k.weight.shape[1], params)  # [C_ctx]
        shared = attn2.to_q(block.norm2.bias.view(1, -1)).float().view(attn2.heads, -1)  # [heads, d]
        d = shared.shape[1]
        tokens = archs.TEXT_TOKENS
        # The start token's logit L against ~0 for the other T-1 tokens gives it e^L / (e^L + T - 1).
        logit = math.log(params.bos_mass / (1 - params.bos_mass) * (tokens - 1))
        norms = shared.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        key = (shared / norms * (logit * math.sqrt(d) / norms)).reshape(-1)  # [inner]: q_shared . k / sqrt(d) = L
        wk = attn2.to_k.weight.float()  # [inner, C_ctx]
        # Rank-one change: W e = key for the start token e; other tokens' keys move only along e.
        wk += torch.outer(key - wk @ start, start) / start.dot(start)
        attn2.to_k.weight.copy_(wk.to(attn2.to_k.weight.dtype))
    return unet


def start_token(channels: int, params: StandIn) -> torch.Tensor:
    """[channels] the prompt's start token of the stand-in's text states (the scale of the others: unit variance)."""
    return torch.randn(channels, generator=torch.Generator().manual_seed(params.seed + 2))


def build(arch: str, params: StandIn, dtype: torch.dtype = torch.float32, device: str = "cpu") -> nn.Module:
    """A stand-in UNet of `arch` ("sd15", "sdxl", or the tiny test UNets)."""
    unet = archs.build_unet(arch, dtype, device, seed=params.seed)
    return make_standin(unet, params)


def standin_inputs(
    unet: nn.Module,
    arch: str,
    size: int,
    params: StandIn,
    *,
    batch: int = 1,
    latent_kind: str = "natural",
    timestep: int = 500,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """One call's inputs (`archs.make_inputs`) with the stand-in's start token in the text states."""
    args, kwargs = archs.make_inputs(
        arch, size, batch=batch, latent_kind=latent_kind, timestep=timestep, seed=params.seed
    )
    context = kwargs["encoder_hidden_states"].clone()
    context[:, 0] = start_token(context.shape[-1], params).to(context.dtype)
    kwargs["encoder_hidden_states"] = context
    return args, kwargs


# ---------------------------------------------------------------------------------------------- fitted values

#: The published relations the stand-in is fitted to (one UNet call at t=500 from a natural-spectrum start, the
#: first level with attention only): the output's mean squared change under ToMe at ratio 0.75 over that under ToDo
#: 2x2, and under ToDo 3x3 over ToDo 2x2 (ToDo, arXiv 2402.13573, Table 1: 4.3 and 1.5, DreamShaper SD1.5 at
#: 1536 px). The sharpness in `FITTED` was scanned by hand for both, at each size (docs/fidelity.md).
TARGETS = {"tome.75/todo2": 4.3, "todo3/todo2": 1.5}

#: Depth gain of every fitted stand-in: with it, merging or pooling deeper levels changes the output more than the
#: first level alone, and adding cross-attention and the MLP more again, as tomesd's ablation finds on real weights
#: (with 1.0, the random UNet's deep levels would still look nearly free; docs/fidelity.md).
DEPTH_GAIN = 1.3

#: (arch, size in px) -> the fitted stand-in. The relations depend on size (a stand-in fitted at 512 px reads 15.9
#: instead of 4.3 at 1024 px): fitted per size, and between two fitted sizes the sharpness is interpolated in
#: log(size); outside them the nearest is used. Commands and errors in docs/fidelity.md.
FITTED: dict[tuple[str, int], StandIn] = {
    ("sd15", 512): StandIn(sharpness=1.0, depth_gain=DEPTH_GAIN),
    ("sd15", 1024): StandIn(sharpness=1.4, depth_gain=DEPTH_GAIN),
    ("sdxl", 1024): StandIn(sharpness=0.7, depth_gain=DEPTH_GAIN),
}

#: The panel's variants: sharper and softer attention than fitted, to show that a ranking does not hang on the fit.
VARIANTS: dict[str, dict[str, float]] = {
    "stand-in": {},
    "sharper": {"sharpness": 1.25, "depth_gain": 1.6 / DEPTH_GAIN},
    "softer": {"sharpness": 0.8, "depth_gain": 1.0 / DEPTH_GAIN},
}


#: The tiny test UNets take the fitted values of the architecture they stand for.
_FITTED_AS = {"tiny": "sd15", "tiny-xl": "sdxl"}


def fitted(arch: str, size: int, variant: str = "stand-in") -> StandIn:
    """The stand-in of `arch` at `size` px: `FITTED`, interpolated between sizes, then `variant`'s factors."""
    arch = _FITTED_AS.get(arch, arch)
    sizes = sorted(s for a, s in FITTED if a == arch)
    if not sizes:
        raise ValueError(f"no fitted stand-in for {arch!r}; fitted: {sorted({a for a, _ in FITTED})}")
    below = max((s for s in sizes if s <= size), default=sizes[0])
    above = min((s for s in sizes if s >= size), default=sizes[-1])
    lo, hi = FITTED[arch, below], FITTED[arch, above]
    t = 0.0 if above == below else math.log(size / below) / math.log(above / below)
    sharpness = lo.sharpness * (hi.sharpness / lo.sharpness) ** t
    factors = VARIANTS[variant]
    return lo.replace(
        sharpness=sharpness * factors.get("sharpness", 1.0), depth_gain=lo.depth_gain * factors.get("depth_gain", 1.0)
    )
