"""What users read to choose a preset: the WebUI's hint under "Speed", ComfyUI's node description and log line,
`tome_core.presets()`. Made here from the presets (`tome_core.presets`), their speed per size (`tome_core.figures`,
the table the lab writes) and their change beside the references users know, so no figure is typed anywhere else.

The words are for someone generating images: "about 1.06× faster per step at 512×512, 1.33× in the 1024×1024 hires
pass (NVIDIA H200, estimated)", "changes the image about as much as tomesd's default".
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tome_core import figures
from tome_core.config import TomeConfig
from tome_core.families import DIT_FAMILIES, FIGURES_FAMILIES
from tome_core.plan import BlockPlan, grid, layout_table, plan_dit
from tome_core.presets import ALL_FAMILIES, FAMILIES, REFERENCES, Fidelity, Preset, all_presets, get_preset

#: Transformer blocks per UNet level (1: the full latent, 2: the first downsampled level, ...) in each UNet
#: family: SD1/SD2 have 2 down and 3 up at each of 1/1, 1/2 and 1/4 and one in the middle; SDXL none at 1/1, 10 at
#: 1/2 and 60 at 1/4 (`tome_core.blocks_per_level` of the real UNets; the tests check it). For a UI that has no
#: model at hand: `tome_core.describe_layout(FAMILY_LAYOUTS[family], ...)`.
FAMILY_LAYOUTS: Mapping[str, Mapping[int, int]] = MappingProxyType(
    {"sd": MappingProxyType({1: 5, 2: 5, 4: 5, 8: 1}), "sdxl": MappingProxyType({2: 10, 4: 60})}
)
#: How users call each model family.
FAMILY_LABELS: Mapping[str, str] = MappingProxyType(
    {"sd": "SD1/SD2", "sdxl": "SDXL", **{f.name: f.label for f in DIT_FAMILIES}}
)
#: The size a family's figures are given at when the user's is not known (width, height, frames): what people
#: generate at with it.
TYPICAL_SIZES: Mapping[str, tuple[int, int, int]] = MappingProxyType(
    {
        "sd": (512, 512, 1),
        "sdxl": (1024, 1024, 1),
        "flux": (1024, 1024, 1),
        "chroma": (1024, 1024, 1),
        "flux2": (1024, 1024, 1),
        "qwen": (1328, 1328, 1),
        "zimage": (1024, 1024, 1),
        "lumina2": (1024, 1024, 1),
        "sd3": (1024, 1024, 1),
        "wan": (832, 480, 81),
        "wan22-5b": (1280, 704, 121),  # the speed table's Wan 2.2 TI2V 5B (`tome_core.families.FIGURES_FAMILIES`)
        "hunyuanvideo": (1280, 720, 129),
        "hunyuanvideo15": (1280, 720, 121),
        "ltx": (768, 512, 121),
        "ltx2": (1280, 720, 121),
    }
)
#: Blocks a diffusion transformer family has (the full-size public checkpoints), for words without a model.
DIT_BLOCKS: Mapping[str, int] = MappingProxyType(
    {
        "flux": 57,
        "chroma": 57,
        "flux2": 56,
        "qwen": 60,
        "zimage": 30,
        "lumina2": 26,
        "sd3": 38,
        "wan": 40,
        "hunyuanvideo": 60,  # 20 double-stream blocks, 40 single-stream ones
        "hunyuanvideo15": 54,
        "ltx": 28,  # LTX-Video 2B (13B: 48)
        "ltx2": 48,
    }
)

Size = tuple[int, int] | tuple[int, int, int]


def _preset(preset: Preset | str) -> Preset:
    return preset if isinstance(preset, Preset) else get_preset(preset)


def _families(family: str | None) -> tuple[str, ...]:
    """The families to speak of: the model's alone when it is known, else the UNet families (what a WebUI runs
    before a model is loaded)."""
    if family is None:
        return FAMILIES
    if family not in ALL_FAMILIES:
        raise ValueError(f"model family must be one of {', '.join(map(repr, ALL_FAMILIES))} or None, got {family!r}")
    return (family,)


def preset_words(preset: Preset | str) -> str:
    """The preset's own words for what a user chooses it for: its help up to the first colon or full stop
    ("Smallest change to the image" for Quality)."""
    text = _preset(preset).help
    ends = [i for i in (text.find(": "), text.find(". "), len(text.rstrip("."))) if i >= 0]
    return text[: min(ends)].strip()


# ---------------------------------------------------------------------------------------------- what a config runs


def describe_config(config: TomeConfig, family: str | None = None) -> str:
    """What a config runs, in its own terms (cells, ratios, levels or blocks), as its block table (`tome_core.plan`)
    plans it on a `family` model: the internals behind a hint, for custom settings and for a preset's details.
    Without a family, the words for every UNet family when they are the same, else each family's after its name."""
    words = {name: _config_words(config, name) for name in _families(family)}
    if len(set(words.values())) == 1:
        return next(iter(words.values()))
    return "; ".join(f"{FAMILY_LABELS[name]}: {text}" for name, text in words.items())


