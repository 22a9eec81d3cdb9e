"""The script's lifecycle inside the stand-in WebUI: which config each sampling pass runs with, and no leaks.

Runs `process_images` in the callback order of WebUI v1.10 and of v1.6-1.9 (docs/webui-contract.md 2.3) with
tiny real UNets as models, and reads the config each sampler step saw (`FakeSampler.records`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import errors, processing, scripts, sd_models, shared
from webui_stub.harness import (
    VERSIONS,
    FakeSampler,
    WebUI,
    custom_args,
    install_xyz_module,
    run_xyz_cells,
    tome_args,
    webui_model,
)

import tome_core
import tome_webui
from tome_core import TomeConfig
from tome_webui import infotext, lifecycle

FIRST = TomeConfig(ratio=0.5)
HIRES = TomeConfig(ratio=0.3, sx=4, sy=4, max_downsample=2)
OWN = {"hr_mode": "own", "hr_preset": "custom", "hr_ratio": 0.3, "hr_sx": 4, "hr_sy": 4, "hr_max_downsample": "2"}


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {"main": webui_model("ldm_sd1", 0), "hires": webui_model("ldm_sd2", 1), "refiner": webui_model("ldm_sd1", 2)}


@pytest.fixture(autouse=True)
def _clean(models: dict[str, torch.nn.Module]) -> Iterator[None]:
    yield
    for model in models.values():  # keep a failing test from leaking into the next
        tome_core.remove_patch(model)
        model.__dict__.pop("applied_token_merged_ratio", None)


def make(version: str, models: dict[str, torch.nn.Module]) -> WebUI:
    return WebUI(version, models)


def assert_clean(webui: WebUI) -> None:
    assert webui.patched() == dict.fromkeys(webui.models, False)
    assert errors.reported == []


# ---------------------------------------------------------------------------------------------- loading


def test_loading_registers_one_script_and_callbacks_once(models: dict[str, torch.nn.Module]) -> None:
    webui = make("1.10", models)
    assert [d.script_class.__name__ for d in scripts.scripts_data] == ["ToMeScript"]
    assert webui.script("txt2img") is not webui.script("img2img")
    from modules import script_callbacks

    counts = {name: len(items) for name, items in script_callbacks.callbacks.items()}
    assert counts == {
        "before_ui": 1,
        "app_started": 1,
        "cfg_denoiser": 1,
        "model_loaded": 1,
        "script_unloaded": 1,
        "infotext_pasted": 0,
    }
    assert webui.script().title() == "ToMe" and webui.script().show(False) is scripts.AlwaysVisible


# ---------------------------------------------------------------------------------------------- disabled


@pytest.mark.parametrize("version", VERSIONS)
def test_disabled_is_bitwise_the_webui_without_the_extension(
    version: str, models: dict[str, torch.nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    webui = make(version, models)
    shared.opts.data["token_merging_ratio"] = 0.3  # the built-in stays exactly as it would be
    applied: list[Any] = []
    monkeypatch.setattr(tome_core, "apply_patch", lambda *a, **k: applied.append(a))
    p, processed = webui.txt2img(tome_args(False), enable_hr=True, sampler=FakeSampler(webui, run_unet=True))

    plain = scripts.ScriptRunner() if version == "1.10" else scripts.LegacyScriptRunner()
    baseline = webui.make_p("txt2img", None, enable_hr=True, sampler=FakeSampler(webui, run_unet=True))
    baseline.scripts, baseline.script_args = plain, (0,)
    baseline_processed = processing.process_images(baseline)

    assert applied == []
    assert all(r.hooks == 0 and r.config is None for r in p.sampler.records)
    assert [r.builtin for r in p.sampler.records] == [r.builtin for r in baseline.sampler.records]
    assert all(torch.equal(a, b) for a, b in zip(p.sampler.outputs, baseline.sampler.outputs, strict=True))
    assert processed.infotexts == baseline_processed.infotexts
    assert p.override_settings == {} and p.extra_generation_params == {}
    assert_clean(webui)


def test_disabled_with_invalid_other_args_says_so(models: dict[str, torch.nn.Module]) -> None:
    """The script refuses what the API check refuses (tome_webui.params.resolve), also with ToMe off."""
    webui = make("1.10", models)
    p, _ = webui.txt2img(tome_args(False, ratio=5))
    assert p.extra_generation_params == {
        "ToMe error": "ratio (args[1]) must be a number in [0, 0.95], got 5",
        "ToMe version": tome_core.__version__,
    }
    assert_clean(webui)


# ---------------------------------------------------------------------------------------------- passes


@pytest.mark.parametrize("version", VERSIONS)
def test_txt2img_without_hires(version: str, models: dict[str, torch.nn.Module]) -> None:
    webui = make(version, models)
    sampler = FakeSampler(webui, run_unet=version == "1.10")  # one real forward through the patched UNet
    p, processed = webui.txt2img(custom_args(ratio=0.5), sampler=sampler)
    assert p.sampler.passes() == [("first", 0, "main", FIRST)]
    assert all(r.hooks > 0 for r in p.sampler.records)
    extra = json.loads(processed.js())["extra_generation_params"]
    assert extra["ToMe ratio"] == "0.5" and "ToMe hires" not in extra
    assert_clean(webui)


def test_the_infotext_names_the_version_that_ran(models: dict[str, torch.nn.Module]) -> None:
    """Where a WebUI user reports a problem from: the image's infotext (and the API's `info`) says which version of
    the extension made it."""
    webui = make("1.10", models)
    _, processed = webui.txt2img(custom_args(ratio=0.5), enable_hr=True)
    extra = json.loads(processed.js())["extra_generation_params"]
    assert extra[infotext.VERSION_KEY] == tome_core.__version__
    assert f"ToMe version: {tome_core.__version__}" in processed.infotexts[0]
    assert_clean(webui)


HIRES_CASES = {
    "same": ({}, FIRST, FIRST, "same"),
    "own": (OWN, FIRST, HIRES, "own"),
    "off": ({"hr_mode": "off"}, FIRST, None, "off"),
    "hires only": ({**OWN, "ratio": 0.0}, None, HIRES, "own"),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", list(HIRES_CASES))
def test_txt2img_hires_batch_count_2(version: str, case: str, models: dict[str, torch.nn.Module]) -> None:
    """Batch 2's first pass runs with the first-pass settings again, after batch 1's hires pass."""
    values, first, hires, mode = HIRES_CASES[case]
    webui = make(version, models)
    p, processed = webui.txt2img(custom_args(**{"ratio": 0.5, **values}), enable_hr=True, n_iter=2)
    expected = [("first", 0, "main", first), ("hires", 0, "main", hires)]
    expected += [("first", 1, "main", first), ("hires", 1, "main", hires)]
    assert p.sampler.passes() == expected
    assert all((r.hooks > 0) == (r.config is not None) for r in p.sampler.records)
    for text in processed.infotexts:
        assert f"ToMe hires: {mode}" in text
    assert ("ToMe hires ratio: 0.3" in processed.infotexts[0]) == (mode == "own")
    assert_clean(webui)


@pytest.mark.parametrize("version", VERSIONS)
def test_img2img(version: str, models: dict[str, torch.nn.Module]) -> None:
    webui = make(version, models)
    sampler = FakeSampler(webui)
    p, processed = webui.img2img(custom_args(img2img=True, ratio=0.5, sx=1, sy=2), n_iter=2, sampler=sampler)
    config = TomeConfig(ratio=0.5, sx=1, sy=2)
    assert p.sampler.passes() == [("img2img", 0, "main", config), ("img2img", 1, "main", config)]
    assert "ToMe hires" not in processed.infotexts[0] and "ToMe stride x: 1" in processed.infotexts[0]
    assert_clean(webui)


@pytest.mark.parametrize("version", VERSIONS)
def test_gallery_upscale_runs_only_the_hires_pass(version: str, models: dict[str, torch.nn.Module]) -> None:
    webui = make(version, models)
    p, _ = webui.txt2img(custom_args(ratio=0.5, **OWN), enable_hr=True, firstpass_image=object())
    assert p.sampler.passes() == [("hires", 0, "main", HIRES)]
    assert_clean(webui)


@pytest.mark.parametrize("version", VERSIONS)
def test_hires_checkpoint_swaps_the_model(version: str, models: dict[str, torch.nn.Module]) -> None:
    webui = make(version, models)
    p, _ = webui.txt2img(custom_args(ratio=0.5, **OWN), enable_hr=True, n_iter=2, hr_checkpoint=models["hires"])
    assert p.sampler.passes() == [
        ("first", 0, "main", FIRST),
        ("hires", 0, "hires", HIRES),
        ("first", 1, "main", FIRST),
        ("hires", 1, "hires", HIRES),
    ]
    # The first-pass model was unpatched when it was reloaded and re-patched by the next first pass.
    assert not any(r.model == "main" and r.config == HIRES for r in p.sampler.records)
    assert_clean(webui)


@pytest.mark.parametrize("version", ["1.8", "1.10"])
def test_refiner_swapped_in_mid_sampling_gets_the_pass_config(version: str, models: dict[str, torch.nn.Module]) -> None:
    webui = make(version, models)
    sampler = FakeSampler(webui, refiner=models["refiner"], refiner_switch_at=1)
    webui.txt2img(custom_args(ratio=0.5), steps=3, sampler=sampler)
    assert [(r.model, r.config) for r in sampler.records] == [
        ("main", FIRST),
        ("refiner", FIRST),
        ("refiner", FIRST),
    ]
    assert_clean(webui)


def test_refiner_on_16_is_left_unpatched(models: dict[str, torch.nn.Module]) -> None:
    """v1.6/1.7 give on_cfg_denoiser no way to reach p: the refiner runs unmerged, and nothing leaks."""
    webui = make("1.6", models)
    sampler = FakeSampler(webui, refiner=models["refiner"], refiner_switch_at=1)
    webui.txt2img(custom_args(ratio=0.5), steps=3, sampler=sampler)
    assert [(r.model, r.config) for r in sampler.records] == [("main", FIRST), ("refiner", None), ("refiner", None)]
    assert_clean(webui)


@pytest.mark.parametrize("version", VERSIONS)
def test_step_window_gets_the_sampler_step(version: str, models: dict[str, torch.nn.Module]) -> None:
    webui = make(version, models)
    p, _ = webui.txt2img(custom_args(ratio=0.5, step_end=0.5), steps=3, enable_hr=True)
    assert [(r.pass_name, r.core_step) for r in p.sampler.records] == [
        ("first", (0, 3)),
        ("first", (1, 3)),
        ("first", (2, 3)),
        ("hires", (0, 2)),
        ("hires", (1, 2)),
    ]
    assert_clean(webui)


# ---------------------------------------------------------------------------------------------- failures


@pytest.mark.parametrize("version", VERSIONS)
def test_exception_mid_generation_is_healed_by_the_next_generation(
    version: str, models: dict[str, torch.nn.Module]
) -> None:
    webui = make(version, models)
    failing = FakeSampler(webui, fail_at=("hires", 0))
    with pytest.raises(RuntimeError, match="sampler failed"):
        webui.txt2img(custom_args(ratio=0.5, **OWN), enable_hr=True, sampler=failing)
    assert webui.patched()["main"]  # postprocess never ran

    p, _ = webui.txt2img(tome_args(False))  # ToMe off: the stale patch is gone before sampling
    assert all(r.config is None and r.hooks == 0 for r in p.sampler.records)
    assert_clean(webui)

    failing = FakeSampler(webui, fail_at=("img2img", 1))
    with pytest.raises(RuntimeError):
        webui.img2img(custom_args(img2img=True, ratio=0.7), sampler=failing)
    p, _ = webui.txt2img(custom_args(ratio=0.5))  # the other tab's instance heals it too
    assert p.sampler.passes() == [("first", 0, "main", FIRST)]
    assert_clean(webui)


def test_invalid_args_leave_tome_off_and_say_why(
    models: dict[str, torch.nn.Module], caplog: pytest.LogCaptureFixture
) -> None:
    webui = make("1.10", models)
    shared.opts.data["token_merging_ratio"] = 0.3
    with caplog.at_level(logging.WARNING, logger="tome"):
        p, processed = webui.txt2img([True, 5])
    assert [r.getMessage() for r in caplog.records if r.name == "tome"] == [
        f"ToMe {tome_core.__version__}: not applied, invalid arguments: ratio (args[1]) must be a number in"
        " [0, 0.95], got 5"
    ]
    assert all(r.config is None for r in p.sampler.records)
    assert all(r.builtin == 0.3 for r in p.sampler.records)  # the built-in works as before
    extra = json.loads(processed.js())["extra_generation_params"]
    assert extra == {
        "ToMe error": "ratio (args[1]) must be a number in [0, 0.95], got 5",
        "ToMe version": tome_core.__version__,
    }
    assert 'ToMe error: "ratio (args[1]) must be a number in [0, 0.95]' in processed.infotexts[0]
    assert_clean(webui)


def test_model_without_a_unet_is_reported_not_raised(models: dict[str, torch.nn.Module]) -> None:
    webui = make("1.10", {**models, "odd": torch.nn.Linear(2, 2)})
    sd_models.load(webui.models["odd"], main=True)
    _, processed = webui.txt2img(custom_args())
    extra = json.loads(processed.js())["extra_generation_params"]
    # The core's words, naming the class (the log adds what ToMe does patch).
    assert extra["ToMe note"] == "not applied: Linear is not a model ToMe patches"
    assert "ToMe error" not in extra
    assert 'ToMe note: "not applied: Linear is not a model ToMe patches"' in processed.infotexts[0]
    assert errors.reported == []


def test_builtin_ratio_on_p_is_switched_off_too(models: dict[str, torch.nn.Module]) -> None:
    """The WebUI reads `p.token_merging_ratio` before the settings: ours sets it to 0 for the job."""
    webui = make("1.10", models)
    p = webui.make_p("txt2img", custom_args())
    p.token_merging_ratio = 0.4
    processed = processing.process_images(p)
    assert all(r.config == FIRST and r.builtin == 0 for r in p.sampler.records)
    assert processed.extra_generation_params["ToMe builtin"] == "disabled"
    assert_clean(webui)


def test_builtin_applied_anyway_keeps_ours_off_and_says_so(
    models: dict[str, torch.nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never both: if the built-in is applied whatever the settings say, ours stays off and the note says why."""
    webui = make("1.10", models)
    original = sd_models.apply_token_merging
    monkeypatch.setattr(sd_models, "apply_token_merging", lambda model, ratio: original(model, 0.4))
    p, processed = webui.txt2img(custom_args())
    assert all(r.config is None and r.builtin == 0.4 for r in p.sampler.records)
    note = processed.extra_generation_params["ToMe note"]
    assert note == "not applied: the WebUI's built-in token merging is applied to the model"
    assert_clean(webui)


