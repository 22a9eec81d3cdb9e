"""The script's args (the API contract): positional order, the dict form, presets, short lists, and clear errors."""

from __future__ import annotations

from typing import Any

import pytest

from tome_core import DEFAULT_PRESET, FAMILIES, TomeConfig, field_specs, get_preset, presets
from tome_webui import params
from tome_webui.params import (
    ARG_NAMES,
    IMG2IMG_ARG_NAMES,
    UI_PRESET_DEFAULT,
    TomeArgsError,
    TomeJob,
    defaults,
    pad_positional,
    resolve,
    ui_value,
    validate_request_args,
)

#: The documented positional order. Positions never move (API callers depend on them): only append.
DOCUMENTED_ORDER = (
    "enabled",
    "ratio",
    "max_downsample",
    "sx",
    "sy",
    "use_rand",
    "merge_attn",
    "merge_crossattn",
    "merge_mlp",
    "seed",
    "mode",
    "matching",
    "step_start",
    "step_end",
    "hr_mode",
    "hr_ratio",
    "hr_max_downsample",
    "hr_sx",
    "hr_sy",
    "mlp_ratio",
    "share_plan",
    "preset",
    "hr_preset",
    "mlp_min_downsample",
    "min_downsample",
    "pool_kv",
    "st",
    "block_start",
    "block_end",
)
DOCUMENTED_IMG2IMG_ORDER = (
    *DOCUMENTED_ORDER[:14],
    "mlp_ratio",
    "share_plan",
    "preset",
    "mlp_min_downsample",
    "min_downsample",
    "pool_kv",
    "st",
    "block_start",
    "block_end",
)

#: Valid first-pass args (the first 14 of both tabs), to put a bad hires value after.
VALID = [True, 0.5, "auto", 2, 2, True, True, False, False, -1, "merge", "local", 0, 1]
#: The rest of a full txt2img list: hires same, then mlp_ratio, share_plan (preset, hr_preset, mlp_min_downsample
#: follow).
TAIL = ["same", 0.5, "auto", 2, 2, -1, False]


def full(*, preset: str = "custom", hr_preset: str = "custom", **values: Any) -> list[Any]:
    """A full txt2img list as the UI sends it, custom by default."""
    named = dict(zip(ARG_NAMES, [*VALID, *TAIL, preset, hr_preset, 1, 1, False, 1, 0.0, 1.0], strict=True))
    named.update(values)
    return [named[name] for name in ARG_NAMES]


def fast(family: str) -> TomeConfig:
    return get_preset("fast").config(family)


def test_positional_order_is_the_documented_one() -> None:
    assert ARG_NAMES == DOCUMENTED_ORDER
    assert IMG2IMG_ARG_NAMES == DOCUMENTED_IMG2IMG_ORDER
    assert set(ARG_NAMES) >= {s.name for s in field_specs()}
    doc = " ".join((params.__doc__ or "").split())
    groups = [(0, 1), (1, 14), (14, 19), (19, 23), (23, 24), (24, 26), (26, 29)]
    table = " ".join(
        f"{start if end == start + 1 else f'{start}-{end - 1}'} {', '.join(DOCUMENTED_ORDER[start:end])}"
        for start, end in groups
    )
    assert table in doc
    assert (
        "0 enabled, 1-13 the same fields, 14-22 mlp_ratio, share_plan, preset, mlp_min_downsample, min_downsample,"
        " pool_kv, st, block_start, block_end" in doc
    )


def test_defaults_are_off_and_the_config_defaults() -> None:
    assert resolve([]) is None
    assert resolve([True]) == TomeJob(first=TomeConfig())  # a short list means custom
    values = params.defaults()
    assert values["enabled"] is False and values["hr_mode"] == "same"
    assert values["preset"] == values["hr_preset"] == DEFAULT_PRESET  # what the UI starts at
    assert all(values[s.name] == s.default for s in field_specs())
    assert (*(p.name for p in presets()), "custom") == params.PRESET_CHOICES


