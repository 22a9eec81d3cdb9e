"""Named speed settings: one choice for speed against fidelity, resolved per model family.

Per family (SD1.x/SD2.x "sd", SDXL "sdxl") the presets form a ladder: from Quality to Fastest each takes less GPU
time than the one before. Each is held to a reference users know (`REFERENCES`: Quality to ToDo's default, the others
to tomesd's): `Preset.fidelity` records how much it changes the image beside that reference, measured on a stand-in
model, and among the presets held to one reference the faster changes the image more. `Preset.gpu` and `Preset.cpu`
record its speed-ups, measured or (GPU) estimated by the cost model (the commands and tables are in
docs/benchmarks.md and docs/fidelity.md). `Preset.config(family)` is the `TomeConfig` that runs; `apply_patch(model,
preset="fast")` picks the family from the model. A Hires fix pass runs the same values, resolved for the model
that runs it: its larger latent already makes each preset gain more there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tome_core.config import TomeConfig
from tome_core.plan import BlockPlan, grid, layout_table

#: Model families a preset is resolved for (`tome_core.model_family`).
FAMILIES: tuple[str, ...] = ("sd", "sdxl")


def _frozen(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(values))


#: The references a preset is held to, in users' words (`Fidelity.reference`): what users know from tomesd (and the
#: WebUIs' built-in token merging) and from ToDo, each at the first level with attention of the model (level 1 on
#: SD1/SD2, level 2 on SDXL, where tomesd's own default merges nothing).
REFERENCES: Mapping[str, str] = MappingProxyType(
    {
        "tomesd's default": "tomesd's default (ratio 0.5, 2×2 cells, self-attention, the first level with attention)",
        "ToDo's default": "ToDo's default (keys/values from the tokens subsampled 2×2, the first level with attention)",
    }
)


@dataclass(frozen=True)
class Fidelity:
    """How much a preset changes the image, beside the reference users know that it is held to.

    `change` is the relative change of one UNet call's output under the preset over that under the reference
    (`REFERENCES`), side by side: below 1 the preset changes the image less. `generation`, where measured, is the
    same ratio for the final latent of a whole generation from white noise: errors of every step add up there, and
    the two can rank a preset differently against its reference. Measured on a stand-in model, the real architecture
    with random weights whose attention behaves like a trained model's (tome_bench.standin, fitted to published
    real-weight relations of one call): a random-weight UNet attends uniformly, and there pooling keys/values or
    merging deep levels looks free. `setting` names the runs (docs/fidelity.md).
    """

    reference: str
    change: float
    setting: str
    generation: float | None = None


@dataclass(frozen=True)
class Speed:
    """How much faster a preset made a UNet call: the unpatched call's time over the patched one's.

    On a GPU, the GPU time of one call (the sum of its kernels' times, fp16, SDPA, batch 2): the speed-up wherever
    the GPU is the bottleneck (CUDA graphs, large images, a consumer card); eager on a fast GPU at small sizes the
    host's kernel launches bound a call instead, which every preset keeps within 10% of the unpatched call's.
    `measured` False: estimated (tome_bench.gpu_estimate, calibrated on that GPU's profiles), not measured.
    """

    speedup: float
    setting: str  # the run (device, size, date), whose job and table are in docs/benchmarks.md
    device: str  # in the hint's words: "an NVIDIA H200 at 1024 px", "a CPU"
    measured: bool = True


@dataclass(frozen=True)
class Preset:
    """A named setting: `TomeConfig` fields per model family, and what each was measured at."""

    name: str
    label: str
    help: str
    families: Mapping[str, Mapping[str, Any]]  # family -> TomeConfig fields (others keep their defaults)
    fidelity: Mapping[str, Fidelity]  # family -> its change beside its reference
    gpu: Mapping[str, Speed] = field(default_factory=lambda: MappingProxyType({}))  # family -> one GPU call
    cpu: Mapping[str, Speed] = field(default_factory=lambda: MappingProxyType({}))  # family -> one CPU call

    def config(self, family: str) -> TomeConfig:
        """The config this preset runs with on a model of `family` ("sd" or "sdxl")."""
        if family not in self.families:
            raise ValueError(f"model family must be one of {', '.join(map(repr, FAMILIES))}, got {family!r}")
        return TomeConfig(**self.families[family])


# Chosen (issue 38) on the stand-ins, beside tomesd's and ToDo's defaults run as their own code runs them: Quality
# changes the image no more than ToDo's default, Balanced no more than tomesd's default, Fast and Fastest more, each
# faster than the one below; each saves at least the GPU work of its reference (tome_bench.gpu_estimate), adds at
# most 10% kernel-launching operations (tests/test_gpu_budget.py), and the ladder rises per step (docs/fidelity.md).
# On models that attend like trained ones the first level with attention carries the detail and deeper levels cost
# more change per time saved than subsampling keys/values there; what pays on a GPU is few, large kernels:
# subsampling is one copy per block, a block merged whole one merge and one unmerge. Chosen on one call (the measure
# of the published relations the stand-ins are fitted to); over a whole generation from white noise tomesd's and
# ToDo's defaults change the image about as much, and every preset but Quality more than tomesd's (`Fidelity`).
#
# SD1/SD2: Quality and Balanced subsample self-attention's keys/values at level 1 only (2x2: ToDo's default; 4x4).
# Fast and Fastest also merge the level-2 and level-4 blocks whole (0.55 and 0.95 of the tokens).
# SDXL: every preset subsamples keys/values 2x2 at level 2; Balanced to Fastest also merge the sixty level-4 blocks (six
# stacks of ten) whole, one plan, one merge and one unmerge per stack.
_WHOLE = {"merge_crossattn": True, "merge_mlp": True, "share_plan": True, "pool_kv": True}
_SD_DEEP = {**_WHOLE, "min_downsample": 2, "max_downsample": 4}
_SDXL_DEEP = {**_WHOLE, "min_downsample": 4, "max_downsample": 4}

_FIDELITY_SD = (
    "stand-in SD1.5, 512 px: one UNet call at t=500 from a natural-spectrum start; a whole generation: 8 DPM++ 2M"
    " steps from white noise (2026-11-27)"
)
_FIDELITY_SDXL = (
    "stand-in SDXL, 1024 px: one UNet call at t=500 from a natural-spectrum start; a whole generation: 4 DPM++ 2M"
    " steps from white noise (2026-11-27)"
)
_TODO, _TOMESD = "ToDo's default", "tomesd's default"


def _fidelity(
    reference: str, sd: tuple[float, float | None], sdxl: tuple[float, float | None]
) -> Mapping[str, Fidelity]:
    """(one call, a whole generation) per family."""
    return _frozen(
        {
            "sd": Fidelity(reference, sd[0], _FIDELITY_SD, sd[1]),
            "sdxl": Fidelity(reference, sdxl[0], _FIDELITY_SDXL, sdxl[1]),
        }
    )


_H200 = "an NVIDIA H200 at 1024 px"
_GPU_ESTIMATED = (
    "one UNet call, fp16, batch 2, H200 cost model (tome_bench.gpu_estimate) fitted to the H200's kernel profiles of"
    " 2026-11-27, 1024 px"
)


def _gpu(sd: float, sdxl: float) -> Mapping[str, Speed]:
    return _frozen(
        {family: Speed(value, _GPU_ESTIMATED, _H200, False) for family, value in (("sd", sd), ("sdxl", sdxl))}
    )


# No CPU figures: the main job of 2026-11-27 (docs/benchmarks.md) ran on a machine too busy to rank the presets (spread
# up to 38% over the timed runs); where a preset has none, the hint gives its GPU figure on a CPU too.
_PRESETS: tuple[Preset, ...] = (
    Preset(
        "quality",
        "Quality",
        "Smallest change to the image: self-attention attends to keys/values subsampled 2x2 at the first level"
        " with attention, every query kept (ToDo's default).",
        families=_frozen(
            {
                "sd": _frozen({"mode": "kv", "max_downsample": 1}),
                "sdxl": _frozen({"mode": "kv", "min_downsample": 2, "max_downsample": 2}),
            }
        ),
        fidelity=_fidelity(_TODO, (1.0, 1.0), (1.0, 1.0)),
        gpu=_gpu(1.25, 1.05),
    ),
    Preset(
        "balanced",
        "Balanced",
        "The default: SD1/SD2 subsample keys/values 4x4 at level 1; SDXL subsamples them 2x2 at level 2 and merges"
        " 0.3 of the tokens of its level-4 blocks, whole.",
        families=_frozen(
            {
                "sd": _frozen({"mode": "kv", "sx": 4, "sy": 4, "max_downsample": 1}),
                "sdxl": _frozen({**_SDXL_DEEP, "ratio": 0.3}),
            }
        ),
        fidelity=_fidelity(_TOMESD, (0.94, 1.24), (0.92, 1.37)),
        gpu=_gpu(1.33, 1.17),
    ),
    Preset(
        "fast",
        "Fast",
        "Faster: SD1/SD2 also merge 0.55 of the tokens of the level-2 and level-4 blocks whole (4x4 cells); SDXL"
        " merges half the tokens of its level-4 blocks.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_DEEP, "ratio": 0.55, "sx": 4, "sy": 4}),
                "sdxl": _frozen({**_SDXL_DEEP, "ratio": 0.5}),
            }
        ),
        fidelity=_fidelity(_TOMESD, (1.40, 1.50), (1.18, 1.78)),
        gpu=_gpu(1.44, 1.28),
    ),
    Preset(
        "fastest",
        "Fastest",
        "The most speed, softer detail, for drafts: SD1/SD2 subsample keys/values 8x8 at level 1 and merge 0.95 of the"
        " tokens of the level-2 and level-4 blocks whole; SDXL merges 0.7 of the tokens of its level-4 blocks.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_DEEP, "ratio": 0.95, "sx": 8, "sy": 8}),
                "sdxl": _frozen({**_SDXL_DEEP, "ratio": 0.7}),
            }
        ),
        fidelity=_fidelity(_TOMESD, (2.26, 2.19), (1.43, 2.17)),
        gpu=_gpu(1.56, 1.39),
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
# here from `Preset.gpu`, `Preset.cpu`, `Preset.fidelity` and `Preset.help`, so no figure of a preset is typed anywhere
# else.

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


def _relative(ratio: float, reference: str) -> str:
    if abs(ratio - 1) <= 0.03:
        return f"about as much as {reference}"
    if ratio < 1:
        return f"less than {reference} ({ratio:.2f}\u00d7 its change)"
    return f"{ratio:.2f}\u00d7 as much as {reference}"


def change_words(fidelity: Fidelity) -> str:
    """How much a preset changes the image beside its reference, in a user's words: "about as much as ToDo's
    default" within 3%, else "less than" (with the factor) or "1.3× as much as" it; in one step and, where measured,
    over a whole generation; always saying that it was measured on a stand-in model (`Fidelity`)."""
    one = _relative(fidelity.change, fidelity.reference)
    whole = fidelity.generation
    if whole is None:
        return f"{one[:-1]}, stand-in model)" if one.endswith(")") else f"{one} (stand-in model)"
    if abs(fidelity.change - 1) <= 0.03 and abs(whole - 1) <= 0.03:
        return f"{one}, in one step and over a whole generation (stand-in model)"
    over = "about as much" if abs(whole - 1) <= 0.03 else f"{whole:.2f}\u00d7 as much"
    return f"{one} in one step, {over} over a whole generation (stand-in model)"


def _speed_words(speed: Speed, gpu: bool) -> str:
    estimated = "" if speed.measured else ", estimated"
    if gpu:
        return f"about {speed.speedup:.3g}× less GPU time per step on {speed.device}{estimated}"
    return f"about {speed.speedup:.3g}× faster on {speed.device}{estimated}"


def preset_hint(
    preset: Preset | str,
    family: str | None = None,
    size: tuple[int, int] | None = None,
    device: str | None = None,
) -> str:
    """What a user reads to choose `preset`: its own words, then how much faster it made a UNet call and how much it
    changes the image beside the reference it is held to (`Preset.fidelity`: tomesd's or ToDo's default, measured on
    a stand-in model that attends like a trained one), for the model `family` ("sd"/"sdxl") that runs it, or for
    every family when that is not known (None). With `size` (width, height in pixels), a note when the image is
    too small for the preset to merge at some level (`unmerged_levels`): it then gains less.

    `device` is where the model runs: "cuda" gives the GPU figure (`Preset.gpu`), "cpu" (or another device) the CPU
    one (`Preset.cpu`); None (not known, as in a node's tooltip) gives both. Where and how the figures were measured
    is in `preset_details`, e.g. for a tooltip. Example (Balanced, SD1/SD2 loaded, on a GPU)::

        The default. SD1/SD2: about 1.36× less GPU time per step on an NVIDIA H200 at 1024 px; changes the image
        less than tomesd's default (0.91× its change, stand-in model).
    """
    chosen = _preset(preset)
    families = _families(family)
    figures = []
    for name in families:
        gpu, cpu = chosen.gpu.get(name), chosen.cpu.get(name)
        speed = []
        if gpu is not None and (device in (None, "cuda") or cpu is None):
            speed.append(_speed_words(gpu, True))
        if cpu is not None and (device != "cuda" or gpu is None):
            speed.append(_speed_words(cpu, False))
        held = chosen.fidelity.get(name)
        if not speed and held is None:
            figures.append(f"{FAMILY_LABELS[name]}: not measured")
            continue
        text = f"{' ('.join(speed)}{')' if len(speed) > 1 else ''}"
        if held is not None:
            text += f"{'; ' if text else ''}changes the image {change_words(held)}"
        figures.append(f"{FAMILY_LABELS[name]}: {text}")
    text = f"{preset_words(chosen)}. {'; '.join(figures)}."
    if size is not None:
        where = []
        for name in families:
            config = chosen.config(name)
            levels = unmerged_levels(config, name, *size)
            if levels:
                latent = (size[1] // 8, size[0] // 8)
                fits = all(h >= config.sy and w >= config.sx for h, w in (grid(level, latent) for level in levels))
                why = (
                    "its ratio merges no token there"
                    if fits
                    else f"its {config.sx}\u00d7{config.sy} cells do not fit there"
                )
                where.append(f"at level {' and '.join(map(str, levels))} on {FAMILY_LABELS[name]} ({why})")
        if where:
            text += (
                f" At {size[0]}\u00d7{size[1]} px the image is too small for {chosen.label} to merge tokens"
                f" {' or '.join(where)}, so it gains less."
            )
    return text


def preset_details(preset: Preset | str, family: str | None = None) -> str:
    """The internals behind `preset_hint`, one line per family (`family` alone when given): what the preset runs
    (`describe_config`) and where its figures were measured, e.g. for a tooltip or a details line::

        SD1/SD2: keys/values pooled over 4×4 cells, max downsample 1 (change beside tomesd's default (ratio 0.5, ...):
        0.91×, measured on a stand-in SD1.5, 512 px, ...; 1.36× faster, measured: one UNet call, fp16, ...; ...)
    """
    chosen = _preset(preset)
    lines = []
    for name in _families(family):
        line = f"{FAMILY_LABELS[name]}: {describe_config(chosen.config(name), name)}"
        notes = []
        held = chosen.fidelity.get(name)
        if held is not None:
            notes.append(
                f"change beside {REFERENCES.get(held.reference, held.reference)}: {held.change:.3g}\u00d7"
                + (
                    ""
                    if held.generation is None
                    else f" in one step, {held.generation:.3g}\u00d7 in a whole generation"
                )
                + f", measured on a {held.setting}, a model that attends like a trained one"
            )
        for speed, gain in ((chosen.gpu.get(name), "less GPU time"), (chosen.cpu.get(name), "faster")):
            if speed is not None:
                how = "measured" if speed.measured else "estimated"
                notes.append(f"{speed.speedup:.3g}\u00d7 {gain}, {how}: {speed.setting}")
        if notes:
            line += f" ({'; '.join(notes)})"
        lines.append(line)
    return "\n".join(lines)


def presets_table(family: str | None = None) -> str:
    """The presets as a table for reading, one row per preset: its name (`apply_patch(model, preset=name)`), the
    words a user chooses it by, and per model family (`family` alone when given) the GPU speed-up ("(est.)" where the
    cost model estimated it, `Preset.gpu`) and the change of the image beside the preset's reference
    (`Preset.fidelity`); then where the figures were measured.
    `print(tome_core.presets())` prints the table for every family."""
    return _table(_PRESETS, family)


def _table(listed: tuple[Preset, ...], family: str | None) -> str:
    import textwrap

    families = _families(family)
    short = {"tomesd's default": "tomesd", "ToDo's default": "ToDo"}

    def cells(preset: Preset, name: str) -> list[str]:
        gpu, held = preset.gpu.get(name), preset.fidelity.get(name)
        speed = "-" if gpu is None else f"{gpu.speedup:.3g}\u00d7{'' if gpu.measured else '*'}"
        change = "-"
        if held is not None:
            whole = "" if held.generation is None else f"/{held.generation:.2f}"
            change = f"{held.change:.2f}{whole}\u00d7 {short.get(held.reference, held.reference)}"
        return [speed, change]

    head = [f"{FAMILY_LABELS[name]} {what}" for name in families for what in ("GPU", "change")]
    rows = [["preset", "chosen for", *head]]
    for preset in listed:
        # The default preset's words say so ("The default"): no marker beside its name, which is what apply_patch takes.
        rows.append([preset.name, preset_words(preset), *(cell for f in families for cell in cells(preset, f))])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in rows]
    lines += [
        "",
        "GPU: less GPU time per UNet call than the unpatched model's (* estimated, else measured). change: how much the",
        "image changes beside the reference the preset is held to (tomesd's or ToDo's default: the same change = 1.00×),",
        "in one step/over a whole generation, measured on a stand-in model that attends like a trained one. Runs:",
    ]
    for name in families:
        runs = dict.fromkeys(
            [p.gpu[name].setting for p in listed if name in p.gpu]
            + [p.fidelity[name].setting for p in listed if name in p.fidelity]
        )
        for run in runs:
            lines += textwrap.wrap(f"{FAMILY_LABELS[name]}: {run}", 118, initial_indent="  ", subsequent_indent="    ")
    lines.append(
        "Settings per family: tome_core.get_preset(name).config(family); use: apply_patch(model, preset=name)."
    )
    return "\n".join(lines)
