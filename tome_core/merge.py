"""Token merging kernels: pure functions of tensors that return merge and unmerge closures.

Tokens are the flattened h*w latent grid of one transformer block, [B, N, C] with N = h*w, row-major.
The grid is cut into cells of sy rows by sx columns; each whole cell holds one destination (dst) token,
every other token is a source (src). The r sources most similar to a destination are averaged into it
(bipartite soft matching, arXiv 2303.17604). Unmerging copies each destination's output back to the
sources merged into it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Merge = Callable[[torch.Tensor], torch.Tensor]


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


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


def _partition(w: int, sx: int, sy: int, slots: torch.Tensor) -> torch.Tensor:
    """Token indices of the destinations, [hs*ws] in cell order."""
    hs, ws = slots.shape
    rows = torch.arange(hs, device=slots.device).view(hs, 1) * sy + torch.div(slots, sx, rounding_mode="floor")
    cols = torch.arange(ws, device=slots.device).view(1, ws) * sx + slots % sx
    return (rows * w + cols).reshape(-1)


def _match_global(
    metric: torch.Tensor, unit_dst: torch.Tensor, h: int, w: int, sx: int, sy: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """All-to-all matching (tomesd's rule). Returns raw best score [B, N] and best dst number [B, N]."""
    scores = metric @ unit_dst.transpose(1, 2)  # [B, N, Nd]
    return scores.max(dim=-1)


def _match_local(
    metric: torch.Tensor, unit_dst: torch.Tensor, h: int, w: int, sx: int, sy: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Match each token only against destinations in its own and the two adjacent rows of cells.

    The tokens of one row of cells are contiguous in memory and the destinations of three consecutive cell
    rows are a strided view, so this is one batched matmul with no copy: O(N * 3*w/sx * C) instead of
    O(N * N/(sx*sy) * C). Returns raw best score [B, N] and best dst number [B, N].
    """
    B, N, C = metric.shape
    hs, ws = h // sy, w // sx
    rows = unit_dst.view(B, hs, ws, C)
    # Edge rows repeated instead of zero padding: duplicates never win over the real row, zeros could.
    padded = torch.cat([rows[:, :1], rows, rows[:, -1:]], dim=1).contiguous()  # [B, hs+2, ws, C]
    band = padded.as_strided((B, hs, 3 * ws, C), (padded.stride(0), ws * C, C, 1))  # [B, hs, 3*ws, C]
    grid_tokens = hs * sy * w
    body = metric[:, :grid_tokens].reshape(B, hs, sy * w, C)
    best, pick = (body @ band.transpose(-1, -2)).max(dim=-1)  # [B, hs, sy*w]
    cell_row = torch.arange(hs, device=metric.device).view(1, hs, 1)
    dst_row = (cell_row - 1 + torch.div(pick, ws, rounding_mode="floor")).clamp(0, hs - 1)
    best_idx = dst_row * ws + pick % ws
    best, best_idx = best.reshape(B, grid_tokens), best_idx.reshape(B, grid_tokens)
    if grid_tokens == N:
        return best, best_idx
    # The ragged bottom rows (fewer than sy) match against the last band.
    tail_best, tail_pick = (metric[:, grid_tokens:] @ band[:, -1].transpose(-1, -2)).max(dim=-1)
    tail_row = (hs - 2 + torch.div(tail_pick, ws, rounding_mode="floor")).clamp(0, hs - 1)
    return torch.cat([best, tail_best], dim=1), torch.cat([best_idx, tail_row * ws + tail_pick % ws], dim=1)


_MATCHERS = {"global": _match_global, "local": _match_local}


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

    Args:
        metric: [B, N, C] with N = h*w, the tokens whose cosine similarity decides what merges.
        w, h: the token grid's width and height; sx, sy need not divide them.
        sx, sy: cell size; each whole cell holds one destination, so at most N - (h//sy)*(w//sx) merge.
        r: number of tokens to remove; capped at the number of sources.
        no_rand: put each cell's destination in its top-left corner instead of a random slot.
        generator: private generator for the random slots (the global RNG is never drawn from).
        matching: "global" compares every source with every destination (tomesd's rule);
            "local" only with the destinations in its own and the adjacent rows of cells.

    Returns:
        merge: [B, N, C] -> [B, N - r, C], averaging merged sources into their destination.
        unmerge: [B, N - r, C'] -> [B, N, C'], giving each token its destination's (or its own) row.
    """
    B, N, _ = metric.shape
    if h * w != N:
        raise ValueError(f"metric has {N} tokens but the grid is {h}x{w}")
    if matching not in _MATCHERS:
        raise ValueError(f"matching must be 'local' or 'global', got {matching!r}")
    hs, ws = h // sy, w // sx
    num_dst = hs * ws
    r = min(r, N - num_dst)
    if r <= 0 or num_dst == 0:
        return identity, identity

    with torch.no_grad():
        device = metric.device
        slots = random2d_slots(hs, ws, sx, sy, no_rand=no_rand, generator=generator, device=device)
        dst_tok = _partition(w, sx, sy, slots)
        # Cosine similarity without normalising all N tokens: destinations are normalised (N/(sx*sy) rows),
        # sources are divided by their norm after the max, which does not change their argmax.
        unit_dst = F.normalize(metric.index_select(1, dst_tok), dim=-1)
        best, into_all = _MATCHERS[matching](metric, unit_dst, h, w, sx, sy)
        best = best / metric.norm(dim=-1).clamp_min(1e-12)
        # Destinations never merge: ranked last, so the top r are sources only.
        best.index_fill_(1, dst_tok, float("-inf"))
        order = best.argsort(dim=-1, descending=True)  # [B, N]
        num_unm = N - num_dst - r
        merged, kept = order[:, :r], order[:, r : N - num_dst]
        into = into_all.gather(1, merged)  # [B, r] destination number of each merged source

        # row[b, t]: the row of the merged tensor holding token t (unmerged sources first, then destinations).
        row = torch.empty(B, N, dtype=torch.int64, device=device)
        row[:, dst_tok] = torch.arange(num_unm, num_unm + num_dst, device=device)
        row.scatter_(1, kept, torch.arange(num_unm, device=device).expand(B, num_unm))
        row.scatter_(1, merged, into + num_unm)
        # Each destination averages itself and the sources merged into it.
        count = torch.ones(B, num_dst, device=device).scatter_add_(1, into, torch.ones(B, r, device=device))
        inv_count = count.reciprocal().unsqueeze(-1)  # [B, Nd, 1]

    def merge(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(B, num_unm + num_dst, x.shape[-1])
        for b in range(B):
            out[b].index_add_(0, row[b], x[b])
        out[:, num_unm:] *= inv_count.to(x.dtype)
        return out

    def unmerge(x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x[b].index_select(0, row[b]) for b in range(B)])

    return merge, unmerge


def kv_downsample(x: torch.Tensor, w: int, h: int, sx: int, sy: int) -> torch.Tensor:
    """Average-pool tokens over sx*sy cells, for attention keys and values (ToDo, arXiv 2402.13573).

    Args:
        x: [B, N, C] with N = h*w.
    Returns:
        [B, ceil(h/sy) * ceil(w/sx), C]; ragged edge cells average only the tokens they hold.
    """
    B, N, C = x.shape
    if h * w != N:
        raise ValueError(f"x has {N} tokens but the grid is {h}x{w}")
    if sx == 1 and sy == 1:
        return x
    grid = x.view(B, h, w, C).permute(0, 3, 1, 2)  # [B, C, h, w], channels-last in memory
    pooled = F.avg_pool2d(grid, kernel_size=(sy, sx), stride=(sy, sx), ceil_mode=True)
    return pooled.flatten(2).transpose(1, 2)
