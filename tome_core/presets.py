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
    #: Where the speed-up was measured, in the hint's words ("a CPU"): a GPU that runs the UNet eagerly at the
    #: speed it launches kernels gains far less, or loses (docs/benchmarks.md, 2026-11-25 GPU run).
    device: str = "a CPU"


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
# Fastest merges 0.9: from 0.85 on the deviation hardly grows (the cells are down to one or two tokens) while
# attention and the feed-forward still shrink. 2026-11-25, CPU: at 0.85 Fastest was within 1-12% of Fast across
# runs; at 0.9 it ran 14% (512 px) and 24% (768 px) faster than ToMe 0.7 in 10-step runs (each pair two runs) and 15% in
# the 6-step DPM++ run that `measured` holds (docs/benchmarks.md).
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
# of the deviation for a seventh of the feed-forward's work. Its ratio is what trades speed for deviation: Fast
# merges it at 0.7 (at 0.5 Fast ran 1% above Balanced at 640 px), Fastest at 0.9 with 4x4 pools (at 0.8 it ran only
# 7% above Fast in whole generations). 2026-11-26, one call at 640 px, CPU: Fastest at 0.9 2.01x against 0.8's
# 1.79x for a little more deviation (0.0376 against 0.0358); merging whole blocks instead (ToMe 0.7, 1.91x, 0.0397)
# or the level-2 feed-forward too (2.12x) deviated more, the latter twice as much (0.0817).
_SDXL_MLP = {"mode": "kv", "merge_crossattn": True, "merge_mlp": True, "mlp_min_downsample": 4, "share_plan": True}

_SD_RUN = "SD1.5 512 px, 6 DPM++ 2M steps, CPU (2026-11-25)"
_SDXL_RUN = "SDXL 640 px, 3 DPM++ 2M steps, CPU (2026-11-26)"