# ---------------------------------------------------------------------------------------------- built-in


@pytest.mark.parametrize(
    ("setting", "tab", "hires", "active"),
    [
        ("token_merging_ratio", "txt2img", False, True),
        ("token_merging_ratio_hr", "txt2img", True, True),
        ("token_merging_ratio_hr", "txt2img", False, False),
        ("token_merging_ratio_img2img", "img2img", False, True),
        ("token_merging_ratio_img2img", "txt2img", False, False),
    ],
)
def test_builtin_is_switched_off_for_the_job_only(
    setting: str, tab: str, hires: bool, active: bool, models: dict[str, torch.nn.Module]
) -> None:
    webui = make("1.10", models)
    shared.opts.data[setting] = 0.3
    shared_overrides = {"CLIP_stop_at_last_layers": 2}
    kwargs: dict[str, Any] = {"enable_hr": hires} if tab == "txt2img" else {}
    p = webui.make_p(tab, custom_args(img2img=tab == "img2img"), override_settings=shared_overrides, **kwargs)
    p.override_settings = shared_overrides  # as in an XYZ cell: the dict is shared, it must not be edited
    processed = processing.process_images(p)
    assert shared_overrides == {"CLIP_stop_at_last_layers": 2}
    assert all(r.builtin == 0 for r in p.sampler.records)
    assert max(sd_models.builtin_calls) == 0
    assert (processed.extra_generation_params.get("ToMe builtin") == "disabled") == active
    assert "Token merging ratio" not in processed.infotexts[0]
    assert shared.opts.data[setting] == 0.3  # restored afterwards
    assert_clean(webui)

    _, plain = webui.txt2img(tome_args(False), enable_hr=True) if tab == "txt2img" else webui.img2img()
    builtin_expected = setting != "token_merging_ratio_img2img" or tab == "img2img"
    assert ("Token merging ratio" in plain.infotexts[0]) == builtin_expected


