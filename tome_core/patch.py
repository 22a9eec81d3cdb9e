"""Apply and remove token merging on a UNet instance (and, through `tome_core.dit`, token reduction on a diffusion
transformer: `apply_patch` and every function here take either; `find_model` tells them apart).

Nothing here changes a class. A patch is one hook object per patched module, installed as that instance's
`forward` (a bound method of the hook, the way diffusers installs its hooks), plus one pre- and one post-hook
registered on the UNet itself; `remove_patch` takes exactly those away. The WebUI's built-in token merging
(tomesd) unpatches by the class name `ToMeBlock` and the attribute `_tome_info`; we use neither, so the two never
undo each other.

What each block does is decided once, at `apply_patch`: config and UNet become a `BlockTable` (`tome_core.plan`),
one `BlockPlan` per transformer block, and a block gets hooks only for what its plan names. `describe`, `stats`
and the presets' words read the same table.

Built to stay whole under `torch.compile(fullgraph=True)`:

* The UNet's registered hooks run eagerly, also around a compiled UNet (`compat.eager`): they count calls, decide
  the step window and work out the call's grids. The UNet's forward hook makes the call's scratch (`_Call`: the
  timestep the forward received, a graph input when compiled, and the partitions, matches and merge plans the
  blocks make from it) and drops it before it returns. The first block on a grid makes the call's partition:
  eagerly from index tensors kept per grid, in a graph from tensors the graph builds itself and a hash of that
  timestep. So nothing in the compiled region reads a value back, makes a tensor on the host, draws from a
  generator, or reads a tensor from the patch's state (under CUDA graphs that would be a static input, re-recorded
  at a new address).
* A call's plans live only in its `_Call`: no state passes from one call to the next through a graph, so a
  sampling traces once, and a new patch with the same settings reuses that graph.
* What the hooks did is recorded as flags they set and never read (`stats`): a compiled graph replays those
  stores after every run, so the counts hold for compiled and eager calls alike.
* Installing a hook changes the module's `forward`, which torch.compile's guards watch: a UNet compiled before
  the patch traces again (once) and merges; after `remove_patch` its earlier graph is valid again.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from tome_core.compat import eager, is_compiling, static_sizes, uncompiled
from tome_core.config import TomeConfig
from tome_core.dit import INTERCEPTORS, DitState
from tome_core.dit import apply as apply_dit
from tome_core.dit import attend as attend_dit
from tome_core.dit import check_config as check_dit_config
from tome_core.dit import reduce as reduce_dit
from tome_core.dit import remove as remove_dit
from tome_core.families import family, find_layout, handled
from tome_core.hooks import Hook, timestep_arg, uninstall, unmark
from tome_core.kernels import LseKernel
from tome_core.merge import (
    BandMatch,
    BandMerge,
    GridLayout,
    Match,
    Merge,
    Partition,
    PartitionTable,
    band_match,
    band_merge,
    fixed_slots,
    grid_layout,
    hashed_partition,
    kv_downsample,
    match,
    partition,
    plan,
    random_partitions,
)
from tome_core.plan import (
    BLOCK_MODULES,
    BlockPlan,
    BlockShape,
    BlockTable,
    LevelInfo,
    family_of_levels,
    grid,
    layout_table,
    plan_blocks,
    plan_dit,
)
from tome_core.presets import DEFAULT_PRESET, get_preset

STATE_ATTR = "_tome_sd_state"

#: Timesteps the SD noise schedules were trained with; maps a timestep to a sampling fraction.
_TRAIN_TIMESTEPS = 1000
#: Keywords through which attention modules take keys and values (ldm/sgm/Forge, diffusers, Forge's values).
_KV_KEYWORDS = ("context", "encoder_hidden_states", "value")
#: Seed used when the config leaves `seed` as None.
_DEFAULT_SEED = 0x70E5


class _Call:
    """One UNet call's scratch: the timestep, the partition key made from it, and what the blocks planned from it.
    The UNet's hooks make it when the call starts (its forward hook inside the graph when compiled) and drop it
    when it returns, so nothing of a call reaches the next one, and a graph's scratch never leaves the graph."""

    def __init__(self, timestep: torch.Tensor) -> None:
        self.timestep = timestep
        self.key: torch.Tensor | None = None  # timestep_key(timestep), made on first use
        self.row: torch.Tensor | None = None  # key mod PARTITIONS_PER_GRID: the row of every grid's table this call
        self.parts: dict[int, Partition] = {}  # level -> this call's partition of its grid
        self.matches: dict[Any, BandMatch | Match | None] = {}  # plan key -> this call's match
        # (plan key, ratio) -> its merge plan: a BandMerge (local), (merge, unmerge) (global), or None
        self.merges: dict[tuple[Any, float], Any] = {}
        # stack -> (its merge, the residual of its first block's input), until its last block unmerges
        self.carry: dict[int, tuple[BandMerge, torch.Tensor]] = {}
        self.guarded: dict[int, bool] = {}  # stacks whose first block ran unmerged for `set_whole_block_guard`
        # block index -> (its tokens, its grid, ratio -> (merge, unmerge)) while a block merging module by module runs
        self.running: dict[int, tuple[int, tuple[int, int], dict[float, tuple[Merge, Merge]]]] = {}


