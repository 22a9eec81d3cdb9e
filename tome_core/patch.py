"""Apply and remove token merging on a UNet instance.

Nothing here changes a class. A patch is one hook object per patched module, installed as that instance's
`forward` (a bound method of the hook, the way diffusers installs its hooks), plus one pre- and one post-hook
registered on the UNet itself; `remove_patch` takes exactly those away. The WebUI's built-in token merging
(tomesd) unpatches by the class name `ToMeBlock` and the attribute `_tome_info`; we use neither, so the two never
undo each other.

Built to stay whole under `torch.compile(fullgraph=True)`:

* The UNet's registered hooks run eagerly, also around a compiled UNet (`compat.eager`): they count calls, decide
  the step window and work out the call's grids. The UNet's forward hook hands the blocks the timestep the forward
  received (a graph input when compiled). The first block on a grid makes the call's partition: eagerly from
  index tensors kept per grid, in a graph from tensors the graph builds itself and a hash of that timestep. So
  nothing in the compiled region reads a value back, makes a tensor on the host, draws from a generator, or reads
  a tensor from the patch's state (under CUDA graphs that would be a static input, re-recorded at a new address).
* A block's plan exists only while the block runs: its hook matches the tokens, its modules' hooks merge and
  unmerge with that plan, and it is dropped before the block returns. No state passes from one call to the next
  through a graph, so a sampling traces once, and a new patch with the same settings reuses that graph.
* What the hooks did is recorded as flags they set and never read (`stats`): a compiled graph replays those
  stores after every run, so the counts hold for compiled and eager calls alike.
* Installing a hook changes the module's `forward`, which torch.compile's guards watch: a UNet compiled before
  the patch traces again (once) and merges; after `remove_patch` its earlier graph is valid again.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from tome_core.compat import eager, is_compiling, static_sizes, uncompiled
from tome_core.config import LEVELS, TomeConfig, auto_levels
from tome_core.merge import (
    BandMatch,
    BandMerge,
    GridLayout,
    Match,
    Merge,
    Partition,
    PartitionTable,
    fixed_slots,
    grid_layout,
    hashed_partition,
    kv_downsample,
    match,
    merged_tokens,
    partition,
    plan,
    random_partitions,
)
from tome_core.merge import band_match as _band_match
from tome_core.merge import band_merge as _band_merge

STATE_ATTR = "_tome_sd_state"

#: Timesteps the SD noise schedules were trained with; maps a timestep to a sampling fraction.
_TRAIN_TIMESTEPS = 1000
#: Keywords through which attention modules take keys and values (ldm/sgm/Forge, diffusers, Forge's values).
_KV_KEYWORDS = ("context", "encoder_hidden_states", "value")
#: Seed used when the config leaves `seed` as None.
_DEFAULT_SEED = 0x70E5
#: Downsampling factors a block's token count is looked up at (beyond LEVELS: the middle block of deep UNets).
_GRID_LEVELS = (*LEVELS, 16, 32)


@dataclass(frozen=True)
class LevelInfo:
    """What `describe` reports for one downsampling level of a UNet at a given image size."""

    level: int
    blocks: int
    merging: int
    tokens: int
    tokens_after: int


#: Which ratio each hooked module merges with: attention (self and cross) or the feed-forward.
_TARGETS = (("attn1", "merge_attn", "attn"), ("attn2", "merge_crossattn", "attn"), ("ff", "merge_mlp", "mlp"))


@dataclass(frozen=True)
class _Grid:
    """The token grid of one downsampling level at the current latent size."""

    level: int
    h: int
    w: int
    merges: bool  # the config merges (or only pools keys/values in) blocks at this level


@dataclass
class _State:
    config: TomeConfig
    auto_levels: frozenset[int]
    handles: list[RemovableHandle] = field(default_factory=list)  # the UNet's own pre- and post-hook
    hooks: list[_Hook] = field(default_factory=list)  # every installed forward, in install order
    blocks: list[_BlockHook] = field(default_factory=list)  # the blocks that carry hooks (the config selects them)
    total: int = 0  # transformer blocks in the UNet
    block_levels: frozenset[int] = frozenset()
    step: tuple[int, int] | None = None
    pipeline: Callable[[], Any] | None = None  # the diffusers pipeline patched through: its scheduler's step
    # Set by the UNet's pre-hook, read by the blocks (eagerly, or as inputs of a compiled graph).
    latent: tuple[int, int] | None = None
    grids: dict[int, _Grid] = field(default_factory=dict)  # tokens -> grid, for the current latent size
    active: bool = True  # inside the step window
    # This call's timestep (the UNet's own argument: a graph input when compiled), the key derived from it, and
    # tokens -> partition for the grids the blocks have asked for; all made on first use, dropped after the call.
    timestep: Any = None
    key: torch.Tensor | None = None
    row: torch.Tensor | None = None  # key mod PARTITIONS_PER_GRID: the row of every grid's table this call
    parts: dict[int, Partition] = field(default_factory=dict)
    # plan key -> this call's match, and (plan key, ratio) -> its merge plan; dropped after the call.
    matches: dict[Any, BandMatch | Match | None] = field(default_factory=dict)
    merges: dict[Any, BandMerge | None] = field(default_factory=dict)
    spans: list[_Span] = field(default_factory=list)
    # Eager calls only: index tensors built once per grid shape and device (a compiled graph builds its own).
    layouts: dict[tuple[int, int, str], GridLayout] = field(default_factory=dict)
    fixed: dict[tuple[int, int, str], Partition] = field(default_factory=dict)
    tables: dict[tuple[int, int, str], PartitionTable] = field(default_factory=dict)
    unet_calls: int = 0  # UNet forwards since the last `reset_stats`
    active_calls: int = 0  # ... of which inside the step window
    unmark: Callable[[], None] | None = None  # takes `compat.static_sizes`' mark off this call's latent
    # set_whole_block_guard: (block kwargs, positions in the stack) -> True when another extension replaced the
    # attention of one of those blocks for this call: they then run unmerged.
    guard: Callable[[Mapping[str, Any], range], bool] | None = None


@dataclass(frozen=True)
class TomeStats:
    """What the patch did since it was applied or since `reset_stats`, read with `stats`.

    Blocks count once however often they ran. `selected`: blocks the config merges (by level), of the UNet's
    `total` transformer blocks. `planned`: selected blocks that got a merge plan (or kv grid) at least once.
    `reached`: planned blocks whose hooked attention/MLP modules then ran (another extension may replace the
    attention and skip the module). `applied`: blocks that really merged tokens (or pooled keys/values), and
    `modules` the same per kind of module: ("kv", n) self-attention pooled its keys/values in n blocks, ("attn1",
    n) self-attention, ("attn2", n) cross-attention and ("ff", n) the feed-forward ran on merged tokens.
    `unet_calls` and `active_calls` (inside the step window) count UNet calls, compiled or not; `block_calls`
    the selected blocks that ran at least once and `grid_misses` those whose token count fit no level of the
    latent. Compiled or eager, a block counts only when the code that ran merged in it.
    """

    mode: str
    total: int
    selected: int
    planned: int
    reached: int
    applied: int
    unet_calls: int
    active_calls: int
    block_calls: int
    grid_misses: int
    levels: frozenset[int]  # the levels the config selects
    block_levels: frozenset[int]  # the levels that hold transformer blocks
    modules: tuple[tuple[str, int], ...] = ()  # (kind, blocks) for each kind of module that merged or pooled


# ---------------------------------------------------------------------------------------------- finding


def find_unet(model: Any) -> nn.Module:
    """The UNet inside a WebUI/LDM/SGM model (`.model.diffusion_model`), a diffusers pipeline (`.unet`) or itself;
    the module a torch.compile wrapper runs when it is one."""
    inner = getattr(getattr(model, "model", None), "diffusion_model", None)
    if isinstance(inner, nn.Module):
        return uncompiled(inner)
    unet = getattr(model, "unet", None)
    if isinstance(unet, nn.Module):
        return uncompiled(unet)
    if isinstance(model, nn.Module) and _is_unet(model):
        return uncompiled(model)
    raise TypeError(
        f"{type(model).__name__} has no UNet: expected a UNet (ldm/sgm UNetModel, diffusers UNet2DConditionModel),"
        " a model with .model.diffusion_model (WebUI/LDM/SGM) or a pipeline with .unet"
    )


def _is_unet(module: nn.Module) -> bool:
    return any(hasattr(module, a) for a in ("input_blocks", "down_blocks")) or any(
        _is_block(m) for m in module.modules()
    )


def _is_block(module: nn.Module) -> bool:
    return any(c.__name__ == "BasicTransformerBlock" for c in type(module).__mro__) and hasattr(module, "attn1")


def _structural_levels(unet: nn.Module) -> list[tuple[nn.Module, int]]:
    """Transformer blocks in forward order with their downsampling level, read from the module tree.

    Registration order inside each stage follows the forward order (attentions before the down/upsampler),
    but diffusers registers `up_blocks` before `mid_block`, so stages are visited in forward order explicitly.
    """
    stages = [getattr(unet, n) for n in ("input_blocks", "middle_block", "output_blocks") if hasattr(unet, n)]
    if not stages:
        stages = [getattr(unet, n) for n in ("down_blocks", "mid_block", "up_blocks") if getattr(unet, n, None)]
    if not stages:
        stages = [unet]
    level = 1
    found: list[tuple[nn.Module, int]] = []
    for stage in stages:
        for module in stage.modules():
            name = type(module).__name__
            if _is_block(module):
                found.append((module, level))
            elif name.startswith("Downsample"):
                level *= 2
            elif name.startswith("Upsample"):
                level = max(1, level // 2)
    return found


def _stacks(unet: nn.Module) -> dict[int, tuple[int, int, int]]:
    """id(block) -> (number of its transformer stack, its position there, the stack's length); a stack is a module
    with `transformer_blocks` (Transformer2DModel / SpatialTransformer), run in that order."""
    out: dict[int, tuple[int, int, int]] = {}
    for number, module in enumerate(
        m for m in unet.modules() if isinstance(getattr(m, "transformer_blocks", None), nn.ModuleList)
    ):
        stack = list(module.transformer_blocks)
        for position, block in enumerate(stack):
            out[id(block)] = (number, position, len(stack))
    return out


def model_family(model: Any) -> str:
    """The family presets resolve for: "sdxl" when the UNet's first transformer blocks sit at level 2 (SDXL and
    its fine-tunes), else "sd" (SD1.x, SD2.x: attention from full resolution)."""
    blocks = _structural_levels(find_unet(model))
    if not blocks:
        raise TypeError(f"{type(find_unet(model)).__name__} has no BasicTransformerBlock")
    return _family_of_levels(level for _, level in blocks)


def _family_of_levels(levels: Iterable[int]) -> str:
    return "sdxl" if min(levels) >= 2 else "sd"


def _level_counts(blocks: list[tuple[nn.Module, int]]) -> dict[int, int]:
    return dict(Counter(level for _, level in blocks))


# ---------------------------------------------------------------------------------------------- public API


def apply_patch(model: Any, config: TomeConfig | None = None, /, *, preset: str | None = None, **fields: Any) -> Any:
    """Patch `model`'s UNet with token merging and return `model`.

    Takes a `TomeConfig`, a preset name (`preset="fast"`, see `presets()`: resolved for this model's family),
    tomesd-style keywords (`ratio=0.5, sx=2, ...`), or a mix: keywords
    override the preset or config. Applying again replaces the previous patch. Invalid values raise
    `ValueError`/`TypeError` naming the field, and leave the model untouched.

    A UNet compiled with torch.compile, before or after the patch, runs merged: the patch goes on the module the
    compiled wrapper runs, and its graph traces again once (see the README's "With torch.compile").
    """
    if config is not None and not isinstance(config, TomeConfig):
        raise TypeError(f"config must be a TomeConfig, got {type(config).__name__}")
    if preset is not None and config is not None:
        raise TypeError("apply_patch takes a config or a preset, not both")
    unet = find_unet(model)
    if preset is not None:
        from tome_core.presets import get_preset

        config = get_preset(preset).config(model_family(unet))
    config = TomeConfig.from_dict(fields, base=config)
    blocks = _structural_levels(unet)
    if not blocks:
        raise TypeError(f"{type(unet).__name__} has no BasicTransformerBlock to patch")
    config.warn_if_capped()

    remove_patch(model)
    state = _State(config=config, auto_levels=auto_levels(_level_counts(blocks)))
    state.block_levels = frozenset(level for _, level in blocks)
    state.total = len(blocks)
    if hasattr(getattr(model, "scheduler", None), "timesteps"):
        state.pipeline = _ref(model)
    state.handles.append(unet.register_forward_pre_hook(eager(_unet_pre_hook(state)), with_kwargs=True))
    state.handles.append(unet.register_forward_hook(eager(_unet_post_hook(state))))
    state.hooks.append(_UNetHook(unet))
    where = _stacks(unet)
    spans: dict[int, _Span] = {}
    for index, (module, level) in enumerate(blocks):
        _patch_block(state, module, index, level, where.get(id(module)), spans)
    state.spans = list(spans.values())
    for hook in state.hooks:
        hook.install()
    setattr(unet, STATE_ATTR, state)
    return model


def remove_patch(model: Any) -> Any:
    """Remove our patch from `model`'s UNet, restoring it exactly; a no-op when it is not patched."""
    unet = find_unet(model)
    state = unet.__dict__.pop(STATE_ATTR, None)
    if state is not None:
        _unmark(state)  # a call that raised left its latent marked
        for handle in state.handles:
            handle.remove()
        state.handles.clear()
        for hook in reversed(state.hooks):
            hook.uninstall()
        state.hooks.clear()
    return model


def is_patched(model: Any) -> bool:
    return STATE_ATTR in find_unet(model).__dict__


def get_config(model: Any) -> TomeConfig | None:
    state = find_unet(model).__dict__.get(STATE_ATTR)
    return state.config if state is not None else None


def set_step(model: Any, step: int | None, total: int | None) -> None:
    """Tell the patch which sampler step runs next, for the step window.

    Samplers that evaluate the UNet twice per step should report the same step for both calls. Without it, a
    model patched through a diffusers pipeline follows the pipeline scheduler's step index; a bare UNet with a
    step window reads the timestep back instead (one host synchronisation per call on a GPU, outside any
    compiled graph).
    """
    state = find_unet(model).__dict__.get(STATE_ATTR)
    if state is None:
        return
    if step is None or total is None or total <= 0:
        state.step = None
    else:
        state.step = (int(step), int(total))


def stats(model: Any) -> TomeStats | None:
    """What the patch on `model` did since it was applied or since `reset_stats`; None when it is not patched."""
    state = find_unet(model).__dict__.get(STATE_ATTR)
    if state is None:
        return None
    config = state.config
    kinds: Counter[str] = Counter()
    for block in state.blocks:
        kinds.update(block.applied_names())
    return TomeStats(
        mode=config.mode,
        total=state.total,
        selected=len(state.blocks),
        planned=sum(1 for b in state.blocks if b.planned),
        reached=sum(1 for b in state.blocks if b.planned and b.counts_reached()),
        applied=sum(1 for b in state.blocks if b.counts_applied()),
        unet_calls=state.unet_calls,
        active_calls=state.active_calls,
        block_calls=sum(1 for b in state.blocks if b.called),
        grid_misses=sum(1 for b in state.blocks if b.grid_miss),
        levels=frozenset(
            lv
            for lv in state.block_levels | set(LEVELS)
            if config.merges_level(lv, state.auto_levels) or config.pools_level(lv, state.auto_levels)
        )
        if not config.is_noop
        else frozenset(),
        block_levels=state.block_levels,
        modules=tuple((name, kinds[name]) for name in ("kv", "attn1", "attn2", "ff") if kinds[name]),
    )


def set_whole_block_guard(model: Any, guard: Callable[[Mapping[str, Any], range], bool] | None) -> None:
    """Let a host keep blocks merged whole unmerged in a call where another extension replaced their attention.

    A block merged whole hands its attention merged tokens; a replacement that maps tokens back to image positions
    (regional prompting, attention couple) expects every token. `guard(kwargs, positions)` gets the keyword
    arguments the block (the first of a merged stack) was called with and the positions in its transformer stack
    that would run merged; True runs them unmerged for that call, and `stats` then counts them planned but not
    reached. ComfyUI's adapter installs one that reads `transformer_options["patches_replace"]`. None removes it.
    Blocks merged module by module need none: a replaced module never runs, so its hook never merges.
    """
    state = find_unet(model).__dict__.get(STATE_ATTR)
    if state is not None:
        state.guard = guard


def reset_stats(model: Any) -> None:
    """Start counting afresh (the WebUI does so at the start of each sampling pass)."""
    state = find_unet(model).__dict__.get(STATE_ATTR)
    if state is None:
        return
    state.unet_calls = state.active_calls = 0
    for block in state.blocks:
        block.reset()


def transformer_blocks(model: Any) -> list[tuple[nn.Module, int]]:
    """`model`'s UNet's transformer blocks in forward order, each with its downsampling level (1: the full latent,
    2: half, ...), as the patch finds them."""
    return _structural_levels(find_unet(model))


def blocks_per_level(model: Any) -> dict[int, int]:
    """Transformer blocks per downsampling level of `model`'s UNet (1: the full latent, 2: half, ...)."""
    return _level_counts(transformer_blocks(model))


def describe(model: Any, height: int = 512, width: int = 512, config: TomeConfig | None = None) -> list[LevelInfo]:
    """Per downsampling level: transformer blocks, how many merge, tokens before and after, at an image size.

    `height`/`width` are in pixels, positive multiples of 8 (latent = pixels / 8); anything else raises
    ValueError (TypeError for a non-integer) naming the argument. Describes `config`, else the model's current
    patch config, else the default preset (`DEFAULT_PRESET`) resolved for the model's family (`model_family`): what
    `apply_patch(model, preset=DEFAULT_PRESET)` and the WebUI's default would run.
    """
    return describe_layout(blocks_per_level(model), height, width, config or get_config(model))


def describe_layout(
    blocks: Mapping[int, int], height: int = 512, width: int = 512, config: TomeConfig | None = None
) -> list[LevelInfo]:
    """`describe` for a UNet known only by its transformer blocks per level (`blocks_per_level`), e.g. a model
    family's layout in a UI that has no model at hand. Without `config`: the default preset, for the family the
    layout is of as `model_family` tells it ("sdxl" when the first level holding blocks is 2 or deeper, else
    "sd"). Sizes as in `describe`."""
    _check_size(height=height, width=width)
    levels = [level for level, count in blocks.items() if count > 0]
    if config is None and levels:
        from tome_core.presets import DEFAULT_PRESET, get_preset

        config = get_preset(DEFAULT_PRESET).config(_family_of_levels(levels))
    config = config or TomeConfig()
    auto = auto_levels(blocks)
    lat_h, lat_w = height // 8, width // 8  # as the WebUI and diffusers size the latent
    out = []
    for level in LEVELS:
        count = blocks.get(level, 0)
        if not count:
            continue
        h, w = math.ceil(lat_h / level), math.ceil(lat_w / level)
        tokens = h * w
        merges = config.merges_level(level, auto) and not config.is_noop
        pools = config.pools_level(level, auto) and not config.is_noop
        merging = count if merges or pools else 0
        after = tokens
        if merges and config.mode == "merge" and config.merge_attn:
            after = merged_tokens(h, w, config.sx, config.sy, config.effective_ratio, config.matching)
        elif pools or (merges and config.mode == "kv" and config.merge_attn):
            after = math.ceil(h / config.sy) * math.ceil(w / config.sx)  # keys/values attended to
        out.append(LevelInfo(level=level, blocks=count, merging=merging, tokens=tokens, tokens_after=after))
    return out


def _check_size(**sizes: Any) -> None:
    """An image size `describe` takes: a positive multiple of 8 pixels (a whole latent pixel), by argument name."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be a positive multiple of 8 (pixels), got {value!r}")
        if value <= 0 or value % 8:
            raise ValueError(f"{name} must be a positive multiple of 8 (pixels), got {value!r}")


# ---------------------------------------------------------------------------------------------- the UNet's hooks


def _kv_keyword(attn: nn.Module) -> str:
    """diffusers' Attention takes keys/values as `encoder_hidden_states`; ldm/sgm CrossAttention as `context`."""
    return "encoder_hidden_states" if type(attn).__module__.startswith("diffusers") else "context"


def _first_arg(args: tuple[Any, ...], kwargs: dict[str, Any], *names: str) -> Any:
    if args:
        return args[0]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


def _unet_pre_hook(state: _State) -> Callable[..., None]:
    """Per UNet call, on the host: the counts, the step window, and the grids and partitions the blocks read."""

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = _first_arg(args, kwargs, "x", "sample")
        if not isinstance(x, torch.Tensor) or x.dim() < 3:
            state.active = False  # not a latent: nothing to merge over
            return
        latent = (int(x.shape[-2]), int(x.shape[-1]))
        _unmark(state)
        state.unmark = static_sizes(x)
        if latent != state.latent:
            state.latent = latent
            state.grids = _grids(state.config, state.auto_levels, latent)
        timestep = _timestep_arg(args, kwargs)
        fraction = _fraction(state, timestep)
        state.active = fraction is None or state.config.active_at(fraction)
        state.unet_calls += 1
        state.active_calls += state.active
        # A number becomes a device tensor here, outside any graph: traced, the graph would guard on its value.
        if not isinstance(timestep, torch.Tensor):
            value = 0.0 if timestep is None else float(timestep)
            timestep = torch.full((1,), value, dtype=torch.float32, device=x.device)
        _new_call(state, timestep)

    return hook


def _unet_post_hook(state: _State) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        _new_call(state, None)  # nothing of this call kept alive until the next
        _unmark(state)

    return hook


def _timestep_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[1] if len(args) > 1 else kwargs.get("timesteps", kwargs.get("timestep", kwargs.get("t")))


def _new_call(state: _State, timestep: Any) -> None:
    """Forget the last call's partitions; the next ones come from `timestep`."""
    state.timestep = timestep
    state.key = None
    state.row = None
    state.parts = {}
    state.matches = {}
    state.merges = {}
    for span in state.spans:
        span.merge = span.residual = None
        span.guarded = False


def _unmark(state: _State) -> None:
    if state.unmark is not None:
        state.unmark, unmark = None, state.unmark
        unmark()


def _grids(config: TomeConfig, auto: frozenset[int], latent: tuple[int, int]) -> dict[int, _Grid]:
    """tokens -> the grid of the first level that holds that many tokens at this latent size."""
    out: dict[int, _Grid] = {}
    for level in _GRID_LEVELS:
        h, w = math.ceil(latent[0] / level), math.ceil(latent[1] / level)
        acts = config.merges_level(level, auto) or config.pools_level(level, auto)
        out.setdefault(h * w, _Grid(level, h, w, acts))
    return out


def _call_partition(state: _State, tokens: int, grid: _Grid, device: torch.device) -> Partition:
    """This call's partition of `grid`, made on the first block that asks for it.

    Eagerly, the grid's index tensors and its table of random partitions are built once and kept, and a call picks
    its row by its timestep. A compiled graph builds the index tensors itself (constants to the compiler) and hashes
    the same row's slots from its own timestep input, so that it reads no tensor from the patch's state: under CUDA
    graphs such a tensor would be an input whose address must never change.
    """
    part = state.parts.get(tokens)
    if part is not None:
        return part
    config = state.config
    compiling = is_compiling()
    cache = (grid.h, grid.w, str(device))
    layout = None if compiling else state.layouts.get(cache)
    if layout is None:
        layout = grid_layout(grid.h, grid.w, config.sx, config.sy, device)
        if not compiling:
            state.layouts[cache] = layout
    numbers = config.matching == "global"  # only global matching reads the per-token table
    if config.use_rand:
        seed = _DEFAULT_SEED if config.seed is None else config.seed
        if state.key is None:
            state.key = timestep_key(state.timestep, device)
        if compiling:
            part = hashed_partition(layout, state.key, seed, numbers=numbers)
        else:
            table = state.tables.get(cache)
            if table is None:
                table = state.tables[cache] = random_partitions(layout, seed)
            if state.row is None:
                state.row = state.key.remainder(table.count)
            part = table.pick_row(state.row, numbers=numbers)
    else:
        part = None if compiling else state.fixed.get(cache)
        if part is None:
            part = partition(layout, fixed_slots(layout))
            if not compiling:
                state.fixed[cache] = part
    state.parts[tokens] = part
    return part


def _call_band(state: _State, key: Any, x: torch.Tensor, grid: _Grid, ratio: float) -> BandMerge | None:
    """This call's band merge plan for the blocks sharing `key`, at `ratio`: matched on the first of them that
    asks (from its input tokens), planned once per ratio, dropped after the call."""
    plan_key = (key, ratio)
    if plan_key in state.merges:
        return state.merges[plan_key]
    if key not in state.matches:
        state.matches[key] = _band_match(x, _call_partition(state, x.shape[1], grid, x.device))
    m = state.matches[key]
    merge = None if not isinstance(m, BandMatch) else _band_merge(m, ratio)
    state.merges[plan_key] = merge
    return merge


def _call_match(state: _State, key: Any, x: torch.Tensor, grid: _Grid) -> Match:
    """Global matching (tomesd's rule): this call's similarity ranking for the blocks sharing `key`."""
    m = state.matches.get(key)
    if not isinstance(m, Match):
        m = state.matches[key] = match(x, _call_partition(state, x.shape[1], grid, x.device), "global")
    return m


def _fraction(state: _State, timestep: Any) -> float | None:
    """How far sampling is (0 at the first step), or None when no step window is set.

    From `set_step`, else a pipeline scheduler's step index, both host values; only a bare UNet with a step
    window falls back to reading the timestep back from the device.
    """
    config = state.config
    if config.step_start <= 0 and config.step_end >= 1:
        return None
    if state.step is not None:
        return state.step[0] / state.step[1]
    # Read afresh each call: users swap a pipeline's scheduler after patching.
    scheduler = getattr(state.pipeline(), "scheduler", None) if state.pipeline is not None else None
    timesteps = getattr(scheduler, "timesteps", None)
    if timesteps is not None and len(timesteps) > 0:
        return (getattr(scheduler, "step_index", None) or 0) / len(timesteps)
    return 1.0 - _timestep_value(timestep) / _TRAIN_TIMESTEPS


def _ref(obj: Any) -> Callable[[], Any]:
    """A weak reference where the object allows one (the UNet must not keep its pipeline alive), else a strong one."""
    try:
        return weakref.ref(obj)
    except TypeError:  # no __weakref__ slot (a SimpleNamespace, say): kept alive by the patch until removed
        return lambda: obj


def _timestep_value(timestep: Any) -> float:
    if timestep is None:
        return 0.0
    if isinstance(timestep, torch.Tensor):
        return float(timestep.reshape(-1)[0]) if timestep.numel() else 0.0
    return float(timestep)


def timestep_key(timestep: Any, device: torch.device) -> torch.Tensor:
    """[1] int64 on `device`: the (first) timestep x 1000, truncated; derived on the device, never read back.

    The key picks a step's random partitions. One value gives one key whatever the timestep's dtype: it is widened
    to float32 before scaling (x 1000 in fp16 overflows past a timestep of 65.5, in bf16 it rounds). float32 holds
    every fp16 and bf16 value and every integer below 2**24 exactly and rounds the product the same on every
    device; float64 would not run on MPS. A value a dtype cannot hold is rounded by whoever made the tensor (bf16
    makes 999 into 1000), and keys as that value. A host timestep is copied without blocking: a blocking copy would
    wait for the device's stream. A Python number (or None: 0) is filled on the device, with no copy at all. An
    integer timestep (diffusers' schedulers) is scaled as it is, in one kernel: the same key, exactly.
    """
    if isinstance(timestep, torch.Tensor) and timestep.numel() and not timestep.is_floating_point():
        return timestep.reshape(-1)[:1].to(device, torch.int64, non_blocking=True) * 1000
    if isinstance(timestep, torch.Tensor) and timestep.numel():
        wide = timestep.reshape(-1)[:1].to(device, torch.float32, non_blocking=True)
    else:
        value = 0.0 if timestep is None or isinstance(timestep, torch.Tensor) else float(timestep)
        wide = torch.full((1,), value, dtype=torch.float32, device=device)
    return (wide * 1000).long()  # not in place: `wide` may be the caller's own tensor


# ---------------------------------------------------------------------------------------------- block hooks


class _Hook:
    """One patched module: its instance `forward` is this object's `forward` until `uninstall`.

    A bound method of a long-lived object, not a closure or a partial: torch.compile guards on the values this
    object holds, not on its identity, so re-patching with the same settings reuses a compiled graph.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.inner: Callable[..., Any] | None = None  # an instance forward someone else set before us
        self.own: Callable[..., Any] = type(module).forward  # the class's forward, as the module had it
        self.passthrough = False  # removed while another wrapper still calls us

    def install(self) -> None:
        # The class's forward as it is now: the WebUIs swap attention forwards on the class when a model loads or
        # a setting changes, never during a generation, and a patch lasts one generation.
        self.own = type(self.module).forward
        self.inner = self.module.__dict__.get("forward")
        self.module.forward = self.forward  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self.module.__dict__.get("forward") == self.forward:
            if self.inner is None:
                del self.module.__dict__["forward"]
            else:
                self.module.forward = self.inner  # type: ignore[method-assign]
        else:
            # Another wrapper went on after ours and holds it: stay in its chain, doing nothing.
            self.passthrough = True

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward as it was before ours."""
        if self.inner is not None:
            return self.inner(*args, **kwargs)
        return self.own(self.module, *args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class _UNetHook(_Hook):
    """The UNet itself: hands the blocks this call's timestep as the forward received it, so that a compiled
    graph hashes the random partitions from its own input (the pre-hook's copy would be a tensor from Python
    state), and drops what the call made before the graph returns.

    It reads the patch's state from the UNet (`STATE_ATTR`), not from itself: a compiled frame that starts here
    then reaches every number of the state through an nn.Module, and dynamo keeps the integers it finds on
    modules constant. Reached from this object (a plain local), the strides and grid sizes would become symbolic
    once they differ from a previous compile (automatic dynamic shapes: a new preset or latent size), or from the
    start under `dynamic=True`, and inductor fails on the merge's index arithmetic with symbolic strides.
    """

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        timestep = _timestep_arg(args, kwargs)
        state = getattr(self.module, STATE_ATTR, None)
        if self.passthrough or state is None or not isinstance(timestep, torch.Tensor):
            return self.call(*args, **kwargs)  # a number: the pre-hook made it a tensor
        _new_call(state, timestep)
        try:
            return self.call(*args, **kwargs)
        finally:
            _new_call(state, None)


class _Span:
    """A stack of whole-merged blocks that stays merged from its first block's input to its last block's output
    (one merge and one unmerge for the whole stack, not per block): what the first block hands the last, for one
    call only."""

    merge: BandMerge | None = None
    residual: torch.Tensor | None = None  # x - unmerge(merge(x)) of the first block's input
    guarded = False  # the first block ran unmerged for `set_whole_block_guard`: so do the others


class _BlockHook(_Hook):
    """A transformer block that merges.

    Whole (`ratio` set): the block runs on its merged input and its output is unmerged, with what merging took
    from each token added back: the same as merging each of attention, cross-attention and feed-forward with one
    plan (merge(x + unmerge(d)) = merge(x) + d), for one merge and one unmerge instead of three each. Inside a
    `_Span` the middle blocks run on the merged tokens as they come. Otherwise its modules' hooks merge one by one
    (`_MergeHook`, `_KvHook`) with the plans this hook makes for the call.
    """

    def __init__(self, state: _State, module: nn.Module, index: int, level: int) -> None:
        super().__init__(module)
        self.state = state
        self.index = index
        self.level = level
        self.modules: list[_MergeHook | _KvHook] = []
        self.names: tuple[str, ...] = ()  # what a whole block merges: its modules' names (attn1, attn2, ff)
        self.ratio: float | None = None  # set: the block merges whole at this ratio
        self.ratios: dict[str, float] = {}  # ratio kind -> ratio, for the kinds this block's modules merge
        self.pools = False  # self-attention pools keys/values (kv mode)
        self.span: _Span | None = None
        self.first_in_span = True
        self.last_in_span = True
        self.positions = range(0, 1)  # the positions in its transformer stack this block merges for
        self.plan_key: Any = None  # which blocks share a plan within a call (`_call_merge`)
        # This call's plans, read by the modules' hooks: kind -> (merge, unmerge); and the kv grid.
        self.plans: dict[str, tuple[Merge, Merge]] | None = None
        self.tokens = 0
        self.grid: tuple[int, int] | None = None
        self.reset()

    def reset(self) -> None:
        # Flags the hooks set and never read (a compiled graph replays each store after its run).
        self.called = self.planned = self.grid_miss = self.merged = False
        for hook in self.modules:
            hook.wanted = hook.reached = hook.applied = False

    def counts_applied(self) -> bool:
        if self.ratio is not None:
            return self.merged
        wanted = [hook for hook in self.modules if hook.wanted]
        return bool(wanted) and all(hook.applied for hook in wanted)

    def counts_reached(self) -> bool:
        return self.merged if self.ratio is not None else all(m.reached for m in self.modules)

    def applied_names(self) -> list[str]:
        if self.ratio is not None:
            return list(self.names) if self.merged else []
        return [hook.name for hook in self.modules if hook.applied]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.passthrough:
            return self.call(*args, **kwargs)
        self.called = True
        x = _first_arg(args, kwargs, "x", "hidden_states")
        if not (self.state.active and isinstance(x, torch.Tensor) and x.dim() == 3):
            return self.call(*args, **kwargs)
        if self.ratio is not None:
            return self._whole(x, args, kwargs)
        self._plan(x)
        try:
            return self.call(*args, **kwargs)
        finally:
            self.plans = None
            self.grid = None

    # -------------------------------------------------------------------------------- whole blocks

    def _whole(self, x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        span = self.span
        if span is not None and not self.first_in_span:
            merge = span.merge
            if merge is None or x.shape[1] != merge.merged_tokens:
                self.planned = self.planned or span.guarded
                return self.call(*args, **kwargs)  # the stack's first block did not merge
            self.planned = self.merged = True
            out = self.call(*args, **kwargs)
            if self.last_in_span:
                residual = span.residual
                span.merge = span.residual = None
                return merge.unmerge_add(residual, out)
            return out
        guard = self.state.guard
        if guard is not None and guard(kwargs, self.positions):
            self.planned = True  # it would have merged: counted planned, not reached
            if span is not None:
                span.guarded = True
            return self.call(*args, **kwargs)
        merge = self._merge_plan(x)
        if merge is None:
            return self.call(*args, **kwargs)
        merged, residual = merge.merge_with_residual(x)
        self.merged = True
        args, kwargs = _with_first(args, kwargs, merged)
        out = self.call(*args, **kwargs)
        if span is not None and not self.last_in_span:
            span.merge, span.residual = merge, residual
            return out
        return merge.unmerge_add(residual, out)

    def _grid(self, x: torch.Tensor) -> _Grid | None:
        grid = self.state.grids.get(x.shape[1])
        if grid is None:
            self.grid_miss = True
            return None
        return grid if grid.merges else None

    def _merge_plan(self, x: torch.Tensor) -> BandMerge | None:
        grid = self._grid(x)
        if grid is None:
            return None
        with torch.no_grad():
            merge = _call_band(self.state, self.plan_key, x, grid, self.ratio)
        self.planned = merge is not None
        return merge

    # -------------------------------------------------------------------------------- module by module

    def _plan(self, x: torch.Tensor) -> None:
        grid = self._grid(x)
        if grid is None:
            return
        state, config = self.state, self.state.config
        tokens = x.shape[1]
        num_dst = (grid.h // config.sy) * (grid.w // config.sx)
        if self.pools:
            self.grid = (grid.h, grid.w)
        plans: dict[str, tuple[Merge, Merge]] = {}
        with torch.no_grad():
            for kind, ratio in self.ratios.items():
                removed = min(int(tokens * ratio), tokens - num_dst)
                if removed <= 0 or num_dst <= 0:
                    continue
                if config.matching == "global":
                    plans[kind] = plan(_call_match(state, self.plan_key, x, grid), removed)
                else:
                    merge = _call_band(state, self.plan_key, x, grid, ratio)
                    if merge is not None:
                        plans[kind] = (merge.merge, merge.unmerge)
        for hook in self.modules:
            if hook.kind == "kv" or hook.kind in plans:
                hook.wanted = True
        if self.pools or plans:
            self.planned = True
        self.plans = plans or None
        self.tokens = tokens


def _with_first(
    args: tuple[Any, ...], kwargs: dict[str, Any], x: torch.Tensor
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) with the tokens (the first positional argument, or `x`/`hidden_states`) replaced by `x`."""
    if args:
        return (x, *args[1:]), kwargs
    name = next(n for n in ("x", "hidden_states") if n in kwargs)
    return args, {**kwargs, name: x}


class _MergeHook(_Hook):
    """Self-/cross-attention or the feed-forward: runs on the block's merged tokens, then unmerges its output."""

    def __init__(self, block: _BlockHook, module: nn.Module, name: str, kind: str) -> None:
        super().__init__(module)
        self.block = block
        self.name = name  # "attn1", "attn2" or "ff"
        self.kind = kind  # the ratio it merges with: "attn" or "mlp"
        self.wanted = self.reached = self.applied = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        plans = None if self.passthrough else self.block.plans
        if plans is None:
            return self.call(*args, **kwargs)
        self.reached = True
        pair = plans.get(self.kind)
        name = None if args else next((n for n in ("x", "hidden_states") if n in kwargs), None)
        x = args[0] if args else kwargs.get(name) if name else None
        # Another patch (the WebUI's built-in tomesd, say) may already have changed the token count.
        if pair is None or not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != self.block.tokens:
            return self.call(*args, **kwargs)
        merge, unmerge = pair
        merged = merge(x)
        self.applied = True
        # Forge passes self-attention's keys/values explicitly once any attn1 patch exists: the same tensor as
        # the queries, which must merge with them. Other keys/values (a reference image's, say) stay whole.
        extra = {kw: merged for kw in _KV_KEYWORDS if kwargs.get(kw) is x}
        if args:
            out = self.call(merged, *args[1:], **{**kwargs, **extra})
        else:
            out = self.call(**{**kwargs, name: merged, **extra})
        return unmerge(out) if isinstance(out, torch.Tensor) else out


class _KvHook(_Hook):
    """Self-attention in kv mode: every query attends to keys/values pooled over the block's token grid."""

    name = "kv"
    kind = "kv"

    def __init__(self, block: _BlockHook, module: nn.Module, kv_kw: str, sx: int, sy: int) -> None:
        super().__init__(module)
        self.block = block
        self.kv_kw = kv_kw  # keyword through which attn1 takes keys/values ("context" or "encoder_hidden_states")
        self.sx, self.sy = sx, sy
        self.wanted = self.reached = self.applied = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        grid = None if self.passthrough else self.block.grid
        if grid is None:
            return self.call(*args, **kwargs)
        self.reached = True
        x = _first_arg(args, kwargs, "x", "hidden_states")
        # Self-attention's keys/values are absent (None) or, in Forge once any attn1 patch exists, the queries
        # themselves; anything else (another extension's keys/values) is left alone.
        targets = [self.kv_kw, *(["value"] if "value" in kwargs else [])]
        if any(kwargs.get(kw) is not None and kwargs.get(kw) is not x for kw in targets):
            return self.call(*args, **kwargs)
        h, w = grid
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != h * w:
            return self.call(*args, **kwargs)  # tokens already merged by another patch: no grid to pool over
        pooled = kv_downsample(x, w, h, self.sx, self.sy)
        self.applied = True
        return self.call(*args, **{**kwargs, **dict.fromkeys(targets, pooled)})


def _plan_key(config: TomeConfig, index: int, level: int, where: tuple[int, int, int] | None) -> tuple[Any, ...]:
    """Which blocks share a merge plan within a call. Shared plans: a stack of several blocks (SDXL's, 10 at level
    4) matches once, at its first block; the single-block stacks of a level (SD1/SD2's) share one plan per level, so
    a call matches once per stack or level, never once per block."""
    if not config.share_plan:
        return ("block", index)
    if where is not None and where[2] > 1:
        return ("stack", where[0])
    return ("level", level)


def _self_attention(module: nn.Module) -> nn.Module | None:
    """The block's `attn1` where it attends to the block's own tokens (the only place pooling keys/values makes
    sense), else None."""
    target = getattr(module, "attn1", None)
    if not isinstance(target, nn.Module):
        return None
    if getattr(module, "disable_self_attn", False) or getattr(module, "only_cross_attention", False):
        return None
    return target


def _pool_block(state: _State, module: nn.Module, index: int, level: int) -> None:
    """Hook a block of a level that only pools self-attention's keys/values (`pool_kv`)."""
    target = _self_attention(module)
    if target is None:
        return
    config = state.config
    block = _BlockHook(state, module, index, level)
    block.modules.append(_KvHook(block, target, _kv_keyword(target), config.sx, config.sy))
    block.pools = True
    block.reset()
    state.blocks.append(block)
    state.hooks.append(block)
    state.hooks.extend(block.modules)


def _patch_block(
    state: _State,
    module: nn.Module,
    index: int,
    level: int,
    where: tuple[int, int, int] | None,
    spans: dict[int, _Span],
) -> None:
    """Hook `module` and its attention/MLP as the config asks. `where`: (stack, position, length) of the block in
    its transformer stack; `spans` holds the spans of the stacks seen so far."""
    config = state.config
    if config.is_noop:
        return
    if not config.merges_level(level, state.auto_levels):
        if config.pools_level(level, state.auto_levels):
            _pool_block(state, module, index, level)
        return
    block = _BlockHook(state, module, index, level)
    targets = []
    for name, flag, kind in _TARGETS:
        target = getattr(module, name, None)
        if not (getattr(config, flag) and isinstance(target, nn.Module)):
            continue
        if kind == "mlp" and level < config.mlp_min_downsample:
            continue
        targets.append((name, kind, target))
    if not targets:
        return
    present = tuple(name for name, _, _ in _TARGETS if isinstance(getattr(module, name, None), nn.Module))
    ratios = config.ratios_by_kind
    block.plan_key = _plan_key(config, index, level, where)
    if (
        config.mode == "merge"
        and config.matching == "local"
        and tuple(name for name, _, _ in targets) == present
        and len({ratios[kind] for _, kind, _ in targets}) == 1
    ):
        block.ratio = ratios[targets[0][1]]
        block.names = present
        if where is not None:
            block.positions = range(where[1], where[1] + 1)
        if config.share_plan and where is not None and where[2] > 1:
            number, position, length = where
            block.span = spans.setdefault(number, _Span())
            block.first_in_span, block.last_in_span = position == 0, position == length - 1
            block.positions = range(0, length)
    else:
        for name, kind, target in targets:
            if name == "attn1" and config.mode == "kv":
                if _self_attention(module) is None:
                    continue
                block.modules.append(_KvHook(block, target, _kv_keyword(target), config.sx, config.sy))
            else:
                block.modules.append(_MergeHook(block, target, name, kind))
        if not block.modules:
            return
        kinds = {hook.kind for hook in block.modules}
        block.pools = "kv" in kinds
        block.ratios = {kind: r for kind, r in ratios.items() if kind in kinds}
    block.reset()
    state.blocks.append(block)
    state.hooks.append(block)
    state.hooks.extend(block.modules)
