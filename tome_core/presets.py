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
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tome_core.config import TomeConfig
from tome_core.plan import BlockPlan, layout_table

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
class GpuMeasured:
    """What a preset saved on a GPU: the GPU time of one UNet call (the sum of its kernels' times, fp16, SDPA, batch
    2) of the unpatched UNet over the patched one's. That is the speed-up wherever the GPU is the bottleneck (CUDA
    graphs, large images, a consumer card); eager on a fast GPU at small sizes the host's kernel launches bound a
    call instead, which every preset keeps within 10% of the unpatched call's. How much the image changes does not
    depend on the device: the hint takes it from `Measured`."""

    speedup: float
    setting: str  # the run (GPU, size, date), whose job and table are in docs/benchmarks.md
    device: str  # in the hint's words: "an NVIDIA H100"


@dataclass(frozen=True)
class Preset:
    """A named setting: `TomeConfig` fields per model family, and what each was measured at."""

    name: str
    label: str
    help: str
    families: Mapping[str, Mapping[str, Any]]  # family -> TomeConfig fields (others keep their defaults)
    measured: Mapping[str, Measured]  # family -> the measurement it was chosen from (CPU, whole generations)
    measured_gpu: Mapping[str, GpuMeasured] = field(default_factory=lambda: MappingProxyType({}))  # one GPU call

    def config(self, family: str) -> TomeConfig:
        """The config this preset runs with on a model of `family` ("sd" or "sdxl")."""
        if family not in self.families:
            raise ValueError(f"model family must be one of {', '.join(map(repr, FAMILIES))}, got {family!r}")
        return TomeConfig(**self.families[family])


# Chosen for GPUs (issue 34): each preset at most 10% more kernel-launching operations per UNet call than the
# unpatched UNet (tests/test_gpu_budget.py), the most estimated GPU work saved (tome_bench.gpu_estimate, calibrated on
# H200 profiles) at no more deviation than the preset of the same name before (one call, SD1.5 512 px and SDXL
# 640 px, white-noise and natural starts; docs/benchmarks.md, 2026-11-26 fifth session). What pays on a GPU is few,
# large kernels: pooling keys/values is one kernel per block; merging a block whole is one merge and one unmerge
# (batched matrix products); merging attention and feed-forward one by one costs four, and merging at SD1/SD2's
# level 1 (where the finest detail is) deviated twice as much as anywhere else for the same time saved.
#
# SD1/SD2: Quality pools keys/values 2x2 down to level 4; Balanced 4x4. Fast merges the level-4 blocks whole (0.95 of
# the tokens, 8x8 cells) and pools 8x8 in the others; Fastest merges levels 2 and 4 whole.
_SD_KV = {"mode": "kv", "max_downsample": 4}
_SD_WHOLE = {"merge_crossattn": True, "merge_mlp": True, "share_plan": True, "pool_kv": True}
# SDXL: the level-2 blocks pool keys/values; the sixty level-4 blocks (six stacks of ten) merge whole, one plan, one
# merge and one unmerge per stack, so the ratio buys speed for a handful of kernels.
_SDXL_WHOLE = {"min_downsample": 4, "merge_crossattn": True, "merge_mlp": True, "share_plan": True, "pool_kv": True}

_GPU_RUN = "one UNet call, fp16, SDPA, batch 2, sum of kernel times, NVIDIA H100, 1024 px (2026-11-26)"
_H100 = "an NVIDIA H100 at 1024 px"


def _gpu(sd: float, sdxl: float) -> Mapping[str, GpuMeasured]:
    return _frozen({"sd": GpuMeasured(sd, _GPU_RUN, _H100), "sdxl": GpuMeasured(sdxl, _GPU_RUN, _H100)})


_SD_RUN = "SD1.5 512 px, 6 DPM++ 2M steps, CPU (2026-11-26)"
_SDXL_RUN = "SDXL 640 px, 3 DPM++ 2M steps, CPU (2026-11-26)"