@dataclass
class _State:
    """A patch, by lifetime: what `apply_patch` installed, what a sampling counts, what a latent size fixes, and
    the current call's scratch."""

    # Installed once.
    config: TomeConfig
    table: BlockTable
    handles: list[RemovableHandle] = field(default_factory=list)  # the UNet's own pre- and post-hook
    hooks: list[Hook] = field(default_factory=list)  # every installed forward, in install order
    blocks: list[_BlockHook] = field(default_factory=list)  # the hooked blocks: the table's acting ones
    pipeline: Callable[[], Any] | None = None  # the diffusers pipeline patched through: its scheduler's step
    # set_whole_block_guard: (block kwargs, positions in the stack) -> True when another extension replaced the
    # attention of one of those blocks for this call: they then run unmerged.
    guard: Callable[[Mapping[str, Any], range], bool] | None = None
    # Per sampling: the host's step, the counts since `reset_stats`.
    step: tuple[int, int] | None = None
    unet_calls: int = 0
    active_calls: int = 0  # ... of which inside the step window
    # Per latent size: each level's grid (rows, columns), and for eager calls the index tensors built once per grid
    # shape and device (a compiled graph builds its own).
    latent: tuple[int, int] | None = None
    grids: dict[int, tuple[int, int]] = field(default_factory=dict)
    layouts: dict[tuple[int, int, str], GridLayout] = field(default_factory=dict)
    fixed: dict[tuple[int, int, str], Partition] = field(default_factory=dict)
    tables: dict[tuple[int, int, str], PartitionTable] = field(default_factory=dict)
    # Per call: its scratch (None outside a call and outside the step window), and what unmarks its latent.
    call: _Call | None = None
    unmark: Callable[[], None] | None = None  # takes `compat.static_sizes`' mark off this call's latent


