"""Sampling as ComfyUI runs it (comfy/samplers.py, comfy/sampler_helpers.py, comfy/model_base.py), reduced to
what a model patch can observe: which options reach the UNet, in which order the wrappers run, when the step
callback fires, and which dicts are copies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .dit import build_dit
from .patcher import (
    APPLY_MODEL,
    OUTER_SAMPLE,
    ModelPatcher,
    WrapperExecutor,
    copy_nested_dicts,
    get_all_wrappers,
    merge_nested_dicts,
)
from .unet import CONTEXT_DIM, DiT, build_unet


class SD15:
    """Stand-ins for `comfy.supported_models` configs: only the class names matter to the nodes."""


class SDXL:
    pass


class SSD1B(SDXL):
    pass


class Flux:
    pass


class FluxSchnell(Flux):
    pass


class Chroma:
    pass


class WAN21_T2V:
    pass


class WAN21_I2V(WAN21_T2V):
    pass


class WAN22_T2V(WAN21_T2V):
    pass


class HiDream:
    pass


class Lumina2:
    pass


class ZImage(Lumina2):
    pass  # a config of ComfyUI after a125cd84, derived from Lumina2's


class SD3:
    pass


class LatentFormat:
    """`comfy.latent_formats`: the model's latent format (`BaseModel.latent_format`), by class name: SD15 and SDXL
    (4 channels), Flux (16), Wan21 (16, video), Wan22 (48, video, 16x spatial downscale)."""


def latent_format(name: str) -> LatentFormat:
    return type(name, (LatentFormat,), {})()


#: The noisiest sigma of the stand-in's schedules (`sample`).
SIGMA_MAX = 8.0


class ModelSampling:
    """`comfy.model_sampling`'s object on the model (`BaseModel.model_sampling`): the sigma its schedules start at,
    a tensor as ComfyUI's `sigma_max` property returns it."""

    @property
    def sigma_max(self) -> torch.Tensor:
        return torch.tensor(SIGMA_MAX)

    def percent_to_sigma(self, percent: float) -> float:
        """A schedule linear in the percent, as ComfyUI's flow models' at shift 1 (times SIGMA_MAX)."""
        return SIGMA_MAX * min(max(1.0 - percent, 0.0), 1.0)


#: name -> (model config, diffusion model kind, latent format, the model's timestep per sigma); the diffusion
#: transformers are tests/comfy_stub/dit.py's.
DITS: dict[str, tuple[type, str, str, float]] = {
    "flux": (Flux, "flux", "Flux", 1 / 8),  # a flow model: timestep = sigma (the stand-in's sigmas reach 8)
    "flux-schnell": (FluxSchnell, "flux", "Flux", 1 / 8),
    "chroma": (Chroma, "chroma", "Flux", 1 / 8),
    "wan": (WAN21_T2V, "wan", "Wan21", 1000 / 8),  # Wan: timestep = 1000 * sigma
    "wan-i2v": (WAN21_I2V, "wan", "Wan21", 1000 / 8),
    "wan22": (WAN22_T2V, "wan", "Wan22", 1000 / 8),
    "lumina2": (Lumina2, "lumina2", "Flux", 1 / 8),  # a flow model: timestep = sigma
    "zimage": (ZImage, "zimage", "Flux", 1 / 8),
    "hidream": (HiDream, "unknown", "Flux", 1 / 8),
    "sd3": (SD3, "sd3", "SD3", 1000 / 8),  # SD3: timestep = 1000 * sigma
}


class BaseModel(nn.Module):
    """`model_base.BaseModel`: `.diffusion_model`, `.model_config`, and `apply_model`, which runs the APPLY_MODEL
    wrappers (this model as their `class_obj`) around `_apply_model`, which calls the diffusion model with
    `(x, t, context=..., control=..., transformer_options=...)`: the attribute, read at call time."""

    def __init__(
        self,
        diffusion_model: nn.Module,
        model_config: Any,
        latent: LatentFormat | None = None,
        timestep_per_sigma: float | None = None,
    ) -> None:
        super().__init__()
        self.diffusion_model = diffusion_model
        self.model_config = model_config
        self.latent_format = latent if latent is not None else latent_format(type(model_config).__name__)
        self.timestep_per_sigma = timestep_per_sigma
        self.model_sampling = ModelSampling()

    def apply_model(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        c_crossattn: torch.Tensor,
        transformer_options: dict[str, Any],
        **extra_conds: Any,
    ) -> torch.Tensor:
        wrappers = get_all_wrappers(APPLY_MODEL, transformer_options)
        return WrapperExecutor(self._apply_model, self, wrappers).execute(
            x, t, c_crossattn, transformer_options, **extra_conds
        )

    def _apply_model(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        c_crossattn: torch.Tensor,
        transformer_options: dict[str, Any],
        **extra_conds: Any,
    ) -> torch.Tensor:
        sigma = t.reshape(-1, *([1] * (x.dim() - 1)))
        if self.timestep_per_sigma is None:
            timestep = (t * 100).clamp(max=999)  # the model's timestep from sigma (a monotone map)
        else:
            timestep = t * self.timestep_per_sigma
        eps = self.diffusion_model(
            x / (sigma**2 + 1) ** 0.5,
            timestep,
            context=c_crossattn,
            control=None,
            transformer_options=transformer_options,
            **extra_conds,
        )
        return x - eps * sigma


