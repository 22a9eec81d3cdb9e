"""diffusers pipelines of each diffusion transformer family, on the CPU with tiny components (the text encoders'
embeddings are given directly: no tokenizer or text encoder is built): `tome_core.apply_patch(pipe, preset=...)`
reduces the pipeline's transformer for whole generations, the step window follows the pipeline's scheduler, and
`remove_patch(pipe)` leaves the next generation bitwise the unpatched one. Wan's first-last-frame-to-video runs its
image-to-video pipeline with a tiny Wan VAE (and, for Wan 2.1 FLF2V, a tiny CLIP image encoder)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import tome_core
from tome_core.families import Tokens

from dit_models import TINY, TINY_WAN

STEPS = 4


def _flux() -> tuple[Any, dict[str, Any]]:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline

    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=TINY["flux"]().build(),
    )
    g = torch.Generator().manual_seed(3)
    return pipe, {
        "prompt_embeds": torch.randn(1, 7, 32, generator=g),
        "pooled_prompt_embeds": torch.randn(1, 16, generator=g),
        "height": 32,
        "width": 32,
        "guidance_scale": 1.0,
    }


def _wan() -> tuple[Any, dict[str, Any]]:
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    # No VAE: the latents are the output (the pipeline then takes the Wan VAE's scale factors, 4 frames and 8 px).
    pipe = WanPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=TINY["wan"]().build(),
        vae=None,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    g = torch.Generator().manual_seed(3)
    return pipe, {
        "prompt_embeds": torch.randn(1, 7, 32, generator=g),
        "negative_prompt_embeds": torch.randn(1, 7, 32, generator=g),
        "height": 32,
        "width": 32,
        "num_frames": 9,
        "guidance_scale": 1.0,
    }


def _sd3() -> tuple[Any, dict[str, Any]]:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    pipe = StableDiffusion3Pipeline(
        transformer=TINY["sd3"]().build(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        text_encoder_3=None,
        tokenizer_3=None,
    )
    g = torch.Generator().manual_seed(3)
    return pipe, {
        "prompt_embeds": torch.randn(1, 7, 32, generator=g),
        "pooled_prompt_embeds": torch.randn(1, 16, generator=g),
        "height": 32,
        "width": 32,
        "guidance_scale": 1.0,
    }


def _qwen() -> tuple[Any, dict[str, Any]]:
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    pipe = QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=None,
        text_encoder=None,
        tokenizer=None,
        transformer=TINY["qwen"]().build(),
    )
    g = torch.Generator().manual_seed(3)
    return pipe, {
        "prompt_embeds": torch.randn(1, 7, 32, generator=g),
        "prompt_embeds_mask": torch.ones(1, 7, dtype=torch.long),
        "height": 32,
        "width": 32,
        "true_cfg_scale": 1.0,
    }


def _chroma() -> tuple[Any, dict[str, Any]]:
    from diffusers import ChromaPipeline, FlowMatchEulerDiscreteScheduler

    pipe = ChromaPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=None,
        text_encoder=None,
        tokenizer=None,
        transformer=TINY["chroma"]().build(),
    )
    g = torch.Generator().manual_seed(3)
    return pipe, {
        "prompt_embeds": torch.randn(1, 7, 32, generator=g),
        "prompt_attention_mask": torch.ones(1, 7, dtype=torch.bool),
        "height": 32,
        "width": 32,
        "guidance_scale": 1.0,
    }


def _zimage() -> tuple[Any, dict[str, Any]]:
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    pipe = ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=None,
        text_encoder=None,
        tokenizer=None,
        transformer=TINY["zimage"]().build(),
    )
    g = torch.Generator().manual_seed(3)
    return pipe, {
        "prompt_embeds": [torch.randn(7, 32, generator=g)],  # Z-Image takes each prompt's kept tokens
        "height": 64,
        "width": 64,
        "guidance_scale": 0.0,  # Turbo: no classifier-free guidance
    }


def _lumina2() -> tuple[Any, dict[str, Any]]:
    from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline

    pipe = Lumina2Pipeline(
        transformer=TINY["lumina2"]().build(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=None,
        text_encoder=None,
        tokenizer=None,
    )
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(1, 7, dtype=torch.bool)
    return pipe, {
        "prompt_embeds": torch.randn(1, 7, 32, generator=g),
        "prompt_attention_mask": mask,
        "negative_prompt_embeds": torch.randn(1, 7, 32, generator=g),
        "negative_prompt_attention_mask": torch.tensor([[True] * 4 + [False] * 3]),  # a shorter negative prompt
        "height": 64,
        "width": 64,
        "guidance_scale": 4.0,
    }


#: family -> the tiny pipeline and its call's keywords (Lumina 2's negative prompt shorter: its own caption length)
PIPELINES: dict[str, Callable[[], tuple[Any, dict[str, Any]]]] = {
    "flux": _flux,
    "chroma": _chroma,
    "qwen": _qwen,
    "zimage": _zimage,
    "lumina2": _lumina2,
    "sd3": _sd3,
    "wan": _wan,
}


def generate(pipe: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        out = pipe(
            **kwargs, num_inference_steps=STEPS, output_type="latent", generator=torch.Generator().manual_seed(1)
        )
    return out.frames if hasattr(out, "frames") else out.images


@pytest.mark.parametrize("family", list(PIPELINES))
def test_a_pipeline_generates_reduced_and_bitwise_after_removal(family: str) -> None:
    pipe, kwargs = PIPELINES[family]()
    pipe.set_progress_bar_config(disable=True)
    base = generate(pipe, kwargs)
    tome_core.apply_patch(pipe, preset="balanced")
    assert tome_core.model_family(pipe) == family
    out = generate(pipe, kwargs)
    stats = tome_core.stats(pipe)
    calls = STEPS * (2 if family == "lumina2" else 1)  # Lumina 2's pipeline calls cond and uncond apart
    assert stats is not None and stats.unet_calls == calls and stats.applied == stats.selected > 0, stats
    assert out.shape == base.shape and not torch.equal(out, base)
    tome_core.remove_patch(pipe)
    assert torch.equal(generate(pipe, kwargs), base)


def test_the_step_window_follows_the_pipeline_scheduler() -> None:
    pipe, kwargs = _flux()
    pipe.set_progress_bar_config(disable=True)
    tome_core.apply_patch(pipe, preset="balanced", step_start=0.5)
    generate(pipe, kwargs)
    stats = tome_core.stats(pipe)
    assert stats is not None and (stats.unet_calls, stats.active_calls) == (STEPS, STEPS // 2)
    tome_core.remove_patch(pipe)


def test_wan22s_two_experts_are_both_reduced_and_both_removed() -> None:
    """Issue 58: Wan 2.2 14B runs a high-noise expert (`transformer`) for the first steps and a low-noise one
    (`transformer_2`) after `boundary_ratio`; `apply_patch(pipe)` reduces both with the same settings, each counts
    its own calls, the step window follows the one scheduler across the switch, and `remove_patch(pipe)` leaves
    the next generation bitwise the unpatched one."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    second = TINY["wan"]().build()
    with torch.no_grad():
        for p in second.parameters():
            p.mul_(0.9)  # another expert: other weights
    pipe = WanPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=TINY["wan"]().build(),
        transformer_2=second,
        vae=None,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        boundary_ratio=0.5,
    )
    pipe.set_progress_bar_config(disable=True)
    kwargs = _wan()[1]
    base = generate(pipe, kwargs)
    tome_core.apply_patch(pipe, preset="balanced", step_start=0.25)
    out = generate(pipe, kwargs)
    first, low = tome_core.stats(pipe), tome_core.stats(pipe.transformer_2)
    assert first is not None and low is not None
    assert first.unet_calls + low.unet_calls == STEPS and first.unet_calls > 0 and low.unet_calls > 0
    assert first.active_calls + low.active_calls == STEPS - 1  # one window over both experts' steps
    assert low.applied == low.selected > 0 and first.applied == first.selected
    assert not torch.equal(out, base)
    tome_core.remove_patch(pipe)
    assert not tome_core.is_patched(pipe.transformer_2)
    assert torch.equal(generate(pipe, kwargs), base)


