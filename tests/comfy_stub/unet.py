"""A tiny UNet shaped like ComfyUI's (comfy/ldm/modules/diffusionmodules/openaimodel.py UNetModel with
comfy/ldm/modules/attention.py SpatialTransformer/BasicTransformerBlock): the same module names, block numbering,
`transformer_options` keys and patch points, at a toy size. Weights are seeded, so outputs are bitwise repeatable."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .patcher import DIFFUSION_MODEL, WrapperExecutor, get_all_wrappers

CONTEXT_DIM = 32


class CrossAttention(nn.Module):
    """`attention.CrossAttention`: keys from `context` (default: x), values from `value` (default: keys' input)."""

    def __init__(self, dim: int, context_dim: int | None = None, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(context_dim or dim, dim, bias=False)
        self.to_v = nn.Linear(context_dim or dim, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, context: Any = None, value: Any = None, transformer_options: Any = None
    ) -> torch.Tensor:
        q = self.to_q(x)
        context = x if context is None else context
        k = self.to_k(context)
        v = self.to_v(context if value is None else value)
        return self.to_out(attention(q, k, v, self.heads))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, N, C] x [B, M, C] x [B, M, C] -> [B, N, C], `heads` heads."""
    b, n, c = q.shape
    split = lambda t: t.reshape(b, t.shape[1], heads, c // heads).transpose(1, 2)
    return F.scaled_dot_product_attention(split(q), split(k), split(v)).transpose(1, 2).reshape(b, n, c)


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BasicTransformerBlock(nn.Module):
    """ComfyUI's block order: norm1 -> attn1_patch -> attn1 (or its replacement) -> attn1_output_patch -> residual,
    norm2 -> attn2 -> residual, norm3 -> ff -> residual; replacements are looked up by (block, number, index), then
    by (block, number)."""

    def __init__(self, dim: int, heads: int = 2) -> None:
        super().__init__()
        self.attn1 = CrossAttention(dim, heads=heads)
        self.attn2 = CrossAttention(dim, CONTEXT_DIM, heads=heads)
        self.ff = FeedForward(dim)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.heads = heads

    def forward(self, x: torch.Tensor, context: Any = None, transformer_options: Any = None) -> torch.Tensor:
        to = transformer_options or {}
        patches = to.get("patches", {})
        replace = to.get("patches_replace", {})
        extra = {k: v for k, v in to.items() if k not in ("patches", "patches_replace")}
        block = to.get("block")
        key = (block[0], block[1], to.get("block_index", 0)) if block is not None else None

        n = self.norm1(x)
        context_attn1, value_attn1 = None, None
        if "attn1_patch" in patches:
            context_attn1 = n
            value_attn1 = context_attn1
            for p in patches["attn1_patch"]:
                n, context_attn1, value_attn1 = p(n, context_attn1, value_attn1, extra)
        table = replace.get("attn1", {})
        found = key if key in table else block if block in table else None
        if found is not None:
            if context_attn1 is None:
                context_attn1 = value_attn1 = n
            q, k, v = self.attn1.to_q(n), self.attn1.to_k(context_attn1), self.attn1.to_v(value_attn1)
            n = self.attn1.to_out(table[found](q, k, v, extra))
        else:
            n = self.attn1(n, context=context_attn1, value=value_attn1, transformer_options=to)
        for p in patches.get("attn1_output_patch", []):
            n = p(n, extra)
        x = n + x
        n = self.norm2(x)
        x = self.attn2(n, context=context, value=None, transformer_options=to) + x
        return self.ff(self.norm3(x)) + x


class SpatialTransformer(nn.Module):
    def __init__(self, channels: int, depth: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, channels)
        self.proj_in = nn.Linear(channels, channels)
        self.transformer_blocks = nn.ModuleList(BasicTransformerBlock(channels) for _ in range(depth))
        self.proj_out = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor, context: Any = None, transformer_options: Any = None) -> torch.Tensor:
        b, c, h, w = x.shape
        x_in = x
        x = self.proj_in(self.norm(x).movedim(1, 3).flatten(1, 2))
        for i, block in enumerate(self.transformer_blocks):
            transformer_options["block_index"] = i
            x = block(x, context=context, transformer_options=transformer_options)
        return self.proj_out(x).reshape(b, h, w, c).movedim(3, 1) + x_in


class ResBlock(nn.Module):
    def __init__(self, channels_in: int, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels, 3, padding=1)
        self.emb = nn.Linear(8, channels)
        self.skip = nn.Conv2d(channels_in, channels, 1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.skip(x) + F.silu(self.conv(x) + self.emb(emb)[:, :, None, None])


class Downsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class Upsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class TimestepEmbedSequential(nn.ModuleList):
    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: Any, transformer_options: Any) -> torch.Tensor:
        for layer in self:
            if isinstance(layer, ResBlock):
                x = layer(x, emb)
            elif isinstance(layer, SpatialTransformer):
                x = layer(x, context, transformer_options)
                if "transformer_index" in transformer_options:
                    transformer_options["transformer_index"] += 1
            else:
                x = layer(x)
        return x


class UNetModel(nn.Module):
    """`depths[i]`: transformer blocks per stack at level 2**i (0: a level without attention); the middle stack has
    `middle` blocks. One res block per level on the way down, two on the way up, as in ComfyUI's numbering."""

    def __init__(self, depths: tuple[int, ...], middle: int, channels: int = 16) -> None:
        super().__init__()
        c = channels
        self.time_embed = nn.Linear(1, 8)
        self.input_blocks = nn.ModuleList([TimestepEmbedSequential([nn.Conv2d(4, c, 3, padding=1)])])
        for level, depth in enumerate(depths):
            layers: list[nn.Module] = [ResBlock(c, c)]
            if depth:
                layers.append(SpatialTransformer(c, depth))
            self.input_blocks.append(TimestepEmbedSequential(layers))
            if level < len(depths) - 1:
                self.input_blocks.append(TimestepEmbedSequential([Downsample(c)]))
        self.middle_block = TimestepEmbedSequential([ResBlock(c, c), SpatialTransformer(c, middle), ResBlock(c, c)])
        self.output_blocks = nn.ModuleList()
        for level in reversed(range(len(depths))):
            for i in range(2):
                layers = [ResBlock(2 * c, c)]
                if depths[level]:
                    layers.append(SpatialTransformer(c, depths[level]))
                if i == 1 and level > 0:
                    layers.append(Upsample(c))
                self.output_blocks.append(TimestepEmbedSequential(layers))
        self.out = nn.Conv2d(c, 4, 3, padding=1)

    def forward(
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        context: Any = None,
        y: Any = None,
        control: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """`UNetModel.forward`: the DIFFUSION_MODEL wrappers from `transformer_options` around `_forward`."""
        wrappers = get_all_wrappers(DIFFUSION_MODEL, transformer_options or {})
        return WrapperExecutor(self._forward, self, wrappers).execute(
            x, timesteps, context, y, control, transformer_options, **kwargs
        )

    def _forward(
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        context: Any = None,
        y: Any = None,
        control: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        to = transformer_options if transformer_options is not None else {}
        to["original_shape"] = list(x.shape)
        to["transformer_index"] = 0
        emb = self.time_embed(timesteps.reshape(-1, 1).to(x.dtype) / 1000)
        hs = []
        h = x
        for number, block in enumerate(self.input_blocks):
            to["block"] = ("input", number)
            h = block(h, emb, context, to)
            hs.append(h)
        to["block"] = ("middle", 0)
        h = self.middle_block(h, emb, context, to)
        for number, block in enumerate(self.output_blocks):
            to["block"] = ("output", number)
            skip = hs.pop() if hs else h
            h = block(torch.cat([h, skip], 1)[:, : 2 * h.shape[1]], emb, context, to)
        return self.out(h)


def build_unet(family: str, seed: int = 0) -> nn.Module:
    """ "sd": attention at levels 1, 2 (one block each) and the middle at 4; "sdxl": no attention at level 1, one
    block at level 2, three at level 4 and in the middle (more blocks deeper, as in SDXL)."""
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        unet = UNetModel((1, 1, 0), 1) if family == "sd" else UNetModel((0, 1, 3), 3)
    finally:
        torch.set_rng_state(state)
    return unet.eval().requires_grad_(False)


class DiT(nn.Module):
    """A diffusion model without UNet transformer blocks (Flux, SD3...)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(4, 4, 1)

    def forward(
        self, x: torch.Tensor, timesteps: torch.Tensor, context: Any = None, transformer_options: Any = None, **kw: Any
    ) -> torch.Tensor:
        return self.proj(x)
