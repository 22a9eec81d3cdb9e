"""The lab's diffusion-transformer families as their diffusers pipelines run them (tome_bench.dit_standin builds the
stand-ins on them): each family's class, a reduced config, the latent it runs on, where its text sits in the
self-attention, and how its pipeline feeds the transformer one step (`Feed`: timestep scale, packing, the sign of the
velocity), checked against the pipelines in diffusers (tests/test_bench_dit.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from tome_bench.archs import natural_latent
from tome_bench.dit_inputs import ids

#: What a family's pipeline does with one step's latent: (model, family, latent, sigma, text states) -> the velocity
#: `generate`'s Euler step integrates (x += (sigma_next - sigma) * v), in the latent's shape.
Feed = Callable[[nn.Module, "Family", torch.Tensor, float, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Family:
    """A reduced DiT of one family: its diffusers class and config, the latent it runs on, how the family's
    diffusers pipeline feeds it (`feed`), and where the stand-in scales the time the model embeds (`time_scale`:
    the time embedding's module and the factor, for a family whose random time embedding barely reads the time)."""

    name: str
    cls: str
    config: dict[str, Any]
    latent: tuple[int, ...]  # (C, H, W) or (C, F, H, W) of the VAE's latent, before any packing
    text: int  # text tokens
    text_dim: str  # the config key of the text states' width
    head_dim: int
    feed: Feed
    time_scale: tuple[str, float] | None = None
    patch: int = 2  # latent cells per token along rows and columns (LTX-Video's 32x VAE: 1)
    #: Where the text is in the model's self-attention: "first" / "last" in the joint sequence, or "cross" (the
    #: self-attention holds the image or video alone; the text is cross-attended).
    text_at: str = "first"

    @property
    def grid(self) -> tuple[int, int, int]:
        """(frames, rows, columns) of the tokens the self-attention holds (frames 1 for an image)."""
        frames = self.latent[1] if len(self.latent) == 4 else 1
        return frames, self.latent[-2] // self.patch, self.latent[-1] // self.patch

    def joint_layout(self) -> tuple[int, tuple[int, int, int], int]:
        """(tokens ahead of the grid, the grid, text tokens beside it) in one self-attention call's sequence
        (`tome_bench.attention_profile.Layout`'s fields)."""
        text = 0 if self.text_at == "cross" else self.text
        return (text if self.text_at == "first" else 0), self.grid, text


def pack(latent: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H/2 * W/2, 4C]: 2x2 patches as tokens, as the Flux, Chroma, Qwen-Image and Flux.2 pipelines
    pack them (Flux.2 patchifies into channels first, then flattens: the same order)."""
    b, c, h, w = latent.shape
    return latent.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)


def unpack(tokens: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    b, c, h, w = shape
    return tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(shape)


def _per_sample(latent: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full((latent.shape[0],), value)


def _flux(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """Flux.1 (schnell-like: no guidance embedding): packed tokens, the sigma as the timestep."""
    h, w = latent.shape[-2] // 2, latent.shape[-1] // 2
    out = model(
        hidden_states=pack(latent),
        encoder_hidden_states=text,
        pooled_projections=torch.zeros(latent.shape[0], family.config["pooled_projection_dim"]),
        timestep=_per_sample(latent, sigma),
        img_ids=ids(h, w, 3),
        txt_ids=torch.zeros(text.shape[1], 3),
        return_dict=False,
    )[0]
    return unpack(out, tuple(latent.shape))


def _chroma(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """Chroma: Flux.1's packing and ids, and the pipeline's attention mask: the caption's (float: its kept tokens and
    the first padding one; here the caption fills its tokens) extended by the image's (bool) ones."""
    b, h, w = latent.shape[0], latent.shape[-2] // 2, latent.shape[-1] // 2
    mask = torch.cat([torch.ones(b, text.shape[1]), torch.ones(b, h * w, dtype=torch.bool)], dim=1)
    out = model(
        hidden_states=pack(latent),
        timestep=_per_sample(latent, sigma),
        encoder_hidden_states=text,
        txt_ids=torch.zeros(text.shape[1], 3),
        img_ids=ids(h, w, 3),
        attention_mask=mask,
        return_dict=False,
    )[0]
    return unpack(out, tuple(latent.shape))


