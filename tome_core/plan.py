"""One plan per transformer block, decided once: what each block of a UNet does under a `TomeConfig`.

`plan_blocks` turns a config and the UNet's transformer blocks (`BlockShape`: where each sits, which modules it
has) into a `BlockTable` of immutable `BlockPlan`s, one per block: nothing, self-attention over pooled keys/values
("kv"), its modules merged one by one ("modules"), or the whole block run on merged tokens ("whole"); with the
cells, ratios and shared plan it uses. `apply_patch` hooks what the table names and nothing else, and every word
about what a config does (`describe`, `describe_layout`, the presets' details and size hints, `stats`, the hosts'
notes and log lines) reads the same table: none works it out again. A UI without a model plans a model family's
layout (`layout_table`: standard blocks, as `presets.FAMILY_LAYOUTS` counts them). A diffusion transformer's blocks
are planned by `plan_dit`: one grid, keys/values subsampled in the blocks of the block window.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tome_core.config import LEVELS, TomeConfig, auto_levels
from tome_core.merge import kv_tokens, merged_tokens

#: What a block does: nothing; self-attention attends to keys/values pooled over cells; its modules run on merged
#: tokens one by one (each merges and unmerges); the whole block runs on merged tokens (one merge, one unmerge).
KINDS = ("none", "kv", "modules", "whole")
#: A transformer block's modules in the order it runs them: self-attention, cross-attention, feed-forward.
BLOCK_MODULES = ("attn1", "attn2", "ff")
#: What `BlockPlan.tokens` counts: the block's input, self-attention's queries and the keys/values it attends to,
#: cross-attention's queries, the feed-forward's tokens.
PARTS = ("block", "attn1", "kv", "attn2", "ff")


@dataclass(frozen=True)
class LevelInfo:
    """What `describe` reports for one downsampling level of a UNet at a given image size: its transformer blocks,
    those that merge or pool, the tokens of its grid and those self-attention attends to (`BlockPlan.tokens`)."""

    level: int
    blocks: int
    merging: int
    tokens: int
    tokens_after: int


@dataclass(frozen=True)
class BlockShape:
    """Where a transformer block sits and which modules it has: all the plan needs to know of it."""

    level: int  # downsampling level: 1 = the full latent, 2 = half, ...
    stack: int | None = None  # the number of its transformer stack (Transformer2DModel / SpatialTransformer)
    position: int = 0  # its place in that stack
    length: int = 1  # the stack's blocks
    modules: tuple[str, ...] = BLOCK_MODULES  # which of attn1, attn2, ff it has
    self_attention: bool = True  # attn1 attends to the block's own tokens (it may pool them)


@dataclass(frozen=True)
class BlockPlan:
    """What one transformer block does under a config (`KINDS`), and with what."""

    index: int  # forward order among the UNet's transformer blocks
    shape: BlockShape
    kind: str = "none"
    merges: tuple[tuple[str, float], ...] = ()  # (module, ratio) of each module that runs on merged tokens
    pools: bool = False  # self-attention attends to keys/values pooled over the cells
    sx: int = 1
    sy: int = 1
    matching: str = "local"
    key: tuple[Any, ...] = ()  # the blocks of one key match once per UNet call and merge with that plan
    carries: bool = False  # merged whole in a stack that stays merged from its first block to its last
    st: int = 1  # frames per cell (video diffusion transformers' keys/values)

    @property
    def level(self) -> int:
        return self.shape.level

    @property
    def modules(self) -> tuple[str, ...]:
        """What runs on pooled or merged tokens, in `TomeStats.modules`' names: "kv", "attn1", "attn2", "ff"."""
        return ("kv",) * self.pools + tuple(name for name, _ in self.merges)

    @property
    def ratios(self) -> tuple[float, ...]:
        """The ratios this block merges at (one plan each), in module order."""
        return tuple(dict.fromkeys(ratio for _, ratio in self.merges))

    @property
    def positions(self) -> range:
        """The positions of its stack that run merged when this block merges its input: the whole stack when it
        carries, else its own."""
        if self.carries:
            return range(self.shape.length)
        return range(self.shape.position, self.shape.position + 1)

    def kept(self, ratio: float, h: int, w: int) -> int:
        """Tokens an h x w grid keeps when this block's plan merges `ratio` of them."""
        return merged_tokens(h, w, self.sx, self.sy, ratio, self.matching)

    def tokens(self, h: int, w: int) -> dict[str, int]:
        """The tokens each of the block's `PARTS` computes on at an h x w grid."""
        n = h * w
        merged = {name: self.kept(ratio, h, w) for name, ratio in self.merges}
        if self.kind == "whole":
            return dict.fromkeys(PARTS, next(iter(merged.values())))
        out = {"block": n, **dict.fromkeys(("attn1", "attn2", "ff"), n), **merged}
        out["kv"] = kv_tokens(h, w, self.sx, self.sy) if self.pools else out["attn1"]
        return {part: out[part] for part in PARTS}

    def merges_at(self, h: int, w: int) -> bool:
        """Whether any of its merges keeps fewer tokens than an h x w grid holds (a grid without a whole cell, or
        a ratio too small for one token, merges nothing)."""
        return any(self.kept(ratio, h, w) < h * w for ratio in self.ratios)


