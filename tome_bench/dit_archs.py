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

Size = tuple[int, int, int]  # width, height, frames (1 for an image)


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


def _ids(h: int, w: int, axes: int) -> torch.Tensor:
    """Position ids as the Flux pipelines make them: (0, row, column) or (0, row, column, 0). On the CPU for a
    meta-device trace: on the meta device nothing could read the grid from them. The rotary embedding made from them
    then moves to the meta device inside each attention, two copies a GPU run does not have, traced for the
    unpatched and the patched call alike (Flux.1-dev at 1024 px: 114 of ~4,000 launching operations, ~0.2% of the
    estimated GPU time)."""
    ids = torch.zeros(h, w, axes)
    ids[..., 1] = torch.arange(h).view(-1, 1)
    ids[..., 2] = torch.arange(w).view(1, -1)
    return ids.view(h * w, axes)


def _packed(channels: int, text: int, text_dim: int, axes: int, pooled: int | None, guidance: bool) -> Callable:
    """Packed 2x2 patches of a 16x-downsampling latent (Flux.1, Flux.2, Chroma): h = height / 16."""

    def make(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
        h, w = size[1] // 16, size[0] // 16
        out = {
            "hidden_states": torch.randn(batch, h * w, channels, device=device, dtype=dtype),
            "encoder_hidden_states": torch.randn(batch, text, text_dim, device=device, dtype=dtype),
            "timestep": torch.full((batch,), 0.5, device=device, dtype=dtype),
            "img_ids": _ids(h, w, axes) if device == "meta" else _ids(h, w, axes).to(device),
            "txt_ids": torch.zeros(text, axes, device="cpu" if device == "meta" else device),
            "return_dict": False,
        }
        if pooled is not None:
            out["pooled_projections"] = torch.randn(batch, pooled, device=device, dtype=dtype)
        if guidance:
            out["guidance"] = torch.full((batch,), 3.5, device=device, dtype=dtype)
        return out

    return make


def _qwen(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    h, w, text = size[1] // 16, size[0] // 16, 256
    return {
        "hidden_states": torch.randn(batch, h * w, 64, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, text, 3584, device=device, dtype=dtype),
        "encoder_hidden_states_mask": torch.ones(batch, text, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 0.5, device=device, dtype=dtype),
        "img_shapes": [[(1, h, w)]] * batch,
        "return_dict": False,
    }


def _sd3(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    return {
        "hidden_states": torch.randn(batch, 16, size[1] // 8, size[0] // 8, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 333, 4096, device=device, dtype=dtype),
        "pooled_projections": torch.randn(batch, 2048, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 500.0, device=device, dtype=dtype),
        "return_dict": False,
    }


def _wan(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    frames = (size[2] - 1) // 4 + 1  # Wan's VAE: the first frame alone, then four per latent frame
    return {
        "hidden_states": torch.randn(batch, 16, frames, size[1] // 8, size[0] // 8, device=device, dtype=dtype),
        "timestep": torch.full((batch,), 500.0, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, 512, 4096, device=device, dtype=dtype),
        "return_dict": False,
    }


def _zimage(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """Z-Image's pipeline: one latent [C, 1, H, W] and one caption (its kept tokens) per sample, in lists."""
    return {
        "x": [torch.randn(16, 1, size[1] // 8, size[0] // 8, device=device, dtype=dtype) for _ in range(batch)],
        "t": torch.full((batch,), 0.5, device=device, dtype=dtype),
        "cap_feats": [torch.randn(256, 2560, device=device, dtype=dtype) for _ in range(batch)],
        "return_dict": False,
    }


def _lumina2(size: Size, batch: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
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


_SQUARE = ((1024, 1024, 1), (1328, 1328, 1))
_LARGE = ((1024, 1024, 1), (1536, 1536, 1), (2048, 2048, 1))
_VIDEO = ((832, 480, 81), (1280, 720, 81))

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
            _packed(64, 512, 4096, 3, 768, True),
            1,
            _LARGE,
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
            _packed(64, 512, 4096, 3, None, False),
            2,
            _LARGE[:2],
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
            _packed(128, 512, 15360, 4, None, True),
            1,
            _SQUARE,
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
            _qwen,
            1,
            _SQUARE,
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
            _zimage,
            1,
            _LARGE[:2],
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
            _lumina2,
            1,
            _LARGE[:2],
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
            _sd3,
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
            _wan,
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
            _wan,
            1,
            ((832, 480, 81),),
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
    _packed(64, 8, 32, 3, 16, False),
    1,
    ((128, 128, 1),),
)
#: The architecture whose figures stand for each family in the speed table.
TABLE_ARCH: dict[str, str] = {
    "flux": "flux-dev",
    "chroma": "chroma",
    "flux2": "flux2-dev",
    "qwen": "qwen-image",
    "zimage": "z-image-turbo",
    "lumina2": "lumina-image-2",
    "sd3": "sd35-large",
    "wan": "wan-14b",
}


def trace_call(arch: DitArch, model: nn.Module, size: Size, apply: Callable[[nn.Module], Any] | None = None) -> Any:
    """The meta trace of one steady-state call of `model` (`apply` patches it first; the patch is removed after):
    the second call, as the first reads the position ids and builds what a patch keeps per size."""
    import tome_core
    from tome_bench.gpu_estimate import trace

    kwargs = arch.inputs(size)
    if apply is not None:
        apply(model)
    try:
        trace(lambda: model(**kwargs))
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
                )
            )
    return out


#: A video case's size is its height: its width and frames are the ones users run (480p, 720p; 81 frames).
VIDEO_SIZES = {480: (832, 480, 81), 720: (1280, 720, 81)}


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
    full = VIDEO_SIZES[size] if arch.family == "wan" else (size, size, 1)
    return (), arch.inputs(full, device, dtype)
