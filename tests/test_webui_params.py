"""The script's args (the API contract): positional order, the dict form, short lists, and clear errors."""

from __future__ import annotations

from typing import Any

import pytest

from tome_core import TomeConfig, field_specs
from tome_webui import params
from tome_webui.params import ARG_NAMES, IMG2IMG_ARG_NAMES, TomeArgsError, TomeJob, resolve, validate_request_args

#: The documented positional order. Changing it breaks API callers: update README/docs with it.
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
)


#: Valid first-pass args (img2img's full list), to put a bad hires value after.
VALID = [True, 0.5, "auto", 2, 2, True, True, False, False, -1, "merge", "local", 0, 1]


def test_positional_order_is_the_documented_one() -> None:
    assert ARG_NAMES == DOCUMENTED_ORDER
    assert ARG_NAMES[1 : 1 + len(field_specs())] == tuple(s.name for s in field_specs())
    assert DOCUMENTED_ORDER[: DOCUMENTED_ORDER.index("hr_mode")] == IMG2IMG_ARG_NAMES
    assert params.__doc__ is not None and ", ".join(DOCUMENTED_ORDER[:5]) in " ".join(params.__doc__.split())


def test_defaults_are_off_and_the_config_defaults() -> None:
    assert resolve([]) is None
    assert resolve([True]) == TomeJob(first=TomeConfig(), hires_mode="same", hires=TomeConfig())
    values = params.defaults()
    assert values["enabled"] is False and values["hr_mode"] == "same"
    assert all(values[s.name] == s.default for s in field_specs())


def test_positional_values_as_the_ui_and_json_send_them() -> None:
    ui = [True, 0.6, "2", 3, 1, False, True, True, False, 1234, "merge", "global", 0.1, 0.9, "own", 0.4, "auto", 2, 2]
    job = resolve(ui)
    assert job is not None
    assert job.first == TomeConfig(
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
    )
    assert job.hires_mode == "own"
    assert job.hires == job.first.replace(ratio=0.4, max_downsample="auto", sx=2, sy=2)
    # JSON-ish variants: numbers as strings, "true"/"false", labels, -1/None seed, 2.0 for ints
    loose = [
        "true",
        "0.6",
        2.0,
        "3",
        1.0,
        "False",
        "TRUE",
        1,
        0,
        "1234",
        "Merge",
        "GLOBAL",
        "0.1",
        "0.9",
        "Own settings",
        "0.4",
        "Auto",
        "2",
        2,
    ]
    assert resolve(loose) == job
    for seed in (-1, None, "-1", "none"):
        job = resolve([True, *ui[1:9], seed])
        assert job is not None and job.first.seed is None


def test_short_lists_keep_the_defaults() -> None:
    assert resolve([True, 0.3]) == TomeJob(first=TomeConfig(ratio=0.3), hires_mode="same", hires=TomeConfig(ratio=0.3))
    job = resolve([True, 0.3, *VALID[2:], "off"])
    assert job is not None and job.hires is None and job.config_for(True) is None


def test_hires_modes_and_img2img() -> None:
    own = resolve([True, 0.0, *VALID[2:], "own", 0.5])
    assert own is not None
    assert own.config_for(False) is None  # ratio 0: only the hires pass merges
    assert own.config_for(True) == TomeConfig(ratio=0.5)
    img2img = resolve([True, 0.4], is_img2img=True)
    assert img2img is not None and img2img.config_for(False) == img2img.config_for(True) == TomeConfig(ratio=0.4)


