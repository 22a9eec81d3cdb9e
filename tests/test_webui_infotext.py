"""Infotext: the key table, and writing then pasting (UI, API `infotext` field) restores the same job."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from typing import Any

import gradio as gr
import pytest
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from hypothesis import assume, given
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

import tome_core
from tome_core import FAMILIES, TomeConfig, field_spec, field_specs, get_preset
from tome_webui import infotext
from tome_webui.params import (
    ARG_NAMES,
    FIELD_NAMES,
    HIRES_FIELDS,
    IMG2IMG_ARG_NAMES,
    PRESET_CHOICES,
    TomeArgsError,
    TomeJob,
    defaults,
    resolve,
    ui_value,
)

#: The module (the package's `presets` is the function of the same name).
tome_presets = importlib.import_module("tome_core.presets")

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


def infotext_of(job: TomeJob, family: str = "sd", *, hires: bool = True, extra: dict[str, Any] | None = None) -> str:
    """The infotext of a job that ran on a model of `family`."""
    p = processing.StableDiffusionProcessingTxt2Img(enable_hr=hires)
    ran = infotext.entries(job, with_hires=hires, families={False: family, True: family})
    p.extra_generation_params = {**(extra or {}), **ran}
    return processing.create_infotext(p, 0)


def args_from(values: list[Any], names: tuple[str, ...] = ARG_NAMES) -> list[Any]:
    """Script args after a paste: a pasted value, else the control's default (UNCHANGED/None leave it)."""
    start = [ui_value(name, defaults()[name]) for name in names]
    return [s if v is UNCHANGED or v is None else v for s, v in zip(start, values, strict=True)]


def same_passes(a: TomeJob | None, b: TomeJob | None, family: str, *, hires: bool = True) -> None:
    """Both jobs run the same configs on a model of `family`."""
    assert a is not None and b is not None
    assert a.pass_config(False, family) == b.pass_config(False, family)
    if hires:
        assert a.pass_config(True, family) == b.pass_config(True, family)


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
    assert infotext.KEYS["preset"] == "ToMe preset" and infotext.KEYS["hr_preset"] == "ToMe hires preset"
    assert infotext.KEYS["mlp_ratio"] == "ToMe MLP ratio" and infotext.KEYS["merge_mlp"] == "ToMe merge MLP"
    assert infotext.KEYS["share_plan"] == "ToMe one plan per stack"
    assert infotext.HIRES_KEYS["mlp_ratio"] == "ToMe hires MLP ratio"
    for spec in field_specs():  # derived from the labels
        assert infotext.KEYS[spec.name].lower() == "tome " + re.sub(r"[^a-z0-9]+", " ", spec.label.lower()).strip()
        assert infotext.HIRES_KEYS[spec.name] == infotext.KEYS[spec.name].replace("ToMe ", "ToMe hires ", 1)


