"""The accordion: controls built from `tome_core.field_specs()`, in the order of `tome_webui.params.ARG_NAMES`.

Element ids (for javascript/ and style.css). Every control gets `Script.elem_id(item)`, which is
`script_<tab>_tome_<item>` with <tab> `txt2img` or `img2img` (see `elem_id`). The items, `ELEM_ITEMS`:

    enable             the InputAccordion; the WebUI adds `<id>-checkbox` (hidden input) and, in JS,
                       `<id>-visible-checkbox` in its label
    cap_note           HTML note under the title: the ratio actually merged, and whether the strides cap it
                       (class `tome-capped` when they do)
    ratio, max_downsample, sx, sy, mode
                       the main controls
    advanced           the "Advanced" accordion holding:
    use_rand, merge_attn, merge_crossattn, merge_mlp, seed, matching, step_start, step_end
    hires              txt2img only: the Hires fix pass group (container) holding:
    hr_mode            radio "Same as first pass" / "Own settings" / "Off" (values "same", "own", "off")
    hr_settings        the column shown only for "Own settings", holding:
    hr_ratio, hr_max_downsample, hr_sx, hr_sy

Help texts are the `FieldSpec.help` strings; they are passed as `tooltip=` only where the WebUI's patched gradio
takes it (otherwise hints are left to javascript/).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from tome_core import TomeConfig
from tome_webui import compat, infotext
from tome_webui.params import (
    ARG_NAMES,
    FIELD_NAMES,
    HIRES_FIELDS,
    HIRES_MODE_LABELS,
    IMG2IMG_ARG_NAMES,
    SEED_NONE,
    TITLE,
    coerce,
    defaults,
    field_of,
    spec,
    ui_value,
)

ACCORDION_LABEL = "Token Merging (ToMe)"
HIRES_LABEL = "Hires fix pass"
#: Fields in the main area; the others go into "Advanced".
MAIN_FIELDS: tuple[str, ...] = tuple(name for name in FIELD_NAMES if not spec(name).advanced)
ADVANCED_FIELDS: tuple[str, ...] = tuple(name for name in FIELD_NAMES if spec(name).advanced)
HIRES_ARGS: tuple[str, ...] = tuple(f"hr_{name}" for name in HIRES_FIELDS)
#: Every `elem_id` item, in page order (see the module docstring).
ELEM_ITEMS: tuple[str, ...] = (
    "enable",
    "cap_note",
    *MAIN_FIELDS,
    "advanced",
    *ADVANCED_FIELDS,
    "hires",
    "hr_mode",
    "hr_settings",
    *HIRES_ARGS,
)


def elem_id(tab: str, item: str) -> str:
    """The id `Script.elem_id(item)` gives in `tab` ("txt2img"/"img2img"), for documentation and tests."""
    return f"script_{tab}_{TITLE.lower()}_{item}"


def label_of(arg_name: str) -> str:
    """The control's label; unique within the script, as ui-config.json keys are built from labels."""
    if arg_name == "hr_mode":
        return HIRES_LABEL
    label = spec(field_of(arg_name)).label
    if arg_name.startswith("hr_"):
        return f"Hires {label[:1].lower()}{label[1:]}"
    if spec(arg_name).optional:
        return f"{label} ({SEED_NONE}: default)"
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
        low = SEED_NONE if s.optional else s.minimum
        return gr.Number(value=value, precision=0 if s.kind is int else None, minimum=low, maximum=s.maximum, **common)
    return gr.Slider(minimum=s.minimum, maximum=s.maximum, step=s.step, value=value, **common)