def _dit_words(config: TomeConfig, family: str) -> str:
    count = DIT_BLOCKS[family]
    table = plan_dit(config, count)

    def blocks(kind: str) -> str:
        found = [block.index for block in table.blocks if block.kind == kind]
        if len(found) == count:
            return "every block"
        return f"blocks {found[0] + 1} to {found[-1] + 1} of {count}" if found else ""

    cells = f"{config.sx}\u00d7{config.sy} cells" + (f" over {config.st} frames" if config.st > 1 else "")
    parts = []
    merged, pooled = blocks("whole"), blocks("kv")
    if merged:
        parts.append(f"{merged} run on merged generated tokens, one per {config.sx}\u00d7{config.sy} cell")
    if pooled:
        parts.append(f"keys/values of the generated tokens subsampled over {cells} in {pooled}")
        parts.append("each query also attending to its own key")
    if not parts:
        return "no reduction"
    parts.append("text and reference tokens kept whole")
    if (config.step_start, config.step_end) != (0.0, 1.0):
        parts.append(f"steps {config.step_start:g} to {config.step_end:g}")
    return ", ".join(parts)


def _config_words(config: TomeConfig, family: str) -> str:
    if family in DIT_BLOCKS:
        return _dit_words(config, family)
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
    if (config.block_start, config.block_end) != (0.0, 1.0):
        parts.append(f"blocks {config.block_start:g} to {config.block_end:g} of the depth")
    if (config.step_start, config.step_end) != (0.0, 1.0):
        parts.append(f"steps {config.step_start:g} to {config.step_end:g}")
    return ", ".join(parts)


