"""The accordion under gradio 3.41.2: builds in gr.Blocks, twice (as the API does), in the documented order."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import gradio as gr
import pytest
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import script_callbacks, scripts
from modules.ui_components import InputAccordion
from webui_stub.harness import install_xyz_module, load_extension, reset

import tome_webui
from tome_core import field_specs
from tome_webui import ui
from tome_webui.params import ARG_NAMES, IMG2IMG_ARG_NAMES, defaults, ui_value

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
            assert [type(c.value) for c in components[1:]] == [type(ui_value(n, defaults()[n])) for n in names[1:]]
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


def test_cap_note_and_hires_visibility() -> None:
    assert "tome-capped" not in ui.cap_note(0.5, 2, 2)
    note = ui.cap_note(0.9, 2, 2, "own", 0.9, 4, 4)
    assert "tome-capped" in note and "cap the ratio at 0.75" in note and "Hires pass: merging 0.90" in note
    assert "Hires pass: no merging" in ui.cap_note(0.5, 2, 2, "off", 0.5, 2, 2)
    assert "invalid settings" in ui.cap_note(0.5, "two", 2)
    assert ui.hires_visibility("own")["visible"] is True
    assert ui.hires_visibility("same")["visible"] is False


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
        "[ToMe] Ratio",
        "[ToMe] Hires ratio",
        "[ToMe] Strides",
        "[ToMe] Max downsample",
    ]
    (hires,) = [o for o in xyz.axis_options if o.label == "[ToMe] Hires ratio"]
    assert hires.is_img2img is False
    (max_ds,) = [o for o in xyz.axis_options if o.label == "[ToMe] Max downsample"]
    assert max_ds.choices() == ["auto", "1", "2", "4", "8"]

    # Reload UI: new script modules, callbacks cleared, a fresh xyz_grid module
    script_callbacks.script_unloaded_callback()
    reset()
    load_extension()
    xyz = install_xyz_module()
    script_callbacks.before_ui_callback()
    assert sum(o.label.startswith("[ToMe]") for o in xyz.axis_options) == 5


def test_no_xyz_module_is_fine(script_classes: list[type]) -> None:
    script_callbacks.before_ui_callback()  # logs, does not raise
    from modules import errors

    assert errors.reported == []
