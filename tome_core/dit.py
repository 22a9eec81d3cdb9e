"""Token reduction for diffusion transformers (Flux, Wan, Qwen-Image, SD3.5, ...): keys and values subsampled.

In a DiT every block attends over a joint sequence of text, generated and reference tokens, rotary position
embeddings applied inside attention. The patch keeps every query and lets each attend to the keys/values of all
text and reference tokens and of one generated token per st x sy x sx cell (ToDo, arXiv 2402.13573; on video DiTs
reducing keys/values is far safer than reducing queries, AsymRnR arXiv 2412.11706). The kept keys are taken after
the model applied its rotary embedding, so each carries its own position, the centre of the cell it stands for.

Where a model's `Layout` (`tome_core.families`) says the joint attention runs, its module gets a hook that marks the
block as running; the keys and values are subsampled where the attention kernel is called:

* by default, scaled_dot_product_attention called inside that module (a `TorchFunctionMode` scoped to the module's
  forward: diffusers, Forge Neo). A host whose attention runs another kernel (flash-attn, SageAttention) is not
  reached: `stats` then counts the block reached and not applied, and the hosts say so;
* or by the host itself (`set_attention_interceptor(model, "host")`): ComfyUI's adapter calls `reduce` from its
  attention override, whatever kernel runs after it.

The model's own forward hooks (eager, also around a compiled model) read where the generated tokens sit from its
arguments (`Layout.tokens`), count calls and apply the step window, as for UNets (`tome_core.patch`). Every number
a compiled graph reads comes through the model (an `nn.Module`), so it stays a constant of that graph.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from tome_core.compat import additive, attention_dtype, eager, is_compiling, static_sizes
from tome_core.config import TomeConfig, field_spec
from tome_core.families import BlockIO, Layout, Tokens
from tome_core.hooks import Hook, timestep_arg, uninstall, unmark
from tome_core.kernels import HostBackend, LseKernel, diffusers_backend, pytorch
from tome_core.merge import BandMerge, Partition, band_match, band_merge, grid_layout, kv_table, partition
from tome_core.plan import BlockPlan, BlockTable, plan_dit

#: Interceptors: scaled_dot_product_attention inside the hooked module, or the host's attention override.
INTERCEPTORS = ("sdpa", "host")
#: The TomeConfig fields a DiT runs with; the others must keep their defaults (a DiT has no UNet levels). "merge"
#: mode also reads the ratio (every generated token merges: 1 - 1/(sx*sy)) and pool_kv (keys/values subsampled in
#: the blocks outside the window).
DIT_FIELDS = frozenset(
    {"mode", "sx", "sy", "st", "step_start", "step_end", "block_start", "block_end", "merge_attn", "seed", "use_rand"}
)
MERGE_FIELDS = DIT_FIELDS | {"ratio", "pool_kv"}
PYTORCH = pytorch()  # the kernel a reduced block runs unless the host hands over another (a frozen value)


@dataclass
class DitState:
    """A patch on a diffusion transformer, by lifetime: installed once, counted per sampling, per call."""

    config: TomeConfig
    table: BlockTable
    layout: Layout
    interceptor: str = "sdpa"
    #: Each query's own key joins the kept ones in the blocks that subsample keys/values (`AttentionHook.attend`);
    #: off only for the lab's naive port, run as published.
    own_key: bool = True
    handles: list[RemovableHandle] = field(default_factory=list)
    hooks: list[AttentionHook | MergeHook] = field(default_factory=list)
    pipeline: Callable[[], Any] | None = None
    step: tuple[int, int] | None = None
    unet_calls: int = 0  # model calls, as `TomeStats` names them for every model
    active_calls: int = 0
    window_runs: int = 0  # ... of which the blocks ran in (`TomeStats.window_runs`)
    # Per call, for `window_runs`: set by the eager pre-hook, and by any hooked block that runs (a store, never read
    # in a compiled graph; its post-hook reads it eagerly).
    active: bool = False
    blocks_ran: bool = False
    # Per call: where the generated tokens sit (None outside a call and outside the step window), and what reads
    # them back from position ids, once per ids tensor.
    tokens: Tokens | None = None
    draw: torch.Tensor | None = None  # which token of each cell keys/values keep this call (`draw_slot`)
    memo: dict[int, Any] = field(default_factory=dict)
    indices: dict[tuple[Any, ...], torch.Tensor] = field(default_factory=dict)  # eager calls' kept-token tables
    rows: dict[tuple[Any, ...], torch.Tensor] = field(default_factory=dict)  # this call's rows of them
    partitions: dict[tuple[Any, ...], tuple[Partition, torch.Tensor]] = field(default_factory=dict)  # merged blocks
    unmark: Callable[[], None] | None = None
    running: AttentionHook | None = None  # the block whose attention runs now (the host interceptor reads it)
    carry: Carry | None = None  # the merged window of this call, from its first block to its last


def check_config(config: TomeConfig, name: str, layout: Layout, model: nn.Module) -> None:
    """ValueError naming the first field the diffusion transformer `model` (class `name`) cannot run as set."""
    if config.mode == "merge" and not layout.io:
        raise ValueError(
            f"TomeConfig.mode='merge' does not run on {name} ({layout.host}'s {layout.family}): its blocks cannot run on"
            " merged tokens here; use mode 'kv' (keys/values subsampled, every query kept)"
        )
    allowed = MERGE_FIELDS if config.mode == "merge" else DIT_FIELDS
    default = TomeConfig()
    for spec_name in sorted(set(config.to_dict()) - allowed):
        if getattr(config, spec_name) != getattr(default, spec_name):
            spec = field_spec(spec_name)
            raise ValueError(
                f"TomeConfig.{spec_name}={getattr(config, spec_name)!r} does not apply to {name}, a diffusion"
                f" transformer (it has no UNet levels): leave {spec.label!r} at {spec.default!r}"
            )
    if config.mode != "merge":
        return
    if abs(config.ratio - config.max_ratio) > 1e-9:
        raise ValueError(
            f"TomeConfig.ratio={config.ratio} on {name}: a diffusion transformer's merged blocks merge every generated"
            f" token into one per sx x sy cell, ratio 1 - 1/(sx*sy) = {config.max_ratio:.4g} with sx={config.sx},"
            f" sy={config.sy}; set ratio to it (or use mode 'kv')"
        )
    if config.st != 1:
        raise ValueError(f"TomeConfig.st={config.st} on {name}: merged blocks merge within frames; leave st at 1")
    table = plan_dit(config, len(layout.blocks(model)))
    blocks = [plan.index for plan in table.blocks if plan.kind == "whole"]
    if blocks and any(layout.io_of(index, model) is None for index in blocks):
        raise ValueError(f"TomeConfig.block_start/block_end: {name}'s blocks {blocks[0]}-{blocks[-1]} cannot all merge")


def apply(model: nn.Module, layout: Layout, config: TomeConfig, pipeline: Callable[[], Any] | None, attr: str) -> None:
    """Hook `model` (a diffusion transformer described by `layout`) as `config` plans; the state goes to `attr`."""
    blocks = layout.blocks(model)
    if not blocks:
        raise TypeError(f"{type(model).__name__} has no transformer blocks where {layout.host}'s layout expects them")
    table = plan_dit(config, len(blocks))
    state = DitState(config=config, table=table, layout=layout, pipeline=pipeline)
    state.handles.append(model.register_forward_pre_hook(eager(_pre_hook(state)), with_kwargs=True))
    state.handles.append(model.register_forward_hook(eager(_post_hook(state))))
    window = [plan.index for plan in table.blocks if plan.kind == "whole"]
    for block, plan in zip(blocks, table.blocks):
        if plan.kind == "kv":
            state.hooks.append(AttentionHook(model, layout.attention_of(block), plan, attr))
        elif plan.kind == "whole":
            io = layout.io_of(plan.index, model)
            assert io is not None  # check_config refused a window of blocks without one
            edges = (plan.index == window[0], plan.index == window[-1])
            state.hooks.append(MergeHook(model, block, plan, attr, io, edges))
    for hook in state.hooks:
        hook.install()
    setattr(model, attr, state)


def remove(state: DitState) -> None:
    state.tokens = None
    state.draw = None
    state.rows.clear()
    state.carry = None
    state.running = None
    uninstall(state)


def _pre_hook(state: DitState) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        state.tokens = None
        state.carry = None
        state.unet_calls += 1
        x = args[0] if args else next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
        unmark(state)
        if isinstance(x, torch.Tensor):
            state.unmark = static_sizes(x)
        state.blocks_ran = False
        state.active = _active(state, args, kwargs)
        if not state.active:
            return
        state.active_calls += 1
        state.tokens = state.layout.tokens(module, args, kwargs, state.memo)
        state.draw = draw_slot(timestep_arg(args, kwargs))
        state.rows.clear()

    return hook


def _post_hook(state: DitState) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        # A step cache (EasyCache, LazyCache) calls the model's forward and skips its blocks in the steps it reuses.
        if state.active and state.blocks_ran:
            state.window_runs += 1
        state.active = False
        state.tokens = None
        state.draw = None
        state.rows.clear()
        state.carry = None
        unmark(state)

    return hook


def draw_slot(timestep: Any) -> torch.Tensor | None:
    """[] int64 on the timestep's device, the same for every call of one step (cond and uncond) and another at the
    next step: which token of each cell keys/values keep (`kv_table`'s slot, modulo the cells). Subsampling the same
    token every step repeats the same error at every step and a generation adds them up; another token each step
    averages them out (on the first stand-ins of Qwen-Image, SD3.5 and Flux.2 Balanced's whole generation changed
    0.66-0.70x as much, docs/dit.md). A hash of the timestep made on its device: no read back, the same in a compiled graph.

    `timestep`: [B], or one per frame [B, F] (ComfyUI's Wan 2.2) or per token [B, L] (diffusers' Wan pipelines with
    `expand_timesteps`). Its largest value is the step's: Wan 2.2 TI2V 5B's image-to-video keeps the reference image's
    frame at timestep 0 at every step, which the first element would hash all generation."""
    if not isinstance(timestep, torch.Tensor) or not timestep.numel():
        return None
    x = torch.round(timestep.amax().float() * 4096).long() & 0xFFFFFFFF  # [] distinct per step
    for _ in range(2):  # a 32-bit integer hash: every input bit moves the low ones, which pick the slot
        x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    return (x >> 16) ^ x


def _active(state: DitState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether this call lies in the step window: from `set_step` or a pipeline's scheduler (host values), else
    from the timestep the model got (a bare model with a step window: one read back per call)."""
    config = state.config
    if config.step_start <= 0 and config.step_end >= 1:
        return True
    if state.step is not None:
        return config.active_at(state.step[0] / state.step[1])
    scheduler = getattr(state.pipeline(), "scheduler", None) if state.pipeline is not None else None
    timesteps = getattr(scheduler, "timesteps", None)
    if timesteps is not None and len(timesteps) > 0:
        return config.active_at((getattr(scheduler, "step_index", None) or 0) / len(timesteps))
    timestep = timestep_arg(args, kwargs)
    if not isinstance(timestep, torch.Tensor) or not timestep.numel():
        return True
    # The noisiest token's timestep is the step's: a kept frame (Wan 2.2's reference image) is at 0 at every step.
    noisiest = timestep.amin() if state.layout.rising else timestep.amax()
    value = float(noisiest) / state.layout.timestep_max  # a bare model's documented read-back
    return config.active_at(min(max(value if state.layout.rising else 1.0 - value, 0.0), 1.0))


class AttentionHook(Hook):
    """The module that runs one block's joint self-attention: marks the block as running and, unless the host
    intercepts attention itself, subsamples the keys/values of the scaled_dot_product_attention called inside it.

    Its flags, as `TomeStats` counts them: `called` (the module ran), `planned` (in a call inside the step window
    whose tokens the layout read), `reached` (the attention kernel was intercepted), `applied` (keys/values were
    subsampled), `grid_miss` (an intercepted sequence did not hold the layout's tokens), `own_key` (each query's own key
    joined them: `attend`)."""

    def __init__(self, model: nn.Module, module: nn.Module, plan: BlockPlan, attr: str) -> None:
        super().__init__(module)
        self.model = model  # the patch's numbers are read through it: constants of a compiled graph
        self.plan = plan
        self.attr = attr
        # diffusers' attention dispatch, where the module's processor may call another kernel than
        # scaled_dot_product_attention (`host`); looked up once here, the processor's backend at every call.
        self.dispatch = sys.modules.get("diffusers.models.attention_dispatch") if hasattr(module, "processor") else None
        self.reset()

    def reset(self) -> None:
        # Flags the hook sets and never reads (a compiled graph replays each store after its run).
        self.called = self.planned = self.reached = self.applied = self.grid_miss = self.own_key = False
        self.kernel = ""  # what ran the reduced attention (`LseKernel.name`, or the host's function)
        self.own_off = ""  # why its queries did not keep their own key, where they did not
        self.unreached = ""  # why its attention was not reached, where the core knows (`host`)

    def state(self) -> DitState | None:
        state = getattr(self.model, self.attr, None)
        return state if isinstance(state, DitState) else None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        state = None if self.passthrough else self.state()
        if state is None:
            return self.call(*args, **kwargs)
        self.called = state.blocks_ran = True
        if state.tokens is None:
            return self.call(*args, **kwargs)
        self.planned = True
        state.running = self
        restore = None
        try:
            if state.interceptor == "host":
                return self.call(*args, **kwargs)
            host = self.host()
            if host is not None:
                restore = host.route()  # this forward only: the processor's backend is the user's outside it
            with _SdpaKeys(self, state, host):
                return self.call(*args, **kwargs)
        finally:
            state.running = None
            if restore is not None:
                restore()

    def host(self) -> HostBackend | None:
        """The backend the module's diffusers processor calls now where that is not scaled_dot_product_attention and
        the core can run its kernel (`tome_core.kernels.diffusers_backend`); else None, the reason recorded where
        the core cannot (the block then runs as without ToMe: planned, not reached)."""
        if self.dispatch is None:
            return None
        host = diffusers_backend(getattr(self.module, "processor", None), self.dispatch)
        if host is None or host.kernel is None:
            self.unreached = "" if host is None else host.why
            return None
        return host

    def reduce(
        self,
        state: DitState,
        key: torch.Tensor,
        value: torch.Tensor,
        dim: int,
        mask: Any = None,
        kernel: str = "",
        own_off: str = "",
    ) -> Any:
        """(key, value, mask) with the keys/values of generated tokens subsampled along `dim` (the sequence), or
        None when this attention's sequence is not the joint one the layout describes (a cross-attention).
        `kernel` names what will run the attention on them and `own_off` why without each query's own key (for
        `TomeStats`; `attend` sets its own)."""
        tokens = state.tokens
        if tokens is None:
            return None
        self.reached = True
        length = int(key.shape[dim])
        after = tokens.after_in(length)
        if after is None or int(value.shape[dim]) != length:
            # An attention over the generated tokens alone beside the joint one (SD3.5 Medium's second attention,
            # in a block whose whole forward a host intercepts) is not the layout's sequence, and not a miss.
            if length != tokens.generated:
                self.grid_miss = True
            return None
        index = _index(state, tokens, after, self.plan, key.device)
        if index.dim() == 2:  # per-sample captions: the batch must be the one the layout read, and so the mask's
            other_batch = int(key.shape[0]) != int(index.shape[0])
            if other_batch or (isinstance(mask, torch.Tensor) and mask.dim() < 2):
                self.grid_miss = True
                return None
        if isinstance(mask, torch.Tensor) and mask.dim() > 0 and int(mask.shape[-1]) == int(key.shape[dim]):
            mask = _take(mask, index, -1)
        self.applied = True
        if kernel:
            self.kernel = kernel
        if own_off and state.own_key:
            self.own_off = own_off
        return _take(key, index, dim), _take(value, index, dim), mask

    def attend(
        self,
        state: DitState,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: Any,
        scale: float | None,
        kernel: LseKernel | None = None,
    ) -> torch.Tensor | None:
        """Self-attention [B, H, L, D] of `query` over the kept keys/values (`reduce`), each standing for its cell,
        and each query's own key and value, from [B, H, L, D] tensors (cast to one dtype as autocast casts
        scaled_dot_product_attention's: `attention_dtype`); None where this is not the layout's joint sequence, or
        where the dtypes differ outside autocast.

        Kept keys stand for a cell with one of its tokens, the same for every query, so without this three queries
        in four of a 2x2 cell lose their own token, the largest share of their attention on these models
        (docs/dit.md). The kept keys' attention returns its log-sum-exp, and the own key joins it:
        out = lerp(v_own, out_kept, sigmoid(lse_kept + log(cell) - s_own)). The kept keys weigh as the cells they
        stand for (ToMe's proportional attention): counted once, they would leave a query's own key outweighing
        the rest (0.79 for a 0.48 share at 2x2). A query whose own token is kept gets the kept keys' output as it
        is. Five elementwise kernels beside the attention (six with a mask), no gather.

        `kernel` runs the kept keys' attention (`tome_core.kernels`: the one the host would have called, SageAttention,
        flash-attn, xformers; PyTorch's by default); where it returns no log-sum-exp its output stands, without the
        own key, and the hook records why."""
        tokens = state.tokens
        same = attention_dtype(query, key, value)
        if same is None or tokens is None:
            return None
        query, key, value = same
        kernel = kernel or PYTORCH
        reduced = self.reduce(state, key, value, -2, mask, kernel.name)
        if reduced is None:
            return None
        after = tokens.after_in(int(key.shape[-2]))
        assert after is not None  # reduce checked it
        scale = scale if scale is not None else 1.0 / float(query.shape[-1]) ** 0.5
        out, lse = kernel.run(query, reduced[0], reduced[1], reduced[2], scale)  # [B, H, L, D], [B, H, L]
        if lse is None:
            self.own_off = f"{kernel.name} returned no log-sum-exp"
            return out
        bias = _own_bias(state, tokens, after, self.plan, query)  # [L, 1] or [B, 1, L, 1]: per channel
        self.own_key = True
        # [B, H, L] float32: the kept keys' logit over the own key's, the bias summed in with the product's channels
        share = torch.addcmul(bias, query, key, value=-scale).sum(-1, dtype=torch.float32).add_(lse)
        own_mask = _diagonal(mask, int(key.shape[-2]))  # a query whose own key the host masks gets none of it
        if own_mask is not None:
            share = share.sub_(own_mask)
        weight = torch.sigmoid(share, out=torch.empty(share.shape, dtype=value.dtype, device=share.device))
        return torch.lerp(value, out, weight.unsqueeze(-1))


def _diagonal(mask: Any, length: int) -> torch.Tensor | None:
    """What an attention mask adds to each query's score of its own key, [B, H or 1, L] (0 or minus a large number;
    from a boolean mask, True: attends), or None without a mask over these `length` keys."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or int(mask.shape[-1]) != length:
        return None
    own = mask[..., 0, :] if int(mask.shape[-2]) == 1 else torch.diagonal(mask, dim1=-2, dim2=-1)  # [..., L]
    return additive(own, torch.float32) if own.dtype == torch.bool else own  # a float mask subtracts as it is


def _take(x: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """`x` at `index` along `dim`: index [K] for every sample, or [B, K] per sample (x's batch first; a mask of
    batch 1 is broadcast)."""
    if index.dim() == 1:
        return x.index_select(dim, index)
    dim %= x.dim()
    shape = [1] * x.dim()
    shape[0], shape[dim] = int(index.shape[0]), int(index.shape[1])
    sizes = list(x.shape)
    sizes[0], sizes[dim] = shape[0], shape[dim]
    return torch.gather(x.expand(shape[0], *x.shape[1:]), dim, index.view(shape).expand(sizes))


def _index(state: DitState, tokens: Tokens, after: int, plan: BlockPlan, device: torch.device) -> torch.Tensor:
    """The kept tokens' indices this call, [K], or [B, K] when the samples' grids start at different places
    (`Tokens.shift`): the call's slot (`draw_slot`) of the table of every slot (`kv_table`), which is built once per
    layout and device eagerly, its row once per call; a compiled graph builds its own table (a constant to the
    compiler: a tensor read from the patch's state would be a graph input)."""
    key = (tokens.before, tokens.grid, after, tokens.shift, plan.st, plan.sy, plan.sx, str(device))
    return _call_row(state, key, lambda: _kept(tokens, after, plan, device))


def _call_row(state: DitState, key: tuple[Any, ...], build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """This call's row (`_row`) of the table `build` makes: eagerly the table once per `key` and the row once per
    call; a compiled graph builds both itself."""
    if is_compiling():
        return _row(build(), state.draw)
    row = state.rows.get(key)
    if row is None:
        table = state.indices.get(key)
        if table is None:
            table = state.indices[key] = build()
        row = state.rows[key] = _row(table, state.draw)
    return row


def _row(table: torch.Tensor, draw: torch.Tensor | None) -> torch.Tensor:
    """table [S, K] or [S, B, K] -> the row of the slot `draw` picks (modulo S), slot 0 without a timestep."""
    if draw is None:
        return table[0]
    slot = torch.remainder(draw.to(table.device), int(table.shape[0]))  # []
    return table.index_select(0, slot.view(1)).squeeze(0)


def _own_bias(state: DitState, tokens: Tokens, after: int, plan: BlockPlan, like: torch.Tensor) -> torch.Tensor:
    """[L, 1], or [B, 1, L, 1] per sample, in `like`'s dtype, over its D channels: +inf where a query's own token is
    among this call's kept keys (its kept keys' output stands), log(cell) where its own key joins them (the kept
    keys weigh as their cells); built as `_index`'s table is."""
    cells = (tokens.before, tokens.grid, after, tokens.shift, plan.st, plan.sy, plan.sx)
    key = ("own", *cells, str(like.device), like.dtype, int(like.shape[-1]))
    return _call_row(state, key, lambda: _bias_table(tokens, after, plan, like))


def _bias_table(tokens: Tokens, after: int, plan: BlockPlan, like: torch.Tensor) -> torch.Tensor:
    kept = _kept(tokens, after, plan, like.device)  # [S, K] or [S, B, K]
    length = tokens.before + tokens.generated + after
    per_channel = math.log(plan.st * plan.sy * plan.sx) / int(like.shape[-1])
    table = torch.full((*kept.shape[:-1], length), per_channel, dtype=like.dtype, device=like.device)
    table = table.scatter(-1, kept, float("inf")).unsqueeze(-1)  # [S, L, 1] or [S, B, L, 1]
    return table.unsqueeze(-3) if table.dim() == 4 else table


def _kept(tokens: Tokens, after: int, plan: BlockPlan, device: torch.device) -> torch.Tensor:
    cells = (plan.st, plan.sy, plan.sx)
    if not tokens.shift:
        return kv_table(tokens.before, tokens.grid, after, *cells, device)
    tables = [kv_table(tokens.before + s, tokens.grid, after - s, *cells, device) for s in tokens.shift]
    return torch.stack(tables, dim=1)


_SDPA_NAMES = ("query", "key", "value", "attn_mask")
#: Why a scaled_dot_product_attention call ran the kept keys alone (`_own_key_fits` refused it).
NOT_PLAIN = "its attention call was not a plain self-attention ToMe could run itself"


class _SdpaKeys(TorchFunctionMode):
    """Inside one attention module's forward: scaled_dot_product_attention gets the subsampled keys/values.
    Tensors are [B, H, L, D] (or [B, L, D]): the sequence is dimension -2.

    With `host` (a diffusers backend routed to the native one for this forward), the calls are the user's backend's:
    its kernel runs the kept keys' attention, and every call it cannot take runs that backend, never PyTorch's."""

    def __init__(self, hook: AttentionHook, state: DitState, host: HostBackend | None = None) -> None:
        super().__init__()
        self.hook = hook
        self.state = state
        self.host = host

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.unflatten:
            # Tensor.unflatten calls super(), which torch.compile cannot trace inside a mode (torch 2.13).
            return torch.unflatten(*args, **kwargs)
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        given = dict(zip(_SDPA_NAMES, args))
        given.update({name: kwargs.pop(name) for name in _SDPA_NAMES if name in kwargs})
        host = self.host
        kernel = PYTORCH if host is None or host.kernel is None else host.kernel
        refused = None
        if host is not None and isinstance(given.get("query"), torch.Tensor):
            refused = kernel.fits(given["query"], given.get("attn_mask"))
        if self.state.own_key and refused is None and len(args) <= len(_SDPA_NAMES) and _own_key_fits(given, kwargs):
            out = self.hook.attend(
                self.state,
                given["query"],
                given["key"],
                given["value"],
                given.get("attn_mask"),
                kwargs.get("scale"),
                kernel,
            )
            if out is not None:
                return out
        if isinstance(given.get("key"), torch.Tensor) and isinstance(given.get("value"), torch.Tensor):
            reduced = self.hook.reduce(
                self.state, given["key"], given["value"], -2, given.get("attn_mask"), kernel.name, refused or NOT_PLAIN
            )
            if reduced is not None:
                given["key"], given["value"], given["attn_mask"] = reduced
        rest = args[len(_SDPA_NAMES) :]  # dropout_p, is_causal, ... where a caller passed them in place
        if host is not None:
            q, k, v = given.pop("query"), given.pop("key"), given.pop("value")
            return host.run(q, k, v, given.pop("attn_mask", None), *rest, **kwargs)
        positional = [given.pop(name) for name in _SDPA_NAMES[: len(args)] if name in given]
        return func(*positional, *rest, **given, **kwargs)


def _own_key_fits(given: dict[str, Any], kwargs: dict[str, Any]) -> bool:
    """Whether a scaled_dot_product_attention call is a plain self-attention of [B, H, L, D] tensors (each query has
    its own key): no dropout, no causal mask, as many key heads as query heads."""
    q, k, v = given.get("query"), given.get("key"), given.get("value")
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return False
    if kwargs.get("dropout_p") or kwargs.get("is_causal") or kwargs.get("enable_gqa"):
        return False
    return q.shape == k.shape and k.shape[:-1] == v.shape[:-1]


def attend(
    model: nn.Module,
    attr: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Any = None,
    scale: float | None = None,
    kernel: LseKernel | None = None,
) -> torch.Tensor | None:
    """For a host's own attention interceptor: the attention output [B, H, L, D] from [B, H, L, D] tensors while a
    block ToMe reduces runs (each query keeps its own key: `AttentionHook.attend`, the kept keys' attention run by
    `kernel`, PyTorch's by default), else None (reduce the keys/values with `reduce` and run the host's attention)."""
    state = getattr(model, attr, None)
    if not isinstance(state, DitState) or state.running is None or not state.own_key:
        return None
    if not _own_key_fits({"query": query, "key": key, "value": value}, {}):
        return None
    return state.running.attend(state, query, key, value, mask, scale, kernel)


def reduce(
    model: nn.Module,
    attr: str,
    key: torch.Tensor,
    value: torch.Tensor,
    dim: int,
    mask: Any = None,
    kernel: str = "",
    own_off: str = "",
) -> Any:
    """For a host's own attention interceptor (ComfyUI's attention override): (key, value, mask) subsampled along
    `dim` when a block ToMe reduces is running, else None (pass them on unchanged). `kernel` names what runs the
    attention then, `own_off` why its queries do not keep their own key (`TomeStats.kernels`, `.own_key_off`)."""
    state = getattr(model, attr, None)
    if not isinstance(state, DitState) or state.running is None:
        return None
    return state.running.reduce(state, key, value, dim, mask, kernel, own_off)


# ---------------------------------------------------------------------------------------------- merged blocks


@dataclass
class Carry:
    """One call's merged window: the merge (every generated token into the most similar destination of its band,
    one destination per cell, at the cell's centre), what merging took from each token (added back at the end), and
    the rotary embedding of the merged sequence, made once per call from the model's."""

    merge: BandMerge
    residual: torch.Tensor  # [B, n, C]
    positions: torch.Tensor  # [M] the grid position each merged token stands for: its destination (or tail) token
    ropes: dict[int, Any] = field(default_factory=dict)  # id of the model's rotary embedding -> the merged one's


def _positions(h: int, w: int, sx: int, sy: int, device: torch.device) -> tuple[Partition, torch.Tensor]:
    """(the partition with each cell's destination at its centre, [M] the grid positions of the merged tokens:
    each band's destinations in cell order, then the rows below the last whole band, kept as they are)."""
    layout = grid_layout(h, w, sx, sy, device)
    slots = torch.full((layout.num_dst,), (sy // 2) * sx + sx // 2, dtype=torch.int64, device=device)
    part = partition(layout, slots, numbers=False)
    tail = torch.arange(layout.hs * sy * w, h * w, device=device)
    return part, torch.cat([part.dst_tok, tail])


def _rope_index(positions: torch.Tensor, before: int, n: int, length: int) -> torch.Tensor:
    """[L'] indices into a rotary embedding of `length` positions ([before, grid of n, after]) for the merged
    sequence: the `before` tokens, the merged tokens' grid positions, the tokens after the grid."""
    device = positions.device
    return torch.cat(
        [torch.arange(before, device=device), positions + before, torch.arange(before + n, length, device=device)]
    )


def _gather_rope(rope: Any, index: torch.Tensor, dim: int) -> Any:
    if isinstance(rope, torch.Tensor):
        return rope.index_select(dim, index)
    if isinstance(rope, (tuple, list)):
        return type(rope)(_gather_rope(part, index, dim) for part in rope)
    return rope


def _get(args: tuple[Any, ...], kwargs: dict[str, Any], key: str | int) -> Any:
    if isinstance(key, int):
        return args[key] if len(args) > key else None
    return kwargs.get(key)


def _put(args: tuple[Any, ...], kwargs: dict[str, Any], key: str | int, value: Any) -> tuple[tuple[Any, ...], dict]:
    if isinstance(key, int):
        return (*args[:key], value, *args[key + 1 :]), kwargs
    return args, {**kwargs, key: value}


class MergeHook(Hook):
    """A block of the merged window (`BlockPlan.kind` "whole" on a DiT): runs on the merged generated tokens, with
    the rotary embedding of the positions they stand for. The window's first block merges (`edges[0]`), its last
    unmerges (`edges[1]`); between them the model carries the merged tokens from block to block as they come. Text
    and reference tokens pass whole."""

    def __init__(
        self, model: nn.Module, module: nn.Module, plan: BlockPlan, attr: str, io: BlockIO, edges: tuple[bool, bool]
    ) -> None:
        super().__init__(module)
        self.model = model
        self.plan = plan
        self.attr = attr
        self.io = io
        self.first, self.last = edges
        self.reset()

    def reset(self) -> None:
        self.called = self.planned = self.reached = self.applied = self.grid_miss = self.own_key = False
        # As AttentionHook's: a merged block runs the model's own attention.
        self.kernel = self.own_off = self.unreached = ""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        state = None if self.passthrough else getattr(self.model, self.attr, None)
        if not isinstance(state, DitState):
            return self.call(*args, **kwargs)
        self.called = state.blocks_ran = True
        tokens = state.tokens
        if tokens is None or not tokens.mergeable or tokens.grid[0] != 1:
            return self.call(*args, **kwargs)
        io = self.io
        start = tokens.before if io.joint else tokens.before - tokens.text
        x = _get(args, kwargs, io.tokens)
        n = tokens.generated
        if self.first:
            self.planned = True
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] < start + n:
                self.grid_miss = True
                return self.call(*args, **kwargs)
            found = self._merge(state, tokens, x[:, start : start + n])
            if found is None:
                return self.call(*args, **kwargs)
            state.carry, merged = found
            x = torch.cat([x[:, :start], merged, x[:, start + n :]], dim=1)
            args, kwargs = _put(args, kwargs, io.tokens, x)
        carry = state.carry
        if carry is None:
            return self.call(*args, **kwargs)  # the window's first block did not merge in this call
        self.planned = self.reached = self.applied = True
        rope = kwargs.get(io.rope)
        if rope is not None:
            merged_rope = carry.ropes.get(id(rope))
            if merged_rope is None:
                length = (rope[0] if isinstance(rope, (tuple, list)) else rope).shape[io.rope_dim]
                index = _rope_index(carry.positions, tokens.before, n, int(length))
                merged_rope = carry.ropes[id(rope)] = _gather_rope(rope, index, io.rope_dim)
            kwargs = {**kwargs, io.rope: merged_rope}
        out = self.call(*args, **kwargs)
        if not self.last:
            return out
        state.carry = None
        y = out if io.output is None else out[io.output]
        m = carry.merge.merged_tokens
        full = carry.merge.unmerge_add(carry.residual, y[:, start : start + m])
        y = torch.cat([y[:, :start], full, y[:, start + m :]], dim=1)
        if io.output is None:
            return y
        return (*out[: io.output], y, *out[io.output + 1 :])

    def _merge(self, state: DitState, tokens: Tokens, image: torch.Tensor) -> tuple[Carry, torch.Tensor] | None:
        """(the call's carry, the merged generated tokens), matched on the window's first block's input."""
        _t, h, w = tokens.grid
        plan = self.plan
        if is_compiling():
            part, positions = _positions(h, w, plan.sx, plan.sy, image.device)
        else:
            key = (h, w, plan.sx, plan.sy, str(image.device))
            found = state.partitions.get(key)
            if found is None:
                found = state.partitions[key] = _positions(h, w, plan.sx, plan.sy, image.device)
            part, positions = found
        with torch.no_grad():
            matched = band_match(image, part)
            merge = None if matched is None else band_merge(matched, 1.0)  # every source into a destination
        if merge is None:
            return None
        merged, residual = merge.merge_with_residual(image)
        return Carry(merge, residual, positions), merged