def grid(level: int, latent: tuple[int, int]) -> tuple[int, int]:
    """The token grid (rows, columns) of a level for a latent of (height, width): each downsampling rounds up."""
    return math.ceil(latent[0] / level), math.ceil(latent[1] / level)


@dataclass(frozen=True)
class BlockTable:
    """Every transformer block's plan, in forward order, and the levels the config selects."""

    config: TomeConfig
    blocks: tuple[BlockPlan, ...]
    selected: frozenset[int]  # levels the config merges at ("auto" resolved), with transformer blocks or not
    pooled: frozenset[int]  # levels where self-attention pools keys/values instead (`pool_kv`)

    @property
    def acting(self) -> tuple[BlockPlan, ...]:
        """The blocks that do something: those the patch hooks."""
        return tuple(block for block in self.blocks if block.kind != "none")

    @property
    def levels(self) -> frozenset[int]:
        """The levels the config merges or pools at."""
        return self.selected | self.pooled

    @property
    def block_levels(self) -> frozenset[int]:
        return frozenset(block.level for block in self.blocks)

    def modules(self) -> tuple[tuple[str, int], ...]:
        """(kind of module, blocks) for each kind that runs pooled or merged, in `TomeStats.modules`' order."""
        counts = Counter(name for block in self.blocks for name in block.modules)
        return tuple((name, counts[name]) for name in ("kv", "attn1", "attn2", "ff") if counts[name])

    def level_infos(self, latent: tuple[int, int]) -> list[LevelInfo]:
        """Per level with transformer blocks, for a latent of (height, width): what `describe` reports."""
        out = []
        for level in sorted(self.block_levels):
            here = [block for block in self.blocks if block.level == level]
            acting = [block for block in here if block.kind != "none"]
            h, w = grid(level, latent)
            after = acting[0].tokens(h, w)["kv"] if acting else h * w
            out.append(LevelInfo(level, len(here), len(acting), h * w, after))
        return out

    def unmerged(self, latent: tuple[int, int]) -> tuple[int, ...]:
        """The levels whose blocks plan to merge tokens but merge none at a latent of (height, width): the grid is
        smaller than one cell there (pooling keys/values needs none)."""
        out = []
        for level in sorted(self.block_levels):
            merging = [block for block in self.blocks if block.level == level and block.merges]
            if merging and not any(block.merges_at(*grid(level, latent)) for block in merging):
                out.append(level)
        return tuple(out)


def plan_blocks(config: TomeConfig, shapes: Sequence[BlockShape]) -> BlockTable:
    """The table of what each block (`shapes`, in forward order) does under `config`."""
    counts = Counter(shape.level for shape in shapes)
    levels = set(LEVELS) | set(counts)
    selected: frozenset[int] = frozenset()
    pooled: frozenset[int] = frozenset()
    if not config.is_noop:
        auto = auto_levels(counts)
        selected = frozenset(level for level in levels if _selects(config, level, auto))
        pooled = frozenset(levels - selected) if config.pool_kv else frozenset()
    plans = [
        _plan(config, index, shape, shape.level in selected, shape.level in pooled)
        if config.block_selected(index, len(shapes))
        else BlockPlan(index, shape)
        for index, shape in enumerate(shapes)
    ]
    if config.share_plan:
        # A stack stays merged from its first block to its last only when each of its blocks merges whole.
        whole = Counter(plan.shape.stack for plan in plans if plan.kind == "whole" and plan.shape.stack is not None)
        plans = [
            replace(plan, carries=True)
            if plan.kind == "whole" and plan.shape.length > 1 and whole[plan.shape.stack] == plan.shape.length
            else plan
            for plan in plans
        ]
    return BlockTable(config, tuple(plans), selected, pooled)


