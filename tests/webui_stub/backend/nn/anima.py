"""Forge Neo's Anima (`backend/nn/anima.py: Anima`, a Cosmos `MiniTrainDIT`), tiny: a class `tome_core` has no
layout for. Neo feeds it the Wan VAE's latent, [B, C, 1, H, W]."""

from __future__ import annotations

from typing import Any

import torch
from backend.nn.lumina import NextDiT
from torch import nn


class MiniTrainDIT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = NextDiT()
        self.blocks = self.net.layers

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: Any = None, **kwargs: Any) -> torch.Tensor:
        return self.net(x[:, :, 0], timesteps, context).unsqueeze(2)


class Anima(MiniTrainDIT):
    pass
