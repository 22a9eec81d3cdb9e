"""TomeConfig: validation with field names in every error, derived values, the field table, immutability."""

from __future__ import annotations

import dataclasses
import math

import pytest

import tome_core
from tome_core.config import LEVELS, TomeConfig, auto_levels, field_spec, field_specs
from tome_core.plan import layout_table

FIELD_NAMES = [f.name for f in dataclasses.fields(TomeConfig)]


def test_defaults_match_tomesd_keywords() -> None:
    cfg = TomeConfig()
    assert cfg.ratio == 0.5
    assert (cfg.sx, cfg.sy) == (2, 2)
    assert cfg.use_rand is True
    assert (cfg.merge_attn, cfg.merge_crossattn, cfg.merge_mlp) == (True, False, False)
    assert cfg.max_downsample == "auto"
    assert cfg.seed is None
    assert cfg.mode == "merge"
    assert (cfg.step_start, cfg.step_end) == (0.0, 1.0)


def test_package_exports_config() -> None:
    assert tome_core.TomeConfig is TomeConfig
    assert tome_core.field_specs is field_specs
    assert tuple(tome_core.LEVELS) == (1, 2, 4, 8)


@pytest.mark.parametrize(
    ("name", "value", "exc"),
    [
        ("ratio", 1.2, ValueError),
        ("ratio", -0.1, ValueError),
        ("ratio", 0.96, ValueError),
        ("ratio", math.nan, ValueError),
        ("ratio", math.inf, ValueError),
        ("ratio", "0.5", TypeError),
        ("ratio", True, TypeError),
        ("ratio", None, TypeError),
        ("ratio", [0.5], TypeError),
        ("sx", 0, ValueError),
        ("sy", 0, ValueError),
        ("sx", 9, ValueError),
        ("sx", 1.5, ValueError),
        ("sx", "2", TypeError),
        ("sy", False, TypeError),
        ("max_downsample", 3, ValueError),
        ("max_downsample", 16, ValueError),
        ("max_downsample", 0, ValueError),
        ("max_downsample", "Auto", ValueError),
        ("max_downsample", "2", ValueError),
        ("max_downsample", True, TypeError),
        ("max_downsample", 2.5, ValueError),
        ("use_rand", 1, TypeError),
        ("use_rand", "true", TypeError),
        ("merge_attn", None, TypeError),
        ("merge_crossattn", 0, TypeError),
        ("merge_mlp", "yes", TypeError),
        ("seed", -1, ValueError),
        ("seed", 2**32, ValueError),
        ("seed", 1.5, ValueError),
        ("seed", "7", TypeError),
        ("seed", True, TypeError),
        ("mode", "fast", ValueError),
        ("mode", 1, (TypeError, ValueError)),  # wrong type for a str-choice field: either is fine
        ("matching", "nearest", ValueError),
        ("matching", None, TypeError),
        ("step_start", -0.1, ValueError),
        ("step_start", 1.5, ValueError),
        ("step_end", 1.01, ValueError),
        ("step_end", "1", TypeError),
    ],
)
def test_bad_value_raises_naming_the_field(
    name: str, value: object, exc: type[Exception] | tuple[type[Exception], ...]
) -> None:
    with pytest.raises(exc) as info:
        TomeConfig(**{name: value})
    message = str(info.value)
    assert name in message
    assert repr(value) in message or str(value) in message
    # the same through from_dict and replace
    with pytest.raises(exc, match=name):
        TomeConfig.from_dict({name: value})
    with pytest.raises(exc, match=name):
        TomeConfig().replace(**{name: value})


def test_error_message_states_allowed_range() -> None:
    with pytest.raises(ValueError) as info:
        TomeConfig(ratio=1.2)
    assert "[0, 0.95]" in str(info.value)
    with pytest.raises(ValueError) as info:
        TomeConfig(max_downsample=3)
    for choice in ("'auto'", "1", "2", "4", "8"):
        assert choice in str(info.value)


def test_step_window_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="step_start"):
        TomeConfig(step_start=0.5, step_end=0.5)
    with pytest.raises(ValueError, match="step_end"):
        TomeConfig(step_start=0.8, step_end=0.2)
    TomeConfig(step_start=0.2, step_end=0.8)


