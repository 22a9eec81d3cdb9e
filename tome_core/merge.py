"""Token merging kernels: pure functions of tensors that return merge and unmerge closures.

Tokens are the flattened h*w latent grid of one transformer block, [B, N, C] with N = h*w, row-major.
The grid is cut into cells of sy rows by sx columns; each whole cell holds one destination (dst) token,
every other token is a source (src). The r sources most similar to a destination are averaged into it
(bipartite soft matching, arXiv 2303.17604). Unmerging copies each destination's output back to the
sources merged into it.

Built for a GPU: every step is one batched operation on the device (no loop over the batch, no value read
back to the host), and what depends only on the grid is built once and reused:

* `GridLayout` (per grid shape): the cells and slot offsets;
* `Partition` (per grid and sampler step): which token of each cell is the destination; random ones are a
  hash of the cell and the step's timestep (`hashed_slots`): eager calls pick one of a grid's 17 from a
  `PartitionTable`, a compiled graph hashes the same one from its own timestep input;
* `band_merge` (per level, stack or block): the merge as two dense matrices per band of cells, so that merging
  and unmerging are one batched matrix product each (`BandMerge`); matching stays inside a band ("local");
* `Match` and `plan` (global matching, tomesd's rule): the similarity ranking of the sources, then merge and
  unmerge closures, one `index_add_` and one `index_select` each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tome_core.compat import is_compiling

Merge = Callable[[torch.Tensor], torch.Tensor]

#: Floor of a token's norm before normalising (fp16-safe, unlike 1e-12).
_EPS = 1e-6


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass
class GridLayout:
    """Everything about an h x w grid cut into sx x sy cells that does not depend on the random draw.

    Built once per grid shape and device, then shared by every block and step. `cache` holds small per-batch
    constants (ones, batch offsets) keyed by their shape.
    """

    h: int
    w: int
    sx: int
    sy: int
    cell_tok: torch.Tensor  # [Nd] token index of each cell's top-left corner
    slot_offset: torch.Tensor  # [sx*sy] token offset of slot ky*sx + kx inside a cell
    arange: torch.Tensor  # [N] 0..N-1
    cache: dict[tuple[str, int, int], torch.Tensor] = field(default_factory=dict)

    @property
    def hs(self) -> int:
        return self.h // self.sy

    @property
    def ws(self) -> int:
        return self.w // self.sx

    @property
    def num_dst(self) -> int:
        return self.hs * self.ws

    @property
    def n(self) -> int:
        return self.h * self.w

    def batch_offsets(self, batch: int, rows: int) -> torch.Tensor:
        """[B, 1] offsets b * rows that make per-sample row indices into flat ones."""
        return self._cached(
            ("offsets", batch, rows), lambda: torch.arange(batch, device=self.arange.device).view(-1, 1) * rows
        )

    def ones(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        return self._cached(
            ("ones" + str(dtype), count, 0), lambda: torch.ones(count, dtype=dtype, device=self.arange.device)
        )

    def _cached(self, key: tuple[str, int, int], build: Callable[[], torch.Tensor]) -> torch.Tensor:
        # Traced by torch.compile, a tensor stored here would leave the graph and change what the next call's
        # guards see: the graph builds it instead (a constant to the compiler), eager calls keep it.
        if is_compiling():
            return build()
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]


def grid_layout(h: int, w: int, sx: int, sy: int, device: torch.device | str = "cpu") -> GridLayout:
    """The `GridLayout` of an h x w grid (sx, sy need not divide it)."""
    hs, ws = h // sy, w // sx

    def arange(n: int) -> torch.Tensor:  # device= on each factory: a compiled graph builds these too
        return torch.arange(n, device=device)

    cell_tok = ((arange(hs) * sy).view(hs, 1) * w + (arange(ws) * sx).view(1, ws)).reshape(-1)
    k = arange(sx * sy)
    slot_offset = torch.div(k, sx, rounding_mode="floor") * w + k % sx
    return GridLayout(h, w, sx, sy, cell_tok, slot_offset, arange(h * w))


@dataclass(frozen=True)
class Partition:
    """Which token of each cell is the destination, as token indices and as a per-token table."""

    layout: GridLayout
    dst_tok: torch.Tensor  # [Nd] token index of each destination, in cell order
    dst_number: torch.Tensor | None  # [N] int64: a destination's number at its token, 0 elsewhere (global matching)
    # [Nd] where each destination's similarity to itself sits in a band's flattened [band tokens, ws] scores:
    # dst_tok * ws + its cell's column (`band_merge` marks it so that a destination always keeps its own row).
    self_score: torch.Tensor


def partition(layout: GridLayout, slots: torch.Tensor, numbers: bool = True) -> Partition:
    """The partition that puts each cell's destination in slot `slots` [Nd] (ky * sx + kx) of the cell; `numbers`:
    also the per-token table that global matching reads."""
    dst_tok = layout.cell_tok + layout.slot_offset.index_select(0, slots.reshape(-1))
    self_score = dst_tok * layout.ws + layout.arange[: layout.num_dst] % max(layout.ws, 1)
    dst_number = None
    if numbers:
        dst_number = torch.zeros(layout.n, dtype=torch.int64, device=dst_tok.device)
        dst_number.index_copy_(0, dst_tok, layout.arange[: layout.num_dst])
    return Partition(layout, dst_tok, dst_number, self_score)


def fixed_slots(layout: GridLayout) -> torch.Tensor:
    """Every destination in its cell's top-left corner: [Nd] zeros."""
    return torch.zeros(layout.num_dst, dtype=torch.int64, device=layout.cell_tok.device)


