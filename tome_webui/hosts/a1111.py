"""AUTOMATIC1111 1.6-1.10: the UNet at `sd_model.model.diffusion_model`, the built-in tomesd on the model."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch import nn

import tome_core
from tome_webui import compat
from tome_webui.hosts.common import not_handled

log = logging.getLogger("tome")


class A1111Host:
    name = "a1111"

    def unet(self, model: Any) -> nn.Module | None:
        try:
            return tome_core.find_model(model)
        except TypeError:  # SD3's MMDiT, a placeholder: nothing to patch, which the lifecycle reports
            return None

    def not_patched(self, model: Any) -> str:
        return not_handled(getattr(getattr(model, "model", None), "diffusion_model", None), model)

    def family(self, model: Any, module: nn.Module) -> str:
        return tome_core.model_family(module)

    def is_placeholder(self, model: Any) -> bool:
        return model is None

    def builtin_applied(self, model: Any) -> bool:
        return builtin_ratio(model) > 0

    def remove_builtin(self, model: Any) -> bool:
        # tomesd swaps block classes and keeps state that `tomesd.remove_patch` would strip from us too.
        return False

    def switch_off_builtin(self, p: Any, *, is_img2img: bool) -> bool:
        return switch_off_builtin(p, is_img2img=is_img2img)

    def video_frames(self, model: Any, batch_size: float | None) -> int:
        return 1  # a batch is of images

    def watch(self, unet: nn.Module, on_call: Callable[[], None]) -> None:
        return None  # `on_cfg_denoiser` fires before every UNet evaluation


def builtin_ratio(model: Any) -> float:
    """The ratio A1111's built-in token merging has applied to `model` (0 when it is not applied)."""
    try:
        return float(getattr(model, "applied_token_merged_ratio", 0) or 0)
    except (TypeError, ValueError):
        log.debug("ToMe: unreadable applied_token_merged_ratio on %s", type(model).__name__)
        return 0.0


def switch_off_builtin(p: Any, *, is_img2img: bool) -> bool:
    """Set the built-in token merging ratios to 0 for this job; True if it would have merged (A1111 and Forge).

    Only done when the built-in would run. The settings are overridden on a copy of `p.override_settings` (XYZ
    cells share the dict); with `override_settings_restore_afterwards` off, the WebUI keeps overrides, so the
    settings are put back in `postprocess` (for options present in `opts.data`; an absent one stays at its
    default 0). Ratios set on `p` itself (which the WebUI reads first) are set to 0 on `p`.
    """
    overrides = dict(getattr(p, "override_settings", None) or {})

    def number(raw: Any, what: str) -> float:
        try:
            return float(raw or 0)
        except (TypeError, ValueError):
            log.debug("ToMe: unreadable %s=%r", what, raw)
            return 0.0

    def setting(key: str) -> float:
        return number(overrides[key] if key in overrides else compat.option(key, 0), key)

    own = {attr: number(getattr(p, attr, 0), attr) for attr in compat.BUILTIN_RATIO_ATTRS}
    ratio, ratio_hr, ratio_img2img = (setting(key) for key in compat.BUILTIN_RATIO_KEYS)
    ratio = ratio or own["token_merging_ratio"]
    ratio_hr = ratio_hr or own["token_merging_ratio_hr"]
    if is_img2img:
        active = ratio_img2img > 0 or ratio > 0
    else:
        active = ratio > 0 or (bool(getattr(p, "enable_hr", False)) and ratio_hr > 0)
    if not active:
        return False
    if not getattr(p, "override_settings_restore_afterwards", True):
        data = compat.opts().data
        p.tome_builtin_restore = {key: data[key] for key in compat.BUILTIN_RATIO_KEYS if key in data}
    p.override_settings = {**overrides, **dict.fromkeys(compat.BUILTIN_RATIO_KEYS, 0)}
    for attr, value in own.items():
        if value:
            setattr(p, attr, 0)
    return True


HOST = A1111Host()
