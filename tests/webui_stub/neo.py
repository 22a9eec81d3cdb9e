"""A Forge Neo-shaped stand-in (Haoming02/sd-webui-forge-classic, branch `neo`), on top of `webui_stub.forge`.

Neo keeps Forge 2's model objects and callback order (read from its `modules/processing.py` and
`modules/sd_models.py`, see docs/hosts.md): `sd_model.forge_objects.unet` is a patcher reset to
`forge_objects_after_applying_lora` before every sampling, `apply_token_merging` adds `TomePatcher` attn1 patches
when the ratio is above 0, and the hires pass calls `process_before_every_sampling` twice (the first call's patches
are thrown away). What differs and is modelled here:

* `apply_token_merging` also adds Neo's epsilon scaling (`EpsilonScaling.patch`, when the `scaling_factor` setting
  is above 1 on an EPS model). Its source was not in the fetched index, so the stand-in only records it as a
  model-level patch in `model_options` that must survive our removal of the built-in merging.
* Neo loads models without a UNet (Flux, Qwen-Image, Wan): their `diffusion_model` is a transformer.
"""

from __future__ import annotations

from typing import Any

from modules import shared
from torch import nn

from webui_stub import forge

EPS_KEY = "neo_epsilon_scaling"  # the stand-in's marker for Neo's epsilon scaling patch
_forge_builtin = forge.apply_token_merging  # the tests put `apply_token_merging` below in its place


class Engine(forge.Engine):
    """Neo's SD1.5 / SDXL engines: Forge 2's shape plus `is_wan` and a model type."""

    def __init__(self, diffusion_model: nn.Module, *, is_sdxl: bool = False) -> None:
        super().__init__(diffusion_model, is_sdxl=is_sdxl)
        self.is_wan = False
        self.model_type = "EPS"


class Flux(Engine):
    """A transformer model (Flux; Qwen-Image and Wan are the same to us): no UNet."""

    def __init__(self) -> None:
        super().__init__(forge.NotAUNet())
        self.model_type = "FLUX"


class QwenImage(Flux):
    pass


def apply_token_merging(engine: Any, ratio: float) -> None:
    """Neo's `sd_models.apply_token_merging`: the built-in merging, then its epsilon scaling."""
    _forge_builtin(engine, ratio)
    factor = float(shared.opts.data.get("scaling_factor", 1.0))
    if factor > 1.0 and getattr(engine, "model_type", None) == "EPS":
        clone = engine.forge_objects.unet.clone()
        clone.model_options[EPS_KEY] = factor
        engine.forge_objects.unet = clone


def epsilon_scaling(engine: Any) -> float | None:
    return engine.forge_objects.unet.model_options.get(EPS_KEY)