#: Hash constants of `hashed_slots`, all below 2**31: inductor's GPU kernels index in int32 and refuse a larger
#: literal next to an index (H200, 2026-11-26: "Scalar 2654435761 is out of range for type int32"), and every
#: product stays below 2**63.
_MASK = 0x7FFFFFFF
_KEY_MUL, _SEED_MUL, _MIX_MUL = 0x27D4EB2F, 0x165667B1, 0x045D9F3B


def hashed_slots(count: int, cells: int, key: torch.Tensor, seed: int) -> torch.Tensor:
    """[..., count] int64 in [0, cells): a random-looking destination slot for each of `count` cells, a hash of the
    cell number, `key` (int64 on the device, [1] or [K, 1]: which partition) and `seed`.

    Integer arithmetic on the device and nothing else: no generator, no host tensor, no state, so a compiled graph
    computes it from its own timestep input (under CUDA graphs a tensor the graph read from Python state would be
    an input whose address must never change), and eager and compiled calls draw the same partitions everywhere.
    """
    start = ((key & _MASK) * _KEY_MUL + (seed * _SEED_MUL & _MASK)) & _MASK  # [1]
    # The cell number is only added: scaled, it would be an index expression with a large literal in the kernel.
    x = torch.arange(count, device=key.device) + start  # [count]
    for _ in range(3):
        x = ((x ^ (x >> 16)) * _MIX_MUL) & _MASK
    return (x ^ (x >> 16)) % cells


@dataclass(frozen=True)
class PartitionTable:
    """`count` random partitions of one grid, stacked, so that a sampler step picks one on the device."""

    layout: GridLayout
    dst_tok: torch.Tensor  # [count, 2 * Nd]: each row's dst_tok, then its self_score (one pick reads both)
    dst_number: torch.Tensor  # [count, N]

    @property
    def count(self) -> int:
        return self.dst_tok.shape[0]

    def pick(self, key: torch.Tensor, numbers: bool = True) -> Partition:
        """The partition for `key` (a [1] int64 device tensor): row key mod count, chosen without a host read;
        `numbers`: also its per-token table (global matching), a second pick."""
        return self.pick_row(key.remainder(self.count), numbers)

    def pick_row(self, row: torch.Tensor, numbers: bool = True) -> Partition:
        """The partition in row `row` ([1] int64 on the device, already reduced mod count)."""
        both = self.dst_tok.index_select(0, row)[0]
        nd = self.layout.num_dst
        dst_number = self.dst_number.index_select(0, row)[0] if numbers else None
        return Partition(self.layout, both[:nd], dst_number, both[nd:])


