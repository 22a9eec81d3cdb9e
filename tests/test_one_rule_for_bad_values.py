"""One rule for values the strides cannot run, in every front door (issue 33, section 4).

A ratio above what the strides allow (at most 1 - 1/(sx*sy)), strides of one token per cell with a ratio above 0
(nothing to merge), an MLP ratio above that maximum and kv pooling over one-token cells are refused, with one
message naming the fields and the maximum, by each front door alike:

* the library: `TomeConfig(...)` and `tome_core.apply_patch(model, ...)` (a preset with overrides included);
* the WebUI: the script's args (`tome_webui.params.resolve`, the positional and the dict form) and the API check in
  front of `/sdapi/v1/txt2img` (HTTP 422); the script refuses the same args alone (ToMe off, `ToMe error`);
* infotext: an image's ToMe values pasted back (`InfotextField` readers), then the args they make;
* the ComfyUI advanced node (`tome_comfy.inputs.config_from_inputs` and the node itself).

Values at the limit, a ratio of 0 with 1x1 cells (nothing asked, nothing merged) and ratios the config does not use
are accepted by each door alike, with the same config.
"""

from __future__ import annotations

import html
import json
from typing import Any

import pytest
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from comfy_stub.patcher import ModelPatcher
from comfy_stub.sampling import load_checkpoint
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from modules import processing
from webui_stub.harness import UNCHANGED, WebUI, custom_args, parse_generation_parameters, ui_paste

import tome_core
from tome_comfy import NODE_CLASS_MAPPINGS
from tome_comfy.inputs import INPUT_NAMES, advanced_widgets, config_from_inputs
from tome_comfy.nodes import TOME_ADVANCED_NODE
from tome_core import TomeConfig, field_spec, get_preset
from tome_webui import api, infotext
from tome_webui.params import ARG_NAMES, FIELD_NAMES, TomeArgsError, defaults, resolve, ui_value

import tiny_models

#: (fields, the words the refusal must hold: the fields by name and the maximum), or None where they are accepted.
CASES: tuple[tuple[dict[str, Any], tuple[str, ...] | None], ...] = (
    ({"ratio": 0.9, "sx": 2, "sy": 2}, ("ratio=0.9", "sx=2", "sy=2", "0.75")),
    ({"ratio": 0.6, "sx": 2, "sy": 1}, ("ratio=0.6", "sx=2", "sy=1", "0.5")),
    ({"ratio": 0.5, "sx": 1, "sy": 1}, ("ratio=0.5", "sx=1", "sy=1", "nothing to merge")),
    ({"ratio": 0.3, "sx": 1, "sy": 1, "merge_crossattn": True}, ("ratio=0.3", "sx=1", "sy=1", "nothing to merge")),
    ({"merge_mlp": True, "mlp_ratio": 0.8, "sx": 2, "sy": 1}, ("mlp_ratio=0.8", "sx=2", "sy=1", "0.5")),
    ({"merge_attn": False, "merge_mlp": True, "ratio": 0.9}, ("ratio=0.9", "sx=2", "sy=2", "0.75")),
    ({"mode": "kv", "sx": 1, "sy": 1}, ("sx=1", "sy=1", "nothing to pool")),
    ({"ratio": 0.75, "sx": 2, "sy": 2}, None),
    ({"ratio": 0.9375, "sx": 4, "sy": 4}, None),
    ({"ratio": 0.0, "sx": 1, "sy": 1}, None),
    ({"mode": "kv", "ratio": 0.9}, None),  # kv mode: self-attention pools, the ratio is not used
    ({"mlp_ratio": 0.9}, None),  # the feed-forward does not merge: its ratio is not used
)
IDS = [json.dumps(fields) for fields, _ in CASES]

Outcome = tuple[str, Any]  # ("refused", message) or ("accepted", the config that runs)


def refused_with(words: tuple[str, ...] | None, outcome: Outcome, expected: Outcome) -> None:
    """`outcome` is `expected`: the same config, or a refusal with the library's message and the words."""
    kind, what = outcome
    assert kind == ("accepted" if words is None else "refused"), outcome
    assert kind == expected[0], f"{outcome} where the library gives {expected}"
    if kind == "accepted":
        assert what == expected[1]
        return
    assert words is not None
    assert expected[1] in what, f"{what!r} does not give the library's message {expected[1]!r}"
    for word in words:
        assert word in what


