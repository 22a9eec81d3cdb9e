"""The accordion: a speed selector, then controls built from `tome_core.field_specs()`.

The components `ui()` returns are in `tome_webui.params.ARG_NAMES` order (the API contract); the page order is
the one below. Element ids (for javascript/tome.js): every item gets `Script.elem_id(item)`, which is
`script_<tab>_tome_<item>` with <tab> `txt2img` or `img2img` (see `elem_id`). The items, `ELEM_ITEMS`:

    enable             the InputAccordion; the WebUI adds `<id>-checkbox` (hidden input) and, in JS,
                       `<id>-visible-checkbox` in its label
    preset             radio "Speed": Quality / Balanced / Fast / Fastest / Custom (values: the preset names
                       of `tome_core.presets()` and "custom"); starts at `tome_core.DEFAULT_PRESET`
    cap_note           HTML note under it, a `div.tome-cap-note`: for a preset, what it runs on SD1/SD2 and on
                       SDXL; for Custom, the ratio actually merged and whether the strides cap it (class
                       `tome-capped` when they do), or the pooling in kv mode; plus the Hires fix pass where it
                       differs from the first pass. Once javascript/tome.js has sent the image size (`page_values`),
                       it is followed by the token hint, a `div.tome-token-hint` with the id of the item
                       `token_hint`: the tokens per attention layer before and after merging, per pass, counted by
                       `tome_core.describe`
    page_values        hidden textbox: javascript/tome.js writes the WebUI's own controls the token hint needs
                       into it as JSON (`PageValues`) whenever an edit of those or of the ToMe controls ends (the
                       latter report changes with a `tome_changed` event, `changed_js`); its change recomputes the
                       note
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
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tome_core
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
    UI_PRESET_DEFAULT,
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

log = logging.getLogger("tome")

ACCORDION_LABEL = "Token Merging (ToMe)"
HIRES_LABEL = "Hires fix pass"
PRESET_LABEL = "Speed"
HIRES_PRESET_LABEL = "Hires speed"
PAGE_VALUES_LABEL = "ToMe page values"
FAMILY_LABELS: Mapping[str, str] = {"sd": "SD1/SD2", "sdxl": "SDXL"}
#: Transformer blocks per UNet level (1: the full latent, 2: the first downsampled level, ...) in each model
#: family: SD1/SD2 have 2 down and 3 up at each of 1/1, 1/2 and 1/4 and one in the middle; SDXL none at 1/1,
#: 10 at 1/2 and 60 at 1/4. The token hint's figures come from `tome_core.describe_layout` on these layouts;
#: tests check them against the real architectures (`tome_core.blocks_per_level`).
FAMILY_LAYOUTS: Mapping[str, Mapping[int, int]] = {"sd": {1: 5, 2: 5, 4: 5, 8: 1}, "sdxl": {2: 10, 4: 60}}
PRESET_HELP = (
    "Speed against fidelity: each preset is a point measured on the speed/deviation frontier, resolved for the"
    " model that runs each pass (SD1/SD2 or SDXL). "
    + " ".join(f"{preset.label}: {preset.help}" for preset in presets())
    + " Custom: the settings below."
)
HIRES_PRESET_HELP = (
    "The Hires fix pass's own speed setting, resolved for the model that runs it. Custom: the ratio, max"
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
    "page_values",
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
#: The controls the note reads, per tab: every field, as any of them may change what the token hint counts.
NOTE_ARGS: tuple[str, ...] = ("preset", *FIELD_NAMES)
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

    assert defaults()[arg_name] == UI_PRESET_DEFAULT
    return gr.Radio(
        choices=[(PRESET_LABELS[choice], choice) for choice in PRESET_CHOICES],
        value=UI_PRESET_DEFAULT,  # the object, not an equal string: the script tells a preset the API filled in
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
        # Hidden, yet in the page (gradio 3 renders it with display: none) for javascript/tome.js to write into.
        page_values = gr.Textbox(
            value="", visible=False, label=PAGE_VALUES_LABEL, elem_id=script.elem_id("page_values")
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
    # The note is recomputed when javascript/tome.js writes the page values, which it does once an edit ends, not
    # on every keystroke or slider step: gradio 3 drops an event's call while its previous call is pending, so
    # a handler on each control's change would often miss the last value typed. What the controls tell it: that
    # their value changed, also when set from Python (pasted infotext), in the browser alone (no server call).
    note_inputs = [*(made[name] for name in note_names), page_values]
    page_values.change(
        fn=note_function(is_img2img),
        inputs=note_inputs,
        outputs=[note],
        show_progress="hidden",
        queue=False,
    )
    changed = changed_js("img2img" if is_img2img else "txt2img")
    for name in note_names:
        made[name].change(fn=None, _js=changed, inputs=[], outputs=[], queue=False)

    components = [made[name] for name in names]
    script.infotext_fields = infotext.paste_fields(components, names)
    script.paste_field_names = infotext.send_to_names(names)
    return components


def _on_change(control: Any, fn: Callable[..., Any], inputs: list[Any], outputs: list[Any]) -> None:
    """`.change` also fires for values set from Python (a pasted infotext), so visibility follows pastes."""
    control.change(fn=fn, inputs=inputs, outputs=outputs, show_progress="hidden", queue=False)


def changed_js(tab: str) -> str:
    """The browser-side change listener of the controls the note reads: a `tome_changed` event on the document,
    its `detail` the tab, for javascript/tome.js."""
    return f"() => {{ document.dispatchEvent(new CustomEvent('tome_changed', {{detail: {json.dumps(tab)}}})); return []; }}"


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
    """The note's change handler: the values of `note_args(is_img2img)` and then the page values' JSON (the
    `page_values` textbox), positionally, to HTML."""
    names = note_args(is_img2img)

    def handler(*values: Any) -> str:
        *controls, page = values
        return note_html(dict(zip(names, controls)), is_img2img=is_img2img, page=PageValues.from_json(page))

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


def note_html(
    values: Mapping[str, Any],
    *,
    is_img2img: bool,
    page: PageValues | None = None,
) -> str:
    """HTML for the note under the speed selector (see the module docstring), from the `note_args` values; with
    the `page` values, the token hint follows it."""
    try:
        job = note_job(values, is_img2img=is_img2img)
    except TomeArgsError as exc:
        note = _html([(f"invalid settings: {exc}", False)])
        if page is None:
            return note
        return note + token_hint_html(None, page, is_img2img=is_img2img)
    lines: list[tuple[str, bool]] = []
    if job.needs_family(False):
        configs = {family: job.pass_config(False, family) for family in FAMILIES}
        lines += [(f"{FAMILY_LABELS[f]}: {describe(c)}", c.is_capped) for f, c in configs.items() if c is not None]
    else:
        lines.append(_custom_line("", job.first))
    if not is_img2img:
        lines += _hires_lines(job)
    note = _html(lines)
    if page is None:
        return note
    return note + token_hint_html(job, page, is_img2img=is_img2img)


def _hires_lines(job: TomeJob) -> list[tuple[str, bool]]:
    if job.hires_mode == "off":
        return [("Hires pass: no merging", False)]
    if not job.needs_family(True):
        hires = job.pass_config(True)
        return [_custom_line("Hires pass: ", hires)] if job.hires_mode == "own" and hires is not None else []
    configs = {family: job.pass_config(True, family) for family in FAMILIES}
    if job.hires_mode == "same" and all(c == job.pass_config(False, f) for f, c in configs.items()):
        return []
    return [
        (f"Hires pass, {FAMILY_LABELS[f]}: {describe(c)}", c.is_capped) for f, c in configs.items() if c is not None
    ]


def _html(lines: Sequence[tuple[str, bool]]) -> str:
    capped = any(flag for _, flag in lines)
    body = "<br>".join(html.escape(text) for text, _ in lines)
    return f'<div class="tome-cap-note{" tome-capped" if capped else ""}">{body}</div>'


# ---------------------------------------------------------------------------------------------- the token hint


@dataclass(frozen=True)
class PageValues:
    """The WebUI's own controls the token hint needs, as javascript/tome.js reads them from the page.

    `hires` is whether the Hires fix is on, None where the page has no such control (img2img, another UI); the
    `hr_*` values are the WebUI's "Upscale by", "Resize width to" and "Resize height to". `send` numbers the
    page's sends: it makes each one a change, and the hint echoes it.
    """

    width: float | None = None
    height: float | None = None
    hires: bool | None = None
    hr_scale: float | None = None
    hr_resize_x: float | None = None
    hr_resize_y: float | None = None
    send: int = 0

    @classmethod
    def from_json(cls, text: Any) -> PageValues | None:
        """The values javascript/tome.js wrote, or None before it has written any (or when they are unreadable)."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            return cls(
                width=_number(raw.get("width")),
                height=_number(raw.get("height")),
                hires=raw.get("hires") if isinstance(raw.get("hires"), bool) else None,
                hr_scale=_number(raw.get("hr_scale")),
                hr_resize_x=_number(raw.get("hr_resize_x")),
                hr_resize_y=_number(raw.get("hr_resize_y")),
                send=int(_number(raw.get("send")) or 0),
            )
        except (ValueError, AttributeError) as exc:  # (JSONDecodeError is a ValueError)
            log.warning("ToMe: unreadable page values from javascript/tome.js (%s): %r", exc, text)
            return None

    def size(self) -> tuple[int, int] | None:
        """(width, height) of the first pass, or None while the page has no valid size."""
        if self.width is None or self.height is None or self.width < 8 or self.height < 8:
            return None
        return int(self.width), int(self.height)

    def hires_size(self) -> tuple[int, int] | None:
        """(width, height) of the Hires fix pass as the WebUI's txt2img computes it ("Upscale by" unless "Resize
        width/height to" is set; with both set the upscaled image is cropped to exactly that), or None when the
        Hires fix is off or its size is not valid."""
        size = self.size()
        if not self.hires or size is None:
            return None
        width, height = size
        to_x, to_y = int(self.hr_resize_x or 0), int(self.hr_resize_y or 0)
        if to_x and to_y:
            out = (to_x, to_y)
        elif to_x:
            out = (to_x, to_x * height // width)
        elif to_y:
            out = (to_y * width // height, to_y)
        elif self.hr_scale is not None:
            out = (int(width * self.hr_scale), int(height * self.hr_scale))
        else:
            return None
        return out if min(out) >= 8 else None


def _number(value: Any) -> float | None:
    """A number from the page's JSON (JavaScript's NaN arrives as null); ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _levels_text(family: str, size: tuple[int, int], config: TomeConfig, *, unit: bool) -> str:
    """The levels `config` merges ("4096 -> 2048 tokens at 1/1, ..."), counted by `tome_core.describe_layout`."""
    width, height = size
    word = " keys/values" if config.mode == "kv" else " tokens"  # kv mode: the pooled keys/values attended to
    infos = [info for info in tome_core.describe_layout(FAMILY_LAYOUTS[family], height, width, config) if info.merging]
    return ", ".join(
        f"{info.tokens} \u2192 {info.tokens_after}{word if unit and n == 0 else ''} at 1/{info.level}"
        for n, info in enumerate(infos)
    )


def _pass_hint(job: TomeJob, is_hr_pass: bool, size: tuple[int, int]) -> str:
    """One pass's tokens: per model family for a preset, else the custom settings on SD1/SD2 (and on SDXL
    too with max downsample "auto", where the levels differ by family)."""
    if job.needs_family(is_hr_pass):
        parts = []
        for family in FAMILIES:
            config = job.pass_config(is_hr_pass, family)
            assert config is not None  # (the hires pass is off: no line)
            text = _levels_text(family, size, config, unit=True)
            nothing = "no merging" if config.is_noop else "no attention at these levels"
            parts.append(f"{FAMILY_LABELS[family]}: {text or nothing}")
        return "; ".join(parts)
    config = job.pass_config(is_hr_pass)
    assert config is not None
    if config.is_noop:
        return "no merging"
    text = _levels_text("sd", size, config, unit=True)
    if config.max_downsample == "auto":
        text += f" (SDXL: {_levels_text('sdxl', size, config, unit=False)})"
    return text


def token_hint_title() -> str:
    """The token hint's hover text; which levels "auto" merges comes from `tome_core.describe_layout`."""
    autos = []
    for family in FAMILIES:
        levels = [i.level for i in tome_core.describe_layout(FAMILY_LAYOUTS[family]) if i.merging]
        autos.append(f"at {' and '.join(f'1/{level}' for level in levels)} on {FAMILY_LABELS[family]}")
    return (
        "Image tokens per attention layer, before and after merging, at the size set above (latent = pixels / 8;"
        ' level 1/1 is the full latent, 1/2 the first downsampled level, ...). With max downsample "auto" ToMe'
        f" merges {' and '.join(autos)}; a preset has its own settings per model. The browser cannot tell which"
        " model is loaded, so both are shown."
    )


def token_hint_html(job: TomeJob | None, page: PageValues, *, is_img2img: bool) -> str:
    """The token hint (`div.tome-token-hint`, id of the item `token_hint`): a line for the first pass, and in
    txt2img one for the Hires fix pass while it is on, counted for each family's layout (`FAMILY_LAYOUTS`); no lines without
    a `job` (invalid settings). `data-tome-send` echoes the page values' `send`, so javascript/tome.js can tell
    which of its sends the hint answers."""
    lines = []
    size = page.size()
    if job is not None and size is not None:
        lines.append(_pass_hint(job, False, size))
        hires = None if is_img2img else page.hires_size()
        if hires is not None:
            label = f"Hires pass ({hires[0]}\u00d7{hires[1]}): "
            lines.append(label + ("no merging" if job.hires_mode == "off" else _pass_hint(job, True, hires)))
    element_id = elem_id("img2img" if is_img2img else "txt2img", "token_hint")
    # Inline style: the extension ships no style.css; these are gradio's theme variables.
    style = "font-size: var(--text-sm); color: var(--body-text-color-subdued); margin-top: 0.25em;"
    body = "".join(f"<div>{html.escape(line)}</div>" for line in lines)
    title = html.escape(token_hint_title(), quote=True)
    return (
        f'<div id="{element_id}" class="tome-token-hint" data-tome-send="{page.send}" title="{title}"'
        f' style="{style}">{body}</div>'
    )
