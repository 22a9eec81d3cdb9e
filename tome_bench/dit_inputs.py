"""One sampler step's inputs for each diffusion transformer family's full-size architecture (`tome_bench.dit_archs`),
as the family's diffusers pipeline makes them, at a size (width, height, frames in pixels) and batch: on the meta
device for the estimate, random on a GPU for the GPU job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Size = tuple[int, int, int]  # width, height, frames (1 for an image)


def ids(h: int, w: int, axes: int) -> torch.Tensor:
    """Position ids as the Flux pipelines make them: (0, row, column) or (0, row, column, 0). On the CPU for a
    meta-device trace: on the meta device nothing could read the grid from them. The rotary embedding made from them
    then moves to the meta device inside each attention, two copies a GPU run does not have, traced for the
    unpatched and the patched call alike (Flux.1-dev at 1024 px: 114 of ~4,000 launching operations, ~0.2% of the
    estimated GPU time)."""
    ids = torch.zeros(h, w, axes)
    ids[..., 1] = torch.arange(h).view(-1, 1)
    ids[..., 2] = torch.arange(w).view(1, -1)
    return ids.view(h * w, axes)


def packed(channels: int, text: int, text_dim: int, axes: int, pooled: int | None, guidance: bool) -> Callable:
    """Packed 2x2 patches of a 16x-downsampling latent (Flux.1, Flux.2, Chroma): h = height / 16."""

    def make(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
        h, w = size[1] // 16, size[0] // 16
        out = {
            "hidden_states": torch.randn(batch, h * w, channels, device=device, dtype=dtype),
            "encoder_hidden_states": torch.randn(batch, text, text_dim, device=device, dtype=dtype),
            "timestep": torch.full((batch,), 0.5, device=device, dtype=dtype),
            "img_ids": ids(h, w, axes) if device == "meta" else ids(h, w, axes).to(device),
            "txt_ids": torch.zeros(text, axes, device="cpu" if device == "meta" else device),
            "return_dict": False,
        }
        if pooled is not None:
            out["pooled_projections"] = torch.randn(batch, pooled, device=device, dtype=dtype)
        if guidance:
            out["guidance"] = torch.full((batch,), 3.5, device=device, dtype=dtype)
        return out

    return make


def qwen(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    h, w, text = size[1] // 16, size[0] // 16, 256
    return {
        "hidden_states": torch.randn(batch, h * w, 64, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, text, 3584, device=device, dtype=dtype),
        "encoder_hidden_states_mask": torch.ones(batch, text, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 0.5, device=device, dtype=dtype),
        "img_shapes": [[(1, h, w)]] * batch,
        "return_dict": False,
    }


def sd3(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    return {
        "hidden_states": torch.randn(batch, 16, size[1] // 8, size[0] // 8, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 333, 4096, device=device, dtype=dtype),
        "pooled_projections": torch.randn(batch, 2048, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 500.0, device=device, dtype=dtype),
        "return_dict": False,
    }


def wan(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    frames = (size[2] - 1) // 4 + 1  # Wan's VAE: the first frame alone, then four per latent frame
    return {
        "hidden_states": torch.randn(batch, 16, frames, size[1] // 8, size[0] // 8, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 500.0, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 512, 4096, device=device, dtype=dtype),
        "return_dict": False,
    }


def wan22(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """Wan 2.2 TI2V 5B: the Wan 2.2 VAE (48 channels, 16x in space, 4x in time) and, as its pipelines run it
    (`expand_timesteps`), one timestep per token [B, F*H*W] (at t: text-to-video, or image-to-video's step past the
    first frame, whose tokens are at 0)."""
    frames, h, w = (size[2] - 1) // 4 + 1, size[1] // 16, size[0] // 16
    return {
        "hidden_states": torch.randn(batch, 48, frames, h, w, device=device, dtype=dtype),
        "timestep": torch.full((batch, frames * (h // 2) * (w // 2)), 500.0, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 512, 4096, device=device, dtype=dtype),
        "return_dict": False,
    }


def zimage(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """Z-Image's pipeline: one latent [C, 1, H, W] and one caption (its kept tokens) per sample, in lists."""
    return {
        "x": [torch.randn(16, 1, size[1] // 8, size[0] // 8, device=device, dtype=dtype) for _ in range(batch)],
        "t": torch.full((batch,), 0.5, device=device, dtype=dtype),
        "cap_feats": [torch.randn(256, 2560, device=device, dtype=dtype) for _ in range(batch)],
        "return_dict": False,
    }


def lumina2(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """Lumina 2's pipeline: Gemma's 256 caption tokens and their mask. The mask on the CPU for a meta trace: the model
    reads the captions' lengths back from it."""
    return {
        "hidden_states": torch.randn(batch, 16, size[1] // 8, size[0] // 8, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 0.5, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 256, 2304, device=device, dtype=dtype),
        "encoder_attention_mask": torch.ones(
            batch, 256, dtype=torch.bool, device="cpu" if device == "meta" else device
        ),
        "return_dict": False,
    }


def hunyuan_video(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """HunyuanVideo: its VAE 8x in space, 4x in time (the first frame alone); LLaVA's text, up to 256 tokens; the
    guidance embedded (6.0, as the pipeline passes it: x1000), one call a step."""
    frames, h, w = (size[2] - 1) // 4 + 1, size[1] // 8, size[0] // 8
    return {
        "hidden_states": torch.randn(batch, 16, frames, h, w, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 500.0, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 256, 4096, device=device, dtype=dtype),
        "encoder_attention_mask": torch.ones(batch, 256, device=device, dtype=dtype),
        "pooled_projections": torch.randn(batch, 768, device=device, dtype=dtype),
        "guidance": torch.full((batch,), 6000.0, device=device, dtype=dtype),
        "return_dict": False,
    }


def hunyuan_video15(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """HunyuanVideo 1.5: its VAE 16x in space, 4x in time, patch 1; Qwen2.5-VL's text (up to 1000 tokens), ByT5's
    (256) and SigLIP's image embedding (729 tokens) after the video."""
    frames, h, w = (size[2] - 1) // 4 + 1, size[1] // 16, size[0] // 16
    return {
        "hidden_states": torch.randn(batch, 65, frames, h, w, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 500.0, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 1000, 3584, device=device, dtype=dtype),
        "encoder_attention_mask": torch.ones(batch, 1000, device=device, dtype=dtype),
        "encoder_hidden_states_2": torch.randn(batch, 256, 1472, device=device, dtype=dtype),
        "encoder_attention_mask_2": torch.ones(batch, 256, device=device, dtype=dtype),
        "image_embeds": torch.randn(batch, 729, 1152, device=device, dtype=dtype),
        "return_dict": False,
    }


def ltx(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """LTX-Video: its VAE 32x in space, 8x in time (the first frame alone), patch 1, packed; T5's text, 128 tokens."""
    frames, h, w = (size[2] - 1) // 8 + 1, size[1] // 32, size[0] // 32
    return {
        "hidden_states": torch.randn(batch, frames * h * w, 128, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 128, 4096, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 500.0, device=device, dtype=dtype),
        "encoder_attention_mask": torch.ones(batch, 128, device=device, dtype=dtype),
        "num_frames": frames,
        "height": h,
        "width": w,
        "rope_interpolation_scale": (8 / 25, 32, 32),
        "return_dict": False,
    }


def ltx2(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """LTX-2: LTX's video latent and, beside it, the audio's (25 latent frames a second at 24 fps video); Gemma 3's
    text through the pipeline's connectors (1024 tokens, one for each stream)."""
    frames, h, w = (size[2] - 1) // 8 + 1, size[1] // 32, size[0] // 32
    audio = round(size[2] / 24 * 25)
    return {
        "hidden_states": torch.randn(batch, frames * h * w, 128, device=device, dtype=dtype),
        "audio_hidden_states": torch.randn(batch, audio, 128, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 1024, 3840, device=device, dtype=dtype),
        "audio_encoder_hidden_states": torch.randn(batch, 1024, 3840, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 500.0, device=device, dtype=dtype),
        "sigma": torch.full((batch,), 0.5, device=device, dtype=dtype),
        "encoder_attention_mask": torch.ones(batch, 1024, device=device, dtype=dtype),
        "audio_encoder_attention_mask": torch.ones(batch, 1024, device=device, dtype=dtype),
        "num_frames": frames,
        "height": h,
        "width": w,
        "fps": 24.0,
        "audio_num_frames": audio,
        "return_dict": False,
    }
