"""The change figures users read for the diffusion transformers (`Preset.fidelity`) come from the one model here whose
attention is like a trained model's (issue 57): the trained Flux.1-class DiT (`python -m tome_bench trained-fidelity`,
docs/runs/2026-12-06-trained-dit): Quality beside the naive port, Balanced to Fastest beside dropping steps for the
same time, over a whole 12-step generation. The stand-ins' figures (tied q/k: 4-10x a trained model's share on a
query's own token) are withdrawn: every other family says its change is not measured yet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tome_core
from tome_core.families import DIT_FAMILIES

RUNS = Path(__file__).resolve().parents[1] / "docs" / "runs"
TRAINED = RUNS / "2026-12-06-presets-redecided" / "trained-fidelity.json"
#: The presets before they were re-decided (issue 57), on the same model, noise and labels.
BEFORE = RUNS / "2026-12-06-trained-dit" / "trained-fidelity.json"
#: The families measured on the trained DiT (its class is Flux.1's).
MEASURED = ("flux",)
NOT_MEASURED = tuple(f.name for f in DIT_FAMILIES if f.name not in MEASURED)
#: The naive port's name in the words users read.
PORT = "keys/values 2×2 in every block"


def _rows(steps: int, path: Path = TRAINED) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(path.read_text())["rows"] if r["steps"] == steps}


@pytest.mark.parametrize("family", MEASURED)
def test_each_figure_is_the_trained_models(family: str) -> None:
    """Quality, which saves too little time at 12 steps to drop one, beside the naive port; the others beside dropping
    steps for the same time; each names the trained model."""
    held = {p.name: p.fidelity.get(family) for p in tome_core.presets()}
    measured = _rows(12)
    port = measured["naive port (kv 2x2, every block)"]["change"]
    assert measured["quality"]["step change"] is None and held["quality"].reference == PORT
    assert held["quality"].generation == pytest.approx(measured["quality"]["change"] / port, abs=0.006)
    for name in ("balanced", "fast", "fastest"):
        assert held[name].reference == "dropping steps for the same time" and held[name].change is None
        ratio = measured[name]["change"] / measured[name]["step change"]
        assert held[name].generation == pytest.approx(ratio, abs=0.006), (name, ratio)
    assert len({h.setting for h in held.values()}) == 1 and "trained" in held["balanced"].setting
    assert all("trained" in h.source for h in held.values())


def test_on_the_trained_model_the_ladder_rises_and_no_preset_stays_within_the_step_saving() -> None:
    """What the figures say, at 4, 8 and 12 steps: the change rises from Quality to Fastest; where a step can be
    dropped for a preset's time, the preset changes the generation more than that (no setting tried stays within it);
    each query's own key pays in the step-windowed presets (less change than the kept keys alone)."""
    for steps in (4, 8, 12):
        rows = _rows(steps)
        changes = [rows[name]["change"] for name in ("quality", "balanced", "fast", "fastest")]
        assert changes == sorted(changes), (steps, changes)
        for name in ("quality", "balanced", "fast", "fastest"):
            row = rows[name]
            assert row["step change"] is None or row["change"] > row["step change"], (steps, name)
        for name in ("quality", "balanced", "fast"):
            assert rows[name]["change"] < rows[name]["without own key"], (steps, name)


def test_the_re_decided_presets_change_a_generation_less_than_the_ones_they_replace() -> None:
    """On the trained model, the same noise and labels: Quality to Fast (a step window, every block, small cells)
    change a generation less than the presets before them (larger cells in fewer blocks at every step), at every
    step count; Fastest is the same setting as before."""
    for steps in (4, 8, 12):
        now, before = _rows(steps), _rows(steps, BEFORE)
        for name in ("quality", "balanced", "fast"):
            assert now[name]["change"] < 0.5 * before[name]["change"], (steps, name)
        assert now["fastest"]["change"] == pytest.approx(before["fastest"]["change"], abs=1e-4)


@pytest.mark.parametrize("family", NOT_MEASURED)
def test_a_family_not_measured_has_no_figure_and_its_words_say_so(family: str) -> None:
    assert all(p.fidelity.get(family) is None for p in tome_core.presets())
    assert "its change not measured yet" in tome_core.words.preset_hint("balanced", family)
