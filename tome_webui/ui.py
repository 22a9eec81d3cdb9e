"""The accordion: a speed selector, then controls built from `tome_core.field_specs()`.

The components `ui()` returns are in `tome_webui.params.ARG_NAMES` order (the API contract); the page order is
the one below. Element ids (for javascript/tome.js): every item gets `Script.elem_id(item)`, which is
`script_<tab>_tome_<item>` with <tab> `txt2img` or `img2img` (see `elem_id`). The items, `ELEM_ITEMS`:

    enable             the InputAccordion; the WebUI adds `<id>-checkbox` (hidden input) and, in JS,
                       `<id>-visible-checkbox` in its label
    preset             radio "Speed": Quality / Balanced / Fast / Fastest / Custom (values: the preset names
                       of `tome_core.presets()` and "custom"); starts at `tome_core.DEFAULT_PRESET`
    cap_note           HTML note under it, a `div.tome-cap-note`: for a preset, one line in the user's words,
                       what it gains and changes for the loaded model's family (SD1/SD2 and SDXL while none is
                       known; a diffusion transformer's family in Forge Neo): how much faster a step gets at the
                       page's size (and frames: Forge Neo's Wan makes a video of the batch size's frames,
                       `loaded_frames`), from the speed table (`tome_core.figures`: the loaded architecture's rows, a
                       Wan 2.2 TI2V 5B's and not the 14B's, `loaded_figures_family`), and in the same line the Hires fix
                       pass's figure at its target size while it runs the same preset; the change beside the
                       reference the preset is held to (`preset_hint` in tome_core/words.py), and a note when the
                       image is too small for it to merge at some level; what it runs, its figures per size and
                       its tokens per level (per reduced block on a transformer) in the note's tooltip
                       (`preset_tooltip`, `token_details`); for Custom, the ratio merged or the pooling in kv mode;
                       plus a line for the Hires fix pass where it runs other values than the first pass (its own
                       preset: that preset's line at the hires size). Settings the core refuses (a ratio the strides cannot reach, ...) show its
                       message instead, with the class `tome-invalid` in the theme's error colour. Once
                       javascript/tome.js has sent the image size (`page_values`), it is followed by the token
                       hint, a `div.tome-token-hint` with the id of the item `token_hint`: for each pass that runs
                       Custom values, the tokens per attention layer before and after merging, counted by
                       `tome_core.describe_layout` for the loaded family (empty for presets)
    page_values        hidden textbox: javascript/tome.js writes into it, as JSON (`PageValues`), the values of
                       the controls the note reads, as their `.change` events hand them to it in the browser
                       (`changed_js`), and the WebUI's own controls the token hint needs, whenever an edit of one
                       ends; its change recomputes the note, the JSON coming as the event's data (no inputs)
    custom             the column of the detailed settings, shown only for Custom, holding:
    ratio, max_downsample, sx, sy, mode
                       the main controls
    advanced           the "Advanced" accordion holding:
    st, use_rand, merge_attn, merge_crossattn, merge_mlp, seed, matching, step_start, step_end, mlp_ratio,
    share_plan, mlp_min_downsample, min_downsample, pool_kv, block_start, block_end
                       (st, block_start and block_end: for diffusion transformers, frames per cell and the block
                       window)
    hires              txt2img only: the Hires fix pass group (container) holding:
    hr_mode            radio "Same as first pass" / "Own settings" / "Off" (values "same", "own", "off")
    hr_settings        the column shown only for "Own settings", holding:
    hr_preset          radio "Hires speed", the same choices as `preset`
    hr_custom          the column shown only when `hr_preset` is Custom, holding:
    hr_ratio, hr_max_downsample, hr_sx, hr_sy

Help texts are the `FieldSpec.help` strings (and `PRESET_HELP`, `HIRES_PRESET_HELP`); they are passed as
`tooltip=` only where the WebUI's patched gradio takes it (otherwise hints are left to javascript/).

Events: each sends exactly what its endpoint declares, so no gradio client warns ("Too many arguments provided for
the endpoint." in gradio 4.40, whose client finds no parameters for a call by fn_index): the visibility of the
detailed settings and the controls' change reports run in the browser alone (`_js`, no call), and the note's one
call sends no inputs, its JSON coming as the event's data (`gr.EventData`).
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

import tome_core
from tome_core import FAMILIES, TomeConfig, families, figures, presets
from tome_core.dit import check_config
from tome_core.plan import plan_dit
from tome_core.presets import REFERENCES
from tome_core.words import (
    DIT_BLOCKS,
    FAMILY_LABELS,
    FAMILY_LAYOUTS,
    Size,
    describe_config,
    preset_hint,
    unmerged_levels,
)
from tome_webui import compat, infotext
from tome_webui.hosts import host_of
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
#: `FAMILY_LAYOUTS` (tome_core.words): the token hint's figures come from `tome_core.describe_layout` on these
#: layouts; tests check them against the real architectures (`tome_core.blocks_per_level`).
describe = describe_config
#: Pixels per token side of every diffusion transformer family ToMe reduces: an 8x VAE and 2x2 patches (Flux.2: its
#: latent patchified 2x2 as well; Wan: per latent frame).
DIT_PIXELS_PER_TOKEN = 16
#: Where a speed table's rows (`tome_core.families.figures_family`) are of a model whose token covers more pixels:
#: Wan 2.2 TI2V 5B's VAE downsamples 16x, its patches are 2x2.
DIT_PIXELS_PER_TOKEN_OF: dict[str, int] = {"wan22-5b": 32}
PRESET_HELP = (
    "Speed against fidelity: from Quality to Fastest each preset takes less GPU time, each held to a default users"
    " know (tomesd's or ToDo's), resolved for the model that runs each pass (SD1/SD2, SDXL, or a diffusion"
    " transformer such as Flux or Wan, where keys/values are subsampled and text tokens kept whole). "
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
        _shown_for(made["preset"], CUSTOM, custom)
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
            _shown_for(made["hr_mode"], "own", own)
            _shown_for(made["hr_preset"], CUSTOM, hr_custom)
    # The note is recomputed when javascript/tome.js writes the page values, which it does once an edit ends, not
    # on every keystroke or slider step, and with one call at a time: gradio 3 drops an event's call while its
    # previous call is pending. What the controls hand it, in the browser alone (no server call): their values,
    # whenever one changes, also when set from Python (pasted infotext).
    page_values.change(fn=note_function(is_img2img), inputs=[], outputs=[note], show_progress="hidden", queue=False)
    changed = changed_js("img2img" if is_img2img else "txt2img", note_names)
    controls = [made[name] for name in note_names]
    for name in note_names:
        made[name].change(fn=None, _js=changed, inputs=controls, outputs=[], queue=False)

    components = [made[name] for name in names]
    script.infotext_fields = infotext.paste_fields(components, names)
    script.paste_field_names = infotext.send_to_names(names)
    return components


def _shown_for(control: Any, value: str, target: Any) -> None:
    """Show `target` only while `control` holds `value`, in the browser alone. `.change` also fires for values set
    from Python (a pasted infotext), so the visibility follows pastes."""
    control.change(fn=None, _js=visibility_js(value), inputs=[control], outputs=[target], queue=False)


def visibility_js(value: str) -> str:
    """The browser-side `.change` listener that shows its output only while the control holds `value`."""
    return f"(value) => ({{__type__: 'update', visible: value === {json.dumps(value)}}})"


def changed_js(tab: str, names: Sequence[str]) -> str:
    """The browser-side change listener of the controls the note reads (its inputs: those controls, in `names`
    order): a `tome_changed` event on the document for javascript/tome.js, its `detail` the tab and the values."""
    detail = f"{{tab: {json.dumps(tab)}, names: {json.dumps(list(names))}, values: values}}"
    return f"(...values) => {{ document.dispatchEvent(new CustomEvent('tome_changed', {{detail: {detail}}})); return []; }}"


# ---------------------------------------------------------------------------------------------- the note


def note_args(is_img2img: bool) -> tuple[str, ...]:
    """The controls whose values the note reads (javascript/tome.js sends them by name, `PageValues.controls`)."""
    return NOTE_ARGS if is_img2img else (*NOTE_ARGS, *HIRES_NOTE_ARGS)


def note_function(is_img2img: bool) -> Callable[[Any], str]:
    """The note's handler: the page values' JSON (the `page_values` textbox, whose change fires it) to HTML, for
    the loaded model's family. It takes no inputs (see the module docstring): the JSON comes as the event's data,
    which gradio (3.41 and 4.x) hands to a parameter annotated `gr.EventData` as the changed textbox's value."""
    import gradio as gr

    def handler(event: Any) -> str:
        family = loaded_family()
        return note_for_page(
            getattr(event, "_data", None),
            is_img2img=is_img2img,
            family=family,
            device=compat.compute_device(),
            figures_family=loaded_figures_family(family),
            frames_of=loaded_frames,
        )

    handler.__annotations__ = {"event": gr.EventData, "return": str}  # gradio finds EventData by annotation
    return handler


