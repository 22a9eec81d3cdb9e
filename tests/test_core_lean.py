"""Merging lean enough for a GPU: no host synchronisation in a patched UNet call, no per-sample work, index
tensors shared by blocks, and at most tomesd's kernel-launching operations per merged block.

Operations are counted on the CPU with a `TorchDispatchMode` (`tome_bench.ops`, which loads nothing else of the
benchmark): on a GPU each non-view operation launches a kernel and each `_local_scalar_dense`/`nonzero`/`item`
stops the host until the device catches up.
"""

from __future__ import annotations

import types

import pytest
import torch

import tome_core
from tome_bench.ops import count_ops
from tome_core.merge import (
    PARTITIONS_PER_GRID,
    grid_layout,
    hashed_partition,
    hashed_slots,
    partition,
    random_partitions,
)

from tiny_models import PipelineLike, build_unet, forward, forward_unet, make_inputs

# Every way the core can decide partitions and the step window.
SYNC_FREE_CONFIGS = {
    "defaults (random partitions)": {},
    "fixed partitions": {"use_rand": False},
    "local matching, every target, one plan per stack": {
        "merge_crossattn": True,
        "merge_mlp": True,
        "mlp_ratio": 0.3,
        "share_plan": True,
    },
    "global matching": {"matching": "global"},
    "kv mode": {"mode": "kv"},
    "kv mode, cross-attention and MLP merged from level 2": {
        "mode": "kv",
        "merge_crossattn": True,
        "merge_mlp": True,
        "mlp_min_downsample": 2,
        "share_plan": True,
    },
}


def _ops(model: object, inputs) -> tuple:
    counts, _ = count_ops(lambda: forward(model, inputs))
    return counts


@pytest.mark.parametrize("kind", ["diffusers_sd1", "ldm_sd1", "diffusers_sdxl"])
@pytest.mark.parametrize("fields", list(SYNC_FREE_CONFIGS.values()), ids=list(SYNC_FREE_CONFIGS))
def test_patched_call_never_syncs(kind: str, fields: dict) -> None:
    unet = build_unet(kind)
    inputs = make_inputs(2, 16, 16)
    base = _ops(unet, inputs)
    assert base.syncs == 0, base.sync_names()  # the model itself is sync-free, so any sync would be ours
    tome_core.apply_patch(unet, **fields, max_downsample=8)
    forward(unet, inputs)  # first call builds the per-grid layouts
    ours = _ops(unet, inputs)
    assert tome_core.stats(unet).applied > 0
    tome_core.remove_patch(unet)
    assert ours.syncs == 0, ours.sync_names()


def test_step_window_from_set_step_never_syncs() -> None:
    unet = build_unet("diffusers_sd1")
    inputs = make_inputs(2, 16, 16)
    tome_core.apply_patch(unet, step_start=0.2, step_end=0.8)
    for step, merges in ((1, False), (5, True)):
        tome_core.set_step(unet, step, 10)
        tome_core.reset_stats(unet)
        counts = _ops(unet, inputs)
        assert counts.syncs == 0, counts.sync_names()
        assert bool(tome_core.stats(unet).applied) == merges
    tome_core.remove_patch(unet)


def test_step_window_from_a_pipeline_scheduler_never_syncs() -> None:
    # A diffusers pipeline's scheduler knows its step as a host integer: no timestep is read back.
    scheduler = types.SimpleNamespace(timesteps=torch.arange(999, 0, -100), step_index=None)
    pipe = PipelineLike(build_unet("diffusers_sd1"))
    pipe.scheduler = scheduler
    inputs = make_inputs(2, 16, 16)
    tome_core.apply_patch(pipe, step_start=0.5)
    for step_index, merges in ((None, False), (2, False), (5, True), (9, True)):
        scheduler.step_index = step_index
        tome_core.reset_stats(pipe)
        counts = _ops(pipe, inputs)
        assert counts.syncs == 0, counts.sync_names()
        assert bool(tome_core.stats(pipe).applied) == merges, step_index
    tome_core.remove_patch(pipe)


def test_bare_unet_step_window_without_a_step_reads_the_timestep() -> None:
    # The documented fallback: nothing tells the step, so the timestep is read back (one sync per call).
    unet = build_unet("diffusers_sd1")
    tome_core.apply_patch(unet, step_end=0.5)
    counts = _ops(unet, make_inputs(2, 16, 16))
    tome_core.remove_patch(unet)
    assert counts.syncs == 1, counts.sync_names()


@pytest.mark.parametrize("fields", [{}, {"merge_crossattn": True, "merge_mlp": True, "share_plan": True}])
def test_ops_do_not_grow_with_the_batch(fields: dict) -> None:
    unet = build_unet("diffusers_sd1")
    added = {}
    for batch in (1, 2, 8):
        inputs = make_inputs(batch, 16, 16)
        base = _ops(unet, inputs)
        tome_core.apply_patch(unet, **fields)
        forward(unet, inputs)
        added[batch] = (_ops(unet, inputs) - base).total
        tome_core.remove_patch(unet)
    assert added[1] == added[2] == added[8] > 0, added


