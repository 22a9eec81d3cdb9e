"""The words a user reads to choose a preset (`tome_core.words.preset_hint`, `speed_words`, `change_words`,
`preset_details`): made from the speed table (`tome_core.figures`), `Preset.fidelity` and `Preset.help` alone, for the
model family that runs it, at the size the user generates (and the hires pass's), and a note when the image is too
small for the preset to merge at some level (`unmerged_levels`, checked against what the patch really merges). No
figure of a preset is typed here: every expected text is made from the presets' data and the table."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import pytest
import torch

import tome_core
from tome_core import ALL_FAMILIES, FAMILIES, Fidelity, TomeConfig, figures, get_preset, presets
from tome_core.config import auto_levels
from tome_core.presets import REFERENCES, Preset
from tome_core.words import (
    FAMILY_LABELS,
    FAMILY_LAYOUTS,
    TYPICAL_SIZES,
    change_words,
    describe_config,
    preset_details,
    preset_hint,
    preset_words,
    speed_words,
    unmerged_levels,
)

import tiny_models

PAIRS = [(preset.name, family) for preset in presets() for family in FAMILIES]
ALL_PAIRS = [(preset.name, family) for preset in presets() for family in ALL_FAMILIES]
#: Where each family's figures hold at their own size: no preset may gain less there for want of room to merge.
NATIVE = {"sd": (512, 512), "sdxl": (1024, 1024)}
#: Words no user should have to decode (issue 44).
UNREADABLE = ("stand-in", "standin", "\u00d7 less", "x less", "one step")


def figure(family: str, name: str, size: tuple[int, ...], *, first: bool = True) -> str | None:
    """The table's figure for a preset at a size, as the hint states it (None where the table has none)."""
    found = figures.speed(family, name, *size)
    if found is None:
        return None
    bound = f"{found.bound} " if found.bound else "about " if first else ""
    config = get_preset(name).config(family)
    # A preset that reduces only some steps (a DiT's step window) has a whole generation's figure.
    per = "per step" if (config.step_start, config.step_end) == (0.0, 1.0) else "over a generation"
    where = f"{per} at {size[0]}\u00d7{size[1]}" if first else f"in the {size[0]}\u00d7{size[1]} hires pass"
    if round(found.speedup, 2) < 1:  # a slowdown (a diffusion transformer on few tokens): said as one, bound swapped
        bound = {"at most ": "at least ", "at least ": "at most "}.get(bound, bound)
        return f"{bound}{1 / found.speedup:.2f}\u00d7 slower {where}"
    return f"{bound}{found.speedup:.2f}\u00d7 {'faster ' if first else ''}{where}"


def family_words(name: str, family: str, size: tuple[int, int] | None = None, hires: Any = None) -> str:
    """What the hint says for one family: its label, the speed-up (from `speed_words`), the change."""
    speed = speed_words(name, family, size, hires)
    held = get_preset(name).fidelity.get(family)
    change = f"changes the image {change_words(held)}" if held is not None else "its change not measured yet"
    return f"{FAMILY_LABELS[family]}: {'; '.join(t for t in (speed, change) if t)}"


@pytest.mark.parametrize(("name", "family"), PAIRS)
def test_the_hint_gives_the_figures_of_the_loaded_family(name: str, family: str) -> None:
    text = preset_hint(name, family)
    assert text == f"{preset_words(name)}. {family_words(name, family)}."
    typical = figure(family, name, TYPICAL_SIZES[family][:2])
    assert typical is not None and typical in text  # without a size: the family's typical size
    other = next(f for f in FAMILIES if f != family)
    assert FAMILY_LABELS[other] not in text  # the other family only when the loaded one is unknown


@pytest.mark.parametrize("name", [preset.name for preset in presets()])
def test_without_a_family_the_hint_gives_every_unet_family(name: str) -> None:
    assert preset_hint(name) == f"{preset_words(name)}. {family_words(name, 'sd')}; {family_words(name, 'sdxl')}."
    assert preset_hint(get_preset(name)) == preset_hint(name)