def test_what_is_written() -> None:
    job = resolve([{"ratio": 0.5, "merge_mlp": True, "mlp_ratio": 0.25, "hires": {"ratio": 0.25}}])
    assert job is not None
    assert infotext.entries(job, with_hires=True) == {
        "ToMe ratio": "0.5",
        "ToMe max downsample": "auto",
        "ToMe stride x": "2",
        "ToMe stride y": "2",
        "ToMe merge MLP": "True",
        "ToMe mode": "merge",
        "ToMe MLP ratio": "0.25",
        "ToMe hires": "own",
        "ToMe hires ratio": "0.25",
        "ToMe hires max downsample": "auto",
        "ToMe hires stride x": "2",
        "ToMe hires stride y": "2",
    }
    assert "ToMe hires" not in infotext.entries(job, with_hires=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_preset_records_its_name_and_the_values_that_ran(family: str) -> None:
    job = resolve([{"preset": "fast", "hires": {"preset": "fastest"}}])
    assert job is not None
    # Before a pass has run, the model (and so the values) are not known: only the settings.
    assert infotext.entries(job, with_hires=True) == {
        "ToMe preset": "fast",
        "ToMe hires": "own",
        "ToMe hires preset": "fastest",
    }
    written = infotext.entries(job, with_hires=True, families={False: family, True: family})
    first, hires = get_preset("fast").config(family), get_preset("fastest").config(family)
    assert written["ToMe preset"] == "fast" and written["ToMe hires preset"] == "fastest"
    assert written["ToMe ratio"] == repr(first.ratio)
    assert written["ToMe max downsample"] == str(first.max_downsample)
    assert written.get("ToMe one plan per stack") == ("True" if first.share_plan else None)
    assert written.get("ToMe MLP ratio") == (None if first.mlp_ratio is None else repr(first.mlp_ratio))
    assert written["ToMe hires ratio"] == repr(hires.ratio)  # own mode: always
    for name in FIELD_NAMES:  # other hires values only where they differ from the first pass
        if name not in HIRES_FIELDS:
            differs = getattr(hires, name) != getattr(first, name)
            assert (infotext.HIRES_KEYS[name] in written) == differs, name
    for value in written.values():
        assert not RE_IMAGESIZE.match(value)


def test_values_laid_over_a_preset_are_recorded_as_custom() -> None:
    job = resolve([{"preset": "fast", "ratio": 0.3}])
    assert job is not None
    written = infotext.entries(job, with_hires=True, families={False: "sdxl", True: "sdxl"})
    assert "ToMe preset" not in written
    assert written["ToMe ratio"] == "0.3" and written["ToMe hires"] == "same"
    assert written["ToMe merge MLP"] == str(get_preset("fast").config("sdxl").merge_mlp)


def test_a_hires_model_of_another_family_is_recorded_with_its_values() -> None:
    # A hires checkpoint of another family runs the preset's values for that family; the first pass's own.
    job = resolve([{"preset": "balanced"}])
    assert job is not None
    written = infotext.entries(job, with_hires=True, families={False: "sd", True: "sdxl"})
    first, hires = job.pass_config(False, "sd"), job.pass_config(True, "sdxl")
    assert first == get_preset("balanced").config("sd") and hires == get_preset("balanced").config("sdxl")
    assert written["ToMe preset"] == "balanced" and written["ToMe hires"] == "same"
    for name in FIELD_NAMES:
        differs = getattr(hires, name) != getattr(first, name)
        assert (infotext.HIRES_KEYS[name] in written) == differs, name
    # Values laid over the preset: "same" custom settings would not reproduce the other family's values.
    job = resolve([{"preset": "balanced", "ratio": 0.3}])
    assert job is not None
    written = infotext.entries(job, with_hires=True, families={False: "sd", True: "sdxl"})
    assert written["ToMe hires"] == "own" and "ToMe hires preset" not in written
    assert written["ToMe hires ratio"] == "0.3"  # the value laid over wins in both passes


# ---------------------------------------------------------------------------------------------- round trips

ratios = st.floats(0.0, 0.95, allow_nan=False)
fractions = st.floats(0.0, 1.0, allow_nan=False)


def windows(name: str) -> st.SearchStrategy[tuple[float, float]]:
    """A (start, end) pair of the step or block window, each in its field's range, start before end."""
    low, high = field_spec(f"{name}_start"), field_spec(f"{name}_end")
    starts = st.floats(float(low.minimum or 0), min(float(low.maximum or 1), 0.9), allow_nan=False)
    return starts.flatmap(
        lambda start: st.tuples(
            st.just(start), st.floats(max(start + 0.01, float(high.minimum or 0)), float(high.maximum or 1))
        )
    )


#: The fields drawn in pairs, start before end.
WINDOWS = {
    "step_start": "step_window",
    "step_end": "step_window",
    "block_start": "block_window",
    "block_end": "block_window",
}


@st.composite
def jobs(draw: st.DrawFn) -> TomeJob:
    """Any job of the dict form: custom settings, or a preset with or without values laid over it."""
    values: dict[str, Any] = {}
    for spec in field_specs():
        if spec.kind is bool:
            values[spec.name] = draw(st.booleans())
        elif spec.choices is not None:
            values[spec.name] = draw(st.sampled_from(spec.choices))
        elif spec.kind is float and spec.name not in WINDOWS:
            values[spec.name] = draw((st.none() if spec.optional else st.nothing()) | ratios)
        elif spec.optional:
            values[spec.name] = draw(st.none() | st.integers(0, 2**32 - 1))
        elif spec.kind is int:
            values[spec.name] = draw(st.integers(int(spec.minimum or 0), int(spec.maximum or 8)))
    for window in ("step", "block"):  # each window's start before its end
        start, end = draw(windows(window))
        values.update({f"{window}_start": start, f"{window}_end": end})
    preset = draw(st.sampled_from(PRESET_CHOICES))
    if preset != "custom":
        kept = draw(st.sets(st.sampled_from([*FIELD_NAMES, "step_window", "block_window"]), max_size=3))
        values = {name: value for name, value in values.items() if WINDOWS.get(name, name) in kept}
        values["preset"] = preset
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
        | st.fixed_dictionaries({"preset": st.sampled_from(PRESET_CHOICES)})
    )
    try:
        job = resolve([{**values, "hires": hires}])
    except TomeArgsError as exc:
        # a ratio the strides cannot reach is refused (tests/test_one_rule_for_bad_values.py), and so is a first
        # merging level above the last: not a job
        refused = ("1 - 1/(sx*sy)", "nothing to pool", "no level would merge")
        assume(not any(words in str(exc) for words in refused))
        raise
    assert job is not None
    return job


