"""The accordion: a speed selector, then controls built from `tome_core.field_specs()`.

The components `ui()` returns are in `tome_webui.params.ARG_NAMES` order (the API contract); the page order is
the one below. Element ids (for javascript/ and style.css): every item gets `Script.elem_id(item)`, which is
`script_<tab>_tome_<item>` with <tab> `txt2img` or `img2img` (see `elem_id`). The items, `ELEM_ITEMS`:

    enable             the InputAccordion; the WebUI adds `<id>-checkbox` (hidden input) and, in JS,
                       `<id>-visible-checkbox` in its label
    preset             radio "Speed": Quality / Balanced / Fast / Fastest / Custom (values: the preset names
                       of `tome_core.presets()` and "custom"); starts at `tome_core.DEFAULT_PRESET`
    cap_note           HTML note under it, a `div.tome-cap-note`: for a preset, what it runs on SD1/SD2 and on
                       SDXL; for Custom, the ratio actually merged and whether the strides cap it (class
                       `tome-capped` when they do), or the pooling in kv mode; plus the Hires fix pass where it
                       differs from the first pass. For javascript/ the div carries `data-tome-first` (and
                       `data-tome-hires` when the hires pass runs a preset as it is): JSON of the configs per model
                       family,
                       and `data-tome-preset`, `data-tome-hr-mode`, `data-tome-hr-preset`: the selector values it
                       was made for
    custom             the column of the detailed settings, shown only for Custom, holding:
    ratio, max_downsample, sx, sy, mode
                       the main controls
    advanced           the "Advanced" accordion holding:
    use_rand, merge_attn, merge_crossattn, merge_mlp, seed, matching, step_start, step_end, mlp_ratio, share_plan,
    mlp_min_downsample
    hires              txt2img only: the Hires fix pass group (container) holding:
    hr_mode            radio "Same as first pass" / "Own settings" / "Off" (values "same", "own", "off")
    hr_settings        the column shown only for "Own settings", holding:
    hr_preset          radio "Hires speed", the same choices as `preset`
    hr_custom          the column shown only when `hr_preset` is Custom, holding:
    hr_ratio, hr_max_downsample, hr_sx, hr_sy

Help texts are the `FieldSpec.help` strings (and `PRESET_HELP`, `HIRES_PRESET_HELP`); they are passed as
`tooltip=` only where the WebUI's patched gradio takes it (otherwise hints are left to javascript/).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tome_core import FAMILIES, TomeConfig, presets
from tome_webui import compat, infotext
from tome_webui.params import (
    CUSTOM,
    FIELD_NAMES,
    HIRES_ARGS,
    HIRES_MODE_LABELS,
    OPTIONAL_NONE,
    PRESET_CHOICES,
    PRESET_LABELS,
    TITLE,
    TomeArgsError,
    TomeJob,
    arg_names,
    coerce,
    defaults,
    field_of,
    resolve,
    spec,
    ui_value,
)

ACCORDION_LABEL = "Token Merging (ToMe)"
HIRES_LABEL = "Hires fix pass"
PRESET_LABEL = "Speed"
HIRES_PRESET_LABEL = "Hires speed"
FAMILY_LABELS: Mapping[str, str] = {"sd": "SD1/SD2", "sdxl": "SDXL"}
PRESET_HELP = (
    "Speed against fidelity: each preset is a point measured on the speed/deviation frontier, resolved for the"
    " loaded model (SD1/SD2 or SDXL) and, in its hires variant, for the Hires fix pass. "
    + " ".join(f"{preset.label}: {preset.help}" for preset in presets())
    + " Custom: the settings below."
)
HIRES_PRESET_HELP = (
    "The Hires fix pass's own speed setting, in its hires variant for the loaded model. Custom: the ratio, max"
    " downsample and strides below; the other settings follow the first pass."
)
#: Fields in the main area; the others go into "Advanced".
MAIN_FIELDS: tuple[str, ...] = tuple(name for name in FIELD_NAMES if not spec(name).advanced)
ADVANCED_FIELDS: tuple[str, ...] = tuple(name for name in FIELD_NAMES if spec(name).advanced)
#: Every `elem_id` item, in page order (see the module docstring).
ELEM_ITEMS: tuple[str, ...] = (
    "enable",
    "preset",
    "cap_note",
    "custom",
    *MAIN_FIELDS,
    "advanced",
    *ADVANCED_FIELDS,
    "hires",
    "hr_mode",
    "hr_settings",
    "hr_preset",
    "hr_custom",
    *HIRES_ARGS,
)
#: The controls the note reads, per tab.
NOTE_ARGS: tuple[str, ...] = ("preset", "ratio", "sx", "sy", "mode")
HIRES_NOTE_ARGS: tuple[str, ...] = ("hr_mode", "hr_preset", *HIRES_ARGS)


def elem_id(tab: str, item: str) -> str:
    """The id `Script.elem_id(item)` gives in `tab` ("txt2img"/"img2img"), for documentation and tests."""
    return f"script_{tab}_{TITLE.lower()}_{item}"


def label_of(arg_name: str) -> str:
    """The control's label; unique within the script, as ui-config.json keys are built from labels."""
    if arg_name == "hr_mode":
        return HIRES_LABEL
    if arg_name == "preset":
        return PRESET_LABEL
    if arg_name == "hr_preset":
        return HIRES_PRESET_LABEL
    label = spec(field_of(arg_name)).label
    if arg_name in HIRES_ARGS:
        return f"Hires {label[:1].lower()}{label[1:]}"
    if spec(arg_name).optional:
        return f"{label} ({OPTIONAL_NONE}: default)"
    return label


