"""`tome_core.describe` / `describe_layout` and the presets' table form (issue 33, section 4).

* `describe(model, height, width)` refuses sizes that are not positive multiples of 8, naming the argument, and
  without a patch or a config describes the default preset (`DEFAULT_PRESET`, resolved for the model's family).
  `describe_layout` does the same, inferring the family from the layout as `model_family` does.
* `print(tome_core.presets())` and `tome_core.presets_table()` give a table: a row per preset with the words a user
  chooses it by and, per model family, the GPU speed-up (marked when estimated) and the image change beside the
  preset's reference (made from `Preset.gpu` and `Preset.fidelity`, so re-measured presets need no change here).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

import tome_core
from tome_core import DEFAULT_PRESET, FAMILIES, TomeConfig, get_preset, presets
from tome_core.presets import FAMILY_LABELS, FAMILY_LAYOUTS, preset_words

import tiny_models

KINDS = {"sd": "ldm_sd1", "sdxl": "diffusers_sdxl"}


@pytest.mark.parametrize(
    ("height", "width", "named"),
    [(0, 512, "height"), (-8, 512, "height"), (512, 0, "width"), (512, 500, "width"), (4, 512, "height")],
)
def test_describe_refuses_sizes_that_are_not_positive_multiples_of_8(height: int, width: int, named: str) -> None:
    unet = tiny_models.build_unet("ldm_sd1")
    for call in (
        lambda: tome_core.describe(unet, height, width),
        lambda: tome_core.describe_layout(FAMILY_LAYOUTS["sd"], height, width),
    ):
        with pytest.raises(ValueError, match=rf"^{named} must be a positive multiple of 8 \(pixels\), got"):
            call()


@pytest.mark.parametrize("value", [512.0, "512", True, None])
def test_describe_refuses_sizes_that_are_not_integers(value: Any) -> None:
    unet = tiny_models.build_unet("ldm_sd1")
    with pytest.raises(TypeError, match=r"^height must be a positive multiple of 8 \(pixels\), got"):
        tome_core.describe(unet, value, 512)
    with pytest.raises(TypeError, match=r"^width must be a positive multiple of 8 \(pixels\), got"):
        tome_core.describe_layout(FAMILY_LAYOUTS["sd"], 512, value)


@pytest.mark.parametrize("family", FAMILIES)
def test_describe_without_a_config_describes_the_default_preset(family: str) -> None:
    unet = tiny_models.build_unet(KINDS[family])
    assert tome_core.model_family(unet) == family
    default = get_preset(DEFAULT_PRESET).config(family)
    assert default != TomeConfig()
    for size in ((512, 512), (768, 1024)):
        got = tome_core.describe(unet, *size)
        assert got == tome_core.describe(unet, *size, default)
        assert got != tome_core.describe(unet, *size, TomeConfig())
        layout = FAMILY_LAYOUTS[family]
        assert tome_core.describe_layout(layout, *size) == tome_core.describe_layout(layout, *size, default)
    # patched: the config that runs
    fast = get_preset("fast").config(family)
    tome_core.apply_patch(unet, fast)
    assert tome_core.describe(unet, 512, 512) == tome_core.describe(unet, 512, 512, fast)
    tome_core.remove_patch(unet)


def test_describe_layout_of_no_blocks_is_empty() -> None:
    assert tome_core.describe_layout({}, 512, 512) == []


#: How the table names each reference in its cells (its legend names them in full).
SHORT = {"tomesd's default": "tomesd", "ToDo's default": "ToDo"}


def figures(name: str, family: str) -> list[str]:
    """A family's two cells of a preset's row: the GPU speed-up (* estimated) and the change beside its reference."""
    preset = get_preset(name)
    gpu, held = preset.gpu[family], preset.fidelity[family]
    whole = "" if held.generation is None else f"/{held.generation:.2f}"
    return [
        f"{gpu.speedup:.3g}\u00d7{'' if gpu.measured else '*'}",
        f"{held.change:.2f}{whole}\u00d7 {SHORT[held.reference]}",
    ]


def cells(table: str, name: str) -> list[str]:
    """The cells of a preset's row (columns are two or more spaces apart)."""
    (row,) = [line for line in table.splitlines() if line.split()[:1] == [name]]
    return re.split(r"\s{2,}", row.strip())


def test_presets_print_as_a_table() -> None:
    listed = presets()
    assert isinstance(listed, tuple) and all(isinstance(p, tome_core.Preset) for p in listed)
    table = tome_core.presets_table()
    assert str(listed) == table and repr(listed) == table
    lines = table.splitlines()
    assert all(len(line) <= 120 for line in lines), max(lines, key=len)
    header = lines[0]
    assert all(FAMILY_LABELS[family] in header for family in FAMILIES)
    for preset in listed:
        row = cells(table, preset.name)
        assert row[1] == preset_words(preset)
        assert row[2:] == [cell for family in FAMILIES for cell in figures(preset.name, family)]
    (default,) = [line for line in lines if line.startswith(DEFAULT_PRESET)]
    assert cells(table, DEFAULT_PRESET)[1].startswith("The default"), default
    flat = " ".join(table.split())  # the legend wraps long runs
    for preset in listed:
        for family in FAMILIES:  # where the figures come from
            assert preset.gpu[family].setting in flat and preset.fidelity[family].setting in flat


@pytest.mark.parametrize("family", FAMILIES)
def test_the_table_for_one_family(family: str) -> None:
    table = tome_core.presets_table(family)
    other = next(FAMILY_LABELS[f] for f in FAMILIES if f != family)
    assert other not in table and FAMILY_LABELS[family] in table
    for preset in presets():
        assert cells(table, preset.name)[2:] == figures(preset.name, family)
    with pytest.raises(ValueError, match="model family"):
        tome_core.presets_table("flux")


def test_the_ipython_form_is_the_table() -> None:
    class Printer:
        def __init__(self) -> None:
            self.texts: list[str] = []

        def text(self, value: str) -> None:
            self.texts.append(value)

    printer = Printer()
    presets()._repr_pretty_(printer, False)  # type: ignore[attr-defined]
    assert printer.texts == [tome_core.presets_table()]
