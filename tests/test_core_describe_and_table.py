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
from pathlib import Path
from typing import Any

import pytest

import tome_core
from tome_core import DEFAULT_PRESET, FAMILIES, TomeConfig, get_preset, presets
from tome_core.words import FAMILY_LABELS, FAMILY_LAYOUTS, TYPICAL_SIZES, preset_words

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


#: How the table names each reference in its cells.
SHORT = {
    "tomesd's default": "tomesd's",
    "ToDo's default": "ToDo's",
    "keys/values 2×2 in every block": "kv 2×2 everywhere",
    "dropping steps for the same time": "fewer steps",
}


def expected(name: str, family: str) -> list[str]:
    """A preset's two figure cells on a family: its speed-up at the family's typical size from the speed table
    (tome_core.figures; * estimated), and its change over a whole generation beside its reference ("-" where none
    is measured)."""
    preset = get_preset(name)
    found = tome_core.figures.speed(family, name, *TYPICAL_SIZES[family])
    speed = "-" if found is None else f"{found.speedup:.2f}\u00d7{'' if found.source.measured else '*'}"
    held = preset.fidelity.get(family)
    if held is None:
        return [speed, "-"]
    ratio = held.change if held.generation is None else held.generation
    assert ratio is not None
    return [speed, f"{ratio:.2f}\u00d7 {SHORT[held.reference]}"]


def rows(table: str, family: str) -> dict[str, list[str]]:
    """preset -> its row's cells after the family label, for one family's rows (columns two or more spaces apart)."""
    out = {}
    for line in table.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0].rsplit(" ", 1)[0] == FAMILY_LABELS[family]:  # "HunyuanVideo 1.5 ..." is not "HunyuanVideo"
            out[cells[1]] = cells[2:]
    return out


def test_presets_print_as_a_table() -> None:
    listed = presets()
    assert isinstance(listed, tuple) and all(isinstance(p, tome_core.Preset) for p in listed)
    table = tome_core.presets_table()
    assert str(listed) == table and repr(listed) == table
    lines = table.splitlines()
    assert all(len(line) <= 120 for line in lines), max(lines, key=len)
    for family in tome_core.ALL_FAMILIES:  # every family, UNets and diffusion transformers
        found = rows(table, family)
        assert list(found) == [p.name for p in listed], family
        for preset in listed:
            assert found[preset.name][0] == preset_words(preset)
            assert found[preset.name][1:] == expected(preset.name, family), (family, preset.name)
    assert rows(table, "sd")[DEFAULT_PRESET][0].startswith("The default")
    for word in ("stand-in", "\u00d7 less"):
        assert word not in table


@pytest.mark.parametrize("family", [*FAMILIES, "flux", "wan"])
def test_the_table_for_one_family(family: str) -> None:
    table = tome_core.presets_table(family)
    others = [FAMILY_LABELS[f] for f in tome_core.ALL_FAMILIES if f != family]
    assert not any(line.startswith(other + " ") for line in table.splitlines() for other in others)
    found = rows(table, family)
    for preset in presets():
        assert found[preset.name][1:] == expected(preset.name, family)
    with pytest.raises(ValueError, match="model family"):
        tome_core.presets_table("hunyuan")


def test_the_table_at_a_size() -> None:
    """At a size of the user's, the table gives each preset's figure there (`tome_core.figures`)."""
    table = tome_core.presets_table("sd", (1024, 1024))
    for preset in presets():
        found = tome_core.figures.speed("sd", preset.name, 1024, 1024)
        assert found is not None
        assert rows(table, "sd")[preset.name][1].startswith(f"{found.speedup:.2f}\u00d7")
    assert "SD1/SD2 1024\u00d71024" in table


def test_the_ipython_form_is_the_table() -> None:
    class Printer:
        def __init__(self) -> None:
            self.texts: list[str] = []

        def text(self, value: str) -> None:
            self.texts.append(value)

    printer = Printer()
    presets()._repr_pretty_(printer, False)  # type: ignore[attr-defined]
    assert printer.texts == [tome_core.presets_table()]