@pytest.mark.parametrize(("name", "family"), ALL_PAIRS)
@pytest.mark.parametrize("side", [512, 768, 1024])
def test_the_figures_are_the_tables_at_each_size_and_hires_target(name: str, family: str, side: int) -> None:
    """Issue 44: the speed-up at the size the user generates and in the hires pass at its target, per family, as
    the speed table says (interpolated between its sizes, a bound outside them); no figure where it has none."""
    size, target = (side, side), (2 * side, 2 * side)
    text = preset_hint(name, family, size)
    first = figure(family, name, size)
    if first is None:
        assert "faster per step" not in text and "faster over a generation" not in text
    else:
        assert first in text and figures.speed(family, name, *size).source.device in text  # type: ignore[union-attr]
    with_hires = preset_hint(name, family, size, hires=target)
    second = figure(family, name, target, first=False)
    if first is not None and second is not None:
        assert f"{first}, {second}" in with_hires
        sources = [figures.speed(family, name, *s).source for s in (size, target)]  # type: ignore[union-attr]
        assert ("estimated" in with_hires) == (not all(source.measured for source in sources))
    assert not any(word in with_hires for word in UNREADABLE)


def test_the_issues_balanced_case() -> None:
    """Balanced on SD1.5 at 512 px with a 1024 px hires pass: the 512 px figure first (not the 1024 px one), the
    hires figure after it, the change in plain words."""
    text = preset_hint("balanced", "sd", (512, 512), hires=(1024, 1024))
    small, large = figures.speed("sd", "balanced", 512, 512), figures.speed("sd", "balanced", 1024, 1024)
    assert small is not None and large is not None and small.speedup < large.speedup
    assert f"about {small.speedup:.2f}\u00d7 faster per step at 512\u00d7512" in text
    assert f"{large.speedup:.2f}\u00d7 in the 1024\u00d71024 hires pass" in text
    assert "tomesd's default" in text and not any(word in text for word in UNREADABLE)


@pytest.mark.parametrize(("name", "family"), PAIRS)
def test_the_change_is_stated_against_the_reference_in_plain_words(name: str, family: str) -> None:
    """A preset's change is never a bare figure: it names the reference users know (tomesd's or ToDo's default),
    without the lab's words."""
    held = get_preset(name).fidelity[family]
    assert held.reference in REFERENCES
    words = change_words(held)
    assert held.reference in words and not any(word in words for word in UNREADABLE)
    assert f"changes the image {words}" in preset_hint(name, family)


def test_the_change_words_follow_the_ratio() -> None:
    """About as much within 15%, else less or more than the reference with the factor; over a whole generation
    where it was measured (what the user sees), else the one call."""
    for reference in REFERENCES:
        same, less, more = (Fidelity(reference, change, "a test") for change in (1.1, 0.5, 2.0))
        assert change_words(same) == f"about as much as {reference}"
        assert change_words(less) == f"less than {reference} (0.5\u00d7 its change)"
        assert change_words(more) == f"more than {reference} (2.0\u00d7 its change)"
        assert change_words(Fidelity(reference, 0.5, "a test", generation=1.24)) == (
            f"more than {reference} (1.2\u00d7 its change)"
        )
        assert change_words(Fidelity(reference, 1.5, "a test", generation=1.02)) == f"about as much as {reference}"


def fake_table(monkeypatch: pytest.MonkeyPatch, rows: dict[tuple[str, str, int], float], measured: bool) -> None:
    """Replace the speed table `tome_core.figures` reads by `rows` ((family, preset, side) -> speed-up)."""
    source = figures.Source("an H100", measured, "a test")
    table: dict[tuple[str, str], list[tuple[tuple[int, int, int], float, str]]] = {}
    for (family, name, side), speedup in rows.items():
        table.setdefault((family, name), []).append(((side, side, 1), speedup, "test"))
    fake = figures._Table(
        MappingProxyType({"test": source}),
        MappingProxyType({key: tuple(sorted(value)) for key, value in table.items()}),
    )
    monkeypatch.setattr(figures, "_table", lambda path=figures.TABLE: fake)