def note_for_page(
    text: Any,
    *,
    is_img2img: bool,
    family: str | None = None,
    device: str | None = None,
    figures_family: str | None = None,
    frames_of: Callable[[float | None], int] | None = None,
) -> str:
    """The note for the JSON javascript/tome.js wrote (`PageValues`): the controls' values in it, the token hint
    for its sizes; the note at the controls' defaults before it wrote any. `frames_of`: the frames of the video the
    loaded model makes at the page's batch size (`loaded_frames`); None: a batch is of images."""
    page = PageValues.from_json(text)
    names = note_args(is_img2img)
    values = {name: value for name, value in (page.controls if page else {}).items() if name in names}
    frames = frames_of(page.batch_size) if frames_of is not None and page is not None else 1
    return note_html(
        values,
        is_img2img=is_img2img,
        page=page,
        family=family,
        device=device,
        figures_family=figures_family,
        frames=frames,
    )


def loaded_family() -> str | None:
    """The model family ("sd", "sdxl", or a diffusion transformer's: "flux", "wan", ...) of the model the WebUI has
    loaded; None while none is (a placeholder, nothing ToMe patches, a model of no known family)."""
    model = compat.current_model()
    if model is None:
        return None
    host = host_of(model)
    unet = None if host.is_placeholder(model) else host.unet(model)
    if unet is None:
        return None
    try:
        return host.family(model, unet)
    except (TypeError, ValueError) as exc:
        log.debug("ToMe: no model family for the speed hint: %s", exc)
        return None


