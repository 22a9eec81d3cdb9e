"""Re-fitted stand-ins (issue 57 part 3): weight surgery that makes a reduced DiT attend as the trained Flux.1-class
model does (tome_bench.trained_dit, measured by tome_bench.attention_profile), not as the tied stand-ins do.

The tied stand-ins (`dit_standin.surgery`: the key projection is the query projection) put 0.19-0.48 of each image
query's attention on its own token and 0.01-0.04 on its 8 neighbours; the trained model puts 0.046 on its own token,
0.195 on the 8 neighbours, 0.53 within distance 4, and the rest spread with a floor; some heads are local, some
global; text tokens draw more than their number. Papers on trained DiTs report the same shape: a local kernel that
decays with distance over a uniform floor (Radial Attention, arXiv 2506.19852; ΔConvFusion, 2504.21292), heads from
nearly global to highly local (DiTFastAttnV2, 2503.22796), sinks in deep blocks (text tokens in Flux.1).

The re-fitted construction, in every self-attention of a family with a rotary embedding:

- a positional part: a constant vector in both the query and the key of each head (the projection's bias, added
  where the architecture has none), on the rotary channel pairs of the image grid's axes. The rotary embedding turns
  its dot product into sum_k w_k cos(omega_k * delta) per axis: a kernel of the relative position. The weights w_k
  (non-negative: a constant in both q and k gives w_k = amplitude^2) are fitted, once per family and axis, to
  -depth * (1 - exp(-|delta| / LENGTH)); each head's depth is spread between `Refit.depth` (its heads from global to
  local), the heads shuffled over the blocks by the seed;
- a content part: the tied projection of the old stand-in, on the other channel pairs, scaled so that it adds
  `Refit.content` logits per unit cosine (an own-token and similar-token bonus, and a query-dependent spread);
- a constant on a sink pair (the lowest frequency of the first rotary axis, on which image and text tokens share a
  position or nearly): image keys get it as padding (a logit every image key shares), text keys from their own
  projection (double-stream blocks) get a value set so that a text key draws `Refit.text` logits more than an
  image key 8 rows and columns away: the text tokens become the sinks they are in Flux.1.

The per-head RMS norms after q and k (norm_q, norm_k, and the text stream's) are set to the gain at which the logits
come out in the units above. Single-stream blocks project text and image tokens with one projection, so their text
tokens sit where the rotary embedding puts them (Flux.1: position (0, 0), a corner of the grid; HunyuanVideo's text,
after the video, is not rotated: the same) with no sink; Wan's, LTX-Video's and LTX-2's cross-attention,
HunyuanVideo's token refiner and LTX-2's audio attentions stay tied (`_positional`); LTX-Video and LTX-2 rotate one
embedding across their heads, each head a band of its frequencies (`ltx_bands`): each head's kernel is fitted on its
own band, its sink pair the one that turns least from one token to the next. SD3.5 has no rotary embedding: its
re-fitted stand-in reads its absolute sine-cosine position table through the query and key projections instead
(`_sd3`), which gives the same cos(omega * delta) kernel as long as the table dominates what the projection reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tome_bench.dit_standin import VARIANTS as STANDIN_VARIANTS

if TYPE_CHECKING:
    from tome_bench.dit_families import Family

#: The decay length of every head's positional kernel, in tokens (per axis): the trained model's mean profile
#: (per key by ring 0.046, 0.026, 0.009, 0.004, 0.003, ...) is a mixture of heads of one such shape and depths.
LENGTH = 3.0
#: The farthest relative position the kernel is fitted at (a 48-token axis; the stand-ins' grids are 24 x 24 and
#: 5 x 12 x 20).
FIT_SPAN = 47
#: The distance (rows and columns) of the image key a text key is compared with for the sink's logit.
SINK_AT = 8


@dataclass(frozen=True)
class Refit:
    """The re-fitted construction's settings (`VARIANTS["refit"]`): each head's positional kernel drops
    by a depth drawn evenly from `depth` (logits, per axis, from the own token to far away; the low end global, the
    high end local); the tied content part adds `content` logits per unit cosine; a text key draws `text` logits
    more than an image key SINK_AT rows and columns away. None: the family's fitted value (FITTED, else DEFAULTS)."""

    depth: tuple[float, float] | None = None
    content: float | None = None
    text: float | None = None
    #: The generation's calibration (`VARIANTS["calibrated"]`, docs/runs/2026-12-06-refit-calibrated), None: as the
    #: tied stand-ins. `update`: the blocks' ||out - in|| / ||in|| at sigma 0.5 (`dit_standin.strengthen`; None:
    #: dit_standin.BLOCK_UPDATE); `time`: the squeeze of the time the model reads (dit_standin.TIME_ATTR: it reads
    #: 0.5 + time * (sigma - 0.5)), so that its velocity moves with the sigma about as the trained DiT's does.
    update: float | None = None
    time: float | None = None
    #: ||velocity|| / ||input|| of one call at sigma 0.5 (`dit_standin.velocity_ratio`; None: as built).
    velocity: float | None = None

    def __call__(self, model: nn.Module, family: Family, seed: int) -> None:
        """The surgery in place of the tie (`dit_standin.build` calls it, then `strengthen`s to `update`)."""
        from tome_bench.dit_standin import TIME_ATTR

        surgery(model, family, self, seed)
        if self.time is not None:
            model.__dict__[TIME_ATTR] = self.time

    def resolved(self, family: str) -> Refit:
        fitted = DEFAULTS | FITTED.get(family, {})
        return Refit(
            **{f: fitted[f] if getattr(self, f) is None else getattr(self, f) for f in DEFAULTS},
            update=self.update,
            time=self.time,
            velocity=self.velocity,
        )