_PRESETS: tuple[Preset, ...] = (
    Preset(
        "quality",
        "Quality",
        "Smallest change to the image: self-attention attends to keys/values pooled 2x2, every query kept.",
        families=_frozen({"sd": _frozen(_SD_KV), "sdxl": _frozen({"mode": "kv"})}),
        measured=_frozen(
            {
                "sd": Measured(1.27, 0.0042, 0.0016, _SD_RUN),
                "sdxl": Measured(1.15, 0.0039, 0.0026, _SDXL_RUN),
            }
        ),
        measured_gpu=_gpu(1.29, 1.06),
    ),
    Preset(
        "balanced",
        "Balanced",
        "The default. Keys/values pooled 4x4 (SD1/SD2); SDXL pools 2x2 and merges a fifth of the tokens in its"
        " level-4 blocks, whole.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_KV, "sx": 4, "sy": 4}),
                "sdxl": _frozen({**_SDXL_WHOLE, "ratio": 0.2}),
            }
        ),
        measured=_frozen(
            {
                "sd": Measured(1.35, 0.0052, 0.0030, _SD_RUN),
                "sdxl": Measured(1.2, 0.0209, 0.0174, _SDXL_RUN),
            }
        ),
        measured_gpu=_gpu(1.42, 1.1),
    ),
    Preset(
        "fast",
        "Fast",
        "Faster: SD1/SD2 merge the level-4 blocks whole (0.95 of the tokens, 8x8 cells) and pool keys/values 8x8"
        " elsewhere; SDXL merges 0.3 of the tokens in its level-4 blocks, 4x4 pools.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_WHOLE, "ratio": 0.95, "sx": 8, "sy": 8, "min_downsample": 4, "max_downsample": 4}),
                "sdxl": _frozen({**_SDXL_WHOLE, "ratio": 0.3, "sx": 4, "sy": 4}),
            }
        ),
        measured=_frozen(
            {
                "sd": Measured(1.49, 0.0224, 0.0193, _SD_RUN),
                "sdxl": Measured(1.28, 0.0277, 0.0235, _SDXL_RUN),
            }
        ),
        measured_gpu=_gpu(1.5, 1.18),
    ),
    Preset(
        "fastest",
        "Fastest",
        "The most speed, softer detail, for drafts: SD1/SD2 merge the level-2 and level-4 blocks whole (0.95 of the"
        " tokens, 8x8 cells); SDXL merges 0.45 of the tokens in its level-4 blocks.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_WHOLE, "ratio": 0.95, "sx": 8, "sy": 8, "min_downsample": 2, "max_downsample": 4}),
                "sdxl": _frozen({**_SDXL_WHOLE, "ratio": 0.45, "sx": 4, "sy": 4}),
            }
        ),
        measured=_frozen(
            {
                "sd": Measured(1.61, 0.0392, 0.0347, _SD_RUN),
                "sdxl": Measured(1.38, 0.0351, 0.0313, _SDXL_RUN),
            }
        ),
        measured_gpu=_gpu(1.59, 1.27),
    ),
)

#: The preset the WebUI starts with.
DEFAULT_PRESET = "balanced"


class PresetList(tuple[Preset, ...]):
    """What `presets()` returns: a tuple of the presets that prints as a table (`presets_table`), in a REPL
    (`>>> tome_core.presets()`), with `print` and in IPython alike. Indexing and iterating give the `Preset`s."""

    __slots__ = ()

    def __str__(self) -> str:
        return _table(self, None)

    __repr__ = __str__

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's display hook."""
        printer.text(str(self))


def presets() -> PresetList:
    """Every preset, from the most faithful to the fastest: a tuple of `Preset`s that prints as a table
    (`presets_table`)."""
    return PresetList(_PRESETS)


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


