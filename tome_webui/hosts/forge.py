"""Forge 2 and Forge Neo (`backend/`) and the Forge 1 forks (reForge, Forge Classic): models that carry
`forge_objects`.

The module ToMe patches is `sd_model.forge_objects.unet.model.diffusion_model` (in Forge 2 the engine has no
`.model`; in the Forge 1 forks `.model.diffusion_model` is the same module): a UNet, or in Forge Neo a diffusion
transformer (`backend.nn.flux.IntegratedFluxTransformer2DModel` for Flux.1, Flux.2 and their variants,
`backend.nn.chroma.IntegratedChromaTransformer2DModel`, `backend.nn.wan.WanModel`,
`backend.nn.qwen.QwenImageTransformer2DModel`, `backend.nn.lumina.NextDiT` for Lumina 2 and Z-Image, each reduced
by `tome_core`; Neo's `Anima` is not, and gets the core's words naming the class). It is one module instance for every generation until a
checkpoint change builds a new one, and it is called with `transformer_options`, which our forward hooks ignore.
Where Neo's Torch Compile Integrated has put a `torch.compile` wrapper there, the wrapper is handed to `tome_core`,
which patches the module it runs.

`forge_objects.unet` is a patcher (ComfyUI's ModelPatcher) that the host resets before every sampling. The
built-in token merging adds `TomePatcher` functions as attn1 patches to it; they are taken off by replacing
`forge_objects.unet` with a clone without them, which the host's next reset discards like any other patch.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from torch import nn

import tome_core
from tome_webui.hosts import a1111
from tome_webui.hosts.common import not_handled, patchable

#: Class names of the object Forge 2 holds as `sd_model` before the first checkpoint is loaded.
PLACEHOLDERS: frozenset[str] = frozenset({"FakeInitialModel"})
#: The built-in's patch functions are closures defined in `TomePatcher.patch`.
BUILTIN_QUALNAME_PREFIX = "TomePatcher."
#: Forge Neo's engines whose transformer class serves another family than its own: Neo builds Flux.2 (Klein) with
#: its Flux.1 class (`backend/loader.py`: "Flux2Transformer2DModel" -> `IntegratedFluxTransformer2DModel`).
ENGINE_FAMILIES: dict[str, str] = {"Flux2": "flux2"}


def owns(model: Any) -> bool:
    return hasattr(model, "forge_objects") or type(model).__name__ in PLACEHOLDERS


def _patcher(model: Any) -> Any:
    return getattr(getattr(model, "forge_objects", None), "unet", None)


def _diffusion_model(model: Any) -> Any:
    return getattr(getattr(_patcher(model), "model", None), "diffusion_model", None)


def _patches(patcher: Any) -> dict[str, list[Any]]:
    options = getattr(patcher, "model_options", None) or {}
    return (options.get("transformer_options") or {}).get("patches") or {}


def _is_builtin(fn: Any) -> bool:
    return str(getattr(fn, "__qualname__", "")).startswith(BUILTIN_QUALNAME_PREFIX)


class ForgeHost:
    name = "forge"

    def unet(self, model: Any) -> nn.Module | None:
        inner = _diffusion_model(model)
        return inner if patchable(inner) else None  # None: a transformer of no family ToMe reduces

    def not_patched(self, model: Any) -> str:
        return not_handled(_diffusion_model(model), model)

    def family(self, model: Any, module: nn.Module) -> str:
        family = tome_core.model_family(module)
        return ENGINE_FAMILIES.get(type(model).__name__, family) if family == "flux" else family

    def is_placeholder(self, model: Any) -> bool:
        return type(model).__name__ in PLACEHOLDERS

    def builtin_applied(self, model: Any) -> bool:
        return any(_is_builtin(fn) for fns in _patches(_patcher(model)).values() for fn in fns)

    def remove_builtin(self, model: Any) -> bool:
        patcher = _patcher(model)
        if patcher is None or not callable(getattr(patcher, "clone", None)):
            return False
        clone = patcher.clone()  # deep-copies model_options: the patcher the host resets to keeps its patches
        patches = _patches(clone)
        for name, fns in list(patches.items()):
            kept = [fn for fn in fns if not _is_builtin(fn)]
            if kept:
                patches[name] = kept
            else:  # an empty list still makes Forge pass keys/values explicitly
                del patches[name]
        model.forge_objects.unet = clone
        return not self.builtin_applied(model)

    def switch_off_builtin(self, p: Any, *, is_img2img: bool) -> bool:
        return a1111.switch_off_builtin(p, is_img2img=is_img2img)  # the same settings as A1111

    def video_frames(self, model: Any, batch_size: float | None) -> int:
        if not (getattr(model, "is_wan", False) and _neo_dynamic_args().get("wan")):
            return 1
        return neo_frames(batch_size)

    def watch(self, unet: nn.Module, on_call: Callable[[], None]) -> None:
        return None  # `on_cfg_denoiser` fires before every UNet evaluation


def _neo_dynamic_args() -> dict[str, Any]:
    """Forge Neo's `backend.args.dynamic_args`, set by its loader for the checkpoint loaded; {} outside Neo. Read from
    `sys.modules`, never imported: in Neo it is loaded long before any hint, and importing it elsewhere (Forge 2 has a
    `backend.args` too) would parse the command line for nothing."""
    module = sys.modules.get("backend.args")
    found = getattr(module, "dynamic_args", None)
    return found if isinstance(found, dict) else {}


def neo_frames(batch_size: float | None) -> int:
    """The frames of Forge Neo's Wan video at a batch size, as `modules/processing.py: process_images_inner` rounds
    it (down to 4k+1, ComfyUI's Wan rule: the Wan VAE packs 4 frames into each latent frame after the first);
    1 for a missing or unusable value (the slider's default)."""
    if batch_size is None or not math.isfinite(batch_size) or batch_size < 1:
        return 1
    times = (int(batch_size) - 1) // 4 + 1
    return (times - 1) * 4 + 1


HOST = ForgeHost()