#: The settings every family starts from: fitted on Flux.1's stand-in at sigma 0.5 against the trained model's
#: mean profile (docs/runs/2026-12-06-refit-standins).
DEFAULTS: dict[str, Any] = {"depth": (1.0, 5.0), "content": 0.2, "text": 2.0}
#: Per family, where its profile at sigma 0.5 needed another value: the text sink's strength by how many blocks
#: have one (Qwen-Image: all twelve, Flux.1: four), Wan's and HunyuanVideo's content part (26 neighbours in 3-D
#: spread its own-token share thinner), SD3.5's sink (its table-read kernel leaves image keys' level lower), LTX-2's
#: depths.
FITTED: dict[str, dict[str, Any]] = {
    "flux": {"text": 2.6},
    "chroma": {"text": 2.6},
    "flux2": {"text": 2.8},
    "qwen": {"text": 1.8},
    "sd3": {"text": 3.0},
    "wan": {"content": 1.2},
    # HunyuanVideo: three double-stream blocks of nine draw the text over 1,200 video tokens; LTX-Video: as fitted on
    # Flux.1; LTX-2: its heads of 128 hold twice LTX-Video's band each, its kernels fall further by depth 5 (own token
    # 0.086 where the trained DiT's holds 0.046), so its heads' depths end at 4.2 (docs/runs/2026-12-06-refit-video,
    # fit.log).
    "hunyuanvideo": {"content": 0.7, "text": 4.5},
    "ltx2": {"depth": (1.0, 4.2)},
}


