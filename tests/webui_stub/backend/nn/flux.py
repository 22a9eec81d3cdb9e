"""Forge Neo's Flux.1 / Flux.2 transformer (`backend/nn/flux.py: IntegratedFluxTransformer2DModel`), tiny: double
blocks that attend over the text tokens then the image's, single blocks over the same joint sequence, the latent
[B, C, H, W] patchified 2x2, called as Neo's `KModel` calls it: `(x, timestep, context=..., transformer_options=...)`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from backend import attention as attention_module
from backend.nn.common import CONTEXT_DIM, HEADS, WIDTH, mlp, positions, timestep_embedding
from torch import nn


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[B, H, L, D] each -> [B, L, H*D], through Neo's attention function (`skip_reshape=True`, as Neo's Flux)."""
    return attention_module.attention_function(q, k, v, q.shape[1], skip_reshape=True)


def _qkv(linear: nn.Linear, x: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, n, _ = x.shape
    q, k, v = linear(x).view(b, n, 3, heads, -1).permute(2, 0, 3, 1, 4)
    return q, k, v


class SelfAttention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)


class DoubleStreamBlock(nn.Module):
    def __init__(self, dim: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.num_heads = heads
        self.img_mod, self.txt_mod = nn.Linear(dim, 2 * dim), nn.Linear(dim, 2 * dim)
        self.img_norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.txt_norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.img_attn, self.txt_attn = SelfAttention(dim), SelfAttention(dim)
        self.img_mlp, self.txt_mlp = mlp(dim), mlp(dim)

    def forward(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        vec: torch.Tensor,
        pe: Any = None,
        attn_mask: Any = None,
        transformer_options: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        img_shift, img_scale = self.img_mod(F.silu(vec))[:, None].chunk(2, dim=-1)
        txt_shift, txt_scale = self.txt_mod(F.silu(vec))[:, None].chunk(2, dim=-1)
        img_q, img_k, img_v = _qkv(self.img_attn.qkv, self.img_norm(img) * (1 + img_scale) + img_shift, self.num_heads)
        txt_q, txt_k, txt_v = _qkv(self.txt_attn.qkv, self.txt_norm(txt) * (1 + txt_scale) + txt_shift, self.num_heads)
        out = attention(torch.cat((txt_q, img_q), 2), torch.cat((txt_k, img_k), 2), torch.cat((txt_v, img_v), 2))
        txt_out, img_out = out[:, : txt.shape[1]], out[:, txt.shape[1] :]
        img = img + self.img_attn.proj(img_out)
        img = img + self.img_mlp(self.img_norm(img))
        txt = txt + self.txt_attn.proj(txt_out)
        return img, txt + self.txt_mlp(self.txt_norm(txt))


class SingleStreamBlock(nn.Module):
    def __init__(self, dim: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.num_heads = heads
        self.modulation = nn.Linear(dim, 2 * dim)
        self.pre_norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.linear1 = nn.Linear(dim, 3 * dim + 2 * dim)
        self.linear2 = nn.Linear(dim + 2 * dim, dim)
        self.dim = dim

    def forward(
        self, x: torch.Tensor, vec: torch.Tensor, pe: Any = None, attn_mask: Any = None, transformer_options: Any = None
    ) -> torch.Tensor:
        shift, scale = self.modulation(F.silu(vec))[:, None].chunk(2, dim=-1)
        qkv, hidden = torch.split(
            self.linear1(self.pre_norm(x) * (1 + scale) + shift), [3 * self.dim, 2 * self.dim], -1
        )
        b, n, _ = x.shape
        q, k, v = qkv.view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        return x + self.linear2(torch.cat((attention(q, k, v), F.gelu(hidden, approximate="tanh")), 2))


class FluxBody(nn.Module):
    """The tiny Flux's layers and forward, shared by Neo's two classes of that shape (Flux.1/Flux.2, and Chroma,
    which is a class of its own in Neo, not a subclass)."""

    def __init__(self, in_channels: int = 4, depth: int = 1, depth_single_blocks: int = 2, patch_size: int = 2) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.img_in = nn.Linear(in_channels * patch_size**2, WIDTH)
        self.pos_in = nn.Linear(2, WIDTH)
        self.txt_in = nn.Linear(CONTEXT_DIM, WIDTH)
        self.time_in = nn.Linear(16, WIDTH)
        self.double_blocks = nn.ModuleList(DoubleStreamBlock() for _ in range(depth))
        self.single_blocks = nn.ModuleList(SingleStreamBlock() for _ in range(depth_single_blocks))
        self.final_layer = nn.Linear(WIDTH, in_channels * patch_size**2)

    def forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        y: Any = None,
        guidance: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        b, c, h, w = x.shape
        p = self.patch_size
        img = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), -1)
        img = self.img_in(img) + self.pos_in(positions(h // p, w // p))
        txt = self.txt_in(context)
        vec = self.time_in(timestep_embedding(timestep / 1000))
        for block in self.double_blocks:
            img, txt = block(img=img, txt=txt, vec=vec, transformer_options=transformer_options)
        joint = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            joint = block(joint, vec=vec, transformer_options=transformer_options)
        out = self.final_layer(joint[:, txt.shape[1] :])
        return out.reshape(b, h // p, w // p, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


class IntegratedFluxTransformer2DModel(FluxBody):
    pass