def loaded_frames(batch_size: float | None) -> int:
    """The frames per video the loaded model makes at the page's batch size: Forge Neo turns the batch of its Wan
    into one video of that many frames (rounded down to 4k+1, `hosts.forge.neo_frames`); 1 for every other model
    and host (a batch of images), and while none is loaded."""
    try:
        model = compat.current_model()
    except ImportError as exc:  # not inside a WebUI (the library's tests)
        log.debug("ToMe: no WebUI model for the frames: %s", exc)
        return 1
    if model is None:
        return 1
    host = host_of(model)
    return 1 if host.is_placeholder(model) else host.video_frames(model, batch_size)


def loaded_figures_family(family: str | None) -> str | None:
    """The speed table's family for the loaded model, whose presets are `family`'s
    (`tome_core.families.figures_family`: a Wan 2.2 TI2V 5B's rows, not the 14B's); None while no family is known."""
    if family is None:
        return None
    module = loaded_module()
    return family if module is None else families.figures_family(module, family)


def note_job(values: Mapping[str, Any], *, is_img2img: bool) -> TomeJob:
    """The job the accordion describes, from some controls' values (the others at their defaults)."""
    named = {name: ui_value(name, value) for name, value in defaults().items()}
    named.update({name: ui_value(name, coerce(name, value)) for name, value in values.items()})
    named["enabled"] = True
    job = resolve([named[name] for name in arg_names(is_img2img)], is_img2img=is_img2img)
    assert job is not None
    return job


