"""Host adapters: where each A1111-style WebUI keeps the UNet and its own token merging.

One lifecycle (`tome_webui.lifecycle`) drives every host; what differs between hosts is only how a model object
reaches its UNet module and how the host's built-in token merging shows on it:

* `a1111`: AUTOMATIC1111 1.6-1.10 (and SD.Next's original backend): the UNet at `sd_model.model.diffusion_model`;
  the built-in is tomesd, recorded as `sd_model.applied_token_merged_ratio`.
* `forge`: Forge 2 (`backend/`, `sd_model.forge_objects.unet.model.diffusion_model`), and the forks on Forge 1's
  `ldm_patched` (reForge, Forge Classic), whose models carry `forge_objects` too. The built-in is a pair of
  attn1 patches of a `TomePatcher` in the UNet patcher's `model_options`, added afresh before every sampling.

`host_of(model)` picks the adapter from the model object itself, so a process that mixes models (a refiner, a
hires checkpoint) is handled per model. The algorithm never lives here: adapters hand a UNet module to `tome_core`.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import nn

from tome_webui.hosts import a1111, forge


class Host(Protocol):
    """What the lifecycle asks of a host about one model object."""

    name: str

    def unet(self, model: Any) -> nn.Module | None:
        """The model's UNet module, or None when it has none (Flux, SD3, a placeholder)."""

    def is_placeholder(self, model: Any) -> bool:
        """Whether `model` stands in for a model not loaded yet (no error is reported for it)."""

    def builtin_applied(self, model: Any) -> bool:
        """Whether the host's built-in token merging is applied to `model` for the pass about to sample."""

    def remove_builtin(self, model: Any) -> bool:
        """Take the built-in token merging off `model` for this pass; False when the host cannot."""


def host_of(model: Any) -> Host:
    """The adapter for a model object."""
    return forge.HOST if forge.owns(model) else a1111.HOST


def unet_of(model: Any) -> nn.Module | None:
    """The UNet module of a model object of any host, or None."""
    return None if model is None else host_of(model).unet(model)


__all__ = ["Host", "a1111", "forge", "host_of", "unet_of"]