#: Random partitions per grid. A step picks one by its timestep; a prime count spreads the usual timestep
#: spacings (multiples of 1000 in the key) over all of them.
PARTITIONS_PER_GRID = 17


def random_partitions(layout: GridLayout, seed: int, count: int = PARTITIONS_PER_GRID) -> PartitionTable:
    """The partitions of keys 0 .. count-1 (`hashed_slots`), for eager calls: built once per grid, never per call.

    Row k is the partition a compiled graph hashes for a key k (mod count): eager and compiled calls merge alike.
    """
    keys = torch.arange(count, device=layout.arange.device).view(count, 1)  # [count, 1]
    slots = hashed_slots(layout.num_dst, layout.sx * layout.sy, keys, seed)  # [count, Nd]
    parts = [partition(layout, row) for row in slots]
    both = torch.stack([torch.cat([p.dst_tok, p.self_score]) for p in parts])
    return PartitionTable(layout, both, torch.stack([p.dst_number for p in parts]))


def hashed_partition(
    layout: GridLayout, key: torch.Tensor, seed: int, count: int = PARTITIONS_PER_GRID, numbers: bool = True
) -> Partition:
    """The partition `random_partitions(layout, seed, count).pick(key)` returns, computed without the table: what a
    compiled graph runs, so that it reads no stored tensor."""
    slots = hashed_slots(layout.num_dst, layout.sx * layout.sy, key.remainder(count), seed)
    return partition(layout, slots, numbers)


