"""Stable Diffusion UNet architectures for the benchmark and tests, defined in code (no downloads).

`build_unet` makes a diffusers `UNet2DConditionModel` with the exact SD1.5 or SDXL-base architecture and random
weights; `load_checkpoint` puts a real checkpoint's UNet weights into it; `make_inputs` builds one sampler step's
inputs (batch 2 = cond + uncond). Nothing here imports tomesd, and diffusers is imported lazily.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

#: diffusers `UNet2DConditionModel` keyword arguments of Stable Diffusion 1.5
#: (runwayml/stable-diffusion-v1-5, unet/config.json).
SD15_CONFIG: dict[str, Any] = {
    "sample_size": 64, "in_channels": 4, "out_channels": 4, "center_input_sample": False, "flip_sin_to_cos": True,
    "freq_shift": 0,
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    "only_cross_attention": False, "block_out_channels": (320, 640, 1280, 1280), "layers_per_block": 2,
    "downsample_padding": 1, "mid_block_scale_factor": 1, "act_fn": "silu", "norm_num_groups": 32,
    "norm_eps": 1e-5, "cross_attention_dim": 768, "attention_head_dim": 8, "use_linear_projection": False,
}  # fmt: skip

#: diffusers `UNet2DConditionModel` keyword arguments of SDXL base 1.0
#: (stabilityai/stable-diffusion-xl-base-1.0, unet/config.json).
SDXL_CONFIG: dict[str, Any] = {
    "sample_size": 128, "in_channels": 4, "out_channels": 4, "center_input_sample": False, "flip_sin_to_cos": True,
    "freq_shift": 0, "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), "only_cross_attention": False,
    "block_out_channels": (320, 640, 1280), "layers_per_block": 2, "downsample_padding": 1,
    "mid_block_scale_factor": 1, "act_fn": "silu", "norm_num_groups": 32, "norm_eps": 1e-5,
    "cross_attention_dim": 2048, "transformer_layers_per_block": (1, 2, 10), "attention_head_dim": (5, 10, 20),
    "use_linear_projection": True, "addition_embed_type": "text_time", "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
}  # fmt: skip

#: A very small SD1-like UNet (attention at full resolution, one downsample) for fast tests.
TINY_CONFIG: dict[str, Any] = {
    "sample_size": 16, "in_channels": 4, "out_channels": 4,
    "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"), "mid_block_type": "UNetMidBlock2DCrossAttn",
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"), "block_out_channels": (32, 64), "layers_per_block": 1,
    "norm_num_groups": 8, "cross_attention_dim": 32, "attention_head_dim": 4,
}  # fmt: skip


#: A very small SDXL-like UNet (no attention at full resolution, text_time conditioning) for fast tests.
TINY_XL_CONFIG: dict[str, Any] = {
    "sample_size": 16, "in_channels": 4, "out_channels": 4,
    "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D"), "mid_block_type": "UNetMidBlock2DCrossAttn",
    "up_block_types": ("CrossAttnUpBlock2D", "UpBlock2D"), "block_out_channels": (32, 64), "layers_per_block": 1,
    "norm_num_groups": 8, "cross_attention_dim": 32, "transformer_layers_per_block": (1, 2),
    "attention_head_dim": (2, 4), "use_linear_projection": True, "addition_embed_type": "text_time",
    "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 16 + 6 * 8,
}  # fmt: skip


@dataclass(frozen=True)
class Arch:
    name: str
    label: str
    config: Mapping[str, Any]
    #: Width of the text-encoder states the UNet cross-attends to.
    context_dim: int
    #: SDXL's pooled text embedding and size/crop conditioning (added_cond_kwargs).
    text_time: bool = False
    #: Width of the pooled text embedding (text_embeds) when `text_time`.
    pooled_dim: int = 0
    #: Native resolution in pixels.
    native_size: int = 512
    #: The family the library resolves presets for ("sd": SD1.x/SD2.x, "sdxl"), and the batch of one sampler call.
    family: str = "sd"
    batch: int = 2
    #: Square sizes (px) of the speed table the library reads (`estimate.speed_table`); none for the test UNets.
    table_sizes: tuple[int, ...] = ()


ARCHS: dict[str, Arch] = {
    "sd15": Arch("sd15", "SD1.5", SD15_CONFIG, 768, table_sizes=(512, 640, 768, 896, 1024, 1280, 1536)),
    "sdxl": Arch(
        "sdxl", "SDXL", SDXL_CONFIG, 2048, True, 1280, 1024, family="sdxl", table_sizes=(768, 1024, 1280, 1536, 2048)
    ),
    "tiny": Arch("tiny", "tiny SD1-like (tests)", TINY_CONFIG, context_dim=32, native_size=128),
    "tiny-xl": Arch("tiny-xl", "tiny SDXL-like (tests)", TINY_XL_CONFIG, 32, True, 16, 128, family="sdxl"),
}

#: Latent channels and the VAE's downsampling factor (8 px per latent cell) of every SD UNet here.
LATENT_CHANNELS = 4
VAE_SCALE = 8
#: Text tokens per prompt (CLIP context length).
TEXT_TOKENS = 77

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def get_arch(arch: str | Arch) -> Arch:
    if isinstance(arch, Arch):
        return arch
    try:
        return ARCHS[arch]
    except KeyError:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}") from None


def as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}") from None


# ---------------------------------------------------------------------------------------------- building

#: Size of the pool of uniform random numbers that random weights are cut from (see `randomize_`).
_POOL_SIZE = 1 << 24


def build_unet(
    arch: str | Arch, dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int = 0
):
    """A `UNet2DConditionModel` of `arch` with random weights, in eval mode, on `device` in `dtype`.

    The model is built on the meta device and then filled by `randomize_`, which is much faster than diffusers'
    own per-layer initialisation on CPU (SD1.5 has 0.86 B parameters, SDXL 2.6 B). Every weight, including
    those diffusers would leave at zero, ends up random so that the output depends on the input and merging
    visibly changes it. Attention uses diffusers' default processor (AttnProcessor2_0, i.e. SDPA).
    """
    from diffusers import UNet2DConditionModel

    spec = get_arch(arch)
    dtype = as_dtype(dtype)
    with torch.device("meta"):
        unet = UNet2DConditionModel(**spec.config)
    unet = unet.to(dtype=dtype).to_empty(device=device)
    randomize_(unet, seed)
    return unet.eval().requires_grad_(False)


@torch.no_grad()
def randomize_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Fill every parameter and buffer of `model` with seeded random values, in place.

    Linear and convolution weights and biases follow PyTorch's default scale, uniform in +-1/sqrt(fan_in),
    which keeps activations bounded through the residual stream; normalisation layers get a weight of
    1 +- 0.1 and a bias of +-0.1. For speed the values are contiguous slices, at seeded random offsets, of one
    pool of 2**24 uniform numbers (drawing 0.86 B numbers one by one from a CPU generator takes tens of seconds)
    - statistically irrelevant for timing and for measuring how much merging changes the output.
    """
    gen = torch.Generator().manual_seed(seed)
    params = list(model.parameters())
    if not params:
        return model
    device = params[0].device
    pool = torch.rand(_POOL_SIZE, generator=gen).mul_(2).sub_(1).to(device)

    def fill(t: torch.Tensor, bound: float, centre: float = 0.0) -> None:
        flat = t.view(-1)
        done = 0
        while done < flat.numel():
            n = min(flat.numel() - done, _POOL_SIZE)
            start = int(torch.randint(0, _POOL_SIZE - n + 1, (1,), generator=gen))
            flat[done : done + n].copy_(pool[start : start + n])
            done += n
        t.mul_(bound).add_(centre)

    seen: set[int] = set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        bias = getattr(module, "bias", None)
        is_norm = isinstance(module, (nn.GroupNorm, nn.LayerNorm, nn.BatchNorm2d, nn.InstanceNorm2d))
        if isinstance(weight, nn.Parameter) and id(weight) not in seen:
            seen.add(id(weight))
            if is_norm:
                fill(weight, 0.1, 1.0)
            else:
                fan_in = weight[0].numel() if weight.dim() > 1 else weight.numel()
                fill(weight, 1.0 / math.sqrt(max(fan_in, 1)))
        if isinstance(bias, nn.Parameter) and id(bias) not in seen:
            seen.add(id(bias))
            if is_norm:
                fill(bias, 0.1)
            else:
                fan_in = weight[0].numel() if isinstance(weight, torch.Tensor) and weight.dim() > 1 else bias.numel()
                fill(bias, 1.0 / math.sqrt(max(fan_in, 1)))
    for p in params:
        if id(p) not in seen:  # anything that is not a module's weight/bias
            seen.add(id(p))
            fill(p, 0.02)
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:  # to_empty() leaves buffers uninitialised and their values cannot be guessed
        raise RuntimeError(f"randomize_ cannot initialise buffers, found {', '.join(buffers)}")
    return model