def is_transformer(family: str | None) -> bool:
    """Whether `family` is a diffusion transformer's (no UNet levels: keys/values subsampled per block)."""
    return family is not None and family not in FAMILIES


def loaded_module() -> nn.Module | None:
    """The module ToMe would patch in the model the WebUI has loaded (the one a compile wrapper runs), or None (none
    loaded, a placeholder, no WebUI at all)."""
    try:
        model = compat.current_model()
    except ImportError as exc:  # not inside a WebUI (the library's tests)
        log.debug("ToMe: no WebUI model for the note: %s", exc)
        return None
    if model is None:
        return None
    host = host_of(model)
    module = None if host.is_placeholder(model) else host.unet(model)
    return getattr(module, "_orig_mod", module)


def refusal(config: TomeConfig, family: str | None) -> str | None:
    """The core's message when the loaded diffusion transformer (of `family`) cannot run `config` (settings of UNet
    levels, a merge it cannot run, ...), else None. The core decides with the model at hand
    (`tome_core.dit.check_config`); with none loaded nothing is said here, and a generation says it in `ToMe note`."""
    if not is_transformer(family):
        return None
    module = loaded_module()
    layout = None if module is None else tome_core.find_layout(module)
    if module is None or layout is None:  # (the note's transformer family is the loaded model's)
        return None
    try:
        check_config(config, type(module).__name__, layout, module)
    except ValueError as exc:
        return str(exc)
    return None


def _custom_line(prefix: str, config: TomeConfig, family: str | None = None) -> tuple[str, bool]:
    """The note of custom settings: the ratio merged, or the keys/values pooling in kv mode; on a diffusion
    transformer what it runs, or why it cannot (flagged as an error). (A ratio the strides cannot reach never gets
    here: `TomeConfig` refuses it, and the note shows that error.)"""
    refused = refusal(config, family)
    if refused is not None:
        return f"{prefix}invalid settings for {FAMILY_LABELS[str(family)]}: {refused}", True
    if is_transformer(family):
        return f"{prefix}{describe_config(config, family)}", False
    if config.mode == "kv":
        unused = "" if config.ratios_by_kind else " (the ratio is unused)"
        return f"{prefix}pooling keys/values over {config.sx}\u00d7{config.sy} cells{unused}", False
    if config.is_noop:
        return f"{prefix}no merging", False
    return f"{prefix}merging {config.ratio:.2f} of the tokens", False


def hires_follows(job: TomeJob) -> bool:
    """Whether the Hires fix pass runs the first pass's preset as it is ("same", or "own" at the same preset): its
    figure then goes into the first pass's line."""
    if not job.needs_family(False) or job.hires_mode == "off":
        return False
    return job.hires_preset == job.preset and job.hires_changes == job.changes