@pytest.fixture
def tomesd():
    return pytest.importorskip("tomesd", reason="tomesd 0.1.3 is in requirements-nodeps.txt")


def _per_block(counts, blocks: int) -> float:
    return counts.launching / blocks


def test_at_most_tomesds_launching_ops_per_merged_block(tomesd) -> None:
    # tomesd's defaults (self-attention, level 1) against ours with the same targets, both at batch 2.
    unet = build_unet("diffusers_sd1")
    inputs = make_inputs(2, 32, 32)
    base = _ops(unet, inputs)

    tome_core.apply_patch(unet, ratio=0.5, max_downsample=1)
    forward(unet, inputs)
    tome_core.reset_stats(unet)
    ours = _ops(unet, inputs) - base
    merged_blocks = tome_core.stats(unet).applied
    tome_core.remove_patch(unet)

    torch.manual_seed(0)
    tomesd.apply_patch(unet, ratio=0.5, max_downsample=1)
    theirs = _ops(unet, inputs) - base
    tomesd.remove_patch(unet)

    assert merged_blocks == 3
    assert ours.syncs == 0
    assert _per_block(ours, merged_blocks) <= _per_block(theirs, merged_blocks), (ours.names, theirs.names)
    assert ours.total <= theirs.total  # views included


def test_shared_plans_match_once_per_stack_or_level() -> None:
    # The SDXL-like model has stacks of 1 and 2 blocks at level 2 and of 2 and 3 blocks at level 4 (see
    # tiny_models): matching (one topk per plan) runs once per stack of several blocks, and once per level for the
    # level's single-block stacks, instead of once per block.
    unet = build_unet("diffusers_sdxl")
    inputs = make_inputs(2, 16, 16)
    plans = {}
    for share in (False, True):
        tome_core.apply_patch(unet, share_plan=share, merge_mlp=True)
        forward(unet, inputs)
        tome_core.reset_stats(unet)
        counts = _ops(unet, inputs)
        plans[share] = counts.names["topk"]
        applied = tome_core.stats(unet).applied
        tome_core.remove_patch(unet)
        assert applied == 11
    stacks = [m for m in unet.modules() if hasattr(m, "transformer_blocks")]
    levels = dict(tome_core.transformer_blocks(unet))
    single_levels = {levels[m.transformer_blocks[0]] for m in stacks if len(m.transformer_blocks) == 1}
    expected = sum(len(m.transformer_blocks) > 1 for m in stacks) + len(single_levels)
    assert plans == {False: 11, True: expected} and expected < 11


def test_a_shared_stack_merges_once_and_unmerges_once() -> None:
    # With shared plans a stack of whole-merged blocks stays merged from its first block to its last: one merge
    # (bmm) and two batched products (residual, unmerge) per stack, not per block.
    unet = build_unet("diffusers_sdxl")
    inputs = make_inputs(2, 16, 16)
    tome_core.apply_patch(unet, share_plan=True, merge_crossattn=True, merge_mlp=True, max_downsample=4)
    forward(unet, inputs)
    counts = _ops(unet, inputs)
    tome_core.remove_patch(unet)
    stacks = sum(1 for m in unet.modules() if hasattr(m, "transformer_blocks"))
    blocks = sum(tome_core.blocks_per_level(unet).values())
    assert stacks < blocks
    modules = [m for m in unet.modules() if hasattr(m, "transformer_blocks")]
    levels = dict(tome_core.transformer_blocks(unet))
    plans = sum(len(m.transformer_blocks) > 1 for m in modules)
    plans += len({levels[m.transformer_blocks[0]] for m in modules if len(m.transformer_blocks) == 1})
    assert counts.names["baddbmm"] == 2 * stacks
    assert counts.names["bmm"] == stacks + plans  # one per stack (the merge), one per plan (the match)


def test_shared_plan_changes_the_output_less_than_it_saves() -> None:
    # Sharing is a different approximation, not a no-op: later blocks merge with the first block's plan.
    unet = build_unet("diffusers_sdxl")
    inputs = make_inputs(2, 16, 16)
    reference = forward_unet(unet, inputs)
    outs = {}
    for share in (False, True):
        tome_core.apply_patch(unet, share_plan=share)
        outs[share] = forward_unet(unet, inputs)
        tome_core.remove_patch(unet)
    assert not torch.equal(outs[True], outs[False])
    assert not torch.equal(outs[True], reference)


def test_mlp_ratio_merges_the_feed_forward_at_its_own_ratio() -> None:
    unet = build_unet("diffusers_sd1")
    block = next(m for m in unet.modules() if type(m).__name__ == "BasicTransformerBlock")
    seen: dict[str, int] = {}

    def record(name: str):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            seen[name] = x.shape[1]

        return hook

    tome_core.apply_patch(unet, ratio=0.5, merge_mlp=True, mlp_ratio=0.25, max_downsample=1)
    # Read where the projections run: the token counts attention and the feed-forward really compute on.
    handles = [block.attn1.to_q.register_forward_pre_hook(record("attn1"), with_kwargs=True)]
    handles.append(block.ff.net[0].register_forward_pre_hook(record("ff"), with_kwargs=True))
    forward_unet(unet, make_inputs(2, 16, 16))
    for handle in handles:
        handle.remove()
    tome_core.remove_patch(unet)
    assert seen == {"attn1": 256 - 128, "ff": 256 - 64}