def library(fields: dict[str, Any]) -> Outcome:
    try:
        return ("accepted", TomeConfig(**fields))
    except ValueError as exc:
        return ("refused", str(exc))


def webui(args: list[Any]) -> Outcome:
    try:
        job = resolve(args)
    except TomeArgsError as exc:
        return ("refused", str(exc))
    assert job is not None
    return ("accepted", job.pass_config(False))


def pasted(fields: dict[str, Any]) -> list[Any]:
    """The script args after pasting an image's infotext that holds `fields` as its ToMe values."""
    # As `infotext.entries` writes them: the main fields always (`ToMe ratio` marks that ToMe ran), then the others.
    written = {name: spec.default for name in FIELD_NAMES if not (spec := field_spec(name)).advanced}
    written.update(fields)
    text = ", ".join(f"{infotext.KEYS[name]}: {infotext.format_value(value)}" for name, value in written.items())
    params = parse_generation_parameters(f"a cat\nSteps: 20, Seed: 1, Size: 512x512, {text}")

    class Control:  # what the paste reads of a component: the type of its value
        def __init__(self, value: Any) -> None:
            self.value = value

    start = [ui_value(name, defaults()[name]) for name in ARG_NAMES]
    fields_of = infotext.paste_fields([Control(value) for value in start], ARG_NAMES)
    values = ui_paste(fields_of, params)
    return [s if v is UNCHANGED else v for s, v in zip(start, values, strict=True)]


def comfy(fields: dict[str, Any]) -> Outcome:
    inputs = {w.name: w.default for w in advanced_widgets()}
    inputs.update({INPUT_NAMES.get(name, name): value for name, value in fields.items()})
    try:
        return ("accepted", config_from_inputs(inputs))
    except ValueError as exc:
        return ("refused", str(exc))


@pytest.mark.parametrize(("fields", "words"), CASES, ids=IDS)
def test_the_library_refuses_naming_the_fields_and_the_maximum(
    fields: dict[str, Any], words: tuple[str, ...] | None
) -> None:
    outcome = library(fields)
    assert outcome[0] == ("accepted" if words is None else "refused"), outcome
    if words is not None:
        for word in words:
            assert word in outcome[1]
    model = tiny_models.build_unet("ldm_sd1")
    if words is None:
        tome_core.apply_patch(model, **fields)
        assert tome_core.get_config(model) == outcome[1]
        tome_core.remove_patch(model)
    else:
        with pytest.raises(ValueError, match="sx=") as info:
            tome_core.apply_patch(model, **fields)
        assert str(info.value) == outcome[1]
        assert not tome_core.is_patched(model)


@pytest.mark.parametrize(("fields", "words"), CASES, ids=IDS)
def test_the_webui_args_give_the_same_outcome(fields: dict[str, Any], words: tuple[str, ...] | None) -> None:
    expected = library(fields)
    refused_with(words, webui(custom_args(**fields)), expected)  # the positional form, as the UI sends it
    refused_with(words, webui([fields]), expected)  # the dict form


@pytest.mark.parametrize(("fields", "words"), CASES, ids=IDS)
def test_the_api_check_gives_the_same_outcome(fields: dict[str, Any], words: tuple[str, ...] | None) -> None:
    app = FastAPI()
    reached: list[bytes] = []

    @app.post("/sdapi/v1/txt2img")
    async def generate(request: Request) -> dict[str, Any]:
        reached.append(await request.body())
        return {"info": "generated"}

    client = TestClient(app)
    assert client.post("/sdapi/v1/txt2img", json={}).status_code == 200  # the app has started
    reached.clear()
    api.on_app_started(None, app)
    response = client.post("/sdapi/v1/txt2img", json={"alwayson_scripts": {"tome": {"args": [fields]}}})
    expected = library(fields)
    if words is None:
        assert response.status_code == 200 and len(reached) == 1
    else:
        assert response.status_code == 422 and reached == []
        refused_with(words, ("refused", response.json()["detail"]), expected)


@pytest.fixture(scope="module")
def stand_in_webui() -> WebUI:
    return WebUI("1.10")