def note_html(
    values: Mapping[str, Any],
    *,
    is_img2img: bool,
    page: PageValues | None = None,
    family: str | None = None,
    device: str | None = None,
    figures_family: str | None = None,
    frames: int = 1,
) -> str:
    """HTML for the note under the speed selector (see the module docstring), from the `note_args` values; with
    the `page` values, the token hint follows it. `family`: the loaded model's ("sd", "sdxl", "flux", ...), None
    when unknown (then SD1/SD2 and SDXL are shown). `device`: where the WebUI runs models (the figures are a GPU's;
    on another device the hint says so). `figures_family`: the speed table's rows for the loaded model where they
    are not its family's (`loaded_figures_family`: a Wan 2.2 TI2V 5B's); the presets and words stay `family`'s.
    `frames`: the frames per video the model makes at the page's batch size (`loaded_frames`; 1: images), for the
    figures (a Wan's table rows are videos: at one frame its figure would be a bound far from the user's).

    A preset is one line in the family's words (`preset_hint`), its figures at the page's size (and at the Hires fix
    target while that pass runs the same preset); what it runs and its tokens per level are in the note's tooltip.
    Settings the core refuses (a ratio the strides cannot reach, say) show its message, marked `tome-invalid`: the
    WebUI swallows errors raised while generating, so this is where a user sees them first."""
    try:
        job = note_job(values, is_img2img=is_img2img)
    except TomeArgsError as exc:
        note = _html([(f"invalid settings: {exc}", True)])
        if page is None:
            return note
        return note + token_hint_html(None, page, is_img2img=is_img2img)
    size = page.size() if page is not None else None
    hires_size = page.hires_size() if page is not None and not is_img2img else None
    pixels = DIT_PIXELS_PER_TOKEN_OF.get(str(figures_family), DIT_PIXELS_PER_TOKEN)
    size, hires_size = _with_frames(size, frames), _with_frames(hires_size, frames)
    lines: list[tuple[str, bool]] = []
    details: list[str] = []
    if job.needs_family(False):
        target = hires_size if not is_img2img and hires_follows(job) else None
        lines.append(
            (preset_hint(job.preset, family, size, device, hires=target, figures_family=figures_family), False)
        )
        details += preset_tooltip(job.preset, family, figures_family)
    else:
        lines.append(_custom_line("", job.first, family))
    if not is_img2img:
        hires_lines, hires_details = _hires_lines(job, family, hires_size, device, figures_family)
        lines += hires_lines
        details += hires_details
    if page is not None:
        details += token_details(job, page, is_img2img=is_img2img, family=family, pixels=pixels)
    note = _html(lines, title="\n".join(details))
    if page is None:
        return note
    return note + token_hint_html(job, page, is_img2img=is_img2img, family=family, pixels=pixels)


def _with_frames(size: tuple[int, int] | None, frames: int) -> Size | None:
    """A size for the speed table: with its frames where the model makes a video of more than one."""
    return size if size is None or frames <= 1 else (*size, frames)


def _families(family: str | None) -> tuple[str, ...]:
    return FAMILIES if family is None else (family,)


def preset_tooltip(preset: str, family: str | None, figures_family: str | None = None) -> list[str]:
    """The note's tooltip for a preset, one line per family (`family` alone when known): what it runs
    (`describe_config`), its speed-up at each size of the speed table (`figures_family`'s rows where given) and
    where those figures come from, and the reference its change is held to, in full."""
    chosen = tome_core.get_preset(preset)
    lines = []
    for name in _families(family):
        parts = [describe_config(chosen.config(name), name)]
        rows = figures_family if family is not None and figures_family is not None else name
        found = [figures.speed(rows, chosen.name, *size) for size in figures.sizes(rows, chosen.name)]
        each = [f"{f.speedup:.2f}\u00d7 at {f.size[0]}\u00d7{f.size[1]}" for f in found if f is not None]
        if each:
            source = found[0].source if found[0] is not None else None
            how = "" if source is None else f" ({source.device}, {'measured' if source.measured else 'estimated'})"
            parts.append(f"faster per step: {', '.join(each)}{how}")
        held = chosen.fidelity.get(name)
        if held is not None:
            parts.append(f"its change is held to {REFERENCES.get(held.reference, held.reference)}")
        lines.append(f"{FAMILY_LABELS[name]}: {'; '.join(parts)}")
    return lines


