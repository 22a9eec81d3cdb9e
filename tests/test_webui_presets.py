"""Speed presets through the stand-in WebUIs: resolved per pass for the model that runs it, recorded in the
infotext with the values that ran, pasted back to the same configs; hires same/own/off, XYZ, Forge's lazy load.

Preset values are read from `tome_core` (`Preset.config`), never copied here: they will still be tuned.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import gradio as gr
import pytest
import torch
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import errors, processing, scripts
from webui_stub import forge
from webui_stub.harness import (
    FakeSampler,
    WebUI,
    custom_args,
    install_xyz_module,
    load_extension,
    parse_generation_parameters,
    reset,
    run_xyz_cells,
    tome_args,
    ui_paste,
    webui_model,
)

import tome_core
import tome_webui
from tome_core import TomeConfig, get_preset
from tome_webui import infotext
from tome_webui.params import ARG_NAMES, FIELD_NAMES, HIRES_FIELDS

# gradio 3.41 builds its app with FastAPI's deprecated on_event; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:(?s).*on_event is deprecated:DeprecationWarning")

KINDS = {"sd": "ldm_sd1", "sdxl": "diffusers_sdxl"}  # a tiny SD1-like and SDXL-like UNet


def preset(name: str, family: str) -> TomeConfig:
    return get_preset(name).config(family)


@pytest.fixture(scope="module")
def paste_fields() -> Iterator[list[tuple[Any, Any]]]:
    """The txt2img script's `infotext_fields`, from its real `ui()` (the stand-in runners skip gradio)."""
    reset()
    load_extension()
    (data,) = scripts.scripts_data
    script = data.script_class()
    script.is_img2img, script.is_txt2img = False, True
    with gr.Blocks():
        script.ui(False)
    yield script.infotext_fields
    reset()


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {family: webui_model(kind, seed) for seed, (family, kind) in enumerate(KINDS.items())}


@pytest.fixture(autouse=True)
def _clean(models: dict[str, torch.nn.Module]) -> Iterator[None]:
    yield
    for model in models.values():
        tome_core.remove_patch(model)


def webui_for(models: dict[str, torch.nn.Module], family: str, version: str = "1.10") -> WebUI:
    webui = WebUI(version, {"main": models[family], **{f: m for f, m in models.items() if f != family}})
    return webui


def paste(fields: list[tuple[Any, Any]], text: str) -> list[Any]:
    values = ui_paste(fields, parse_generation_parameters(text))
    assert all(value is not None for value in values)
    return values


def assert_clean(webui: WebUI) -> None:
    assert not any(webui.patched().values())
    assert errors.reported == []


# ---------------------------------------------------------------------------------------------- first pass


@pytest.mark.parametrize("version", ["1.6", "1.10"])
@pytest.mark.parametrize("family", ["sd", "sdxl"])
def test_preset_runs_its_config_for_the_family_and_pastes_back(
    family: str, version: str, models: dict[str, torch.nn.Module], paste_fields: list[tuple[Any, Any]]
) -> None:
    webui = webui_for(models, family, version)
    p, processed = webui.txt2img(tome_args(True, preset="fast", ratio=0.05), enable_hr=True)
    expected = [("first", 0, "main", preset("fast", family)), ("hires", 0, "main", preset("fast", family))]
    assert p.sampler.passes() == expected
    extra = json.loads(processed.js())["extra_generation_params"]
    ran = preset("fast", family)
    assert extra["ToMe preset"] == "fast" and extra["ToMe hires"] == "same"
    assert extra["ToMe ratio"] == repr(ran.ratio) and extra["ToMe max downsample"] == str(ran.max_downsample)
    assert extra.get("ToMe merge MLP") == ("True" if ran.merge_mlp else None)
    assert extra.get("ToMe one plan per stack") == ("True" if ran.share_plan else None)
    assert "ToMe error" not in extra  # (the fake sampler does not run the UNet: the note says so)
    text = processed.infotexts[0]
    assert "ToMe preset: fast" in text and "ToMe ratio: 0.05" not in text
    assert_clean(webui)

    # Paste, then generate again: the same configs in both passes, and the same infotext.
    pasted = paste(paste_fields, text)
    named = dict(zip(ARG_NAMES, pasted, strict=True))
    assert named["preset"] == "fast" and named["ratio"] == ran.ratio
    p2, processed2 = webui.txt2img(pasted, enable_hr=True)
    assert p2.sampler.passes() == expected
    assert processed2.infotexts == processed.infotexts
    # Switching to Custom keeps exactly what ran in the first pass.
    p3, processed3 = webui.txt2img([*pasted[:21], "custom", *pasted[22:]], enable_hr=True)
    assert p3.sampler.passes()[0][3] == ran
    assert "ToMe preset" not in processed3.infotexts[0]
    assert_clean(webui)


