"""Apply and remove token merging on a UNet instance through forward hooks.

Nothing here changes a class: every patch is a set of hooks registered on the model's own modules, recorded
in one state object on the UNet, and `remove_patch` removes exactly those. The WebUI's built-in token
merging (tomesd) unpatches by the class name `ToMeBlock` and the attribute `_tome_info`; we use neither,
so the two never undo each other.
"""

from __future__ import annotations

import math
import weakref
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from tome_core.config import LEVELS, TomeConfig, auto_levels
from tome_core.merge import (
    GridLayout,
    Merge,
    Partition,
    PartitionTable,
    fixed_slots,
    grid_layout,
    kv_downsample,
    match,
    partition,
    plan,
    random_partitions,
)

STATE_ATTR = "_tome_sd_state"

#: Timesteps the SD noise schedules were trained with; maps a timestep to a sampling fraction.
_TRAIN_TIMESTEPS = 1000
#: Keywords through which attention modules take keys and values (ldm/sgm/Forge, diffusers, Forge's values).
_KV_KEYWORDS = ("context", "encoder_hidden_states", "value")
#: Seed used when the config leaves `seed` as None.
_DEFAULT_SEED = 0x70E5


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

_Plans = dict[str, tuple[Merge, Merge]]  # "attn"/"mlp" -> (merge, unmerge)


@dataclass
class _Block:
    """One patched transformer block and the merge plans of its current call."""

    index: int
    level: int
    kv_kw: str  # keyword through which attn1 takes keys/values ("context" or "encoder_hidden_states")
    stack: int = 0  # the transformer stack (Transformer2DModel / SpatialTransformer) holding the block
    first_in_stack: bool = True
    plans: _Plans | None = None  # the current call's merge/unmerge per ratio kind
    unmerge: Merge | None = None  # the unmerge owed by the module now running
    tokens: int = 0  # token count the current plans were made for
    grid: tuple[int, int] | None = None  # (h, w) of the current call, when kv pooling applies
    # Since the last `reset_stats`, read by `stats`: calls with a plan (merge plan or kv grid); the hooked modules
    # ("attn1", "attn2", "ff") whose plan merges something, those that ran while a plan existed, and those that
    # really merged or pooled. A block counts only when all of them did: another extension may replace
    # self-attention while the feed-forward still merges.
    planned: int = 0
    wanted: set[str] = field(default_factory=set)
    reached: set[str] = field(default_factory=set)
    applied: set[str] = field(default_factory=set)
    kinds: dict[str, str] = field(default_factory=dict)  # hooked module name -> ratio kind ("attn", "mlp", "kv")
    # Set with the hooks: whether self-attention pools (kv), and the ratio of each kind this block merges.
    pools: bool = False
    ratios: dict[str, float] = field(default_factory=dict)

    def counts_reached(self) -> bool:
        return bool(self.planned) and set(self.kinds) <= self.reached

    def counts_applied(self) -> bool:
        return bool(self.wanted) and self.wanted <= self.applied


@dataclass
class _State:
    config: TomeConfig
    auto_levels: frozenset[int]
    handles: list[RemovableHandle] = field(default_factory=list)
    latent: tuple[int, int] | None = None
    grids: dict[int, tuple[int, int, int] | None] = field(default_factory=dict)  # tokens -> (level, h, w)
    active: bool = True
    step: tuple[int, int] | None = None
    pipeline: Callable[[], Any] | None = None  # the diffusers pipeline patched through: its scheduler's step
    # Index tensors, built once and reused by every block: layouts per grid shape for good, partitions per grid
    # for the current UNet call (random ones change with the timestep), shared plans per stack.
    layouts: dict[tuple[int, int, str], GridLayout] = field(default_factory=dict)
    tables: dict[tuple[int, int, str], PartitionTable] = field(default_factory=dict)
    partitions: dict[tuple[int, int, str], Partition] = field(default_factory=dict)
    timestep: Any = None  # the current call's timestep argument, read on the device only
    key: torch.Tensor | None = None  # [1] int64 partition key derived from it
    stack_plans: dict[int, tuple[int, _Plans]] = field(default_factory=dict)  # stack -> (tokens, plans)
    blocks: list[_Block] = field(default_factory=list)  # the blocks that carry hooks (the config selects them)
    total: int = 0  # transformer blocks in the UNet
    block_levels: frozenset[int] = frozenset()
    unet_calls: int = 0  # UNet forwards since the last `reset_stats`
    active_calls: int = 0  # ... of which inside the step window
    block_calls: int = 0  # calls of selected blocks seen by their hooks
    grid_misses: int = 0  # block calls whose token count fit no level of the latent


