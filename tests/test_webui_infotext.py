"""Infotext: the key table, and writing then pasting (UI, API `infotext` field) restores the same job."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import gradio as gr
import pytest
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from hypothesis import given
from hypothesis import strategies as st
from modules import processing, scripts
from webui_stub.harness import (
    RE_IMAGESIZE,
    RE_PARAM_16,
    UNCHANGED,
    api_infotext,
    load_extension,
    parse_generation_parameters,
    reset,
    ui_paste,
)

from tome_core import field_specs
from tome_webui import infotext
from tome_webui.params import ARG_NAMES, HIRES_FIELDS, IMG2IMG_ARG_NAMES, TomeJob, defaults, resolve, ui_value

# gradio 3.41 builds its app with FastAPI's deprecated on_event; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:(?s).*on_event is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def runners() -> Iterator[dict[str, scripts.ScriptRunner]]:
    reset()
    load_extension()
    out = {}
    with gr.Blocks():
        for tab, is_img2img in (("txt2img", False), ("img2img", True)):
            runner = scripts.ScriptRunner()
            runner.initialize_scripts(is_img2img)
            runner.setup_ui()
            out[tab] = runner
    yield out
    reset()


def infotext_of(job: TomeJob, *, hires: bool = True, extra: dict[str, Any] | None = None) -> str:
    p = processing.StableDiffusionProcessingTxt2Img(enable_hr=hires)
    p.extra_generation_params = {**(extra or {}), **infotext.entries(job, with_hires=hires)}
    return processing.create_infotext(p, 0)


def args_from(values: list[Any], names: tuple[str, ...] = ARG_NAMES) -> list[Any]:
    """Script args after a paste: a pasted value, else the control's default (UNCHANGED/None leave it)."""
    start = [ui_value(name, defaults()[name]) for name in names]
    return [s if v is UNCHANGED or v is None else v for s, v in zip(start, values, strict=True)]


# ---------------------------------------------------------------------------------------------- the table


def test_key_table() -> None:
    keys = list(infotext.ALL_KEYS)
    assert len(set(keys)) == len(keys)
    for key in keys:
        assert re.fullmatch(r"ToMe [A-Za-z0-9 ]+", key), key  # 1.6 parses keys as [\w ]+
        assert not key.lower().startswith("token merging")
    assert set(infotext.KEYS) == set(ARG_NAMES) - {"enabled"}
    assert infotext.KEYS["ratio"] == "ToMe ratio"
    assert infotext.KEYS["max_downsample"] == "ToMe max downsample"
    assert infotext.KEYS["sx"] == "ToMe stride x" and infotext.KEYS["hr_sx"] == "ToMe hires stride x"
    assert infotext.KEYS["hr_mode"] == "ToMe hires"
    for spec in field_specs():  # derived from the labels
        assert infotext.KEYS[spec.name].lower() == "tome " + re.sub(r"[^a-z0-9]+", " ", spec.label.lower()).strip()


def test_what_is_written() -> None:
    job = resolve([{"ratio": 0.5, "merge_mlp": True, "hires": {"ratio": 0.25}}])
    assert job is not None
    assert infotext.entries(job, with_hires=True) == {
        "ToMe ratio": "0.5",
        "ToMe max downsample": "auto",
        "ToMe stride x": "2",
        "ToMe stride y": "2",
        "ToMe merge MLP": "True",
        "ToMe mode": "merge",
        "ToMe hires": "own",
        "ToMe hires ratio": "0.25",
        "ToMe hires max downsample": "auto",
        "ToMe hires stride x": "2",
        "ToMe hires stride y": "2",
    }
    assert "ToMe hires" not in infotext.entries(job, with_hires=False)


# ---------------------------------------------------------------------------------------------- round trips

ratios = st.floats(0.0, 0.95, allow_nan=False)
fractions = st.floats(0.0, 1.0, allow_nan=False)


