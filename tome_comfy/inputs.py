"""The nodes' inputs, generated from `tome_core.field_specs()` and `tome_core.presets()`: no number is restated here.

`Widget` is one node input in host-neutral form; `classic_input` renders it for ComfyUI's `INPUT_TYPES` and
`tome_comfy.nodes` renders it for the V3 schema. `config_from_inputs` turns the values ComfyUI passes back into a
`TomeConfig`, raising an error that names the input for anything ComfyUI's own min/max/choices check let through.

Two things ComfyUI's widgets cannot express directly:
- an optional field (`None` allowed, e.g. `seed`, `mlp_ratio`) has no "empty" widget value: its widget accepts one
  extra value below the field's range, `minimum - 1`, which means None;
- an input named `seed` gets the front-end's "control after generate" widget (randomize on every queue), which would
  re-seed the partitions on every run: that field's input is called `tome_seed` instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tome_core import DEFAULT_PRESET, FAMILIES, Preset, presets
from tome_core.config import FieldSpec, TomeConfig, field_specs
from tome_core.families import LAYOUTS
from tome_core.words import FAMILY_LABELS, change_words, preset_words, speed_words

#: Field name -> input name, where the field's own name means something else to ComfyUI's front-end.
INPUT_NAMES: Mapping[str, str] = {"seed": "tome_seed"}


@dataclass(frozen=True)
class Widget:
    """One node input: ComfyUI type ("FLOAT", "INT", "BOOLEAN", "COMBO"), default, range or options, tooltip."""

    name: str
    kind: str
    default: Any
    tooltip: str
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    options: tuple[str, ...] | None = None
    field: str | None = None  # the TomeConfig field it sets


def _none_value(spec: FieldSpec) -> float:
    """The widget value standing for None in an optional numeric field: one below the field's range."""
    if spec.minimum is None:
        raise ValueError(f"optional field {spec.name} needs a minimum to place its None value below")
    return spec.minimum - 1


def field_widget(spec: FieldSpec) -> Widget:
    """The widget of one `TomeConfig` field."""
    name = INPUT_NAMES.get(spec.name, spec.name)
    tooltip = f"{spec.label}: {spec.help}"
    if spec.choices is not None:
        options = tuple(str(c) for c in spec.choices)
        return Widget(name, "COMBO", str(spec.default), tooltip, options=options, field=spec.name)
    if spec.kind is bool:
        return Widget(name, "BOOLEAN", spec.default, tooltip, field=spec.name)
    kind = "INT" if spec.kind is int else "FLOAT"
    minimum, default = spec.minimum, spec.default
    if spec.optional:
        minimum = _none_value(spec)
        default = minimum if default is None else default
        tooltip += f" {_num(minimum)} = None."
    cast = int if kind == "INT" else float
    return Widget(
        name,
        kind,
        cast(default),
        tooltip,
        minimum=None if minimum is None else cast(minimum),
        maximum=None if spec.maximum is None else cast(spec.maximum),
        step=None if spec.step is None else cast(spec.step),
        field=spec.name,
    )


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def advanced_widgets() -> tuple[Widget, ...]:
    """Every `TomeConfig` field, in the field table's order."""
    return tuple(field_widget(spec) for spec in field_specs())


def preset_by_label() -> dict[str, Preset]:
    return {p.label: p for p in presets()}


def comfy_families() -> tuple[str, ...]:
    """The families a ComfyUI preset resolves for: the UNets' and the diffusion transformers the core reduces in
    ComfyUI (its layouts for ComfyUI's classes), in the order the UIs list them."""
    dits = dict.fromkeys(layout.family for layout in LAYOUTS if layout.host == "ComfyUI")
    return (*FAMILIES, *dits)


def family_text(preset: Preset, family: str) -> str:
    """A preset's figures on one family, at the size people generate with it (`tome_core.words.TYPICAL_SIZES`):
    how much faster a step gets and how much the image changes beside the reference users know; "" where neither
    was measured or estimated yet."""
    speed = speed_words(preset, family)
    held = preset.fidelity.get(family)
    change = f"changes the image {change_words(held)}" if held is not None else ""
    if speed and not change:
        change = "its change not measured yet"  # as the WebUI's hint says it: a speed-up alone is not a promise
    return "; ".join(text for text in (speed, change) if text)


def preset_text(preset: Preset) -> str:
    """What a user reads to choose `preset` before the node knows the model: its own words, then per family that has
    figures (the UNets and ComfyUI's diffusion transformers) the speed-up at that family's usual size and the change
    of the image (`family_text`, the words of `tome_core.words`, as the WebUI's hint); the families without figures
    yet are named as such."""
    parts, unmeasured = [], []
    for family in comfy_families():
        text = family_text(preset, family)
        if text:
            parts.append(f"{FAMILY_LABELS[family]}: {text}")
        else:
            unmeasured.append(FAMILY_LABELS[family])
    text = f"{preset_words(preset)}."
    if parts:
        text += f" {'; '.join(parts)}."
    if unmeasured:
        text += f" {', '.join(unmeasured)}: not measured yet."
    return text


def preset_widgets() -> tuple[Widget, ...]:
    """The simple node's input: the preset, by label."""
    labels = tuple(preset_by_label())
    default = next(p.label for p in presets() if p.name == DEFAULT_PRESET)
    help_text = "\n".join(f"{p.label}: {preset_text(p)}" for p in presets())
    return (
        Widget(
            "preset",
            "COMBO",
            default,
            "Speed against fidelity, resolved for the model's family when sampling starts (speed-ups: one model call"
            f" on a GPU at that family's usual size).\n{help_text}",
            options=labels,
        ),
    )


def classic_input(widget: Widget) -> tuple[Any, ...]:
    """The `INPUT_TYPES` entry of a widget: `(type, options)` or `(choices, options)` for a combo."""
    extra: dict[str, Any] = {"default": widget.default, "tooltip": widget.tooltip}
    if widget.kind == "COMBO":
        return (list(widget.options or ()), extra)
    for key in ("minimum", "maximum", "step"):
        value = getattr(widget, key)
        if value is not None:
            extra[key[:3] if key != "step" else key] = value
    return (widget.kind, extra)


def config_from_inputs(values: Mapping[str, Any]) -> TomeConfig:
    """The `TomeConfig` of the advanced node's input values; ValueError/TypeError naming the input otherwise.

    `TomeConfig` checks the values, and refuses a ratio the strides cannot reach (at most 1 - 1/(sx*sy)) as the
    library, the WebUI and its API do, naming the fields and the maximum: the value on screen is the value that runs.
    """
    fields: dict[str, Any] = {}
    for spec in field_specs():
        widget = field_widget(spec)
        if widget.name not in values:
            raise ValueError(f"input {widget.name!r} is missing")
        value = values[widget.name]
        if spec.choices is not None:
            by_text = {str(c): c for c in spec.choices}
            if str(value) not in by_text:
                raise ValueError(f"input {widget.name!r} must be one of {', '.join(by_text)}, got {value!r}")
            value = by_text[str(value)]
        elif spec.optional and isinstance(value, (int, float)) and value == _none_value(spec):
            value = None
        fields[spec.name] = value
    try:
        return TomeConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise type(exc)(_with_input_names(str(exc))) from exc


def _with_input_names(message: str) -> str:
    """A core error message with each renamed field also called by its input name."""
    for field_name, input_name in INPUT_NAMES.items():
        message = message.replace(f"TomeConfig.{field_name} ", f"TomeConfig.{field_name} (input {input_name!r}) ")
    return message