def test_dict_form() -> None:
    job = resolve([{"ratio": 0.6, "sx": 4, "sy": 4, "max_downsample": "auto", "merge_mlp": True}])
    assert job == TomeJob(
        first=TomeConfig(ratio=0.6, sx=4, sy=4, merge_mlp=True),
        hires_mode="same",
        hires=TomeConfig(ratio=0.6, sx=4, sy=4, merge_mlp=True),
    )
    job = resolve([{"enabled": True, "ratio": 0.6, "sx": 4, "hires": {"ratio": 0.7}}])
    assert job is not None and job.hires == TomeConfig(ratio=0.7, sx=4)  # missing hires keys follow the first pass
    job = resolve([{"hires": "off"}])
    assert job is not None and job.hires is None and job.hires_mode == "off"
    assert resolve([{"enabled": False, "ratio": 0.6}]) is None
    assert resolve([{"enabled": "false"}]) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([True, 5], "ratio (args[1]) must be a number in [0, 0.95], got 5"),
        ([True, 0.5, "auto", "two"], "sx (args[3]) must be an integer in [1, 8], got 'two'"),
        ([True, 0.5, "auto", 2.5], "sx (args[3]) must be an integer in [1, 8], got 2.5"),
        ([True, 0.5, 3], "max_downsample (args[2]) must be one of 'auto', 1, 2, 4, 8, got 3"),
        ([True, 0.5, "auto", 2, 2, "yes"], "use_rand (args[5]) must be true or false, got 'yes'"),
        ([True, *[0.5, "auto", 2, 2, True, True, False, False], -2], "seed (args[9]) must be an integer in"),
        ([True, *[0.5, "auto", 2, 2, True, True, False, False, -1], "fast"], "mode (args[10]) must be one of 'merge'"),
        (
            [True, *[0.5, "auto", 2, 2, True, True, False, False, -1, "merge", "local", 0.6, 0.5]],
            "step_start must be less",
        ),
        (["on"], "enabled (args[0]) must be true or false, got 'on'"),
        ([True, float("nan")], "ratio (args[1]) must be a number in [0, 0.95]"),
        ([*VALID, "sometimes"], "hr_mode (args[14]) must be one of 'same', 'own', 'off'"),
        ([*VALID, "own", 1.5], "hr_ratio (args[15])"),
        ([True] * 20, "args has 20 values, at most 19 allowed"),
        ([{"ratio": 5}], "ratio must be a number in [0, 0.95], got 5"),
        ([{"sx": "two"}], "sx must be an integer in [1, 8], got 'two'"),
        ([{"foo": 1}], "args[0] has unknown field(s) 'foo'; allowed: enabled, ratio"),
        (
            [{"hires": {"ratio": 0.5, "merge_mlp": True}}],
            "hires has unknown field(s) 'merge_mlp'; allowed: ratio, max_downsample, sx, sy",
        ),
        ([{"hires": {"ratio": 2}}], "hires.ratio must be a number in [0, 0.95], got 2"),
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


def test_disabled_skips_the_other_args_unless_strict() -> None:
    assert resolve([False, 5]) is None
    with pytest.raises(TomeArgsError, match="ratio"):
        resolve([False, 5], strict=True)
    with pytest.raises(TomeArgsError, match="dict alone"):
        validate_request_args([{"ratio": 0.5}, 1])
    with pytest.raises(TomeArgsError, match="must be a list"):
        validate_request_args({"ratio": 0.5})
    validate_request_args([])
    validate_request_args([True, 0.5])


def test_xyz_overrides() -> None:
    base = [False, 0.5, "auto", 2, 2]
    assert resolve(base, {"ratio": 0.3}) == resolve([True, 0.3])  # a value axis turns ToMe on
    assert resolve([True, 0.5], {"enabled": False, "ratio": 0.3}) is None
    job = resolve([True, 0.5, "auto", 4, 4], {"hr_ratio": 0.2})
    assert job is not None and job.hires_mode == "own" and job.hires == TomeConfig(ratio=0.2, sx=4, sy=4)
    own = [True, 0.5, "auto", 4, 4, *VALID[5:], "own", 0.6, 1, 1, 2]
    job = resolve(own, {"hr_ratio": 0.2})
    assert job is not None and job.hires == TomeConfig(ratio=0.2, sx=1, sy=2, max_downsample=1)


def test_config_for_skips_noop_passes() -> None:
    job = TomeJob(first=TomeConfig(ratio=0.0), hires_mode="same", hires=TomeConfig(ratio=0.0))
    assert job.config_for(False) is None and job.config_for(True) is None
