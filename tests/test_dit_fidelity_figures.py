"""The change figures users read for the diffusion transformers (`Preset.fidelity`) are those of the committed
stand-in panel runs (`python -m tome_bench dit-fidelity`, docs/dit.md): Quality beside the naive port (one call and a
whole generation), Balanced to Fastest beside dropping steps for the same time (a whole generation), where the preset
saves at least one step's worth in twelve at the family's size (else beside the naive port)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tome_core
from tome_core.families import DIT_FAMILIES

RUNS = Path(__file__).resolve().parents[1] / "docs" / "runs"
#: The families no panel has measured yet (issue 58): their presets carry no change figure, and the words say so.
NOT_MEASURED = ("hunyuanvideo", "hunyuanvideo15", "ltx", "ltx2")
MEASURED = [f.name for f in DIT_FAMILIES if f.name not in NOT_MEASURED]
#: The panel runs the figures come from (the kept token of each cell drawn per step, blocks as strong in every family,
#: each query's own key beside the kept keys weighing as their cells; a later run's rows replace).
PANELS = tuple(f"2026-11-29-dit-proportional/panel-{name}" for name in MEASURED)
#: The naive port's name in the words users read.
PORT = "keys/values 2×2 in every block"


def _stand_in_rows() -> dict[str, dict[str, dict]]:
    rows: dict[str, dict[str, dict]] = {}
    for panel in PANELS:
        found: dict[str, dict[str, dict]] = {}
        for row in json.loads((RUNS / panel / "dit-fidelity.json").read_text())["rows"]:
            if row["variant"] == "stand-in":
                found.setdefault(row["family"], {})[row["name"]] = row
        rows.update(found)  # a family a later panel ran: its rows alone
    return rows


@pytest.mark.parametrize("family", MEASURED)
def test_each_figure_is_the_panels(family: str) -> None:
    held = {p.name: p.fidelity.get(family) for p in tome_core.presets()}
    measured = _stand_in_rows()[family]
    port = measured["naive port (kv 2x2, every block)"]
    quality = held["quality"]
    assert quality.reference == PORT
    assert quality.change == pytest.approx(measured["quality"]["call"] / port["call"], abs=0.006)
    assert quality.generation == pytest.approx(measured["quality"]["generation"] / port["generation"], abs=0.006)
    assert quality.change < 1 and quality.generation < 1  # less than the naive port
    for name in ("balanced", "fast", "fastest"):
        (steps,) = [row for key, row in measured.items() if key.startswith(f"fewer steps ({name}'s")]
        if steps["generation"] == 0:  # it saves less than one step's worth: held to the naive port instead
            assert held[name].reference == PORT, (family, name)
            assert held[name].change == pytest.approx(measured[name]["call"] / port["call"], abs=0.006)
            assert held[name].generation == pytest.approx(measured[name]["generation"] / port["generation"], abs=0.006)
            continue
        assert held[name].reference == "dropping steps for the same time" and held[name].change is None
        assert held[name].generation == pytest.approx(measured[name]["generation"] / steps["generation"], abs=0.006)
    assert len({h.setting for h in held.values()}) == 1


#: The families whose Balanced changes a generation more than dropping steps for the same time on their stand-ins:
#: none since each query keeps its own key (Flux.2 was, 1.72x: docs/dit.md).
OVER_THE_STEPS: tuple[str, ...] = ()
#: Balanced saves less than one step's worth in twelve at 1024 px: held to the naive port instead (none).
NO_STEP_REFERENCE: tuple[str, ...] = ()


@pytest.mark.parametrize("family", MEASURED)
def test_balanced_changes_no_more_than_dropping_steps_for_the_same_time(family: str) -> None:
    held = tome_core.get_preset("balanced").fidelity.get(family)
    if family in NO_STEP_REFERENCE:
        assert held.reference == PORT and held.generation < 1
        return
    assert (held.generation > 1) == (family in OVER_THE_STEPS), (family, held)


@pytest.mark.parametrize("family", NOT_MEASURED)
def test_a_family_not_measured_has_no_figure_and_its_words_say_so(family: str) -> None:
    assert all(p.fidelity.get(family) is None for p in tome_core.presets())
    assert "its change not measured yet" in tome_core.words.preset_hint("balanced", family)
