"""The hint under *Speed* in the WebUI (issues 33 and 44): what a user choosing a preset reads.

* A preset: one line, in the words of the loaded model's family (`tome_core.words.preset_hint`): how much faster a
  step gets at the size the page generates, from the speed table (`tome_core.figures`), and, while the Hires fix
  runs the same preset, in the hires pass at its target size, in the same line; how much it changes the image
  beside the reference users know. The other family only while no model is loaded. Every family presets resolve
  for, the diffusion transformers (Forge Neo's Flux, Wan, ...) included.
* The tokens per level ("4096 -> 256 keys/values at 1/1, ...") are shown for Custom settings only; for a preset
  they are in the note's tooltip (its `title`). A diffusion transformer's are per reduced block, in its own words.
* Hires fix with "Own settings" at the first pass's preset adds no second line; another preset adds one line,
  with the figures at the hires size.
* Custom settings count the loaded family's levels alone: no "(SDXL: ...)" with an SD1/SD2 model loaded.
* No word a user reads says "stand-in" or "× less".

No figure of a preset is typed here: every expected text is made from `tome_core` (`preset_hint`,
`figures.speed`, `describe_layout`), so re-measured presets and a rewritten speed table keep these tests valid.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest

import tome_core
from tome_core import ALL_FAMILIES, FAMILIES, TomeConfig, figures, get_preset, presets
from tome_core.words import FAMILY_LABELS, FAMILY_LAYOUTS, preset_hint
from tome_webui import ui

SIZE = (512, 512)
HIRES_SIZE = (1024, 1024)  # "Upscale by" 2
PRESETS = [preset.name for preset in presets()]
FAMILIES_OR_NONE: list[str | None] = [*FAMILIES, None]
DIT_FAMILIES = [family for family in ALL_FAMILIES if family not in FAMILIES]
#: Words no user should have to decode (issue 44): the lab's name for its models, and a speed-up stated backwards.
UNREADABLE = ("stand-in", "standin", "\u00d7 less", "x less")


def render(
    values: dict[str, Any],
    family: str | None,
    *,
    hires: bool = False,
    img2img: bool = False,
    size: tuple[int, int] = SIZE,
    scale: float = 2,
) -> str:
    """The note and the token hint as the page gets them, for the page values javascript/tome.js sends."""
    page = {"width": size[0], "height": size[1], "hires": hires, "hr_scale": scale, "send": 3, "controls": values}
    return ui.note_for_page(json.dumps(page), is_img2img=img2img, family=family)


def note_lines(rendered: str) -> list[str]:
    """The lines the note shows (its tooltip aside)."""
    match = re.search(
        r'<div class="tome-cap-note[^"]*"(?: style="[^"]*")?(?: title="[^"]*")?>(.*?)</div>', rendered, re.DOTALL
    )
    assert match is not None, rendered
    return [html.unescape(line) for line in match.group(1).split("<br>") if line]


def note_title(rendered: str) -> str:
    match = re.search(r'<div class="tome-cap-note[^"]*"(?: style="[^"]*")? title="([^"]*)"', rendered)
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


def table_words(family: str, name: str, size: tuple[int, int], *, first: bool = True) -> str | None:
    """How the hint states the speed table's figure for a preset at a size (None: the table has none)."""
    found = figures.speed(family, name, *size)
    if found is None:
        return None
    bound = f"{found.bound} " if found.bound else "about " if first else ""
    config = tome_core.get_preset(name).config(family)
    # A preset that reduces only some steps (a DiT's step window) has a whole generation's figure.
    per = "per step" if (config.step_start, config.step_end) == (0.0, 1.0) else "over a generation"
    at = f"{per} at {size[0]}\u00d7{size[1]}" if first else f"in the {size[0]}\u00d7{size[1]} hires pass"
    if round(found.speedup, 2) < 1:  # a slowdown (a diffusion transformer on few tokens): said as one, bound swapped
        bound = {"at most ": "at least ", "at least ": "at most "}.get(bound, bound)
        return f"{bound}{1 / found.speedup:.2f}\u00d7 slower {at}"
    return f"{bound}{found.speedup:.2f}\u00d7 {'faster ' if first else ''}{at}"


# ---------------------------------------------------------------------------------------------- figures at the size


