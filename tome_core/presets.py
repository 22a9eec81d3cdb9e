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


_ATTN_CROSS_MLP = {"merge_crossattn": True, "merge_mlp": True, "share_plan": True}

# Points measured side by side (README, Benchmark: SDXL and SD1.5 at 1024 px, white-noise and natural latents).
# On SDXL the feed-forward is 45% of a step: only merging it (with cross-attention, one plan per stack) goes
# past 1.5x; its ratio is what trades speed for deviation. The hires pass runs the first pass's values.
_PRESETS: tuple[Preset, ...] = (
    Preset(
        "quality",
        "Quality",
        "Smallest change to the image: attention on pooled keys/values (SDXL), a light merge (SD1/SD2).",
        families=_frozen({"sd": _frozen({"ratio": 0.3}), "sdxl": _frozen({"mode": "kv"})}),
    ),
    Preset(
        "balanced",
        "Balanced",
        "Merges tokens for self-attention (SD1/SD2: tomesd's defaults, levels 2 and 4 on SDXL); the default.",
        families=_frozen({"sd": _frozen({"ratio": 0.5}), "sdxl": _frozen({"ratio": 0.6, "share_plan": True})}),
    ),
    Preset(
        "fast",
        "Fast",
        "Also merges for cross-attention and the feed-forward (most of an SDXL step), one plan per stack.",
        families=_frozen(
            {
                "sd": _frozen({"ratio": 0.6, "max_downsample": 2}),
                "sdxl": _frozen({"ratio": 0.5, "mlp_ratio": 0.3, **_ATTN_CROSS_MLP}),
            }
        ),
    ),
    Preset(
        "fastest",
        "Fastest",
        "Merges every module at the full ratio: the most speed, visibly softer detail.",
        families=_frozen(
            {
                "sd": _frozen({"ratio": 0.7, "max_downsample": 2, "mlp_ratio": 0.4, **_ATTN_CROSS_MLP}),
                "sdxl": _frozen({"ratio": 0.5, **_ATTN_CROSS_MLP}),
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