@dataclass(frozen=True)
class TomeStats:
    """What the patch did since it was applied or since `reset_stats`, read with `stats`.

    Blocks count once however often they ran. `selected`: blocks the config merges or pools in (its `BlockTable`'s
    acting blocks), of the UNet's `total` transformer blocks. `planned`: selected blocks that got a merge plan (or
    kv grid) at least once. `reached`: planned blocks whose hooked attention/MLP modules then ran (another
    extension may replace the attention and skip the module). `applied`: blocks that really merged tokens (or
    pooled keys/values), and `modules` the same per kind of module: ("kv", n) self-attention pooled its keys/values
    in n blocks, ("attn1", n) self-attention, ("attn2", n) cross-attention and ("ff", n) the feed-forward ran on
    merged tokens; on a diffusion transformer ("own", n): each query also attended to its own key in n of them,
    `kernels` what ran the reduced attention ("PyTorch attention", "SageAttention", another node's override) in how
    many blocks, `own_key_off` why the others' queries did not keep their own key, and `not_reached` why planned
    blocks were not reached, where the core knows (a diffusers attention backend whose kernel it cannot run).
    `unet_calls` and `active_calls` (inside the step window) count UNet calls, compiled or not; on a diffusion
    transformer `window_runs` those of the active calls in which its selected blocks ran (a step cache such as
    EasyCache calls the model's forward and skips its blocks in the steps whose output it reuses);
    `block_calls` the selected blocks that ran at least once and `grid_misses` those whose token count did not fit
    their level's grid at the latent's size. Compiled or eager, a block counts only when the code that ran merged
    in it.
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
    levels: frozenset[int]  # the levels the config merges or pools at
    block_levels: frozenset[int]  # the levels that hold transformer blocks
    modules: tuple[tuple[str, int], ...] = ()  # (kind, blocks) for each kind of module that merged or pooled
    kernels: tuple[tuple[str, int], ...] = ()  # DiT: (what ran the reduced attention, blocks)
    own_key_off: tuple[tuple[str, int], ...] = ()  # DiT: (why queries did not keep their own key, blocks)
    not_reached: tuple[tuple[str, int], ...] = ()  # DiT: (why planned blocks were not reached, blocks)
    window_runs: int | None = None  # DiT: active calls in which the selected blocks ran (None: not counted)


# ---------------------------------------------------------------------------------------------- finding


def _candidates(model: Any) -> list[nn.Module]:
    """What may hold the model: a WebUI/LDM/SGM model's `.model.diffusion_model`, a diffusers pipeline's `.unet` or
    `.transformer`, or the module itself; the module a torch.compile wrapper runs when it is one."""
    found = [getattr(getattr(model, "model", None), "diffusion_model", None)]
    found += [getattr(model, name, None) for name in ("unet", "transformer")]
    return [uncompiled(m) for m in (*found, model) if isinstance(m, nn.Module)]


def _not_handled(model: Any) -> str:
    return (
        f"{type(model).__name__} is not a model ToMe patches: it patches UNets (ldm/sgm UNetModel, diffusers"
        " UNet2DConditionModel: SD1.x, SD2.x, SDXL) and the diffusion transformers"
        f" {handled()}, alone or inside a WebUI/LDM model (.model.diffusion_model) or a diffusers pipeline (.unet,"
        " .transformer)"
    )


def find_model(model: Any) -> nn.Module:
    """The UNet or diffusion transformer ToMe patches in `model` (see `_candidates`); TypeError naming the class
    otherwise."""
    for candidate in _candidates(model):
        if find_layout(candidate) is not None or _is_unet(candidate):
            return candidate
    raise TypeError(_not_handled(model))


def _second_expert(model: Any, first: nn.Module) -> list[nn.Module]:
    """A diffusers pipeline's second diffusion transformer (`transformer_2`: Wan 2.2 14B's low-noise expert beside
    the high-noise `transformer`), which the pipeline calls for the later steps: patched, counted and removed with
    the first, with the same settings. Empty for anything else."""
    second = getattr(model, "transformer_2", None)
    if model is first or not isinstance(second, nn.Module):
        return []
    second = uncompiled(second)
    return [second] if second is not first and find_layout(second) is not None else []


def find_unet(model: Any) -> nn.Module:
    """The UNet inside a WebUI/LDM/SGM model (`.model.diffusion_model`), a diffusers pipeline (`.unet`) or itself;
    the module a torch.compile wrapper runs when it is one. TypeError for anything else, a diffusion transformer
    included."""
    module = find_model(model)
    layout = find_layout(module)
    if layout is not None:
        raise TypeError(
            f"{type(module).__name__} has no UNet: it is a diffusion transformer ({family(layout.family).label})"
        )
    return module


def _is_unet(module: nn.Module) -> bool:
    return any(hasattr(module, a) for a in ("input_blocks", "down_blocks")) or any(
        _is_block(m) for m in module.modules()
    )


def _is_block(module: nn.Module) -> bool:
    return any(c.__name__ == "BasicTransformerBlock" for c in type(module).__mro__) and hasattr(module, "attn1")


def _walk(unet: nn.Module) -> list[tuple[nn.Module, BlockShape]]:
    """The UNet's transformer blocks in forward order, each with what its plan needs: its downsampling level, its
    place in its transformer stack, its modules. Read from the module tree, once per patch or description.

    Registration order inside each stage follows the forward order (attentions before the down/upsampler), but
    diffusers registers `up_blocks` before `mid_block`, so stages are visited in forward order explicitly. A stack
    is a module with `transformer_blocks` (Transformer2DModel / SpatialTransformer), run in that order.
    """
    stacks: dict[int, tuple[int, int, int]] = {}  # id(block) -> (stack, position, length)
    for number, module in enumerate(
        m for m in unet.modules() if isinstance(getattr(m, "transformer_blocks", None), nn.ModuleList)
    ):
        for position, block in enumerate(module.transformer_blocks):
            stacks[id(block)] = (number, position, len(module.transformer_blocks))
    stages = [getattr(unet, n) for n in ("input_blocks", "middle_block", "output_blocks") if hasattr(unet, n)]
    if not stages:
        stages = [getattr(unet, n) for n in ("down_blocks", "mid_block", "up_blocks") if getattr(unet, n, None)]
    if not stages:
        stages = [unet]
    level = 1
    found: list[tuple[nn.Module, BlockShape]] = []
    for stage in stages:
        for module in stage.modules():
            name = type(module).__name__
            if _is_block(module):
                stack, position, length = stacks.get(id(module), (None, 0, 1))
                modules = tuple(n for n in BLOCK_MODULES if isinstance(getattr(module, n, None), nn.Module))
                shape = BlockShape(level, stack, position, length, modules, _self_attention(module) is not None)
                found.append((module, shape))
            elif name.startswith("Downsample"):
                level *= 2
            elif name.startswith("Upsample"):
                level = max(1, level // 2)
    return found


def _self_attention(module: nn.Module) -> nn.Module | None:
    """The block's `attn1` where it attends to the block's own tokens (the only place pooling keys/values makes
    sense), else None."""
    target = getattr(module, "attn1", None)
    if not isinstance(target, nn.Module):
        return None
    if getattr(module, "disable_self_attn", False) or getattr(module, "only_cross_attention", False):
        return None
    return target


def model_family(model: Any) -> str:
    """The family presets resolve for: "sdxl" when the UNet's first transformer blocks sit at level 2 (SDXL and
    its fine-tunes), "sd" for the other UNets (SD1.x, SD2.x: attention from full resolution), and a diffusion
    transformer's own family ("flux", "wan", ... `tome_core.families`)."""
    module = find_model(model)
    layout = find_layout(module)
    if layout is not None:
        return layout.family
    found = _walk(module)
    if not found:
        raise TypeError(f"{type(module).__name__} has no BasicTransformerBlock")
    return family_of_levels([shape.level for _, shape in found])


# ---------------------------------------------------------------------------------------------- public API