def test_positional_values_as_the_ui_and_json_send_them() -> None:
    ui = [True, 0.6, "2", 3, 1, False, True, True, False, 1234, "merge", "global", 0.1, 0.9]
    ui += ["own", 0.4, "auto", 2, 2, 0.3, True, "custom", "custom"]
    job = resolve(ui)
    assert job is not None
    first = TomeConfig(
        ratio=0.6,
        max_downsample=2,
        sx=3,
        sy=1,
        use_rand=False,
        merge_crossattn=True,
        seed=1234,
        matching="global",
        step_start=0.1,
        step_end=0.9,
        mlp_ratio=0.3,
        share_plan=True,
    )
    assert job.first == first and job.pass_config(False) == first
    assert job.hires_mode == "own"
    assert job.pass_config(True) == first.replace(ratio=0.4, max_downsample="auto", sx=2, sy=2)
    # JSON-ish variants: numbers as strings, "true"/"false", labels, -1/None for optional numbers, 2.0 for ints
    loose = ["true", "0.6", 2.0, "3", 1.0, "False", "TRUE", 1, 0, "1234", "Merge", "GLOBAL", "0.1", "0.9"]
    loose += ["Own settings", "0.4", "Auto", "2", 2, "0.3", "true", "Custom", "CUSTOM"]
    assert resolve(loose) == job
    for none in (-1, -1.0, None, "-1", "none"):
        job = resolve([True, *ui[1:9], none, *ui[10:19], none])
        assert job is not None and job.first.seed is None and job.first.mlp_ratio is None


def test_short_lists_keep_the_defaults_and_mean_custom() -> None:
    assert resolve([True, 0.3]) == TomeJob(first=TomeConfig(ratio=0.3))
    job = resolve([True, 0.3, *VALID[2:], "off"])
    assert job is not None and job.pass_config(True) is None and job.config_for(True) is None
    assert resolve([True, 0.3], is_img2img=True) == TomeJob(first=TomeConfig(ratio=0.3))
    # A list that stops before `preset` is completed like the API check does it, and keeps its meaning.
    for img2img in (False, True):
        padded = pad_positional([True, 0.3], is_img2img=img2img)
        assert padded is not None and len(padded) == len(IMG2IMG_ARG_NAMES if img2img else ARG_NAMES)
        assert resolve(padded, is_img2img=img2img) == resolve([True, 0.3], is_img2img=img2img)
        assert pad_positional(padded, is_img2img=img2img) is None


def test_preset_resolves_per_family_and_pass() -> None:
    job = resolve(full(preset="fast", ratio=0.1, sx=1))  # the detailed settings are Custom's: not used
    assert job is not None and job.preset == "fast" and job.changes == ()
    for family in FAMILIES:
        assert job.pass_config(False, family) == fast(family)
        assert job.pass_config(True, family) == fast(family)  # "same": the first pass's preset
        assert job.config_for(False, family) == fast(family)
    assert job.needs_family(False) and job.needs_family(True) and job.may_merge(False)
    with pytest.raises(ValueError, match="model family"):
        job.pass_config(False)


@pytest.mark.parametrize("family", FAMILIES)
def test_hires_modes_with_presets(family: str) -> None:
    own_preset = resolve(full(preset="quality", hr_mode="own", hr_preset="fastest"))
    assert own_preset is not None
    assert own_preset.pass_config(True, family) == get_preset("fastest").config(family)
    # own custom settings over a first-pass preset: its values for this family, with own ratio/strides/levels
    own_custom = resolve(full(preset="fast", hr_mode="own", hr_ratio=0.7, hr_sx=4, hr_sy=4, hr_max_downsample="1"))
    assert own_custom is not None
    # (max downsample 1 below the preset's first merging level: from level 1, `params._overlay`)
    assert own_custom.pass_config(True, family) == fast(family).replace(
        ratio=0.7, sx=4, sy=4, max_downsample=1, min_downsample=1
    )
    # a hires preset over custom first-pass settings
    custom_first = resolve(full(ratio=0.2, hr_mode="own", hr_preset="fast"))
    assert custom_first is not None and not custom_first.needs_family(False) and custom_first.needs_family(True)
    assert custom_first.pass_config(False) == TomeConfig(ratio=0.2)
    assert custom_first.pass_config(True, family) == fast(family)
    off = resolve(full(preset="fast", hr_mode="off", hr_preset="fast"))
    assert off is not None and off.pass_config(True, family) is None and not off.needs_family(True)


def test_hires_modes_and_img2img() -> None:
    own = resolve([True, 0.0, *VALID[2:], "own", 0.5])
    assert own is not None
    assert own.config_for(False) is None  # ratio 0: only the hires pass merges
    assert own.config_for(True) == TomeConfig(ratio=0.5)
    assert not own.may_merge(False) and own.may_merge(True)
    img2img = resolve([True, 0.4], is_img2img=True)
    assert img2img is not None and img2img.config_for(False) == img2img.config_for(True) == TomeConfig(ratio=0.4)
    img2img = resolve([*VALID, 0.25, True, "fastest"], is_img2img=True)
    assert img2img is not None and img2img.preset == "fastest"
    assert img2img.config_for(False, "sdxl") == get_preset("fastest").config("sdxl")