def load_checkpoint(family: str, seed: int = 0) -> ModelPatcher:
    """What CheckpointLoaderSimple (or UNETLoader, for a DiT) returns as MODEL: a ModelPatcher around a BaseModel.
    "sd", "sdxl", "ssd1b": the stand-in UNets; the `DITS` names: the stand-in diffusion transformers; "dit": a
    model with neither (the UNet-less module, under ComfyUI's Flux config)."""
    if family == "dit":
        return ModelPatcher(BaseModel(DiT(), Flux()))
    if family in DITS:
        config, kind, latent, per_sigma = DITS[family]
        return ModelPatcher(BaseModel(build_dit(kind, seed), config(), latent_format(latent), per_sigma))
    config = {"sd": SD15(), "sdxl": SDXL(), "ssd1b": SSD1B()}[family]
    return ModelPatcher(BaseModel(build_unet("sd" if family == "sd" else "sdxl", seed), config))


def calc_cond_batch(
    model: BaseModel,
    conds: list[torch.Tensor],
    x: torch.Tensor,
    sigma: torch.Tensor,
    model_options: dict[str, Any],
    extra_conds: dict[str, Any] | None = None,
) -> list[torch.Tensor]:
    """`samplers._calc_cond_batch`: one batched UNet call for the conds; a fresh transformer_options per call,
    merged from the options' own, with `cond_or_uncond` and `sigmas` (the current sigma tensor) added. Extra conds
    (Kontext's `ref_latents`: a list of latents) are repeated for each cond of the batch."""
    transformer_options: dict[str, Any] = {}
    merge_nested_dicts(transformer_options, copy_nested_dicts(model_options.get("transformer_options", {})))
    transformer_options["cond_or_uncond"] = list(range(len(conds)))
    transformer_options["sigmas"] = sigma
    transformer_options["uuids"] = list(range(len(conds)))
    batch = torch.cat([x] * len(conds))
    extra = {
        name: [torch.cat([t] * len(conds)) for t in value] if isinstance(value, list) else value
        for name, value in (extra_conds or {}).items()
    }
    out = model.apply_model(batch, torch.cat([sigma] * len(conds)), torch.cat(conds), transformer_options, **extra)
    return list(out.chunk(len(conds)))


