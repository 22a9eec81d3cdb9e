"""Forge Neo's Lumina 2 / Z-Image transformer (`backend/nn/lumina.py: NextDiT`), tiny: the caption's tokens (refined
alone), then the image's 2x2 patch tokens (refined alone), one joint sequence through `layers`, each block's
`attention` calling `attention_function` with [B, H, L, D] (`skip_reshape`) and no mask. Z-Image
(`pad_tokens_multiple`) pads the caption and the image tokens each to a multiple of it with learned pad tokens;
Lumina 2 keeps the whole caption as given."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from backend import attention as attention_module
from backend.nn.common import CONTEXT_DIM, HEADS, WIDTH, mlp, positions, timestep_embedding
from torch import nn


class JointAttention(nn.Module):
    def __init__(self, dim: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, x_mask: Any, transformer_options: Any = None) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        out = attention_module.attention_function(q, k, v, self.heads, x_mask, skip_reshape=True)
        return self.out(out)


class JointTransformerBlock(nn.Module):
    def __init__(self, dim: int = WIDTH) -> None:
        super().__init__()
        self.attention = JointAttention(dim)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.mod = nn.Linear(16, dim)
        self.feed_forward = mlp(dim)

    def forward(self, x: torch.Tensor, x_mask: Any, t: Any = None, transformer_options: Any = None) -> torch.Tensor:
        scale = 0.0 if t is None else self.mod(F.silu(t))[:, None]
        x = x + self.attention(self.norm(x) * (1 + scale), x_mask, transformer_options)
        return x + self.feed_forward(self.norm(x))


class NextDiT(nn.Module):
    def __init__(self, in_channels: int = 4, pad_tokens_multiple: int | None = None) -> None:
        super().__init__()
        self.patch_size = 2
        self.pad_tokens_multiple = pad_tokens_multiple
        self.x_embedder = nn.Linear(in_channels * 4, WIDTH)
        self.pos_in = nn.Linear(2, WIDTH)
        self.cap_embedder = nn.Linear(CONTEXT_DIM, WIDTH)
        self.noise_refiner = nn.ModuleList([JointTransformerBlock()])
        self.context_refiner = nn.ModuleList([JointTransformerBlock()])
        self.layers = nn.ModuleList(JointTransformerBlock() for _ in range(2))
        self.final_layer = nn.Linear(WIDTH, in_channels * 4)
        if pad_tokens_multiple is not None:
            self.x_pad_token = nn.Parameter(torch.randn(1, WIDTH))
            self.cap_pad_token = nn.Parameter(torch.randn(1, WIDTH))

    def _pad(self, x: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        extra = (-x.shape[1]) % self.pad_tokens_multiple if self.pad_tokens_multiple else 0
        return torch.cat([x, token.to(x.dtype).expand(x.shape[0], extra, -1)], dim=1) if extra else x

    def forward(
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        context: torch.Tensor,
        num_tokens: Any = None,
        attention_mask: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        b, c, h, w = x.shape
        t = timestep_embedding(1.0 - timesteps)
        cap = self.cap_embedder(context)
        img = x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4)
        img = self.x_embedder(img) + self.pos_in(positions(h // 2, w // 2))
        if self.pad_tokens_multiple:
            cap, img = self._pad(cap, self.cap_pad_token), self._pad(img, self.x_pad_token)
        for layer in self.context_refiner:
            cap = layer(cap, attention_mask, transformer_options=transformer_options)
        for layer in self.noise_refiner:
            img = layer(img, None, t, transformer_options=transformer_options)
        tokens = torch.cat([cap, img], dim=1)
        for layer in self.layers:
            tokens = layer(tokens, None, t, transformer_options=transformer_options)
        n = (h // 2) * (w // 2)
        out = self.final_layer(tokens[:, cap.shape[1] : cap.shape[1] + n])
        out = out.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return -out.reshape(b, c, h, w)
