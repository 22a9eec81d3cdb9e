"""Like modules/sd_models.py: the loaded models, checkpoint switches and the built-in token merging."""

from __future__ import annotations

from typing import Any

from modules import script_callbacks


class SdModelData:
    def __init__(self) -> None:
        self.sd_model: Any = None
        self.loaded_sd_models: list[Any] = []
        self.main: Any = None  # the stub's "selected checkpoint": reload_model_weights() returns to it


model_data = SdModelData()
#: Every ratio the built-in token merging was asked to apply, in order (tests read it).
builtin_calls: list[float] = []


def reset() -> None:
    model_data.__init__()
    builtin_calls.clear()


def load(model: Any, *, main: bool = False) -> None:
    """Make `model` current (like load_model/reload_model_weights) and fire on_model_loaded."""
    if main:
        model_data.main = model
    if model_data.sd_model is model:
        return
    model_data.sd_model = model
    if model not in model_data.loaded_sd_models:
        model_data.loaded_sd_models.append(model)
    script_callbacks.model_loaded_callback(model)


def reload_model_weights(info: Any = None) -> None:
    """Switch to `info` (a model object in the stub), or back to the main checkpoint."""
    load(info if info is not None else model_data.main)


def apply_token_merging(sd_model: Any, token_merging_ratio: float) -> None:
    """The built-in ToMe: the stub only keeps the WebUI's bookkeeping (`applied_token_merged_ratio`)."""
    builtin_calls.append(token_merging_ratio)
    current = getattr(sd_model, "applied_token_merged_ratio", 0)
    if current == token_merging_ratio:
        return
    sd_model.applied_token_merged_ratio = token_merging_ratio