def test_builtin_setting_is_put_back_when_overrides_are_not_restored(models: dict[str, torch.nn.Module]) -> None:
    webui = make("1.10", models)
    shared.opts.data["token_merging_ratio"] = 0.3
    webui.txt2img(custom_args(), override_settings_restore_afterwards=False)
    assert shared.opts.data["token_merging_ratio"] == 0.3
    assert_clean(webui)


# ---------------------------------------------------------------------------------------------- callbacks


def test_model_loaded_and_script_unloaded_remove_patches(models: dict[str, torch.nn.Module]) -> None:
    webui = make("1.10", models)
    from modules import script_callbacks

    tome_core.apply_patch(models["main"], FIRST)
    script_callbacks.model_loaded_callback(models["main"])
    assert not tome_core.is_patched(models["main"])

    sd_models.load(models["refiner"])
    for model in models.values():
        tome_core.apply_patch(model, FIRST)
    script_callbacks.script_unloaded_callback()
    assert webui.patched() == {"main": False, "hires": True, "refiner": False}  # hires was never loaded
    tome_core.remove_patch(models["hires"])
    assert errors.reported == []


def test_run_is_not_inherited_by_a_copy_of_p(models: dict[str, torch.nn.Module]) -> None:
    """An extension that copies p for its own generation must not carry our run into on_cfg_denoiser."""
    import copy

    webui = make("1.10", models)
    p = webui.make_p("txt2img", custom_args())
    webui.script().tome_runtime.before_process(p, custom_args(), is_img2img=False)
    assert lifecycle.run_of(p) is not None
    assert lifecycle.run_of(copy.copy(p)) is None