# ---------------------------------------------------------------------------------------------- checkpoints

LDM_UNET_PREFIX = "model.diffusion_model."


def load_checkpoint(unet: nn.Module, path: str | os.PathLike[str], arch: str | Arch) -> nn.Module:
    """Load a real checkpoint's UNet weights (safetensors) into `unet`, in place, keeping its dtype and device.

    Accepts diffusers-format UNet weights (`diffusion_pytorch_model.safetensors`, optionally prefixed `unet.`)
    and original single-file SD1.x / SDXL checkpoints (keys `model.diffusion_model.*`; only those tensors are
    read), which are converted with diffusers' own `convert_ldm_unet_checkpoint` using this module's config
    (works offline). Raises `ValueError` naming the problem when the file does not match `arch`.
    """
    from safetensors import safe_open

    spec = get_arch(arch)
    path = os.fspath(path)
    if not path.endswith(".safetensors"):
        raise ValueError(f"checkpoint must be a .safetensors file (pickled .ckpt is not loaded), got {path!r}")
    with safe_open(path, framework="pt", device="cpu") as f:
        keys = list(f.keys())
        if any(k.startswith(LDM_UNET_PREFIX) for k in keys):
            layout, wanted = "ldm", [k for k in keys if k.startswith(LDM_UNET_PREFIX)]
        elif any(k.startswith("unet.") for k in keys):
            layout, wanted = "pipeline", [k for k in keys if k.startswith("unet.")]
        else:
            layout, wanted = "diffusers", keys
        state = {k: f.get_tensor(k) for k in wanted}
    _check_context_dim(state, spec, path)
    if layout == "ldm":
        from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

        state = convert_ldm_unet_checkpoint(state, dict(unet.config))
    elif layout == "pipeline":
        state = {k[len("unet.") :]: v for k, v in state.items()}

    expected = unet.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or mismatched:
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        if mismatched:
            k = mismatched[0]
            problems.append(
                f"{len(mismatched)} of another shape (e.g. {k}: {tuple(state[k].shape)} vs {tuple(expected[k].shape)})"
            )
        raise ValueError(f"{path} does not hold {spec.label} UNet weights: " + "; ".join(problems))
    unet.load_state_dict({k: v.to(device=expected[k].device, dtype=expected[k].dtype) for k, v in state.items()})
    return unet