@pytest.mark.parametrize(
    ("name", "value", "normalised"),
    [
        ("ratio", 0, 0.0),
        ("ratio", 0.95, 0.95),
        ("sx", 3.0, 3),
        ("sy", 8, 8),
        ("max_downsample", 2.0, 2),
        ("max_downsample", 8, 8),
        ("max_downsample", "auto", "auto"),
        ("seed", 0, 0),
        ("seed", 2**32 - 1, 2**32 - 1),
        ("seed", None, None),
        ("mode", "kv", "kv"),
        ("matching", "global", "global"),
    ],
)
def test_good_values_are_normalised(name: str, value: object, normalised: object) -> None:
    strides = {"sx": 8, "sy": 8} if name == "ratio" else {}  # ratio 0.95 needs cells of 20 tokens or more
    got = getattr(TomeConfig(**{**strides, name: value}), name)
    assert got == normalised
    assert type(got) is type(normalised)


def test_unknown_field_via_from_dict_lists_known_fields() -> None:
    with pytest.raises(ValueError) as info:
        TomeConfig.from_dict({"ratio": 0.3, "rattio": 0.4})
    message = str(info.value)
    assert "rattio" in message
    assert "ratio" in message.split("known", 1)[-1]
    with pytest.raises(ValueError, match="bogus"):
        TomeConfig().replace(bogus=1)
    with pytest.raises(TypeError):
        TomeConfig(bogus=1)  # type: ignore[call-arg]


def test_from_dict_rejects_non_mapping() -> None:
    with pytest.raises(TypeError):
        TomeConfig.from_dict([("ratio", 0.3)])  # type: ignore[arg-type]


def test_round_trip_and_replace() -> None:
    cfg = TomeConfig(ratio=0.3, max_downsample=2, sx=3, sy=1, use_rand=False, seed=42, matching="global")
    assert TomeConfig.from_dict(cfg.to_dict()) == cfg
    assert set(cfg.to_dict()) == set(FIELD_NAMES)
    changed = cfg.replace(ratio=0.6)
    assert changed.ratio == 0.6
    assert changed.replace(ratio=0.3) == cfg
    assert cfg.ratio == 0.3  # replace does not mutate
    based = TomeConfig.from_dict({"sx": 4}, base=cfg)
    assert based.sx == 4
    assert based.seed == 42


def test_frozen() -> None:
    cfg = TomeConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.ratio = 0.7  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.new_field = 1  # type: ignore[attr-defined]
    assert hash(cfg) == hash(TomeConfig())


@pytest.mark.parametrize(
    ("ratio", "sx", "sy"),
    [(0.5, 2, 2), (0.75, 2, 2), (0.5, 2, 1), (0.0, 1, 1), (0.9, 4, 4), (0.85, 3, 3), (0.95, 8, 8)],
)
def test_a_ratio_the_strides_reach_is_what_runs(ratio: float, sx: int, sy: int) -> None:
    cfg = TomeConfig(ratio=ratio, sx=sx, sy=sy)
    assert cfg.max_ratio == pytest.approx(1 - 1 / (sx * sy))
    # Nothing is ever capped (a ratio the strides cannot reach is refused): the blocks plan the ratio as it is.
    (block,) = layout_table({1: 1}, cfg).blocks
    assert block.merges == ((("attn1", ratio),) if ratio else ())


@pytest.mark.parametrize(
    ("ratio", "sx", "sy", "maximum"),
    [(0.9, 2, 2, "0.75"), (0.95, 2, 2, "0.75"), (0.6, 2, 1, "0.5"), (0.9, 3, 3, "0.8889"), (0.3, 1, 1, "0")],
)
def test_a_ratio_the_strides_cannot_reach_is_refused(ratio: float, sx: int, sy: int, maximum: str) -> None:
    with pytest.raises(ValueError) as info:
        TomeConfig(ratio=ratio, sx=sx, sy=sy)
    message = str(info.value)
    assert f"TomeConfig.ratio={ratio}" in message and f"sx={sx}, sy={sy}" in message
    assert f"at most 1 - 1/(sx*sy) = {maximum}" in message


def test_is_noop() -> None:
    assert TomeConfig(ratio=0.0).is_noop
    assert TomeConfig(ratio=0.0, sx=1, sy=1).is_noop
    assert TomeConfig(merge_attn=False).is_noop
    assert not TomeConfig(merge_attn=False, merge_mlp=True).is_noop
    assert not TomeConfig().is_noop
    assert TomeConfig(mode="kv", sx=1, sy=1, merge_attn=False).is_noop
    assert not TomeConfig(mode="kv", ratio=0.0).is_noop  # kv ignores the ratio
    assert TomeConfig(mode="kv", merge_attn=False).is_noop
    assert not TomeConfig(mode="kv", merge_attn=False, merge_mlp=True).is_noop  # the MLP still merges
    assert TomeConfig(mode="kv", merge_attn=False, merge_mlp=True, mlp_ratio=0.0).is_noop