# ---------------------------------------------------------------------------------------------- XYZ


def test_xyz_cells_get_their_own_values_and_share_nothing(models: dict[str, torch.nn.Module]) -> None:
    webui = make("1.10", models)
    xyz = install_xyz_module()
    tome_webui.xyz.register_axes()
    shared_extra: dict[str, Any] = {"Other": "kept"}
    p = webui.make_p("txt2img", tome_args(False), enable_hr=True)
    p.extra_generation_params = shared_extra
    results = run_xyz_cells(p, xyz, {"[ToMe] Ratio": ["0.2", "0.6"]})
    ratios = [r.config.ratio if r.config else None for r in p.sampler.records]
    assert ratios == [0.2] * 5 + [0.6] * 5  # an axis value turns ToMe on; hires "same" follows
    assert [r.extra_generation_params["ToMe ratio"] for r in results] == ["0.2", "0.6"]
    assert shared_extra == {"Other": "kept"}
    assert not hasattr(p, "tome_xyz")

    sampler = FakeSampler(webui)
    p = webui.make_p("txt2img", custom_args(ratio=0.4), enable_hr=True, sampler=sampler)
    results = run_xyz_cells(p, xyz, {"[ToMe] Enabled": ["True", "False"]})
    assert [bool(r.extra_generation_params) for r in results] == [True, False]
    assert [r.config.ratio if r.config else None for r in sampler.records] == [0.4] * 5 + [None] * 5

    sampler = FakeSampler(webui)
    p = webui.make_p("txt2img", custom_args(ratio=0.4), enable_hr=True, sampler=sampler)
    run_xyz_cells(p, xyz, {"[ToMe] Hires ratio": ["0.1"]})
    assert sampler.passes() == [
        ("first", 0, "main", TomeConfig(ratio=0.4)),
        ("hires", 0, "main", TomeConfig(ratio=0.1)),
    ]

    sampler = FakeSampler(webui)
    p = webui.make_p("txt2img", custom_args(), sampler=sampler)
    run_xyz_cells(p, xyz, {"[ToMe] Strides": ["1x2", "4"]})
    assert [(r.config.sx, r.config.sy) for r in sampler.records if r.step == 0] == [(1, 2), (4, 4)]

    with pytest.raises(tome_webui.TomeArgsError, match="Strides"):
        run_xyz_cells(p, xyz, {"[ToMe] Strides": ["2x"]})
    with pytest.raises(tome_webui.TomeArgsError, match=r"must be a number in \[0, 0.95\]"):
        run_xyz_cells(p, xyz, {"[ToMe] Ratio": ["0.99"]})
    assert_clean(webui)


