"""Forge Neo's Qwen-Image (`backend/nn/qwen.py: QwenImageTransformer2DModel`), tiny: Neo feeds it the Wan VAE's
latent, [B, C, 1, H, W] (`process_img`: `bs, c, t, h, w = x.shape`), patchified 2x2; each block's `attn` attends over
the text tokens then the image's."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from backend import attention as attention_module
from backend.nn.common import CONTEXT_DIM, HEADS, WIDTH, mlp, positions, timestep_embedding
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v, self.to_out = (nn.Linear(dim, dim) for _ in range(4))
        self.add_q_proj, self.add_k_proj, self.add_v_proj, self.to_add_out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_hidden_states_mask: Any = None,
        attention_mask: Any = None,
        image_rotary_emb: Any = None,
        transformer_options: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        img, txt = hidden_states, encoder_hidden_states
        q = torch.cat([self.add_q_proj(txt), self.to_q(img)], dim=1)
        k = torch.cat([self.add_k_proj(txt), self.to_k(img)], dim=1)
        v = torch.cat([self.add_v_proj(txt), self.to_v(img)], dim=1)
        out = attention_module.attention_function(q, k, v, self.heads, attention_mask)
        return self.to_out(out[:, txt.shape[1] :]), self.to_add_out(out[:, : txt.shape[1]])


class QwenImageTransformerBlock(nn.Module):
    def __init__(self, dim: int = WIDTH) -> None:
        super().__init__()
        self.img_mod, self.txt_mod = nn.Linear(dim, 2 * dim), nn.Linear(dim, 2 * dim)
        self.img_norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.txt_norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.attn = Attention(dim)
        self.img_mlp, self.txt_mlp = mlp(dim), mlp(dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_hidden_states_mask: Any,
        temb: torch.Tensor,
        image_rotary_emb: Any = None,
        transformer_options: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        img_shift, img_scale = self.img_mod(F.silu(temb))[:, None].chunk(2, dim=-1)
        txt_shift, txt_scale = self.txt_mod(F.silu(temb))[:, None].chunk(2, dim=-1)
        img_out, txt_out = self.attn(
            self.img_norm(hidden_states) * (1 + img_scale) + img_shift,
            self.txt_norm(encoder_hidden_states) * (1 + txt_scale) + txt_shift,
            transformer_options=transformer_options,
        )
        img = hidden_states + img_out
        txt = encoder_hidden_states + txt_out
        return txt + self.txt_mlp(self.txt_norm(txt)), img + self.img_mlp(self.img_norm(img))


class QwenImageTransformer2DModel(nn.Module):
    def __init__(self, in_channels: int = 4, num_layers: int = 4) -> None:
        super().__init__()
        self.patch_size = 2
        self.img_in = nn.Linear(in_channels * 4, WIDTH)
        self.pos_in = nn.Linear(2, WIDTH)
        self.txt_in = nn.Linear(CONTEXT_DIM, WIDTH)
        self.time_in = nn.Linear(16, WIDTH)
        self.transformer_blocks = nn.ModuleList(QwenImageTransformerBlock() for _ in range(num_layers))
        self.proj_out = nn.Linear(WIDTH, in_channels * 4)

    def forward(
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        context: torch.Tensor,
        attention_mask: Any = None,
        guidance: Any = None,
        ref_latents: Any = None,
        transformer_options: Any = None,
        control: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        b, c, _, h, w = x.shape  # one frame
        img = x[:, :, 0].reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4)
        img = self.img_in(img) + self.pos_in(positions(h // 2, w // 2))
        txt = self.txt_in(context)
        temb = self.time_in(timestep_embedding(timesteps / 1000))
        for block in self.transformer_blocks:
            txt, img = block(
                hidden_states=img,
                encoder_hidden_states=txt,
                encoder_hidden_states_mask=attention_mask,
                temb=temb,
                transformer_options=transformer_options,
            )
        out = self.proj_out(img).reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(b, c, 1, h, w)