def widget(arg_name: str) -> str:
    """Which control a field gets: "checkbox", "radio", "number" or "slider"."""
    s = spec(field_of(arg_name))
    if s.kind is bool:
        return "checkbox"
    if s.choices is not None:
        return "radio"
    if s.optional or s.minimum is None or s.maximum is None:
        return "number"
    return "slider"


def component(arg_name: str, element_id: str) -> Any:
    """One control for a TomeConfig field (or its hires twin), built from its FieldSpec."""
    import gradio as gr

    s = spec(field_of(arg_name))
    value = ui_value(arg_name, defaults()[arg_name])
    common: dict[str, Any] = {"label": label_of(arg_name), "elem_id": element_id, **compat.tooltip_kwargs(s.help)}
    kind = widget(arg_name)
    if kind == "checkbox":
        return gr.Checkbox(value=value, **common)
    if kind == "radio":
        return gr.Radio(choices=[str(choice) for choice in s.choices or ()], value=value, **common)
    if kind == "number":
        low = OPTIONAL_NONE if s.optional else s.minimum
        return gr.Number(value=value, precision=0 if s.kind is int else None, minimum=low, maximum=s.maximum, **common)
    return gr.Slider(minimum=s.minimum, maximum=s.maximum, step=s.step, value=value, **common)


def preset_radio(arg_name: str, element_id: str) -> Any:
    """The speed selector of the first pass (`preset`) or of the hires pass (`hr_preset`)."""
    import gradio as gr

    return gr.Radio(
        choices=[(PRESET_LABELS[choice], choice) for choice in PRESET_CHOICES],
        value=defaults()[arg_name],
        label=label_of(arg_name),
        elem_id=element_id,
        **compat.tooltip_kwargs(PRESET_HELP if arg_name == "preset" else HIRES_PRESET_HELP),
    )


