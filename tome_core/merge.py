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

#: Offsets (dy, dx) of the 3x3 neighbourhood of cells that local matching searches, row-major.
_NEIGHBOURS = tuple((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1))


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


def _partition(h: int, w: int, sx: int, sy: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token indices of destinations [hs*ws] (cell order) and of sources [N - hs*ws] (ascending)."""
    hs, ws = slots.shape
    device = slots.device
    rows = torch.arange(hs, device=device).view(hs, 1) * sy + torch.div(slots, sx, rounding_mode="floor")
    cols = torch.arange(ws, device=device).view(1, ws) * sx + slots % sx
    dst_tok = (rows * w + cols).reshape(-1)
    is_dst = torch.zeros(h * w, dtype=torch.int8, device=device)
    is_dst[dst_tok] = 1
    # A stable sort puts sources first in ascending order without a host sync (unlike nonzero()).
    src_tok = torch.sort(is_dst, stable=True).indices[: h * w - hs * ws]
    return dst_tok, src_tok


def _match_global(
    metric: torch.Tensor, dst_tok: torch.Tensor, src_tok: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All-to-all matching (as tomesd). Returns src token ids [Ns], best score [B, Ns], best dst number [B, Ns]."""
    a = metric.index_select(1, src_tok)  # [B, Ns, C]
    b = metric.index_select(1, dst_tok)  # [B, Nd, C]
    scores = a @ b.transpose(1, 2)  # [B, Ns, Nd]
    node_max, node_idx = scores.max(dim=-1)
    return src_tok, node_max, node_idx


def _neighbour_cells(cy: torch.Tensor, cx: torch.Tensor, hs: int, ws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell numbers [..., 9] of the 3x3 neighbourhood of cells (cy, cx) and whether each lies on the grid."""
    dy = torch.tensor([o[0] for o in _NEIGHBOURS], device=cy.device)
    dx = torch.tensor([o[1] for o in _NEIGHBOURS], device=cy.device)
    ny = cy.unsqueeze(-1) + dy  # [..., 9]
    nx = cx.unsqueeze(-1) + dx
    valid = (ny >= 0) & (ny < hs) & (nx >= 0) & (nx < ws)
    cells = ny.clamp(0, hs - 1) * ws + nx.clamp(0, ws - 1)
    return cells, valid


def _match_local(
    metric: torch.Tensor, h: int, w: int, sx: int, sy: int, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Match each source only against the destinations of its own and the 8 neighbouring cells.

    Cost is O(N * 9 * C) instead of O(N * N/(sx*sy) * C). Returns src token ids [Ns] (in-grid sources in
    cell order, then the ragged right/bottom remainder), best score [B, Ns] and best dst number [B, Ns].
    """
    B, _, C = metric.shape
    hs, ws = slots.shape
    k = sy * sx
    device = metric.device
    cells = hs * ws

    # [B, hs*ws, k, C]: the tokens of each whole cell, one copy of the in-grid part.
    grid = metric.view(B, h, w, C)[:, : hs * sy, : ws * sx]
    grid = grid.reshape(B, hs, sy, ws, sx, C).permute(0, 1, 3, 2, 4, 5).reshape(B, cells, k, C)
    dst = grid.gather(2, slots.view(1, cells, 1, 1).expand(B, cells, 1, C)).view(B, hs, ws, C)
    padded = F.pad(dst, (0, 0, 1, 1, 1, 1))  # [B, hs+2, ws+2, C]
    near = torch.stack(
        [padded[:, 1 + dy : 1 + dy + hs, 1 + dx : 1 + dx + ws] for dy, dx in _NEIGHBOURS], dim=-1
    )  # [B, hs, ws, C, 9]
    scores = grid @ near.view(B, cells, C, 9)  # [B, cells, k, 9]

    cy = torch.arange(hs, device=device).view(hs, 1).expand(hs, ws).reshape(-1)
    cx = torch.arange(ws, device=device).view(1, ws).expand(hs, ws).reshape(-1)
    near_cells, valid = _neighbour_cells(cy, cx, hs, ws)  # [cells, 9]
    scores = scores.masked_fill(~valid.view(1, cells, 1, 9), float("-inf"))

    # The k-1 source slots of each cell skip its destination slot.
    src_slot = torch.arange(k - 1, device=device).view(1, k - 1).expand(cells, k - 1)
    src_slot = src_slot + (src_slot >= slots.view(cells, 1)).long()  # [cells, k-1]
    scores = scores.gather(2, src_slot.view(1, cells, k - 1, 1).expand(B, cells, k - 1, 9))
    node_max, pick = scores.max(dim=-1)  # [B, cells, k-1]
    node_idx = near_cells.view(1, cells, 1, 9).expand(B, cells, k - 1, 9).gather(3, pick.unsqueeze(-1)).squeeze(-1)
    ky = torch.div(src_slot, sx, rounding_mode="floor")
    kx = src_slot % sx
    src_tok = ((cy.view(cells, 1) * sy + ky) * w + cx.view(cells, 1) * sx + kx).reshape(-1)
    node_max = node_max.reshape(B, -1)
    node_idx = node_idx.reshape(B, -1)

    if hs * sy == h and ws * sx == w:
        return src_tok, node_max, node_idx

    # Tokens right of / below the last whole cell: few, so a plain gather is cheap.
    ys = torch.arange(h, device=device).view(h, 1).expand(h, w)
    xs = torch.arange(w, device=device).view(1, w).expand(h, w)
    outside = ((ys >= hs * sy) | (xs >= ws * sx)).reshape(-1)
    rem_tok = torch.sort(outside.to(torch.int8), stable=True, descending=True).indices[: h * w - hs * sy * ws * sx]
    ry = (rem_tok // w // sy).clamp(max=hs - 1)
    rx = (rem_tok % w // sx).clamp(max=ws - 1)
    rem_cells, rem_valid = _neighbour_cells(ry, rx, hs, ws)  # [R, 9]
    dst_flat = dst.view(B, cells, C)
    cand = dst_flat.index_select(1, rem_cells.reshape(-1)).view(B, -1, 9, C)  # [B, R, 9, C]
    rem_scores = torch.einsum("brc,brkc->brk", metric.index_select(1, rem_tok), cand)
    rem_scores = rem_scores.masked_fill(~rem_valid.unsqueeze(0), float("-inf"))
    rem_max, rem_pick = rem_scores.max(dim=-1)
    rem_idx = rem_cells.unsqueeze(0).expand(B, -1, 9).gather(2, rem_pick.unsqueeze(-1)).squeeze(-1)
    return (
        torch.cat([src_tok, rem_tok]),
        torch.cat([node_max, rem_max], dim=1),
        torch.cat([node_idx, rem_idx], dim=1),
    )


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
    slots: torch.Tensor | None = None,
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
            "local" only with the destinations of the 3x3 neighbouring cells.
        slots: precomputed [h//sy, w//sx] destination slots, overriding no_rand/generator.

    Returns:
        merge: [B, N, C] -> [B, N - r, C], averaging merged sources into their destination.
        unmerge: [B, N - r, C'] -> [B, N, C'], giving each token its destination's (or its own) row.
    """
    B, N, _ = metric.shape
    if N != h * w:
        raise ValueError(f"metric has {N} tokens but the grid is {h}x{w}")
    hs, ws = h // sy, w // sx
    num_dst = hs * ws
    r = min(r, N - num_dst)
    if r <= 0 or num_dst == 0:
        return identity, identity

    with torch.no_grad():
        if slots is None:
            slots = random2d_slots(hs, ws, sx, sy, no_rand=no_rand, generator=generator, device=metric.device)
        dst_tok, src_tok = _partition(h, w, sx, sy, slots)
        # Zero tokens stay zero instead of turning into NaN (tomesd divides by a zero norm).
        unit = F.normalize(metric, dim=-1)
        if matching == "local":
            src_tok, node_max, node_idx = _match_local(unit, h, w, sx, sy, slots)
        elif matching == "global":
            src_tok, node_max, node_idx = _match_global(unit, dst_tok, src_tok)
        else:
            raise ValueError(f"matching must be 'local' or 'global', got {matching!r}")

        num_src = src_tok.numel()
        num_unm = num_src - r
        order = node_max.argsort(dim=-1, descending=True)  # [B, Ns]
        merged, kept = order[:, :r], order[:, r:]
        into = node_idx.gather(1, merged)  # [B, r] destination number of each merged source
        src_tok_b = src_tok.view(1, num_src).expand(B, num_src)

        # row[b, t]: the row of the merged tensor holding token t (unmerged sources first, then destinations).
        row = torch.empty(B, N, dtype=torch.int64, device=metric.device)
        row.scatter_(1, dst_tok.view(1, num_dst).expand(B, num_dst), torch.arange(num_unm, num_unm + num_dst, device=metric.device).expand(B, num_dst))
        row.scatter_(1, src_tok_b.gather(1, kept), torch.arange(num_unm, device=metric.device).expand(B, num_unm))
        row.scatter_(1, src_tok_b.gather(1, merged), into + num_unm)
        # Each destination averages itself and the sources merged into it.
        count = torch.ones(B, num_dst, device=metric.device).scatter_add_(1, into, torch.ones(B, r, device=metric.device))
        inv_count = count.reciprocal().unsqueeze(-1)  # [B, Nd, 1]

    def merge(x: torch.Tensor) -> torch.Tensor:
        c = x.shape[-1]
        out = x.new_zeros(B, num_unm + num_dst, c)
        out.scatter_add_(1, row.unsqueeze(-1).expand(B, N, c), x)
        out[:, num_unm:] *= inv_count.to(x.dtype)
        return out

    def unmerge(x: torch.Tensor) -> torch.Tensor:
        return x.gather(1, row.unsqueeze(-1).expand(B, N, x.shape[-1]))

    return merge, unmerge


def kv_downsample(x: torch.Tensor, w: int, h: int, sx: int, sy: int) -> torch.Tensor:
    """Average-pool tokens over sx*sy cells, for attention keys and values (ToDo, arXiv 2402.13573).

    Args:
        x: [B, N, C] with N = h*w.
    Returns:
        [B, ceil(h/sy) * ceil(w/sx), C]; ragged edge cells average only the tokens they hold.
    """
    B, N, C = x.shape
    if N != h * w:
        raise ValueError(f"x has {N} tokens but the grid is {h}x{w}")
    if sx == 1 and sy == 1:
        return x
    grid = x.view(B, h, w, C).permute(0, 3, 1, 2)  # [B, C, h, w], channels-last in memory
    pooled = F.avg_pool2d(grid, kernel_size=(sy, sx), stride=(sy, sx), ceil_mode=True)
    return pooled.flatten(2).transpose(1, 2)
