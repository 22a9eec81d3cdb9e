"""The words a user reads to choose a preset (`tome_core.presets.preset_hint`, `preset_details`): made from
`Preset.measured` and `Preset.help` alone, for the model family that runs it, and a note when the image is too small
for the preset to merge at some level (`unmerged_levels`, checked against what the patch really merges)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest
import torch

import tome_core
from tome_core import FAMILIES, Measured, TomeConfig, get_preset, presets
from tome_core.config import auto_levels
from tome_core.presets import (
    FAMILY_LABELS,
    FAMILY_LAYOUTS,
    describe_config,
    preset_details,
    preset_hint,
    preset_words,
    unmerged_levels,
)

import tiny_models

PAIRS = [(preset.name, family) for preset in presets() for family in FAMILIES]


def figures(name: str, family: str, device: str | None = "cpu") -> str:
    """The figures the hint gives for a family: on a CPU the CPU one, on CUDA the GPU one, unknown: both."""
    preset = get_preset(name)
    measured, gpu = preset.measured[family], preset.measured_gpu[family]
    cpu_words = f"about {measured.speedup:.3g}\u00d7 faster on a CPU"
    gpu_words = f"about {gpu.speedup:.3g}\u00d7 less GPU time per step on {gpu.device}"
    speed = {"cpu": cpu_words, "cuda": gpu_words, None: f"{gpu_words} ({cpu_words})"}[device]
    return f"{FAMILY_LABELS[family]}: {speed}, the image changes by about {100 * measured.deviation_natural:.2g}%"


@pytest.mark.parametrize(("name", "family"), PAIRS)
def test_the_hint_gives_the_measured_figures_of_the_loaded_family(name: str, family: str) -> None:
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


def test_the_hint_follows_the_measurements_it_is_made_from() -> None:
    """No figure is typed into the hint: another measurement, another hint."""
    fast = get_preset("fast")
    remeasured = dataclasses.replace(
        fast, measured=MappingProxyType({**fast.measured, "sd": Measured(2.5, 0.2, 0.125, "SD1.5 640 px, a test")})
    )
    assert (
        preset_hint(remeasured, "sd", device="cpu")
        == f"{preset_words(fast)}. SD1/SD2: about 2.5\u00d7 faster on a CPU, the image changes by about 12%."
    )
    on_gpu = dataclasses.replace(
        fast, measured=MappingProxyType({**fast.measured, "sd": Measured(0.9, 0.2, 0.125, "a test", "an H100")})
    )
    assert "SD1/SD2: about 0.9\u00d7 faster on an H100, the image" in preset_hint(on_gpu, "sd", device="cpu")
    assert preset_hint(remeasured, "sdxl") == preset_hint(fast, "sdxl")
    assert "measured: SD1.5 640 px, a test: 2.5\u00d7 faster, deviation 0.2 from white noise, 0.125 from" in (
        preset_details(remeasured, "sd")
    )
    unmeasured = dataclasses.replace(
        fast, measured=MappingProxyType({"sd": fast.measured["sd"]}), measured_gpu=MappingProxyType({})
    )
    assert "SDXL: not measured" in preset_hint(unmeasured)


@pytest.mark.parametrize("name", [preset.name for preset in presets()])
def test_the_words_are_the_lead_of_the_presets_help(name: str) -> None:
    words, help_text = preset_words(name), get_preset(name).help
    assert words and help_text.startswith(words) and help_text[len(words)] in ".:"
    assert ":" not in words and not words.endswith(".")


@pytest.mark.parametrize(("name", "family"), PAIRS)
def test_the_details_say_what_runs_and_where_it_was_measured(name: str, family: str) -> None:
    preset = get_preset(name)
    measured = preset.measured[family]
    details = preset_details(name, family)
    assert details.startswith(f"{FAMILY_LABELS[family]}: {describe_config(preset.config(family), family)} (measured: ")
    assert measured.setting in details and f"{measured.speedup:.3g}\u00d7" in details
    assert preset_details(name).splitlines() == [preset_details(name, f) for f in FAMILIES]


def test_too_small_to_merge_at_a_level_is_said() -> None:
    # SD1/SD2 Fast merges with 8x8 cells at level 4, Fastest at levels 2 and 4: a 96 px image has a 3x3 grid at
    # level 4 and a 6x6 one at level 2, a 256 px image an 8x8 grid at level 4 (one cell fits).
    for name, levels in (("fast", "4"), ("fastest", "2 and 4")):
        text = preset_hint(name, "sd", (96, 96))
        assert text.startswith(preset_hint(name, "sd"))
        label = get_preset(name).label
        assert text.endswith(
            f"At 96\u00d796 px the image is too small for {label} to merge tokens at level {levels} on SD1/SD2 (its"
            " 8\u00d78 cells do not fit there), so it gains less."
        )
        assert preset_hint(name, "sd", (256, 256)) == preset_hint(name, "sd")
    assert preset_hint("quality", "sd", (64, 64)) == preset_hint("quality", "sd")  # pooling needs no cell
    both = preset_hint("fastest", None, (64, 96))
    assert "on SD1/SD2 (its 8\u00d78 cells do not fit there) or at level 4 on SDXL (its 4\u00d74 cells" in both
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
