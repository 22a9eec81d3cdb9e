"""Forge Neo's Lumina 2 / Z-Image transformer (`backend/nn/lumina.py: NextDiT`), tiny: a class `tome_core` has no
layout for, so the extension must name it and run unchanged."""

from __future__ import annotations

from typing import Any

import torch
from backend import attention as attention_module
from backend.nn.common import WIDTH
from torch import nn


class JointAttention(nn.Module):
    def __init__(self, dim: int = WIDTH) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(attention_module.attention_function(q, k, v, 2))


class JointTransformerBlock(nn.Module):
    def __init__(self, dim: int = WIDTH) -> None:
        super().__init__()
        self.attention = JointAttention(dim)

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return x + self.attention(x)


class NextDiT(nn.Module):
    def __init__(self, in_channels: int = 4) -> None:
        super().__init__()
        self.patch_size = 2
        self.x_embedder = nn.Linear(in_channels * 4, WIDTH)
        self.layers = nn.ModuleList(JointTransformerBlock() for _ in range(2))
        self.final_layer = nn.Linear(WIDTH, in_channels * 4)

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: Any = None, **kwargs: Any) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.x_embedder(x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4))
        for layer in self.layers:
            tokens = layer(tokens)
        out = self.final_layer(tokens).reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(b, c, h, w)
