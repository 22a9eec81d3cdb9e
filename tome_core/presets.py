"""Named speed settings: one choice for speed against fidelity, resolved per model family.

Per family (SD1.x/SD2.x "sd", SDXL "sdxl") the presets form a ladder: from Quality to Fastest each is faster and
deviates more from the unmerged image than the one before. Each is a point measured on the benchmark's
speed/deviation frontier, and `Preset.measured` records the figures it was chosen from (the commands and tables
are in docs/benchmarks.md). `Preset.config(family)` is the `TomeConfig` that runs; `apply_patch(model,
preset="fast")` picks the family from the model. A Hires fix pass runs the same values, resolved for the model
that runs it: its larger latent already makes each preset gain more there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tome_core.config import TomeConfig

#: Model families a preset is resolved for (`tome_core.model_family`).
FAMILIES: tuple[str, ...] = ("sd", "sdxl")


def _frozen(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class Measured:
    """What a preset was chosen from: whole generations side by side with the unpatched model.

    `speedup` is the unpatched time over the patched time; the deviations are ||out - base|| / ||base|| of the
    final latent from a white-noise start and from a start with a natural image's spectrum. `setting` names the
    run (model, size, steps, date), whose command and table are in docs/benchmarks.md.
    """

    speedup: float
    deviation_noise: float
    deviation_natural: float
    setting: str


@dataclass(frozen=True)
class Preset:
    """A named setting: `TomeConfig` fields per model family, and what each was measured at."""

    name: str
    label: str
    help: str
    families: Mapping[str, Mapping[str, Any]]  # family -> TomeConfig fields (others keep their defaults)
    measured: Mapping[str, Measured]  # family -> the measurement it was chosen from

    def config(self, family: str) -> TomeConfig:
        """The config this preset runs with on a model of `family` ("sd" or "sdxl")."""
        if family not in self.families:
            raise ValueError(f"model family must be one of {', '.join(map(repr, FAMILIES))}, got {family!r}")
        return TomeConfig(**self.families[family])


# SD1/SD2: Quality pools self-attention's keys/values (kv) down to level 4. Balanced adds 4x4 pools, cross-attention
# and the feed-forward merged in the level-2 and level-4 blocks (level 1's feed-forward, where the finest detail is,
# cost more deviation than it gained). Fast and Fastest merge whole blocks (ToMe) down to level 4 with one
# destination per 4x4 cell: past Balanced, that bought more speed per unit of deviation than kv with a larger
# feed-forward ratio (at 512 px kv's speed-up stalled near Balanced's), and the ratio trades one for the other.
_SD_KV = {"mode": "kv", "max_downsample": 4}
_SD_MLP = {
    **_SD_KV,
    "sx": 4,
    "sy": 4,
    "merge_crossattn": True,
    "merge_mlp": True,
    "mlp_min_downsample": 2,
    "share_plan": True,
}
_SD_MERGE = {"max_downsample": 4, "sx": 4, "sy": 4, "merge_crossattn": True, "merge_mlp": True, "share_plan": True}
# SDXL: the feed-forward (45% of a step) merges only in the level-4 blocks: in the ten level-2 blocks it made most
# of the deviation for a seventh of the feed-forward's work. Its ratio is what trades speed for deviation.
_SDXL_MLP = {"mode": "kv", "merge_crossattn": True, "merge_mlp": True, "mlp_min_downsample": 4, "share_plan": True}

_SD_RUN = "SD1.5 512 px, 10 Euler steps, CPU (2026-11-25)"
_SDXL_RUN = "SDXL 768 px, 4 Euler steps, CPU (2026-11-24)"

_PRESETS: tuple[Preset, ...] = (
    Preset(
        "quality",
        "Quality",
        "Smallest change to the image: self-attention attends to keys/values pooled 2x2, every query kept.",
        families=_frozen({"sd": _frozen(_SD_KV), "sdxl": _frozen({"mode": "kv"})}),
        measured=_frozen(
            {"sd": Measured(1.22, 0.0047, 0.0018, _SD_RUN), "sdxl": Measured(1.14, 0.0046, 0.0033, _SDXL_RUN)}
        ),
    ),
    Preset(
        "balanced",
        "Balanced",
        "The default. Keys/values pooled (4x4 on SD1/SD2), cross-attention merged, the feed-forward merged"
        " (SD1/SD2: at 0.5 in the level-2 and level-4 blocks; SDXL: at 0.3 in the level-4 blocks).",
        families=_frozen(
            {
                "sd": _frozen({**_SD_MLP, "mlp_ratio": 0.5}),
                "sdxl": _frozen({**_SDXL_MLP, "mlp_ratio": 0.3}),
            }
        ),
        measured=_frozen(
            {"sd": Measured(1.34, 0.032, 0.0244, _SD_RUN), "sdxl": Measured(1.4, 0.0294, 0.0243, _SDXL_RUN)}
        ),
    ),
    Preset(
        "fast",
        "Fast",
        "Faster: SD1/SD2 merge 0.7 of the tokens for whole blocks (ToMe, 4x4 cells) down to level 4;"
        " SDXL as Balanced, the feed-forward merged at 0.5.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_MERGE, "ratio": 0.7}),
                "sdxl": _frozen({**_SDXL_MLP, "mlp_ratio": 0.5}),
            }
        ),
        measured=_frozen(
            {"sd": Measured(1.52, 0.0602, 0.0474, _SD_RUN), "sdxl": Measured(1.6, 0.0369, 0.0304, _SDXL_RUN)}
        ),
    ),
    Preset(
        "fastest",
        "Fastest",
        "The most speed, softer detail, for drafts: SD1/SD2 merge 0.85 of the tokens for whole blocks (ToMe,"
        " 4x4 cells) down to level 4; SDXL pools keys/values 4x4 and merges the level-4 feed-forward at 0.8.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_MERGE, "ratio": 0.85}),
                "sdxl": _frozen({**_SDXL_MLP, "sx": 4, "sy": 4, "ratio": 0.7, "mlp_ratio": 0.8}),
            }
        ),
        measured=_frozen(
            {"sd": Measured(1.71, 0.0646, 0.0537, _SD_RUN), "sdxl": Measured(2.17, 0.0451, 0.0404, _SDXL_RUN)}
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