def _wan_flf2v(image_dim: int | None) -> tuple[Any, dict[str, Any]]:
    """Wan first-last-frame-to-video as diffusers runs it, `WanImageToVideoPipeline(image=..., last_image=...)`:
    `image_dim` 16, Wan 2.1 FLF2V 14B (CLIP embeddings of both frames for its cross-attention, the text padded to the
    512 tokens its attention expects); None, Wan 2.2 I2V A14B (no image encoder). Both frames reach the transformer
    as channels beside the noisy latent (a mask, then the VAE's latent of first frame, blank frames and last frame):
    12 = 4 noisy + 4 mask (the VAE's 4 frames per latent frame) + 4 condition. 64 px and 9 frames: 3 latent frames
    of 4x4 patches."""
    import transformers
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanImageToVideoPipeline,
        WanTransformer3DModel,
    )
    from PIL import Image

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=3,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).eval()
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(
        **{**TINY_WAN, "in_channels": 12},  # the latent, its condition and the mask's 4 channels
        image_dim=image_dim,
        added_kv_proj_dim=None if image_dim is None else 32,
        pos_embed_seq_len=None if image_dim is None else 2 * 5,  # both frames' 5 CLIP tokens
    ).eval()
    encoders: dict[str, Any] = {}
    if image_dim is not None:
        config = transformers.CLIPVisionConfig(
            hidden_size=image_dim,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=16,
        )
        # The PIL processor where transformers has it: the default one warns without torchvision.
        processor = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)
        encoders = {
            "image_encoder": transformers.CLIPVisionModel(config).eval(),
            "image_processor": processor(crop_size=32, size={"shortest_edge": 32}),
        }
    pipe = WanImageToVideoPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=transformer,
        **encoders,
    )
    g = torch.Generator().manual_seed(3)
    first, last = (Image.fromarray((torch.rand(64, 64, 3, generator=g) * 255).byte().numpy()) for _ in range(2))
    text = 7 if image_dim is None else 512
    return pipe, {
        "image": first,
        "last_image": last,
        "prompt_embeds": torch.randn(1, text, 32, generator=g),
        "negative_prompt_embeds": torch.randn(1, text, 32, generator=g),
        "height": 64,
        "width": 64,
        "num_frames": 9,
        "guidance_scale": 1.0,
    }


