"""Words for the device the user has (issues 34 and 44): the hint under *Speed*, the ComfyUI tooltip and the README
give the GPU figure of the speed table (`tome_core.figures`), naming the GPU and saying whether it was measured or
estimated; on another device the hint says the figures are a GPU's. The WebUI's note follows the WebUI's device.

Every expected figure comes from `tome_core.figures` and `Preset.fidelity`, none is typed here."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from tome_core import FAMILIES, figures, presets
from tome_core.words import FAMILY_LABELS, TYPICAL_SIZES, change_words, preset_hint
from tome_webui import compat, ui

PRESETS = list(presets())
README = Path(__file__).resolve().parents[1] / "README.md"
ON_A_CPU = "Figures are a GPU's"


def gpu_words(preset, family: str, size: tuple[int, int]) -> tuple[str, str]:
    """The figure at a size and where it comes from, as the hint states them."""
    found = figures.speed(family, preset.name, *size)
    assert found is not None, (preset.name, family, size)
    bound = f"{found.bound} " if found.bound else "about "
    how = "measured" if found.source.measured else "estimated"
    return (
        f"{bound}{found.speedup:.2f}\u00d7 faster per step at {size[0]}\u00d7{size[1]}",
        f"({found.source.device}, {how})",
    )


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_preset_has_a_gpu_figure_per_family(preset, family: str) -> None:
    """The table has every preset on every UNet family, each figure a gain, from a named GPU, measured or estimated
    by a run it names."""
    sizes = figures.sizes(family, preset.name)
    assert sizes
    for size in sizes:
        found = figures.speed(family, preset.name, *size)
        assert found is not None and found.exact and found.speedup > 1
        assert "GPU" not in found.source.device and found.source.device.startswith("NVIDIA")
        assert found.source.what  # the run the figure comes from


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_hint_speaks_of_the_device_the_model_runs_on(preset, family: str) -> None:
    """The GPU's figure on every device, naming the card and how it was made; off CUDA the hint says it is a GPU's."""
    size = TYPICAL_SIZES[family][:2]
    on_gpu = preset_hint(preset, family, size, device="cuda")
    on_cpu = preset_hint(preset, family, size, device="cpu")
    unknown = preset_hint(preset, family, size)
    speed, source = gpu_words(preset, family, size)
    assert all(speed in text and source in text for text in (on_gpu, on_cpu, unknown))
    assert ON_A_CPU in on_cpu and ON_A_CPU not in on_gpu and ON_A_CPU not in unknown
    change = f"changes the image {change_words(preset.fidelity[family])}"
    assert all(change in text for text in (on_gpu, on_cpu, unknown))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_webui_note_follows_the_webui_device(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setattr(compat, "compute_device", lambda: device)
    monkeypatch.setattr(ui, "loaded_family", lambda: None)  # no model loaded: both families
    page = {"width": 512, "height": 512, "hires": False, "hr_scale": 2, "send": 3, "controls": {"preset": "fast"}}
    shown = html.unescape(ui.note_function(False)(type("Event", (), {"_data": json.dumps(page)})()))
    fast = next(p for p in PRESETS if p.name == "fast")
    for family in FAMILIES:
        assert FAMILY_LABELS[family] in shown
        speed, source = gpu_words(fast, family, (512, 512))
        assert speed in shown and source in shown
    assert (ON_A_CPU in shown) == (device != "cuda")


def test_the_comfyui_tooltip_gives_the_gpu_figures() -> None:
    """The node does not know the model's size: each family's figure at the size people generate at."""
    from tome_comfy import inputs

    (widget,) = inputs.preset_widgets()
    tooltip = widget.tooltip
    for preset in PRESETS:
        for family in FAMILIES:
            speed, _ = gpu_words(preset, family, TYPICAL_SIZES[family][:2])
            assert speed in tooltip, (preset.name, family)


def test_the_readme_gives_the_gpu_figure_of_every_preset() -> None:
    """The README's preset table: each preset's GPU figure at 1024 px on SD1.5 and SDXL, as the table has it."""
    text = README.read_text()
    for preset in PRESETS:
        for family in FAMILIES:
            found = figures.speed(family, preset.name, 1024, 1024)
            assert found is not None and f"{found.speedup:.2f}\u00d7" in text, (preset.name, family)