def test_the_hint_follows_the_figures_it_is_made_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """No figure is typed into the hint: another table, another hint; between two sizes of it the figure is
    interpolated in the log of the tokens, outside them it is a bound."""
    fake_table(monkeypatch, {("sd", "fast", 512): 2.5, ("sd", "fast", 1024): 3.0}, measured=False)
    text = preset_hint("fast", "sd", (512, 512), hires=(1024, 1024))
    assert "about 2.50\u00d7 faster per step at 512\u00d7512, 3.00\u00d7 in the 1024\u00d71024 hires pass" in text
    assert "(an H100, estimated)" in text
    middle = figures.speed("sd", "fast", 724, 724)
    assert middle is not None and 2.5 < middle.speedup < 3.0 and middle.exact
    assert "at most 2.50\u00d7" in preset_hint("fast", "sd", (256, 256))
    assert "at least 3.00\u00d7" in preset_hint("fast", "sd", (2048, 2048))
    assert "faster per step" not in preset_hint("fast", "sdxl")  # no row: no speed claimed
    fake_table(monkeypatch, {("sd", "fast", 512): 2.5}, measured=True)
    assert "(an H100, measured)" in preset_hint("fast", "sd", (512, 512))
    fast = get_preset("fast")
    reference = next(iter(REFERENCES))
    refigured = dataclasses.replace(
        fast, fidelity=MappingProxyType({**fast.fidelity, "sd": Fidelity(reference, 0.5, "a test")})
    )
    assert f"changes the image less than {reference} (0.5\u00d7 its change)" in preset_hint(refigured, "sd")
    unmeasured = dataclasses.replace(fast, fidelity=MappingProxyType({"sd": fast.fidelity["sd"]}))
    assert "SDXL: its change not measured yet" in preset_hint(unmeasured)


@pytest.mark.parametrize("name", [preset.name for preset in presets()])
def test_the_words_are_the_lead_of_the_presets_help(name: str) -> None:
    words, help_text = preset_words(name), get_preset(name).help
    assert words and help_text.startswith(words) and help_text[len(words)] in ".:"
    assert ":" not in words and not words.endswith(".")


@pytest.mark.parametrize(("name", "family"), ALL_PAIRS)
def test_the_details_say_what_runs_and_where_the_figures_come_from(name: str, family: str) -> None:
    """What runs (`describe_config`), then the speed-up at each size of the table with where it comes from."""
    preset = get_preset(name)
    details = preset_details(name, family)
    assert details.startswith(f"{FAMILY_LABELS[family]}: {describe_config(preset.config(family), family)}")
    for size in figures.sizes(family, name):
        found = figures.speed(family, name, *size)
        assert found is not None and f"{found.speedup:.2f}\u00d7 at {size[0]}\u00d7{size[1]}" in details
    assert preset_details(name).splitlines() == [preset_details(name, f) for f in FAMILIES]


@pytest.mark.parametrize("family", [f for f in ALL_FAMILIES if f not in FAMILIES])
def test_a_diffusion_transformer_family_has_its_own_words(family: str) -> None:
    """Flux, Wan, ...: the hint names the family, the details say keys/values are subsampled in blocks (no UNet
    level), and no figure is claimed where the table has none."""
    for preset in presets():
        text = preset_hint(preset, family, (1024, 1024))
        assert FAMILY_LABELS[family] in text
        # A figure under 1x reads "1.01× slower" (Wan's Quality on a single 1024² frame): a claim as much as faster.
        claimed = any(
            f"{how} {per}" in text for how in ("faster", "slower") for per in ("per step", "over a generation")
        )
        assert claimed == (figures.speed(family, preset.name, 1024, 1024) is not None)
        details = describe_config(preset.config(family), family)
        assert "keys/values" in details and "block" in details and "downsample" not in details