def unmerged_levels(config: TomeConfig, family: str, width: int, height: int) -> tuple[int, ...]:
    """The levels at which `config` selects blocks of a UNet `family` model to merge tokens (ToMe's merge, the
    feed-forward) but an image of `width` x `height` pixels is too small: the level's token grid is narrower or lower
    than one `sx` x `sy` cell, which holds the one token the others merge into, so those blocks run unmerged (pooling
    keys/values needs no cell and runs at any size). Read from the family's block table
    (`tome_core.plan.BlockTable.unmerged`); a diffusion transformer merges no tokens: ()."""
    if family not in FAMILY_LAYOUTS:
        return ()
    return layout_table(FAMILY_LAYOUTS[family], config).unmerged((height // 8, width // 8))


# ---------------------------------------------------------------------------------------------- change and speed


def _ratio(fidelity: Fidelity) -> float:
    """The change users see: over a whole generation where measured, else in one step."""
    ratio = fidelity.generation if fidelity.generation is not None else fidelity.change
    assert ratio is not None  # a Fidelity has one or the other
    return ratio


def change_words(fidelity: Fidelity) -> str:
    """How much a preset changes the final image beside the reference users know, in plain words: "about as much
    as tomesd's default" (within 15%), else "less than" or "more than" it with the factor, as measured over a whole
    generation (one step where no generation was measured)."""
    ratio = _ratio(fidelity)
    source = f", {fidelity.source}" if fidelity.source else ""  # a DiT's: the trained model or a re-fitted stand-in
    if abs(ratio - 1) <= 0.15:
        return f"about as much as {fidelity.reference}" + (f" ({fidelity.source})" if source else "")
    if ratio < 1:
        figure = f"{ratio:.2f}" if source else f"{ratio:.1f}"
        return f"less than {fidelity.reference} ({figure}\u00d7 its change{source})"
    return f"more than {fidelity.reference} ({ratio:.1f}\u00d7 its change{source})"


def _size_text(size: Size) -> str:
    text = f"{size[0]}\u00d7{size[1]}"
    return text + (f", {size[2]} frames" if len(size) > 2 and size[2] > 1 else "")


def _size3(size: Size) -> tuple[int, int, int]:
    return (size[0], size[1], size[2] if len(size) > 2 else 1)


def speed_words(preset: Preset | str, family: str, size: Size | None = None, hires: Size | None = None) -> str:
    """How much faster `preset` makes each step on a `family` model at `size` (width, height[, frames]; the
    family's typical size when None) and, with `hires`, in the hires pass at that size, from the speed table
    (`tome_core.figures`): "about 1.06× faster per step at 512×512, 1.33× in the 1024×1024 hires pass (NVIDIA H200,
    estimated)"; "" when the table has no figure for it."""
    name = _preset(preset).name
    first = _size3(size) if size is not None else TYPICAL_SIZES[family]
    found = figures.speed(family, name, *first)
    if found is None:
        return ""
    parts = [f"{_bound(found)}{_factor(found)} {_per(_preset(preset), family)} at {_size_text(first)}"]
    sources = [found.source]
    if hires is not None:
        second = figures.speed(family, name, *_size3(hires))
        if second is not None:
            parts.append(f"{_bound(second, False)}{_factor(second, False)} in the {_size_text(hires)} hires pass")
            sources.append(second.source)
    how = "measured" if all(s.measured for s in sources) else "estimated"
    devices = " and ".join(dict.fromkeys(s.device for s in sources))
    return f"{', '.join(parts)} ({devices}, {how})"


def _per(preset: Preset, family: str) -> str:
    """What a figure is over: "per step", or "over a generation" where the preset reduces only some of the steps
    (its step window: the table's figure then averages its reduced steps with the others)."""
    fields = preset.families.get(FIGURES_FAMILIES.get(family, family), {})
    windowed = fields.get("step_start", 0.0) > 0 or fields.get("step_end", 1.0) < 1
    return "over a generation" if windowed else "per step"


def not_reached_words(stats: Any, generic: str) -> list[str]:
    """Why planned blocks were not reached, for a host's note or log: the core's reasons (`TomeStats.not_reached`,
    each with its block count when there are several), and the host's `generic` one for the blocks they leave."""
    known = list(stats.not_reached)
    reasons = [reason + (f" ({n})" if len(known) > 1 else "") for reason, n in known]
    if sum(n for _, n in known) < stats.planned - stats.reached:
        reasons.append(generic)
    return reasons


def _slower(found: figures.Speed) -> bool:
    """Whether the figure, as printed, is under 1×: on few tokens (a diffusion transformer at 512×512) the kernels a
    preset adds can cost more than the attention it saves."""
    return round(found.speedup, 2) < 1


def _factor(found: figures.Speed, first: bool = True) -> str:
    """ "1.12× faster", or "1.01× slower" where the preset costs time ("0.99× faster" would read as a gain)."""
    if _slower(found):
        return f"{1 / found.speedup:.2f}\u00d7 slower"
    return f"{found.speedup:.2f}\u00d7" + (" faster" if first else "")


def _bound(found: figures.Speed, first: bool = True) -> str:
    """ "at most " / "at least " outside the table's sizes (swapped for a slowdown: at most 0.99× the speed is at
    least 1.01× slower), else "about " before the first figure."""
    if not found.bound:
        return "about " if first else ""
    if _slower(found):
        return {"at most": "at least ", "at least": "at most "}[found.bound]
    return f"{found.bound} "


def preset_hint(
    preset: Preset | str,
    family: str | None = None,
    size: Size | None = None,
    device: str | None = None,
    hires: Size | None = None,
    figures_family: str | None = None,
) -> str:
    """What a user reads to choose `preset`: its own words, then for the model `family` that runs it (every UNet
    family when that is not known) how much faster each step gets at `size` (and in a hires pass at `hires`) and how
    much it changes the image beside the reference users know; a note when the image is too small for the preset
    to merge at some level. `device` is where the model runs (figures are a GPU's; on a CPU the hint says so).
    `figures_family`: the speed table's rows for that model where they are not `family`'s
    (`tome_core.families.figures_family`: a Wan 2.2 TI2V 5B's), its words and change staying `family`'s.
    Example (Balanced, SD1/SD2, 512 px with a 1024 px hires pass)::

        The default. SD1/SD2: about 1.06× faster per step at 512×512, 1.33× in the 1024×1024 hires pass (NVIDIA
        H200, estimated); changes the image more than tomesd's default (1.2× its change).
    """
    chosen = _preset(preset)
    figures_text = []
    for name in _families(family):
        rows = figures_family if family is not None and figures_family is not None else name
        speed = speed_words(chosen, rows, size, hires)
        held = chosen.fidelity.get(name)
        change = f"changes the image {change_words(held)}" if held is not None else "its change not measured yet"
        figures_text.append(f"{FAMILY_LABELS[name]}: {'; '.join(t for t in (speed, change) if t)}")
    text = f"{preset_words(chosen)}. {'; '.join(figures_text)}."
    if device is not None and device != "cuda" and any(figures_text):
        text += " Figures are a GPU's; on a CPU the gain differs."
    if size is not None:
        text += _small_note(chosen, _families(family), size)
    return text


def _small_note(chosen: Preset, families: tuple[str, ...], size: Size) -> str:
    where = []
    for name in families:
        config = chosen.config(name)
        levels = unmerged_levels(config, name, size[0], size[1])
        if levels:
            latent = (size[1] // 8, size[0] // 8)
            fits = all(h >= config.sy and w >= config.sx for h, w in (grid(level, latent) for level in levels))
            why = (
                "its ratio merges no token there"
                if fits
                else f"its {config.sx}\u00d7{config.sy} cells do not fit there"
            )
            where.append(f"at level {' and '.join(map(str, levels))} on {FAMILY_LABELS[name]} ({why})")
    if not where:
        return ""
    return (
        f" At {size[0]}\u00d7{size[1]} px the image is too small for {chosen.label} to merge tokens"
        f" {' or '.join(where)}, so it gains less."
    )


def preset_details(preset: Preset | str, family: str | None = None) -> str:
    """The internals behind `preset_hint`, one line per family (`family` alone when given): what the preset runs
    (`describe_config`), how its change was measured and where its speed figures come from, e.g. for a tooltip."""
    chosen = _preset(preset)
    lines = []
    for name in _families(family):
        line = f"{FAMILY_LABELS[name]}: {describe_config(chosen.config(name), name)}"
        notes = []
        held = chosen.fidelity.get(name)
        if held is not None:
            figures_text = [f"{held.change:.2f}\u00d7 in one step"] if held.change is not None else []
            figures_text += (
                [f"{held.generation:.2f}\u00d7 over a whole generation"] if held.generation is not None else []
            )
            notes.append(
                f"change beside {REFERENCES.get(held.reference, held.reference)}: {', '.join(figures_text)},"
                f" measured on {held.setting}"
            )
        sizes = figures.sizes(name, chosen.name)
        if sizes:
            found = [figures.speed(name, chosen.name, *s) for s in sizes]
            each = ", ".join(f"{f.speedup:.2f}\u00d7 at {_size_text(f.size)}" for f in found if f is not None)
            source = found[0].source if found[0] is not None else None
            notes.append(f"faster per step: {each}" + (f" ({source.what})" if source is not None else ""))
        if notes:
            line += f" ({'; '.join(notes)})"
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the table


class PresetList(tuple[Preset, ...]):
    """What `presets()` returns: a tuple of the presets that prints as a table (`presets_table`), in a REPL
    (`>>> tome_core.presets()`), with `print` and in IPython alike. Indexing and iterating give the `Preset`s."""

    __slots__ = ()

    def __str__(self) -> str:
        return _table(self, None, None)

    __repr__ = __str__

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's display hook."""
        printer.text(str(self))


def presets() -> PresetList:
    """Every preset, from the most faithful to the fastest: a tuple of `Preset`s that prints as a table
    (`presets_table`)."""
    return PresetList(all_presets())


def presets_table(family: str | None = None, size: Size | None = None) -> str:
    """The presets as a table for reading, one row per preset: its name (`apply_patch(model, preset=name)`), the
    words a user chooses it by, and per model family (`family` alone when given; without it the UNet families and the
    diffusion transformers) how much faster a step gets at `size` (each family's typical size when None) and how
    much it changes the image beside its reference. `print(tome_core.presets())` prints it for every family."""
    return _table(all_presets(), family, size)


def _table(listed: tuple[Preset, ...], family: str | None, size: Size | None) -> str:
    families = ALL_FAMILIES if family is None else _families(family)
    short = {
        "tomesd's default": "tomesd's",
        "ToDo's default": "ToDo's",
        "keys/values 2×2 in every block": "kv 2×2 everywhere",
        "dropping steps for the same time": "fewer steps",
    }
    rows = [["family", "preset", "chosen for", "per step", "change"]]
    for name in families:
        at = _size3(size) if size is not None else TYPICAL_SIZES[name]
        for preset in listed:
            found = figures.speed(name, preset.name, *at)
            speed = "-" if found is None else f"{found.speedup:.2f}\u00d7{'' if found.source.measured else '*'}"
            held = preset.fidelity.get(name)
            change = "-" if held is None else f"{_ratio(held):.2f}\u00d7 {short.get(held.reference, held.reference)}"
            label = f"{FAMILY_LABELS[name]} " + "\u00d7".join(map(str, at if at[2] > 1 else at[:2]))
            rows.append([label, preset.name, preset_words(preset), speed, change])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in rows]
    notes = (
        "family: at width×height(×frames). per step: how much faster one model call gets at that size on a GPU,"
        " unpatched over patched, over a whole generation where the preset reduces only later steps (the"
        " diffusion transformers') (* estimated, else measured;"
        " tome_core.figures). change: how much the final image changes beside the reference the preset is held to"
        " (the same change = 1.00×; - not measured yet). Settings: tome_core.get_preset(name).config(family); use:"
        " apply_patch(model, preset=name)."
    )
    return "\n".join([*lines, "", *textwrap.wrap(notes, 118)])