@given(job=jobs(), family=st.sampled_from(FAMILIES))
def test_ui_paste_reproduces_what_ran(runners: dict[str, scripts.ScriptRunner], job: TomeJob, family: str) -> None:
    text = infotext_of(job, family, extra={"Hires upscale": 2, "Size": "512x768"})
    for regex in (None, RE_PARAM_16):
        params = parse_generation_parameters(text) if regex is None else parse_generation_parameters(text, regex)
        values = ui_paste(runners["txt2img"].infotext_fields, params)
        assert UNCHANGED not in values  # every control is set
        same_passes(resolve(values), job, family)
        img2img = args_from(ui_paste(runners["img2img"].infotext_fields, params), IMG2IMG_ARG_NAMES)
        same_passes(resolve(img2img, is_img2img=True), job, family, hires=False)
        # Switching to Custom keeps exactly what the first pass ran.
        named = dict(zip(ARG_NAMES, values, strict=True))
        custom = resolve([{**named, "preset": "custom"}[name] for name in ARG_NAMES])
        assert custom is not None and custom.pass_config(False) == job.pass_config(False, family)
    for value in params.values():
        assert not RE_IMAGESIZE.match(str(value)) or str(value) == "512x768"


@given(job=jobs(), family=st.sampled_from(FAMILIES))
def test_api_infotext_field_restores_typed_values(
    runners: dict[str, scripts.ScriptRunner], job: TomeJob, family: str
) -> None:
    params = parse_generation_parameters(infotext_of(job, family))
    values = api_infotext(runners["txt2img"].infotext_fields, params)
    assert None not in values
    for value, component in zip(values, runners["txt2img"].inputs[1:], strict=True):
        assert type(value) is type(component.value)
    same_passes(resolve(values), job, family)


DIT_FAMILIES = [family for family in tome_core.ALL_FAMILIES if family not in FAMILIES]
strides = st.integers(2, 8)


