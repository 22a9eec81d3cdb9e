"""Everything that differs between WebUI versions (A1111 1.6-1.10, Forge) in the WebUI's own modules.

What differs in the model objects (where the UNet is, how the built-in token merging shows) is in `tome_webui.hosts`.

WebUI modules are imported inside the functions: the WebUI root is always importable, but these must not run
when `tome_webui` is imported (tests import it with a stand-in for the WebUI).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

log = logging.getLogger("tome")

#: The WebUI's built-in token merging settings (tomesd), which `before_process` overrides to 0 for our jobs.
BUILTIN_RATIO_KEYS: tuple[str, ...] = ("token_merging_ratio", "token_merging_ratio_hr", "token_merging_ratio_img2img")
#: Per-job ratios on the processing object, which the WebUI reads before the settings.
BUILTIN_RATIO_ATTRS: tuple[str, ...] = ("token_merging_ratio", "token_merging_ratio_hr")
#: Module names the XYZ plot script is loaded under (A1111/Forge load scripts by file name; SD.Next as a package).
XYZ_MODULE_NAMES: tuple[str, ...] = ("xyz_grid.py", "scripts.xyz_grid")


def has_every_sampling_hook(p: Any) -> bool:
    """Whether the runner calls `process_before_every_sampling` (v1.10+); else `process_batch`/`before_hr` apply."""
    runner = getattr(p, "scripts", None)
    if runner is None:
        from modules import scripts

        runner = scripts.ScriptRunner
    return callable(getattr(runner, "process_before_every_sampling", None))


def input_accordion() -> Any:
    """`modules.ui_components.InputAccordion`: a class in A1111 1.6+, a factory function in Forge 2."""
    from modules.ui_components import InputAccordion

    return InputAccordion


def tooltip_kwargs(text: str) -> dict[str, str]:
    """`{"tooltip": text}` when the WebUI's patched gradio takes `tooltip=`, else nothing.

    The WebUI replaces gradio's component `__init__` with its own function (modules/gradio_extensons.py) that
    accepts `tooltip`; plain gradio 3.41 warns about the unknown kwarg.
    """
    import gradio as gr

    base = getattr(gr.components, "IOComponent", None) or gr.components.Component
    module = getattr(base.__init__, "__module__", "") or ""
    return {"tooltip": text} if module.startswith("modules.") else {}


def opts() -> Any:
    from modules import shared

    return shared.opts


def option(key: str, default: Any = None) -> Any:
    """A WebUI setting read without tripping over options not registered (yet)."""
    return opts().data.get(key, default)


def current_model() -> Any:
    """The current model, or None; unlike `shared.sd_model` this never starts loading one."""
    from modules import sd_models

    return getattr(getattr(sd_models, "model_data", None), "sd_model", None)


def compute_device() -> str | None:
    """The type of the device the WebUI runs its models on ("cuda", "cpu", "mps", ...; `modules.devices.device` in
    every host), None when the host does not say."""
    try:
        from modules import devices
    except ImportError:
        return None
    device = getattr(devices, "device", None)
    kind = getattr(device, "type", device)
    return kind if isinstance(kind, str) else None


def loaded_models() -> Iterator[Any]:
    """Every model the WebUI holds (current and cached), without loading one if none is loaded."""
    from modules import sd_models

    data = getattr(sd_models, "model_data", None)
    cached = getattr(data, "loaded_sd_models", None) or ()
    refiner = getattr(data, "sd_refiner", None)  # SD.Next keeps its refiner pipeline beside the model
    seen: set[int] = set()
    for model in (current_model(), refiner, *cached):
        if model is not None and id(model) not in seen:
            seen.add(id(model))
            yield model


def denoiser_p(params: Any) -> Any:
    """The processing object behind an `on_cfg_denoiser` call (`params.denoiser.p`, v1.8+), else None."""
    return getattr(getattr(params, "denoiser", None), "p", None)


def xyz_module() -> ModuleType | None:
    """The loaded XYZ plot script module, or None when it is not loaded."""
    from modules import scripts

    for data in getattr(scripts, "scripts_data", ()):
        if data.script_class.__module__ in XYZ_MODULE_NAMES:
            return data.module
    return None
