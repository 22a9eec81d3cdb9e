"""The words a user reads to choose a preset (`tome_core.presets.preset_hint`, `preset_details`): made from
`Preset.gpu`, `Preset.cpu`, `Preset.fidelity` and `Preset.help` alone, for the model family that runs it, and a note
when the image is too small for the preset to merge at some level (`unmerged_levels`, checked against what the patch
really merges). No figure of a preset is typed here: every expected text is made from the presets' data."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest
import torch

import tome_core
from tome_core import FAMILIES, Fidelity, Speed, TomeConfig, get_preset, presets
from tome_core.config import auto_levels
from tome_core.presets import (
    FAMILY_LABELS,
    FAMILY_LAYOUTS,
    REFERENCES,
    Preset,
    change_words,
    describe_config,
    preset_details,
    preset_hint,
    preset_words,
    unmerged_levels,
)

import tiny_models

PAIRS = [(preset.name, family) for preset in presets() for family in FAMILIES]
#: Where each family's figures hold at their own size: no preset may gain less there for want of room to merge.
NATIVE = {"sd": (512, 512), "sdxl": (1024, 1024)}


def gpu_words(speed: Speed) -> str:
    return f"about {speed.speedup:.3g}\u00d7 less GPU time per step on {speed.device}" + (
        "" if speed.measured else ", estimated"
    )


def cpu_words(speed: Speed) -> str:
    return f"about {speed.speedup:.3g}\u00d7 faster on {speed.device}" + ("" if speed.measured else ", estimated")


def figures(name: str, family: str, device: str | None = "cpu") -> str:
    """The figures the hint gives for a family: on a CPU the CPU one, on CUDA the GPU one, unknown: both; then the
    change beside the preset's reference."""
    preset = get_preset(name)
    gpu = gpu_words(preset.gpu[family])
    if family in preset.cpu:
        cpu = cpu_words(preset.cpu[family])
        speed = {"cpu": cpu, "cuda": gpu, None: f"{gpu} ({cpu})"}[device]
    else:  # no CPU figure: the GPU one on any device
        speed = gpu
    return f"{FAMILY_LABELS[family]}: {speed}; changes the image {change_words(preset.fidelity[family])}"


@pytest.mark.parametrize(("name", "family"), PAIRS)
def test_the_hint_gives_the_figures_of_the_loaded_family(name: str, family: str) -> None:
    text = preset_hint(name, family, device="cpu")
    assert text == f"{preset_words(name)}. {figures(name, family)}."
    assert preset_hint(name, family, device="cuda") == f"{preset_words(name)}. {figures(name, family, 'cuda')}."
    assert preset_hint(name, family) == f"{preset_words(name)}. {figures(name, family, None)}."
    other = next(f for f in FAMILIES if f != family)
    assert FAMILY_LABELS[other] not in text  # the other family only when the loaded one is unknown


@pytest.mark.parametrize("name", [preset.name for preset in presets()])
def test_without_a_family_the_hint_gives_every_family(name: str) -> None:
    assert preset_hint(name, device="cpu") == f"{preset_words(name)}. {figures(name, 'sd')}; {figures(name, 'sdxl')}."
    assert preset_hint(get_preset(name)) == preset_hint(name)


@pytest.mark.parametrize(("name", "family"), PAIRS)
def test_the_change_is_stated_against_the_reference_on_a_stand_in(name: str, family: str) -> None:
    """A preset's change is never a bare figure: it names the reference users know (tomesd's or ToDo's default)
    and says it was measured on a stand-in model; an estimated GPU figure says so."""
    preset = get_preset(name)
    held, gpu = preset.fidelity[family], preset.gpu[family]
    assert held.reference in REFERENCES and "stand-in" in held.setting
    words = change_words(held)
    assert held.reference in words and words.endswith("stand-in model)")
    on_gpu = preset_hint(name, family, device="cuda")
    assert f"changes the image {words}" in on_gpu
    assert ("estimated" in on_gpu) == (not gpu.measured)


def test_the_change_words_follow_the_ratio() -> None:
    """About as much within 3%, else less (with the factor) or the factor as much, beside the reference named; in
    one step and, where measured, over a whole generation, each as measured (a preset can rank differently)."""
    for reference in REFERENCES:
        same, less, more = (Fidelity(reference, change, "stand-in, a test") for change in (1.02, 0.5, 2.0))
        assert change_words(same) == f"about as much as {reference} (stand-in model)"
        assert change_words(less) == f"less than {reference} (0.50\u00d7 its change, stand-in model)"
        assert change_words(more) == f"2.00\u00d7 as much as {reference} (stand-in model)"
        both = Fidelity(reference, 0.99, "stand-in, a test", generation=1.01)
        assert change_words(both) == (
            f"about as much as {reference}, in one step and over a whole generation (stand-in model)"
        )
        split = Fidelity(reference, 0.94, "stand-in, a test", generation=1.24)
        assert change_words(split) == (
            f"less than {reference} (0.94\u00d7 its change) in one step, 1.24\u00d7 as much over a whole generation"
            " (stand-in model)"
        )
        level = Fidelity(reference, 1.5, "stand-in, a test", generation=1.02)
        assert change_words(level) == (
            f"1.50\u00d7 as much as {reference} in one step, about as much over a whole generation (stand-in model)"
        )