@st.composite
def transformer_jobs(draw: st.DrawFn) -> TomeJob:
    """Jobs a diffusion transformer runs: a preset as it is or with fields it runs laid over it, or custom keys/values
    subsampling; the hires pass the same, off, at its own preset or with its own strides."""
    preset = draw(st.sampled_from(PRESET_CHOICES))
    values: dict[str, Any] = {"preset": preset, **({"mode": "kv"} if preset == "custom" else {})}
    optional = {"sx": strides, "sy": strides, "st": st.integers(1, 4), "use_rand": st.booleans()}
    values.update(draw(st.fixed_dictionaries({}, optional=optional)))
    if draw(st.booleans()):
        start, end = draw(windows("block"))
        values.update(block_start=start, block_end=end)
    hires = draw(
        st.sampled_from(["same", "off"])
        | st.fixed_dictionaries({"preset": st.sampled_from(PRESET_CHOICES)})
        | st.fixed_dictionaries({}, optional={"sx": strides, "sy": strides})
    )
    try:
        job = resolve([{**values, "hires": hires}])
    except TomeArgsError as exc:  # strides that leave a preset's ratio nothing to merge on a UNet: not a job
        assume("1 - 1/(sx*sy)" not in str(exc))
        raise
    assert job is not None
    return job


@given(job=transformer_jobs(), family=st.sampled_from(DIT_FAMILIES))
def test_a_diffusion_transformers_infotext_pastes_back(
    runners: dict[str, scripts.ScriptRunner], job: TomeJob, family: str
) -> None:
    """On Flux, Wan, ...: only the fields it runs are written (no max downsample, which means nothing there; the ratio
    only for merged blocks), `ToMe mode` marks that ToMe ran, and pasting restores what ran."""
    text = infotext_of(job, family)
    params = parse_generation_parameters(text)
    first = job.pass_config(False, family)
    assert first is not None and params["ToMe mode"] == first.mode and "ToMe max downsample" not in params
    assert ("ToMe ratio" in params) == (first.mode == "merge")
    values = ui_paste(runners["txt2img"].infotext_fields, params)
    assert values[0] is True and UNCHANGED not in values
    same_passes(resolve(values), job, family)
    typed = api_infotext(runners["txt2img"].infotext_fields, params)
    same_passes(resolve(typed), job, family)


def test_an_image_without_tome_turns_it_off(runners: dict[str, scripts.ScriptRunner]) -> None:
    plain = "a cat\nSteps: 20, Sampler: Euler, Seed: 1, Size: 512x512, Token merging ratio: 0.3"
    failed = 'a cat\nSteps: 20, Sampler: Euler, Seed: 1, ToMe error: "ratio must be a number in [0, 0.95], got 5"'
    for text in (plain, failed):
        params = parse_generation_parameters(text)
        fields = runners["txt2img"].infotext_fields
        assert ui_paste(fields, params) == [False] + [UNCHANGED] * (len(ARG_NAMES) - 1)
        assert api_infotext(fields, params) == [False] + [None] * (len(ARG_NAMES) - 1)
        assert resolve(args_from(ui_paste(fields, params))) is None


def test_an_image_from_before_presets_pastes_as_custom(runners: dict[str, scripts.ScriptRunner]) -> None:
    old = (
        "a cat\nSteps: 20, Seed: 1, Size: 512x512, ToMe ratio: 0.6, ToMe max downsample: auto, ToMe stride x: 2,"
        " ToMe stride y: 2, ToMe mode: merge, ToMe hires: own, ToMe hires ratio: 0.7, ToMe hires max downsample: 2,"
        " ToMe hires stride x: 2, ToMe hires stride y: 2"
    )
    values = dict(zip(ARG_NAMES, ui_paste(runners["txt2img"].infotext_fields, parse_generation_parameters(old))))
    assert values["enabled"] is True and values["preset"] == "custom" and values["hr_preset"] == "custom"
    job = resolve(list(values.values()))
    assert job is not None and job.pass_config(False) == TomeConfig(ratio=0.6)
    assert job.pass_config(True) == TomeConfig(ratio=0.7, max_downsample=2)