def test_dict_form() -> None:
    job = resolve([{"ratio": 0.6, "sx": 4, "sy": 4, "max_downsample": "auto", "merge_mlp": True}])
    config = TomeConfig(ratio=0.6, sx=4, sy=4, merge_mlp=True)
    assert job == TomeJob(first=config)  # no "preset": custom, as before presets existed
    job = resolve([{"enabled": True, "ratio": 0.6, "sx": 4, "hires": {"ratio": 0.7}}])
    assert job is not None and job.pass_config(True) == TomeConfig(ratio=0.7, sx=4)  # missing keys follow
    job = resolve([{"hires": "off"}])
    assert job is not None and job.pass_config(True) is None and job.hires_mode == "off"
    assert resolve([{"enabled": False, "ratio": 0.6}]) is None
    assert resolve([{"enabled": "false"}]) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_dict_form_with_presets(family: str) -> None:
    job = resolve([{"preset": "fast"}])
    assert job is not None and job.pass_config(False, family) == fast(family)
    assert job.pass_config(True, family) == fast(family)
    # fields next to a preset are laid over it (like tome_core.apply_patch(model, preset="fast", ratio=0.3))
    job = resolve([{"preset": "Fast", "ratio": 0.3, "use_rand": False}])
    assert job is not None and job.changes == (("ratio", 0.3), ("use_rand", False))
    assert job.pass_config(False, family) == fast(family).replace(ratio=0.3, use_rand=False)
    assert job.pass_config(True, family) == fast(family).replace(ratio=0.3, use_rand=False)
    job = resolve([{"ratio": 0.3, "hires": {"preset": "fastest"}}])
    assert job is not None and job.pass_config(False) == TomeConfig(ratio=0.3)
    assert job.pass_config(True, family) == get_preset("fastest").config(family)
    # own hires settings over a preset: missing keys follow the preset's values for the model
    job = resolve([{"preset": "fast", "hires": {"ratio": 0.7}}])
    assert job is not None and job.pass_config(True, family) == fast(family).replace(ratio=0.7)
    job = resolve([{"preset": "fast", "hires": {"preset": "custom", "ratio": 0.7}}])
    assert job is not None and job.pass_config(True, family) == fast(family).replace(ratio=0.7)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([True, 5], "ratio (args[1]) must be a number in [0, 0.95], got 5"),
        ([True, 0.5, "auto", "two"], "sx (args[3]) must be an integer in [1, 8], got 'two'"),
        ([True, 0.5, "auto", 2.5], "sx (args[3]) must be an integer in [1, 8], got 2.5"),
        ([True, 0.5, 3], "max_downsample (args[2]) must be one of 'auto', 1, 2, 4, 8, got 3"),
        ([True, 0.5, "auto", 2, 2, "yes"], "use_rand (args[5]) must be true or false, got 'yes'"),
        (
            [True, *[0.5, "auto", 2, 2, True, True, False, False], -2],
            "seed (args[9]) must be an integer in [0, 4294967295] or None (-1 means None), got -2",
        ),
        ([True, *[0.5, "auto", 2, 2, True, True, False, False, -1], "fast"], "mode (args[10]) must be one of 'merge'"),
        (
            [True, *[0.5, "auto", 2, 2, True, True, False, False, -1, "merge", "local", 0.6, 0.5]],
            "settings are invalid: TomeConfig.step_start must be less than step_end",
        ),
        (["on"], "enabled (args[0]) must be true or false, got 'on'"),
        ([True, float("nan")], "ratio (args[1]) must be a number in [0, 0.95]"),
        ([*VALID, "sometimes"], "hr_mode (args[14]) must be one of 'same', 'own', 'off'"),
        ([*VALID, "own", 1.5], "hr_ratio (args[15])"),
        ([*VALID, *TAIL[:5], 2], "mlp_ratio (args[19]) must be a number in [0, 0.95] or None (-1 means None), got 2"),
        ([*VALID, *TAIL[:6], "yes"], "share_plan (args[20]) must be true or false"),
        (
            full(preset="turbo"),
            "preset (args[21]) must be one of 'quality', 'balanced', 'fast', 'fastest', 'custom', got 'turbo'",
        ),
        (full(hr_preset=""), "hr_preset (args[22]) must be one of 'quality'"),
        ([0.0] * (len(ARG_NAMES) + 1), f"args has {len(ARG_NAMES) + 1} values, at most {len(ARG_NAMES)} allowed"),
        ([{"ratio": 5}], "ratio must be a number in [0, 0.95], got 5"),
        ([{"sx": "two"}], "sx must be an integer in [1, 8], got 'two'"),
        ([{"foo": 1}], "args[0] has unknown field(s) 'foo'; allowed: enabled, preset, ratio"),
        ([{"preset": "turbo"}], "preset must be one of 'quality', 'balanced', 'fast', 'fastest', 'custom'"),
        ([{"preset": "fast", "mlp_ratio": 1}], "mlp_ratio must be a number in [0, 0.95] or None"),
        (
            [{"preset": "fast", "step_start": 0.5, "step_end": 0.5}],
            "settings are invalid: TomeConfig.step_start must be less than step_end",
        ),
        (
            [{"hires": {"ratio": 0.5, "merge_mlp": True}}],
            "hires has unknown field(s) 'merge_mlp'; allowed: preset, ratio, max_downsample, sx, sy",
        ),
        ([{"hires": {"ratio": 2}}], "hires.ratio must be a number in [0, 0.95], got 2"),
        ([{"hires": {"preset": "slow"}}], "hires.preset must be one of 'quality', 'balanced'"),
        (
            [{"hires": {"preset": "fast", "sx": 4}}],
            "hires takes either a 'preset' or its own settings (ratio, max_downsample, sx, sy), not both",
        ),
        ([{"hires": "own"}], "hires must be 'same', 'off' or an object"),
        ([{"hires": 3}], "hires must be 'same', 'off' or an object of hires settings, got 3"),
    ],
)
def test_invalid_args_name_the_field_and_the_allowed_values(args: list[Any], message: str) -> None:
    with pytest.raises(TomeArgsError) as info:
        resolve(args)
    assert message in str(info.value)
    with pytest.raises(TomeArgsError):
        validate_request_args(args)