@pytest.mark.parametrize("mode", ["merge", "kv"])
def test_mlp_min_downsample_merges_the_feed_forward_only_from_that_level(mode: str) -> None:
    unet = build_unet("diffusers_sd1")
    blocks = [m for m in unet.modules() if type(m).__name__ == "BasicTransformerBlock"]
    seen: dict[int, list[int]] = {}

    def record(index: int):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            seen.setdefault(index, []).append(x.shape[1])

        return hook

    tome_core.apply_patch(unet, mode=mode, merge_mlp=True, mlp_ratio=0.5, mlp_min_downsample=2, max_downsample=4)
    handles = [b.ff.net[0].register_forward_pre_hook(record(i), with_kwargs=True) for i, b in enumerate(blocks)]
    forward_unet(unet, make_inputs(2, 16, 16))
    stats = tome_core.stats(unet)
    for handle in handles:
        handle.remove()
    tome_core.remove_patch(unet)
    assert stats is not None and stats.applied == stats.selected
    # The tiny SD1 UNet has blocks at 16x16, 8x8, 4x4 and 2x2 (levels 1-8): levels 2 and 4 merge the feed-forward.
    tokens = {n for sizes in seen.values() for n in sizes}
    assert tokens == {256, 64 - 32, 16 - 8, 4}  # the middle block (level 8) is beyond max_downsample
    level1 = [i for i, sizes in seen.items() if sizes == [256]]
    assert level1 and len(level1) < len(blocks)


def test_mlp_min_downsample_above_every_block_selects_none() -> None:
    unet = build_unet("diffusers_sd1")
    tome_core.apply_patch(unet, merge_attn=False, merge_mlp=True, mlp_min_downsample=8, max_downsample=4)
    stats = tome_core.stats(unet)
    tome_core.remove_patch(unet)
    assert stats is not None and stats.selected == 0


def test_mlp_ratio_zero_leaves_the_feed_forward_whole() -> None:
    config = tome_core.TomeConfig(merge_attn=False, merge_mlp=True, mlp_ratio=0.0)
    assert config.is_noop
    assert not tome_core.TomeConfig(merge_attn=False, merge_mlp=True, mlp_ratio=0.1, ratio=0.0).is_noop


def test_each_step_picks_one_of_the_grids_random_partitions() -> None:
    layout = grid_layout(16, 16, 2, 2)
    table = random_partitions(layout, seed=5)
    assert torch.equal(table.dst_tok, random_partitions(layout, seed=5).dst_tok)
    assert not torch.equal(table.dst_tok, random_partitions(layout, seed=6).dst_tok)
    assert len({tuple(row.tolist()) for row in table.dst_tok}) == table.count == PARTITIONS_PER_GRID
    # Timesteps 1000 apart in the key (integer timesteps) still reach every partition.
    picked = {tuple(table.pick(torch.tensor([t * 1000])).dst_tok.tolist()) for t in range(0, 1000, 20)}
    assert len(picked) == table.count
    part = table.pick(torch.tensor([321000]))
    assert torch.equal(part.dst_tok, table.pick(torch.tensor([321000])).dst_tok)
    assert torch.equal(part.dst_number[part.dst_tok], torch.arange(layout.num_dst))


def test_hashed_slots_spread_over_the_cell_and_match_the_table() -> None:
    layout = grid_layout(64, 64, 4, 4)
    draws = hashed_slots(layout.num_dst, 16, torch.arange(200).view(200, 1), seed=5)  # [200, 256]
    counts = torch.bincount(draws.reshape(-1), minlength=16)
    assert counts.min() > 0.9 * counts.float().mean()
    # Neighbouring cells and neighbouring keys are unrelated: each equal about 1 time in 16.
    assert abs(float((draws[:, 1:] == draws[:, :-1]).float().mean()) - 1 / 16) < 0.01
    assert abs(float((draws[1:] == draws[:-1]).float().mean()) - 1 / 16) < 0.01
    # Row k of the eager table is the partition a compiled graph hashes for key k.
    table = random_partitions(layout, seed=5)
    for k in (0, 7, 16):
        part = partition(layout, hashed_slots(layout.num_dst, 16, torch.tensor([k]), seed=5))
        assert torch.equal(table.pick(torch.tensor([k])).dst_tok, part.dst_tok)
    for k in (7, 321000):  # what a compiled graph runs, without the table
        hashed = hashed_partition(layout, torch.tensor([k]), seed=5)
        assert torch.equal(table.pick(torch.tensor([k])).dst_number, hashed.dst_number)