def build(script: Any, is_img2img: bool) -> list[Any]:
    """Build the accordion for `script.ui(is_img2img)`; return the arg components in `ARG_NAMES` order.

    Also sets `script.infotext_fields` and `script.paste_field_names`. Safe to call again (the API calls `ui()`
    twice per runner to read defaults): it only creates components inside the caller's gr.Blocks.
    """
    import gradio as gr

    names = arg_names(is_img2img)
    made: dict[str, Any] = {}

    def add(group: tuple[str, ...]) -> None:
        for name in group:
            made[name] = component(name, script.elem_id(name))

    def add_rows(group: tuple[str, ...]) -> None:
        """Sliders, then choices and numbers, then checkboxes, each kind in a row of its own."""
        sliders = tuple(n for n in group if widget(n) == "slider")
        checkboxes = tuple(n for n in group if widget(n) == "checkbox")
        others = tuple(n for n in group if n not in sliders and n not in checkboxes)
        for row in (sliders, others, checkboxes):
            if row:
                with gr.Row():
                    add(row)

    note_names = note_args(is_img2img)
    accordion = compat.input_accordion()
    with accordion(False, label=ACCORDION_LABEL, elem_id=script.elem_id("enable")) as enabled:
        made["enabled"] = enabled
        made["preset"] = preset_radio("preset", script.elem_id("preset"))
        note = gr.HTML(
            value=note_html({n: ui_value(n, defaults()[n]) for n in note_names}, is_img2img=is_img2img),
            elem_id=script.elem_id("cap_note"),
        )
        with gr.Column(visible=defaults()["preset"] == CUSTOM, elem_id=script.elem_id("custom")) as custom:
            with gr.Row():
                add(("ratio",))
            add_rows(tuple(n for n in MAIN_FIELDS if n != "ratio"))
            with gr.Accordion("Advanced", open=False, elem_id=script.elem_id("advanced")):
                add_rows(ADVANCED_FIELDS)
        _on_change(made["preset"], custom_visibility, [made["preset"]], [custom])
        if not is_img2img:
            with gr.Group(elem_id=script.elem_id("hires")):
                made["hr_mode"] = gr.Radio(
                    choices=[(label, mode) for mode, label in HIRES_MODE_LABELS.items()],
                    value=defaults()["hr_mode"],
                    label=HIRES_LABEL,
                    elem_id=script.elem_id("hr_mode"),
                )
                with gr.Column(visible=defaults()["hr_mode"] == "own", elem_id=script.elem_id("hr_settings")) as own:
                    made["hr_preset"] = preset_radio("hr_preset", script.elem_id("hr_preset"))
                    with gr.Column(
                        visible=defaults()["hr_preset"] == CUSTOM, elem_id=script.elem_id("hr_custom")
                    ) as hr_custom:
                        with gr.Row():
                            add(("hr_ratio",))
                        add_rows(tuple(n for n in HIRES_ARGS if n != "hr_ratio"))
            _on_change(made["hr_mode"], hires_visibility, [made["hr_mode"]], [own])
            _on_change(made["hr_preset"], custom_visibility, [made["hr_preset"]], [hr_custom])
    note_inputs = [made[name] for name in note_names]
    for control in note_inputs:
        _on_change(control, note_function(is_img2img), note_inputs, [note])

    components = [made[name] for name in names]
    script.infotext_fields = infotext.paste_fields(components, names)
    script.paste_field_names = infotext.send_to_names(names)
    return components


def _on_change(control: Any, fn: Callable[..., Any], inputs: list[Any], outputs: list[Any]) -> None:
    """`.change` also fires for values set from Python (a pasted infotext), so visibility follows pastes."""
    control.change(fn=fn, inputs=inputs, outputs=outputs, show_progress="hidden", queue=False)


def hires_visibility(mode: Any) -> dict[str, Any]:
    """Show the hires settings only in "own" mode."""
    import gradio as gr

    return gr.update(visible=mode == "own")


def custom_visibility(preset: Any) -> dict[str, Any]:
    """Show the detailed settings only for Custom."""
    import gradio as gr

    return gr.update(visible=preset == CUSTOM)


# ---------------------------------------------------------------------------------------------- the note


def note_args(is_img2img: bool) -> tuple[str, ...]:
    """The controls whose values the note shows, in the order `note_function` takes them."""
    return NOTE_ARGS if is_img2img else (*NOTE_ARGS, *HIRES_NOTE_ARGS)


def note_function(is_img2img: bool) -> Callable[..., str]:
    """The note's change handler: the values of `note_args(is_img2img)`, positionally, to HTML."""
    names = note_args(is_img2img)

    def handler(*values: Any) -> str:
        return note_html(dict(zip(names, values)), is_img2img=is_img2img)

    return handler


def note_job(values: Mapping[str, Any], *, is_img2img: bool) -> TomeJob:
    """The job the accordion describes, from some controls' values (the others at their defaults)."""
    named = {name: ui_value(name, value) for name, value in defaults().items()}
    named.update({name: ui_value(name, coerce(name, value)) for name, value in values.items()})
    named["enabled"] = True
    job = resolve([named[name] for name in arg_names(is_img2img)], is_img2img=is_img2img)
    assert job is not None
    return job


def describe(config: TomeConfig) -> str:
    """What a config does, in a few words."""
    if config.is_noop:
        return "no merging"
    kv = config.mode == "kv"
    parts = [f"keys/values pooled over {config.sx}\u00d7{config.sy} cells"] if kv and config.merge_attn else []
    kinds = [name for name, on in (("self", config.merge_attn and not kv), ("cross", config.merge_crossattn)) if on]
    if kinds:
        cap = f", capped by the strides from {config.ratio:.2f}" if config.is_capped else ""
        parts.append(f"merging {config.effective_ratio:.2f} of the tokens ({'/'.join(kinds)}-attention{cap})")
    if config.merge_mlp:
        where = f" from downsample {config.mlp_min_downsample}" if config.mlp_min_downsample > 1 else ""
        parts.append(f"{config.effective_mlp_ratio:.2f} for the MLP{where}")
    if not kv:
        parts.append(f"strides {config.sx}\u00d7{config.sy}")
    parts.append(f"max downsample {config.max_downsample}")
    if config.share_plan:
        parts.append("one plan per stack")
    if (config.step_start, config.step_end) != (0.0, 1.0):
        parts.append(f"steps {config.step_start:g} to {config.step_end:g}")
    return ", ".join(parts)