def test_a_preset_image_pastes_with_its_preset(runners: dict[str, scripts.ScriptRunner]) -> None:
    params = parse_generation_parameters(
        "x\nSteps: 20, Seed: 1, ToMe preset: fast, ToMe ratio: 0.5, ToMe max downsample: 2, ToMe hires: same"
    )
    values = dict(zip(ARG_NAMES, api_infotext(runners["txt2img"].infotext_fields, params), strict=True))
    assert values["preset"] == "fast" and values["hr_mode"] == "same"
    assert values["hr_preset"] == "fast"  # switching to "Own settings" keeps what "same" ran
    assert values["ratio"] == 0.5 and values["max_downsample"] == "2" and values["hr_max_downsample"] == "2"
    # a preset key alone (the model never ran) still marks ToMe as on
    only = parse_generation_parameters("x\nSteps: 20, Seed: 1, ToMe preset: Fastest")
    values = dict(zip(ARG_NAMES, api_infotext(runners["txt2img"].infotext_fields, only), strict=True))
    assert values["enabled"] is True and values["preset"] == "fastest"


def test_false_values_stay_false_and_bad_values_are_skipped(runners: dict[str, scripts.ScriptRunner]) -> None:
    params = parse_generation_parameters(
        "x\nSteps: 20, Seed: 1, ToMe ratio: 0.5, ToMe random partitions: False, ToMe stride x: two, ToMe hires: off,"
        " ToMe preset: warp"
    )
    fields = runners["txt2img"].infotext_fields
    values = dict(zip(ARG_NAMES, api_infotext(fields, params), strict=True))
    assert values["enabled"] is True and values["use_rand"] is False
    assert values["sx"] is None  # unreadable: the control is left as it is, no error reaches the WebUI
    assert values["preset"] is None
    assert values["hr_mode"] == "off"


def test_the_version_reads_as_one_value_and_paste_ignores_it(runners: dict[str, scripts.ScriptRunner]) -> None:
    """`ToMe version` is a record for bug reports, not a setting: no control reads it, so pasting an image (here, or
    into another version of the extension) restores exactly what it would without the key."""
    assert infotext.VERSION_KEY == "ToMe version" and infotext.VERSION_KEY not in infotext.VALUE_KEYS
    job = resolve([{"preset": "fast", "hires": {"ratio": 0.3}}])
    assert job is not None
    text = infotext_of(job, extra={infotext.VERSION_KEY: tome_core.__version__})
    params = parse_generation_parameters(text)
    assert params[infotext.VERSION_KEY] == tome_core.__version__  # one value: never split like "2x2"
    without = {key: value for key, value in params.items() if key != infotext.VERSION_KEY}
    for tab in ("txt2img", "img2img"):
        fields = runners[tab].infotext_fields
        assert infotext.VERSION_KEY not in [str(name) for _, name in fields]
        assert ui_paste(fields, params) == ui_paste(fields, without)
        assert api_infotext(fields, params) == api_infotext(fields, without)
    # An image ToMe refused to run on carries the version beside the error, and pastes with ToMe off.
    failed = parse_generation_parameters(
        f'x\nSteps: 20, Seed: 1, ToMe error: "ratio must be a number in [0, 0.95], got 5", ToMe version: '
        f"{tome_core.__version__}"
    )
    assert api_infotext(runners["txt2img"].infotext_fields, failed)[0] is False


def test_send_to_img2img_matches_the_controls_of_both_tabs(runners: dict[str, scripts.ScriptRunner]) -> None:
    """Like connect_paste_params_buttons: entries of both tabs are matched by name, in order."""
    names = runners["txt2img"].paste_field_names
    assert names == runners["img2img"].paste_field_names
    assert "ToMe preset" in names
    sources = [c for c, name in runners["txt2img"].infotext_fields if name in names]
    targets = [c for c, name in runners["img2img"].infotext_fields if name in names]
    assert [c.label for c in sources] == [c.label for c in targets]
    assert len(sources) == len(IMG2IMG_ARG_NAMES)
    assert all(type(s.value) is type(t.value) for s, t in zip(sources, targets, strict=True))


def test_hires_values_only_when_they_differ_or_in_own_mode() -> None:
    for hires in ("same", "off"):
        job = resolve([{"hires": hires}])
        assert job is not None
        written = infotext.entries(job, with_hires=True)
        assert written["ToMe hires"] == hires
        assert not any(key in written for key in infotext.HIRES_KEYS.values())