_PRESETS: tuple[Preset, ...] = (
    Preset(
        "quality",
        "Quality",
        "Smallest change to the image: self-attention attends to keys/values pooled 2x2, every query kept.",
        families=_frozen({"sd": _frozen(_SD_KV), "sdxl": _frozen({"mode": "kv"})}),
        measured=_frozen(
            {"sd": Measured(1.28, 0.0042, 0.0016, _SD_RUN), "sdxl": Measured(1.08, 0.0039, 0.0026, _SDXL_RUN)}
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
            {"sd": Measured(1.43, 0.0321, 0.0231, _SD_RUN), "sdxl": Measured(1.32, 0.0226, 0.0173, _SDXL_RUN)}
        ),
    ),
    Preset(
        "fast",
        "Fast",
        "Faster: SD1/SD2 merge 0.7 of the tokens for whole blocks (ToMe, 4x4 cells) down to level 4;"
        " SDXL as Balanced, the feed-forward merged at 0.7.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_MERGE, "ratio": 0.7}),
                "sdxl": _frozen({**_SDXL_MLP, "mlp_ratio": 0.7}),
            }
        ),
        measured=_frozen(
            {"sd": Measured(1.57, 0.0611, 0.0455, _SD_RUN), "sdxl": Measured(1.56, 0.0332, 0.0258, _SDXL_RUN)}
        ),
    ),
    Preset(
        "fastest",
        "Fastest",
        "The most speed, softer detail, for drafts: SD1/SD2 merge 0.9 of the tokens for whole blocks (ToMe,"
        " 4x4 cells) down to level 4; SDXL pools keys/values 4x4 and merges the level-4 feed-forward at 0.9.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_MERGE, "ratio": 0.9}),
                "sdxl": _frozen({**_SDXL_MLP, "sx": 4, "sy": 4, "ratio": 0.7, "mlp_ratio": 0.9}),
            }
        ),
        measured=_frozen(
            {"sd": Measured(1.8, 0.0649, 0.0515, _SD_RUN), "sdxl": Measured(1.88, 0.0366, 0.0307, _SDXL_RUN)}
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


# ---------------------------------------------------------------------------------------------- words for users
# What a user reads to choose a preset, in the WebUI's hint under "Speed" and the ComfyUI node's tooltip alike: made
# here from `Preset.measured` and `Preset.help`, so no figure of a preset is typed anywhere else.

#: Transformer blocks per UNet level (1: the full latent, 2: the first downsampled level, ...) in each model
#: family: SD1/SD2 have 2 down and 3 up at each of 1/1, 1/2 and 1/4 and one in the middle; SDXL none at 1/1, 10 at
#: 1/2 and 60 at 1/4 (`tome_core.blocks_per_level` of the real UNets; the tests check it). For a UI that has no
#: model at hand: `tome_core.describe_layout(FAMILY_LAYOUTS[family], ...)`.
FAMILY_LAYOUTS: Mapping[str, Mapping[int, int]] = _frozen(
    {"sd": _frozen({1: 5, 2: 5, 4: 5, 8: 1}), "sdxl": _frozen({2: 10, 4: 60})}
)
#: How users call each model family.
FAMILY_LABELS: Mapping[str, str] = _frozen({"sd": "SD1/SD2", "sdxl": "SDXL"})


def _preset(preset: Preset | str) -> Preset:
    return preset if isinstance(preset, Preset) else get_preset(preset)


def _families(family: str | None) -> tuple[str, ...]:
    """The families to speak of: the model's alone when it is known, else every family."""
    if family is None:
        return FAMILIES
    if family not in FAMILIES:
        raise ValueError(f"model family must be one of {', '.join(map(repr, FAMILIES))} or None, got {family!r}")
    return (family,)


def preset_words(preset: Preset | str) -> str:
    """The preset's own words for what a user chooses it for: its help up to the first colon or full stop
    ("Smallest change to the image" for Quality)."""
    text = _preset(preset).help
    ends = [i for i in (text.find(": "), text.find(". "), len(text.rstrip("."))) if i >= 0]
    return text[: min(ends)].strip()


def describe_config(config: TomeConfig) -> str:
    """What a config runs, in its own terms (cells, ratios, levels): the internals behind a hint, for custom settings
    and for a preset's details."""
    if config.is_noop:
        return "no merging"
    kv = config.mode == "kv"
    parts = [f"keys/values pooled over {config.sx}\u00d7{config.sy} cells"] if kv and config.merge_attn else []
    kinds = [name for name, on in (("self", config.merge_attn and not kv), ("cross", config.merge_crossattn)) if on]
    if kinds:
        cap = f", capped by the strides from {config.ratio:.2f}" if config.is_capped else ""
        parts.append(f"merging {config.effective_ratio:.2f} of the tokens ({'/'.join(kinds)}-attention{cap})")
    if config.merge_mlp:
        where = f" from downsample {config.mlp_min_downsample}" if config.mlp_min_downsample > 1 else ""
        parts.append(f"{config.effective_mlp_ratio:.2f} for the MLP{where}")
    if not kv:
        parts.append(f"strides {config.sx}\u00d7{config.sy}")
    parts.append(f"max downsample {config.max_downsample}")
    if config.share_plan:
        parts.append("one plan per stack")
    if (config.step_start, config.step_end) != (0.0, 1.0):
        parts.append(f"steps {config.step_start:g} to {config.step_end:g}")
    return ", ".join(parts)


def unmerged_levels(config: TomeConfig, family: str, width: int, height: int) -> tuple[int, ...]:
    """The levels at which `config` selects blocks of a `family` model to merge tokens (ToMe's merge, the feed-forward)
    but an image of `width` x `height` pixels is too small: the level's token grid is narrower or lower than one
    `sx` x `sy` cell, which holds the one token the others merge into, so those blocks run unmerged (the patch plans
    no merge without a destination; pooling keys/values needs no cell and runs at any size)."""
    from tome_core.config import LEVELS, auto_levels

    layout = FAMILY_LAYOUTS[family]
    ratios = config.ratios_by_kind
    if config.is_noop or not any(ratio > 0 for ratio in ratios.values()):
        return ()
    auto = auto_levels(layout)
    out = []
    for level in LEVELS:
        if not layout.get(level) or not config.merges_level(level, auto):
            continue
        kinds = [kind for kind, ratio in ratios.items() if ratio > 0]
        if level < config.mlp_min_downsample:
            kinds = [kind for kind in kinds if kind != "mlp"]
        rows, cols = -(-(height // 8) // level), -(-(width // 8) // level)  # the latent is pixels / 8, rounded up
        if kinds and (rows < config.sy or cols < config.sx):
            out.append(level)
    return tuple(out)


def preset_hint(preset: Preset | str, family: str | None = None, size: tuple[int, int] | None = None) -> str:
    """What a user reads to choose `preset`: its own words, then how much faster it made whole generations and how
    much it changed the image, as measured (`Preset.measured`), for the model `family` ("sd"/"sdxl") that runs it,
    or for every family when that is not known (None). With `size` (width, height in pixels), a note when the
    image is too small for the preset to merge at some level (`unmerged_levels`): it then gains less.

    How much the image changes is the measured deviation of the final latent from the unmerged one, from a start
    with a natural image's spectrum, as a percentage. Where and how the figures were measured is in
    `preset_details`, e.g. for a tooltip. Example (Balanced, SD1/SD2 loaded, 512 x 512)::

        The default. SD1/SD2: about 1.43× faster on a CPU, the image changes by about 2.3%.
    """
    chosen = _preset(preset)
    families = _families(family)
    figures = []
    for name in families:
        measured = chosen.measured.get(name)
        if measured is None:
            figures.append(f"{FAMILY_LABELS[name]}: not measured")
        else:
            figures.append(
                f"{FAMILY_LABELS[name]}: about {measured.speedup:.3g}\u00d7 faster on {measured.device}, the image"
                f" changes by about {100 * measured.deviation_natural:.2g}%"
            )
    text = f"{preset_words(chosen)}. {'; '.join(figures)}."
    if size is not None:
        where = []
        for name in families:
            config = chosen.config(name)
            levels = unmerged_levels(config, name, *size)
            if levels:
                where.append(
                    f"at level {' and '.join(map(str, levels))} on {FAMILY_LABELS[name]} (its"
                    f" {config.sx}\u00d7{config.sy} cells do not fit there)"
                )
        if where:
            text += (
                f" At {size[0]}\u00d7{size[1]} px the image is too small for {chosen.label} to merge tokens"
                f" {' or '.join(where)}, so it gains less."
            )
    return text


def preset_details(preset: Preset | str, family: str | None = None) -> str:
    """The internals behind `preset_hint`, one line per family (`family` alone when given): what the preset runs
    (`describe_config`) and where its figures were measured, e.g. for a tooltip or a details line::

        SD1/SD2: keys/values pooled over 4×4 cells, ... (measured: SD1.5 512 px, 6 DPM++ 2M steps, CPU (2026-11-25):
        1.43× faster, deviation 0.0321 from white noise, 0.0231 from a natural-spectrum start)
    """
    chosen = _preset(preset)
    lines = []
    for name in _families(family):
        line = f"{FAMILY_LABELS[name]}: {describe_config(chosen.config(name))}"
        measured = chosen.measured.get(name)
        if measured is not None:
            line += (
                f" (measured: {measured.setting}: {measured.speedup:.3g}\u00d7 faster, deviation"
                f" {measured.deviation_noise:.3g} from white noise, {measured.deviation_natural:.3g} from a"
                " natural-spectrum start)"
            )
        lines.append(line)
    return "\n".join(lines)
