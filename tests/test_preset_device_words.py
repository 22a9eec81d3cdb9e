"""Words for the device the user has (issue 34): the hint under *Speed*, the ComfyUI tooltip and the README give the
GPU figure when the model runs on CUDA, the CPU figure on a CPU, both where the device is unknown; a GPU figure the
cost model estimated says "estimated".

Every expected figure comes from `Preset.gpu` / `Preset.cpu` / `Preset.fidelity`, none is typed here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tome_core import FAMILIES, presets
from tome_core.presets import FAMILY_LABELS, change_words, preset_hint
from tome_webui import compat, ui

PRESETS = list(presets())
README = Path(__file__).resolve().parents[1] / "README.md"


def _gpu_words(preset, family: str) -> str:
    gpu = preset.gpu[family]
    estimated = "" if gpu.measured else ", estimated"
    return f"about {gpu.speedup:.3g}\u00d7 less GPU time per step on {gpu.device}{estimated}"


def _cpu_words(preset, family: str) -> str:
    cpu = preset.cpu[family]
    estimated = "" if cpu.measured else ", estimated"
    return f"about {cpu.speedup:.3g}\u00d7 faster on {cpu.device}{estimated}"


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_preset_has_a_gpu_figure_per_family(preset, family: str) -> None:
    gpu = preset.gpu[family]
    assert gpu.speedup > 1 and "GPU" not in gpu.device and gpu.device.startswith("an NVIDIA")
    card = gpu.device.split()[2]  # "an NVIDIA H200 at 1024 px": the card its run names
    assert card in gpu.setting
    assert ("estimate" in gpu.setting) == (not gpu.measured)  # the run says how the figure was made
    cpu = preset.cpu.get(family)  # only from a run quiet enough to rank the presets
    assert cpu is None or (cpu.device == "a CPU" and "CPU" in cpu.setting)


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_hint_speaks_of_the_device_the_model_runs_on(preset, family: str) -> None:
    """A GPU gets the GPU figure; a CPU the CPU figure, or the GPU one (naming its card) where none was measured."""
    on_gpu = preset_hint(preset, family, device="cuda")
    on_cpu = preset_hint(preset, family, device="cpu")
    unknown = preset_hint(preset, family)
    assert _gpu_words(preset, family) in on_gpu and _gpu_words(preset, family) in unknown
    assert ("estimated" in on_gpu) == (not preset.gpu[family].measured)
    if family in preset.cpu:
        assert _cpu_words(preset, family) not in on_gpu and _cpu_words(preset, family) in unknown
        assert _cpu_words(preset, family) in on_cpu and _gpu_words(preset, family) not in on_cpu
        assert ("estimated" in on_cpu) == (not preset.cpu[family].measured)
    else:
        assert on_cpu == on_gpu and "faster on a CPU" not in unknown
    change = f"changes the image {change_words(preset.fidelity[family])}"
    assert all(change in text for text in (on_gpu, on_cpu, unknown))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_webui_note_follows_the_webui_device(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setattr(compat, "compute_device", lambda: device)
    monkeypatch.setattr(ui, "loaded_family", lambda: None)  # no model loaded: both families
    page = {"width": 512, "height": 512, "hires": False, "hr_scale": 2, "send": 3, "controls": {"preset": "fast"}}
    shown = ui.note_function(False)(type("Event", (), {"_data": json.dumps(page)})())
    fast = next(p for p in PRESETS if p.name == "fast")
    for family in FAMILIES:
        assert FAMILY_LABELS[family] in shown
        gpu = _gpu_words(fast, family)
        if family not in fast.cpu:  # no CPU figure: the GPU one, naming its card, on either device
            assert gpu in shown
            continue
        cpu = _cpu_words(fast, family)
        assert (gpu in shown, cpu in shown) == ((True, False) if device == "cuda" else (False, True))


def test_the_comfyui_tooltip_gives_both_figures() -> None:
    from tome_comfy import inputs

    (widget,) = inputs.preset_widgets()
    tooltip = widget.tooltip
    for preset in PRESETS:
        for family in FAMILIES:
            assert _gpu_words(preset, family) in tooltip
            assert family not in preset.cpu or _cpu_words(preset, family) in tooltip


def test_the_readme_gives_the_gpu_figure_of_every_preset() -> None:
    text = README.read_text()
    for preset in PRESETS:
        for family in FAMILIES:
            assert f"{preset.gpu[family].speedup:.3g}\u00d7" in text, (preset.name, family)