def test_the_hint_follows_the_figures_it_is_made_from() -> None:
    """No figure is typed into the hint: other figures, another hint."""
    fast = get_preset("fast")
    reference = next(iter(REFERENCES))
    refigured = dataclasses.replace(
        fast,
        cpu=MappingProxyType({**fast.cpu, "sd": Speed(2.5, "SD1.5 640 px, a test", "a CPU")}),
        gpu=MappingProxyType({**fast.gpu, "sd": Speed(3.0, "a GPU test", "an H100", measured=False)}),
        fidelity=MappingProxyType({**fast.fidelity, "sd": Fidelity(reference, 0.5, "stand-in SD1.5, a test")}),
    )
    change = f"changes the image less than {reference} (0.50\u00d7 its change, stand-in model)"
    assert preset_hint(refigured, "sd", device="cpu") == (
        f"{preset_words(fast)}. SD1/SD2: about 2.5\u00d7 faster on a CPU; {change}."
    )
    assert preset_hint(refigured, "sd", device="cuda") == (
        f"{preset_words(fast)}. SD1/SD2: about 3\u00d7 less GPU time per step on an H100, estimated; {change}."
    )
    measured = dataclasses.replace(refigured, gpu=MappingProxyType({"sd": Speed(3.0, "a GPU test", "an H100")}))
    assert "SD1/SD2: about 3\u00d7 less GPU time per step on an H100; " in preset_hint(measured, "sd", device="cuda")
    assert preset_hint(refigured, "sdxl") == preset_hint(fast, "sdxl")
    details = preset_details(refigured, "sd")
    assert f"change beside {REFERENCES[reference]}: 0.5\u00d7, measured on a stand-in SD1.5, a test" in details
    assert "3\u00d7 less GPU time, estimated: a GPU test" in details
    assert "2.5\u00d7 faster, measured: SD1.5 640 px, a test" in details
    unmeasured = dataclasses.replace(
        fast,
        fidelity=MappingProxyType({"sd": fast.fidelity["sd"]}),
        gpu=MappingProxyType({}),
        cpu=MappingProxyType({}),
    )
    assert "SDXL: not measured" in preset_hint(unmeasured)
    assert "SD1/SD2: not measured" not in preset_hint(unmeasured)


@pytest.mark.parametrize("name", [preset.name for preset in presets()])
def test_the_words_are_the_lead_of_the_presets_help(name: str) -> None:
    words, help_text = preset_words(name), get_preset(name).help
    assert words and help_text.startswith(words) and help_text[len(words)] in ".:"
    assert ":" not in words and not words.endswith(".")


@pytest.mark.parametrize(("name", "family"), PAIRS)
def test_the_details_say_what_runs_and_where_it_was_measured(name: str, family: str) -> None:
    """What runs, then each figure with where it comes from: the change beside the reference (in full) on the
    stand-in, the GPU and the CPU speed-up, measured or estimated, each with its run."""
    preset = get_preset(name)
    held = preset.fidelity[family]
    details = preset_details(name, family)
    assert details.startswith(
        f"{FAMILY_LABELS[family]}: {describe_config(preset.config(family), family)} (change beside"
        f" {REFERENCES[held.reference]}: {held.change:.3g}\u00d7"
        + ("" if held.generation is None else f" in one step, {held.generation:.3g}\u00d7 in a whole generation")
        + f", measured on a {held.setting}"
    )
    for speed, gain in ((preset.gpu[family], "less GPU time"), (preset.cpu.get(family), "faster")):
        if speed is None:
            continue
        how = "measured" if speed.measured else "estimated"
        assert f"{speed.speedup:.3g}\u00d7 {gain}, {how}: {speed.setting}" in details
    assert preset_details(name).splitlines() == [preset_details(name, f) for f in FAMILIES]


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
            plain = preset_hint(preset, family)
            for size in SMALL:
                note = too_small(preset, (family,), size)
                assert preset_hint(preset, family, size) == plain + note, (preset.name, family, size)
                noted += bool(note)
            assert preset_hint(preset, family, NATIVE[family]) == plain, (preset.name, family)
    assert noted  # a 32 px image has one token at level 4: any preset that merges there says so
    # Both families, as when no model is loaded: one sentence, the families joined.
    fastest = get_preset("fastest")
    both = [size for size in SMALL if all(unmerged_levels(fastest.config(f), f, *size) for f in FAMILIES)]
    assert both
    text = preset_hint(fastest, None, both[0])
    assert text == preset_hint(fastest) + too_small(fastest, FAMILIES, both[0]) and " or at level " in text
    # Pooling keys/values needs no cell: a preset that only pools never says it.
    pooling = dataclasses.replace(
        fastest, families=MappingProxyType({f: {"mode": "kv", "sx": 4, "sy": 4} for f in FAMILIES})
    )
    assert preset_hint(pooling, None, (32, 32)) == preset_hint(pooling)
    with pytest.raises(ValueError, match="model family"):
        preset_hint("fast", "flux")


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
