"""The hint under *Speed* in the WebUI (issue 33, section 4): what a user choosing a preset reads.

* A preset: one line, in the words of the loaded model's family (what it gives and what it changes, from
  `tome_core.presets.preset_hint`); the other family only while no model is loaded.
* The tokens per level ("4096 -> 256 keys/values at 1/1, ...") are shown for Custom settings only; for a preset
  they are in the note's tooltip (its `title`).
* Hires fix with "Own settings" at the first pass's preset adds no second line; another preset adds one line.
* Custom settings count the loaded family's levels alone: no "(SDXL: ...)" with an SD1/SD2 model loaded.

No figure of a preset is typed here: every expected text is made from `tome_core` (`preset_hint`,
`describe_layout`), so re-measured presets keep these tests valid.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest

import tome_core
from tome_core import FAMILIES, TomeConfig, get_preset, presets
from tome_core.presets import FAMILY_LABELS, FAMILY_LAYOUTS, preset_hint
from tome_webui import ui

SIZE = (512, 512)
HIRES_SIZE = (1024, 1024)  # "Upscale by" 2
PRESETS = [preset.name for preset in presets()]
FAMILIES_OR_NONE: list[str | None] = [*FAMILIES, None]


def render(values: dict[str, Any], family: str | None, *, hires: bool = False, img2img: bool = False) -> str:
    """The note and the token hint as the page gets them, for the page values javascript/tome.js sends."""
    page = {"width": SIZE[0], "height": SIZE[1], "hires": hires, "hr_scale": 2, "send": 3, "controls": values}
    return ui.note_for_page(json.dumps(page), is_img2img=img2img, family=family)


def note_lines(rendered: str) -> list[str]:
    """The lines the note shows (its tooltip aside)."""
    match = re.search(r'<div class="tome-cap-note[^"]*"(?: title="[^"]*")?>(.*?)</div>', rendered, re.DOTALL)
    assert match is not None, rendered
    return [html.unescape(line) for line in match.group(1).split("<br>") if line]


def note_title(rendered: str) -> str:
    match = re.search(r'<div class="tome-cap-note[^"]*" title="([^"]*)"', rendered)
    return html.unescape(match.group(1)) if match else ""


def hint_lines(rendered: str) -> list[str]:
    """The lines the token hint shows."""
    match = re.search(r'class="tome-token-hint"[^>]*>(.*)</div>$', rendered, re.DOTALL)
    assert match is not None, rendered
    return [html.unescape(line) for line in re.findall(r"<div>(.*?)</div>", match.group(1))]


def shown(rendered: str) -> str:
    """Everything the page shows of the note and the hint, without their tooltips."""
    return " ".join([*note_lines(rendered), *hint_lines(rendered)])


def per_level(family: str, size: tuple[int, int], config: TomeConfig) -> str:
    """The tokens per merged level as the hint words them, counted by `tome_core.describe_layout`."""
    infos = [i for i in tome_core.describe_layout(FAMILY_LAYOUTS[family], size[1], size[0], config) if i.merging]
    unit = " keys/values" if config.mode == "kv" else " tokens"
    return ", ".join(
        f"{i.tokens} \u2192 {i.tokens_after}{unit if n == 0 else ''} at 1/{i.level}" for n, i in enumerate(infos)
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", PRESETS)
def test_a_preset_is_one_line_in_the_loaded_familys_words(name: str, family: str) -> None:
    rendered = render({"preset": name}, family)
    assert note_lines(rendered) == [preset_hint(name, family, SIZE)]
    other = next(FAMILY_LABELS[f] for f in FAMILIES if f != family)
    assert other not in shown(rendered) and other not in note_title(rendered)


@pytest.mark.parametrize("name", PRESETS)
def test_without_a_model_a_preset_speaks_of_every_family(name: str) -> None:
    rendered = render({"preset": name}, None)
    assert note_lines(rendered) == [preset_hint(name, None, SIZE)]
    assert all(FAMILY_LABELS[f] in note_lines(rendered)[0] for f in FAMILIES)


@pytest.mark.parametrize("family", FAMILIES_OR_NONE)
@pytest.mark.parametrize("name", PRESETS)
def test_the_tokens_per_level_of_a_preset_are_in_the_tooltip(name: str, family: str | None) -> None:
    rendered = render({"preset": name}, family, hires=True)
    assert hint_lines(rendered) == []  # nothing shown under the note for a preset
    title = note_title(rendered)
    for fam in FAMILIES if family is None else (family,):
        config = get_preset(name).config(fam)
        for size in (SIZE, HIRES_SIZE):
            assert per_level(fam, size, config) in title
    assert "\u2192" not in shown(rendered)


@pytest.mark.parametrize("family", FAMILIES_OR_NONE)
@pytest.mark.parametrize("name", PRESETS)
def test_own_hires_settings_at_the_same_preset_add_no_line(name: str, family: str | None) -> None:
    values = {"preset": name, "hr_mode": "own", "hr_preset": name}
    rendered = render(values, family, hires=True)
    assert note_lines(rendered) == [preset_hint(name, family, SIZE)]
    assert "Hires pass" not in shown(rendered)
    assert note_lines(rendered) == note_lines(render({"preset": name}, family, hires=True))


@pytest.mark.parametrize("family", FAMILIES_OR_NONE)
def test_own_hires_settings_at_another_preset_add_one_line_naming_it(family: str | None) -> None:
    rendered = render({"preset": "quality", "hr_mode": "own", "hr_preset": "fastest"}, family, hires=True)
    first, *rest = note_lines(rendered)
    assert first == preset_hint("quality", family, SIZE)
    assert rest == [f"Hires pass, {get_preset('fastest').label}: {preset_hint('fastest', family, HIRES_SIZE)}"]
    custom = render({"preset": "custom", "hr_mode": "own", "hr_preset": "balanced"}, family, hires=True)
    assert note_lines(custom)[1:] == [
        f"Hires pass, {get_preset('balanced').label}: {preset_hint('balanced', family, HIRES_SIZE)}"
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_custom_counts_the_loaded_familys_levels_alone(family: str) -> None:
    config = TomeConfig()  # the custom controls' defaults: max downsample "auto", whose levels differ by family
    rendered = render({"preset": "custom"}, family, hires=True)
    assert hint_lines(rendered) == [
        per_level(family, SIZE, config),
        f"Hires pass ({HIRES_SIZE[0]}\u00d7{HIRES_SIZE[1]}): {per_level(family, HIRES_SIZE, config)}",
    ]
    other = next(FAMILY_LABELS[f] for f in FAMILIES if f != family)
    assert other not in shown(rendered)


def test_custom_without_a_model_counts_both_families() -> None:
    config = TomeConfig()
    sdxl = per_level("sdxl", SIZE, config).replace(" tokens", "", 1)  # the unit is said once, for SD1/SD2
    assert hint_lines(render({"preset": "custom"}, None)) == [f"{per_level('sd', SIZE, config)} (SDXL: {sdxl})"]