def _flux2(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """Flux.2-dev: packed tokens, integer ids of four axes per sample (image: (0, row, column, 0); text: (0, 0, 0,
    index)), its default embedded guidance 4."""
    b, h, w = latent.shape[0], latent.shape[-2] // 2, latent.shape[-1] // 2
    txt_ids = torch.zeros(text.shape[1], 4, dtype=torch.long)
    txt_ids[:, 3] = torch.arange(text.shape[1])
    out = model(
        hidden_states=pack(latent),
        timestep=_per_sample(latent, sigma),
        guidance=_per_sample(latent, 4.0),
        encoder_hidden_states=text,
        txt_ids=txt_ids.expand(b, -1, -1),
        img_ids=ids(h, w, 4).long().expand(b, -1, -1),
        return_dict=False,
    )[0]
    return unpack(out, tuple(latent.shape))


def _qwen(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """Qwen-Image: packed tokens and their grid as `img_shapes`; the pipeline passes no text mask when the caption
    fills it, and timestep / 1000, the sigma."""
    h, w = latent.shape[-2] // 2, latent.shape[-1] // 2
    out = model(
        hidden_states=pack(latent),
        timestep=_per_sample(latent, sigma),
        encoder_hidden_states_mask=None,
        encoder_hidden_states=text,
        img_shapes=[[(1, h, w)]] * latent.shape[0],
        return_dict=False,
    )[0]
    return unpack(out, tuple(latent.shape))


def _sd3(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """SD3.5: the latent as it is, the scheduler's timestep (sigma * 1000)."""
    return model(
        hidden_states=latent,
        timestep=_per_sample(latent, sigma * 1000),
        encoder_hidden_states=text,
        pooled_projections=torch.zeros(latent.shape[0], family.config["pooled_projection_dim"]),
        return_dict=False,
    )[0]


def _wan(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """Wan: the video latent as it is, the scheduler's timestep (sigma * 1000)."""
    return model(
        hidden_states=latent, timestep=_per_sample(latent, sigma * 1000), encoder_hidden_states=text, return_dict=False
    )[0]


def _hunyuanvideo(
    model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor
) -> torch.Tensor:
    """HunyuanVideo: the video latent as it is, the scheduler's timestep (sigma * 1000), the text's mask (the caption
    fills its tokens), pooled CLIP states (zeros, as Flux.1's stand-in feeds them) and the pipeline's embedded guidance
    (its default 6, times 1000); the pipeline steps with the output as it is."""
    b = latent.shape[0]
    return model(
        hidden_states=latent,
        timestep=_per_sample(latent, sigma * 1000),
        encoder_hidden_states=text,
        encoder_attention_mask=torch.ones(b, text.shape[1]),
        pooled_projections=torch.zeros(b, family.config["pooled_projection_dim"]),
        guidance=_per_sample(latent, 6.0 * 1000),
        return_dict=False,
    )[0]


#: LTX-Video's VAE: latent frames and pixels per latent cell, and the pipelines' default frame rate.
LTX_SCALE = (8, 32, 32)
LTX_FRAME_RATE = 25


def _ltx(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """LTX-Video (text-to-video): the latent packed into tokens [B, F*H*W, C] (patch 1), the latent's frames, rows
    and columns with the pipeline's `rope_interpolation_scale` (8 / frame rate, 32, 32), the scheduler's timestep
    (sigma * 1000), the text's mask; the pipeline steps with the output as it is."""
    b, c, f, h, w = latent.shape
    out = model(
        hidden_states=latent.permute(0, 2, 3, 4, 1).reshape(b, f * h * w, c),
        encoder_hidden_states=text,
        timestep=_per_sample(latent, sigma * 1000),
        encoder_attention_mask=torch.ones(b, text.shape[1]),
        num_frames=f,
        height=h,
        width=w,
        rope_interpolation_scale=(LTX_SCALE[0] / LTX_FRAME_RATE, LTX_SCALE[1], LTX_SCALE[2]),
        return_dict=False,
    )[0]
    return out.view(b, f, h, w, c).permute(0, 4, 1, 2, 3)


#: LTX-2's pipelines' default frame rate, and its audio latent frames per second (16 kHz, hop 160, 4x in time).
LTX2_FRAME_RATE = 24.0
LTX2_AUDIO_RATE = 16000 / 160 / 4


def ltx2_audio(family: Family, sigma: float, batch: int) -> torch.Tensor:
    """LTX-2's audio latent [B, frames, channels] at `sigma`, for as long as the video (its pixel frames at
    LTX2_FRAME_RATE): on the straight path from a fixed noise to a fixed natural-spectrum latent (seed 0). The stand-in
    generates the video; the audio stream runs beside it as if denoised along with it, and is never reduced."""
    frames = (family.latent[1] - 1) * LTX_SCALE[0] + 1
    length = round(frames / LTX2_FRAME_RATE * LTX2_AUDIO_RATE)
    g = torch.Generator().manual_seed(0)
    channels = family.config["audio_in_channels"]
    noise = torch.randn(1, length, channels, generator=g)
    clean = natural_latent((1, channels, length, 1), g).view(1, channels, length).transpose(1, 2)
    return ((1 - sigma) * clean + sigma * noise).expand(batch, -1, -1)


def _ltx2(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """LTX-2 (text-to-video with its audio): the video latent packed as LTX-Video's, its frames, rows and columns at
    the pipeline's frame rate (24), the scheduler's timestep (sigma * 1000, passed as `sigma` too, as the pipeline
    does), the same text states for video and audio, the audio latent beside it (`ltx2_audio`); the pipeline's
    x0 conversions undo each other: it steps with the video output as it is."""
    b, c, f, h, w = latent.shape
    audio = ltx2_audio(family, sigma, b)
    mask = torch.ones(b, text.shape[1])
    out = model(
        hidden_states=latent.permute(0, 2, 3, 4, 1).reshape(b, f * h * w, c),
        audio_hidden_states=audio,
        encoder_hidden_states=text,
        audio_encoder_hidden_states=text,
        timestep=_per_sample(latent, sigma * 1000),
        sigma=_per_sample(latent, sigma * 1000),
        encoder_attention_mask=mask,
        audio_encoder_attention_mask=mask,
        num_frames=f,
        height=h,
        width=w,
        fps=LTX2_FRAME_RATE,
        audio_num_frames=audio.shape[1],
        return_dict=False,
    )[0]
    return out.view(b, f, h, w, c).permute(0, 4, 1, 2, 3)


def _zimage(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """Z-Image: lists of latents [C, 1, H, W] and of captions (their kept tokens); its time rises from noise to image
    ((1000 - t) / 1000 = 1 - sigma) and the pipeline steps with the output negated."""
    out = model([x.unsqueeze(1) for x in latent], _per_sample(latent, 1.0 - sigma), list(text), return_dict=False)[0]
    return -torch.stack(out).squeeze(2)


def _lumina2(model: nn.Module, family: Family, latent: torch.Tensor, sigma: float, text: torch.Tensor) -> torch.Tensor:
    """Lumina 2: the latent as it is, the tokenizer's caption mask; its time rises (1 - sigma) and the pipeline steps
    with the output negated."""
    out = model(
        hidden_states=latent,
        timestep=_per_sample(latent, 1.0 - sigma),
        encoder_hidden_states=text,
        encoder_attention_mask=torch.ones(latent.shape[0], text.shape[1], dtype=torch.long),
        return_dict=False,
    )[0]
    return -out


#: 384 px images (a 24 x 24 grid of tokens: packed 2x2 patches of a 48 x 48 latent, or patch 2 on it), 32 text tokens,
#: about three heads of the real head width and few blocks (the real ratio of block kinds where practical), so that
#: one call takes about a second on one CPU thread.
_IMAGE = (16, 48, 48)
#: Flux.1's blocks, which Chroma shares (4 double-stream and 8 single-stream blocks, three heads of 128).
_FLUX_BLOCKS = MappingProxyType(
    {
        "patch_size": 1,
        "in_channels": 64,
        "num_layers": 4,
        "num_single_layers": 8,
        "attention_head_dim": 128,
        "num_attention_heads": 3,
        "joint_attention_dim": 128,
        "axes_dims_rope": (16, 56, 56),
    }
)
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "flux",
            "FluxTransformer2DModel",
            {**_FLUX_BLOCKS, "pooled_projection_dim": 64},
            _IMAGE,
            32,
            "joint_attention_dim",
            128,
            _flux,
        ),
        Family(
            "chroma",
            "ChromaTransformer2DModel",
            {
                **_FLUX_BLOCKS,
                "approximator_num_channels": 64,
                "approximator_hidden_dim": 384,
                "approximator_layers": 5,
            },
            _IMAGE,
            32,
            "joint_attention_dim",
            128,
            _chroma,
        ),
        Family(
            "flux2",
            "Flux2Transformer2DModel",
            {
                "patch_size": 1,
                "in_channels": 128,
                "num_layers": 2,
                "num_single_layers": 10,
                "attention_head_dim": 128,
                "num_attention_heads": 3,
                "joint_attention_dim": 128,
                "timestep_guidance_channels": 256,
                "mlp_ratio": 3.0,
                "axes_dims_rope": (32, 32, 32, 32),
            },
            (32, 48, 48),  # Flux.2's VAE: 32 channels
            32,
            "joint_attention_dim",
            128,
            _flux2,
        ),
        Family(
            "qwen",
            "QwenImageTransformer2DModel",
            {
                "patch_size": 2,
                "in_channels": 64,
                "out_channels": 16,
                "num_layers": 12,
                "attention_head_dim": 128,
                "num_attention_heads": 3,
                "joint_attention_dim": 128,
                "axes_dims_rope": (16, 56, 56),
            },
            _IMAGE,
            32,
            "joint_attention_dim",
            128,
            _qwen,
        ),
        Family(
            "zimage",
            "ZImageTransformer2DModel",
            {
                "all_patch_size": (2,),
                "all_f_patch_size": (1,),
                "in_channels": 16,
                "dim": 384,
                "n_layers": 12,
                "n_refiner_layers": 2,
                "n_heads": 3,
                "n_kv_heads": 3,
                "qk_norm": True,
                "cap_feat_dim": 128,
                "rope_theta": 256.0,
                "t_scale": 1000.0,
                "axes_dims": (32, 48, 48),
                "axes_lens": (1536, 512, 512),
            },
            _IMAGE,
            32,
            "cap_feat_dim",
            128,
            _zimage,
            text_at="last",
        ),
        Family(
            "lumina2",
            "Lumina2Transformer2DModel",
            {
                "sample_size": 128,
                "patch_size": 2,
                "in_channels": 16,
                "hidden_size": 288,
                "num_layers": 12,
                "num_refiner_layers": 2,
                "num_attention_heads": 3,
                "num_kv_heads": 1,  # Lumina 2's three query heads per key head
                "multiple_of": 256,
                "norm_eps": 1e-5,
                "axes_dim_rope": (32, 32, 32),
                "axes_lens": (300, 512, 512),
                "cap_feat_dim": 128,
            },
            _IMAGE,
            32,
            "cap_feat_dim",
            96,
            _lumina2,
            # Lumina 2 embeds a time in [0, 1] with sinusoids of periods 2 pi to 2 pi * 10^4: with random weights its
            # output hardly depends on the time (one call at sigma 0.2 against 0.5: 1.7% apart, 22-59% in the other
            # families) and dropping a step moved a generation by 0.1%. Read 1000x, as Z-Image's model scales the
            # same [0, 1] time (`t_scale`).
            time_scale=("time_caption_embed.time_proj", 1000.0),
        ),
        Family(
            "sd3",
            "SD3Transformer2DModel",
            {
                "sample_size": 128,
                "patch_size": 2,
                "in_channels": 16,
                "num_layers": 12,
                "attention_head_dim": 64,
                "num_attention_heads": 3,
                "joint_attention_dim": 128,
                "caption_projection_dim": 192,
                "pooled_projection_dim": 64,
                "out_channels": 16,
                "pos_embed_max_size": 192,
                "qk_norm": "rms_norm",  # SD3.5's (SD3's attention has none)
            },
            _IMAGE,
            32,
            "joint_attention_dim",
            64,
            _sd3,
            text_at="last",
        ),
        Family(
            "wan",
            "WanTransformer3DModel",
            {
                "patch_size": (1, 2, 2),
                "num_attention_heads": 3,
                "attention_head_dim": 128,
                "in_channels": 16,
                "out_channels": 16,
                "text_dim": 128,
                "freq_dim": 256,
                "ffn_dim": 1024,
                "num_layers": 8,
                "cross_attn_norm": True,
                "qk_norm": "rms_norm_across_heads",
                "rope_max_seq_len": 1024,
            },
            (16, 5, 24, 40),  # 17 frames at 320 x 192 px: 5 x 12 x 20 tokens
            32,
            "text_dim",
            128,
            _wan,
            text_at="cross",
        ),
        Family(
            "hunyuanvideo",
            "HunyuanVideoTransformer3DModel",
            {
                "in_channels": 16,
                "out_channels": 16,
                "num_attention_heads": 3,
                "attention_head_dim": 128,
                "num_layers": 3,  # HunyuanVideo's 20 double-stream and 40 single-stream blocks: 1 to 2
                "num_single_layers": 6,
                "num_refiner_layers": 2,
                "patch_size": 2,
                "patch_size_t": 1,
                "text_embed_dim": 128,
                "pooled_projection_dim": 64,
                "rope_theta": 256.0,
                "rope_axes_dim": (16, 56, 56),
            },
            (16, 5, 24, 40),  # 17 frames at 320 x 192 px (its VAE: 4x in time, 8x in space): 5 x 12 x 20 tokens
            32,
            "text_embed_dim",
            128,
            _hunyuanvideo,
            text_at="last",
        ),
        Family(
            "ltx",
            "LTXVideoTransformer3DModel",
            {
                "in_channels": 128,
                "out_channels": 128,
                "patch_size": 1,
                "patch_size_t": 1,
                "num_attention_heads": 6,  # LTX-Video rotates across its heads: six bands of 64 channels
                "attention_head_dim": 64,
                "cross_attention_dim": 384,
                "num_layers": 8,
                "caption_channels": 128,
            },
            (128, 5, 12, 20),  # 33 frames at 640 x 384 px (its VAE: 8x in time, 32x in space): 5 x 12 x 20 tokens
            32,
            "caption_channels",
            64,
            _ltx,
            patch=1,
            text_at="cross",
        ),
        Family(
            "ltx2",
            "LTX2VideoTransformer3DModel",
            {
                "in_channels": 128,
                "out_channels": 128,
                "patch_size": 1,
                "patch_size_t": 1,
                "num_attention_heads": 3,  # LTX-2's heads of 128, rotated across them as LTX-Video's
                "attention_head_dim": 128,
                "cross_attention_dim": 384,
                "audio_in_channels": 32,
                "audio_out_channels": 32,
                "audio_num_attention_heads": 2,
                "audio_attention_head_dim": 64,
                "audio_cross_attention_dim": 128,
                "num_layers": 8,
                "caption_channels": 128,
            },
            (128, 5, 12, 20),  # 33 frames at 640 x 384 px (LTX-Video's VAE): 5 x 12 x 20 tokens, 34 audio frames
            32,
            "caption_channels",
            128,
            _ltx2,
            patch=1,
            text_at="cross",
        ),
    )
}
