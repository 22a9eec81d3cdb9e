"""Like modules/script_callbacks.py: registrars, and firing that reports (swallows) exceptions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from modules import errors

NAMES = ("before_ui", "app_started", "cfg_denoiser", "model_loaded", "script_unloaded", "infotext_pasted")
callbacks: dict[str, list[Callable[..., Any]]] = {name: [] for name in NAMES}


class CFGDenoiserParams:
    def __init__(
        self,
        x: Any,
        image_cond: Any,
        sigma: Any,
        sampling_step: int,
        total_sampling_steps: int,
        text_cond: Any,
        text_uncond: Any,
        denoiser: Any = None,
    ) -> None:
        self.x = x
        self.image_cond = image_cond
        self.sigma = sigma
        self.sampling_step = sampling_step
        self.total_sampling_steps = total_sampling_steps
        self.text_cond = text_cond
        self.text_uncond = text_uncond
        if denoiser is not None:  # v1.8+
            self.denoiser = denoiser


class LegacyCFGDenoiserParams(CFGDenoiserParams):
    """v1.6/1.7: no `denoiser` attribute."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args[:7])


def clear_callbacks() -> None:
    for items in callbacks.values():
        items.clear()


def _fire(name: str, *args: Any) -> None:
    for callback in list(callbacks[name]):
        try:
            callback(*args)
        except Exception:
            errors.report(f"Error executing callback {name}", exc_info=True)


def on_before_ui(callback: Callable[[], None]) -> None:
    callbacks["before_ui"].append(callback)


def on_app_started(callback: Callable[[Any, Any], None]) -> None:
    callbacks["app_started"].append(callback)


def on_cfg_denoiser(callback: Callable[[CFGDenoiserParams], None]) -> None:
    callbacks["cfg_denoiser"].append(callback)


def on_model_loaded(callback: Callable[[Any], None]) -> None:
    callbacks["model_loaded"].append(callback)


def on_script_unloaded(callback: Callable[[], None]) -> None:
    callbacks["script_unloaded"].append(callback)


def on_infotext_pasted(callback: Callable[[str, dict[str, Any]], None]) -> None:
    callbacks["infotext_pasted"].append(callback)


def before_ui_callback() -> None:
    _fire("before_ui")


def app_started_callback(demo: Any, app: Any) -> None:
    _fire("app_started", demo, app)


def cfg_denoiser_callback(params: CFGDenoiserParams) -> None:
    _fire("cfg_denoiser", params)


def model_loaded_callback(sd_model: Any) -> None:
    _fire("model_loaded", sd_model)


def script_unloaded_callback() -> None:
    _fire("script_unloaded")
