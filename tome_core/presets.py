"""Named speed settings: one choice for speed against fidelity, resolved per model family and pass.

Each preset is a point measured on the speed/deviation frontier of the benchmark (`python -m tome_core.bench
--presets all`; the figures are in the README), for SD1.x/SD2.x ("sd") and SDXL ("sdxl"), and for the Hires fix
pass, whose larger latent holds more redundant tokens. `Preset.config(family, hires=...)` is the `TomeConfig`
that runs; `apply_patch(model, preset="fast")` picks the family from the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tome_core.config import TomeConfig

#: Model families a preset is resolved for (`tome_core.model_family`).
FAMILIES: tuple[str, ...] = ("sd", "sdxl")


def _frozen(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class Preset:
    """A named setting: `TomeConfig` fields per model family, and what changes for the Hires fix pass."""

    name: str
    label: str
    help: str
    families: Mapping[str, Mapping[str, Any]]  # family -> TomeConfig fields (others keep their defaults)
    hires: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # family -> fields changed for hires

    def config(self, family: str, *, hires: bool = False) -> TomeConfig:
        """The config this preset runs with on a model of `family` ("sd" or "sdxl"), in the hires pass or not."""
        if family not in self.families:
            raise ValueError(f"model family must be one of {', '.join(map(repr, FAMILIES))}, got {family!r}")
        values = dict(self.families[family])
        if hires:
            values.update(self.hires.get(family, {}))
        return TomeConfig(**values)


# SDXL: self-attention attends to keys/values pooled 2x2 (kv), cross-attention merges at 0.5, the feed-forward (45%
# of a step) merges only in the level-4 blocks: merging it in the five level-2 stacks (10 blocks, a seventh of the
# feed-forward's work) made most of the deviation. The feed-forward ratio is what trades speed for deviation.
_SDXL = {
    "mode": "kv",
    "merge_crossattn": True,
    "ratio": 0.5,
    "merge_mlp": True,
    "mlp_min_downsample": 4,
    "share_plan": True,
}

# Points measured side by side (README, Benchmark: SDXL and SD1.5, white-noise and natural latents). The hires
# pass runs the first pass's values.
_PRESETS: tuple[Preset, ...] = (
    Preset(
        "quality",
        "Quality",
        "Smallest change to the image: self-attention on keys/values pooled 2x2, every query kept.",
        families=_frozen({"sd": _frozen({"mode": "kv"}), "sdxl": _frozen({"mode": "kv"})}),
    ),
    Preset(
        "balanced",
        "Balanced",
        "The default. SD1/SD2: tomesd's defaults (self-attention at 0.5). SDXL: pooled keys/values, cross-attention"
        " merged, the deepest blocks' feed-forward at a light ratio.",
        families=_frozen({"sd": _frozen({"ratio": 0.5}), "sdxl": _frozen({**_SDXL, "mlp_ratio": 0.2})}),
    ),
    Preset(
        "fast",
        "Fast",
        "Faster: SD1/SD2 pool keys/values down to level 4 (faster and more faithful than Balanced there); SDXL"
        " merges its deepest feed-forward at half the tokens.",
        families=_frozen(
            {
                "sd": _frozen({"mode": "kv", "max_downsample": 4}),
                "sdxl": _frozen({**_SDXL, "mlp_ratio": 0.5}),
            }
        ),
    ),
    Preset(
        "fastest",
        "Fastest",
        "The most speed, softer detail: SD1/SD2 merge 0.7 of the tokens for self- and cross-attention down to level"
        " 2; SDXL merges its deepest feed-forward at 0.6.",
        families=_frozen(
            {
                "sd": _frozen({"ratio": 0.7, "max_downsample": 2, "merge_crossattn": True, "share_plan": True}),
                "sdxl": _frozen({**_SDXL, "mlp_ratio": 0.6}),
            }
        ),
    ),
)

#: The preset the WebUI starts with.
DEFAULT_PRESET = "balanced"


def presets() -> tuple[Preset, ...]:
    """Every preset, from the most faithful to the fastest."""
    return _PRESETS


def get_preset(name: str) -> Preset:
    """The preset called `name`; ValueError naming the known ones otherwise."""
    for preset in _PRESETS:
        if preset.name == name:
            return preset
    raise ValueError(f"preset must be one of {', '.join(repr(p.name) for p in _PRESETS)}, got {name!r}")
