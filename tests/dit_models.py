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


def wan() -> Tiny:
    from diffusers import WanTransformer3DModel

    def build() -> nn.Module:
        torch.manual_seed(0)
        return WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=16,
            in_channels=4,
            out_channels=4,
            text_dim=32,
            freq_dim=16,
            ffn_dim=64,
            num_layers=2,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=64,
        ).eval()

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
}


def run(model: nn.Module, tiny: Tiny, seed: int = 0, **changes: Any) -> torch.Tensor:
    with torch.no_grad():
        out = model(**{**tiny.inputs(seed), **changes})[0]
    return torch.stack(out) if isinstance(out, list) else out  # Z-Image: one latent per sample
