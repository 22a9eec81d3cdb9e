"""XYZ plot axes: "[ToMe] Enabled", "[ToMe] Preset", "[ToMe] Hires preset", "[ToMe] Ratio", "[ToMe] Hires ratio",
"[ToMe] Strides", "[ToMe] Max downsample".

Registered from `on_before_ui` (which runs again on every Reload UI; existing "[ToMe]" axes are never added
twice). An axis's `apply` stores its value by arg name in `p.tome_xyz`, a fresh dict per plot cell; the hooks
lay it over the UI args (`tome_webui.params.resolve`). Any value axis turns ToMe on for the plot unless an
"[ToMe] Enabled" axis says otherwise.

* "[ToMe] Preset" picks the speed preset (or "custom") of the first pass (and of the hires pass in "same" mode);
  "[ToMe] Hires preset" switches the hires pass to its own settings with that preset.
* "[ToMe] Ratio", "[ToMe] Strides", "[ToMe] Max downsample" set that value: with Custom, in the custom settings;
  with a preset, laid over the preset's values for the model that runs (the infotext then records the cell as
  custom values, which paste back exactly).
* "[ToMe] Hires ratio" switches the hires pass to its own custom settings (the other hires settings following
  the first pass, unless the UI already has own custom settings).

`confirm` checks every value before the plot starts, with the same messages as the API.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from tome_webui import compat
from tome_webui.params import PRESET_CHOICES, TomeArgsError, coerce, spec

log = logging.getLogger("tome")

PREFIX = "[ToMe]"
_STRIDES = re.compile(r"^\s*(\d+)\s*(?:[x*× ]\s*(\d+)\s*)?$")


def register_axes() -> None:
    """`script_callbacks.on_before_ui`: add our axes to the XYZ plot script, once."""
    module = compat.xyz_module()
    if module is None:
        log.debug("ToMe: the XYZ plot script is not loaded; no axes added")
        return
    options = module.axis_options
    if any(str(getattr(option, "label", "")).startswith(PREFIX) for option in options):
        return
    options.extend(make_axes(module))


def make_axes(module: Any) -> list[Any]:
    """Our `AxisOption`s, built from the XYZ module's own classes."""
    axis = module.AxisOption
    txt2img_axis = getattr(module, "AxisOptionTxt2Img", axis)
    return [
        axis(
            f"{PREFIX} Enabled",
            str,
            _apply("enabled"),
            confirm=_confirm("enabled"),
            choices=lambda: ["True", "False"],
        ),
        axis(
            f"{PREFIX} Preset", str, _apply("preset"), confirm=_confirm("preset"), choices=lambda: list(PRESET_CHOICES)
        ),
        txt2img_axis(
            f"{PREFIX} Hires preset",
            str,
            _apply("hr_preset"),
            confirm=_confirm("hr_preset"),
            choices=lambda: list(PRESET_CHOICES),
        ),
        axis(f"{PREFIX} Ratio", float, _apply("ratio"), confirm=_confirm("ratio")),
        txt2img_axis(f"{PREFIX} Hires ratio", float, _apply("hr_ratio"), confirm=_confirm("hr_ratio")),
        axis(f"{PREFIX} Strides", str, apply_strides, confirm=confirm_strides),
        axis(
            f"{PREFIX} Max downsample",
            str,
            _apply("max_downsample"),
            confirm=_confirm("max_downsample"),
            choices=lambda: [str(choice) for choice in spec("max_downsample").choices or ()],
        ),
    ]


def _store(p: Any, values: dict[str, Any]) -> None:
    # A new dict each time: XYZ cells are shallow copies of one `p`.
    p.tome_xyz = {**(getattr(p, "tome_xyz", None) or {}), **values}


def _apply(arg_name: str) -> Callable[[Any, Any, Any], None]:
    def apply(p: Any, value: Any, values: Any) -> None:
        _store(p, {arg_name: coerce(arg_name, value, f"{PREFIX} {arg_name}")})

    return apply


def _confirm(arg_name: str) -> Callable[[Any, Sequence[Any]], None]:
    def confirm(p: Any, values: Sequence[Any]) -> None:
        for value in values:
            coerce(arg_name, value, f"{PREFIX} {arg_name}")

    return confirm


def parse_strides(value: Any) -> tuple[int, int]:
    """ "2x2", "2 2", "2*2" or "2" (both) -> (sx, sy); raises TomeArgsError."""
    match = _STRIDES.match(str(value))
    if match is None:
        raise TomeArgsError(f"{PREFIX} Strides", f"must be like '2x2' (sx x sy) or '2', got {value!r}")
    sx = coerce("sx", match.group(1), f"{PREFIX} Strides sx")
    sy = coerce("sy", match.group(2) or match.group(1), f"{PREFIX} Strides sy")
    return sx, sy


def apply_strides(p: Any, value: Any, values: Any) -> None:
    sx, sy = parse_strides(value)
    _store(p, {"sx": sx, "sy": sy})


def confirm_strides(p: Any, values: Sequence[Any]) -> None:
    for value in values:
        parse_strides(value)
