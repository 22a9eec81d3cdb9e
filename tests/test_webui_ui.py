"""The accordion under gradio 3.41.2: builds in gr.Blocks, twice (as the API does), in the documented order."""

from __future__ import annotations

import functools
import html
import json
import re
import warnings
from collections.abc import Iterator
from typing import Any

import gradio as gr
import pytest
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import script_callbacks, scripts
from modules.ui_components import InputAccordion
from webui_stub.harness import install_xyz_module, load_extension, reset

import tome_core
import tome_webui
from tome_bench import archs
from tome_core import DEFAULT_PRESET, FAMILIES, TomeConfig, field_specs, get_preset, presets
from tome_core.words import preset_hint, unmerged_levels
from tome_webui import ui
from tome_webui.params import ARG_NAMES, IMG2IMG_ARG_NAMES, UI_PRESET_DEFAULT, defaults, ui_value

# gradio 3.41 builds its app with FastAPI's deprecated on_event; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:(?s).*on_event is deprecated:DeprecationWarning")


@pytest.fixture
def script_classes() -> Iterator[list[type]]:
    reset()
    load_extension()
    yield [data.script_class for data in scripts.scripts_data]
    reset()


def make_script(script_classes: list[type], is_img2img: bool) -> scripts.Script:
    (cls,) = script_classes
    script = cls()
    script.is_img2img = is_img2img
    script.is_txt2img = not is_img2img
    return script


def all_blocks(root: gr.Blocks) -> list[gr.blocks.Block]:
    return list(root.blocks.values())