def describe_config(config: TomeConfig, family: str | None = None) -> str:
    """What a config runs, in its own terms (cells, ratios, levels), as its block table (`tome_core.plan`) plans it
    on a `family` model: the internals behind a hint, for custom settings and for a preset's details. Without a
    family, the words for every family when they are the same, else each family's after its name."""
    words = {name: _config_words(config, name) for name in _families(family)}
    if len(set(words.values())) == 1:
        return next(iter(words.values()))
    return "; ".join(f"{FAMILY_LABELS[name]}: {text}" for name, text in words.items())


def _config_words(config: TomeConfig, family: str) -> str:
    if config.is_noop:
        return "no merging"
    table = layout_table(FAMILY_LAYOUTS[family], config)
    selected = [block for block in table.acting if block.level in table.selected]
    everywhere = sorted({block.level for block in selected})

    def where(blocks: list[BlockPlan]) -> str:
        """Where a phrase holds, when that is not at every level that merges."""
        levels = sorted({block.level for block in blocks})
        return "" if levels == everywhere else f" at downsample {' and '.join(map(str, levels))}"

    def ratio(blocks: list[BlockPlan], names: tuple[str, ...]) -> float:
        return next(r for block in blocks for name, r in block.merges if name in names)

    cells = f"{config.sx}\u00d7{config.sy} cells"
    pooling = [block for block in selected if block.pools]
    whole = [block for block in selected if block.kind == "whole"]
    modules = [block for block in selected if block.kind == "modules"]
    attention = [block for block in modules if {"attn1", "attn2"} & set(block.modules)]
    mlp = [block for block in modules if "ff" in block.modules]
    parts = [f"keys/values pooled over {cells}{where(pooling)}"] if pooling else []
    if whole:
        parts.append(f"whole blocks merged, {ratio(whole, ('attn1', 'attn2', 'ff')):.2f} of the tokens{where(whole)}")
    if attention:
        kinds = [
            word for name, word in (("attn1", "self"), ("attn2", "cross")) if any(name in b.modules for b in attention)
        ]
        amount = ratio(attention, ("attn1", "attn2"))
        parts.append(f"merging {amount:.2f} of the tokens ({'/'.join(kinds)}-attention){where(attention)}")
    if mlp:
        parts.append(f"{ratio(mlp, ('ff',)):.2f} for the MLP{where(mlp)}")
    merging = bool(whole or attention or mlp)
    if merging and config.mode == "merge":
        parts.append(f"strides {config.sx}\u00d7{config.sy}")
    if merging and config.matching == "global":
        parts.append("global matching")
    levels = f"max downsample {config.max_downsample}"
    if config.min_downsample > 1:
        levels = f"downsample {config.min_downsample} to {config.max_downsample}"
    parts.append(levels if selected else f"no merging at {levels}")
    if any(block.level in table.pooled for block in table.acting):
        parts.append(f"keys/values pooled over {cells} in the other levels")
    if merging and config.share_plan:
        parts.append("one plan per stack")
    if (config.step_start, config.step_end) != (0.0, 1.0):
        parts.append(f"steps {config.step_start:g} to {config.step_end:g}")
    return ", ".join(parts)