@pytest.mark.parametrize("version", ["1.6", "1.10"])
def test_values_are_written_before_params_txt(version: str, models: dict[str, torch.nn.Module]) -> None:
    """The WebUI writes params.txt (pasted by "read last generation parameters") right after `process_batch`."""
    webui = webui_for(models, "sdxl", version)
    p = webui.make_p("txt2img", tome_args(True, preset="fast"))
    seen: dict[str, Any] = {}
    original = p.scripts.process_batch

    def process_batch(p: Any, **kwargs: Any) -> None:
        original(p, **kwargs)
        seen.update(p.extra_generation_params)

    p.scripts.process_batch = process_batch
    processing.process_images(p)
    assert seen["ToMe preset"] == "fast" and seen["ToMe ratio"] == repr(preset("fast", "sdxl").ratio)
    assert seen == {k: v for k, v in p.extra_generation_params.items() if k != "ToMe note"}
    assert_clean(webui)


def test_every_preset_merges_every_selected_block(models: dict[str, torch.nn.Module]) -> None:
    """Never silent, for the presets' configs: merge_mlp, mlp_ratio and share_plan blocks count as merged.

    (The A1111 stand-in runs its ldm UNet only; SDXL: `test_forge_every_preset_merges_every_selected_block`.)
    A 32x32 latent: the presets' 8x8 cells need a level-4 grid of at least 8x8 (smaller, the note says so).
    """
    webui = webui_for(models, "sd")
    for choice in tome_core.presets():
        sampler = FakeSampler(webui, run_unet=True, latent=32)
        _, processed = webui.txt2img(tome_args(True, preset=choice.name), enable_hr=True, sampler=sampler)
        assert "ToMe note" not in processed.extra_generation_params, choice.name
        assert all(r.hooks > 0 for r in sampler.records)
    assert_clean(webui)


# ---------------------------------------------------------------------------------------------- hires pass

HIRES = {
    "same": ({"hr_mode": "same"}, lambda f: preset("fast", f), {"ToMe hires": "same"}),
    "own preset": (
        {"hr_mode": "own", "hr_preset": "fastest"},
        lambda f: preset("fastest", f),
        {"ToMe hires": "own", "ToMe hires preset": "fastest"},
    ),
    "own custom": (
        {"hr_mode": "own", "hr_preset": "custom", "hr_ratio": 0.7, "hr_sx": 4, "hr_sy": 2, "hr_max_downsample": "4"},
        lambda f: preset("fast", f).replace(ratio=0.7, sx=4, sy=2, max_downsample=4),
        {"ToMe hires": "own", "ToMe hires ratio": "0.7", "ToMe hires stride x": "4", "ToMe hires max downsample": "4"},
    ),
    "off": ({"hr_mode": "off"}, lambda f: None, {"ToMe hires": "off"}),
}


@pytest.mark.parametrize("family", ["sd", "sdxl"])
@pytest.mark.parametrize("case", list(HIRES))
def test_hires_pass_with_presets(
    case: str, family: str, models: dict[str, torch.nn.Module], paste_fields: list[tuple[Any, Any]]
) -> None:
    values, expected, keys = HIRES[case]
    webui = webui_for(models, family)
    args = tome_args(True, preset="fast", **values)
    p, processed = webui.txt2img(args, enable_hr=True, n_iter=2)
    first, hires = preset("fast", family), expected(family)
    assert p.sampler.passes() == [
        ("first", 0, "main", first),
        ("hires", 0, "main", hires),
        ("first", 1, "main", first),
        ("hires", 1, "main", hires),
    ]
    extra = processed.extra_generation_params
    assert {key: extra.get(key) for key in keys} == keys
    if hires is not None:  # the hires values that ran: its own always in "own" mode, the others where they differ
        for name in FIELD_NAMES:
            value = getattr(hires, name)
            differs = value != getattr(first, name)
            # an optional field set in the first pass and unset in the hires pass is recorded as "None"
            recorded = differs if value is None else (case != "same" and name in HIRES_FIELDS) or differs
            assert (infotext.HIRES_KEYS[name] in extra) == recorded, name
            if recorded:
                assert extra[infotext.HIRES_KEYS[name]] == infotext.format_value(value)
    p2, processed2 = webui.txt2img(paste(paste_fields, processed.infotexts[0]), enable_hr=True, n_iter=2)
    assert p2.sampler.passes() == p.sampler.passes()
    assert processed2.infotexts == processed.infotexts
    assert_clean(webui)


