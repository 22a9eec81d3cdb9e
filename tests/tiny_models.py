"""Small random-weight UNets of every kind the core supports, built from configs in code (no downloads).

Kinds:
    ldm_sd1        original LDM `UNetModel` (SD1-like: conv proj_in, num_heads)
    ldm_sd2        original LDM `UNetModel` (SD2-like: linear proj_in, num_head_channels)
    diffusers_sd1  diffusers `UNet2DConditionModel` (SD1-like)
    diffusers_sdxl diffusers `UNet2DConditionModel`, no attention at level 1, text_time added conditioning
    diffusers_sd1_small  two levels of diffusers_sd1 (attention at level 1, the middle block at 2), for
                   torch.compile tests where tracing time matters and not the layout; not in UNET_KINDS

The SD1/SD2-like ones keep the real layout at a smaller scale: 4 levels, attention at levels 1, 2 and 4 (3
transformer blocks each with one res block per level) and the middle block's one at level 8. The SDXL-like one
has attention at levels 2 (3 blocks) and 4 (8 blocks), more blocks at the deeper level as in SDXL (10 and 60).
LDM latents must be multiples of 8 (its skip connections need exact halving); diffusers takes any size.

Wrappers:
    PipelineLike   object with `.unet` (like a diffusers pipeline)
    WebUILike      nn.Module with `.model.diffusion_model` (like the WebUI's LatentDiffusion / tomesd's target)

Every builder seeds torch itself, returns the model in eval() mode, and the forward helpers run under
torch.no_grad(), so the same call always gives bitwise the same output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

CONTEXT_DIM = 64  # cross-attention context width (768/1024/2048 in the real models)
CONTEXT_TOKENS = 7  # prompt tokens (77 in the real models)
LATENT_CHANNELS = 4
SDXL_POOLED_DIM = 32  # width of the pooled text embedding (1280 in SDXL)
SDXL_TIME_EMBED_DIM = 8  # addition_time_embed_dim (256 in SDXL)

LDM_KINDS = ("ldm_sd1", "ldm_sd2")
DIFFUSERS_KINDS = ("diffusers_sd1", "diffusers_sdxl")
UNET_KINDS = LDM_KINDS + DIFFUSERS_KINDS

#: downsample levels that hold attention blocks, per kind
ATTENTION_LEVELS = {
    "ldm_sd1": (1, 2, 4, 8),
    "ldm_sd2": (1, 2, 4, 8),
    "diffusers_sd1": (1, 2, 4, 8),
    "diffusers_sdxl": (2, 4),
    "diffusers_sd1_small": (1, 2),
    "ldm_sd2_small": (1, 2),
}

#: transformer blocks per downsample level, per kind
BLOCKS_PER_LEVEL = {
    "ldm_sd1": {1: 3, 2: 3, 4: 3, 8: 1},
    "ldm_sd2": {1: 3, 2: 3, 4: 3, 8: 1},
    "diffusers_sd1": {1: 3, 2: 3, 4: 3, 8: 1},
    "diffusers_sdxl": {2: 3, 4: 8},
    "diffusers_sd1_small": {1: 3, 2: 1},
    "ldm_sd2_small": {1: 3, 2: 4},
}


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Run with torch seeded, leaving the caller's global RNG state as it was."""
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(state)


def _finish(model: nn.Module) -> nn.Module:
    # LDM zero-initialises every SpatialTransformer's proj_out and the residual blocks' last conv (so a fresh
    # model outputs exactly 0 and attention changes nothing). Give such weights random values so that merging
    # tokens in attention visibly changes the output. Uses the RNG already seeded by the caller.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1 and not param.any():
                fan_in = param[0].numel()
                param.normal_(0.0, fan_in**-0.5)
    model.eval()
    model.requires_grad_(False)
    return model


# ---------------------------------------------------------------------------------------------- builders


def _ldm(seed: int, sd2: bool, levels: int = 4) -> nn.Module:
    """A tiny LDM UNet: channels 32/64/.., attention at every level but the deepest (+ the middle block's there);
    SD1-like (4 heads, conv proj_in) or SD2-like (heads of 16 channels, linear proj_in/out)."""
    from ldm.modules.diffusionmodules.openaimodel import UNetModel

    heads = {"num_head_channels": 16, "use_linear_in_transformer": True} if sd2 else {"num_heads": 4}
    with _seeded(seed):
        model = UNetModel(
            image_size=16,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            model_channels=32,
            attention_resolutions=tuple(2**i for i in reversed(range(min(levels, 3)))),
            num_res_blocks=1,
            channel_mult=(1, *([2] * (levels - 1))),
            use_spatial_transformer=True,
            transformer_depth=1,
            context_dim=CONTEXT_DIM,
            use_checkpoint=False,
            legacy=False,
            **heads,
        )
        return _finish(model)