@pytest.mark.parametrize("is_img2img", [False, True])
def test_ui_builds_twice_in_throwaway_blocks_like_the_api(script_classes: list[type], is_img2img: bool) -> None:
    script = make_script(script_classes, is_img2img)
    names = IMG2IMG_ARG_NAMES if is_img2img else ARG_NAMES
    registered = {name: list(items) for name, items in script_callbacks.callbacks.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", category=UserWarning)  # e.g. gradio's unused-kwarg warning (tooltip=)
        for _ in range(2):  # Api.init_default_script_args: once in an `if`, once in the loop
            with gr.Blocks() as demo:
                components = script.ui(is_img2img)
            assert len(components) == len(names)
            assert isinstance(components[0], InputAccordion) and components[0].value is False
            assert [c.value for c in components] == [ui_value(n, defaults()[n]) for n in names]
            presets = [n for n in names if n in ("preset", "hr_preset")]
            assert all(components[names.index(n)].value is UI_PRESET_DEFAULT for n in presets)  # not just equal
            assert [type(c.value) for n, c in zip(names[1:], components[1:]) if n not in presets] == [
                type(ui_value(n, defaults()[n])) for n in names[1:] if n not in presets
            ]
            assert len(script.infotext_fields) == len(names)
            assert all(c is f[0] for c, f in zip(components, script.infotext_fields, strict=True))
            ids = {b.elem_id for b in all_blocks(demo) if getattr(b, "elem_id", None)}
            tab = "img2img" if is_img2img else "txt2img"
            items = [i for i in ui.ELEM_ITEMS if not is_img2img or not (i == "hires" or i.startswith("hr_"))]
            assert {ui.elem_id(tab, item) for item in items} <= ids
            assert all(
                ui.elem_id(tab, n) == c.elem_id for n, c in zip(names, components, strict=True) if n != "enabled"
            )
            assert components[0].accordion.elem_id == ui.elem_id(tab, "enable")
    assert {name: list(items) for name, items in script_callbacks.callbacks.items()} == registered  # no global effects


def test_controls_follow_the_field_table(script_classes: list[type]) -> None:
    script = make_script(script_classes, False)
    with gr.Blocks():
        components = dict(zip(ARG_NAMES, script.ui(False), strict=True))
    for spec in field_specs():
        control = components[spec.name]
        assert control.label.startswith(spec.label)
        if isinstance(control, gr.Slider):
            assert (control.minimum, control.maximum, control.step) == (spec.minimum, spec.maximum, spec.step)
        if isinstance(control, gr.Radio):
            assert [value for _, value in control.choices] == [str(c) for c in spec.choices or ()]
    assert components["hr_mode"].choices == [("Same as first pass", "same"), ("Own settings", "own"), ("Off", "off")]
    choices = [("Quality", "quality"), ("Balanced", "balanced"), ("Fast", "fast"), ("Fastest", "fastest")]
    assert [(p.label, p.name) for p in presets()] == choices
    for name in ("preset", "hr_preset"):
        assert components[name].choices == [*choices, ("Custom", "custom")]
        assert components[name].value == DEFAULT_PRESET
    assert (components["preset"].label, components["hr_preset"].label) == ("Speed", "Hires speed")
    assert components["mlp_ratio"].label == "MLP ratio (-1: default)" and components["mlp_ratio"].value == -1.0
    assert components["hr_ratio"].label == "Hires ratio"
    labels = [c.label for c in components.values()]
    assert len(set(labels)) == len(labels)  # ui-config.json keys are built from labels
    assert components["enabled"].accordion.label == "Token Merging (ToMe)"


def test_elem_items_documented() -> None:
    doc = " ".join((ui.__doc__ or "").split())
    for item in ui.ELEM_ITEMS:
        assert item in doc
    assert tome_webui.ELEM_ITEMS is ui.ELEM_ITEMS
    assert ui.elem_id("txt2img", "hr_mode") == "script_txt2img_tome_hr_mode"


def note(is_img2img: bool = False, **values: Any) -> str:
    return ui.note_html({"preset": "custom", **values}, is_img2img=is_img2img)


def test_cap_note_for_custom_settings() -> None:
    assert "tome-invalid" not in note(ratio=0.5, sx=2, sy=2)
    text = note(ratio=0.75, sx=2, sy=2, hr_mode="own", hr_preset="custom", hr_ratio=0.9, hr_sx=4, hr_sy=4)
    assert "merging 0.75 of the tokens" in text and "Hires pass: merging 0.90" in text
    # a ratio the strides cannot reach is refused, as everywhere: the note shows the core's message as an error
    refused = note(ratio=0.9, sx=2, sy=2)
    assert "tome-invalid" in refused and "invalid settings: " in refused and "at most 1 - 1/(sx*sy) = 0.75" in refused
    assert "tome-invalid" in note(hr_mode="own", hr_preset="custom", hr_ratio=0.5, hr_sx=1, hr_sy=1)
    assert "Hires pass: no merging" in note(hr_mode="off")
    assert "Hires pass" not in note(hr_mode="same") and "Hires pass" not in note(True, ratio=0.3)
    assert "invalid settings: sx must be an integer in [1, 8], got &#x27;two&#x27;" in note(sx="two")
    # kv mode pools keys/values over the strides' cells: the ratio is not what it does
    kv = note(mode="kv", ratio=0.9, sx=4, sy=2)
    assert "pooling keys/values over 4\u00d72 cells" in kv and "0.90" not in kv and "tome-capped" not in kv
    assert "Hires pass: pooling keys/values over 2\u00d72" in note(mode="kv", hr_mode="own", hr_preset="custom")
    assert "nothing to pool" in note(True, mode="kv", sx=1, sy=1)
    assert "tome-token-hint" not in kv  # no page values yet: no token hint


def visible_text(note: str) -> str:
    """The note's text as the page shows it (its tooltip aside)."""
    body = re.sub(r'title="[^"]*"', "", note)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def tooltip(note: str) -> str:
    match = re.search(r'<div class="tome-cap-note[^"]*" title="([^"]*)"', note)
    assert match is not None, note
    return html.unescape(match.group(1))


@pytest.mark.parametrize("name", [p.name for p in presets()])
def test_note_for_a_preset_speaks_the_users_words(name: str) -> None:
    """The note says what the preset gains and changes (tome_core.words.preset_hint, from the speed table and
    Preset.fidelity), for the loaded model's family alone when it is known; what it runs is in the tooltip."""
    unknown = ui.note_html({"preset": name, "ratio": 0.37}, is_img2img=True)
    assert preset_hint(name) in visible_text(unknown)
    assert tooltip(unknown) == "\n".join(ui.preset_tooltip(name, None))
    assert unknown == ui.note_html({"preset": name}, is_img2img=True)  # the hidden custom ratio is not what runs
    for family, other in (("sd", "SDXL"), ("sdxl", "SD1/SD2")):
        loaded = ui.note_html({"preset": name}, is_img2img=True, family=family)
        assert preset_hint(name, family) in visible_text(loaded) and other not in visible_text(loaded)
        assert tooltip(loaded) == "\n".join(ui.preset_tooltip(name, family))
        assert tooltip(loaded).startswith(
            f"{ui.FAMILY_LABELS[family]}: {ui.describe(get_preset(name).config(family), family)}"
        )
    assert "Hires pass" not in ui.note_html({"preset": name, "hr_mode": "same"}, is_img2img=False)
    # Too small to merge at some level: said, for the size the page sent
    page = ui.PageValues.from_json(json.dumps({"width": 64, "height": 64, "send": 1}))
    small = ui.note_html({"preset": name}, is_img2img=True, page=page, family="sd")
    assert preset_hint(name, "sd", (64, 64)) in visible_text(small)
    assert ("too small" in visible_text(small)) == bool(unmerged_levels(get_preset(name).config("sd"), "sd", 64, 64))


def test_note_for_the_hires_pass_with_presets() -> None:
    own = ui.note_html({"preset": "quality", "hr_mode": "own", "hr_preset": "fastest"}, is_img2img=False)
    assert f"Hires pass, Fastest: {preset_hint('fastest')}" in visible_text(own)
    assert tooltip(own) == "\n".join(
        [*ui.preset_tooltip("quality", None), *(f"Hires pass, {line}" for line in ui.preset_tooltip("fastest", None))]
    )
    custom = ui.note_html(
        {"preset": "fast", "hr_mode": "own", "hr_preset": "custom", "hr_ratio": 0.7, "hr_max_downsample": "1"},
        is_img2img=False,
    )
    # Own max downsample 1 lies below the preset's first merging level (4): the hires pass merges from level 1, with
    # the hires controls' own strides (2x2 by default).
    sdxl = get_preset("fast").config("sdxl").replace(ratio=0.7, max_downsample=1, min_downsample=1, sx=2, sy=2)
    assert f"Hires pass, SDXL: {ui.describe(sdxl, 'sdxl')}" in visible_text(custom)
    loaded = ui.note_html({"preset": "fast", "hr_mode": "own", "hr_preset": "custom"}, is_img2img=False, family="sd")
    assert "Hires pass, SD1/SD2: " in visible_text(loaded) and "SDXL" not in visible_text(loaded)
    assert "Hires pass: no merging" in ui.note_html({"preset": "fast", "hr_mode": "off"}, is_img2img=False)


# ---------------------------------------------------------------------------------------------- the token hint


@functools.cache
def real_unet(arch: str) -> Any:
    """The real SD1.5 or SDXL UNet architecture on the meta device: no weights, built in a fraction of a second."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        return UNet2DConditionModel(**archs.get_arch(arch).config)


def test_family_layouts_are_the_real_architectures() -> None:
    """The layouts the hint counts on are the real SD1.5 and SDXL blocks per level, so the same levels merge
    ("auto" included) and tome_core.describe_layout gives describe's figures."""
    assert set(ui.FAMILY_LAYOUTS) == set(FAMILIES)
    config = TomeConfig(ratio=0.6, sx=4, sy=1)
    for family, arch in (("sd", "sd15"), ("sdxl", "sdxl")):
        unet = real_unet(arch)
        assert tome_core.blocks_per_level(unet) == ui.FAMILY_LAYOUTS[family]
        for size in ((512, 512), (1000, 616)):
            ours = tome_core.describe_layout(ui.FAMILY_LAYOUTS[family], *size, config)
            assert ours == tome_core.describe(unet, *size, config)


def hint(is_img2img: bool = False, page: dict[str, Any] | None = None, **values: Any) -> list[str]:
    """The token hint's lines for the control values, with the page values `page` (512 x 512, Hires fix off)."""
    text = ui.note_html(
        {"preset": "custom", **values},
        is_img2img=is_img2img,
        page=ui.PageValues.from_json(json.dumps({"width": 512, "height": 512, "send": 7, **(page or {})})),
    )
    match = re.search(r'<div id="([^"]+)" class="tome-token-hint" data-tome-send="7"[^>]*>(.*)</div>$', text)
    assert match is not None, text
    assert match.group(1) == ui.elem_id("img2img" if is_img2img else "txt2img", "token_hint")
    return [html.unescape(line) for line in re.findall(r"<div>(.*?)</div>", match.group(2))]


def test_token_hint_counts_with_tome_core_describe() -> None:
    def levels(family: str, width: int, height: int, config: TomeConfig) -> list[tuple[int, int, int]]:
        infos = tome_core.describe_layout(ui.FAMILY_LAYOUTS[family], height, width, config)
        return [(i.tokens, i.tokens_after, i.level) for i in infos if i.merging]

    # custom settings: SD1/SD2's levels, SDXL's in brackets while max downsample is "auto"
    sd = levels("sd", 512, 512, TomeConfig())
    sdxl = levels("sdxl", 512, 512, TomeConfig())
    assert sd == [(4096, 2048, 1)] and sdxl == [(1024, 512, 2), (256, 128, 4)]
    assert hint() == ["4096 \u2192 2048 tokens at 1/1 (SDXL: 1024 \u2192 512 at 1/2, 256 \u2192 128 at 1/4)"]
    assert hint(max_downsample="2", mode="kv") == ["4096 \u2192 1024 keys/values at 1/1, 1024 \u2192 256 at 1/2"]
    assert hint(ratio=0.0) == ["no merging"]
    assert hint(True, page={"hires": True}) == hint(True)  # img2img has no Hires fix pass
    # a preset: each family with its own values, and the hires pass at the WebUI's hires size, in the note's tooltip
    # (a user choosing a preset reads its line; nothing is shown under it)
    values, page = {"preset": "fast", "hr_mode": "own", "hr_preset": "quality"}, {"hires": True, "hr_scale": 1.5}
    assert hint(page=page, **values) == []
    sent = ui.PageValues.from_json(json.dumps({"width": 512, "height": 512, "send": 7, **page}))
    lines = tooltip(ui.note_html(values, is_img2img=False, page=sent)).splitlines()[-2:]
    assert lines[0].startswith("Tokens per attention layer (512\u00d7512): SD1/SD2: ")
    for line, size, preset in ((lines[0], (512, 512), "fast"), (lines[1], (768, 768), "quality")):
        for family in FAMILIES:
            config = get_preset(preset).config(family)
            first, *rest = levels(family, *size, config)
            unit = " keys/values" if config.mode == "kv" else " tokens"
            text = ", ".join(
                [
                    f"{first[0]} \u2192 {first[1]}{unit} at 1/{first[2]}",
                    *(f"{a} \u2192 {b} at 1/{lv}" for a, b, lv in rest),
                ]
            )
            assert f"{ui.FAMILY_LABELS[family]}: {text}" in line
    assert lines[1].startswith("Hires pass (768\u00d7768): SD1/SD2: ")
    assert hint(page={"hires": True, "hr_scale": 2}, hr_mode="off")[1] == "Hires pass (1024\u00d71024): no merging"
    assert hint(sx="two", page={"hires": True}) == []  # invalid settings: the note says so, the hint is empty


@pytest.mark.parametrize(
    ("values", "size"),
    [
        ({"hr_scale": 2}, (1024, 1280)),
        ({"hr_scale": 1.5, "hr_resize_x": 1024}, (1024, 1280)),  # the other side keeps the aspect ratio
        ({"hr_scale": 1.5, "hr_resize_y": 1000}, (800, 1000)),
        ({"hr_scale": 1.5, "hr_resize_x": 1000, "hr_resize_y": 700}, (1000, 700)),  # both: exactly that
        ({"hr_scale": None}, None),
        ({"hr_scale": 2, "hires": False}, None),
    ],
)
def test_page_values_hires_size_follows_the_webui(values: dict[str, Any], size: tuple[int, int] | None) -> None:
    page = ui.PageValues.from_json(json.dumps({"width": 512, "height": 640, "hires": True, **values}))
    assert page is not None and page.hires_size() == size


def test_page_values_read_the_batch_size_and_a_video_gets_its_frames() -> None:
    """tome.js sends the WebUI's batch size; the note turns it into frames only through `frames_of` (Forge Neo's
    Wan, `ui.loaded_frames`): without it, or with a model that makes images, the note is the one of an image."""
    page = json.dumps({"width": 832, "height": 480, "batch_size": 81, "send": 1, "controls": {"preset": "balanced"}})
    assert ui.PageValues.from_json(page).batch_size == 81  # type: ignore[union-attr]
    image = ui.note_for_page(page, is_img2img=True, family="wan")
    assert ui.note_for_page(page, is_img2img=True, family="wan", frames_of=lambda size: 1) == image
    video = html.unescape(ui.note_for_page(page, is_img2img=True, family="wan", frames_of=lambda size: int(size or 1)))
    assert "832\u00d7480, 81 frames" in video and "81 frames" not in html.unescape(image)


def test_unreadable_page_values_are_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    assert ui.PageValues.from_json("") is None
    for text in ("{", "[1]", '{"width": "wide"}'):
        assert ui.PageValues.from_json(text) is None
    assert len([r for r in caplog.records if r.name == "tome" and "page values" in r.message]) == 3
    assert ui.PageValues.from_json('{"width": null, "height": 600}').size() is None


def test_token_hint_title_names_the_auto_levels() -> None:
    title = ui.token_hint_title()
    assert "at 1/1 on SD1/SD2 and at 1/2 and 1/4 on SDXL" in title


def test_describe() -> None:
    assert (
        ui.describe(TomeConfig())
        == "merging 0.50 of the tokens (self-attention), strides 2\u00d72, max downsample auto"
    )
    assert ui.describe(TomeConfig(mode="kv", sx=4)) == "keys/values pooled over 4\u00d72 cells, max downsample auto"
    assert ui.describe(TomeConfig(mode="kv", merge_mlp=True, mlp_ratio=0.3)) == (
        "keys/values pooled over 2\u00d72 cells, 0.30 for the MLP, max downsample auto"
    )
    full = TomeConfig(ratio=0.7, merge_crossattn=True, merge_mlp=True, mlp_ratio=0.4, share_plan=True, step_end=0.8)
    assert ui.describe(full) == (
        "merging 0.70 of the tokens (self/cross-attention), 0.40 for the MLP, strides 2\u00d72, max downsample"
        " auto, one plan per stack, steps 0 to 0.8"
    )
    assert ui.describe(TomeConfig(ratio=0.0)) == "no merging"


@pytest.mark.parametrize("is_img2img", [False, True])
def test_handlers_are_wired_to_the_right_controls(script_classes: list[type], is_img2img: bool) -> None:
    """The speed selectors show and hide the detailed settings in the browser; every control the note reads hands
    its values to javascript/tome.js in the browser; the note's one call takes the page's JSON as event data."""
    script = make_script(script_classes, is_img2img)
    with gr.Blocks() as demo:
        components = dict(zip(IMG2IMG_ARG_NAMES if is_img2img else ARG_NAMES, script.ui(is_img2img), strict=True))
    by_id = {block._id: block for block in demo.blocks.values()}
    tab = "img2img" if is_img2img else "txt2img"
    events: dict[tuple[str, str], list[tuple[dict[str, Any], Any]]] = {}
    for dependency, fn in zip(demo.dependencies, demo.fns, strict=True):
        for target in dependency["targets"]:
            control = by_id[target[0] if isinstance(target, (list, tuple)) else target]
            outputs = [by_id[i].elem_id for i in dependency["outputs"]]
            events.setdefault((control.elem_id, outputs[0] if outputs else ""), []).append((dependency, fn.fn))

    def event(source: str, target: str) -> tuple[dict[str, Any], Any]:
        (found,) = events[(ui.elem_id(tab, source), ui.elem_id(tab, target) if target else "")]
        return found

    shown = [("preset", "custom", "custom")]
    if not is_img2img:
        shown += [("hr_mode", "hr_settings", "own"), ("hr_preset", "hr_custom", "custom")]
    for source, target, value in shown:
        dependency, fn = event(source, target)
        assert fn is None and not dependency["backend_fn"] and dependency["js"] == ui.visibility_js(value)
        assert [by_id[i] for i in dependency["inputs"]] == [components[source]]
    assert 'value === "custom"' in ui.visibility_js("custom")
    # The note: one call, no inputs, the page's JSON as the event's data.
    dependency, fn = event("page_values", "cap_note")
    assert dependency["backend_fn"] and dependency["inputs"] == []
    assert (
        by_id[
            dependency["targets"][0][0] if isinstance(dependency["targets"][0], list) else dependency["targets"][0]
        ].visible
        is False
    )
    names = ui.note_args(is_img2img)
    page = json.dumps({"width": 640, "height": 512, "send": 3, "controls": {"preset": "custom", "ratio": 0.3}})
    assert fn(gr.EventData(None, page)) == ui.note_for_page(page, is_img2img=is_img2img)
    assert fn(gr.EventData(None, page)) == ui.note_html(
        {"preset": "custom", "ratio": 0.3}, is_img2img=is_img2img, page=ui.PageValues.from_json(page)
    )
    assert 'data-tome-send="3"' in fn(gr.EventData(None, page))
    assert fn(gr.EventData(None, "")) == ui.note_html({}, is_img2img=is_img2img)  # before tome.js wrote any
    # Every control the note reads hands the values of all of them over in the browser when it changes.
    for name in names:
        dependency, fn = event(name, "")
        assert fn is None and not dependency["backend_fn"] and dependency["js"] == ui.changed_js(tab, names)
        assert [by_id[i] for i in dependency["inputs"]] == [components[n] for n in names]
    assert f"'tome_changed', {{detail: {{tab: \"{tab}\", names: {json.dumps(list(names))}" in ui.changed_js(tab, names)
    # at the defaults (a preset), the custom columns start hidden, the note describes the preset
    assert [b.visible for b in demo.blocks.values() if getattr(b, "elem_id", None) == ui.elem_id(tab, "custom")] == [
        False
    ]


def test_controls_unknown_to_the_note_are_ignored_and_bad_ones_logged(caplog: pytest.LogCaptureFixture) -> None:
    page = {"width": 512, "height": 512, "send": 1, "controls": {"enable-checkbox": True, "page_values": ""}}
    assert ui.note_for_page(json.dumps(page), is_img2img=True) == ui.note_html(
        {}, is_img2img=True, page=ui.PageValues.from_json(json.dumps(page))
    )
    assert ui.PageValues.from_json(json.dumps({**page, "controls": [1]})) is None
    assert any("page values" in r.message for r in caplog.records if r.name == "tome")
    bad = ui.note_for_page(json.dumps({**page, "controls": {"sx": "two", "preset": "custom"}}), is_img2img=True)
    assert "invalid settings: sx must be an integer in [1, 8], got &#x27;two&#x27;" in bad


def test_no_tooltip_kwarg_without_the_webui_patch() -> None:
    assert tome_webui.compat.tooltip_kwargs("help") == {}


def test_xyz_axes_registered_once(script_classes: list[type]) -> None:
    xyz = install_xyz_module()
    for _ in range(3):  # on_before_ui runs again on every Reload UI
        script_callbacks.before_ui_callback()
    labels = [o.label for o in xyz.axis_options]
    assert labels == [
        "Nothing",
        "[ToMe] Enabled",
        "[ToMe] Preset",
        "[ToMe] Hires preset",
        "[ToMe] Ratio",
        "[ToMe] Hires ratio",
        "[ToMe] Strides",
        "[ToMe] Max downsample",
    ]
    (hires,) = [o for o in xyz.axis_options if o.label == "[ToMe] Hires ratio"]
    assert hires.is_img2img is False
    (max_ds,) = [o for o in xyz.axis_options if o.label == "[ToMe] Max downsample"]
    assert max_ds.choices() == ["auto", "1", "2", "4", "8"]
    (preset,) = [o for o in xyz.axis_options if o.label == "[ToMe] Preset"]
    assert preset.choices() == ["quality", "balanced", "fast", "fastest", "custom"]
    (hires_preset,) = [o for o in xyz.axis_options if o.label == "[ToMe] Hires preset"]
    assert hires_preset.is_img2img is False and hires_preset.choices() == preset.choices()

    # Reload UI: new script modules, callbacks cleared, a fresh xyz_grid module
    script_callbacks.script_unloaded_callback()
    reset()
    load_extension()
    xyz = install_xyz_module()
    script_callbacks.before_ui_callback()
    assert sum(o.label.startswith("[ToMe]") for o in xyz.axis_options) == 7


def test_no_xyz_module_is_fine(script_classes: list[type]) -> None:
    script_callbacks.before_ui_callback()  # logs, does not raise
    from modules import errors

    assert errors.reported == []