#: Width of the text states a UNet cross-attends to, as a hint to which model family a checkpoint is.
_CONTEXT_FAMILIES = {768: "SD1.x", 1024: "SD2.x", 1280: "SDXL refiner", 2048: "SDXL base"}


def _check_context_dim(state: Mapping[str, torch.Tensor], spec: Arch, path: str) -> None:
    """Raise a clear error when the checkpoint's cross-attention width is not the architecture's."""
    for key, value in state.items():
        if key.endswith("attn2.to_k.weight") and value.dim() == 2:
            width = int(value.shape[1])
            if width != spec.context_dim:
                family = _CONTEXT_FAMILIES.get(width, "another model")
                raise ValueError(
                    f"{path} cross-attends to {width}-wide text states ({family}); {spec.label} expects"
                    f" {spec.context_dim} (pick the matching --arch)"
                )
            return


def checkpoint_arch(path: str | os.PathLike[str]) -> str:
    """The architecture name of a checkpoint's UNet ("sd15" or "sdxl"), told by the width of the text states it
    cross-attends to; ValueError naming the family when it is neither."""
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="pt", device="cpu") as f:
        key = next((k for k in f.keys() if k.endswith("attn2.to_k.weight")), None)  # noqa: SIM118 (not iterable)
        width = None if key is None else int(f.get_slice(key).get_shape()[1])
    found = [spec.name for spec in ARCHS.values() if spec.context_dim == width and not spec.name.startswith("tiny")]
    if not found:
        family = "no cross-attention weights" if width is None else _CONTEXT_FAMILIES.get(width, f"{width}-wide")
        raise ValueError(f"{path}: not an SD1.5 or SDXL checkpoint ({family}); name the architecture with --arch")
    return found[0]