def build_ldm_sd1(seed: int = 0) -> nn.Module:
    """Tiny SD1-like LDM UNet: channels 32/64/64/64, attention at levels 1, 2, 4 (+ middle at 8), 4 heads, conv proj_in."""
    return _ldm(seed, sd2=False)


def build_ldm_sd2(seed: int = 0) -> nn.Module:
    """Tiny SD2-like LDM UNet: linear proj_in/out, heads of 16 channels, attention at levels 1, 2, 4 (+ middle at 8)."""
    return _ldm(seed, sd2=True)


def build_ldm_sd2_small(seed: int = 0) -> nn.Module:
    """A two-level SD2-like LDM UNet: attention at levels 1 and 2, the middle block's at 2. For torch.compile tests on
    the ldm class where the deep levels are not the point (dynamo unrolls each block's `self.parameters()`, ldm's
    checkpoint call)."""
    return _ldm(seed, sd2=True, levels=2)


def build_diffusers_sd1(seed: int = 0) -> nn.Module:
    """Tiny SD1-like diffusers UNet2DConditionModel: CrossAttn blocks at levels 1, 2, 4, a plain one at 8."""
    from diffusers import UNet2DConditionModel

    with _seeded(seed):
        model = UNet2DConditionModel(
            sample_size=16,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            layers_per_block=1,
            block_out_channels=(32, 64, 64, 64),
            down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
            mid_block_type="UNetMidBlock2DCrossAttn",
            cross_attention_dim=CONTEXT_DIM,
            attention_head_dim=4,
            norm_num_groups=32,
        )
        return _finish(model)


def build_diffusers_sdxl(seed: int = 0) -> nn.Module:
    """Tiny SDXL-like diffusers UNet2DConditionModel.

    DownBlock2D (no attention) at level 1, then CrossAttnDownBlock2D at levels 2 and 4 with 1 and 2 transformer
    layers, linear projections, and "text_time" added conditioning (needs `added_cond_kwargs`).
    """
    from diffusers import UNet2DConditionModel

    with _seeded(seed):
        model = UNet2DConditionModel(
            sample_size=16,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            layers_per_block=1,
            block_out_channels=(32, 64, 64),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            mid_block_type="UNetMidBlock2DCrossAttn",
            transformer_layers_per_block=(1, 1, 2),
            cross_attention_dim=CONTEXT_DIM,
            attention_head_dim=(2, 4, 4),
            use_linear_projection=True,
            addition_embed_type="text_time",
            addition_time_embed_dim=SDXL_TIME_EMBED_DIM,
            projection_class_embeddings_input_dim=SDXL_POOLED_DIM + 6 * SDXL_TIME_EMBED_DIM,
            norm_num_groups=32,
        )
        return _finish(model)


def build_diffusers_sd1_small(seed: int = 0) -> nn.Module:
    """A two-level SD1-like diffusers UNet: CrossAttn blocks at level 1 only (3 transformer blocks, as in
    diffusers_sd1) and the middle block's one at level 2. For torch.compile tests where the merge at level 1 is
    the point and not the layout: dynamo traces it in about half the time of diffusers_sd1."""
    from diffusers import UNet2DConditionModel

    with _seeded(seed):
        model = UNet2DConditionModel(
            sample_size=16,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            layers_per_block=1,
            block_out_channels=(32, 32),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            mid_block_type="UNetMidBlock2DCrossAttn",
            cross_attention_dim=CONTEXT_DIM,
            attention_head_dim=4,
            norm_num_groups=32,
        )
        return _finish(model)


BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "ldm_sd1": build_ldm_sd1,
    "ldm_sd2": build_ldm_sd2,
    "diffusers_sd1": build_diffusers_sd1,
    "diffusers_sdxl": build_diffusers_sdxl,
    "diffusers_sd1_small": build_diffusers_sd1_small,  # not in UNET_KINDS: only where a test names it
    "ldm_sd2_small": build_ldm_sd2_small,
}


def build_unet(kind: str, seed: int = 0) -> nn.Module:
    return BUILDERS[kind](seed)


# ---------------------------------------------------------------------------------------------- wrappers


class PipelineLike:
    """Stands in for a diffusers pipeline: a plain object (not an nn.Module) with `.unet`."""

    def __init__(self, unet: nn.Module) -> None:
        self.unet = unet


class DiffusionWrapperLike(nn.Module):
    """Like ldm's DiffusionWrapper: holds `diffusion_model` and forwards the cross-attention context."""

    def __init__(self, diffusion_model: nn.Module) -> None:
        super().__init__()
        self.diffusion_model = diffusion_model

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.diffusion_model(x, t, context=context)