def build(script: Any, is_img2img: bool) -> list[Any]:
    """Build the accordion for `script.ui(is_img2img)`; return the arg components in `ARG_NAMES` order.

    Also sets `script.infotext_fields` and `script.paste_field_names`. Safe to call again (the API calls `ui()`
    twice per runner to read defaults): it only creates components inside the caller's gr.Blocks.
    """
    import gradio as gr

    arg_names = IMG2IMG_ARG_NAMES if is_img2img else ARG_NAMES
    made: dict[str, Any] = {}

    def add(names: tuple[str, ...]) -> None:
        for name in names:
            made[name] = component(name, script.elem_id(name))

    def add_rows(names: tuple[str, ...]) -> None:
        """Sliders, then choices and numbers, then checkboxes, each kind in a row of its own."""
        sliders = tuple(n for n in names if widget(n) == "slider")
        checkboxes = tuple(n for n in names if widget(n) == "checkbox")
        others = tuple(n for n in names if n not in sliders and n not in checkboxes)
        for group in (sliders, others, checkboxes):
            if group:
                with gr.Row():
                    add(group)

    accordion = compat.input_accordion()
    with accordion(False, label=ACCORDION_LABEL, elem_id=script.elem_id("enable")) as enabled:
        made["enabled"] = enabled
        note = gr.HTML(
            value=cap_note(*(ui_value(n, defaults()[n]) for n in _note_args(is_img2img))),
            elem_id=script.elem_id("cap_note"),
        )
        with gr.Row():
            add(("ratio",))
        add_rows(tuple(n for n in MAIN_FIELDS if n != "ratio"))
        with gr.Accordion("Advanced", open=False, elem_id=script.elem_id("advanced")):
            add_rows(ADVANCED_FIELDS)
        if not is_img2img:
            with gr.Group(elem_id=script.elem_id("hires")):
                made["hr_mode"] = gr.Radio(
                    choices=[(label, mode) for mode, label in HIRES_MODE_LABELS.items()],
                    value=defaults()["hr_mode"],
                    label=HIRES_LABEL,
                    elem_id=script.elem_id("hr_mode"),
                )
                with gr.Column(visible=False, elem_id=script.elem_id("hr_settings")) as hr_settings:
                    with gr.Row():
                        add(("hr_ratio",))
                    add_rows(tuple(n for n in HIRES_ARGS if n != "hr_ratio"))
            made["hr_mode"].change(
                fn=hires_visibility,
                inputs=[made["hr_mode"]],
                outputs=[hr_settings],
                show_progress="hidden",
                queue=False,
            )
    note_inputs = [made[name] for name in _note_args(is_img2img)]
    for control in note_inputs:
        control.change(fn=cap_note, inputs=note_inputs, outputs=[note], show_progress="hidden", queue=False)

    components = [made[name] for name in arg_names]
    script.infotext_fields = infotext.paste_fields(components, arg_names)
    script.paste_field_names = infotext.send_to_names(arg_names)
    return components


def _note_args(is_img2img: bool) -> tuple[str, ...]:
    first = ("ratio", "sx", "sy")
    return first if is_img2img else (*first, "hr_mode", "hr_ratio", "hr_sx", "hr_sy")


def hires_visibility(mode: Any) -> dict[str, Any]:
    """Show the hires settings only in "own" mode."""
    import gradio as gr

    return gr.update(visible=mode == "own")


def _pass_note(prefix: str, values: Mapping[str, Any]) -> tuple[str, bool]:
    try:
        config = TomeConfig(**{name: coerce(name, value) for name, value in values.items()})
    except (TypeError, ValueError) as exc:  # TomeArgsError is a ValueError
        return f"{prefix}invalid settings: {exc}", False
    if config.is_capped:
        text = (
            f"{prefix}strides {config.sx}\u00d7{config.sy} cap the ratio at {config.max_ratio:.2f}:"
            f" merging {config.effective_ratio:.2f} of the tokens, not {config.ratio:.2f}"
        )
        return text, True
    return f"{prefix}merging {config.effective_ratio:.2f} of the tokens", False


def cap_note(ratio: Any, sx: Any, sy: Any, *hires: Any) -> str:
    """HTML for the note: the ratio each pass merges, flagged when the strides cap it.

    `hires` is (hr_mode, hr_ratio, hr_sx, hr_sy) in txt2img.
    """
    lines = [_pass_note("", {"ratio": ratio, "sx": sx, "sy": sy})]
    if hires:
        mode, hr_ratio, hr_sx, hr_sy = hires
        if mode == "own":
            lines.append(_pass_note("Hires pass: ", {"ratio": hr_ratio, "sx": hr_sx, "sy": hr_sy}))
        elif mode == "off":
            lines.append(("Hires pass: no merging", False))
    capped = any(flag for _, flag in lines)
    body = "<br>".join(html.escape(text) for text, _ in lines)
    return f'<div class="tome-cap-note{" tome-capped" if capped else ""}">{body}</div>'
