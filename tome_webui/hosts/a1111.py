"""AUTOMATIC1111 1.6-1.10: the UNet at `sd_model.model.diffusion_model`, the built-in tomesd on the model."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

import tome_core

log = logging.getLogger("tome")


class A1111Host:
    name = "a1111"

    def unet(self, model: Any) -> nn.Module | None:
        try:
            return tome_core.find_unet(model)
        except TypeError:  # SD3's MMDiT, a placeholder: nothing to patch, which the lifecycle reports
            return None

    def is_placeholder(self, model: Any) -> bool:
        return model is None

    def builtin_applied(self, model: Any) -> bool:
        return builtin_ratio(model) > 0

    def remove_builtin(self, model: Any) -> bool:
        # tomesd swaps block classes and keeps state that `tomesd.remove_patch` would strip from us too.
        return False


def builtin_ratio(model: Any) -> float:
    """The ratio A1111's built-in token merging has applied to `model` (0 when it is not applied)."""
    try:
        return float(getattr(model, "applied_token_merged_ratio", 0) or 0)
    except (TypeError, ValueError):
        log.debug("ToMe: unreadable applied_token_merged_ratio on %s", type(model).__name__)
        return 0.0


HOST = A1111Host()
