"""SD.Next (vladmandic/sdnext): the loaded model is a diffusers pipeline, its UNet at `pipeline.unet` or its
diffusion transformer at `pipeline.transformer`.

What the lifecycle relies on (read from SD.Next master 058a7f0, see docs/hosts.md):

* `shared.sd_model` is a diffusers pipeline; the hires pass runs the same UNet through an image-to-image pipeline
  made from it, the refiner is `shared.sd_refiner` with a UNet of its own. Pipelines without a UNet (Flux, SD3,
  Qwen-Image, Z-Image, Lumina 2, Wan: `.transformer`) are patched through that transformer where `tome_core` reduces its family
  (diffusers' own classes, `tome_core.families`); another transformer gets the core's words naming its class.
* Its ScriptRunner has neither `process_before_every_sampling` nor `before_hr`, and `on_cfg_denoiser` never fires
  on the diffusers path. The first pass is applied from `process_batch` (the lifecycle's path for hosts without the
  per-sampling hook); the passes after it are seen from the UNet itself: `watch` wraps its instance's `forward` to
  run the lifecycle's per-call check first (`p.is_hr_pass` says which pass runs).
* The built-in token merging (`modules/token_merge.py`) is applied in `process_pre` from the settings alone:
  `token_merging_method` ("None", "ToMe": tomesd, "ToDo": an attention processor), `tome_ratio`, `todo_ratio`; its
  infotext reads the same names on `p` first. It is switched off for our generation through `override_settings`
  (SD.Next restores overridden settings afterwards) and on `p`. It is never removed by us: its ToDo removal resets
  every attention processor to `AttnProcessor2_0`, which would drop another extension's processors too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch import nn

import tome_core
from tome_webui import compat
from tome_webui.hosts.common import not_handled, patchable

log = logging.getLogger("tome")

#: The built-in's settings (and per-request fields of the same name on `p`).
METHOD_KEY = "token_merging_method"
RATIO_KEYS: dict[str, str] = {"ToMe": "tome_ratio", "ToDo": "todo_ratio"}
#: The value of `token_merging_method` that switches the built-in off.
OFF = "None"
#: Attributes the built-in sets on the pipeline while it is applied (ratio, 0 when not).
APPLIED_ATTRS: tuple[str, ...] = ("applied_tome", "applied_todo")


def owns(model: Any) -> bool:
    """A diffusers pipeline (a scheduler and components), not an ldm/sgm model or a Forge engine."""
    return (
        model is not None
        and hasattr(model, "scheduler")
        and isinstance(getattr(model, "components", None), dict)
        and not hasattr(model, "forge_objects")
    )


def _number(raw: Any, what: str) -> float:
    try:
        return float(raw or 0)
    except (TypeError, ValueError):
        log.debug("ToMe: unreadable %s=%r", what, raw)
        return 0.0


def _setting(p: Any, key: str) -> Any:
    """What SD.Next's infotext and (through the settings) its `process_pre` read: `p` first, then the settings."""
    overrides = getattr(p, "override_settings", None) or {}
    value = getattr(p, key, None)
    if value is not None:
        return value
    if key in overrides:
        return overrides[key]
    value = compat.option(key)  # `opts.data` holds only what was set; the registered default is read through opts
    return value if value is not None else getattr(compat.opts(), key, None)


class SDNextHost:
    name = "sdnext"

    def unet(self, model: Any) -> nn.Module | None:
        unet = getattr(model, "unet", None)
        if isinstance(unet, nn.Module) and hasattr(unet, "down_blocks"):
            return unet
        transformer = getattr(model, "transformer", None)
        if isinstance(transformer, nn.Module) and patchable(transformer):
            return transformer
        return None  # a transformer of no family ToMe reduces, or none loaded

    def not_patched(self, model: Any) -> str:
        return not_handled(getattr(model, "transformer", None), model)

    def family(self, model: Any, module: nn.Module) -> str:
        return tome_core.model_family(module)

    def is_placeholder(self, model: Any) -> bool:
        return model is None

    def builtin_applied(self, model: Any) -> bool:
        return any(_number(getattr(model, attr, 0), attr) > 0 for attr in APPLIED_ATTRS)

    def remove_builtin(self, model: Any) -> bool:
        # ToDo's remove_patch resets every attention processor to AttnProcessor2_0 (another extension's too).
        return False

    def switch_off_builtin(self, p: Any, *, is_img2img: bool) -> bool:
        method = _setting(p, METHOD_KEY)
        ratio_key = RATIO_KEYS.get(str(method))
        if ratio_key is None or _number(_setting(p, ratio_key), ratio_key) <= 0:
            return False
        p.override_settings = {**(getattr(p, "override_settings", None) or {}), METHOD_KEY: OFF}
        setattr(p, METHOD_KEY, OFF)  # the infotext reads `p` first
        return True

    def video_frames(self, model: Any, batch_size: float | None) -> int:
        return 1  # its video tab sets frames of its own; the batch of txt2img/img2img is of images

    def watch(self, unet: nn.Module, on_call: Callable[[], None]) -> ForwardWatch:
        return ForwardWatch(unet, on_call)


class ForwardWatch:
    """Runs `on_call()` at the start of each call of `unet`, through an instance-level `forward`.

    Not a forward pre-hook: torch runs the pre-hooks from a list taken before the first of them, so a patch applied
    or removed from inside one would miss its own UNet-level pre-hook (or have a removed one called wrongly). By the
    time `forward` runs every pre-hook has run: those that `on_call` added are run here, in order; the forward
    hooks are read after `forward`, so the new patch's are run and a removed patch's are not.
    """

    def __init__(self, unet: nn.Module, on_call: Callable[[], None]) -> None:
        self.unet = unet
        self.on_call: Callable[[], None] | None = on_call
        self.had_own = "forward" in unet.__dict__  # another wrapper (accelerate's offload hook) set before us
        self.inner = unet.forward
        unet.forward = self.forward

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        on_call, unet = self.on_call, self.unet
        if on_call is not None:
            before = set(unet._forward_pre_hooks)
            on_call()
            for hook_id, added in list(unet._forward_pre_hooks.items()):
                if hook_id in before:
                    continue
                if hook_id in unet._forward_pre_hooks_with_kwargs:
                    result = added(unet, args, kwargs)
                    if result is not None:
                        args, kwargs = result
                else:
                    result = added(unet, args)
                    if result is not None:
                        args = result if isinstance(result, tuple) else (result,)
        return self.inner(*args, **kwargs)

    def remove(self) -> None:
        self.on_call = None
        if self.unet.__dict__.get("forward") != self.forward:
            log.debug("ToMe: %s.forward was wrapped after ours; ours stays in place, inert", type(self.unet).__name__)
            return
        if self.had_own:
            self.unet.forward = self.inner
        else:
            del self.unet.forward


HOST = SDNextHost()