#: Sizes people generate at with each diffusion transformer family (issue 58): width, height, frames.
USERS_SIZES = {
    "flux": [(512, 512, 1), (768, 1344, 1), (1344, 768, 1), (896, 1152, 1), (1024, 1024, 1)],
    "chroma": [(512, 512, 1), (768, 1344, 1), (1024, 1024, 1)],
    "flux2": [(512, 512, 1), (768, 1344, 1), (1024, 1024, 1)],
    "qwen": [(512, 512, 1), (1328, 1328, 1), (1664, 928, 1), (928, 1664, 1)],
    "zimage": [(512, 512, 1), (1024, 1024, 1), (1536, 1536, 1)],
    "lumina2": [(512, 512, 1), (1024, 1024, 1)],
    "sd3": [(512, 512, 1), (1024, 1024, 1)],
    "wan": [(320, 320, 9), (480, 480, 17), (832, 480, 33), (832, 480, 49), (1280, 720, 33), (1280, 704, 121)],
    # Wan 2.2 TI2V 5B: its own rows (a quarter of the 14B's tokens at one size), 480p and 1280x704 at 33-121 frames.
    "wan22-5b": [(832, 480, 33), (832, 480, 49), (1280, 704, 49), (1280, 704, 81), (1280, 704, 121)],
    "hunyuanvideo": [(848, 480, 61), (960, 544, 61), (960, 544, 129), (1280, 720, 121), (1280, 720, 129)],
    "ltx": [(768, 512, 65), (768, 512, 97), (768, 512, 121), (1280, 720, 121)],
    "ltx2": [(768, 512, 65), (768, 512, 121), (1280, 720, 121), (1920, 1088, 121)],
}


@pytest.mark.parametrize("family", list(USERS_SIZES))
def test_the_sizes_people_generate_at_get_a_figure_not_a_bound(family: str) -> None:
    """Issue 58: the speed table holds each diffusion transformer family from 512x512 (Wan: a 320x320, 9-frame clip)
    to its large sizes, so a Flux at 512x512 or a Wan at 320x320 and 9 frames reads the table's or an interpolated
    figure for each preset, not the smallest size's marked "at most"."""
    for size in USERS_SIZES[family]:
        for preset in presets():
            found = tome_core.figures.speed(family, preset.name, *size)
            assert found is not None and found.exact, (family, size, preset.name, found)
            words = tome_core.words.speed_words(preset, family, size)
            assert words.startswith("about ") and "at most" not in words and "at least" not in words, words


#: The README's diffusion-transformer speed rows: the row's start -> per " · "-separated model, (family, sizes); each
#: cell holds one figure per model and size ("1.07 / 1.15×", "1.05 · 1.04 · 1.03×").
README_DIT_ROWS = {
    "| Flux.1-dev, 1024² / 2048²": [("flux", [(1024, 1024, 1), (2048, 2048, 1)])],
    "| Wan 2.1 14B, 81 frames": [("wan", [(832, 480, 81), (1280, 720, 81)])],
    "| Qwen-Image 1328²": [("qwen", [(1328, 1328, 1)]), ("sd3", [(1024, 1024, 1)]), ("flux2", [(1024, 1024, 1)])],
    "| Z-Image-Turbo": [("zimage", [(1024, 1024, 1)]), ("lumina2", [(1024, 1024, 1)])],
    "| Wan 2.2 TI2V 5B": [("wan22-5b", [(1280, 704, 49), (1280, 704, 121)])],
    "| HunyuanVideo 13B": [("hunyuanvideo", [(1280, 720, 129)])],
    "| LTX-Video 2B": [("ltx", [(1280, 720, 121)]), ("ltx2", [(1280, 720, 121)])],
}


def test_the_readme_s_diffusion_transformer_rows_are_the_speed_table_s() -> None:
    """Issue 58: each figure of the README's diffusion-transformer speed table is the speed table's at its size."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for start, models in README_DIT_ROWS.items():
        (line,) = [ln for ln in readme.splitlines() if ln.startswith(start)]
        cells = line.split("|")[2:6]
        for preset, cell in zip(presets(), cells):
            shown = [float(x) for x in re.findall(r"\d+\.\d+", cell)]
            want = [
                round(tome_core.figures.speed(family, preset.name, *size).speedup, 2)
                for family, sizes in models
                for size in sizes
            ]
            # " · " separates models, " / " sizes: a cell lists them in the order the row's label does.
            assert shown == want, (start, preset.name, shown, want)