@dataclass(frozen=True)
class TomeStats:
    """What the patch did since it was applied or since `reset_stats`, read with `stats`.

    Blocks count once however often they ran. `selected`: blocks the config merges (by level), of the UNet's
    `total` transformer blocks. `planned`: selected blocks that got a merge plan (or kv grid) at least once.
    `reached`: planned blocks whose hooked attention/MLP module then ran (another extension may replace the
    attention and skip the module). `applied`: blocks that really merged tokens (or pooled keys/values).
    `unet_calls`, `active_calls` (inside the step window) and `block_calls` count hook calls: a UNet compiled
    before the patch runs a graph that ignores hooks added later.
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


# ---------------------------------------------------------------------------------------------- finding


def find_unet(model: Any) -> nn.Module:
    """The UNet inside a WebUI/LDM/SGM model (`.model.diffusion_model`), a diffusers pipeline (`.unet`) or itself."""
    inner = getattr(getattr(model, "model", None), "diffusion_model", None)
    if isinstance(inner, nn.Module):
        return inner
    unet = getattr(model, "unet", None)
    if isinstance(unet, nn.Module):
        return unet
    if isinstance(model, nn.Module) and _is_unet(model):
        return model
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


def _stacks(unet: nn.Module) -> dict[int, int]:
    """id(block) -> number of the transformer stack holding it (a module with `transformer_blocks`)."""
    out: dict[int, int] = {}
    for number, module in enumerate(
        m for m in unet.modules() if isinstance(getattr(m, "transformer_blocks", None), nn.ModuleList)
    ):
        for block in module.transformer_blocks:
            out[id(block)] = number
    return out


def model_family(model: Any) -> str:
    """The family presets resolve for: "sdxl" when the UNet's first transformer blocks sit at level 2 (SDXL and
    its fine-tunes), else "sd" (SD1.x, SD2.x: attention from full resolution)."""
    blocks = _structural_levels(find_unet(model))
    if not blocks:
        raise TypeError(f"{type(find_unet(model)).__name__} has no BasicTransformerBlock")
    return "sdxl" if min(level for _, level in blocks) >= 2 else "sd"


def _level_counts(blocks: list[tuple[nn.Module, int]]) -> dict[int, int]:
    return dict(Counter(level for _, level in blocks))


# ---------------------------------------------------------------------------------------------- public API


def apply_patch(model: Any, config: TomeConfig | None = None, /, *, preset: str | None = None, **fields: Any) -> Any:
    """Patch `model`'s UNet with token merging and return `model`.

    Takes a `TomeConfig`, a preset name (`preset="fast"`, see `presets()`: resolved for this model's family),
    tomesd-style keywords (`ratio=0.5, sx=2, ...`), or a mix: keywords
    override the preset or config. Applying again replaces the previous patch. Invalid values raise
    `ValueError`/`TypeError` naming the field, and leave the model untouched.
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
    if hasattr(unet, "_orig_mod"):
        # Seen in reForge's --torch-compile: the hooks counted as run, yet the images equalled those without them.
        raise TypeError(
            f"{type(unet).__name__} is compiled with torch.compile, and its compiled graph does not apply hooks"
            " added afterwards: patch and run the uncompiled module (._orig_mod) instead"
        )
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
    state.handles.append(unet.register_forward_pre_hook(_unet_pre_hook(state), with_kwargs=True))
    state.handles.append(unet.register_forward_hook(_unet_post_hook(state)))
    stacks = _stacks(unet)
    previous = None
    for index, (module, level) in enumerate(blocks):
        stack = stacks.get(id(module), -1 - index)
        slot = _Block(index=index, level=level, kv_kw=_kv_keyword(module.attn1), stack=stack)
        slot.first_in_stack = stack != previous
        previous = stack
        _patch_block(state, module, slot)
    setattr(unet, STATE_ATTR, state)
    return model


def remove_patch(model: Any) -> Any:
    """Remove our patch from `model`'s UNet, restoring it exactly; a no-op when it is not patched."""
    unet = find_unet(model)
    state = unet.__dict__.pop(STATE_ATTR, None)
    if state is not None:
        for handle in state.handles:
            handle.remove()
        state.handles.clear()
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
    step window reads the timestep back instead (one host synchronisation per call on a GPU).
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
    return TomeStats(
        mode=config.mode,
        total=state.total,
        selected=len(state.blocks),
        planned=sum(1 for b in state.blocks if b.planned),
        reached=sum(1 for b in state.blocks if b.counts_reached()),
        applied=sum(1 for b in state.blocks if b.counts_applied()),
        unet_calls=state.unet_calls,
        active_calls=state.active_calls,
        block_calls=state.block_calls,
        grid_misses=state.grid_misses,
        levels=frozenset(lv for lv in state.block_levels | set(LEVELS) if config.merges_level(lv, state.auto_levels))
        if not config.is_noop
        else frozenset(),
        block_levels=state.block_levels,
    )


def reset_stats(model: Any) -> None:
    """Start counting afresh (the WebUI does so at the start of each sampling pass)."""
    state = find_unet(model).__dict__.get(STATE_ATTR)
    if state is None:
        return
    state.unet_calls = state.active_calls = state.block_calls = state.grid_misses = 0
    for block in state.blocks:
        block.planned = 0
        block.wanted, block.reached, block.applied = set(), set(), set()


def transformer_blocks(model: Any) -> list[tuple[nn.Module, int]]:
    """`model`'s UNet's transformer blocks in forward order, each with its downsampling level (1: the full latent,
    2: half, ...), as the patch finds them."""
    return _structural_levels(find_unet(model))


def blocks_per_level(model: Any) -> dict[int, int]:
    """Transformer blocks per downsampling level of `model`'s UNet (1: the full latent, 2: half, ...)."""
    return _level_counts(transformer_blocks(model))


def describe(model: Any, height: int = 512, width: int = 512, config: TomeConfig | None = None) -> list[LevelInfo]:
    """Per downsampling level: transformer blocks, how many merge, tokens before and after, at an image size.

    `height`/`width` are in pixels (latent = pixels // 8). Uses the model's current patch config, else `config`,
    else the defaults.
    """
    config = config or get_config(model) or TomeConfig()
    return describe_layout(blocks_per_level(model), height, width, config)


def describe_layout(
    blocks: Mapping[int, int], height: int = 512, width: int = 512, config: TomeConfig | None = None
) -> list[LevelInfo]:
    """`describe` for a UNet known only by its transformer blocks per level (`blocks_per_level`), e.g. a model
    family's layout in a UI that has no model at hand."""
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
        merging = count if config.merges_level(level, auto) and not config.is_noop else 0
        after = tokens
        if merging and config.mode == "merge":
            after = tokens - min(int(tokens * config.effective_ratio), tokens - (h // config.sy) * (w // config.sx))
        elif merging:
            after = math.ceil(h / config.sy) * math.ceil(w / config.sx)  # keys/values attended to
        out.append(LevelInfo(level=level, blocks=count, merging=merging, tokens=tokens, tokens_after=after))
    return out


# ---------------------------------------------------------------------------------------------- hooks


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
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = _first_arg(args, kwargs, "x", "sample")
        latent = (int(x.shape[-2]), int(x.shape[-1]))
        if latent != state.latent:
            state.latent = latent
            state.grids = {}
        config = state.config
        state.timestep = args[1] if len(args) > 1 else kwargs.get("timesteps", kwargs.get("timestep", kwargs.get("t")))
        state.key = None
        if config.use_rand:
            state.partitions = {}  # random partitions change with the timestep; fixed ones stay
        fraction = _fraction(state)
        state.active = fraction is None or config.active_at(fraction)
        state.unet_calls += 1
        state.active_calls += state.active

    return hook


def _unet_post_hook(state: _State) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        # Drop the call's plans and keys so their tensors are not kept alive between calls.
        state.stack_plans = {}
        state.timestep = state.key = None

    return hook


def _fraction(state: _State) -> float | None:
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
    return 1.0 - _timestep_value(state.timestep) / _TRAIN_TIMESTEPS


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
    wait for the device's stream. A Python number (or None: 0) is filled on the device, with no copy at all.
    """
    if isinstance(timestep, torch.Tensor) and timestep.numel():
        wide = timestep.reshape(-1)[:1].to(device, torch.float32, non_blocking=True)
    else:
        value = 0.0 if timestep is None or isinstance(timestep, torch.Tensor) else float(timestep)
        wide = torch.full((1,), value, dtype=torch.float32, device=device)
    return (wide * 1000).long()  # not in place: `wide` may be the caller's own tensor


def _timestep_key(state: _State, device: torch.device) -> torch.Tensor:
    """`timestep_key` of the call's timestep, derived once per call and device."""
    if state.key is None or state.key.device != device:
        state.key = timestep_key(state.timestep, device)
    return state.key


def _grid(state: _State, tokens: int) -> tuple[int, int, int] | None:
    """(level, h, w) of a block seeing `tokens` tokens in the current call, or None if it fits no level."""
    if tokens not in state.grids:
        found = None
        lat_h, lat_w = state.latent or (0, 0)
        for level in (*LEVELS, 16, 32):
            h, w = math.ceil(lat_h / level), math.ceil(lat_w / level)
            if h * w == tokens:
                found = (level, h, w)
                break
        state.grids[tokens] = found
    return state.grids[tokens]


def _partition(state: _State, h: int, w: int, device: torch.device) -> Partition:
    """The current call's partition of an h x w grid, shared by every block that sees that grid."""
    key = (h, w, str(device))
    part = state.partitions.get(key)
    if part is None:
        config = state.config
        layout = state.layouts.get(key)
        if layout is None:
            layout = state.layouts[key] = grid_layout(h, w, config.sx, config.sy, device)
        if config.use_rand and config.sx * config.sy > 1:
            table = state.tables.get(key)
            if table is None:
                seed = _DEFAULT_SEED if config.seed is None else config.seed
                table = state.tables[key] = random_partitions(layout, zlib.crc32(f"{seed}:{h}x{w}".encode()))
            part = table.pick(_timestep_key(state, device))
        else:
            part = partition(layout, fixed_slots(layout))
        state.partitions[key] = part
    return part


def _patch_block(state: _State, block: nn.Module, slot: _Block) -> None:
    config = state.config
    if config.is_noop or not config.merges_level(slot.level, state.auto_levels):
        return
    modules: list[tuple[str, nn.Module, str]] = []  # (name, module, kind) to hook
    for name, flag, kind in _TARGETS:
        module = getattr(block, name, None)
        if not (getattr(config, flag) and isinstance(module, nn.Module)):
            continue
        if kind == "mlp" and slot.level < config.mlp_min_downsample:
            continue
        if name == "attn1" and config.mode == "kv":
            # Pooling keys/values only makes sense where attn1 attends to the block's own tokens.
            if getattr(block, "disable_self_attn", False) or getattr(block, "only_cross_attention", False):
                continue
            kind = "kv"
        modules.append((name, module, kind))
    if not modules:
        return
    handles = state.handles
    state.blocks.append(slot)
    handles.append(block.register_forward_pre_hook(_block_pre_hook(state, slot), with_kwargs=True))
    handles.append(block.register_forward_hook(_block_post_hook(slot)))
    slot.kinds = {name: kind for name, _, kind in modules}
    slot.pools = "kv" in slot.kinds.values()
    slot.ratios = {kind: r for kind, r in config.ratios_by_kind.items() if kind in slot.kinds.values()}
    for name, module, kind in modules:
        if kind == "kv":
            handles.append(module.register_forward_pre_hook(_kv_pre_hook(state, slot), with_kwargs=True))
        else:
            handles.append(module.register_forward_pre_hook(_merge_pre_hook(slot, name), with_kwargs=True))
            handles.append(module.register_forward_hook(_unmerge_post_hook(slot)))


def _block_pre_hook(state: _State, slot: _Block) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        slot.plans = None
        slot.grid = None
        state.block_calls += 1
        if not state.active or state.latent is None:
            return
        x = _first_arg(args, kwargs, "x", "hidden_states")
        if x is None or x.dim() != 3:
            return
        tokens = x.shape[1]
        grid = _grid(state, tokens)
        if grid is None:
            state.grid_misses += 1
            return
        level, h, w = grid
        config = state.config
        if not config.merges_level(level, state.auto_levels):
            return
        num_dst = (h // config.sy) * (w // config.sx)
        removed = {kind: min(int(tokens * ratio), tokens - num_dst) for kind, ratio in slot.ratios.items()}
        merges = num_dst > 0 and any(r > 0 for r in removed.values())
        if slot.pools:
            slot.grid = (h, w)
            slot.wanted.add("attn1")
        if slot.pools or merges:
            slot.planned += 1
        if not merges:
            return
        slot.tokens = tokens
        slot.wanted.update(name for name, kind in slot.kinds.items() if removed.get(kind, 0) > 0)
        shared = state.stack_plans.get(slot.stack) if config.share_plan and not slot.first_in_stack else None
        if shared is not None and shared[0] == tokens:
            slot.plans = shared[1]
            return
        with torch.no_grad():
            m = match(x, _partition(state, h, w, x.device), config.matching)
            by_r: dict[int, tuple[Merge, Merge]] = {}
            slot.plans = {kind: by_r.get(r) or by_r.setdefault(r, plan(m, r)) for kind, r in removed.items()}
        if config.share_plan:
            state.stack_plans[slot.stack] = (tokens, slot.plans)

    return hook


def _block_post_hook(slot: _Block) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        # Drop the plans so their index tensors are not kept alive between calls.
        slot.plans = None
        slot.unmerge = None
        slot.grid = None

    return hook


def _merge_pre_hook(slot: _Block, target: str) -> Callable[..., Any]:
    kind = slot.kinds[target]

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        slot.unmerge = None
        if slot.plans is None:
            return None
        merge, unmerge = slot.plans[kind]
        slot.reached.add(target)
        name = None if args else next((n for n in ("x", "hidden_states") if n in kwargs), None)
        x = args[0] if args else kwargs.get(name) if name else None
        # Another patch (the WebUI's built-in tomesd, say) may already have changed the token count.
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != slot.tokens or merge is unmerge:
            return None
        slot.unmerge = unmerge
        slot.applied.add(target)
        merged = merge(x)
        # Forge passes self-attention's keys/values explicitly once any attn1 patch exists: the same tensor as
        # the queries, which must merge with them. Other keys/values (a reference image's, say) stay whole.
        extra = {kw: merged for kw in _KV_KEYWORDS if kwargs.get(kw) is x}
        if args:
            return (merged, *args[1:]), {**kwargs, **extra}
        return args, {**kwargs, name: merged, **extra}

    return hook


def _unmerge_post_hook(slot: _Block) -> Callable[..., Any]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        unmerge, slot.unmerge = slot.unmerge, None
        if unmerge is None or not isinstance(output, torch.Tensor):
            return None
        return unmerge(output)

    return hook


def _kv_pre_hook(state: _State, slot: _Block) -> Callable[..., Any]:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if slot.grid is None:
            return None
        slot.reached.add("attn1")
        x = _first_arg(args, kwargs, "x", "hidden_states")
        # Self-attention's keys/values are absent (None) or, in Forge once any attn1 patch exists, the queries
        # themselves; anything else (another extension's keys/values) is left alone.
        targets = [slot.kv_kw, *(["value"] if "value" in kwargs else [])]
        if any(kwargs.get(kw) is not None and kwargs.get(kw) is not x for kw in targets):
            return None
        h, w = slot.grid
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != h * w:
            return None  # tokens already merged by another patch: no grid to pool over
        pooled = kv_downsample(x, w, h, state.config.sx, state.config.sy)
        slot.applied.add("attn1")
        return args, {**kwargs, **dict.fromkeys(targets, pooled)}

    return hook