@pytest.mark.parametrize(("fields", "words"), CASES, ids=IDS)
def test_the_script_alone_gives_the_same_outcome(
    stand_in_webui: WebUI, fields: dict[str, Any], words: tuple[str, ...] | None
) -> None:
    """Without the API check (the WebUI swallows exceptions in script callbacks): ToMe stays off and the message
    goes into the infotext (`ToMe error`, so into the API's `info`); accepted values run as the library's config."""
    runner = stand_in_webui.runners["txt2img"]
    p = processing.StableDiffusionProcessingTxt2Img(scripts=runner, script_args=(0, *custom_args(**fields)))
    runner.before_process(p)
    error = p.extra_generation_params.get(infotext.ERROR_KEY)
    run = getattr(p, "tome_run", None)
    runner.postprocess(p, None)
    if error is not None:
        assert run is None
        outcome: Outcome = ("refused", error)
    else:
        assert run is not None
        outcome = ("accepted", run.job.pass_config(False))
    refused_with(words, outcome, library(fields))


@pytest.mark.parametrize(("fields", "words"), CASES, ids=IDS)
def test_a_pasted_infotext_gives_the_same_outcome(fields: dict[str, Any], words: tuple[str, ...] | None) -> None:
    args = pasted(fields)
    assert dict(zip(ARG_NAMES, args))["preset"] == "custom"  # no `ToMe preset` key: custom values
    refused_with(words, webui(args), library(fields))


@pytest.mark.parametrize(("fields", "words"), CASES, ids=IDS)
def test_the_comfyui_node_gives_the_same_outcome(fields: dict[str, Any], words: tuple[str, ...] | None) -> None:
    refused_with(words, comfy(fields), library(fields))


def test_the_comfyui_node_refuses_and_leaves_its_model_alone() -> None:
    model: ModelPatcher = load_checkpoint("sd")
    node = NODE_CLASS_MAPPINGS[TOME_ADVANCED_NODE]()
    inputs = {w.name: w.default for w in advanced_widgets()}
    with pytest.raises(ValueError, match=r"ratio=0\.9.*sx=2, sy=2") as info:
        node.patch(model, **{**inputs, "ratio": 0.9})
    assert str(info.value) == library({"ratio": 0.9})[1]
    assert model.wrappers == {}


@pytest.mark.parametrize("family", ["sd", "sdxl"])
def test_a_preset_with_one_token_cells_is_refused_in_the_library_and_the_webui(family: str) -> None:
    """`preset="fast", sx=1, sy=1` used to warn "merging 0.000 of the tokens" and patch: refused now."""
    model = tiny_models.build_unet("ldm_sd1" if family == "sd" else "diffusers_sdxl")
    assert tome_core.model_family(model) == family
    with pytest.raises(ValueError, match=r"sx=1, sy=1") as info:
        tome_core.apply_patch(model, preset="fast", sx=1, sy=1)
    assert not tome_core.is_patched(model)
    expected = library({**get_preset("fast").families[family], "sx": 1, "sy": 1})
    assert expected[0] == "refused" and str(info.value) == expected[1]
    with pytest.raises(TomeArgsError, match=r"sx=1, sy=1") as webui_info:
        resolve([{"preset": "fast", "sx": 1, "sy": 1}])
    assert "ratio=" in str(webui_info.value) or "nothing to pool" in str(webui_info.value)


@pytest.mark.parametrize("name", [p.name for p in tome_core.presets()])
@pytest.mark.parametrize("family", tome_core.FAMILIES)
def test_every_preset_builds_for_every_family(name: str, family: str) -> None:
    """No built-in preset breaks the rule (the WebUI resolves each for both families before it runs)."""
    config = get_preset(name).config(family)
    assert TomeConfig(**config.to_dict()) == config
    job = resolve([{"preset": name, "hires": {"preset": name}}])
    assert job is not None and job.pass_config(False, family) == job.pass_config(True, family) == config


def test_the_custom_note_shows_the_refusal_before_generation() -> None:
    """The WebUI swallows errors raised in its callbacks: Custom controls holding a refused combination show the
    library's message in the note under *Speed*, marked as an error, before anything is generated."""
    from tome_webui import ui

    values = {"preset": "custom", "ratio": 0.9, "sx": 2, "sy": 2}
    note = ui.note_html(values, is_img2img=False)
    message = library({"ratio": 0.9, "sx": 2, "sy": 2})[1]
    assert "tome-invalid" in note and html.escape(message) in note


def test_the_field_help_states_the_rule() -> None:
    for name in ("ratio", "sx", "sy", "mlp_ratio"):
        help_text = tome_core.field_spec(name).help
        assert "1 - 1/(sx*sy)" in help_text and "refused" in help_text, name