def too_small(preset: Preset, families: tuple[str, ...], size: tuple[int, int]) -> str:
    """The note `preset_hint` adds at `size`: the levels `unmerged_levels` names per family, and why."""
    where = []
    for family in families:
        config = preset.config(family)
        levels = unmerged_levels(config, family, *size)
        if levels:
            # A level's grid rounds up from the latent (pixels / 8); a whole cell fits, or the ratio is too small.
            grids = [(-(-size[1] // 8 // level), -(-size[0] // 8 // level)) for level in levels]
            fits = all(h >= config.sy and w >= config.sx for h, w in grids)
            why = (
                "its ratio merges no token there"
                if fits
                else f"its {config.sx}\u00d7{config.sy} cells do not fit there"
            )
            where.append(f"at level {' and '.join(map(str, levels))} on {FAMILY_LABELS[family]} ({why})")
    if not where:
        return ""
    return (
        f" At {size[0]}\u00d7{size[1]} px the image is too small for {preset.label} to merge tokens"
        f" {' or '.join(where)}, so it gains less."
    )


SMALL = [(side, side) for side in (32, 48, 64, 96, 128, 192, 256)] + [(64, 96), (96, 512), (512, 64)]


def test_too_small_to_merge_at_a_level_is_said() -> None:
    noted = 0
    for preset in presets():
        for family in FAMILIES:
            for size in SMALL:
                note = too_small(preset, (family,), size)
                plain = f"{preset_words(preset)}. {family_words(preset.name, family, size)}."
                assert preset_hint(preset, family, size) == plain + note, (preset.name, family, size)
                noted += bool(note)
            native = NATIVE[family]
            assert preset_hint(preset, family, native) == (
                f"{preset_words(preset)}. {family_words(preset.name, family, native)}."
            ), (preset.name, family)
    assert noted  # a 32 px image has one token at level 4: any preset that merges there says so
    # Both families, as when no model is loaded: one sentence, the families joined.
    fastest = get_preset("fastest")
    both = [size for size in SMALL if all(unmerged_levels(fastest.config(f), f, *size) for f in FAMILIES)]
    assert both
    text = preset_hint(fastest, None, both[0])
    assert text.endswith(too_small(fastest, FAMILIES, both[0])) and " or at level " in text
    # Pooling keys/values needs no cell: a preset that only pools never says it.
    pooling = dataclasses.replace(
        fastest, families=MappingProxyType({f: {"mode": "kv", "sx": 4, "sy": 4} for f in FAMILIES})
    )
    assert "too small" not in preset_hint(pooling, None, (32, 32))
    with pytest.raises(ValueError, match="model family"):
        preset_hint("fast", "hidream")


@pytest.mark.parametrize(
    ("kind", "family", "config"),
    [
        ("ldm_sd1", "sd", get_preset("fast").config("sd")),
        ("ldm_sd1", "sd", get_preset("fastest").config("sd")),
        ("ldm_sd1", "sd", TomeConfig(ratio=0.5, sx=4, sy=2, max_downsample=2)),
        ("diffusers_sdxl", "sdxl", TomeConfig(ratio=0.5, sx=4, sy=4)),
        ("diffusers_sdxl", "sdxl", TomeConfig(ratio=0.5, sx=2, sy=4, merge_crossattn=True)),
    ],
)
@pytest.mark.parametrize(("height", "width"), [(64, 64), (64, 128), (128, 128), (64, 192)])
def test_unmerged_levels_are_those_the_patch_leaves_unmerged(
    kind: str, family: str, config: TomeConfig, height: int, width: int
) -> None:
    """A tiny UNet with the family's levels (its blocks per level differ), patched and run at the size: the blocks
    that merged are the selected ones but those at the levels `unmerged_levels` names (merge mode: a block that
    merges nothing does nothing)."""
    unet = tiny_models.build_unet(kind)
    layout = tome_core.blocks_per_level(unet)
    assert auto_levels(layout) == auto_levels(FAMILY_LAYOUTS[family]) and config.mode == "merge"
    tome_core.apply_patch(unet, config)
    with torch.no_grad():
        tiny_models.forward_unet(unet, tiny_models.make_inputs(batch=1, height=height // 8, width=width // 8))
    stats = tome_core.stats(unet)
    assert stats is not None
    unmerged = unmerged_levels(config, family, width, height)
    assert stats.applied == stats.selected - sum(layout[level] for level in unmerged)