def apply_patch(model: Any, config: TomeConfig | None = None, /, *, preset: str | None = None, **fields: Any) -> Any:
    """Patch `model`'s UNet with token merging and return `model`.

    Takes a `TomeConfig`, a preset name (`preset="fast"`, see `presets()`: resolved for this model's family),
    tomesd-style keywords (`ratio=0.5, sx=2, ...`), or a mix: keywords
    override the preset or config. Applying again replaces the previous patch. Invalid values raise
    `ValueError`/`TypeError` naming the field, and leave the model untouched.

    A UNet compiled with torch.compile, before or after the patch, runs merged: the patch goes on the module the
    compiled wrapper runs, and its graph traces again once (see the README's "With torch.compile").

    A diffusers pipeline with two diffusion transformers (Wan 2.2 14B: `transformer` for the high-noise steps,
    `transformer_2` for the low-noise ones) gets both patched with the same settings, and `remove_patch` removes both.
    """
    if config is not None and not isinstance(config, TomeConfig):
        raise TypeError(f"config must be a TomeConfig, got {type(config).__name__}")
    if preset is not None and config is not None:
        raise TypeError("apply_patch takes a config or a preset, not both")
    unet = find_model(model)
    pipeline = _ref(model) if hasattr(getattr(model, "scheduler", None), "timesteps") else None
    layout = find_layout(unet)
    if layout is not None:
        plans = []
        for module in (unet, *_second_expert(model, unet)):
            found_layout = find_layout(module)
            assert found_layout is not None
            base = get_preset(preset).config(found_layout.family) if preset is not None else config
            module_config = TomeConfig.from_dict(fields, base=base or TomeConfig(mode="kv"))
            check_dit_config(module_config, type(module).__name__, found_layout, module)
            plans.append((module, found_layout, module_config))
        remove_patch(model)
        for module, found_layout, module_config in plans:
            apply_dit(module, found_layout, module_config, pipeline, STATE_ATTR)
        return model
    found = _walk(unet)
    if not found:
        raise TypeError(f"{type(unet).__name__} has no BasicTransformerBlock to patch")
    if preset is not None:
        config = get_preset(preset).config(family_of_levels([shape.level for _, shape in found]))
    config = TomeConfig.from_dict(fields, base=config)
    table = plan_blocks(config, [shape for _, shape in found])

    remove_patch(model)
    state = _State(config=config, table=table, pipeline=pipeline)
    state.handles.append(unet.register_forward_pre_hook(eager(_unet_pre_hook(state)), with_kwargs=True))
    state.handles.append(unet.register_forward_hook(eager(_unet_post_hook(state))))
    state.hooks.append(_UNetHook(unet))
    for (module, _shape), block_plan in zip(found, table.blocks):
        if block_plan.kind != "none":
            _hook_block(state, module, block_plan)
    for hook in state.hooks:
        hook.install()
    setattr(unet, STATE_ATTR, state)
    return model


def check_config(model: Any, config: TomeConfig) -> None:
    """Raise what `apply_patch(model, config)` would raise about `config` before touching `model` (ValueError or
    TypeError naming the field and what is allowed): a diffusion transformer's own rules (fields it cannot run at
    their defaults; merging only where its blocks can run on merged tokens). A UNet runs every valid `TomeConfig`."""
    module = find_model(model)
    layout = find_layout(module)
    if layout is not None:
        check_dit_config(config, type(module).__name__, layout, module)


def remove_patch(model: Any) -> Any:
    """Remove our patch from `model`'s UNet, restoring it exactly; a no-op when it is not patched."""
    unet = find_model(model)
    for module in (unet, *_second_expert(model, unet)):
        state = module.__dict__.pop(STATE_ATTR, None)
        if isinstance(state, DitState):
            remove_dit(state)
        elif state is not None:
            state.call = None
            uninstall(state)
    return model


def is_patched(model: Any) -> bool:
    return STATE_ATTR in find_model(model).__dict__


def get_config(model: Any) -> TomeConfig | None:
    state = find_model(model).__dict__.get(STATE_ATTR)
    return state.config if state is not None else None


def block_table(model: Any, config: TomeConfig | None = None) -> BlockTable:
    """What each transformer block of `model`'s UNet does: under `config`, else under the model's patch (the table
    its hooks were installed from), else under the default preset for the model's family."""
    unet = find_model(model)
    state = unet.__dict__.get(STATE_ATTR)
    if config is None and state is not None:
        return state.table
    layout = find_layout(unet)
    if layout is not None:
        return plan_dit(config or get_preset(DEFAULT_PRESET).config(layout.family), len(layout.blocks(unet)))
    shapes = [shape for _, shape in _walk(unet)]
    if config is None:
        config = _default_config([shape.level for shape in shapes])
    return plan_blocks(config, shapes)


def set_step(model: Any, step: int | None, total: int | None) -> None:
    """Tell the patch which sampler step runs next, for the step window.

    Samplers that evaluate the UNet twice per step should report the same step for both calls. Without it, a
    model patched through a diffusers pipeline follows the pipeline scheduler's step index; a bare UNet with a
    step window reads the timestep back instead (one host synchronisation per call on a GPU, outside any
    compiled graph).
    """
    unet = find_model(model)
    for module in (unet, *_second_expert(model, unet)):
        state = module.__dict__.get(STATE_ATTR)
        if state is None:
            continue
        if step is None or total is None or total <= 0:
            state.step = None
        else:
            state.step = (int(step), int(total))


def stats(model: Any) -> TomeStats | None:
    """What the patch on `model` did since it was applied or since `reset_stats`; None when it is not patched. For
    a pipeline with two experts (Wan 2.2 14B), the first's (`transformer`): ask `stats(pipe.transformer_2)` for the
    second's."""
    state = find_model(model).__dict__.get(STATE_ATTR)
    if state is None:
        return None
    if isinstance(state, DitState):
        return _dit_stats(state)
    table = state.table
    kinds: Counter[str] = Counter()
    for block in state.blocks:
        kinds.update(block.applied_names())
    return TomeStats(
        mode=state.config.mode,
        total=len(table.blocks),
        selected=len(state.blocks),
        planned=sum(1 for b in state.blocks if b.planned),
        reached=sum(1 for b in state.blocks if b.planned and b.counts_reached()),
        applied=sum(1 for b in state.blocks if b.counts_applied()),
        unet_calls=state.unet_calls,
        active_calls=state.active_calls,
        block_calls=sum(1 for b in state.blocks if b.called),
        grid_misses=sum(1 for b in state.blocks if b.grid_miss),
        levels=table.levels,
        block_levels=table.block_levels,
        modules=tuple((name, kinds[name]) for name in ("kv", "attn1", "attn2", "ff") if kinds[name]),
    )