def _custom_line(prefix: str, config: TomeConfig) -> tuple[str, bool]:
    """The cap note of custom settings: the ratio actually merged, or the keys/values pooling in kv mode."""
    if config.mode == "kv":
        if config.sx * config.sy == 1:
            return f"{prefix}strides 1\u00d71 pool nothing: no merging", False
        unused = "" if config.ratios_by_kind else " (the ratio is unused)"
        return f"{prefix}pooling keys/values over {config.sx}\u00d7{config.sy} cells{unused}", False
    if config.is_capped:
        text = (
            f"{prefix}strides {config.sx}\u00d7{config.sy} cap the ratio at {config.max_ratio:.2f}:"
            f" merging {config.effective_ratio:.2f} of the tokens, not {config.ratio:.2f}"
        )
        return text, True
    return f"{prefix}merging {config.effective_ratio:.2f} of the tokens", False


def _page_config(config: TomeConfig) -> dict[str, Any]:
    """A config as javascript/tome.js's token hint reads it."""
    targets = (config.merge_attn,) if config.mode == "kv" else (config.merge_attn, config.merge_crossattn)
    return {
        "ratio": config.ratio,
        "sx": config.sx,
        "sy": config.sy,
        "maxDownsample": str(config.max_downsample),
        "mode": config.mode,
        "merges": any(targets),
    }


def note_html(values: Mapping[str, Any], *, is_img2img: bool) -> str:
    """HTML for the note under the speed selector (see the module docstring), from the `note_args` values."""
    try:
        job = note_job(values, is_img2img=is_img2img)
    except TomeArgsError as exc:
        return _html([(f"invalid settings: {exc}", False)], {})
    data: dict[str, str] = {"data-tome-preset": str(values.get("preset", job.preset))}
    if not is_img2img:
        data["data-tome-hr-mode"] = str(values.get("hr_mode", job.hires_mode))
        data["data-tome-hr-preset"] = str(values.get("hr_preset", job.hires_preset))
    lines: list[tuple[str, bool]] = []
    if job.needs_family(False):
        configs = {family: job.pass_config(False, family) for family in FAMILIES}
        lines += [(f"{FAMILY_LABELS[f]}: {describe(c)}", c.is_capped) for f, c in configs.items() if c is not None]
        data["data-tome-first"] = json.dumps({f: _page_config(c) for f, c in configs.items() if c is not None})
    else:
        lines.append(_custom_line("", job.first))
    if not is_img2img:
        lines += _hires_lines(job, data)
    return _html(lines, data)


def _hires_lines(job: TomeJob, data: dict[str, str]) -> list[tuple[str, bool]]:
    if job.hires_mode == "off":
        return [("Hires pass: no merging", False)]
    if not job.needs_family(True):
        hires = job.pass_config(True)
        return [_custom_line("Hires pass: ", hires)] if job.hires_mode == "own" and hires is not None else []
    configs = {family: job.pass_config(True, family) for family in FAMILIES}
    if job.hires_preset != CUSTOM:  # (own custom values over a preset: the page reads them from the controls)
        data["data-tome-hires"] = json.dumps({f: _page_config(c) for f, c in configs.items() if c is not None})
    if job.hires_mode == "same" and all(c == job.pass_config(False, f) for f, c in configs.items()):
        return []
    return [
        (f"Hires pass, {FAMILY_LABELS[f]}: {describe(c)}", c.is_capped) for f, c in configs.items() if c is not None
    ]


def _html(lines: Sequence[tuple[str, bool]], data: Mapping[str, str]) -> str:
    capped = any(flag for _, flag in lines)
    attrs = "".join(f' {name}="{html.escape(value, quote=True)}"' for name, value in data.items())
    body = "<br>".join(html.escape(text) for text, _ in lines)
    return f'<div class="tome-cap-note{" tome-capped" if capped else ""}"{attrs}>{body}</div>'