def _hires_lines(
    job: TomeJob,
    family: str | None,
    size: Size | None,
    device: str | None = None,
    figures_family: str | None = None,
) -> tuple[list[tuple[str, bool]], list[str]]:
    """The hires pass's lines where it runs other values than the first pass: its own preset (that preset's line at
    the hires size), other custom values, or none ("no merging"); a pass at the first pass's preset has its figure
    in the first line (`hires_follows`)."""
    if job.hires_mode == "off":
        return [("Hires pass: no merging", False)], []
    if not job.needs_family(True):
        hires = job.pass_config(True)
        own = job.hires_mode == "own" and hires is not None
        return ([_custom_line("Hires pass: ", hires, family)] if own else []), []
    if hires_follows(job):
        return [], []
    if job.hires_preset != CUSTOM and not job.hires_changes:  # a preset of its own
        label = PRESET_LABELS[job.hires_preset]
        hint = preset_hint(job.hires_preset, family, size, device, figures_family=figures_family)
        return [(f"Hires pass, {label}: {hint}", False)], [
            f"Hires pass, {line}" for line in preset_tooltip(job.hires_preset, family, figures_family)
        ]
    configs = {f: job.pass_config(True, f) for f in _families(family)}
    if all(c == job.pass_config(False, f) for f, c in configs.items()):
        return [], []
    lines = [
        (f"Hires pass, {FAMILY_LABELS[f]}: {describe_config(c, f)}", False) for f, c in configs.items() if c is not None
    ]
    return lines, []


def _html(lines: Sequence[tuple[str, bool]], title: str = "") -> str:
    """The note's div: its lines, each flagged True when it is an error (class `tome-invalid`, in the theme's error
    colour), and its tooltip."""
    invalid = any(flag for _, flag in lines)
    body = "<br>".join(html.escape(text) for text, _ in lines)
    tip = f' title="{html.escape(title, quote=True)}"' if title else ""
    if invalid:  # inline: the extension ships no style.css; gradio's theme variable, with a fallback
        return f'<div class="tome-cap-note tome-invalid" style="color: var(--error-text-color, #dc2626);"{tip}>{body}</div>'
    return f'<div class="tome-cap-note"{tip}>{body}</div>'


# ---------------------------------------------------------------------------------------------- the token hint


@dataclass(frozen=True)
class PageValues:
    """What javascript/tome.js sends the note: the values of the controls the note reads and the WebUI's own
    controls the token hint needs.

    `controls` maps an item of the accordion (`preset`, `ratio`, ...) to its value as gradio handed it to the page
    (tome.js starts from the values the page was built with); the note's handler takes those it reads. `hires` is
    whether the Hires fix is on, None where the page has no such control (img2img, another UI); the `hr_*` values
    are the WebUI's "Upscale by", "Resize width to" and "Resize height to". `batch_size` is the WebUI's "Batch size"
    (Forge Neo's "Frames" while its UI preset is Wan), None where the page has none. `send` numbers the page's
    sends: it makes each one a change, and the hint echoes it.
    """

    width: float | None = None
    height: float | None = None
    hires: bool | None = None
    hr_scale: float | None = None
    hr_resize_x: float | None = None
    hr_resize_y: float | None = None
    batch_size: float | None = None
    send: int = 0
    controls: Mapping[str, Any] = field(default_factory=dict)

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
                batch_size=_number(raw.get("batch_size")),
                send=int(_number(raw.get("send")) or 0),
                controls=_controls(raw.get("controls")),
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


def _controls(value: Any) -> dict[str, Any]:
    """The controls' values from the page's JSON: an object of item names; ValueError for anything else."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"expected an object of the controls' values, got {value!r}")
    return dict(value)


def _number(value: Any) -> float | None:
    """A number from the page's JSON (JavaScript's NaN arrives as null); ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _levels_text(family: str, size: tuple[int, int], config: TomeConfig, *, unit: bool) -> str:
    """The levels `config` merges ("4096 -> 2048 tokens at 1/1, ..."), counted by `tome_core.describe_layout`; a
    level whose grid is smaller than one cell merges nothing ("256 tokens unmerged at 1/4", `unmerged_levels`)."""
    width, height = size[0] // 8 * 8, size[1] // 8 * 8  # the latent is pixels // 8 (a hires size may be any)
    word = " keys/values" if config.mode == "kv" else " tokens"  # kv mode: the pooled keys/values attended to
    infos = [info for info in tome_core.describe_layout(FAMILY_LAYOUTS[family], height, width, config) if info.merging]
    unmerged = unmerged_levels(config, family, width, height) if config.mode == "merge" else ()
    parts = []
    for n, info in enumerate(infos):
        unit_word = word if unit and n == 0 else ""
        if info.level in unmerged:
            parts.append(f"{info.tokens}{unit_word} unmerged at 1/{info.level}")
        else:
            parts.append(f"{info.tokens} \u2192 {info.tokens_after}{unit_word} at 1/{info.level}")
    return ", ".join(parts)