def _dit_stats(state: DitState) -> TomeStats:
    hooks = state.hooks
    applied = sum(1 for h in hooks if h.applied)
    pooled = sum(1 for h in hooks if h.applied and h.plan.kind == "kv")
    merged = applied - pooled
    own = sum(1 for h in hooks if h.applied and h.own_key)  # a merged block's hook never sets it
    kernels = Counter(h.kernel for h in hooks if h.applied and h.kernel)
    off = Counter(h.own_off for h in hooks if h.applied and h.own_off and not h.own_key)
    unreached = Counter(h.unreached for h in hooks if h.planned and not h.reached and h.unreached)
    return TomeStats(
        mode=state.config.mode,
        total=len(state.table.blocks),
        selected=len(hooks),
        planned=sum(1 for h in hooks if h.planned),
        reached=sum(1 for h in hooks if h.reached),
        applied=applied,
        unet_calls=state.unet_calls,
        active_calls=state.active_calls,
        block_calls=sum(1 for h in hooks if h.called),
        grid_misses=sum(1 for h in hooks if h.grid_miss),
        levels=state.table.levels,
        block_levels=state.table.block_levels,
        modules=tuple(
            (name, count) for name, count in (("kv", pooled), ("own", own), ("attn1", merged), ("ff", merged)) if count
        ),
        kernels=tuple(sorted(kernels.items())),
        own_key_off=tuple(sorted(off.items())),
        not_reached=tuple(sorted(unreached.items())),
        window_runs=state.window_runs,
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
    state = find_model(model).__dict__.get(STATE_ATTR)
    if isinstance(state, _State):
        state.guard = guard


def reset_stats(model: Any) -> None:
    """Start counting afresh (the WebUI does so at the start of each sampling pass)."""
    unet = find_model(model)
    for module in (unet, *_second_expert(model, unet)):
        state = module.__dict__.get(STATE_ATTR)
        if state is None:
            continue
        state.unet_calls = state.active_calls = 0
        if isinstance(state, DitState):
            state.window_runs = 0
        for block in state.hooks if isinstance(state, DitState) else state.blocks:
            block.reset()


def set_attention_interceptor(model: Any, interceptor: str) -> None:
    """Who subsamples a patched diffusion transformer's keys/values: "sdpa" (the default: the
    scaled_dot_product_attention called inside each reduced block's attention) or "host" (the host's own attention
    override calls `reduce_attention`, as ComfyUI's adapter does). A no-op on a UNet or an unpatched model."""
    if interceptor not in INTERCEPTORS:
        raise ValueError(f"interceptor must be one of {', '.join(map(repr, INTERCEPTORS))}, got {interceptor!r}")
    state = find_model(model).__dict__.get(STATE_ATTR)
    if isinstance(state, DitState):
        state.interceptor = interceptor


def reduce_attention(
    model: Any,
    key: torch.Tensor,
    value: torch.Tensor,
    dim: int,
    mask: Any = None,
    kernel: str = "",
    own_key_off: str = "",
) -> Any:
    """For a host's attention override on a patched diffusion transformer: (key, value, mask) with the generated
    tokens' keys/values subsampled along the sequence dimension `dim` while a block ToMe reduces runs, else None
    (run the attention unchanged). `model` is the diffusion transformer module itself (not looked up per call).
    `kernel` names what runs the attention on them and `own_key_off` why its queries do not keep their own key
    there (what `stats` reports: `TomeStats.kernels`, `TomeStats.own_key_off`)."""
    return reduce_dit(model, STATE_ATTR, key, value, dim, mask, kernel, own_key_off)


def reduced_attention(
    model: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Any = None,
    scale: float | None = None,
    kernel: LseKernel | None = None,
) -> torch.Tensor | None:
    """For a host's attention override on a patched diffusion transformer (each query keeps its own key beside the
    kept ones): the attention output [B, H, L, D] from [B, H, L, D] tensors (the mask broadcast to [B, H, L, L])
    while a block ToMe reduces runs, else None: then `reduce_attention` and the host's own attention. Call it first.
    `kernel` runs the kept keys' attention (`tome_core.kernels`: the SageAttention, flash-attn or xformers function
    the host would call; PyTorch's by default); where it returns no log-sum-exp, its output is returned as it is and
    `stats` says the own key was off there and why."""
    return attend_dit(model, STATE_ATTR, query, key, value, mask, scale, kernel)


def transformer_blocks(model: Any) -> list[tuple[nn.Module, int]]:
    """`model`'s UNet's transformer blocks in forward order, each with its downsampling level (1: the full latent,
    2: half, ...), as the patch finds them."""
    module = find_model(model)
    layout = find_layout(module)
    if layout is not None:
        return [(block, 1) for block in layout.blocks(module)]
    return [(module, shape.level) for module, shape in _walk(module)]


def blocks_per_level(model: Any) -> dict[int, int]:
    """Transformer blocks per downsampling level of `model`'s UNet (1: the full latent, 2: half, ...)."""
    return dict(Counter(level for _, level in transformer_blocks(model)))


def describe(model: Any, height: int = 512, width: int = 512, config: TomeConfig | None = None) -> list[LevelInfo]:
    """Per downsampling level: transformer blocks, how many merge (or pool), tokens before and those
    self-attention attends to after, at an image size; read from the model's `block_table`.

    `height`/`width` are in pixels, positive multiples of 8 (latent = pixels / 8); anything else raises
    ValueError (TypeError for a non-integer) naming the argument. Describes `config`, else the model's current
    patch config, else the default preset (`DEFAULT_PRESET`) resolved for the model's family (`model_family`): what
    `apply_patch(model, preset=DEFAULT_PRESET)` and the WebUI's default would run.
    """
    _check_size(height=height, width=width)
    return block_table(model, config).level_infos((height // 8, width // 8))


def describe_layout(
    blocks: Mapping[int, int], height: int = 512, width: int = 512, config: TomeConfig | None = None
) -> list[LevelInfo]:
    """`describe` for a UNet known only by its transformer blocks per level (`blocks_per_level`), e.g. a model
    family's layout in a UI that has no model at hand (`tome_core.plan.layout_table`). Without `config`: the
    default preset, for the family the layout is of as `model_family` tells it ("sdxl" when the first level holding
    blocks is 2 or deeper, else "sd"). Sizes as in `describe`."""
    _check_size(height=height, width=width)
    if config is None:
        config = _default_config([level for level, count in blocks.items() if count > 0])
    return layout_table(blocks, config).level_infos((height // 8, width // 8))  # as the WebUI and diffusers size it


def _default_config(levels: list[int]) -> TomeConfig:
    """The default preset for the family of a UNet whose transformer blocks sit at `levels`."""
    return get_preset(DEFAULT_PRESET).config(family_of_levels(levels)) if levels else TomeConfig()


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
    """Per UNet call, on the host: the counts, the step window, the grids, and the call's scratch."""

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        state.call = None
        x = _first_arg(args, kwargs, "x", "sample")
        if not isinstance(x, torch.Tensor) or x.dim() < 3:
            return  # not a latent: nothing to merge over
        latent = (int(x.shape[-2]), int(x.shape[-1]))
        unmark(state)
        state.unmark = static_sizes(x)
        if latent != state.latent:
            state.latent = latent
            state.grids = {level: grid(level, latent) for level in state.table.block_levels}
        timestep = timestep_arg(args, kwargs)
        fraction = _fraction(state, timestep)
        active = fraction is None or state.config.active_at(fraction)
        state.unet_calls += 1
        state.active_calls += active
        if not active:
            return
        # A number becomes a device tensor here, outside any graph: traced, the graph would guard on its value.
        if not isinstance(timestep, torch.Tensor):
            value = 0.0 if timestep is None else float(timestep)
            timestep = torch.full((1,), value, dtype=torch.float32, device=x.device)
        state.call = _Call(timestep)

    return hook


def _unet_post_hook(state: _State) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        state.call = None  # nothing of this call kept alive until the next
        unmark(state)

    return hook


def _call_partition(state: _State, call: _Call, level: int, device: torch.device) -> Partition:
    """This call's partition of `level`'s grid, made on the first block that asks for it.

    Eagerly, the grid's index tensors and its table of random partitions are built once and kept, and a call picks
    its row by its timestep. A compiled graph builds the index tensors itself (constants to the compiler) and hashes
    the same row's slots from its own timestep input, so that it reads no tensor from the patch's state: under CUDA
    graphs such a tensor would be an input whose address must never change.
    """
    part = call.parts.get(level)
    if part is not None:
        return part
    config = state.config
    h, w = state.grids[level]
    compiling = is_compiling()
    cache = (h, w, str(device))
    layout = None if compiling else state.layouts.get(cache)
    if layout is None:
        layout = grid_layout(h, w, config.sx, config.sy, device)
        if not compiling:
            state.layouts[cache] = layout
    numbers = config.matching == "global"  # only global matching reads the per-token table
    if config.use_rand:
        seed = _DEFAULT_SEED if config.seed is None else config.seed
        if call.key is None:
            call.key = timestep_key(call.timestep, device)
        if compiling:
            part = hashed_partition(layout, call.key, seed, numbers=numbers)
        else:
            table = state.tables.get(cache)
            if table is None:
                table = state.tables[cache] = random_partitions(layout, seed)
            if call.row is None:
                call.row = call.key.remainder(table.count)
            part = table.pick_row(call.row, numbers=numbers)
    else:
        part = None if compiling else state.fixed.get(cache)
        if part is None:
            part = partition(layout, fixed_slots(layout))
            if not compiling:
                state.fixed[cache] = part
    call.parts[level] = part
    return part


def _band(state: _State, call: _Call, block: BlockPlan, x: torch.Tensor, ratio: float) -> BandMerge | None:
    """This call's band merge plan (local matching) for the blocks sharing `block`'s plan key, at `ratio`: matched
    on the first of them that asks (from its input tokens), planned once per ratio, dropped with the call."""
    plan_key = (block.key, ratio)
    if plan_key in call.merges:
        return call.merges[plan_key]
    if block.key not in call.matches:
        call.matches[block.key] = band_match(x, _call_partition(state, call, block.level, x.device))
    m = call.matches[block.key]
    merge = band_merge(m, ratio) if isinstance(m, BandMatch) else None
    call.merges[plan_key] = merge
    return merge


def _pair(state: _State, call: _Call, block: BlockPlan, x: torch.Tensor, ratio: float) -> tuple[Merge, Merge] | None:
    """This call's (merge, unmerge) at `ratio` for the blocks sharing `block`'s plan key: a band merge (local), or
    tomesd's rule over the whole grid (global): the sources ranked once per plan key, planned once per ratio."""
    if block.matching != "global":
        merge = _band(state, call, block, x, ratio)
        return None if merge is None else (merge.merge, merge.unmerge)
    plan_key = (block.key, ratio)
    if plan_key in call.merges:
        return call.merges[plan_key]
    tokens = x.shape[1]
    removed = tokens - block.kept(ratio, *state.grids[block.level])
    pair = None
    if removed > 0:
        m = call.matches.get(block.key)
        if not isinstance(m, Match):
            m = call.matches[block.key] = match(x, _call_partition(state, call, block.level, x.device))
        pair = plan(m, removed)
    call.merges[plan_key] = pair
    return pair


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


class _UNetHook(Hook):
    """The UNet itself: makes the call's scratch (`_Call`) with the timestep as the forward received it, so that a
    compiled graph hashes the random partitions from its own input (the pre-hook's copy would be a tensor from
    Python state), and drops it before the graph returns.

    It reads the patch's state from the UNet (`STATE_ATTR`), not from itself: a compiled frame that starts here
    then reaches every number of the state through an nn.Module, and dynamo keeps the integers it finds on
    modules constant. Reached from this object (a plain local), the strides and grid sizes would become symbolic
    once they differ from a previous compile (automatic dynamic shapes: a new preset or latent size), or from the
    start under `dynamic=True`, and inductor fails on the merge's index arithmetic with symbolic strides.
    """

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        timestep = timestep_arg(args, kwargs)
        state = getattr(self.module, STATE_ATTR, None)
        if self.passthrough or state is None or state.call is None or not isinstance(timestep, torch.Tensor):
            return self.call(*args, **kwargs)  # outside the step window, or a number the pre-hook made a tensor
        state.call = _Call(timestep)
        try:
            return self.call(*args, **kwargs)
        finally:
            state.call = None


class _BlockHook(Hook):
    """A transformer block its plan has do something (`BlockPlan.kind`).

    "whole": the block runs on its merged input and its output is unmerged, with what merging took from each token
    added back: the same as merging each of attention, cross-attention and feed-forward with one plan
    (merge(x + unmerge(d)) = merge(x) + d), for one merge and one unmerge instead of three each. A block that
    `carries` hands its stack's later blocks the merged tokens as they come, and the last one unmerges. "modules"
    and "kv": its modules' hooks (`_MergeHook`, `_KvHook`) merge or pool one by one, with the plans this hook makes
    for the call.
    """

    def __init__(self, state: _State, module: nn.Module, plan: BlockPlan) -> None:
        super().__init__(module)
        self.state = state
        self.plan = plan
        self.modules: list[_MergeHook | _KvHook] = []
        self.reset()

    def reset(self) -> None:
        # Flags the hooks set and never read (a compiled graph replays each store after its run).
        self.called = self.planned = self.grid_miss = self.merged = False
        for hook in self.modules:
            hook.wanted = hook.reached = hook.applied = False

    def counts_applied(self) -> bool:
        if self.plan.kind == "whole":
            return self.merged
        wanted = [hook for hook in self.modules if hook.wanted]
        return bool(wanted) and all(hook.applied for hook in wanted)

    def counts_reached(self) -> bool:
        return self.merged if self.plan.kind == "whole" else all(m.reached for m in self.modules)

    def applied_names(self) -> list[str]:
        if self.plan.kind == "whole":
            return list(self.plan.modules) if self.merged else []
        return [hook.name for hook in self.modules if hook.applied]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.passthrough:
            return self.call(*args, **kwargs)
        self.called = True
        call = self.state.call
        x = _first_arg(args, kwargs, "x", "hidden_states")
        if call is None or not (isinstance(x, torch.Tensor) and x.dim() == 3):
            return self.call(*args, **kwargs)
        if self.plan.kind == "whole":
            return self._whole(call, x, args, kwargs)
        return self._modules(call, x, args, kwargs)

    def _fits(self, x: torch.Tensor) -> bool:
        """Whether the tokens are the block's level's grid at this latent size (else another patch changed them)."""
        h, w = self.state.grids.get(self.plan.level, (0, 0))
        if x.shape[1] != h * w:
            self.grid_miss = True
            return False
        return True

    # -------------------------------------------------------------------------------- whole blocks

    def _whole(self, call: _Call, x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        block = self.plan
        if block.carries and block.shape.position > 0:
            carried = call.carry.get(block.shape.stack)  # type: ignore[arg-type]
            if carried is None or x.shape[1] != carried[0].merged_tokens:
                if block.shape.stack in call.guarded:
                    self.planned = True
                return self.call(*args, **kwargs)  # the stack's first block did not merge
            merge, residual = carried
            self.planned = self.merged = True
            out = self.call(*args, **kwargs)
            if block.shape.position == block.shape.length - 1:
                del call.carry[block.shape.stack]  # type: ignore[arg-type]
                return merge.unmerge_add(residual, out)
            return out
        guard = self.state.guard
        if guard is not None and guard(kwargs, block.positions):
            self.planned = True  # it would have merged: counted planned, not reached
            if block.carries:
                call.guarded[block.shape.stack] = True  # type: ignore[index]
            return self.call(*args, **kwargs)
        if not self._fits(x):
            return self.call(*args, **kwargs)
        with torch.no_grad():
            merge = _band(self.state, call, block, x, block.merges[0][1])
        if merge is None:
            return self.call(*args, **kwargs)
        self.planned = self.merged = True
        merged, residual = merge.merge_with_residual(x)
        args, kwargs = _with_first(args, kwargs, merged)
        out = self.call(*args, **kwargs)
        if block.carries and block.shape.position < block.shape.length - 1:
            call.carry[block.shape.stack] = (merge, residual)  # type: ignore[index]
            return out
        return merge.unmerge_add(residual, out)

    # -------------------------------------------------------------------------------- module by module

    def _modules(self, call: _Call, x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        block = self.plan
        if not self._fits(x):
            return self.call(*args, **kwargs)
        plans: dict[float, tuple[Merge, Merge]] = {}
        with torch.no_grad():
            for ratio in block.ratios:
                pair = _pair(self.state, call, block, x, ratio)
                if pair is not None:
                    plans[ratio] = pair
        for hook in self.modules:
            if hook.ratio is None or hook.ratio in plans:
                hook.wanted = True
        if not (block.pools or plans):
            return self.call(*args, **kwargs)
        self.planned = True
        call.running[block.index] = (x.shape[1], self.state.grids[block.level], plans)
        try:
            return self.call(*args, **kwargs)
        finally:
            del call.running[block.index]  # a module run outside its block merges nothing


def _with_first(
    args: tuple[Any, ...], kwargs: dict[str, Any], x: torch.Tensor
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) with the tokens (the first positional argument, or `x`/`hidden_states`) replaced by `x`."""
    if args:
        return (x, *args[1:]), kwargs
    name = next(n for n in ("x", "hidden_states") if n in kwargs)
    return args, {**kwargs, name: x}


class _MergeHook(Hook):
    """Self-/cross-attention or the feed-forward: runs on the block's merged tokens, then unmerges its output."""

    def __init__(self, block: _BlockHook, module: nn.Module, name: str, ratio: float) -> None:
        super().__init__(module)
        self.block = block
        self.name = name  # "attn1", "attn2" or "ff"
        self.ratio: float | None = ratio  # the block's plan it merges with
        self.wanted = self.reached = self.applied = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        call = None if self.passthrough else self.block.state.call
        running = None if call is None else call.running.get(self.block.plan.index)
        if running is None:
            return self.call(*args, **kwargs)
        self.reached = True
        tokens, _grid, plans = running
        pair = plans.get(self.ratio)  # type: ignore[arg-type]
        name = None if args else next((n for n in ("x", "hidden_states") if n in kwargs), None)
        x = args[0] if args else kwargs.get(name) if name else None
        # Another patch (the WebUI's built-in tomesd, say) may already have changed the token count.
        if pair is None or not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != tokens:
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


class _KvHook(Hook):
    """Self-attention in kv mode: every query attends to keys/values pooled over the block's token grid."""

    name = "kv"
    ratio = None  # pools: no merge plan

    def __init__(self, block: _BlockHook, module: nn.Module, kv_kw: str) -> None:
        super().__init__(module)
        self.block = block
        self.kv_kw = kv_kw  # keyword through which attn1 takes keys/values ("context" or "encoder_hidden_states")
        self.wanted = self.reached = self.applied = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        call = None if self.passthrough else self.block.state.call
        running = None if call is None else call.running.get(self.block.plan.index)
        if running is None:
            return self.call(*args, **kwargs)
        self.reached = True
        x = _first_arg(args, kwargs, "x", "hidden_states")
        # Self-attention's keys/values are absent (None) or, in Forge once any attn1 patch exists, the queries
        # themselves; anything else (another extension's keys/values) is left alone.
        targets = [self.kv_kw, *(["value"] if "value" in kwargs else [])]
        if any(kwargs.get(kw) is not None and kwargs.get(kw) is not x for kw in targets):
            return self.call(*args, **kwargs)
        _tokens, (h, w), _plans = running
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != h * w:
            return self.call(*args, **kwargs)  # tokens already merged by another patch: no grid to pool over
        plan = self.block.plan
        pooled = kv_downsample(x, w, h, plan.sx, plan.sy)
        self.applied = True
        return self.call(*args, **{**kwargs, **dict.fromkeys(targets, pooled)})


def _hook_block(state: _State, module: nn.Module, plan: BlockPlan) -> None:
    """Hook `module` and the modules its plan names."""
    block = _BlockHook(state, module, plan)
    if plan.pools:
        target = module.attn1
        block.modules.append(_KvHook(block, target, _kv_keyword(target)))
    if plan.kind != "whole":
        block.modules.extend(_MergeHook(block, getattr(module, name), name, ratio) for name, ratio in plan.merges)
    block.reset()
    state.blocks.append(block)
    state.hooks.append(block)
    state.hooks.extend(block.modules)
