"""The diffusion transformers' full-size public architectures, for the GPU estimate (meta device) and the GPU job.

Each `DitArch` builds the diffusers class with the published checkpoint's config (no weights: on the meta device
for the estimate, random on a GPU) and makes one sampler step's inputs as the family's diffusers pipeline does, at
the batch it samples with (guidance-distilled Flux and the pipelines that run cond and uncond apart: 1; SD3.5's
classifier-free guidance: 2). Sizes are (width, height[, frames]) in pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tome_bench import dit_inputs
from tome_bench.dit_inputs import Size


@dataclass(frozen=True)
class DitArch:
    """One family's public architecture: its diffusers class and config, inputs per size, and the sizes users run."""

    name: str
    family: str  # the preset family (tome_core.families)
    label: str
    cls: str  # the diffusers class
    config: dict[str, Any]
    make_inputs: Callable[[Size, int, torch.device | str, torch.dtype], dict[str, Any]]
    batch: int
    sizes: tuple[Size, ...]  # what the speed table holds

    def build(self, device: torch.device | str = "meta", dtype: torch.dtype = torch.float16) -> nn.Module:
        import diffusers

        with torch.device(device):
            model = getattr(diffusers, self.cls)(**self.config)
        return model.to(dtype).eval().requires_grad_(False)

    def inputs(self, size: Size, device: torch.device | str = "meta", dtype: torch.dtype = torch.float16) -> dict:
        return self.make_inputs(size, self.batch, device, dtype)


# Sizes ordered as the speed table's rows: width, height, frames. Each family's span from 512 px (below it a figure
# is an "at most" bound) to its largest common size, with the portrait Flux users run (768x1344), so that the
# sizes people generate at are interpolated between two rows rather than bounded by one.
_SMALL = (512, 512, 1)
_PORTRAIT = (768, 1344, 1)
_SQUARE = (_SMALL, (1024, 1024, 1), (1328, 1328, 1))
_LARGE = (_SMALL, (1024, 1024, 1), (1536, 1536, 1), (2048, 2048, 1))
#: Wan: 320x320 9-frame drafts, 480p at 33, 49 and 81 frames, 720p at 33 and 81, and 1280x704 at 121 frames (Wan
#: 2.2 TI2V 5B's size, priced on the 14B: the table's rows are one architecture's, see `TABLE_ARCH`).
_VIDEO = (
    (320, 320, 9),
    (832, 480, 33),
    (832, 480, 49),
    (832, 480, 81),
    (1280, 704, 121),
    (1280, 720, 33),
    (1280, 720, 81),
)