def _dit_text(family: str, size: tuple[int, int], config: TomeConfig, pixels: int = DIT_PIXELS_PER_TOKEN) -> str:
    """A diffusion transformer's tokens at a size, from the core's block table for the family's public checkpoints
    (`DIT_BLOCKS`): the image's tokens and the keys/values each reduced block attends to ("4096 -> 1024 keys/values
    per reduced block"), and where blocks run on merged tokens how many they run on ("4096 -> 1024 tokens in merged
    blocks"); text and reference tokens are kept whole and not counted. `pixels`: pixels per token side."""
    h, w = size[1] // pixels, size[0] // pixels
    acting = plan_dit(config, DIT_BLOCKS[family]).acting
    if not acting or h < 1 or w < 1:
        return "no reduction"
    parts = []
    merged = next((block for block in acting if block.kind == "whole"), None)
    pooled = next((block for block in acting if block.kind == "kv"), None)
    if pooled is not None:
        parts.append(f"{h * w} \u2192 {pooled.tokens(h, w)['kv']} keys/values per reduced block")
    if merged is not None:
        parts.append(f"{h * w} \u2192 {merged.tokens(h, w)['attn1']} tokens in merged blocks")
    return ", ".join(parts)


def _family_text(
    family: str, size: tuple[int, int], config: TomeConfig, *, unit: bool, pixels: int = DIT_PIXELS_PER_TOKEN
) -> str:
    """One family's tokens for a config at a size: per UNet level, or per block of a diffusion transformer (a token
    `pixels` wide)."""
    if is_transformer(family):
        if refusal(config, family):
            return "not run on this model (see above)"
        return _dit_text(family, size, config, pixels)
    return _levels_text(family, size, config, unit=unit)


def _pass_hint(
    job: TomeJob,
    is_hr_pass: bool,
    size: tuple[int, int],
    family: str | None = None,
    pixels: int = DIT_PIXELS_PER_TOKEN,
) -> str:
    """One pass's tokens: per model family for a preset (the loaded one's alone when known), else the custom
    settings on the loaded family's layout, or while none is known on SD1/SD2's (and on SDXL's too with max
    downsample "auto", where the levels differ by family)."""
    if job.needs_family(is_hr_pass):
        parts = []
        for name in _families(family):
            config = job.pass_config(is_hr_pass, name)
            assert config is not None  # (the hires pass is off: no line)
            text = _family_text(name, size, config, unit=True, pixels=pixels)
            nothing = "no merging" if config.is_noop else "no attention at these levels"
            parts.append(f"{FAMILY_LABELS[name]}: {text or nothing}")
        return "; ".join(parts)
    config = job.pass_config(is_hr_pass)
    assert config is not None
    if config.is_noop:
        return "no merging"
    if family is not None:
        return _family_text(family, size, config, unit=True, pixels=pixels) or "no attention at these levels"
    text = _levels_text("sd", size, config, unit=True)
    if config.max_downsample == "auto":
        text += f" (SDXL: {_levels_text('sdxl', size, config, unit=False)})"
    return text