@st.composite
def jobs(draw: st.DrawFn) -> TomeJob:
    values: dict[str, Any] = {}
    for spec in field_specs():
        if spec.kind is bool:
            values[spec.name] = draw(st.booleans())
        elif spec.choices is not None:
            values[spec.name] = draw(st.sampled_from(spec.choices))
        elif spec.name == "ratio":
            values[spec.name] = draw(ratios)
        elif spec.optional:
            values[spec.name] = draw(st.none() | st.integers(0, 2**32 - 1))
        elif spec.kind is int:
            values[spec.name] = draw(st.integers(int(spec.minimum or 0), int(spec.maximum or 8)))
    start, end = sorted(draw(st.lists(fractions, min_size=2, max_size=2, unique=True)))
    values.update(step_start=start, step_end=end)
    hires = draw(
        st.sampled_from(["same", "off"])
        | st.fixed_dictionaries(
            {},
            optional={
                "ratio": ratios,
                "sx": st.integers(1, 8),
                "sy": st.integers(1, 8),
                "max_downsample": st.sampled_from(["auto", 1, 2, 4, 8]),
            },
        )
    )
    job = resolve([{**values, "hires": hires}])
    assert job is not None
    return job


@given(job=jobs())
def test_ui_paste_restores_every_control(runners: dict[str, scripts.ScriptRunner], job: TomeJob) -> None:
    text = infotext_of(job, extra={"Hires upscale": 2, "Size": "512x768"})
    for regex in (None, RE_PARAM_16):
        params = parse_generation_parameters(text) if regex is None else parse_generation_parameters(text, regex)
        values = ui_paste(runners["txt2img"].infotext_fields, params)
        assert UNCHANGED not in values  # every control is set
        assert resolve(values) == job
        assert resolve(args_from(ui_paste(runners["img2img"].infotext_fields, params), IMG2IMG_ARG_NAMES)) == (
            TomeJob(first=job.first, hires_mode="same", hires=job.first)
        )
    for value in params.values():
        assert not RE_IMAGESIZE.match(str(value)) or str(value) == "512x768"


@given(job=jobs())
def test_api_infotext_field_restores_typed_values(runners: dict[str, scripts.ScriptRunner], job: TomeJob) -> None:
    params = parse_generation_parameters(infotext_of(job))
    values = api_infotext(runners["txt2img"].infotext_fields, params)
    assert None not in values
    for value, component in zip(values, runners["txt2img"].inputs[1:], strict=True):
        assert type(value) is type(component.value)
    assert resolve(values) == job


def test_an_image_without_tome_turns_it_off(runners: dict[str, scripts.ScriptRunner]) -> None:
    plain = "a cat\nSteps: 20, Sampler: Euler, Seed: 1, Size: 512x512, Token merging ratio: 0.3"
    failed = 'a cat\nSteps: 20, Sampler: Euler, Seed: 1, ToMe error: "ratio must be a number in [0, 0.95], got 5"'
    for text in (plain, failed):
        params = parse_generation_parameters(text)
        fields = runners["txt2img"].infotext_fields
        assert ui_paste(fields, params) == [False] + [UNCHANGED] * (len(ARG_NAMES) - 1)
        assert api_infotext(fields, params) == [False] + [None] * (len(ARG_NAMES) - 1)
        assert resolve(args_from(ui_paste(fields, params))) is None


def test_false_values_stay_false_and_bad_values_are_skipped(runners: dict[str, scripts.ScriptRunner]) -> None:
    params = parse_generation_parameters(
        "x\nSteps: 20, Seed: 1, ToMe ratio: 0.5, ToMe random partitions: False, ToMe stride x: two, ToMe hires: off"
    )
    fields = runners["txt2img"].infotext_fields
    values = dict(zip(ARG_NAMES, api_infotext(fields, params), strict=True))
    assert values["enabled"] is True and values["use_rand"] is False
    assert values["sx"] is None  # unreadable: the control is left as it is, no error reaches the WebUI
    assert values["hr_mode"] == "off"


def test_send_to_img2img_matches_the_controls_of_both_tabs(runners: dict[str, scripts.ScriptRunner]) -> None:
    """Like connect_paste_params_buttons: entries of both tabs are matched by name, in order."""
    names = runners["txt2img"].paste_field_names
    assert names == runners["img2img"].paste_field_names
    sources = [c for c, name in runners["txt2img"].infotext_fields if name in names]
    targets = [c for c, name in runners["img2img"].infotext_fields if name in names]
    assert [c.label for c in sources] == [c.label for c in targets]
    assert len(sources) == len(IMG2IMG_ARG_NAMES)
    assert all(type(s.value) is type(t.value) for s, t in zip(sources, targets, strict=True))


def test_hires_keys_only_in_own_mode() -> None:
    for hires in ("same", "off"):
        job = resolve([{"hires": hires}])
        assert job is not None
        written = infotext.entries(job, with_hires=True)
        assert written["ToMe hires"] == hires
        assert not any(infotext.KEYS[f"hr_{name}"] in written for name in HIRES_FIELDS)
