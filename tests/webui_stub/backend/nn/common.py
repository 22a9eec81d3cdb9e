"""What the tiny transformers share: timestep and position embeddings, a modulated MLP."""

from __future__ import annotations

import math

import torch
from torch import nn

WIDTH = 32  # hidden size of every tiny transformer
HEADS = 2
CONTEXT_DIM = 16  # the stand-in sampler's text embeddings (`webui_stub.forge.CONTEXT_DIM`)


def timestep_embedding(t: torch.Tensor, dim: int = 16) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    angles = t.reshape(-1, 1).float() * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def positions(*sizes: int) -> torch.Tensor:
    """[prod(sizes), len(sizes)] coordinates in raster order, in [0, 1): what makes attention depend on position."""
    grids = torch.meshgrid(*(torch.arange(n, dtype=torch.float32) / max(n, 1) for n in sizes), indexing="ij")
    return torch.stack([g.reshape(-1) for g in grids], dim=-1)


def mlp(width: int = WIDTH) -> nn.Module:
    return nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(approximate="tanh"), nn.Linear(2 * width, width))