def token_hint_title() -> str:
    """The token hint's hover text; which levels "auto" merges comes from `tome_core.describe_layout`."""
    autos = []
    for family in FAMILIES:
        auto = TomeConfig(max_downsample="auto")
        levels = [i.level for i in tome_core.describe_layout(FAMILY_LAYOUTS[family], config=auto) if i.merging]
        autos.append(f"at {' and '.join(f'1/{level}' for level in levels)} on {FAMILY_LABELS[family]}")
    return (
        "Image tokens per attention layer, before and after merging, at the size set above (latent = pixels / 8;"
        ' level 1/1 is the full latent, 1/2 the first downsampled level, ...). With max downsample "auto" ToMe'
        f" merges {' and '.join(autos)}. Shown for Custom settings, counted for the loaded model's family (SD1/SD2"
        " and SDXL while none is loaded); a preset's are in the tooltip of the line above. On a diffusion transformer"
        f" (Flux, Wan, ...): the image's tokens (pixels / {DIT_PIXELS_PER_TOKEN} per side, / 32 on Wan 2.2 TI2V 5B;"
        " per frame of a video) and the keys/values each"
        " reduced block attends to; text and reference tokens are kept whole."
    )


def _is_custom(job: TomeJob, is_hr_pass: bool) -> bool:
    """Whether a pass runs the Custom controls' values (the first pass's, or the hires pass's own), not a preset."""
    if not is_hr_pass or job.hires_mode != "own":
        return job.preset == CUSTOM
    return job.hires_preset == CUSTOM


def _token_lines(
    job: TomeJob, page: PageValues, *, is_img2img: bool, family: str | None, pixels: int = DIT_PIXELS_PER_TOKEN
) -> list[tuple[bool, str, str]]:
    """Per pass: (whether it runs Custom values, its label, its tokens per level); the hires pass in txt2img
    while Hires fix is on."""
    size = page.size()
    if size is None:
        return []
    out = [(_is_custom(job, False), "", _pass_hint(job, False, size, family, pixels))]
    hires = None if is_img2img else page.hires_size()
    if hires is not None:
        text = "no merging" if job.hires_mode == "off" else _pass_hint(job, True, hires, family, pixels)
        out.append((_is_custom(job, True), f"Hires pass ({hires[0]}\u00d7{hires[1]}): ", text))
    return out


def token_details(
    job: TomeJob,
    page: PageValues,
    *,
    is_img2img: bool,
    family: str | None = None,
    pixels: int = DIT_PIXELS_PER_TOKEN,
) -> list[str]:
    """The tokens per level of the passes that run a preset, for the note's tooltip (a user choosing a preset
    reads its line; the counts are there on hover). `pixels`: a transformer token's side in pixels."""
    lines = _token_lines(job, page, is_img2img=is_img2img, family=family, pixels=pixels)
    size = page.size()
    first = f"Tokens per attention layer ({size[0]}\u00d7{size[1]}): " if size else ""
    return [f"{label or first}{text}" for custom, label, text in lines if not custom]


def token_hint_html(
    job: TomeJob | None,
    page: PageValues,
    *,
    is_img2img: bool,
    family: str | None = None,
    pixels: int = DIT_PIXELS_PER_TOKEN,
) -> str:
    """The token hint (`div.tome-token-hint`, id of the item `token_hint`): for each pass that runs Custom values, a
    line of its tokens per level (the first pass, and in txt2img the Hires fix pass while it is on), counted for
    the loaded family's layout (`FAMILY_LAYOUTS`; both families while none is known); a pass that runs a preset
    has its line in the note's tooltip instead (`token_details`). No lines without a `job` (invalid settings).
    Always in the page, empty or not: `data-tome-send` echoes the page values' `send`, so javascript/tome.js can
    tell which of its sends the hint answers."""
    lines = []
    if job is not None:
        lines = [
            label + text
            for custom, label, text in _token_lines(job, page, is_img2img=is_img2img, family=family, pixels=pixels)
            if custom
        ]
    element_id = elem_id("img2img" if is_img2img else "txt2img", "token_hint")
    # Inline style: the extension ships no style.css; these are gradio's theme variables.
    style = "font-size: var(--text-sm); color: var(--body-text-color-subdued); margin-top: 0.25em;"
    body = "".join(f"<div>{html.escape(line)}</div>" for line in lines)
    title = html.escape(token_hint_title(), quote=True)
    return (
        f'<div id="{element_id}" class="tome-token-hint" data-tome-send="{page.send}" title="{title}"'
        f' style="{style}">{body}</div>'
    )