class CFGGuider:
    def __init__(
        self,
        model_patcher: ModelPatcher,
        positive: torch.Tensor,
        negative: torch.Tensor,
        cfg: float,
        extra_conds: dict[str, Any] | None = None,
    ) -> None:
        self.model_patcher = model_patcher
        self.model_options = model_patcher.model_options
        self.conds = {"positive": positive, "negative": negative}
        self.cfg = cfg
        self.extra_conds = extra_conds

    def predict_noise(self, x: torch.Tensor, sigma: torch.Tensor, model_options: dict[str, Any]) -> torch.Tensor:
        """`sampling_function`: cond and uncond in one call, CFG, then the post-CFG functions (PAG runs its extra
        UNet call there, with its own attn1 replacement in a copy of the options)."""
        model = self.inner_model
        conds = [self.conds["positive"], self.conds["negative"]]
        cond, uncond = calc_cond_batch(model, conds, x, sigma, model_options, self.extra_conds)
        denoised = uncond + (cond - uncond) * self.cfg
        for fn in model_options.get("sampler_post_cfg_function", []):
            denoised = fn(
                {
                    "model": model,
                    "cond_denoised": cond,
                    "uncond_denoised": uncond,
                    "cond": self.conds["positive"],
                    "denoised": denoised,
                    "sigma": sigma,
                    "model_options": model_options,
                    "input": x,
                }
            )
        return denoised

    def inner_sample(
        self,
        noise: torch.Tensor,
        sampler: Callable[..., torch.Tensor],
        sigmas: torch.Tensor,
        callback: Callable[..., Any] | None,
    ) -> torch.Tensor:
        extra = copy_nested_dicts(self.model_options)
        extra.setdefault("transformer_options", {})["sample_sigmas"] = sigmas
        return sampler(lambda x, s: self.predict_noise(x, s, extra), noise, sigmas, callback)

    def outer_sample(
        self,
        noise: torch.Tensor,
        latent_image: torch.Tensor,
        sampler: Callable[..., torch.Tensor],
        sigmas: torch.Tensor,
        denoise_mask: Any = None,
        callback: Callable[..., Any] | None = None,
        disable_pbar: bool = False,
        seed: int | None = None,
    ) -> torch.Tensor:
        self.inner_model = self.model_patcher.model  # prepare_sampling: the loaded BaseModel
        try:
            return self.inner_sample(noise + latent_image, sampler, sigmas, callback)
        finally:
            del self.inner_model

    def sample(
        self,
        noise: torch.Tensor,
        latent_image: torch.Tensor,
        sampler: Callable[..., torch.Tensor],
        sigmas: torch.Tensor,
        callback: Callable[..., Any] | None = None,
        seed: int | None = None,
    ) -> torch.Tensor:
        """A copy of the options for this sampling, the patcher's wrappers merged into it, then the OUTER_SAMPLE
        wrappers around `outer_sample` with this guider as `class_obj`; the copy is dropped afterwards."""
        original = self.model_options
        try:
            self.model_options = copy_nested_dicts(self.model_options)
            merge_nested_dicts(
                self.model_options["transformer_options"].setdefault("wrappers", {}), self.model_patcher.wrappers
            )
            wrappers = get_all_wrappers(OUTER_SAMPLE, self.model_options["transformer_options"])
            executor = WrapperExecutor(self.outer_sample, self, wrappers)
            return executor.execute(noise, latent_image, sampler, sigmas, None, callback, False, seed)
        finally:
            self.model_options = original


def euler(
    model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    noise: torch.Tensor,
    sigmas: torch.Tensor,
    callback: Callable[..., Any] | None,
) -> torch.Tensor:
    """k-diffusion's Euler with KSAMPLER's callback: `callback(i, denoised, x, total_steps)` after each step."""
    x = noise * sigmas[0]
    total = sigmas.shape[-1] - 1
    for i in range(total):
        sigma = sigmas[i : i + 1]
        denoised = model(x, sigma)
        x = x + (x - denoised) / sigma * (sigmas[i + 1] - sigma)
        if callback is not None:
            callback(i, denoised, x, total)
    return x


def sample(
    model: ModelPatcher,
    seed: int = 0,
    steps: int = 4,
    size: int = 16,
    cfg: float = 5.0,
    denoise: float = 1.0,
    latent: torch.Tensor | None = None,
    callback: Callable[..., Any] | None = None,
    frames: int | None = None,
    start_step: int | None = None,
    last_step: int | None = None,
    **extra_conds: Any,
) -> torch.Tensor:
    """What KSampler does: noise from the seed (its own generator), sigmas for `steps`, CFG guider, Euler. `frames`:
    a video latent [1, 4, frames, size, size]; `extra_conds` reach the diffusion model as keywords (`ref_latents`).
    `start_step`, `last_step`: KSamplerAdvanced's "start_at_step" and "end_at_step" with leftover noise returned,
    which cut the schedule's sigmas (`comfy.samplers.KSampler.sample`): a sampling from sigma `start_step` to sigma
    `last_step`, that sigma not 0."""
    generator = torch.Generator().manual_seed(seed)
    image = (1, 4, size, size) if frames is None else (1, 4, frames, size, size)
    shape = image if latent is None else tuple(latent.shape)
    noise = torch.randn(shape, generator=generator)
    full = [*torch.linspace(SIGMA_MAX, 0.1, round(steps / denoise)).tolist(), 0.0]
    sigmas = torch.tensor(full[-(steps + 1) :])
    sigmas = sigmas[: None if last_step is None else last_step + 1][start_step:]
    cond = torch.randn(1, 5, CONTEXT_DIM, generator=generator)
    uncond = torch.zeros(1, 5, CONTEXT_DIM)
    guider = CFGGuider(model, cond, uncond, cfg, extra_conds)
    with torch.no_grad():
        return guider.sample(noise, latent if latent is not None else torch.zeros(shape), euler, sigmas, callback, seed)
