"""What makes the core cheaper than tomesd: local matching, key/value pooling, shared partitions, the step window."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import pytest
import torch

import tome_core
from tome_core.merge import bipartite_soft_matching_random2d, kv_downsample

from tiny_models import build_unet, forward_unet, make_inputs


def _rows_of_merges(metric: torch.Tensor, h: int, w: int, sx: int, sy: int, r: int) -> list[tuple[int, int]]:
    """(source cell row, destination cell row) for every source that `local` matching merged."""
    merge, _ = bipartite_soft_matching_random2d(metric, w, h, sx, sy, r, no_rand=True, matching="local")
    # Merging the identity shows the plan: row m of merge(I) weighs the tokens averaged into merged token m.
    rows = merge(torch.eye(h * w, dtype=torch.float64).unsqueeze(0))[0]  # [M, N]
    pairs = []
    for row in rows:
        members = torch.nonzero(row).flatten().tolist()
        if len(members) < 2:
            continue
        dst = next(t for t in members if (t // w) % sy == 0 and (t % w) % sx == 0)
        pairs += [((t // w) // sy, (dst // w) // sy) for t in members if t != dst]
    return pairs


@pytest.mark.parametrize(("h", "w"), [(16, 16), (13, 19)])
def test_local_matching_stays_within_its_band_of_cells(h: int, w: int) -> None:
    metric = torch.randn(1, h * w, 8, generator=torch.Generator().manual_seed(3))
    pairs = _rows_of_merges(metric, h, w, 2, 2, int(h * w * 0.5))
    assert pairs, "nothing merged"
    assert all(src == dst for src, dst in pairs)  # the row below the last band (h = 13) stays unmerged


def test_global_matching_may_cross_the_whole_grid() -> None:
    # A source identical to a far destination and unlike its neighbours merges there under global matching.
    h = w = 8
    metric = torch.randn(1, h * w, 16, generator=torch.Generator().manual_seed(0))
    metric[0, 7 * w + 1] = metric[0, 0]  # bottom row source, copy of the top-left destination
    merge, _ = bipartite_soft_matching_random2d(metric, w, h, 2, 2, 1, no_rand=True, matching="global")
    eye = torch.eye(h * w).unsqueeze(0)
    merged_row = next(row for row in merge(eye)[0] if int((row > 0).sum()) == 2)
    assert merged_row[0] > 0 and merged_row[7 * w + 1] > 0


def test_kv_downsample_spreads_ragged_cells_evenly() -> None:
    x = torch.arange(15.0).view(1, 15, 1)  # a 3 x 5 grid: rows 0-4, 5-9, 10-14
    # 2x2 cells do not divide it: 2 x 3 tokens resampled nearest-exact, rows 0 and 2, columns 0, 2 and 4 (the
    # corners and the middle, not a corner cell twice).
    assert kv_downsample(x, 5, 3, 2, 2).flatten().tolist() == [0.0, 2.0, 4.0, 10.0, 12.0, 14.0]


@contextlib.contextmanager
def projected_tokens(attn: torch.nn.Module) -> Iterator[list[tuple[int, int]]]:
    """(tokens projected to queries, tokens projected to keys) of each call: what attention really computes on."""
    seen: list[tuple[int, int]] = []
    queries: list[int] = []
    handles = [
        attn.to_q.register_forward_pre_hook(lambda module, args: queries.append(args[0].shape[1])),
        attn.to_k.register_forward_pre_hook(lambda module, args: seen.append((queries.pop(), args[0].shape[1]))),
    ]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def test_kv_mode_keeps_queries_and_the_sdpa_processor() -> None:
    unet = build_unet("diffusers_sd1")
    processors = {type(p).__name__ for p in unet.attn_processors.values()}
    block = next(m for m in unet.modules() if type(m).__name__ == "BasicTransformerBlock")
    tome_core.apply_patch(unet, mode="kv", max_downsample=1)
    with projected_tokens(block.attn1) as seen:
        forward_unet(unet, make_inputs(2, 16, 24))
    tome_core.remove_patch(unet)
    assert seen == [(16 * 24, 8 * 12)]  # every query kept, keys/values pooled 2x2
    assert {type(p).__name__ for p in unet.attn_processors.values()} == processors == {"AttnProcessor2_0"}


def test_kv_mode_with_mlp_merging_pools_self_attention_and_merges_the_feed_forward() -> None:
    unet = build_unet("diffusers_sd1")
    ff_tokens: list[int] = []
    block = next(m for m in unet.modules() if type(m).__name__ == "BasicTransformerBlock")
    inputs = make_inputs(2, 16, 24)
    reference = forward_unet(unet, inputs)
    tome_core.apply_patch(unet, mode="kv", merge_mlp=True, mlp_ratio=0.5, max_downsample=1)
    handle = block.ff.net[0].register_forward_pre_hook(lambda module, args: ff_tokens.append(args[0].shape[1]))
    with projected_tokens(block.attn1) as seen:
        out = forward_unet(unet, inputs)
    handle.remove()
    stats = tome_core.stats(unet)
    tome_core.remove_patch(unet)
    assert stats is not None
    assert seen == [(16 * 24, 8 * 12)]  # every query kept, keys/values pooled 2x2
    assert ff_tokens == [16 * 24 - 16 * 24 // 2]  # the feed-forward on half the tokens
    assert stats.applied == stats.selected > 0
    assert out.shape == reference.shape and not torch.equal(out, reference)
    assert torch.equal(forward_unet(unet, inputs), reference)


@pytest.mark.parametrize("mode", ["merge", "kv"])
def test_cond_and_uncond_in_separate_calls_match_one_batch(mode: str) -> None:
    # Partitions are keyed on the timestep, not on the call: a sampler that runs cond and uncond as two
    # batches gets what it would get from one batch (tomesd turns randomness off for odd batches instead).
    unet = build_unet("diffusers_sd1")
    inputs = make_inputs(2, 16, 16)
    inputs = dataclasses.replace(inputs, t=torch.full_like(inputs.t, 321.0))
    tome_core.apply_patch(unet, ratio=0.5, mode=mode, seed=7)
    both = forward_unet(unet, inputs)
    halves = [
        forward_unet(
            unet,
            dataclasses.replace(
                inputs, **{f: getattr(inputs, f)[i : i + 1] for f in ("x", "t", "context", "text_embeds", "time_ids")}
            ),
        )
        for i in range(2)
    ]
    tome_core.remove_patch(unet)
    torch.testing.assert_close(torch.cat(halves), both, rtol=1e-4, atol=1e-5)


def test_partitions_vary_with_seed_and_step_but_not_between_calls() -> None:
    unet = build_unet("diffusers_sd1")
    inputs = make_inputs(2, 16, 16)
    outs = {}
    for seed in (1, 2):
        tome_core.apply_patch(unet, ratio=0.5, seed=seed)
        outs[seed] = forward_unet(unet, inputs)
        assert torch.equal(forward_unet(unet, inputs), outs[seed])
    tome_core.remove_patch(unet)
    assert not torch.equal(outs[1], outs[2])


def test_step_window_counts_sampler_steps_not_unet_calls() -> None:
    # A second-order sampler calls the UNet twice per step; both calls report the same step and agree.
    unet = build_unet("diffusers_sd1")
    inputs = make_inputs(2, 16, 16)
    reference = forward_unet(unet, inputs)
    tome_core.apply_patch(unet, ratio=0.5, step_end=0.5)
    outputs = []
    for step in range(4):
        tome_core.set_step(unet, step, 4)
        outputs.append([forward_unet(unet, inputs) for _ in range(2)])
    tome_core.remove_patch(unet)
    for step, (first, second) in enumerate(outputs):
        assert torch.equal(first, second)
        assert torch.equal(first, reference) == (step >= 2)


def test_describe_reports_auto_levels() -> None:
    auto = tome_core.TomeConfig()  # max downsample "auto" (no config: the default preset's levels)
    sd1 = {i.level: i for i in tome_core.describe(build_unet("diffusers_sd1"), 512, 512, auto)}
    assert sd1[1].merging == sd1[1].blocks and sd1[2].merging == 0
    assert (sd1[1].tokens, sd1[1].tokens_after) == (4096, 2048)
    xl = {i.level: i for i in tome_core.describe(build_unet("diffusers_sdxl"), 1024, 1024, auto)}
    assert 1 not in xl and xl[2].merging == xl[2].blocks and xl[4].merging == xl[4].blocks
