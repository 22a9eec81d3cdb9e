"""The library's preset API: `presets()`, `get_preset`, `model_family` and `apply_patch(model, preset=...)`."""

from __future__ import annotations

import itertools

import pytest
import torch

import tome_core
from tome_core import TomeConfig, figures

from tiny_models import PipelineLike, WebUILike, build_unet, forward, make_inputs

FAMILY = {"ldm_sd1": "sd", "ldm_sd2": "sd", "diffusers_sd1": "sd", "diffusers_sdxl": "sdxl"}


def test_presets_are_named_and_ordered() -> None:
    names = [p.name for p in tome_core.presets()]
    assert names == ["quality", "balanced", "fast", "fastest"]
    assert tome_core.DEFAULT_PRESET in names
    for preset in tome_core.presets():
        assert preset.label and preset.help
        for family in tome_core.ALL_FAMILIES:  # every family resolves, the diffusion transformers' too
            assert not preset.config(family).is_noop


def table_sizes(family: str) -> list[tuple[int, int, int]]:
    """The sizes the speed table holds for every preset of a family (`tome_core.figures`)."""
    listed = [set(figures.sizes(family, p.name)) for p in tome_core.presets()]
    return sorted(set.intersection(*listed), key=lambda size: size[0] * size[1] * size[2])


@pytest.mark.parametrize("family", tome_core.FAMILIES)
def test_each_family_is_a_ladder(family: str) -> None:
    # From Quality to Fastest each preset takes less GPU time than the one before, and every one less than the
    # unpatched model, at every size of the speed table. Each is held to a reference users know
    # (`Preset.fidelity`): Quality to ToDo's default, the others to tomesd's; where two share a reference, the faster
    # changes the image more. Changes beside different references are not compared.
    listed = list(tome_core.presets())
    sizes = table_sizes(family)
    assert sizes, f"the speed table has no size for every preset of {family}"
    for size in sizes:
        gpu = [figures.speed(family, p.name, *size) for p in listed]
        assert all(found is not None and found.exact for found in gpu)
        for slower, faster in itertools.pairwise(gpu):
            assert faster.speedup > slower.speedup, (size, slower, faster)
        assert gpu[0].speedup > 1.0
    held = {p.name: p.fidelity[family] for p in listed}
    assert held["quality"].reference == "ToDo's default"
    assert held["balanced"].reference == "tomesd's default"
    for before, after in itertools.combinations(listed, 2):
        first, second = held[before.name], held[after.name]
        if first.reference == second.reference:
            assert second.change > first.change, (before.name, first, after.name, second)
    assert len({h.setting for h in held.values()}) == 1  # one run, side by side: changes that compare


@pytest.mark.parametrize("family", tome_core.FAMILIES)
def test_the_default_is_dominated_by_no_other_preset(family: str) -> None:
    # Among the presets held to the default's reference, none takes no more GPU time and changes the image no more.
    # At every size of the speed table.
    default = tome_core.get_preset(tome_core.DEFAULT_PRESET)
    for size in table_sizes(family):
        ours = figures.speed(family, default.name, *size)
        for preset in tome_core.presets():
            if preset.name == default.name or preset.fidelity[family].reference != default.fidelity[family].reference:
                continue
            theirs = figures.speed(family, preset.name, *size)
            assert ours is not None and theirs is not None
            dominates = (
                theirs.speedup >= ours.speedup and preset.fidelity[family].change <= default.fidelity[family].change
            )
            assert not dominates, (preset.name, size)


def test_faster_presets_merge_more_on_sdxl() -> None:
    # Each step up merges at least the kinds of module of the one before, the feed-forward at a rising ratio.
    configs = [p.config("sdxl") for p in tome_core.presets()]
    kinds = [set(c.ratios_by_kind) for c in configs]
    assert all(a <= b for a, b in itertools.pairwise(kinds))
    assert "mlp" in kinds[-1]
    mlp = [c.ratios_by_kind.get("mlp", 0.0) for c in configs]
    assert mlp == sorted(mlp) and len(set(mlp)) == len(mlp)


@pytest.mark.parametrize("name", ["", "Fast", "turbo", None])
def test_unknown_preset_names_the_known_ones(name: object) -> None:
    with pytest.raises(ValueError, match="preset must be one of 'quality', 'balanced', 'fast', 'fastest'"):
        tome_core.get_preset(name)  # type: ignore[arg-type]


def test_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="model family must be one of 'sd', 'sdxl', 'flux'"):
        tome_core.get_preset("fast").config("hidream")


@pytest.mark.parametrize("kind", list(FAMILY))
def test_model_family(kind: str) -> None:
    unet = build_unet(kind)
    assert tome_core.model_family(unet) == FAMILY[kind]
    assert tome_core.model_family(PipelineLike(unet)) == FAMILY[kind]
    if kind.startswith("ldm"):
        assert tome_core.model_family(WebUILike(unet)) == FAMILY[kind]


def test_model_family_without_transformer_blocks() -> None:
    with pytest.raises(TypeError):
        tome_core.model_family(torch.nn.Sequential(torch.nn.Linear(2, 2)))


@pytest.mark.parametrize("kind", ["diffusers_sd1", "diffusers_sdxl", "ldm_sd2"])
@pytest.mark.parametrize("name", ["quality", "fast", "fastest"])
def test_apply_preset_resolves_for_the_models_family(kind: str, name: str) -> None:
    unet = build_unet(kind)
    inputs = make_inputs(2, 16, 16)
    reference = forward(unet, inputs)
    tome_core.apply_patch(unet, preset=name)
    assert tome_core.get_config(unet) == tome_core.get_preset(name).config(FAMILY[kind])
    assert not torch.equal(forward(unet, inputs), reference)
    tome_core.remove_patch(unet)
    assert torch.equal(forward(unet, inputs), reference)


def test_keywords_override_a_preset() -> None:
    unet = build_unet("diffusers_sdxl")
    tome_core.apply_patch(unet, preset="fast", ratio=0.3, share_plan=False)
    expected = tome_core.get_preset("fast").config("sdxl").replace(ratio=0.3, share_plan=False)
    assert tome_core.get_config(unet) == expected


def test_preset_with_a_config_or_bad_values_leaves_the_model_untouched() -> None:
    unet = build_unet("diffusers_sd1")
    with pytest.raises(TypeError, match="a config or a preset, not both"):
        tome_core.apply_patch(unet, TomeConfig(), preset="fast")
    with pytest.raises(ValueError, match="preset must be one of"):
        tome_core.apply_patch(unet, preset="warp")
    with pytest.raises(ValueError, match=r"TomeConfig\.ratio must be"):
        tome_core.apply_patch(unet, preset="fast", ratio=2)
    assert not tome_core.is_patched(unet)