def layout_table(blocks_per_level: Mapping[int, int], config: TomeConfig) -> BlockTable:
    """`plan_blocks` for a UNet known only by its transformer blocks per level (a model family's layout in a UI that
    has no model at hand), as standard blocks in stacks of one."""
    levels = [level for level, count in blocks_per_level.items() if count > 0]
    shapes = [BlockShape(level) for level in sorted(levels) for _ in range(blocks_per_level[level])]
    return plan_blocks(config, shapes)


def plan_dit(config: TomeConfig, count: int) -> BlockTable:
    """The table of a diffusion transformer's `count` blocks (forward order) under `config`. In "kv" mode the blocks
    of the block window subsample self-attention's keys/values over st x sy x sx cells of the generated tokens
    ("kv"). In "merge" mode the window's blocks run on merged generated tokens ("whole": one merge before the
    window's first block, one unmerge after its last, every generated token merged into one destination per cell),
    and with `pool_kv` the other blocks subsample keys/values. A DiT's tokens are one grid (level 1): the patch grid
    of the latent."""
    acting = not config.is_noop
    merging = config.mode == "merge"
    ratio = config.max_ratio
    plans = []
    for index in range(count):
        shape = BlockShape(1, 0 if merging else None, index, count, ("attn1", "ff") if merging else ("attn1",))
        selected = acting and config.block_selected(index, count)
        key = ("block", index)
        if selected and merging:
            merges = (("attn1", ratio), ("ff", ratio))
            plans.append(BlockPlan(index, shape, "whole", merges, False, config.sx, config.sy, "local", key, True))
        elif selected or (acting and merging and config.pool_kv):
            plans.append(BlockPlan(index, shape, "kv", (), True, config.sx, config.sy, "local", key, st=config.st))
        else:
            plans.append(BlockPlan(index, shape))
    level = frozenset({1}) if acting else frozenset()
    return BlockTable(config, tuple(plans), level, frozenset())


def family_of_levels(levels: Sequence[int]) -> str:
    """ "sdxl" when the first transformer blocks sit at level 2 or deeper (SDXL), else "sd" (SD1.x, SD2.x)."""
    return "sdxl" if min(levels) >= 2 else "sd"


def _selects(config: TomeConfig, level: int, auto: frozenset[int]) -> bool:
    """Whether the config merges (or, in kv mode, pools) at `level`; `auto` resolves max_downsample "auto"."""
    if level < config.min_downsample:
        return False
    if config.max_downsample == "auto":
        return level in auto
    return level <= int(config.max_downsample)


def _plan(config: TomeConfig, index: int, shape: BlockShape, selected: bool, pooled: bool) -> BlockPlan:
    pools = (pooled or (selected and config.mode == "kv" and config.merge_attn)) and shape.self_attention
    pools = pools and "attn1" in shape.modules
    ratios = config.ratios_by_kind
    wanted = {
        "attn1": selected and config.merge_attn and config.mode == "merge",
        "attn2": selected and config.merge_crossattn,
        "ff": selected and config.merge_mlp and shape.level >= config.mlp_min_downsample,
    }
    merges = tuple(
        (name, ratio)
        for name in shape.modules
        if wanted[name] and (ratio := ratios["mlp" if name == "ff" else "attn"]) > 0
    )
    if not (merges or pools):
        return BlockPlan(index, shape)
    # Local matching merges a block whose every module merges at one ratio as a whole: the same as merging each
    # module with one plan (up to the layer norms seeing merged tokens), for one merge and one unmerge.
    whole = config.mode == "merge" and config.matching == "local" and len({ratio for _, ratio in merges}) == 1
    whole = whole and tuple(name for name, _ in merges) == shape.modules
    kind = "whole" if whole else "modules" if merges else "kv"
    return BlockPlan(
        index, shape, kind, merges, pools, config.sx, config.sy, config.matching, _plan_key(config, index, shape)
    )


def _plan_key(config: TomeConfig, index: int, shape: BlockShape) -> tuple[Any, ...]:
    """Which blocks share a merge plan within a call. Shared plans: a stack of several blocks (SDXL's, 10 at level
    4) matches once, at its first block; the single-block stacks of a level (SD1/SD2's) share one plan per level, so
    a call matches once per stack or level, never once per block."""
    if not config.share_plan:
        return ("block", index)
    if shape.stack is not None and shape.length > 1:
        return ("stack", shape.stack)
    return ("level", shape.level)