def test_img2img_positions_are_its_own() -> None:
    with pytest.raises(TomeArgsError, match=r"mlp_ratio \(args\[14\]\)"):
        validate_request_args([*VALID, "same"], is_img2img=True)
    with pytest.raises(TomeArgsError, match=r"preset \(args\[16\]\) must be one of"):
        validate_request_args([*VALID, -1, False, "own"], is_img2img=True)
    with pytest.raises(TomeArgsError, match=f"at most {len(IMG2IMG_ARG_NAMES)} allowed"):
        validate_request_args(full(), is_img2img=True)
    validate_request_args([*VALID, 0.5, True, "fast"], is_img2img=True)
    # a dict's hires settings are checked in img2img too (one dict for both tabs), and unused there
    with pytest.raises(TomeArgsError, match=r"hires\.ratio"):
        validate_request_args([{"hires": {"ratio": 3}}], is_img2img=True)
    job = resolve([{"ratio": 0.2, "hires": {"ratio": 0.7}}], is_img2img=True)
    assert job is not None and job.pass_config(False) == TomeConfig(ratio=0.2)


def test_every_arg_is_checked_also_when_off() -> None:
    """The script and the API check refuse the same args: a bad value is refused even with ToMe off."""
    assert resolve([False, 0.5]) is None
    with pytest.raises(TomeArgsError, match=r"ratio \(args\[1\]\)"):
        resolve([False, 5])
    with pytest.raises(TomeArgsError, match=r"dict alone when args\[0\] is a dict, got ratio \(args\[1\]\) too"):
        validate_request_args([{"ratio": 0.5}, 1])
    with pytest.raises(TomeArgsError, match="must be a list"):
        validate_request_args({"ratio": 0.5})
    validate_request_args([])
    validate_request_args([True, 0.5])


def test_after_a_dict_only_the_webui_defaults_may_follow() -> None:
    """The WebUI fills the args a request leaves out with the UI defaults; the script sees those after a dict."""
    filled = [ui_value(name, defaults()[name]) for name in ARG_NAMES]
    filled[ARG_NAMES.index("preset")] = filled[ARG_NAMES.index("hr_preset")] = UI_PRESET_DEFAULT
    assert resolve([{"preset": "fast"}, *filled[1:]]) == resolve([{"preset": "fast"}])
    with pytest.raises(TomeArgsError, match=r"got hr_mode \(args\[14\]\) too"):
        resolve([{"preset": "fast"}, *filled[1:14], "off"])
    with pytest.raises(TomeArgsError, match=r"got use_rand \(args\[5\]\) too"):
        resolve([{"preset": "fast"}, *filled[1:5], 1])  # 1 is not the checkbox's True
    with pytest.raises(TomeArgsError, match=f"got {len(ARG_NAMES) + 1} values"):
        validate_request_args([{"preset": "fast"}, *filled[1:], 0])