class WebUILike(nn.Module):
    """Like the WebUI's loaded LatentDiffusion model: the UNet lives at `.model.diffusion_model`."""

    def __init__(self, diffusion_model: nn.Module) -> None:
        super().__init__()
        self.model = DiffusionWrapperLike(diffusion_model)

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.model(x, t, context)


def unwrap(model: object) -> nn.Module:
    """The UNet inside any of the objects above (test-side twin of tome_core.find_unet)."""
    if isinstance(model, WebUILike):
        return model.model.diffusion_model
    if isinstance(model, PipelineLike):
        return model.unet
    assert isinstance(model, nn.Module)
    return model


# ---------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Inputs:
    x: torch.Tensor  # latent [B, 4, H, W]
    t: torch.Tensor  # timesteps [B]
    context: torch.Tensor  # [B, CONTEXT_TOKENS, CONTEXT_DIM]
    text_embeds: torch.Tensor  # [B, SDXL_POOLED_DIM] (SDXL only)
    time_ids: torch.Tensor  # [B, 6] (SDXL only)


def make_inputs(batch: int = 2, height: int = 16, width: int = 16, seed: int = 1) -> Inputs:
    """Random inputs for a forward pass at a latent of `height` x `width`, from a private generator."""
    g = torch.Generator().manual_seed(seed)
    return Inputs(
        x=torch.randn(batch, LATENT_CHANNELS, height, width, generator=g),
        t=torch.randint(1, 1000, (batch,), generator=g).float(),
        context=torch.randn(batch, CONTEXT_TOKENS, CONTEXT_DIM, generator=g),
        text_embeds=torch.randn(batch, SDXL_POOLED_DIM, generator=g),
        time_ids=torch.tensor([[8.0 * height, 8.0 * width, 0.0, 0.0, 8.0 * height, 8.0 * width]] * batch),
    )


def is_diffusers(unet: nn.Module) -> bool:
    return any(cls.__name__ == "ModelMixin" for cls in type(unet).__mro__)


@torch.no_grad()
def forward_unet(unet: nn.Module, inputs: Inputs) -> torch.Tensor:
    """One UNet forward pass, whichever kind. The latent is passed positionally (tomesd's pre-hook needs that)."""
    if is_diffusers(unet):
        added = None
        if getattr(unet.config, "addition_embed_type", None) == "text_time":
            added = {"text_embeds": inputs.text_embeds, "time_ids": inputs.time_ids}
        out = unet(inputs.x, inputs.t, encoder_hidden_states=inputs.context, added_cond_kwargs=added, return_dict=False)
        return out[0]
    return unet(inputs.x, inputs.t, context=inputs.context)


@torch.no_grad()
def forward(model: object, inputs: Inputs) -> torch.Tensor:
    """One forward pass through a bare UNet, a PipelineLike or a WebUILike (through its own forward)."""
    if isinstance(model, WebUILike):
        return model(inputs.x, inputs.t, inputs.context)
    return forward_unet(unwrap(model), inputs)


def run_once(kind: str, batch: int = 2, height: int = 16, width: int = 16, seed: int = 0) -> torch.Tensor:
    """Build a fresh model of `kind` and run one forward on fresh inputs."""
    return forward_unet(build_unet(kind, seed), make_inputs(batch, height, width))


# ---------------------------------------------------------------------------------------------- introspection


def transformer_blocks(unet: nn.Module) -> list[tuple[str, nn.Module]]:
    """The (name, module) of every BasicTransformerBlock in the UNet (also when tomesd swapped in a subclass)."""
    return [
        (n, m) for n, m in unet.named_modules() if any(c.__name__ == "BasicTransformerBlock" for c in type(m).__mro__)
    ]


def snapshot(model: object) -> dict[str, tuple[type, int, int, int, tuple[str, ...]]]:
    """Per module of the UNet: class, forward-hook counts and instance attribute names, to compare later."""
    unet = unwrap(model)
    shot = {}
    for name, module in unet.named_modules():
        shot[name] = (
            type(module),
            len(module._forward_hooks),
            len(module._forward_pre_hooks),
            sum(
                len(getattr(module, extra, {}))
                for extra in (
                    "_forward_pre_hooks_with_kwargs",
                    "_forward_hooks_with_kwargs",
                    "_forward_hooks_always_called",
                )
            ),
            tuple(sorted(k for k in vars(module) if not k.startswith("_") or k.startswith("_tome"))),
        )
    return shot


def hook_count(model: object) -> int:
    """All forward hooks and pre-hooks on all modules of the UNet, and the forwards set on its module instances."""
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + ("forward" in m.__dict__) for m in unwrap(model).modules()
    )