@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("side", [512, 768, 1024])
@pytest.mark.parametrize("name", PRESETS)
def test_the_figures_are_the_tables_at_the_page_size(name: str, side: int, family: str) -> None:
    """Issue 44: at the size the user generates, the table's figure for the loaded family, not one size's."""
    size = (side, side)
    (line,) = note_lines(render({"preset": name}, family, size=size))
    assert line == preset_hint(name, family, size)
    expected = table_words(family, name, size)
    if expected is None:  # no row for this family yet (the lab adds the DiT families): no speed is claimed
        assert "faster per step" not in line and "faster over a generation" not in line
    else:
        assert expected in line
    assert FAMILY_LABELS[family] in line


@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("side", [512, 768, 1024])
@pytest.mark.parametrize("name", PRESETS)
def test_the_hires_pass_gets_its_figure_at_its_target_size(name: str, side: int, family: str) -> None:
    """The hires pass, where merging pays most: its own figure at the upscaled size, in the first pass's line."""
    size, target = (side, side), (2 * side, 2 * side)
    (line,) = note_lines(render({"preset": name}, family, size=size, hires=True))
    assert line == preset_hint(name, family, size, hires=target)
    first, second = table_words(family, name, size), table_words(family, name, target, first=False)
    if first is not None and second is not None:
        assert f"{first}, {second}" in line
    # A scale of 1.5 and an image that is not square: the target is what the WebUI computes.
    (odd,) = note_lines(render({"preset": name}, family, size=(side, side // 2), hires=True, scale=1.5))
    assert odd == preset_hint(name, family, (side, side // 2), hires=(side * 3 // 2, side * 3 // 4))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_balanced_hint_of_the_issue(family: str) -> None:
    """The issue's case: Balanced at 512 px with a 1024 px hires pass says both figures, the first the table's
    512 px one (not the 1024 px one the old hint gave), in words a user reads."""
    (line,) = note_lines(render({"preset": "balanced"}, family, hires=True))
    small, large = figures.speed(family, "balanced", *SIZE), figures.speed(family, "balanced", *HIRES_SIZE)
    assert small is not None and large is not None
    assert f"{small.speedup:.2f}\u00d7 faster per step at 512\u00d7512" in line
    assert f"{large.speedup:.2f}\u00d7 in the 1024\u00d71024 hires pass" in line
    assert ("estimated" in line) == (not (small.source.measured and large.source.measured))
    assert small.source.device in line and not any(word in line for word in UNREADABLE)


# ---------------------------------------------------------------------------------------------- one line per preset


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
    with_hires = render({"preset": name}, None, hires=True)
    assert note_lines(with_hires) == [preset_hint(name, None, SIZE, hires=HIRES_SIZE)]


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
    assert note_lines(rendered) == [preset_hint(name, family, SIZE, hires=HIRES_SIZE)]
    assert "Hires pass" not in shown(rendered)
    assert note_lines(rendered) == note_lines(render({"preset": name}, family, hires=True))


@pytest.mark.parametrize("family", [*FAMILIES_OR_NONE, "flux"])
def test_own_hires_settings_at_another_preset_add_one_line_naming_it(family: str | None) -> None:
    rendered = render({"preset": "quality", "hr_mode": "own", "hr_preset": "fastest"}, family, hires=True)
    first, *rest = note_lines(rendered)
    assert first == preset_hint("quality", family, SIZE)  # its own preset: no hires figure in this line
    assert rest == [f"Hires pass, {get_preset('fastest').label}: {preset_hint('fastest', family, HIRES_SIZE)}"]
    custom = render({"preset": "custom", "hr_mode": "own", "hr_preset": "balanced"}, family, hires=True)
    assert note_lines(custom)[1:] == [
        f"Hires pass, {get_preset('balanced').label}: {preset_hint('balanced', family, HIRES_SIZE)}"
    ]


@pytest.mark.parametrize("family", FAMILIES_OR_NONE)
def test_hires_off_says_so_and_keeps_the_first_line_plain(family: str | None) -> None:
    rendered = render({"preset": "fast", "hr_mode": "off"}, family, hires=True)
    assert note_lines(rendered) == [preset_hint("fast", family, SIZE), "Hires pass: no merging"]


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


# ---------------------------------------------------------------------------------------------- diffusion transformers


def dit_tokens(family: str, size: tuple[int, int], config: TomeConfig) -> str:
    """A diffusion transformer's tokens as the hint words them: the image's tokens (pixels / 16: an 8x VAE and 2x2
    patches) and the keys/values each reduced block attends to, or the tokens merged blocks run on, counted from the
    core's block table."""
    h, w = size[1] // 16, size[0] // 16
    acting = tome_core.plan.plan_dit(config, ui.DIT_BLOCKS[family]).acting
    parts = [
        f"{h * w} \u2192 {block.tokens(h, w)[part]} {words}"
        for kind, part, words in (
            ("kv", "kv", "keys/values per reduced block"),
            ("whole", "attn1", "tokens in merged blocks"),
        )
        for block in [next((b for b in acting if b.kind == kind), None)]
        if block is not None
    ]
    return ", ".join(parts)


@pytest.mark.parametrize("family", DIT_FAMILIES)
@pytest.mark.parametrize("name", PRESETS)
def test_a_diffusion_transformer_speaks_in_its_own_words(name: str, family: str) -> None:
    """Forge Neo with Flux, Wan, ...: the preset's line for that family, its blocks and keys/values in the tooltip,
    no UNet level anywhere."""
    rendered = render({"preset": name}, family, hires=True)
    assert note_lines(rendered) == [preset_hint(name, family, SIZE, hires=HIRES_SIZE)]
    title = note_title(rendered)
    config = get_preset(name).config(family)
    assert dit_tokens(family, SIZE, config) in title and dit_tokens(family, HIRES_SIZE, config) in title
    assert tome_core.words.describe_config(config, family) in title
    assert "1/1" not in title and "level" not in title and "downsample" not in title
    assert hint_lines(rendered) == []


@pytest.mark.parametrize("family", DIT_FAMILIES)
def test_custom_keys_values_on_a_diffusion_transformer(family: str) -> None:
    """Custom keys/values subsampling shows its keys/values per block, for the first pass and the hires pass."""
    rendered = render({"preset": "custom", "mode": "kv", "sx": 2, "sy": 2}, family, hires=True)
    config = TomeConfig(mode="kv", sx=2, sy=2)
    assert hint_lines(rendered) == [
        dit_tokens(family, SIZE, config),
        f"Hires pass ({HIRES_SIZE[0]}\u00d7{HIRES_SIZE[1]}): {dit_tokens(family, HIRES_SIZE, config)}",
    ]
    assert "tome-invalid" not in rendered


@pytest.mark.parametrize(
    "values",
    [{"preset": "custom"}, {"preset": "custom", "mode": "kv"}, {"preset": "custom", "ratio": 0.75}],
    ids=["merge-defaults", "kv", "merge-0.75"],
)
def test_custom_settings_the_loaded_transformer_refuses_show_the_cores_message(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, Any]
) -> None:
    """With Forge Neo's Flux loaded the note asks the core whether that model runs the custom settings
    (`tome_core.dit.check_config`): a refusal shows its message in the error colour before the user generates;
    settings it runs show what runs."""
    import webui_stub  # noqa: F401  (puts the stand-in's `backend` package on sys.path)
    from backend.nn.flux import IntegratedFluxTransformer2DModel

    module = IntegratedFluxTransformer2DModel()
    monkeypatch.setattr(ui, "loaded_module", lambda: module)
    config = ui.note_job(values, is_img2img=True).first
    try:
        tome_core.dit.check_config(config, type(module).__name__, tome_core.find_layout(module), module)
        expected = None
    except ValueError as exc:
        expected = str(exc)
    rendered = render(values, "flux", img2img=True)
    if expected is None:
        assert "tome-invalid" not in rendered and note_lines(rendered) == [
            tome_core.words.describe_config(config, "flux")
        ]
    else:
        assert "tome-invalid" in rendered and expected in " ".join(note_lines(rendered))
    # The custom defaults merge at ratio 0.5, which merged blocks of a transformer do not run; kv, or the whole cell's
    # ratio (0.75 with 2x2 cells), runs.
    assert ("tome-invalid" in rendered) == (values == {"preset": "custom"})


# ---------------------------------------------------------------------------------------------- readable words


def every_text(family: str | None) -> list[str]:
    """Everything a user reads of the note for every preset and hires mode, tooltips included."""
    texts = []
    for name in [*PRESETS, "custom"]:
        for hires in ({}, {"hr_mode": "own", "hr_preset": "fastest"}, {"hr_mode": "off"}):
            rendered = render({"preset": name, "mode": "kv", **hires}, family, hires=True)
            texts += [*note_lines(rendered), note_title(rendered), *hint_lines(rendered)]
    return texts


@pytest.mark.parametrize("family", [None, *ALL_FAMILIES])
def test_no_word_a_user_reads_needs_decoding(family: str | None) -> None:
    for text in every_text(family):
        assert not any(word in text.lower() for word in UNREADABLE), text
    tooltips = [ui.PRESET_HELP, ui.HIRES_PRESET_HELP, ui.token_hint_title(), *(s.help for s in tome_core.field_specs())]
    for text in tooltips:
        assert not any(word in text.lower() for word in UNREADABLE), text
