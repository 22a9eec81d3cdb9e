"""The change figures users read for the diffusion transformers (`Preset.fidelity`) are those of the committed
stand-in panel runs (`python -m tome_bench dit-fidelity`, docs/dit.md): Quality beside the naive port (one call and a
whole generation), Balanced to Fastest beside dropping steps for the same time (a whole generation). Z-Image and
Lumina 2 have no stand-in that holds (the random model already changes by a fifth): no figure is shown for them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tome_core
from tome_core.families import DIT_FAMILIES

RUNS = Path(__file__).resolve().parents[1] / "docs" / "runs"
#: The panel run the figures come from (the kept token of each cell drawn per step, blocks as strong in every family).
PANELS = ("2026-11-28-dit-fidelity-blocks",)
NO_STAND_IN = ("zimage", "lumina2")


def _stand_in_rows() -> dict[str, dict[str, dict]]:
    rows: dict[str, dict[str, dict]] = {}
    for panel in PANELS:
        for row in json.loads((RUNS / panel / "dit-fidelity.json").read_text())["rows"]:
            if row["variant"] == "stand-in":
                rows.setdefault(row["family"], {})[row["name"]] = row
    return rows


@pytest.mark.parametrize("family", [f.name for f in DIT_FAMILIES])
def test_each_figure_is_the_panels(family: str) -> None:
    held = {p.name: p.fidelity.get(family) for p in tome_core.presets()}
    if family in NO_STAND_IN:
        assert set(held.values()) == {None}
        return
    measured = _stand_in_rows()[family]
    port = measured["naive port (kv 2x2, every block)"]
    quality = held["quality"]
    assert quality.reference == "keys/values 2×2 in every block"
    assert quality.change == pytest.approx(measured["quality"]["call"] / port["call"], abs=0.006)
    assert quality.generation == pytest.approx(measured["quality"]["generation"] / port["generation"], abs=0.006)
    assert quality.change < 1 and quality.generation < 1  # less than the naive port
    for name in ("balanced", "fast", "fastest"):
        (steps,) = [row for key, row in measured.items() if key.startswith(f"fewer steps ({name}'s")]
        assert held[name].reference == "dropping steps for the same time" and held[name].change is None
        assert held[name].generation == pytest.approx(measured[name]["generation"] / steps["generation"], abs=0.006)
    assert len({h.setting for h in held.values()}) == 1


#: The one family whose Balanced changes a generation more than dropping steps for the same time on its stand-in:
#: Flux.2's, at every setting that saves a step's worth at 1024 px (docs/dit.md); its figure says so.
OVER_THE_STEPS = ("flux2",)


@pytest.mark.parametrize("family", [f.name for f in DIT_FAMILIES if f.name not in NO_STAND_IN])
def test_balanced_changes_no_more_than_dropping_steps_for_the_same_time(family: str) -> None:
    held = tome_core.get_preset("balanced").fidelity[family].generation
    assert (held > 1) == (family in OVER_THE_STEPS), (family, held)