#: HunyuanVideo: 960x544 and 1280x720 at 129 frames (the model card's), 720p at 61, and 480p at 61 (the short drafts
#: people make on smaller cards); HunyuanVideo 1.5: 480p and 720p at 121 frames. LTX: 768x512 to 1280x720 at 121
#: frames (LTX-2: 1920x1088 too), and 768x512 at 65 frames.
HUNYUAN_SIZES = ((848, 480, 61), (960, 544, 129), (1280, 720, 61), (1280, 720, 129))
HUNYUAN15_SIZES = ((848, 480, 121), (1280, 720, 121))
LTX_SIZES = ((768, 512, 65), (768, 512, 121), (1216, 704, 121), (1280, 720, 121))
LTX2_SIZES = ((768, 512, 65), (768, 512, 121), (1280, 720, 121), (1920, 1088, 121))
#: Wan 2.2 TI2V 5B: 480p at 33, 49 and 81 frames and its own 1280x704 at 49, 81 and 121 (its model card's size).
WAN22_5B_SIZES = ((832, 480, 33), (832, 480, 49), (832, 480, 81), (1280, 704, 49), (1280, 704, 81), (1280, 704, 121))
#: The full-size public configs (each checkpoint's transformer/config.json).
DIT_ARCHS: dict[str, DitArch] = {
    arch.name: arch
    for arch in (
        DitArch(
            "flux-dev",
            "flux",
            "Flux.1-dev",
            "FluxTransformer2DModel",
            {
                "patch_size": 1,
                "in_channels": 64,
                "num_layers": 19,
                "num_single_layers": 38,
                "attention_head_dim": 128,
                "num_attention_heads": 24,
                "joint_attention_dim": 4096,
                "pooled_projection_dim": 768,
                "guidance_embeds": True,
                "axes_dims_rope": (16, 56, 56),
            },
            dit_inputs.packed(64, 512, 4096, 3, 768, True),
            1,
            (_SMALL, _PORTRAIT, *_LARGE[1:]),
        ),
        DitArch(
            "chroma",
            "chroma",
            "Chroma1-HD",
            "ChromaTransformer2DModel",
            {
                "patch_size": 1,
                "in_channels": 64,
                "num_layers": 19,
                "num_single_layers": 38,
                "attention_head_dim": 128,
                "num_attention_heads": 24,
                "joint_attention_dim": 4096,
                "axes_dims_rope": (16, 56, 56),
                "approximator_num_channels": 64,
                "approximator_hidden_dim": 5120,
                "approximator_layers": 5,
            },
            dit_inputs.packed(64, 512, 4096, 3, None, False),
            2,
            (_SMALL, _PORTRAIT, *_LARGE[1:3]),
        ),
        DitArch(
            "flux2-dev",
            "flux2",
            "Flux.2-dev",
            "Flux2Transformer2DModel",
            {
                "patch_size": 1,
                "in_channels": 128,
                "num_layers": 8,
                "num_single_layers": 48,
                "attention_head_dim": 128,
                "num_attention_heads": 48,
                "joint_attention_dim": 15360,
                "timestep_guidance_channels": 256,
                "mlp_ratio": 3.0,
                "axes_dims_rope": (32, 32, 32, 32),
            },
            dit_inputs.packed(128, 512, 15360, 4, None, True),
            1,
            (_SMALL, _PORTRAIT, *_SQUARE[1:]),
        ),
        DitArch(
            "qwen-image",
            "qwen",
            "Qwen-Image",
            "QwenImageTransformer2DModel",
            {
                "patch_size": 2,
                "in_channels": 64,
                "out_channels": 16,
                "num_layers": 60,
                "attention_head_dim": 128,
                "num_attention_heads": 24,
                "joint_attention_dim": 3584,
                "axes_dims_rope": (16, 56, 56),
            },
            dit_inputs.qwen,
            1,
            (*_SQUARE, (1664, 928, 1)),
        ),
        DitArch(
            "z-image-turbo",
            "zimage",
            "Z-Image-Turbo",
            "ZImageTransformer2DModel",
            {
                "all_patch_size": (2,),
                "all_f_patch_size": (1,),
                "in_channels": 16,
                "dim": 3840,
                "n_layers": 30,
                "n_refiner_layers": 2,
                "n_heads": 30,
                "n_kv_heads": 30,
                "qk_norm": True,
                "cap_feat_dim": 2560,
                "rope_theta": 256.0,
                "t_scale": 1000.0,
                "axes_dims": (32, 48, 48),
                "axes_lens": (1536, 512, 512),
            },
            dit_inputs.zimage,
            1,
            _LARGE[:3],
        ),
        DitArch(
            "lumina-image-2",
            "lumina2",
            "Lumina-Image-2.0",
            "Lumina2Transformer2DModel",
            {
                "sample_size": 128,
                "patch_size": 2,
                "in_channels": 16,
                "hidden_size": 2304,
                "num_layers": 26,
                "num_refiner_layers": 2,
                "num_attention_heads": 24,
                "num_kv_heads": 8,
                "multiple_of": 256,
                "norm_eps": 1e-5,
                "axes_dim_rope": (32, 32, 32),
                "axes_lens": (300, 512, 512),
                "cap_feat_dim": 2304,
            },
            dit_inputs.lumina2,
            1,
            _LARGE[:3],
        ),
        DitArch(
            "sd35-large",
            "sd3",
            "SD3.5 Large",
            "SD3Transformer2DModel",
            {
                "sample_size": 128,
                "patch_size": 2,
                "in_channels": 16,
                "num_layers": 38,
                "attention_head_dim": 64,
                "num_attention_heads": 38,
                "joint_attention_dim": 4096,
                "caption_projection_dim": 2432,
                "pooled_projection_dim": 2048,
                "out_channels": 16,
                "pos_embed_max_size": 192,
                "qk_norm": "rms_norm",
            },
            dit_inputs.sd3,
            2,
            _SQUARE,
        ),
        DitArch(
            "wan-14b",
            "wan",
            "Wan 2.1 14B",
            "WanTransformer3DModel",
            {
                "patch_size": (1, 2, 2),
                "num_attention_heads": 40,
                "attention_head_dim": 128,
                "in_channels": 16,
                "out_channels": 16,
                "text_dim": 4096,
                "freq_dim": 256,
                "ffn_dim": 13824,
                "num_layers": 40,
                "cross_attn_norm": True,
                "qk_norm": "rms_norm_across_heads",
                "eps": 1e-6,
                "rope_max_seq_len": 1024,
            },
            dit_inputs.wan,
            1,
            _VIDEO,
        ),
        DitArch(
            "wan-1.3b",
            "wan",
            "Wan 2.1 1.3B",
            "WanTransformer3DModel",
            {
                "patch_size": (1, 2, 2),
                "num_attention_heads": 12,
                "attention_head_dim": 128,
                "in_channels": 16,
                "out_channels": 16,
                "text_dim": 4096,
                "freq_dim": 256,
                "ffn_dim": 8960,
                "num_layers": 30,
                "cross_attn_norm": True,
                "qk_norm": "rms_norm_across_heads",
                "eps": 1e-6,
                "rope_max_seq_len": 1024,
            },
            dit_inputs.wan,
            1,
            ((832, 480, 81),),
        ),
        DitArch(
            "wan22-5b",
            "wan",
            "Wan 2.2 TI2V 5B",
            "WanTransformer3DModel",
            {
                "patch_size": (1, 2, 2),
                "num_attention_heads": 24,
                "attention_head_dim": 128,
                "in_channels": 48,
                "out_channels": 48,
                "text_dim": 4096,
                "freq_dim": 256,
                "ffn_dim": 14336,
                "num_layers": 30,
                "cross_attn_norm": True,
                "qk_norm": "rms_norm_across_heads",
                "eps": 1e-6,
                "rope_max_seq_len": 1024,
            },
            dit_inputs.wan22,
            1,
            WAN22_5B_SIZES,
        ),
        DitArch(
            "hunyuanvideo",
            "hunyuanvideo",
            "HunyuanVideo 13B",
            "HunyuanVideoTransformer3DModel",
            {
                "in_channels": 16,
                "out_channels": 16,
                "num_attention_heads": 24,
                "attention_head_dim": 128,
                "num_layers": 20,
                "num_single_layers": 40,
                "num_refiner_layers": 2,
                "mlp_ratio": 4.0,
                "patch_size": 2,
                "patch_size_t": 1,
                "qk_norm": "rms_norm",
                "guidance_embeds": True,
                "text_embed_dim": 4096,
                "pooled_projection_dim": 768,
                "rope_theta": 256.0,
                "rope_axes_dim": (16, 56, 56),
            },
            dit_inputs.hunyuan_video,
            1,
            HUNYUAN_SIZES,
        ),
        DitArch(
            "hunyuanvideo15",
            "hunyuanvideo15",
            "HunyuanVideo 1.5 8.3B",
            "HunyuanVideo15Transformer3DModel",
            {
                "in_channels": 65,
                "out_channels": 32,
                "num_attention_heads": 16,
                "attention_head_dim": 128,
                "num_layers": 54,
                "num_refiner_layers": 2,
                "mlp_ratio": 4.0,
                "patch_size": 1,
                "patch_size_t": 1,
                "qk_norm": "rms_norm",
                "text_embed_dim": 3584,
                "text_embed_2_dim": 1472,
                "image_embed_dim": 1152,
                "rope_theta": 256.0,
                "rope_axes_dim": (16, 56, 56),
            },
            dit_inputs.hunyuan_video15,
            2,
            HUNYUAN15_SIZES,
        ),
        DitArch(
            "ltx-2b",
            "ltx",
            "LTX-Video 2B",
            "LTXVideoTransformer3DModel",
            {
                "in_channels": 128,
                "out_channels": 128,
                "num_attention_heads": 32,
                "attention_head_dim": 64,
                "cross_attention_dim": 2048,
                "num_layers": 28,
                "caption_channels": 4096,
            },
            dit_inputs.ltx,
            2,
            LTX_SIZES,
        ),
        DitArch(
            "ltx-13b",
            "ltx",
            "LTX-Video 13B",
            "LTXVideoTransformer3DModel",
            {
                "in_channels": 128,
                "out_channels": 128,
                "num_attention_heads": 32,
                "attention_head_dim": 128,
                "cross_attention_dim": 4096,
                "num_layers": 48,
                "caption_channels": 4096,
            },
            dit_inputs.ltx,
            2,
            LTX_SIZES,
        ),
        DitArch(
            "ltx2-19b",
            "ltx2",
            "LTX-2 19B",
            "LTX2VideoTransformer3DModel",
            {},  # diffusers' defaults are LTX-2's published config (48 blocks, 32 x 128 video heads, 32 x 64 audio)
            dit_inputs.ltx2,
            2,
            LTX2_SIZES,
        ),
    )
}
#: A Flux.1 of two blocks a stream, for the GPU job's dry run on a CPU.
DIT_ARCHS["flux-tiny"] = DitArch(
    "flux-tiny",
    "flux",
    "tiny Flux.1",
    "FluxTransformer2DModel",
    {
        "patch_size": 1,
        "in_channels": 64,
        "num_layers": 2,
        "num_single_layers": 2,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "pooled_projection_dim": 16,
        "axes_dims_rope": (4, 6, 6),
    },
    dit_inputs.packed(64, 8, 32, 3, 16, False),
    1,
    ((128, 128, 1),),
)
#: The architecture whose figures stand for each family in the speed table. One per family: the table and
#: `tome_core.figures` key a figure by family and pixel size alone and interpolate between a family's rows in the
#: token count, so rows of two architectures under one family would blend them. Wan 2.2 TI2V 5B (`wan22-5b`) is
#: a Wan to the core (the same class and layout, the same presets) but not the 14B: its VAE's 16x makes a quarter
#: of the 14B's tokens at one pixel size, at 3072 channels rather than 5120. Its rows under "wan" would sit among
#: the 14B's at a size the 14B would run at 4x the tokens (1280x704x121 above 720p x81 though fewer tokens), and a
#: 14B at 720p and 97 frames would be interpolated towards the 5B. So the "wan" rows are the 14B's at every size,
#: 1280x704x121 included, and the 5B has rows of its own, "wan22-5b" (`tome_core.families.figures_family` tells a
#: 5B by its 48 latent channels; its presets are Wan's).
TABLE_ARCH: dict[str, str] = {
    "flux": "flux-dev",
    "chroma": "chroma",
    "flux2": "flux2-dev",
    "qwen": "qwen-image",
    "zimage": "z-image-turbo",
    "lumina2": "lumina-image-2",
    "sd3": "sd35-large",
    "wan": "wan-14b",
    "hunyuanvideo": "hunyuanvideo",
    "ltx": "ltx-2b",
    "ltx2": "ltx2-19b",
    "wan22-5b": "wan22-5b",  # Wan 2.2 TI2V 5B's own rows (`tome_core.families.FIGURES_FAMILIES`)
}
#: Families the table holds no figure for, and why (their words say "not estimated").
NOT_ESTIMATED = {
    "hunyuanvideo15": "its forward reads a tensor back (`torch.all(image_embeds == 0)`), which the meta device cannot",
}
#: The size each family's presets were chosen at (the video families' at the frame counts they run), else 1024².
CHOSEN_AT: dict[str, Size] = {
    "wan": (832, 480, 81),
    "wan22-5b": (1280, 704, 121),
    "hunyuanvideo": (1280, 720, 129),
    "ltx": (768, 512, 121),
    "ltx2": (1280, 720, 121),
}


