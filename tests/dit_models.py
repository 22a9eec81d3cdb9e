"""Tiny diffusion transformers of every family diffusers has and ToMe reduces, with inputs as their pipelines make
them (random weights, CPU, float32): the real classes at a few blocks and a few dozen channels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Tiny:
    """One family's tiny model, its forward keywords, and where its generated tokens sit."""

    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], dict[str, Any]]  # seed -> forward keywords (timestep included)
    before: int  # tokens ahead of the generated grid in the joint attention sequence (text first)
    grid: tuple[int, int, int]
    after: int  # tokens after it (reference images; text placed last)
    first: int = 0  # the attention call of the first block ToMe reduces (after any text- or image-only refiners)


TEXT = 7  # text tokens of every tiny model
H = W = 8  # patch grid of the tiny images


def _ids(h: int, w: int, index: int = 0, axes: int = 3) -> torch.Tensor:
    """[h*w, axes] position ids as the Flux pipelines make them: (index, row, column) or, with 4 axes, (t, row,
    column, l)."""
    ids = torch.zeros(h * w, axes)
    ids[:, 0] = index
    ids[:, 1] = torch.arange(h).repeat_interleave(w)  # (index or t, row, column[, l]): rows and columns at 1, 2
    ids[:, 2] = torch.arange(w).repeat(h)
    return ids


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def flux(kontext: bool = False) -> Tiny:
    from diffusers import FluxTransformer2DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=16,
            axes_dims_rope=(4, 6, 6),
        ).eval()

    ref = H * W // 4 if kontext else 0

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        ids = _ids(H, W)
        if kontext:
            ids = torch.cat([ids, _ids(H // 2, W // 2, index=1)])
        return {
            "hidden_states": torch.randn(2, H * W + ref, 16, generator=g),
            "encoder_hidden_states": torch.randn(2, TEXT, 32, generator=g),
            "pooled_projections": torch.randn(2, 16, generator=g),
            "timestep": torch.full((2,), 0.5),
            "img_ids": ids,
            "txt_ids": torch.zeros(TEXT, 3),
            "return_dict": False,
        }

    return Tiny("flux", build, inputs, TEXT, (1, H, W), ref)


def chroma() -> Tiny:
    from diffusers import ChromaTransformer2DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return ChromaTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=(4, 6, 6),
            approximator_num_channels=8,
            approximator_hidden_dim=32,
            approximator_layers=1,
        ).eval()

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        return {
            "hidden_states": torch.randn(2, H * W, 16, generator=g),
            "encoder_hidden_states": torch.randn(2, TEXT, 32, generator=g),
            "timestep": torch.full((2,), 0.5),
            "img_ids": _ids(H, W),
            "txt_ids": torch.zeros(TEXT, 3),
            "return_dict": False,
        }

    return Tiny("chroma", build, inputs, TEXT, (1, H, W), 0)


def flux2() -> Tiny:
    from diffusers import Flux2Transformer2DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return Flux2Transformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            timestep_guidance_channels=16,
            axes_dims_rope=(4, 4, 4, 4),
        ).eval()

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        return {
            "hidden_states": torch.randn(2, H * W, 16, generator=g),
            "encoder_hidden_states": torch.randn(2, TEXT, 32, generator=g),
            "timestep": torch.full((2,), 0.5),
            "img_ids": _ids(H, W, axes=4),
            "txt_ids": torch.zeros(TEXT, 4),
            "guidance": torch.full((2,), 4.0),
            "return_dict": False,
        }

    return Tiny("flux2", build, inputs, TEXT, (1, H, W), 0)


def qwen(edit: bool = False) -> Tiny:
    from diffusers import QwenImageTransformer2DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=16,
            out_channels=4,
            num_layers=4,  # Quality and Balanced start past half the depth there
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=(4, 6, 6),
        ).eval()

    ref = H * W // 4 if edit else 0

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        shapes = [(1, H, W)] + ([(1, H // 2, W // 2)] if edit else [])
        return {
            "hidden_states": torch.randn(2, H * W + ref, 16, generator=g),
            "encoder_hidden_states": torch.randn(2, TEXT, 32, generator=g),
            "encoder_hidden_states_mask": torch.ones(2, TEXT),
            "timestep": torch.full((2,), 0.5),
            "img_shapes": [shapes, shapes],
            "return_dict": False,
        }

    return Tiny("qwen", build, inputs, TEXT, (1, H, W), ref)


def zimage() -> Tiny:
    from diffusers import ZImageTransformer2DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return ZImageTransformer2DModel(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=4,
            dim=32,
            n_layers=2,
            n_refiner_layers=1,
            n_heads=2,
            n_kv_heads=2,
            cap_feat_dim=32,
            axes_dims=[4, 6, 6],
            axes_lens=[64, 32, 32],
        ).eval()

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        return {
            "x": [torch.randn(4, 1, 2 * H, 2 * W, generator=g) for _ in range(2)],
            "t": torch.full((2,), 0.5),
            "cap_feats": [torch.randn(TEXT, 32, generator=g) for _ in range(2)],
            "return_dict": False,
        }

    # Image first, then the caption padded to 32 tokens; the first reduced attention follows the two refiners'.
    return Tiny("zimage", build, inputs, 0, (1, H, W), 32, first=2)


def lumina2(captions: tuple[int, int] = (TEXT, TEXT)) -> Tiny:
    """`captions`: the tokens each sample's attention mask keeps (the rest of the TEXT are padding)."""
    from diffusers import Lumina2Transformer2DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return Lumina2Transformer2DModel(
            sample_size=16,
            patch_size=2,
            in_channels=4,
            hidden_size=32,
            num_layers=2,
            num_refiner_layers=1,
            num_attention_heads=2,
            num_kv_heads=1,
            multiple_of=16,
            axes_dim_rope=(4, 6, 6),
            axes_lens=(64, 32, 32),
            cap_feat_dim=32,
        ).eval()

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        mask = torch.zeros(2, TEXT, dtype=torch.bool)
        for i, n in enumerate(captions):
            mask[i, :n] = True
        return {
            "hidden_states": torch.randn(2, 4, 2 * H, 2 * W, generator=g),
            "timestep": torch.full((2,), 0.5),
            "encoder_hidden_states": torch.randn(2, TEXT, 32, generator=g),
            "encoder_attention_mask": mask,
            "return_dict": False,
        }

    # Each sample's caption, then its image, then padding to the longest; the two refiners attend first.
    return Tiny("lumina2", build, inputs, min(captions), (1, H, W), max(captions) - min(captions), first=2)


def sd3() -> Tiny:
    from diffusers import SD3Transformer2DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return SD3Transformer2DModel(
            sample_size=16,
            patch_size=2,
            in_channels=4,
            num_layers=4,  # Quality and Balanced start past half the depth there
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            caption_projection_dim=32,
            pooled_projection_dim=16,
            out_channels=4,
            pos_embed_max_size=32,
        ).eval()

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        return {
            "hidden_states": torch.randn(2, 4, 2 * H, 2 * W, generator=g),
            "encoder_hidden_states": torch.randn(2, TEXT, 32, generator=g),
            "pooled_projections": torch.randn(2, 16, generator=g),
            "timestep": torch.full((2,), 500.0),
            "return_dict": False,
        }

    return Tiny("sd3", build, inputs, 0, (1, H, W), TEXT)


FRAMES = 5  # latent frames of the tiny videos
#: The tiny Wan transformer's config (diffusers' `WanTransformer3DModel`): Wan 2.1 text-to-video's layout.
TINY_WAN: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "in_channels": 4,
    "out_channels": 4,
    "text_dim": 32,
    "freq_dim": 16,
    "ffn_dim": 64,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 64,
}


def wan() -> Tiny:
    from diffusers import WanTransformer3DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return WanTransformer3DModel(**TINY_WAN).eval()

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        return {
            "hidden_states": torch.randn(1, 4, FRAMES, 2 * H, 2 * W, generator=g),
            "timestep": torch.tensor([500.0]),
            "encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
            "return_dict": False,
        }

    # The first latent frame (an image-to-video model's reference image) stays whole.
    return Tiny("wan", build, inputs, H * W, (FRAMES - 1, H, W), 0)


def wan22_i2v() -> Tiny:
    """Wan 2.2 TI2V 5B as diffusers runs its image-to-video: the Wan 2.2 VAE's 48 latent channels (the reference image
    encoded into the first latent frame, not concatenated) and, with the pipelines' `expand_timesteps`, a timestep
    per token [B, F*H*W] that is 0 on the first frame's tokens at every step and t on the others."""
    from diffusers import WanTransformer3DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return WanTransformer3DModel(**{**TINY_WAN, "in_channels": 48, "out_channels": 48}).eval()

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        return {
            "hidden_states": torch.randn(1, 48, FRAMES, 2 * H, 2 * W, generator=g),
            "timestep": expanded_timestep(500.0, 1, FRAMES, H * W),
            "encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
            "return_dict": False,
        }

    return Tiny("wan", build, inputs, H * W, (FRAMES - 1, H, W), 0)


def expanded_timestep(t: float, batch: int, frames: int, cells: int) -> torch.Tensor:
    """[batch, frames * cells] as diffusers' Wan pipelines build it with `expand_timesteps` for image-to-video: the
    first latent frame's tokens (the reference image, kept clean) get 0, every other token t."""
    mask = torch.ones(frames, cells)
    mask[0] = 0
    return (mask * t).flatten().unsqueeze(0).expand(batch, -1)


#: name -> its tiny model
TINY: dict[str, Callable[[], Tiny]] = {
    "flux": flux,
    "flux-kontext": lambda: flux(kontext=True),
    "chroma": chroma,
    "flux2": flux2,
    "qwen": qwen,
    "qwen-edit": lambda: qwen(edit=True),
    "zimage": zimage,
    "lumina2": lumina2,
    "sd3": sd3,
    "wan": wan,
    "wan22-i2v": wan22_i2v,
}


def run(model: nn.Module, tiny: Tiny, seed: int = 0, **changes: Any) -> torch.Tensor:
    with torch.no_grad():
        out = model(**{**tiny.inputs(seed), **changes})[0]
    return torch.stack(out) if isinstance(out, list) else out  # Z-Image: one latent per sample


# ---------------------------------------------------------------------------------------------- HunyuanVideo, LTX


def hunyuanvideo(i2v: bool = False) -> Tiny:
    """HunyuanVideo: the video's patch tokens first, then the refined text (its last two tokens padding, masked);
    a double-stream block, then single-stream ones. `i2v`: HunyuanVideo-I2V's token replacement (the first latent
    frame holds the reference image, modulated as at timestep 0)."""
    from diffusers import HunyuanVideoTransformer3DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return HunyuanVideoTransformer3DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=16,
            num_layers=1,
            num_single_layers=2,
            num_refiner_layers=1,
            patch_size=2,
            patch_size_t=1,
            text_embed_dim=32,
            pooled_projection_dim=16,
            rope_axes_dim=(4, 6, 6),
            image_condition_type="token_replace" if i2v else None,
        ).eval()

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        mask = torch.ones(1, TEXT)
        mask[:, -2:] = 0
        return {
            "hidden_states": torch.randn(1, 4, FRAMES, 2 * H, 2 * W, generator=g),
            "timestep": torch.tensor([500.0]),
            "encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
            "encoder_attention_mask": mask,
            "pooled_projections": torch.randn(1, 16, generator=g),
            "guidance": torch.tensor([6000.0]),
            "return_dict": False,
        }

    # The first latent frame stays whole; the token refiner's attention over the text alone runs first.
    return Tiny("hunyuanvideo", build, inputs, H * W, (FRAMES - 1, H, W), TEXT, first=1)


HV15_BYT5, HV15_IMAGE = 3, 4  # the tiny HunyuanVideo 1.5's ByT5 tokens and image-embedding tokens


def hunyuanvideo15() -> Tiny:
    """HunyuanVideo 1.5 image-to-video: the video's patch tokens (patch 1) first, then the image embedding's,
    ByT5's and the text's tokens the model joins per sample (valid first, the text's last two padding)."""
    from diffusers import HunyuanVideo15Transformer3DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return HunyuanVideo15Transformer3DModel(
            in_channels=9,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=16,
            num_layers=2,
            num_refiner_layers=1,
            patch_size=1,
            patch_size_t=1,
            text_embed_dim=32,
            text_embed_2_dim=24,
            image_embed_dim=16,
            rope_axes_dim=(4, 6, 6),
        ).eval()

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        mask = torch.ones(1, TEXT)
        mask[:, -2:] = 0
        return {
            "hidden_states": torch.randn(1, 9, FRAMES, H, W, generator=g),
            "timestep": torch.tensor([500.0]),
            "encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
            "encoder_attention_mask": mask,
            "encoder_hidden_states_2": torch.randn(1, HV15_BYT5, 24, generator=g),
            "encoder_attention_mask_2": torch.ones(1, HV15_BYT5),
            "image_embeds": torch.randn(1, HV15_IMAGE, 16, generator=g),
            "return_dict": False,
        }

    return Tiny("hunyuanvideo15", build, inputs, H * W, (FRAMES - 1, H, W), HV15_IMAGE + HV15_BYT5 + TEXT, first=1)


LTX_SCALE = (8, 32, 32)  # the LTX VAEs' frames and pixels per latent cell
FRAME_RATE = 25


def ltx_coords(frames: int, h: int, w: int, frame_index: int = 0) -> torch.Tensor:
    """[3, frames * h * w] (frame, row, column) of latent tokens as LTX-Video's condition pipeline places them, in
    pixels (a latent frame counts from the causal VAE's one-frame first frame), a condition at `frame_index` later."""
    grid = torch.stack(torch.meshgrid(torch.arange(frames), torch.arange(h), torch.arange(w), indexing="ij"))
    coords = grid.flatten(1).float() * torch.tensor(LTX_SCALE, dtype=torch.float32)[:, None]
    coords[0] = (coords[0] + 1 - LTX_SCALE[0]).clamp(min=0) + frame_index
    return coords


def ltx(condition: bool = False) -> Tiny:
    """LTX-Video: packed video tokens alone in self-attention (`attn1`), the text in cross-attention (`attn2`);
    image-to-video's first frame at timestep 0 (a timestep per token). `condition`: the condition pipeline, a latent
    frame conditioning frame 16 ahead of the video's tokens, placed by `video_coords` (no `num_frames`)."""
    from diffusers import LTXVideoTransformer3DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return LTXVideoTransformer3DModel(
            in_channels=8,
            out_channels=8,
            num_attention_heads=2,
            attention_head_dim=16,
            cross_attention_dim=32,
            num_layers=2,
            caption_channels=32,
        ).eval()

    extra = H * W if condition else 0

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        tokens = extra + FRAMES * H * W
        timestep = torch.full((1, tokens), 500.0)
        timestep[:, : extra + H * W] = 0  # the condition and the image's first frame stay clean
        kwargs: dict[str, Any] = {
            "hidden_states": torch.randn(1, tokens, 8, generator=g),
            "encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
            "timestep": timestep,
            "encoder_attention_mask": torch.ones(1, TEXT),
            "return_dict": False,
        }
        if condition:
            coords = torch.cat([ltx_coords(1, H, W, frame_index=16), ltx_coords(FRAMES, H, W)], dim=1)
            coords[0] = coords[0] / FRAME_RATE
            kwargs["video_coords"] = coords.unsqueeze(0)
        else:
            scale = (LTX_SCALE[0] / FRAME_RATE, LTX_SCALE[1], LTX_SCALE[2])
            kwargs.update(num_frames=FRAMES, height=H, width=W, rope_interpolation_scale=scale)
        return kwargs

    return Tiny("ltx", build, inputs, extra + H * W, (FRAMES - 1, H, W), 0)


AUDIO = 6  # the tiny LTX-2's audio latent frames


def ltx2(keyframe: bool = False) -> Tiny:
    """LTX-2: video and audio streams, each with its self-attention and cross-attention to the text, and attention
    between them; only the video's self-attention (`attn1`) is reduced. `keyframe`: one latent frame of a keyframe
    appended after the video's tokens (LTX-2's condition pipeline), kept whole."""
    from diffusers import LTX2VideoTransformer3DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return LTX2VideoTransformer3DModel(
            in_channels=8,
            out_channels=8,
            num_attention_heads=2,
            attention_head_dim=16,
            cross_attention_dim=32,
            audio_in_channels=4,
            audio_out_channels=4,
            audio_num_attention_heads=2,
            audio_attention_head_dim=8,
            audio_cross_attention_dim=16,
            num_layers=2,
            caption_channels=32,
        ).eval()

    extra = H * W if keyframe else 0

    def inputs(seed: int) -> dict[str, Any]:
        g = _gen(seed)
        tokens = FRAMES * H * W + extra
        timestep = torch.full((1, tokens), 500.0)
        timestep[:, : H * W] = 0  # image-to-video: the first frame clean
        timestep[:, FRAMES * H * W :] = 0
        return {
            "hidden_states": torch.randn(1, tokens, 8, generator=g),
            "audio_hidden_states": torch.randn(1, AUDIO, 4, generator=g),
            "encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
            "audio_encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
            "timestep": timestep,
            "audio_timestep": torch.tensor([500.0]),
            "sigma": torch.tensor([0.5]),
            "encoder_attention_mask": torch.ones(1, TEXT),
            "audio_encoder_attention_mask": torch.ones(1, TEXT),
            "num_frames": FRAMES,
            "height": H,
            "width": W,
            "audio_num_frames": AUDIO,
            "video_coords": ltx2_coords(extra) if keyframe else None,
            "return_dict": False,
        }

    return Tiny("ltx2", build, inputs, H * W, (FRAMES - 1, H, W), extra)


def ltx2_coords(extra: int) -> torch.Tensor:
    """[1, 3, L, 2] the (start, end) pixel coordinates of the video's tokens, then of a keyframe's one latent frame
    (at frame 16) appended after them, as LTX-2's condition pipeline passes them."""
    video = ltx_coords(FRAMES, H, W)
    key = ltx_coords(extra // (H * W), H, W, frame_index=16)
    start = torch.cat([video, key], dim=1)
    end = start + torch.tensor([1.0, LTX_SCALE[1], LTX_SCALE[2]])[:, None]
    coords = torch.stack([start, end], dim=-1)
    coords[0] = coords[0] / FRAME_RATE
    return coords.unsqueeze(0)


TINY.update(
    {
        "hunyuanvideo": hunyuanvideo,
        "hunyuanvideo-i2v": lambda: hunyuanvideo(i2v=True),
        "hunyuanvideo15": hunyuanvideo15,
        "ltx": ltx,
        "ltx-condition": lambda: ltx(condition=True),
        "ltx2": ltx2,
        "ltx2-keyframe": lambda: ltx2(keyframe=True),
    }
)
