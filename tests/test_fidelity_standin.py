"""Fidelity measured where attention is like a trained model's (issue 38): the SD1.5 stand-in (`tome_bench.standin`,
the real architecture with random weights and trained-like attention) reproduces the published relations the
plain random UNet misses, and the presets are held to the references users know on it, beside those references
run as their own code runs them (tomesd 0.1.3 itself, ToDo's nearest-exact subsampling).

One UNet call at t=500 from a natural-spectrum start at 512 px, batch 1, float32 on the CPU, per variant: every
variant runs once, in one worker (the variants of the relations, the references among them, and the presets).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pytest

from tome_bench import fidelity, standin
from tome_core import get_preset

#: One worker builds the stand-in and runs each variant once for every test here.
pytestmark = pytest.mark.xdist_group("fidelity_standin")
SIZE = 512
#: Each relation within this factor of the published value (issue 38).
WITHIN = 1.5
#: Today's presets must change the image no more than their reference: at most this much above it, which is the
#: run-to-run spread of nothing (the measure is deterministic) plus rounding.
TOLERANCE = 1.01

#: The SD1/SD2 presets of 2026-11-26, chosen on the random UNet (kept here, as data, to show that the new rules
#: reject them).
OLD_SD_PRESETS: dict[str, dict[str, Any]] = {
    "quality": {"mode": "kv", "max_downsample": 4},
    "balanced": {"mode": "kv", "max_downsample": 4, "sx": 4, "sy": 4},
}


@functools.cache
def _measured() -> tuple[dict[str, float], fidelity.AttentionStats]:
    """Each variant's change, and the attention of the unpatched call they are measured from (one call fewer)."""
    patches = {**fidelity.relation_patches("sd"), **fidelity.preset_patches()}
    patches.update({f"old {name}": fidelity.config_patch(**fields) for name, fields in OLD_SD_PRESETS.items()})
    unet, args, kwargs = fidelity.model("sd15", SIZE, "stand-in", "natural")
    watch = fidelity.AttentionWatch(unet, queries=64)
    changed = fidelity.changes(unet, args, kwargs, patches, watch_base=watch)
    return changed, watch.stats()


# Cached in the worker, not module-scoped fixtures: pytest tears a module's fixtures down whenever the worker runs
# another module's test between two of these, and each rebuild is a few minutes.
@pytest.fixture
def changed() -> dict[str, float]:
    """Each variant's change on the stand-in: the relations' variants (tomesd's and ToDo's defaults among them),
    today's presets and yesterday's."""
    return dict(_measured()[0])


def test_the_stand_in_attends_like_a_trained_model() -> None:
    stats = _measured()[1]
    # A random UNet's self-attention is 99% of log N at every level; a trained one's is local with a floor.
    assert stats.entropy[1] < 0.9, stats
    # Cross-attention: most of its mass on the prompt's start token (trained SD: 0.9-0.99).
    assert all(mass > 0.75 for mass in stats.bos_mass.values()), stats


def test_the_stand_in_reproduces_the_published_relations(changed: dict[str, float]) -> None:
    got = fidelity.relations(changed)
    for name, target in standin.TARGETS.items():
        assert target / WITHIN <= got[name] <= target * WITHIN, (name, got[name], target)


def test_harm_grows_with_depth_and_with_cross_attention_and_mlp(changed: dict[str, float]) -> None:
    ladder = [
        "tomesd's default",  # ToMe 0.5 at the top level
        "ToMe 0.5, two levels",
        "ToMe 0.5, every level",
        "ToMe 0.5, every level, +cross-attention +MLP",
    ]
    values = [changed[name] for name in ladder]
    assert all(b > 1.05 * a for a, b in itertools.pairwise(values)), dict(zip(ladder, values))


# Its own model: run beside the stand-in's tests, not after them in their worker.
@pytest.mark.xdist_group("fidelity_random")
def test_the_random_unet_misses_them() -> None:
    """The contrast: with uniform attention subsampling keys/values looks nearly free beside merging (relation 2 far
    outside its band) and merging every level adds nothing to merging two (issue 38: .027 -> .030 -> .030), where
    real weights and the stand-in grow at each step. At 256 px: uniform attention is uniform at any size (512 px
    gives 2.96 and 1.04, 256 px 3.42 and 1.04), and a call costs a quarter."""
    unet, args, kwargs = fidelity.model("sd15", 256, "random", "natural")
    patches = fidelity.relation_patches("sd")
    names = ("ToDo 3x3, top level", "ToDo's default", "ToMe 0.5, two levels", "ToMe 0.5, every level")
    changed = fidelity.changes(unet, args, kwargs, {name: patches[name] for name in names})
    todo3_todo2 = (changed["ToDo 3x3, top level"] / changed["ToDo's default"]) ** 2
    target = standin.TARGETS["todo3/todo2"]
    assert not (target / WITHIN <= todo3_todo2 <= target * WITHIN), changed
    assert changed["ToMe 0.5, every level"] < 1.05 * changed["ToMe 0.5, two levels"], changed


def test_each_preset_is_held_to_its_reference(changed: dict[str, float]) -> None:
    for name in ("quality", "balanced", "fast", "fastest"):
        preset = get_preset(name)
        held = preset.fidelity["sd"]
        assert held.reference in changed, held
        ratio = changed[preset.label] / changed[held.reference]
        if name in ("quality", "balanced"):
            assert ratio <= TOLERANCE, (name, ratio)
        # The figure users read is this measurement's.
        assert ratio == pytest.approx(held.change, rel=0.02), (name, ratio, held.change)


def test_the_presets_change_more_from_quality_to_fastest(changed: dict[str, float]) -> None:
    labels = [get_preset(n).label for n in ("quality", "balanced", "fast", "fastest")]
    values = [changed[label] for label in labels]
    assert values == sorted(values) and len(set(values)) == 4, dict(zip(labels, values))


def test_yesterdays_presets_fail_the_rules(changed: dict[str, float]) -> None:
    assert changed["old quality"] > TOLERANCE * changed["ToDo's default"]
    assert changed["old balanced"] > TOLERANCE * changed["tomesd's default"]