def unmerged_levels(config: TomeConfig, family: str, width: int, height: int) -> tuple[int, ...]:
    """The levels at which `config` selects blocks of a `family` model to merge tokens (ToMe's merge, the feed-forward)
    but an image of `width` x `height` pixels is too small: the level's token grid is narrower or lower than one
    `sx` x `sy` cell, which holds the one token the others merge into, so those blocks run unmerged (the patch plans
    no merge without a destination; pooling keys/values needs no cell and runs at any size). Read from the family's
    block table (`tome_core.plan.BlockTable.unmerged`)."""
    return layout_table(FAMILY_LAYOUTS[family], config).unmerged((height // 8, width // 8))


def preset_hint(
    preset: Preset | str,
    family: str | None = None,
    size: tuple[int, int] | None = None,
    device: str | None = None,
) -> str:
    """What a user reads to choose `preset`: its own words, then how much faster it made whole generations and how
    much it changed the image, as measured (`Preset.measured`), for the model `family` ("sd"/"sdxl") that runs it,
    or for every family when that is not known (None). With `size` (width, height in pixels), a note when the
    image is too small for the preset to merge at some level (`unmerged_levels`): it then gains less.

    `device` is where the model runs: "cuda" gives the GPU figure (`Preset.measured_gpu`), "cpu" (or another
    device) the CPU one; None (not known, as in a node's tooltip) gives both.

    How much the image changes is the measured deviation of the final latent from the unmerged one, from a start
    with a natural image's spectrum, as a percentage. Where and how the figures were measured is in
    `preset_details`, e.g. for a tooltip. Example (Balanced, SD1/SD2 loaded, 512 x 512, on a CPU)::

        The default. SD1/SD2: about 1.35× faster on a CPU, the image changes by about 0.3%.
    """
    chosen = _preset(preset)
    families = _families(family)
    figures = []
    for name in families:
        measured = chosen.measured.get(name)
        gpu = chosen.measured_gpu.get(name)
        speed = []
        if gpu is not None and device in (None, "cuda"):
            speed.append(f"about {gpu.speedup:.3g}\u00d7 less GPU time per step on {gpu.device}")
        if measured is not None and (device != "cuda" or gpu is None):
            speed.append(f"about {measured.speedup:.3g}\u00d7 faster on {measured.device}")
        if measured is None and gpu is None:
            figures.append(f"{FAMILY_LABELS[name]}: not measured")
            continue
        change = "" if measured is None else f", the image changes by about {100 * measured.deviation_natural:.2g}%"
        figures.append(f"{FAMILY_LABELS[name]}: {' ('.join(speed)}{')' if len(speed) > 1 else ''}{change}")
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
        line = f"{FAMILY_LABELS[name]}: {describe_config(chosen.config(name), name)}"
        measured = chosen.measured.get(name)
        if measured is not None:
            line += (
                f" (measured: {measured.setting}: {measured.speedup:.3g}\u00d7 faster, deviation"
                f" {measured.deviation_noise:.3g} from white noise, {measured.deviation_natural:.3g} from a"
                " natural-spectrum start)"
            )
        lines.append(line)
    return "\n".join(lines)


def presets_table(family: str | None = None) -> str:
    """The presets as a table for reading, one row per preset: its name (`apply_patch(model, preset=name)`), the
    words a user chooses it by, and per model family (`family` alone when given) the measured speed-up and how much
    the image changed (`Preset.measured`, as `preset_hint` words them); then where the figures were measured.
    `print(tome_core.presets())` prints the table for every family."""
    return _table(_PRESETS, family)


def _table(listed: tuple[Preset, ...], family: str | None) -> str:
    families = _families(family)

    def cell(preset: Preset, name: str) -> str:
        measured = preset.measured.get(name)
        if measured is None:
            return "not measured"
        return f"{measured.speedup:.3g}\u00d7 faster, {100 * measured.deviation_natural:.2g}% change"

    rows = [["preset", "chosen for", *(FAMILY_LABELS[name] for name in families)]]
    for preset in listed:
        name = f"{preset.name} (default)" if preset.name == DEFAULT_PRESET else preset.name
        rows.append([name, preset_words(preset), *(cell(preset, f) for f in families)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in rows]
    settings = {
        name: list(dict.fromkeys(p.measured[name].setting for p in listed if name in p.measured)) for name in families
    }
    lines.append("")
    lines.append(
        "Speed-up of a whole generation and change of the image (relative deviation of the final latent, from a"
    )
    lines.append("natural-spectrum start), each beside the unmerged model, measured on:")
    lines += [f"  {FAMILY_LABELS[name]}: {'; '.join(runs)}" for name, runs in settings.items() if runs]
    lines.append(
        "Settings per family: tome_core.get_preset(name).config(family); use: apply_patch(model, preset=name)."
    )
    return "\n".join(lines)