@pytest.mark.parametrize("image_dim", [16, None], ids=["wan21-flf2v", "wan22-i2v"])
def test_wan_first_last_frame_to_video_is_reduced_as_image_to_video_and_bitwise_after_removal(
    image_dim: int | None,
) -> None:
    """Issue 58: a first and a last frame add no token to Wan's sequence (channels beside the noisy latent, and for
    Wan 2.1 FLF2V CLIP tokens in its cross-attention), so the layout is image-to-video's: the first latent frame
    kept whole, the last one's tokens generated and reduced like the others. The patched run reduces every selected
    block, and `remove_patch(pipe)` leaves the next generation bitwise the unpatched one."""
    pipe, kwargs = _wan_flf2v(image_dim)
    pipe.set_progress_bar_config(disable=True)
    base = generate(pipe, kwargs)
    assert not torch.equal(generate(pipe, {**kwargs, "last_image": kwargs["image"]}), base)  # the last frame counts
    seen: list[torch.Size] = []
    spy = pipe.transformer.register_forward_pre_hook(
        lambda module, args, kw: seen.append(kw["hidden_states"].shape), with_kwargs=True
    )
    tome_core.apply_patch(pipe, preset="balanced")
    out = generate(pipe, kwargs)
    spy.remove()
    stats = tome_core.stats(pipe)
    assert stats is not None and stats.unet_calls == STEPS and stats.applied == stats.selected > 0, stats
    assert out.shape == base.shape and not torch.equal(out, base)
    layout = tome_core.find_layout(pipe.transformer)
    assert layout is not None
    _, channels, frames, height, width = seen[0]
    tokens = layout.tokens(pipe.transformer, (), {"hidden_states": torch.zeros(seen[0])}, {})
    cells = (height // 2) * (width // 2)
    assert (channels, frames) == (12, 3) and tokens == Tokens(cells, (frames - 1, height // 2, width // 2), 0)
    tome_core.remove_patch(pipe)
    assert torch.equal(generate(pipe, kwargs), base)