def test_hires_checkpoint_of_another_family_resolves_its_own_preset(
    models: dict[str, torch.nn.Module], paste_fields: list[tuple[Any, Any]]
) -> None:
    """An SD1 first pass and an SDXL hires checkpoint: each pass gets the preset for its own model."""
    webui = webui_for(models, "sd")
    p, processed = webui.txt2img(tome_args(True, preset="fast"), enable_hr=True, hr_checkpoint=models["sdxl"])
    assert p.sampler.passes() == [
        ("first", 0, "main", preset("fast", "sd")),
        ("hires", 0, "sdxl", preset("fast", "sdxl")),
    ]
    extra = processed.extra_generation_params
    assert extra["ToMe preset"] == "fast" and extra["ToMe ratio"] == repr(preset("fast", "sd").ratio)
    sd, sdxl = preset("fast", "sd"), preset("fast", "sdxl")
    differing = [name for name in FIELD_NAMES if getattr(sd, name) != getattr(sdxl, name)]
    assert differing  # the test needs a preset whose families differ
    for name in differing:  # the hires pass records where the SDXL values differ from the SD1 pass's
        assert extra[infotext.HIRES_KEYS[name]] == infotext.format_value(getattr(sdxl, name))
    p2, _ = webui.txt2img(paste(paste_fields, processed.infotexts[0]), enable_hr=True, hr_checkpoint=models["sdxl"])
    assert p2.sampler.passes() == p.sampler.passes()
    assert_clean(webui)


def test_img2img_with_a_preset(models: dict[str, torch.nn.Module]) -> None:
    webui = webui_for(models, "sdxl")
    p, processed = webui.img2img(tome_args(True, img2img=True, preset="quality"))
    assert p.sampler.passes() == [("img2img", 0, "main", preset("quality", "sdxl"))]
    assert "ToMe preset: quality" in processed.infotexts[0] and "ToMe hires" not in processed.infotexts[0]
    assert f"ToMe mode: {preset('quality', 'sdxl').mode}" in processed.infotexts[0]
    assert_clean(webui)


# ---------------------------------------------------------------------------------------------- API forms


@pytest.mark.parametrize(
    ("tome", "expected"),
    [
        ({"preset": "fastest"}, lambda f: (preset("fastest", f), preset("fastest", f))),
        (
            {"preset": "fast", "ratio": 0.3, "hires": {"ratio": 0.7}},
            lambda f: (preset("fast", f).replace(ratio=0.3), preset("fast", f).replace(ratio=0.7)),
        ),
        ({"ratio": 0.3}, lambda f: (TomeConfig(ratio=0.3), TomeConfig(ratio=0.3))),  # no preset: custom
        # a positional list from before presets: the API check completes it with "custom"
        (tome_webui.params.pad_positional([True, 0.3], is_img2img=False), lambda f: (TomeConfig(ratio=0.3),) * 2),
    ],
)
@pytest.mark.parametrize("family", ["sd", "sdxl"])
def test_api_forms(family: str, tome: Any, expected: Any, models: dict[str, torch.nn.Module]) -> None:
    webui = webui_for(models, family)
    p, processed = webui.txt2img(tome, enable_hr=True)
    first, hires = expected(family)
    assert p.sampler.passes() == [("first", 0, "main", first), ("hires", 0, "main", hires)]
    assert ("ToMe preset" in processed.extra_generation_params) == (tome == {"preset": "fastest"})
    assert_clean(webui)


# ---------------------------------------------------------------------------------------------- XYZ


@pytest.mark.parametrize("family", ["sd", "sdxl"])
def test_xyz_preset_axis_and_a_value_axis_over_a_preset(family: str, models: dict[str, torch.nn.Module]) -> None:
    webui = webui_for(models, family)
    xyz = install_xyz_module()
    tome_webui.xyz.register_axes()
    sampler = FakeSampler(webui)
    p = webui.make_p("txt2img", tome_args(False), sampler=sampler)
    results = run_xyz_cells(p, xyz, {"[ToMe] Preset": ["quality", "Fastest", "custom"]})
    configs = [r.config for r in sampler.records if r.step == 0]
    assert configs == [preset("quality", family), preset("fastest", family), TomeConfig()]
    assert [r.extra_generation_params.get("ToMe preset") for r in results] == ["quality", "fastest", None]

    sampler = FakeSampler(webui)
    p = webui.make_p("txt2img", tome_args(True, preset="fast"), enable_hr=True, sampler=sampler)
    results = run_xyz_cells(p, xyz, {"[ToMe] Ratio": ["0.2", "0.4"]})
    assert [r.config for r in sampler.records if r.step == 0] == [
        preset("fast", family).replace(ratio=0.2),
        preset("fast", family).replace(ratio=0.2),
        preset("fast", family).replace(ratio=0.4),
        preset("fast", family).replace(ratio=0.4),
    ]
    # A preset with a value laid over it is recorded as its custom values, which paste back exactly.
    assert [r.extra_generation_params["ToMe ratio"] for r in results] == ["0.2", "0.4"]
    assert all("ToMe preset" not in r.extra_generation_params for r in results)

    sampler = FakeSampler(webui)
    p = webui.make_p("txt2img", custom_args(ratio=0.3), enable_hr=True, sampler=sampler)
    run_xyz_cells(p, xyz, {"[ToMe] Hires preset": ["fastest"]})
    assert [r.config for r in sampler.records if r.step == 0] == [
        TomeConfig(ratio=0.3),
        preset("fastest", family),
    ]
    with pytest.raises(tome_webui.TomeArgsError, match="preset must be one of 'quality'"):
        run_xyz_cells(p, xyz, {"[ToMe] Preset": ["warp"]})
    assert_clean(webui)