def test_a_preset_the_webui_filled_in_means_custom() -> None:
    """`UI_PRESET_DEFAULT` is what the speed selectors are built with, so what the WebUI fills in for a preset a
    request left out; the same name sent by the page or a client is a preset given."""
    assert UI_PRESET_DEFAULT == DEFAULT_PRESET and isinstance(UI_PRESET_DEFAULT, str)
    filled = [ui_value(name, defaults()[name]) for name in ARG_NAMES]
    given = resolve([True, *filled[1:]])
    assert given is not None and given.preset == DEFAULT_PRESET == given.hires_preset
    filled[ARG_NAMES.index("preset")] = filled[ARG_NAMES.index("hr_preset")] = UI_PRESET_DEFAULT
    left_out = resolve([True, *filled[1:]])
    assert left_out == resolve([True]) and left_out is not None and left_out.preset == "custom"
    assert resolve([True, *filled[1:]], is_img2img=False) == left_out
    img2img = [ui_value(name, defaults()[name]) for name in IMG2IMG_ARG_NAMES]
    img2img[IMG2IMG_ARG_NAMES.index("preset")] = UI_PRESET_DEFAULT
    assert resolve([True, *img2img[1:]], is_img2img=True) == resolve([True], is_img2img=True)
    assert resolve([True, *img2img[1:]], is_img2img=True).preset == "custom"
    # an infotext the API applies converts its value with the control's value's type: a new object, a preset given
    pasted = type(UI_PRESET_DEFAULT)(DEFAULT_PRESET)
    filled[ARG_NAMES.index("preset")] = pasted
    assert resolve([True, *filled[1:]]).preset == DEFAULT_PRESET


def test_xyz_overrides() -> None:
    base = [False, 0.5, "auto", 2, 2]
    assert resolve(base, {"ratio": 0.3}) == resolve([True, 0.3])  # a value axis turns ToMe on
    assert resolve([True, 0.5], {"enabled": False, "ratio": 0.3}) is None
    job = resolve([True, 0.5, "auto", 4, 4], {"hr_ratio": 0.2})
    assert job is not None and job.hires_mode == "own" and job.pass_config(True) == TomeConfig(ratio=0.2, sx=4, sy=4)
    own = [True, 0.5, "auto", 4, 4, *VALID[5:], "own", 0.6, 1, 1, 2]
    job = resolve(own, {"hr_ratio": 0.2})
    assert job is not None and job.pass_config(True) == TomeConfig(ratio=0.2, sx=1, sy=2, max_downsample=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_xyz_overrides_with_presets(family: str) -> None:
    job = resolve(full(), {"preset": "fast"})
    assert job is not None and job.pass_config(False, family) == fast(family)
    # a value axis under a preset lays the value over the preset, in both passes ("same")
    job = resolve(full(preset="fast", ratio=0.1), {"ratio": 0.3, "sx": 2})
    assert job is not None and job.changes == (("ratio", 0.3), ("sx", 2))
    assert job.pass_config(False, family) == fast(family).replace(ratio=0.3, sx=2)
    assert job.pass_config(True, family) == fast(family).replace(ratio=0.3, sx=2)
    # ... and with Custom, into the custom settings
    job = resolve(full(ratio=0.1), {"preset": "custom", "ratio": 0.3})
    assert job is not None and job.changes == () and job.first == TomeConfig(ratio=0.3)
    # a hires ratio: own custom settings following the first pass's preset
    job = resolve(full(preset="fast", hr_mode="own", hr_preset="fastest"), {"hr_ratio": 0.2})
    assert job is not None and job.pass_config(True, family) == fast(family).replace(ratio=0.2)
    job = resolve(full(preset="fast"), {"hr_preset": "quality"})
    assert job is not None and job.hires_mode == "own"
    assert job.pass_config(True, family) == get_preset("quality").config(family)


def test_config_for_skips_noop_passes() -> None:
    job = TomeJob(first=TomeConfig(ratio=0.0))
    assert job.config_for(False) is None and job.config_for(True) is None
    assert not job.may_merge(False) and not job.may_merge(True)
