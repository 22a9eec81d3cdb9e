"""Host adapters: where each A1111-style WebUI keeps the model ToMe patches and its own token merging.

One lifecycle (`tome_webui.lifecycle`) drives every host; what differs between hosts is only how a model object
reaches the module ToMe patches (its UNet, or its diffusion transformer where `tome_core` reduces one) and how the
host's built-in token merging shows on it:

* `a1111`: AUTOMATIC1111 1.6-1.10 (and SD.Next's original backend): the UNet at `sd_model.model.diffusion_model`;
  the built-in is tomesd, recorded as `sd_model.applied_token_merged_ratio`.
* `sdnext`: SD.Next: a diffusers pipeline with the UNet at `pipeline.unet`, or a diffusion transformer (Flux, Wan,
  Qwen-Image, SD3.5) at `pipeline.transformer`; the built-in is tomesd or ToDo, chosen by the
  `token_merging_method` setting. SD.Next fires no per-step script callback, so its adapter watches the model's
  calls (`watch`) to see the passes after the first.
* `forge`: Forge 2 and Forge Neo (`backend/`, `sd_model.forge_objects.unet.model.diffusion_model`: a UNet, or one of
  Neo's diffusion transformers), and the forks on Forge 1's `ldm_patched` (reForge, Forge Classic), whose models carry
  `forge_objects` too. The built-in is a pair of attn1 patches of a `TomePatcher` in the UNet patcher's
  `model_options`, added afresh before every sampling.

`host_of(model)` picks the adapter from the model object itself, so a process that mixes models (a refiner, a
hires checkpoint) is handled per model. The algorithm never lives here: adapters hand a module to `tome_core`.
A model whose module ToMe does not patch (a diffusion transformer of no family `tome_core` reduces) gets the core's
words naming its class (`not_patched`), never a silent no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch import nn

from tome_webui.hosts import a1111, forge, sdnext
from tome_webui.hosts.common import not_handled, patchable, short_reason


class Removable(Protocol):
    def remove(self) -> None:
        """Undo what was added."""


class Host(Protocol):
    """What the lifecycle asks of a host about one model object."""

    name: str

    def unet(self, model: Any) -> nn.Module | None:
        """The module ToMe patches in `model`: its UNet, or its diffusion transformer where `tome_core` reduces that
        family (a torch.compile wrapper around either as the host keeps it: the core patches the module it wraps);
        None when there is none (a transformer of another family, a placeholder)."""

    def not_patched(self, model: Any) -> str:
        """Why `model` has no module ToMe patches: the core's message naming the class and what ToMe patches
        (`common.short_reason` keeps the part naming the class, for the note)."""

    def family(self, model: Any, module: nn.Module) -> str:
        """The family presets resolve for on `module` (`unet(model)`): `tome_core.model_family`, unless the host
        knows better (Forge Neo builds Flux.2 with its Flux.1 class)."""

    def is_placeholder(self, model: Any) -> bool:
        """Whether `model` stands in for a model not loaded yet (no error is reported for it)."""

    def builtin_applied(self, model: Any) -> bool:
        """Whether the host's built-in token merging is applied to `model` for the pass about to sample."""

    def remove_builtin(self, model: Any) -> bool:
        """Take the built-in token merging off `model` for this pass; False when the host cannot."""

    def switch_off_builtin(self, p: Any, *, is_img2img: bool) -> bool:
        """Switch the built-in token merging off for the generation `p` (before it starts); True if it was on."""

    def video_frames(self, model: Any, batch_size: float | None) -> int:
        """The frames `model` generates per video at the page's `batch_size` (None: the page has no such control),
        where the host turns the batch into frames (Forge Neo's Wan); 1 where it generates a batch of images."""

    def watch(self, unet: nn.Module, on_call: Callable[[], None]) -> Removable | None:
        """Run `on_call()` before each call of `unet`, for a host that fires no script callback per sampler step
        (the lifecycle then sees passes and model swaps from there); None when the host's callbacks suffice."""


def host_of(model: Any) -> Host:
    """The adapter for a model object."""
    if forge.owns(model):
        return forge.HOST
    return sdnext.HOST if sdnext.owns(model) else a1111.HOST


def unet_of(model: Any) -> nn.Module | None:
    """The module ToMe patches in a model object of any host (a UNet or a diffusion transformer), or None."""
    return None if model is None else host_of(model).unet(model)


__all__ = [
    "Host",
    "Removable",
    "a1111",
    "forge",
    "host_of",
    "not_handled",
    "patchable",
    "sdnext",
    "short_reason",
    "unet_of",
]