@dataclass(frozen=True)
class Rope:
    """A family's rotary embedding as its attention applies it to each head: consecutive channel pairs (2i, 2i + 1)
    rotate together, `axes` channels per position axis in order, pair k of an axis of D channels at the frequency
    theta^(-2k / D); `grid`: the axes the image's (frames,) rows and columns run along. `bands`: where the rotation
    runs across the heads (LTX-Video: one rotation over the whole inner dimension, each head a band of its
    frequencies), each head's pairs as (axis, angular frequency per token; axis -1: a pair that does not turn)."""

    axes: tuple[int, ...]
    theta: float
    grid: tuple[int, ...]
    bands: tuple[tuple[tuple[int, float], ...], ...] | None = None

    def pairs(self, head: int = 0) -> list[tuple[int, float]]:
        """(axis, angular frequency) of each channel pair of a head."""
        if self.bands is not None:
            return list(self.bands[head])
        return [(a, self.theta ** (-2 * k / d)) for a, d in enumerate(self.axes) for k in range(d // 2)]

    def sink_of(self, head: int = 0) -> int:
        """The sink pair of a head: the first axis's lowest frequency (image and text share that axis's position in
        Flux.1, Chroma and Flux.2; elsewhere it turns by < 0.2 rad across the stand-in's positions); in bands, the
        pair that turns least from one token to the next (a frequency near a multiple of 2 pi turns as little)."""
        if self.bands is None:
            return self.axes[0] // 2 - 1
        pairs = self.bands[head]
        turn = [0.0 if a < 0 else abs(math.remainder(w, 2 * math.pi)) for a, w in pairs]
        return min(range(len(pairs)), key=turn.__getitem__)

    @property
    def sink(self) -> int:
        return self.sink_of(0)


def ltx_bands(
    inner: int, head_dim: int, scale: tuple[float, float, float], theta: float = 10000.0
) -> tuple[tuple[tuple[int, float], ...], ...]:
    """LTX-Video's rotation (diffusers' LTXVideoRotaryPosEmbed) per head: inner // 6 frequencies per axis,
    theta^(k / (n - 1)) * pi / 2 applied to 2 * position * scale / base - 1 (base 20 frames, 2048 rows and columns;
    `scale` the pipeline's rope_interpolation_scale), the axes interleaved frequency by frequency, inner % 6
    channels ahead of them unrotated; the pairs cut into heads of head_dim channels."""
    n = inner // 6
    base = (20.0, 2048.0, 2048.0)
    pairs = [(-1, 0.0)] * ((inner % 6) // 2)
    pairs += [(a, math.pi * theta ** (k / (n - 1)) * scale[a] / base[a]) for k in range(n) for a in range(3)]
    half = head_dim // 2
    return tuple(tuple(pairs[h * half : (h + 1) * half]) for h in range(inner // head_dim))


#: Per family with a rotary embedding (diffusers 0.42: every family's attention rotates interleaved pairs with the
#: standard frequencies; Flux.2's theta is 2000, Z-Image's and HunyuanVideo's 256; Wan splits a head into frames 44,
#: rows and columns 42 each, HunyuanVideo into 16, 56 and 56; LTX-Video rotates across its heads, `ltx_bands`).
ROPES: dict[str, Rope] = {
    "flux": Rope((16, 56, 56), 10000.0, (1, 2)),
    "chroma": Rope((16, 56, 56), 10000.0, (1, 2)),
    "flux2": Rope((32, 32, 32, 32), 2000.0, (1, 2)),
    "qwen": Rope((16, 56, 56), 10000.0, (1, 2)),
    "zimage": Rope((32, 48, 48), 256.0, (1, 2)),
    "lumina2": Rope((32, 32, 32), 10000.0, (1, 2)),
    "wan": Rope((44, 42, 42), 10000.0, (0, 1, 2)),
    "hunyuanvideo": Rope((16, 56, 56), 256.0, (0, 1, 2)),
    # The stand-in's 6 heads of 64 at the pipeline's scale (8 / 25 frame rate, 32, 32; dit_standin.LTX_SCALE).
    "ltx": Rope((), 10000.0, (0, 1, 2), ltx_bands(384, 64, (8 / 25, 32.0, 32.0))),
    # LTX-2's video stream: the same rotation over the stand-in's 3 heads of 128, in pixels (frames at 24 per second)
    # at patch midpoints; its first latent frame sits 4.5 pixel frames before the second where the others are 8 apart.
    "ltx2": Rope((), 10000.0, (0, 1, 2), ltx_bands(384, 128, (8 / 24, 32.0, 32.0))),
}


def nonnegative_ridge(x: torch.Tensor, y: torch.Tensor, ridge: float = 1e-2, steps: int = 20000) -> torch.Tensor:
    """argmin_{w >= 0} |x w - y|^2 + ridge |w|^2 by projected gradient (a few dozen unknowns; the ridge keeps the
    near-constant low frequencies from cancelling each other with huge weights)."""
    q = x.T @ x + ridge * torch.eye(x.shape[1], dtype=x.dtype)
    b = x.T @ y
    step = 1 / float(torch.linalg.eigvalsh(q).max())
    w = torch.zeros(x.shape[1], dtype=x.dtype)
    for _ in range(steps):
        w = (w - step * (q @ w - b)).clamp_min(0)
    return w


def _kernel_problem(omegas: torch.Tensor, length: float) -> tuple[torch.Tensor, torch.Tensor]:
    d = torch.arange(FIT_SPAN + 1, dtype=torch.float64)
    x = torch.cat([torch.cos(d[:, None] * omegas[None].double()), -torch.ones(len(d), 1, dtype=torch.float64)], 1)
    y = -(1 - torch.exp(-d / length))
    weight = (1 + d).rsqrt()[:, None]
    return x * weight, y * weight.squeeze(1)


def unit_kernel(omegas: torch.Tensor, length: float = LENGTH) -> torch.Tensor:
    """Non-negative weights per frequency whose cosine sum, plus a free constant, best follows
    -(1 - exp(-delta / length)) for delta = 0..FIT_SPAN (nearer positions weigh more): the kernel of depth 1."""
    return nonnegative_ridge(*_kernel_problem(omegas, length))[:-1]


def unit_kernels(
    omegas: list[torch.Tensor], length: float = LENGTH, ridge: float = 1e-2, steps: int = 20000
) -> list[torch.Tensor]:
    """`unit_kernel` of several sets of frequencies at once (the bands of LTX-Video's heads, per axis: one batched
    projected gradient, each problem with its own step, a smaller problem padded with unknowns that stay zero; the
    same weights as one by one, to 1e-15, in a tenth of the time)."""
    n = max(len(w) for w in omegas) + 1
    q = torch.zeros(len(omegas), n, n, dtype=torch.float64)
    b = torch.zeros(len(omegas), n, dtype=torch.float64)
    step = torch.zeros(len(omegas), 1, dtype=torch.float64)
    for i, w in enumerate(omegas):
        x, y = _kernel_problem(w, length)
        m = x.shape[1]
        qi = x.T @ x + ridge * torch.eye(m, dtype=torch.float64)
        q[i, :m, :m], b[i, :m] = qi, x.T @ y
        step[i] = 1 / float(torch.linalg.eigvalsh(qi).max())
    w = torch.zeros(len(omegas), n, dtype=torch.float64)
    for _ in range(steps):
        w = (w - step * (torch.bmm(q, w.unsqueeze(-1)).squeeze(-1) - b)).clamp_min(0)
    return [w[i, : len(o)] for i, o in enumerate(omegas)]  # the free constant (after them) dropped


@dataclass(frozen=True)
class Design:
    """One family's kernel: per pair, the weight of the depth-1 kernel (zero off the grid axes and on the sink)."""

    rope: Rope
    unit: torch.Tensor  # [pairs]
    omegas: torch.Tensor  # [pairs]
    axis: torch.Tensor  # [pairs]
    sink: int  # the sink pair (Rope.sink_of)

    @classmethod
    def of(cls, rope: Rope, head: int = 0) -> Design:
        """The kernel of a head (every head's alike but in LTX-Video's bands: those are fitted together)."""
        key = (rope, head if rope.bands is not None else 0)
        if key not in _DESIGNS:
            heads = range(len(rope.bands)) if rope.bands is not None else [0]
            found = []  # (head, pairs fitted, frequencies)
            for h in heads:
                pairs, sink = rope.pairs(h), rope.sink_of(h)
                axis = torch.tensor([a for a, _ in pairs])
                omegas = torch.tensor([w for _, w in pairs], dtype=torch.float64)
                for a in rope.grid:
                    on = [p for p in (axis == a).nonzero().flatten().tolist() if p != sink]
                    found.append((h, on, omegas[on]))
                _DESIGNS[(rope, h)] = cls(rope, torch.zeros(len(pairs), dtype=torch.float64), omegas, axis, sink)
            if rope.bands is None:
                units = [unit_kernel(w) for _, _, w in found]
            else:
                units = unit_kernels([w for _, _, w in found])
            for (h, on, _), unit in zip(found, units):
                _DESIGNS[(rope, h)].unit[on] = unit
        return _DESIGNS[key]

    def logit(self, depth: float, delta: int) -> float:
        """The positional logit (less the sink's constant) of an image key `delta` away along every grid axis."""
        return depth * float((self.unit * torch.cos(self.omegas * delta)).sum())


#: Design.of's fits, per rope and head (each fit is 20,000 projected-gradient steps).
_DESIGNS: dict[tuple[Rope, int], Design] = {}


def _linear_bias(linear: nn.Linear) -> torch.Tensor:
    """The projection's bias, added (zeros) where the architecture has none: the positional part is a constant."""
    if linear.bias is None:
        linear.bias = nn.Parameter(torch.zeros(linear.out_features, dtype=linear.weight.dtype), requires_grad=False)
    return linear.bias


@dataclass
class Stream:
    """One stream's query and key projections in one attention: rows [q_at, q_at + heads * d) of `q` (its RMS
    norm `norm_q`), and of `k` from k_at (`norm_k`), `k_heads` key heads (fewer where a key head serves several
    query heads); `text`: the text stream of a double-stream block."""

    q: nn.Linear
    q_at: int
    k: nn.Linear
    k_at: int
    heads: int
    k_heads: int
    norm_q: nn.Module | None
    norm_k: nn.Module | None
    text: bool


def streams(module: nn.Module, head_dim: int) -> list[Stream]:
    """The query/key projections of one attention module, as `dit_standin.tie` finds them."""
    found = []
    fused = getattr(module, "to_qkv_mlp_proj", None)  # Flux.2's single blocks: rows [q, k, v, MLP] in one
    if isinstance(fused, nn.Linear):
        inner = module.inner_dim
        found.append(
            Stream(fused, 0, fused, inner, inner // head_dim, inner // head_dim, module.norm_q, module.norm_k, False)
        )
    for q, k, nq, nk, text in (
        ("to_q", "to_k", "norm_q", "norm_k", False),
        ("add_q_proj", "add_k_proj", "norm_added_q", "norm_added_k", True),
    ):
        wq, wk = getattr(module, q, None), getattr(module, k, None)
        if not isinstance(wq, nn.Linear) or not isinstance(wk, nn.Linear) or wq.in_features != wk.in_features:
            continue
        heads, k_heads = wq.out_features // head_dim, wk.out_features // head_dim
        found.append(Stream(wq, 0, wk, 0, heads, k_heads, getattr(module, nq, None), getattr(module, nk, None), text))
    return found


def _second_moments(model: nn.Module, family: Family, linears: list[nn.Linear]) -> dict[int, torch.Tensor]:
    """E[x x^T] of each projection's input over the tokens of one call at sigma 0.5 (`dit_standin.one_call`)."""
    from tome_bench.dit_standin import one_call

    sums: dict[int, list[Any]] = {id(lin): [0.0, 0] for lin in linears}

    def record(module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0].detach().double().flatten(0, -2)
        sums[id(module)][0] = sums[id(module)][0] + x.T @ x
        sums[id(module)][1] += len(x)

    handles = [lin.register_forward_pre_hook(record) for lin in {id(lin): lin for lin in linears}.values()]
    try:
        one_call(model, family, 0)
    finally:
        for handle in handles:
            handle.remove()
    return {key: total / max(count, 1) for key, (total, count) in sums.items() if count}


def _gain(norm: nn.Module | None, gain: float) -> None:
    if getattr(norm, "weight", None) is not None:
        norm.weight.fill_(gain)


def _attentions(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The attention modules (those with a query projection or Flux.2's fused one), in the model's order."""
    for name, module in model.named_modules():
        if isinstance(getattr(module, "to_q", None), nn.Linear) or isinstance(
            getattr(module, "to_qkv_mlp_proj", None), nn.Linear
        ):
            yield name, module


def depths(count: int, settings: Refit, seed: int) -> list[float]:
    """`count` depths spread evenly over settings.depth, in an order shuffled by `seed` (which block's which head
    is local is the seed's; how many of each is not)."""
    low, high = settings.depth
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    return [low + (high - low) * (i + 0.5) / count for i in order]


@dataclass(frozen=True)
class Placement:
    """One head's positional part: a constant (`bias`, on rotary pairs) or rows reading the input (`rows`, SD3.5's
    position table), `weight` its squared size in logits (sum of the kernel's weights), `near` its logit for a key
    SINK_AT away along every axis; `content`: the channels left to the tied content part; `sink`: the channel of
    the sink's constant."""

    bias: torch.Tensor  # [d]
    rows: torch.Tensor | None  # [d, in] or None
    weight: float
    near: float
    content: torch.Tensor  # [d] bool
    sink: int


def _rope_placement(design: Design, depth: float, d: int) -> Placement:
    unit = design.unit * (design.unit > 1e-4 * float(design.unit.max()))  # the fit's negligible weights: none
    w = depth * unit
    bias = torch.zeros(d, dtype=torch.float64)
    bias[0::2] = w.sqrt()
    content = (w == 0).repeat_interleave(2)
    content[2 * design.sink : 2 * design.sink + 2] = False
    return Placement(bias, None, float(w.sum()), design.logit(depth, SINK_AT), content, 2 * design.sink)


def _positional(name: str) -> bool:
    """Whether an attention module (by its name in the model) gets the positional construction: not a
    cross-attention (Wan's and LTX-Video's attn2: keys from the text, no positions), nor HunyuanVideo's token
    refiner (self-attention over the text alone, before the blocks), nor LTX-2's audio attentions (its audio's self-
    and text attention, audio to video and back); those are tied as the old stand-in ties them (where the query and
    key read one width)."""
    last = name.rsplit(".", 1)[-1]
    return not last.endswith("attn2") and "audio" not in last and not name.startswith("context_embedder.")


@torch.no_grad()
def surgery(model: nn.Module, family: Family, settings: Refit, seed: int = 0) -> int:
    """The re-fitted surgery on `model` in place (see the module's docstring); how many attention modules it set.
    Cross-attention (Wan's attn2: keys from the text, no positions) is tied as the old stand-in ties it."""
    from tome_bench.dit_standin import LOGIT_SCALE, tie

    settings = settings.resolved(family.name)
    d = family.head_dim
    attentions = list(_attentions(model))
    selfs = [m for n, m in attentions if _positional(n)]
    tied_gain = math.sqrt(LOGIT_SCALE * float(STANDIN_VARIANTS["stand-in"]) / math.sqrt(d))  # type: ignore[arg-type]
    for name, module in attentions:
        if not _positional(name):
            tie(module, d, tied_gain)
    layouts = {id(m): streams(m, d) for m in selfs}
    moments = _second_moments(model, family, [s.q for ss in layouts.values() for s in ss])
    rope = ROPES.get(family.name)
    per_module = [max(s.heads if s.k_heads == s.heads else 1 for s in layouts[id(m)]) for m in selfs]
    drawn = iter(depths(sum(per_module), settings, seed))
    for module, count in zip(selfs, per_module):
        layout = layouts[id(module)]
        image = next(s for s in layout if not s.text)
        module_depths = [next(drawn) for _ in range(count)]
        per_head = [module_depths[h * count // image.heads] for h in range(image.heads)]
        if rope is not None:
            places = [_rope_placement(Design.of(rope, h), depth, d) for h, depth in enumerate(per_head)]
        else:
            places = [_table_placement(model, family, depth, d, moments[id(image.q)]) for depth in per_head]
        _set_module(layout, places, settings.content, settings.text, moments, d)
    return len(attentions)


def _set_module(
    layout: list[Stream],
    places: list[Placement],
    kappa: float,
    text: float,
    moments: dict[int, torch.Tensor],
    d: int,
) -> None:
    """One attention module from its query heads' placements: the sink channel's constant pads every head's
    positional part to one squared size `total`, the content part is scaled to `kappa` logits per unit cosine; the
    text stream's keys carry only the sink's constant (and their content); the norms' gains put logits in the
    placements' units: logit = (total + kappa) * q.k / (|q| |k|) with |q|^2 = |k|^2 = total + kappa on average."""
    heads = len(places)
    total = max(p.weight for p in places) + 1.0
    gain = math.sqrt((total + kappa) / math.sqrt(d))
    pad = [total - p.weight for p in places]
    # What a text key can draw is bounded by its norm: the text stream's key gain is raised (lam) until every
    # head's sink logit is within 0.7 of its reach.
    targets = [pad[h] + places[h].near + text for h in range(heads)]
    reach = [math.sqrt((total + kappa) * p) for p in pad]
    lam = max(1.0, *(abs(t) / (0.7 * r) for t, r in zip(targets, reach)))
    for stream in layout:
        moment = moments.get(id(stream.q))
        # The content rows come from the projection as built (the key's where a key head serves several query
        # heads), read before either is overwritten: query and key then share them (tied).
        grouped = stream.k_heads != stream.heads
        source = (stream.k.weight if grouped else stream.q.weight).clone()
        src_at = stream.k_at if grouped else stream.q_at
        for linear, at, n_heads, role in (
            (stream.q, stream.q_at, stream.heads, "q"),
            (stream.k, stream.k_at, stream.k_heads, "k"),
        ):
            bias = _linear_bias(linear)
            for h in range(n_heads):
                # A key head that several query heads share (Lumina 2) takes the first one's placement; `surgery`
                # gives such a module's heads one depth.
                hq = h * heads // n_heads
                place = places[hq]
                rows = slice(at + h * d, at + (h + 1) * d)
                kh = h * stream.k_heads // n_heads if role == "q" else h
                src = source[src_at + kh * d : src_at + (kh + 1) * d]
                scale = 0.0
                if moment is not None and bool(place.content.any()):
                    kept = src[place.content].double()
                    mean_sq = float(torch.einsum("ri,ij,rj->", kept, moment, kept))
                    scale = math.sqrt(kappa / mean_sq) if mean_sq > 0 else 0.0
                weight = src * place.content[:, None].to(src.dtype) * scale
                amplitude = torch.zeros(d, dtype=torch.float64)
                if stream.text and role == "k":
                    f = targets[hq] / (lam * reach[hq])
                    amplitude[place.sink] = f * math.sqrt(kappa / (1 - f * f))
                else:
                    amplitude += place.bias
                    amplitude[place.sink] = math.sqrt(pad[hq])
                    if place.rows is not None and not stream.text:
                        weight = weight + place.rows.to(weight.dtype)
                linear.weight[rows] = weight
                bias[rows] = amplitude.to(bias.dtype)
        _gain(stream.norm_q, gain)
        _gain(stream.norm_k, gain * (lam if stream.text else 1.0))


#: SD3.5's position table: per axis (columns, then rows) 48 sines then 48 cosines of position * 10000^(-k/48), the
#: position in units of 1/3 token (diffusers scales its 192-wide table to a base of 64).
_TABLE_STEP = 1 / 3


def _table_placement(model: nn.Module, family: Family, depth: float, d: int, moment: torch.Tensor) -> Placement:
    """SD3.5 (no rotary embedding): the head's query and key read the sine and cosine of each kept frequency from the
    residual stream's position table, sin(a) sin(b) + cos(a) cos(b) = cos(a - b), scaled by the input's measured
    size on those channels (the table's share of it is what reaches the kernel)."""
    dim = moment.shape[0]
    half = dim // 2  # per axis
    freqs = half // 2
    omegas = torch.tensor([_TABLE_STEP * 10000 ** (-k / freqs) for k in range(freqs)], dtype=torch.float64)
    unit = unit_kernel(omegas)
    unit = unit * (unit > 1e-4 * float(unit.max()))
    kept = [(a, k) for a in range(2) for k in unit.nonzero().flatten().tolist()]
    kept = sorted(kept, key=lambda ak: -float(unit[ak[1]]))[: d // 2 - 1]  # one pair left for the sink
    rows = torch.zeros(d, dim, dtype=torch.float64)
    weight = 0.0
    for j, (a, k) in enumerate(kept):
        sin, cos = a * half + k, a * half + freqs + k
        size = float(moment[sin, sin] + moment[cos, cos]) / 2
        amp = math.sqrt(depth * float(unit[k]) / size)
        rows[2 * j, sin] = rows[2 * j + 1, cos] = amp
        weight += depth * float(unit[k]) * 2
    content = torch.zeros(d, dtype=torch.bool)
    content[2 * len(kept) : d - 2] = True
    near = 2 * depth * float((unit * torch.cos(omegas * SINK_AT)).sum())
    return Placement(torch.zeros(d, dtype=torch.float64), rows, weight, near, content, d - 2)


#: The calibrated variant's block update: the trained DiT's blocks change their stream by 0.25-0.52 at sigma 0.5
#: (mean 0.375; dit_standin.updates on tome_bench.trained_dit), the tied and refit stand-ins' by 0.2.
CALIBRATED_UPDATE = 0.375
#: The calibrated variant's time squeeze: the model reads 0.5 + CALIBRATED_TIME * (sigma - 0.5), so that its velocity
#: at a fixed input moves between sigma 0.5 and 0.45 about as the trained DiT's does (0.08; as built 0.46: the random
#: time embedding's fast sinusoids make the velocity swing with the sigma, each step grid samples unrelated
#: velocities, and dropping a step cost as much as the naive port). docs/runs/2026-12-06-refit-calibrated.
CALIBRATED_TIME = 0.008
#: The calibrated variant's velocity: ||v|| / ||x|| of one call at sigma 0.5, the trained DiT's on its evaluation
#: crops (1.90); the refit stand-in's as built 0.82 (its generation ends near its starting noise, cosine 0.87, where
#: the trained DiT's ends at an image, cosine 0.20 with its noise, so that any change was diluted by the noise).
CALIBRATED_VELOCITY = 1.9
#: The stand-in variants the panels run: the tied ones (`dit_standin.VARIANTS`), the re-fitted one and the re-fitted
#: one calibrated to the trained DiT's generation response.
VARIANTS: dict[str, float | Refit | None] = {
    **STANDIN_VARIANTS,
    "refit": Refit(),
    "calibrated": Refit(update=CALIBRATED_UPDATE, time=CALIBRATED_TIME, velocity=CALIBRATED_VELOCITY),
}
