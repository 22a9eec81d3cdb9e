"""Property tests of the merge kernels in tome_core.merge (hypothesis, small sizes, CPU)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tome_core.merge import bipartite_soft_matching_random2d, kv_downsample, kv_tokens, merged_tokens

MATCHINGS = ("global", "local")


@st.composite
def grids(draw: st.DrawFn, max_side: int = 10) -> dict:
    h = draw(st.integers(1, max_side))
    w = draw(st.integers(1, max_side))
    return {
        "b": draw(st.integers(1, 3)),
        "h": h,
        "w": w,
        "sx": draw(st.integers(1, 4)),
        "sy": draw(st.integers(1, 4)),
        "ratio": draw(st.floats(0.0, 1.0)),
        "matching": draw(st.sampled_from(MATCHINGS)),
        "no_rand": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def plan(metric: torch.Tensor, g: dict, r: int | None = None):
    n = g["h"] * g["w"]
    r = int(n * g["ratio"]) if r is None else r
    generator = torch.Generator().manual_seed(g["seed"])
    return bipartite_soft_matching_random2d(
        metric, g["w"], g["h"], g["sx"], g["sy"], r, no_rand=g["no_rand"], generator=generator, matching=g["matching"]
    )


def removed(g: dict, r: int | None = None) -> int:
    """How many tokens merging removes: r, capped by the number of sources; none without destinations. Local
    matching merges r/N of each band of cells (sy token rows) and leaves the rows below the last band: r at most."""
    n = g["h"] * g["w"]
    r = int(n * g["ratio"]) if r is None else r
    num_dst = (g["h"] // g["sy"]) * (g["w"] // g["sx"])
    if num_dst == 0 or r <= 0:
        return 0
    if g["matching"] == "local":
        return n - merged_tokens(g["h"], g["w"], g["sx"], g["sy"], r / n, "local")
    return min(r, n - num_dst)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def cell_of(y: int, x: int, g: dict) -> tuple[int, int]:
    """The whole cell a token belongs to; tokens right of/below the last whole cell join the nearest one."""
    hs, ws = g["h"] // g["sy"], g["w"] // g["sx"]
    return min(y // g["sy"], hs - 1), min(x // g["sx"], ws - 1)


def groups(g: dict) -> list[list[set[int]]]:
    """Per batch element, the partition of tokens into merge groups, read off merging one-hot tokens."""
    n = g["h"] * g["w"]
    metric = randn(g["b"], n, 5, seed=g["seed"])
    merge, unmerge = plan(metric, g)
    onehot = torch.eye(n, dtype=torch.float64).expand(g["b"], n, n)
    merged = merge(onehot)  # each row: 1/|group| at each member
    out = []
    for b in range(g["b"]):
        rows = [set(torch.nonzero(row).flatten().tolist()) for row in merged[b]]
        for row, members in zip(merged[b], rows):
            assert torch.allclose(
                row[sorted(members)], torch.full((len(members),), 1.0 / len(members), dtype=row.dtype)
            )
        out.append(rows)
        # unmerge hands every token its group's row
        back = unmerge(merged)[b]
        for members, row in zip(rows, merged[b]):
            for t in members:
                assert torch.equal(back[t], row)
    return out


# ---------------------------------------------------------------------------------------------- shapes


@given(g=grids(), c=st.integers(1, 6), c_out=st.integers(1, 6))
def test_shapes(g: dict, c: int, c_out: int) -> None:
    n = g["h"] * g["w"]
    metric = randn(g["b"], n, c, seed=g["seed"])
    merge, unmerge = plan(metric, g)
    kept = n - removed(g)
    merged = merge(metric)
    assert merged.shape == (g["b"], kept, c)
    assert merged.dtype == metric.dtype
    assert unmerge(merged).shape == (g["b"], n, c)
    # unmerge takes any channel count (it runs on the attention/MLP output)
    assert unmerge(randn(g["b"], kept, c_out, seed=1)).shape == (g["b"], n, c_out)


@given(g=grids())
def test_r_zero_is_identity(g: dict) -> None:
    n = g["h"] * g["w"]
    x = randn(g["b"], n, 4, seed=g["seed"])
    merge, unmerge = plan(x, g, r=0)
    assert torch.equal(merge(x), x)
    assert torch.equal(unmerge(x), x)


@given(g=grids())
def test_groups_partition_tokens(g: dict) -> None:
    n = g["h"] * g["w"]
    for rows in groups(g):
        assert len(rows) == n - removed(g)
        assert sorted(t for members in rows for t in members) == list(range(n))


@given(g=grids())
def test_each_group_has_one_destination(g: dict) -> None:
    """Top-left destinations: every merged group holds exactly one; local matching stays within a band of cells.

    (merge.py's contract for "local", the band merge: a token merges only into a destination of its own row of
    cells; tokens right of the last whole cell belong to their row's band, those below the last band stay alone.)
    """
    g = {**g, "no_rand": True}
    hs, ws = g["h"] // g["sy"], g["w"] // g["sx"]
    dst = {cy * g["sy"] * g["w"] + cx * g["sx"] for cy in range(hs) for cx in range(ws)}
    for rows in groups(g):
        for members in rows:
            if len(members) == 1:
                continue
            heads = members & dst
            assert len(heads) == 1, (members, dst)
            if g["matching"] == "local":
                (head,) = heads
                hy, _ = cell_of(head // g["w"], head % g["w"], g)
                for t in members:
                    ty, _ = cell_of(t // g["w"], t % g["w"], g)
                    assert ty == hy, (t, head)
        # destinations are never merged away: each stays in a group of its own making
        assert sum(len(members & dst) for members in rows) == len(dst)


# ---------------------------------------------------------------------------------------------- values


@given(g=grids(), c=st.integers(3, 8))
def test_merge_unmerge_exact_on_cell_constant_tokens(g: dict, c: int) -> None:
    """Tokens equal within each cell (edge tokens copy the nearest cell) merge only with equals: lossless.

    The match score is the tokens' correlation, so the cells' values are one-hot (scaled and shifted at random):
    random vectors of a few channels can correlate as well as equal ones, up to rounding (h=2, w=9, sy=2, c=3)."""
    hs, ws = g["h"] // g["sy"], g["w"] // g["sx"]
    if hs == 0 or ws == 0:
        return
    c += hs * ws
    scale, shift = randn(2, g["b"], hs, ws, 1, seed=g["seed"] + 1)
    onehot = torch.eye(c)[torch.randperm(c, generator=torch.Generator().manual_seed(g["seed"]))[: hs * ws]]
    values = onehot.view(1, hs, ws, c) * (scale.abs() + 0.5) + shift
    x = torch.empty(g["b"], g["h"], g["w"], c)
    for y in range(g["h"]):
        for xx in range(g["w"]):
            cy, cx = cell_of(y, xx, g)
            x[:, y, xx] = values[:, cy, cx]
    x = x.reshape(g["b"], g["h"] * g["w"], c)
    merge, unmerge = plan(x, g)
    torch.testing.assert_close(unmerge(merge(x)), x, atol=1e-6, rtol=1e-6)


@given(g=grids())
def test_merge_is_linear_and_averages(g: dict) -> None:
    n = g["h"] * g["w"]
    metric = randn(g["b"], n, 4, seed=g["seed"])
    merge, unmerge = plan(metric, g)
    x, y = randn(g["b"], n, 3, seed=2), randn(g["b"], n, 3, seed=3)
    torch.testing.assert_close(merge(2.0 * x + y), 2.0 * merge(x) + merge(y), atol=1e-5, rtol=1e-5)
    ones = torch.ones(g["b"], n, 3)
    torch.testing.assert_close(merge(ones), torch.ones(g["b"], n - removed(g), 3))
    torch.testing.assert_close(unmerge(merge(ones)), ones)


@given(g=grids(), zero_rows=st.integers(0, 100))
def test_zero_tokens_give_no_nan(g: dict, zero_rows: int) -> None:
    n = g["h"] * g["w"]
    x = torch.zeros(g["b"], n, 4)
    merge, unmerge = plan(x, g)
    out = unmerge(merge(x))
    assert not torch.isnan(merge(x)).any()
    assert torch.equal(out, x)
    # some zero tokens among others
    x = randn(g["b"], n, 4, seed=g["seed"])
    x[:, : min(zero_rows, n)] = 0
    merge, unmerge = plan(x, g)
    assert torch.isfinite(merge(x)).all()
    assert torch.isfinite(unmerge(merge(x))).all()


@given(g=grids())
def test_global_rng_untouched(g: dict) -> None:
    n = g["h"] * g["w"]
    x = randn(g["b"], n, 4, seed=g["seed"])
    state = torch.get_rng_state()
    merge, unmerge = bipartite_soft_matching_random2d(
        x, g["w"], g["h"], g["sx"], g["sy"], int(n * g["ratio"]), no_rand=False, matching=g["matching"]
    )
    unmerge(merge(x))
    assert torch.equal(torch.get_rng_state(), state)


@given(g=grids())
def test_same_generator_seed_same_plan(g: dict) -> None:
    n = g["h"] * g["w"]
    x = randn(g["b"], n, 4, seed=g["seed"])
    a = plan(x, g)[0](x)
    b = plan(x, g)[0](x)
    assert torch.equal(a, b)


@given(g=grids(max_side=12), c=st.integers(2, 6))
def test_global_matching_agrees_with_tomesd(g: dict, c: int) -> None:
    """Top-left destinations, global matching: the same groups as tomesd 0.1.3's kernel (the reference)."""
    tomesd_merge = pytest.importorskip("tomesd.merge")
    n = g["h"] * g["w"]
    r = int(n * g["ratio"])
    metric = randn(g["b"], n, c, seed=g["seed"]) + 0.01
    ours_m, ours_u = bipartite_soft_matching_random2d(metric, g["w"], g["h"], g["sx"], g["sy"], r, no_rand=True)
    hs, ws = g["h"] // g["sy"], g["w"] // g["sx"]
    if hs == 0 or ws == 0:
        assert torch.equal(ours_m(metric), metric)
        return
    ref_m, ref_u = tomesd_merge.bipartite_soft_matching_random2d(
        metric, g["w"], g["h"], g["sx"], g["sy"], r, no_rand=True
    )
    x = randn(g["b"], n, 3, seed=7)
    torch.testing.assert_close(ours_u(ours_m(x)), ref_u(ref_m(x)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("matching", MATCHINGS)
def test_dtypes_preserved(dtype: torch.dtype, matching: str) -> None:
    h, w = 6, 9
    x = randn(2, h * w, 8, seed=0).to(dtype)
    merge, unmerge = bipartite_soft_matching_random2d(x, w, h, 2, 2, 20, no_rand=False, matching=matching)
    merged = merge(x)
    kept = h * w - removed({"h": h, "w": w, "sx": 2, "sy": 2, "ratio": 0.0, "matching": matching}, 20)
    assert merged.dtype == dtype and merged.shape == (2, kept, 8)
    assert unmerge(merged).dtype == dtype
    assert torch.isfinite(unmerge(merged).float()).all()


def test_bad_grid_raises() -> None:
    x = torch.randn(1, 10, 4)
    with pytest.raises(ValueError):
        bipartite_soft_matching_random2d(x, 3, 3, 2, 2, 2)
    with pytest.raises(ValueError):
        bipartite_soft_matching_random2d(torch.randn(1, 16, 4), 4, 4, 2, 2, 4, matching="nearest")


# ---------------------------------------------------------------------------------------------- kv_downsample


@given(
    b=st.integers(1, 3),
    h=st.integers(1, 11),
    w=st.integers(1, 11),
    sx=st.integers(1, 4),
    sy=st.integers(1, 4),
    c=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_kv_downsample_keeps_each_cells_centre_token(
    b: int, h: int, w: int, sx: int, sy: int, c: int, seed: int
) -> None:
    """One token per cell: where the cells divide the grid the one at its centre (row sy // 2, column sx // 2 of
    the cell), as ToDo's nearest-exact subsampling picks it; on a ragged grid ceil(h/sy) x ceil(w/sx) tokens
    resampled nearest-exact, evenly spread."""
    x = randn(b, h * w, c, seed=seed)
    out = kv_downsample(x, w, h, sx, sy)
    assert out.shape == (b, kv_tokens(h, w, sx, sy), c) and kv_tokens(h, w, sx, sy) == -(-h // sy) * -(-w // sx)
    grid = x.view(b, h, w, c)
    todo = torch.nn.functional.interpolate(
        grid.permute(0, 3, 1, 2), size=(-(-h // sy), -(-w // sx)), mode="nearest-exact"
    )
    assert torch.equal(out, todo.flatten(2).transpose(1, 2))
    if h % sy == 0 and w % sx == 0:
        centres = [grid[:, y, x_] for y in range(sy // 2, h, sy) for x_ in range(sx // 2, w, sx)]
        assert torch.equal(out, torch.stack(centres, dim=1))
    if sx == sy == 1:
        assert torch.equal(out, x)


def test_kv_downsample_bad_grid_raises() -> None:
    with pytest.raises(ValueError):
        kv_downsample(torch.randn(1, 10, 4), 3, 3, 2, 2)