def test_infotext_keys_are_reset_in_every_cell(models: dict[str, torch.nn.Module]) -> None:
    webui = make("1.10", models)
    p = webui.make_p("txt2img", custom_args())
    p.extra_generation_params = {infotext.BUILTIN_KEY: "disabled", "ToMe hires ratio": "0.1", "Other": 1}
    processed = processing.process_images(p)
    assert "ToMe builtin" not in processed.extra_generation_params
    assert "ToMe hires ratio" not in processed.extra_generation_params
    assert processed.extra_generation_params["Other"] == 1
    assert_clean(webui)


# ---------------------------------------------------------------------------------------------- never silent


@pytest.mark.parametrize("version", VERSIONS)
def test_merging_in_every_selected_block_writes_no_note(version: str, models: dict[str, torch.nn.Module]) -> None:
    webui = make(version, models)
    _p, processed = webui.txt2img(custom_args(), enable_hr=True, sampler=FakeSampler(webui, run_unet=True))
    assert "ToMe note" not in processed.extra_generation_params
    assert not any("ToMe note" in text for text in processed.infotexts)
    assert_clean(webui)


class _Bypass(torch.nn.Module):
    """Another extension's attention that runs the original module's class forward on it directly: neither the
    module's hooks nor a forward set on the instance run."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.inner).forward(self.inner, *args, **kwargs)


@pytest.mark.parametrize("version", ["1.8", "1.10"])
def test_attention_replaced_in_the_hires_pass_is_noted_per_pass(
    version: str, models: dict[str, torch.nn.Module], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import tiny_models

    original = tiny_models.forward

    def forward_with_replaced_attention(model: Any, inputs: Any) -> Any:
        blocks = [m for _, m in tiny_models.transformer_blocks(model.model.diffusion_model)]
        if inputs.x.shape[-1] != 16:  # only in the hires pass (the stand-in's hires latent is 16x16)
            return original(model, inputs)
        saved = [block.attn1 for block in blocks]
        for block in blocks:
            block.attn1 = _Bypass(block.attn1)
        try:
            return original(model, inputs)
        finally:
            for block, attn in zip(blocks, saved):
                block.attn1 = attn

    monkeypatch.setattr(tiny_models, "forward", forward_with_replaced_attention)
    webui = make(version, models)
    with caplog.at_level(logging.WARNING, logger="tome"):
        _, processed = webui.txt2img(custom_args(), enable_hr=True, n_iter=2, sampler=FakeSampler(webui, run_unet=True))
    note = "hires pass: merged in 0 of 3 blocks (attention replaced by another extension)"
    assert processed.extra_generation_params["ToMe note"] == note
    assert all(f'ToMe note: "{note}"' in text for text in processed.infotexts)
    assert [r.message for r in caplog.records] == [f"ToMe {tome_core.__version__}: {note}"]
    assert_clean(webui)


def test_step_window_that_excludes_every_step_is_noted(models: dict[str, torch.nn.Module]) -> None:
    webui = make("1.10", models)
    _, processed = webui.txt2img(custom_args(step_start=0.9), sampler=FakeSampler(webui, run_unet=True))
    assert processed.extra_generation_params["ToMe note"] == (
        "merged in 0 of 3 blocks (the step window excluded every step)"
    )


def test_generation_interrupted_before_the_step_window_says_so(models: dict[str, torch.nn.Module]) -> None:
    """Interrupted at the second of three steps, before a window of the last half: the window was never reached, it
    did not exclude every step (the image A1111 saves after an interrupt carries the note)."""
    webui = make("1.10", models)
    sampler = FakeSampler(webui, run_unet=True, stop_at=("first", 1))
    _, processed = webui.txt2img(custom_args(step_start=0.5), sampler=sampler)
    assert processed.extra_generation_params["ToMe note"] == (
        "merged in 0 of 3 blocks (the generation stopped after step 1 of 3, before the step window)"
    )
    sampler = FakeSampler(webui, run_unet=True, stop_at=("first", 2))
    _, processed = webui.txt2img(custom_args(step_start=0.3), sampler=sampler)
    assert "ToMe note" not in processed.extra_generation_params  # step 2 of 3 ran, in a window from 0.3