# ---------------------------------------------------------------------------------------------- inputs


def make_inputs(
    arch: str | Arch,
    height: int,
    width: int | None = None,
    *,
    batch: int = 2,
    dtype: str | torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    timestep: int = 500,
    latent_kind: str = "noise",
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword arguments for one UNet call: `unet(*args, **kwargs)`.

    `latent_kind` "noise" is white noise, "natural" a field with a natural image's spectrum (`natural_latent`);
    the text states are the same for both.

    `args` = (latent [B, 4, H/8, W/8], timestep [B]) - passed positionally because tomesd's size hook reads
    `args[0]`; `kwargs` = encoder_hidden_states [B, 77, ctx] and, for SDXL, added_cond_kwargs with
    text_embeds [B, pooled_dim] (1280) and time_ids [B, 6] (original size, crop offset, target size).
    """
    spec = get_arch(arch)
    width = height if width is None else width
    if height % VAE_SCALE or width % VAE_SCALE:
        raise ValueError(f"image size must be a multiple of {VAE_SCALE} px, got {height}x{width}")
    dtype = as_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, LATENT_CHANNELS, height // VAE_SCALE, width // VAE_SCALE)
    latent = torch.randn(shape, generator=gen)
    if latent_kind == "natural":
        latent = natural_latent(shape, torch.Generator().manual_seed(seed))
    elif latent_kind != "noise":
        raise ValueError(f"latent_kind must be 'noise' or 'natural', got {latent_kind!r}")
    context = torch.randn(batch, TEXT_TOKENS, spec.context_dim, generator=gen)
    kwargs: dict[str, Any] = {"encoder_hidden_states": context.to(device=device, dtype=dtype)}
    if spec.text_time:
        text_embeds = torch.randn(batch, spec.pooled_dim, generator=gen)
        time_ids = torch.tensor([[height, width, 0, 0, height, width]], dtype=torch.float32).repeat(batch, 1)
        kwargs["added_cond_kwargs"] = {
            "text_embeds": text_embeds.to(device=device, dtype=dtype),
            "time_ids": time_ids.to(device=device, dtype=dtype),
        }
    t = torch.full((batch,), timestep, dtype=torch.int64, device=device)
    return (latent.to(device=device, dtype=dtype), t), kwargs


def natural_latent(
    shape: tuple[int, ...], generator: torch.Generator, exponent: float = 2.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A random latent [B, C, H, W] whose power falls with spatial frequency f as 1 / f**exponent, per channel
    scaled to zero mean and unit variance (the scale of the white noise it stands in for).

    Natural images, and the SD VAE latents of them, have power spectra close to 1 / f**2, so neighbouring
    latent cells are alike; in white noise every cell is unlike its neighbours, which makes merging look worse
    than it is on real images. Made by shaping white noise in the Fourier domain (amplitude 1 / f**(exponent / 2)).
    """
    *_, height, width = shape
    white = torch.randn(shape, generator=generator, dtype=torch.float64)
    fy = torch.fft.fftfreq(height, dtype=torch.float64)[:, None]
    fx = torch.fft.rfftfreq(width, dtype=torch.float64)[None, :]
    freq = (fx**2 + fy**2).sqrt()
    freq[0, 0] = 1.0 / max(height, width)  # the mean (f = 0) gets the weight of the lowest frequency, not infinity
    field = torch.fft.irfft2(torch.fft.rfft2(white) / freq ** (exponent / 2), s=(height, width))
    field = field - field.mean(dim=(-2, -1), keepdim=True)
    field = field / field.std(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    return field.to(dtype)