def chosen_at(family: str) -> Size:
    return CHOSEN_AT.get(family, (1024, 1024, 1))


def trace_call(arch: DitArch, model: nn.Module, size: Size, apply: Callable[[nn.Module], Any] | None = None) -> Any:
    """The meta trace of one steady-state call of `model` (`apply` patches it first; the patch is removed after):
    the second call, as the first reads the position ids and builds what a patch keeps per size."""
    import tome_core
    from tome_bench.gpu_estimate import trace

    kwargs = arch.inputs(size)
    if apply is not None:
        apply(model)
        # The call a step window reduces: a preset's figure is its reduced steps' (the words name the window).
        tome_core.set_step(model, 99, 100)
    try:
        trace(lambda: model(**kwargs), record_ops=False)
        found, _ = trace(lambda: model(**kwargs))
    finally:
        if apply is not None:
            tome_core.remove_patch(model)
    return found


def estimate_rows(
    arch: DitArch, presets: Sequence[str], gpu: str = "h200", sizes: Sequence[Size] | None = None
) -> list:
    """`gpu_estimate.EstimateRow`s of each preset at each size (`arch.sizes` by default), beside the unpatched model."""
    import tome_core
    from tome_bench.gpu_estimate import GPUS, EstimateRow, estimate

    model = arch.build()
    out = []
    for size in sizes or arch.sizes:
        base = estimate(trace_call(arch, model, size), GPUS[gpu])
        for name in presets:
            found = estimate(
                trace_call(arch, model, size, lambda m, n=name: tome_core.apply_patch(m, preset=n)), GPUS[gpu]
            )
            config = tome_core.get_preset(name).config(arch.family)
            out.append(
                EstimateRow(
                    arch.name,
                    size[0],
                    name,
                    gpu,
                    found.gpu_ms,
                    base.gpu_ms,
                    found.launching,
                    base.launching,
                    found.kernels,
                    found.flops,
                    base.flops,
                    found.peak_bytes,
                    base.peak_bytes,
                    GPUS[gpu].host_us,
                    config.step_end - config.step_start,  # a step window's steps: the others run as they are
                )
            )
    return out


#: A video case's size is its height: its width and frames are the ones users run (480p, 720p; 81 frames).
VIDEO_SIZES = {("wan", 480): (832, 480, 81), ("wan", 720): (1280, 720, 81), ("ltx", 512): (768, 512, 121)}


def device_model(name: str, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """`name`'s full-size model with random weights made on `device` (for the GPU job: no download, seconds)."""
    model = DIT_ARCHS[name].build("meta", dtype).to_empty(device=device)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    return model


def device_inputs(name: str, size: int, dtype: torch.dtype, device: torch.device) -> tuple[tuple[Any, ...], dict]:
    """((), keyword arguments) of one call of `name` at `size` px (a video: its height, `VIDEO_SIZES`)."""
    arch = DIT_ARCHS[name]
    full = VIDEO_SIZES.get((arch.family, size), (size, size, 1))
    return (), arch.inputs(full, device, dtype)