def test_kv_mode_gives_self_attention_no_ratio() -> None:
    assert TomeConfig(mode="kv").ratios_by_kind == {}
    assert TomeConfig(mode="kv", merge_mlp=True, mlp_ratio=0.3).ratios_by_kind == {"mlp": 0.3}
    assert TomeConfig(mode="kv", merge_crossattn=True, ratio=0.4).ratios_by_kind == {"attn": 0.4}


def test_the_plan_selects_levels() -> None:
    sd, sdxl = {1: 1, 2: 1, 4: 1, 8: 1}, {2: 1, 4: 2}  # "auto": level 1 on the first, 2 and 4 on the second
    assert layout_table(sd, TomeConfig()).selected == {1}
    assert layout_table(sdxl, TomeConfig()).selected == {2, 4}
    two = TomeConfig(max_downsample=2)
    assert layout_table(sd, two).selected == layout_table(sdxl, two).selected == {1, 2}  # explicit levels ignore auto
    assert layout_table(sdxl, TomeConfig(max_downsample=8)).selected == set(LEVELS)
    assert layout_table(sd, TomeConfig(min_downsample=2, max_downsample=4)).selected == {2, 4}
    pooled = layout_table(sd, TomeConfig(min_downsample=4, max_downsample=4, pool_kv=True))
    assert (pooled.selected, pooled.pooled) == ({4}, {1, 2, 8})


@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        ({1: 5, 2: 5, 4: 5, 8: 1}, {1}),  # SD1/SD2: 16 blocks, middle one at level 8
        ({2: 10, 4: 60}, {2, 4}),  # SDXL: no attention at level 1, most blocks at level 4
        ({1: 0, 2: 10, 4: 60}, {2, 4}),  # a level listed with no blocks does not count as first
        ({1: 3, 2: 3, 4: 4, 8: 1}, {1, 4}),
        ({4: 2}, {4}),
        ({}, set()),
    ],
)
def test_auto_levels(blocks: dict[int, int], expected: set[int]) -> None:
    assert auto_levels(blocks) == expected
    assert tome_core.auto_levels is auto_levels


def test_active_at() -> None:
    full = TomeConfig()
    assert all(full.active_at(f) for f in (0.0, 0.5, 0.999, 1.0))
    window = TomeConfig(step_start=0.25, step_end=0.5)
    assert [window.active_at(f) for f in (0.0, 0.24, 0.25, 0.4, 0.5, 0.9, 1.0)] == [
        False,
        False,
        True,
        True,
        False,
        False,
        False,
    ]


def test_field_specs_complete() -> None:
    specs = field_specs()
    assert [s.name for s in specs] == FIELD_NAMES
    defaults = TomeConfig()
    for spec in specs:
        assert spec.label.strip(), spec.name
        assert spec.help.strip(), spec.name
        assert spec.default == getattr(defaults, spec.name), spec.name
        assert spec.kind in (float, int, bool, str), spec.name
        assert spec.allowed(), spec.name
        assert field_spec(spec.name) == spec
        if spec.minimum is not None and spec.maximum is not None:
            assert spec.minimum <= spec.maximum, spec.name
        if spec.choices is not None:
            assert spec.default in spec.choices, spec.name
    with pytest.raises(KeyError):
        field_spec("nope")


def test_field_spec_ranges_are_enforced() -> None:
    """Every numeric spec's bounds are exactly what the constructor accepts."""
    for spec in field_specs():
        if spec.kind not in (int, float) or spec.choices is not None or spec.minimum is None:
            continue
        # the bounds themselves are accepted (step_start < step_end keeps the window non-empty)
        # (8x8 cells reach the largest ratio; 1x1 cells leave nothing to merge, so the ratio is 0 with them)
        strides = {"sx": 8, "sy": 8, **({"ratio": 0.0} if spec.name in ("sx", "sy") else {})}
        if spec.name != "step_end":
            assert getattr(TomeConfig(**{**strides, spec.name: spec.minimum}), spec.name) == spec.minimum
        if spec.name != "step_start":
            assert getattr(TomeConfig(**{**strides, spec.name: spec.maximum}), spec.name) == spec.maximum
        below = spec.minimum - (1 if spec.kind is int else 0.01)
        above = spec.maximum + (1 if spec.kind is int else 0.01)
        for bad in (below, above):
            with pytest.raises(ValueError, match=spec.name):
                TomeConfig(**{spec.name: bad})
