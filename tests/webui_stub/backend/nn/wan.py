"""Forge Neo's Wan 2.1 / 2.2 (`backend/nn/wan.py: WanModel`), tiny: a video latent [B, C, T, H, W] patchified
1x2x2, blocks whose `self_attn` attends over the video's tokens alone and whose `cross_attn` attends to the text."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from backend import attention as attention_module
from backend.nn.common import CONTEXT_DIM, HEADS, WIDTH, mlp, positions, timestep_embedding
from torch import nn


class WanSelfAttention(nn.Module):
    def __init__(self, dim: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.num_heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor, freqs: Any = None, transformer_options: Any = None) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        return self.o(attention_module.attention_function(q, k, v, heads=self.num_heads))


class WanT2VCrossAttention(WanSelfAttention):
    def __init__(self, dim: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__(dim, heads)
        self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        q, k, v = self.q(x), self.k(context), self.v(context)
        return self.o(attention_module.attention_function(q, k, v, heads=self.num_heads))


class WanAttentionBlock(nn.Module):
    def __init__(self, dim: int = WIDTH) -> None:
        super().__init__()
        self.modulation = nn.Linear(dim, 2 * dim)
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.self_attn = WanSelfAttention(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.cross_attn = WanT2VCrossAttention(dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False)
        self.ffn = mlp(dim)

    def forward(
        self,
        x: torch.Tensor,
        e: torch.Tensor,
        freqs: Any,
        context: torch.Tensor,
        context_img_len: Any = None,
        transformer_options: Any = None,
    ) -> torch.Tensor:
        shift, scale = self.modulation(F.silu(e))[:, None].chunk(2, dim=-1)
        x = x + self.self_attn(self.norm1(x) * (1 + scale) + shift, freqs, transformer_options=transformer_options)
        x = x + self.cross_attn(self.norm3(x), context)
        return x + self.ffn(self.norm2(x))


class WanModel(nn.Module):
    def __init__(self, in_dim: int = 4, num_layers: int = 2) -> None:
        super().__init__()
        self.patch_size = (1, 2, 2)
        self.in_dim = in_dim
        self.patch_embedding = nn.Conv3d(in_dim, WIDTH, kernel_size=self.patch_size, stride=self.patch_size)
        self.pos_in = nn.Linear(3, WIDTH)
        self.text_embedding = nn.Linear(CONTEXT_DIM, WIDTH)
        self.time_embedding = nn.Linear(16, WIDTH)
        self.blocks = nn.ModuleList(WanAttentionBlock() for _ in range(num_layers))
        self.head = nn.Linear(WIDTH, in_dim * 4)

    def forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        clip_fea: Any = None,
        time_dim_concat: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        b, c, t, h, w = x.shape
        tokens = self.patch_embedding(x).flatten(2).transpose(1, 2) + self.pos_in(positions(t, h // 2, w // 2))
        e = self.time_embedding(timestep_embedding(timestep / 1000))
        text = self.text_embedding(context)
        for block in self.blocks:
            tokens = block(tokens, e=e, freqs=None, context=text, transformer_options=transformer_options)
        out = self.head(tokens).reshape(b, t, h // 2, w // 2, c, 2, 2)
        return out.permute(0, 4, 1, 2, 5, 3, 6).reshape(b, c, t, h, w)