# ---------------------------------------------------------------------------------------------- Forge


@pytest.mark.parametrize(("family", "depths"), [("sd", forge.SD1_DEPTHS), ("sdxl", forge.SDXL_DEPTHS)])
def test_forge_resolves_the_preset_after_its_lazy_load(family: str, depths: Any) -> None:
    """Forge 2 loads the model after `before_process`: the preset is resolved when the pass starts."""
    engine = forge.Engine(forge.build_unet(depths, seed=0), is_sdxl=family == "sdxl")
    webui = forge.ForgeWebUI(engine, lazy=True)
    args = tome_args(True, preset="fastest", hr_mode="own", hr_preset="quality")
    p, processed = webui.run(tome=args, enable_hr=True, steps=2, sampler=forge.ForgeSampler(latent=32))
    seen = {r.pass_name: r.config for r in p.sampler.records}
    assert seen == {"first": preset("fastest", family), "hires": preset("quality", family)}
    extra = processed.extra_generation_params
    assert extra["ToMe preset"] == "fastest" and extra["ToMe hires preset"] == "quality"
    assert extra["ToMe ratio"] == repr(preset("fastest", family).ratio)
    assert "ToMe note" not in extra and errors.reported == []
    assert not tome_core.is_patched(engine.forge_objects.unet.model.diffusion_model)


def test_forge_model_without_blocks_is_noted_for_a_preset() -> None:
    engine = forge.Engine(forge.build_unet({1: 0, 2: 0, 4: 0}, seed=0))  # a UNet without transformer blocks
    webui = forge.ForgeWebUI(engine, lazy=False)
    _, processed = webui.run(tome=tome_args(True, preset="fast"))
    note = processed.extra_generation_params["ToMe note"]
    assert note.startswith("not applied: cannot patch Engine: ") and "BasicTransformerBlock" in note
    assert processed.extra_generation_params["ToMe preset"] == "fast"
    assert "ToMe ratio" not in processed.extra_generation_params  # no model family: no values to record
    assert errors.reported == []


@pytest.mark.parametrize(("family", "depths"), [("sd", forge.SD1_DEPTHS), ("sdxl", forge.SDXL_DEPTHS)])
def test_forge_every_preset_merges_every_selected_block(family: str, depths: Any) -> None:
    engine = forge.Engine(forge.build_unet(depths, seed=1), is_sdxl=family == "sdxl")
    webui = forge.ForgeWebUI(engine, lazy=False)
    for choice in tome_core.presets():
        sampler = forge.ForgeSampler(latent=32)  # a level-4 grid that holds the presets' 8x8 cells
        p, processed = webui.run(tome=tome_args(True, preset=choice.name), enable_hr=True, steps=2, sampler=sampler)
        assert {r.config for r in p.sampler.records} == {
            preset(choice.name, family),
            preset(choice.name, family),
        }
        assert "ToMe note" not in processed.extra_generation_params, choice.name


def test_forge_attention_replaced_is_noted_when_other_modules_merge() -> None:
    from test_webui_forge import replace_all_attn1

    engine = forge.Engine(forge.build_unet(forge.SD1_DEPTHS, seed=0))
    webui = forge.ForgeWebUI(engine, lazy=False)
    _, processed = webui.run(
        tome=tome_args(True, preset="fastest"), sampler=forge.ForgeSampler(other_extension=replace_all_attn1)
    )
    assert "attention replaced by another extension" in processed.extra_generation_params.get("ToMe note", "")


def test_preset_too_coarse_for_a_tiny_image_says_so() -> None:
    """At a 64 px image (latent 8) the level-4 grid is 2x2: Fast's 4x4 cells fit nowhere there, and the note says so."""
    engine = forge.Engine(forge.build_unet(forge.SD1_DEPTHS, seed=0))
    webui = forge.ForgeWebUI(engine, lazy=False)
    _, processed = webui.run(tome=tome_args(True, preset="fast"), sampler=forge.ForgeSampler(latent=8))
    note = processed.extra_generation_params["ToMe note"]
    assert note.endswith("blocks (the image is too small for the strides and ratio to merge a token)"), note
    assert note.startswith("merged in ") and not tome_core.is_patched(engine.forge_objects.unet.model.diffusion_model)
