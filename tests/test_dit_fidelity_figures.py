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
TRAINED = RUNS / "2026-12-06-trained-dit" / "trained-fidelity.json"
#: The families measured on the trained DiT (its class is Flux.1's).
MEASURED = ("flux",)
NOT_MEASURED = tuple(f.name for f in DIT_FAMILIES if f.name not in MEASURED)
#: The naive port's name in the words users read.
PORT = "keys/values 2×2 in every block"


def _rows(steps: int) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(TRAINED.read_text())["rows"] if r["steps"] == steps}


@pytest.mark.parametrize("family", MEASURED)
def test_each_figure_is_the_trained_models(family: str) -> None:
    held = {p.name: p.fidelity.get(family) for p in tome_core.presets()}
    measured = _rows(12)
    port = measured["naive port (kv 2x2, every block)"]["change"]
    assert held["quality"].reference == PORT
    assert held["quality"].generation == pytest.approx(measured["quality"]["change"] / port, abs=0.006)
    for name in ("balanced", "fast", "fastest"):
        assert held[name].reference == "dropping steps for the same time" and held[name].change is None
        ratio = measured[name]["change"] / measured[name]["step change"]
        assert held[name].generation == pytest.approx(ratio, abs=0.006), (name, ratio)
    assert len({h.setting for h in held.values()}) == 1 and "trained" in held["balanced"].setting


def test_on_the_trained_model_every_preset_changes_a_generation_more_than_dropping_steps() -> None:
    """What the figures say, at 4, 8 and 12 steps: no preset stays within the step saving for its time (where a
    step count leaves a step to drop), each changes a generation by a third or more of its norm, and each query's
    own key does not pay on attention like a trained model's (within 0.1 of the kept keys alone); random weights
    would have said subsampling is free (docs/dit.md)."""
    for steps in (4, 8, 12):
        rows = _rows(steps)
        for name in ("quality", "balanced", "fast", "fastest"):
            row = rows[name]
            assert row["change"] > 0.3, (steps, name)
            assert row["step change"] is None or row["change"] > 5 * row["step change"], (steps, name)
            assert abs(row["change"] - row["without own key"]) < 0.1, (steps, name)


@pytest.mark.parametrize("family", NOT_MEASURED)
def test_a_family_not_measured_has_no_figure_and_its_words_say_so(family: str) -> None:
    assert all(p.fidelity.get(family) is None for p in tome_core.presets())
    assert "its change not measured yet" in tome_core.words.preset_hint("balanced", family)