def random2d_slots(
    hs: int, ws: int, sx: int, sy: int, *, no_rand: bool, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """The destination slot (ky * sx + kx) chosen in each cell: [hs, ws] int64 on `device`.

    Drawn from `generator` (never the global RNG); all zeros (top-left) when `no_rand`.
    """
    if no_rand or sx * sy == 1:
        return torch.zeros(hs, ws, dtype=torch.int64, device=device)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    if generator is None:
        # A fixed private generator keeps the global RNG untouched.
        generator = torch.Generator(device=gen_device).manual_seed(0)
    slots = torch.randint(sy * sx, (hs, ws), generator=generator, device=gen_device)
    return slots.to(device, non_blocking=True)


@dataclass(frozen=True)
class Match:
    """How the sources rank for merging, for one metric: plan any ratio from it with `plan`."""

    part: Partition
    order: torch.Tensor  # [B, N] tokens by decreasing similarity to their best destination; destinations last
    into: torch.Tensor  # [B, N] the best destination's number of every token


def match(metric: torch.Tensor, part: Partition) -> Match:
    """Rank every source by its cosine similarity to the most similar destination anywhere in the grid (global
    matching, tomesd's rule).

    Args:
        metric: [B, N, C] with N = h*w of `part`'s grid.
    """
    unit = metric / metric.norm(dim=-1, keepdim=True).clamp_min(_EPS)  # [B, N, C]
    unit_dst = unit.index_select(1, part.dst_tok)  # [B, Nd, C]
    best, into = (unit @ unit_dst.transpose(1, 2)).max(dim=-1)  # [B, N]
    best.index_fill_(1, part.dst_tok, float("-inf"))  # destinations never merge: ranked last
    return Match(part, best.argsort(dim=-1, descending=True), into)


def plan(m: Match, r: int) -> tuple[Merge, Merge]:
    """Merge the r best-matched sources of `m` into their destinations.

    Returns:
        merge: [B, N, C] -> [B, N - r, C], averaging merged sources into their destination.
        unmerge: [B, N - r, C'] -> [B, N, C'], giving each token its destination's (or its own) row.

    On CUDA, merge sums with `index_add_`, whose atomic adds land in no fixed order: a destination that takes
    two or more sources can differ in its last bits between two runs of the same input, so images reproduce up
    to float rounding, not bitwise. Under `torch.use_deterministic_algorithms(True)` PyTorch runs `index_add_`
    on CUDA as a sorted `index_put_(accumulate=True)` instead: bitwise repeatable, at the cost of a sort and a
    copy of the input per merge. (The counts are sums of ones, exact in any order.)
    """
    layout = m.part.layout
    B, N = m.order.shape
    num_dst = layout.num_dst
    r = min(r, N - num_dst)
    if r <= 0 or num_dst == 0:
        return identity, identity
    rows = N - r
    num_unm = rows - num_dst
    merged, kept = m.order[:, :r], m.order[:, r : N - num_dst]  # [B, r], [B, num_unm]
    # row[b, t]: the merged tensor's row holding token t: destinations first, then unmerged sources.
    if m.part.dst_number is None:
        raise ValueError("plan needs a partition made with numbers=True")
    row = m.part.dst_number.repeat(B, 1)  # [B, N]
    row.scatter_(1, kept, layout.arange[num_dst:rows].expand(B, num_unm))
    row.scatter_(1, merged, m.into.gather(1, merged))
    flat = (row + layout.batch_offsets(B, rows)).view(-1)  # [B*N] rows of the flattened [B*(N-r)] output
    # Counted in float32 (bf16 stops counting at 256); each dtype merged in gets 1/count from one reciprocal
    # written straight into that dtype, the float32 result rounded once, and kept with the plan: the blocks of a
    # stack and the attention and MLP of a block merge with one plan, and none pays a conversion.
    count = torch.zeros(B * rows, device=row.device).index_add_(0, flat, layout.ones(B * N, torch.float32))
    count = count.unsqueeze(-1)  # [B*(N-r), 1]
    inv_counts: dict[torch.dtype, torch.Tensor] = {}  # dtype -> [B*(N-r), 1]

    def merge(x: torch.Tensor) -> torch.Tensor:
        C = x.shape[-1]
        inv_count = inv_counts.get(x.dtype)
        if inv_count is None:
            inv_count = inv_counts[x.dtype] = torch.reciprocal(count, out=count.new_empty(count.shape, dtype=x.dtype))
        out = x.new_zeros(B * rows, C).index_add_(0, flat, x.reshape(B * N, C))
        return out.mul_(inv_count).view(B, rows, C)

    def unmerge(x: torch.Tensor) -> torch.Tensor:
        C = x.shape[-1]
        return x.reshape(B * rows, C).index_select(0, flat).view(B, N, C)

    return merge, unmerge


@dataclass(frozen=True)
class BandMerge:
    """A merge plan as two dense matrices per band (a row of cells: sy token rows, contiguous in memory).

    Each band of `band` tokens keeps `rows` rows: its destinations (one per whole cell) and the sources least
    similar to any of them; every other source is averaged into its most similar destination of the same band.
    Tokens below the last whole band (fewer than sy rows) are kept as they are, after the bands' rows.

    Shapes, with Nb = bands * band the tokens in bands and M = bands * rows + tail the merged count:
        merge: [B, N, C] -> [B, M, C]        unmerge: [B, M, C] -> [B, N, C]
    """

    bands: int
    band: int
    rows: int
    tail: int
    spread: torch.Tensor  # [B*bands, band, rows] one-hot: the row each token went to (unmerge)
    mean: torch.Tensor  # [B*bands, rows, band]: each row the mean of its tokens (merge); a transposed view

    @property
    def merged_tokens(self) -> int:
        return self.bands * self.rows + self.tail

    def _split(self, x: torch.Tensor, per_band: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, _, C = x.shape
        body = x[:, : self.bands * per_band].reshape(B * self.bands, per_band, C)  # a view unless there is a tail
        return body, (x[:, self.bands * per_band :] if self.tail else None)

    def _join(self, body: torch.Tensor, tail: torch.Tensor | None, batch: int) -> torch.Tensor:
        out = body.view(batch, -1, body.shape[-1])
        return out if tail is None else torch.cat([out, tail], dim=1)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, C] -> [B, M, C]: one batched matrix product."""
        body, tail = self._split(x, self.band)
        return self._join(torch.bmm(self.mean.to(x.dtype), body), tail, x.shape[0])

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        """[B, M, C] -> [B, N, C]: every token gets its row's value."""
        body, tail = self._split(y, self.rows)
        return self._join(torch.bmm(self.spread.to(y.dtype), body), tail, y.shape[0])

    def merge_with_residual(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(merge(x), x - unmerge(merge(x))): the merged tokens and what merging took from each token (zero for a
        kept one), reading x once (a copy first when x is a transposed view, as SD1's blocks get it)."""
        body, tail = self._split(x.contiguous(), self.band)
        rows = torch.bmm(self.mean.to(x.dtype), body)
        residual = torch.baddbmm(body, self.spread.to(x.dtype), rows, alpha=-1)
        batch = x.shape[0]
        return self._join(rows, tail, batch), self._join(
            residual, None if tail is None else torch.zeros_like(tail), batch
        )

    def unmerge_add(self, base: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """base + unmerge(y), [B, N, C], in one batched product (`baddbmm`)."""
        body, tail = self._split(base, self.band)
        rows, y_tail = self._split(y, self.rows)
        out = torch.baddbmm(body, self.spread.to(y.dtype), rows)
        return self._join(out, None if tail is None else tail + y_tail, base.shape[0])


def _kept(tokens: int, dst: int, ratio: float) -> int:
    """Tokens left of `tokens` when `ratio` of them merge away into `dst` destinations, which always stay."""
    return tokens - min(int(tokens * ratio), tokens - dst)


def band_rows(layout: GridLayout, ratio: float) -> int:
    """Rows a band keeps when `ratio` of its tokens merge away: at least one per whole cell."""
    return _kept(layout.sy * layout.w, layout.ws, ratio)


@dataclass(frozen=True)
class BandMatch:
    """Each token's most similar destination in its band, and how similar: plan any ratio from it (`band_merge`)."""

    layout: GridLayout
    best: torch.Tensor  # [B*bands, band] similarity to the best destination (at most C); a destination's own is 2C
    row: torch.Tensor  # [B*bands, band] int64: that destination's column (its row after merging)
    tail: int  # tokens below the last whole band


def band_match(metric: torch.Tensor, part: Partition) -> BandMatch | None:
    """Match every token of a band with the most similar destination of the same band (cosine similarity).

    Args:
        metric: [B, N, C], N = h*w of the partition's grid: the tokens whose similarity decides what merges.
        part: the destinations; each is marked as its own best match (above any similarity), so that it keeps its
            row even beside an identical token.
    Returns:
        None when the grid holds no whole cell.
    """
    layout = part.layout
    B, N, C = metric.shape
    hs, ws, band = layout.hs, layout.ws, layout.sy * layout.w
    if hs == 0 or ws == 0:
        return None
    # Centred and scaled per token (one kernel where dividing by the norm takes three): the score is the tokens'
    # correlation, cosine similarity after removing each token's mean, times C.
    unit = F.layer_norm(metric, (C,), eps=_EPS)  # [B, N, C]
    dst = unit.index_select(1, part.dst_tok).view(B * hs, ws, C)
    body = unit[:, : hs * band].reshape(B * hs, band, C)
    score = torch.bmm(body, dst.transpose(1, 2))  # [B*hs, band, ws]
    score.view(B, hs * band * ws).index_fill_(1, part.self_score, 2.0 * C)
    best, row = score.max(dim=-1)  # [B*hs, band]
    return BandMatch(layout, best, row, N - hs * band)


def merged_tokens(h: int, w: int, sx: int, sy: int, ratio: float, matching: str = "local") -> int:
    """Tokens left when `ratio` of an h x w grid's merge: per band of cells ("local", `band_merge`: each band keeps
    `band_rows`, the rows below the last whole band stay as they are) or over the whole grid ("global", `plan`: one
    destination per whole cell at least). A grid without a whole cell keeps every token."""
    hs, ws, n = h // sy, w // sx, h * w
    if hs == 0 or ws == 0 or ratio <= 0:
        return n
    if matching == "global":
        return _kept(n, hs * ws, ratio)
    return hs * _kept(sy * w, ws, ratio) + (h - hs * sy) * w


def band_merge(m: BandMatch, ratio: float) -> BandMerge | None:
    """Plan merging `ratio` of each band's tokens: the least similar sources keep rows of their own (after the
    destinations'), every other source is averaged into its best destination. None when nothing would merge.

    Args:
        m: `band_match` of the tokens.
        ratio: share of each band's tokens merged away, capped at 1 - ws/band (every source merged).
    """
    layout = m.layout
    hs, ws, band = layout.hs, layout.ws, layout.sy * layout.w
    rows = band_rows(layout, ratio)
    if rows >= band:
        return None
    keep = rows - ws  # sources per band left unmerged
    row = m.row
    if keep > 0:
        # Destinations score 2C: never among the least similar.
        kept = m.best.topk(keep, dim=-1, largest=False, sorted=False).indices  # [B*hs, keep]
        row = row.scatter(1, kept, layout.arange[ws:rows].expand(row.shape[0], keep))
    # A comparison, not zeros().scatter_(..., 1.0): inductor's CUDA lowering of that scatter gave a float32 matrix
    # in a float16 graph (H100, torch 2.11: "Input dtypes must be the same" in the baddbmm after it).
    spread = (row.unsqueeze(-1) == layout.arange[:rows]).to(m.best.dtype)  # [B*hs, band, rows]
    mean = (spread / spread.sum(dim=1, keepdim=True)).transpose(1, 2)  # [B*hs, rows, band]
    return BandMerge(hs, band, rows, m.tail, spread, mean)


def bipartite_soft_matching_random2d(
    metric: torch.Tensor,
    w: int,
    h: int,
    sx: int,
    sy: int,
    r: int,
    *,
    no_rand: bool = False,
    generator: torch.Generator | None = None,
    matching: str = "global",
) -> tuple[Merge, Merge]:
    """Partition tokens into sources and destinations and plan merging the r most similar sources.

    The one-shot form of `grid_layout` + `partition` + `match` + `plan` (global) or `band_match` + `band_merge`
    (local, what the patch runs), with tomesd's signature.

    Args:
        metric: [B, N, C] with N = h*w, the tokens whose cosine similarity decides what merges.
        w, h: the token grid's width and height; sx, sy need not divide them.
        sx, sy: cell size; each whole cell holds one destination, so at most N - (h//sy)*(w//sx) merge.
        r: number of tokens to remove; capped at the number of sources.
        no_rand: put each cell's destination in its top-left corner instead of a random slot.
        generator: private generator for the random slots (the global RNG is never drawn from).
        matching: "global" compares every source with every destination (tomesd's rule); "local" merges each
            token into the most similar destination of its own band of cells (sy token rows), r/N of every band's
            tokens, so `merged_tokens(h, w, sx, sy, r / N)` remain: r at most.

    Returns:
        merge: [B, N, C] -> [B, M, C], averaging merged sources into their destination (M = N - r globally).
        unmerge: [B, M, C'] -> [B, N, C'], giving each token its destination's (or its own) row.
    """
    N = metric.shape[1]
    if h * w != N:
        raise ValueError(f"metric has {N} tokens but the grid is {h}x{w}")
    if matching not in ("global", "local"):
        raise ValueError(f"matching must be 'local' or 'global', got {matching!r}")
    hs, ws = h // sy, w // sx
    if min(r, N - hs * ws) <= 0 or hs * ws == 0:
        return identity, identity
    with torch.no_grad():
        layout = grid_layout(h, w, sx, sy, metric.device)
        slots = random2d_slots(hs, ws, sx, sy, no_rand=no_rand, generator=generator, device=metric.device)
        part = partition(layout, slots, numbers=matching == "global")
        if matching == "global":
            return plan(match(metric, part), r)
        bands = band_match(metric, part)
        merge = None if bands is None else band_merge(bands, r / N)
        return (identity, identity) if merge is None else (merge.merge, merge.unmerge)


def kv_tokens(h: int, w: int, sx: int, sy: int) -> int:
    """Tokens `kv_downsample` keeps of an h x w grid: one per sx x sy cell, ragged edge cells included."""
    return -(-h // sy) * -(-w // sx)


def kv_downsample(x: torch.Tensor, w: int, h: int, sx: int, sy: int) -> torch.Tensor:
    """Keys and values subsampled over sx*sy cells: the token at each cell's centre, as ToDo (arXiv 2402.13573)
    subsamples with `F.interpolate(mode="nearest-exact")`.

    Subsampling, not averaging: on a model that attends like a trained one (tome_bench.standin) an average key
    matches no query as its own token does, and whole generations from white noise changed 1.4-1.6x as much with
    average pooling (docs/fidelity.md). Where the cells divide the grid, one strided copy; on a ragged grid (the
    middle block of an image whose latent the cells do not divide) one nearest-exact resampling to
    kv_tokens(h, w, sx, sy) evenly spaced tokens, one kernel as well.

    Args:
        x: [B, N, C] with N = h*w.
    Returns:
        [B, kv_tokens(h, w, sx, sy), C].
    """
    B, N, C = x.shape
    if h * w != N:
        raise ValueError(f"x has {N} tokens but the grid is {h}x{w}")
    if sx == 1 and sy == 1:
        return x
    grid = x.view(B, h, w, C)
    if h % sy == 0 and w % sx == 0:
        return grid[:, sy // 2 :: sy, sx // 2 :: sx].reshape(B, -1, C)  # [B, h/sy * w/sx, C]
    size = (-(-h // sy), -(-w // sx))
    picked = F.interpolate(grid.permute(0, 3, 1, 2), size=size, mode="nearest-exact")  # [B, C, *size]
    return picked.flatten(2).transpose(1, 2)


def kv_index(
    before: int,
    grid: tuple[int, int, int],
    after: int,
    st: int,
    sy: int,
    sx: int,
    device: torch.device | str,
    slot: int = 0,
) -> torch.Tensor:
    """[K] int64: the tokens of a joint sequence that keys/values keep: every token before and after the grid (text,
    reference images, a kept first frame) and, of the t x h x w grid of generated tokens between them, one token of
    each st x sy x sx cell: slot 0 the one at its centre, as `kv_downsample` picks it (nearest-exact: evenly spaced on
    a ragged grid); `kv_table` lists every slot.

    Kept keys are the model's own keys at those positions, rotary embedding applied: each carries the position of
    the cell it stands for. K = before + kv_tokens-style ceil(t/st) * ceil(h/sy) * ceil(w/sx) + after.
    """
    return kv_table(before, grid, after, st, sy, sx, device)[slot % (st * sy * sx)]


def kv_table(
    before: int, grid: tuple[int, int, int], after: int, st: int, sy: int, sx: int, device: torch.device | str
) -> torch.Tensor:
    """[st*sy*sx, K] int64: `kv_index` for every slot. Slot (rt, ry, rx), numbered rt*sy*sx + ry*sx + rx, takes in
    each cell the token rt, ry, rx places after the centre along each axis, wrapping within the cell (a ragged edge
    cell repeats its own tokens): over the slots every token of a cell stands for it once."""
    t, h, w = grid

    def positions(n: int, s: int) -> torch.Tensor:
        m = -(-n // s)  # cells along the axis, a ragged last one included
        i = torch.arange(m, device=device)
        lo = torch.div(i * n, m, rounding_mode="floor")  # [m] each cell's first token (nearest-exact's cells)
        size = (torch.div((i + 1) * n, m, rounding_mode="floor") - lo).clamp_min(1)  # [m]
        centre = torch.div((i * 2 + 1) * n, 2 * m, rounding_mode="floor") - lo  # [m]
        r = torch.arange(s, device=device).view(-1, 1)  # [s, 1]
        return lo + torch.remainder(torch.minimum(centre, size - 1) + r, size)  # [s, m]

    pt, ph, pw = positions(t, st), positions(h, sy), positions(w, sx)
    mt, mh, mw = pt.shape[1], ph.shape[1], pw.shape[1]
    cells = (pt.view(st, 1, 1, mt, 1, 1) * h + ph.view(1, sy, 1, 1, mh, 1)) * w + pw.view(1, 1, sx, 1, 1, mw)
    slots = st * sy * sx
    n = t * h * w
    return torch.cat(
        [
            torch.arange(before, device=device).expand(slots, before),
            cells.reshape(slots, mt * mh * mw) + before,  # [S, cells]
            (torch.arange(after, device=device) + (before + n)).expand(slots, after),
        ],
        dim=1,
    )
