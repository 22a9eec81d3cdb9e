"""Words equal behaviour (issue 39): what `describe`, the config's words (`describe_config`, a preset's details and
hint), `unmerged_levels` and `stats` say each level and block does is what the blocks really ran.

The UNets have the real SD1.5 and SDXL layouts (diffusers: `tome_bench.archs`' configs; ldm: SD1.5's v1 config and
an SDXL-shaped one) at a few channels' width, so that a call at a small latent takes milliseconds on a CPU: what a
block does depends on where it sits and which modules it has, not on its width. The test's own forward pre-hooks
count the tokens each block's norm1 (the block's input), self-attention's queries and keys/values,
cross-attention's queries and the feed-forward received: what ran, independently of the patch's bookkeeping.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

import tome_core
from tome_core import TomeConfig, get_preset, presets
from tome_core.words import FAMILY_LABELS, describe_config, preset_details, preset_hint, unmerged_levels

#: Image sizes in pixels (width, height): one where every selected level's grid holds the largest cells (8x8 at SD's
#: level 4, 4x4 at its level 8), one too small for some (a 4x2 grid at level 4); the diffusers UNets also run a size
#: whose grids round up (a latent of 25x17).
LARGE, SMALL, ODD = (320, 256), (128, 64), (200, 136)
CONTEXT = 32  # the text states' width

PARTS = ("block", "attn1", "kv", "attn2", "ff")  # norm1, attn1's queries, attn1's keys/values, attn2, ff


def _seeded(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build().eval().requires_grad_(False)


def _diffusers(arch: str) -> nn.Module:
    from diffusers import UNet2DConditionModel

    from tome_bench import archs

    narrow = {"cross_attention_dim": CONTEXT, "attention_head_dim": 2}
    narrow["block_out_channels"] = (32, 64, 64, 64) if arch == "sd15" else (32, 64, 64)
    return _seeded(lambda: UNet2DConditionModel(**{**archs.get_arch(arch).config, **narrow}))


def _ldm(xl: bool) -> nn.Module:
    from ldm.modules.diffusionmodules.openaimodel import UNetModel

    # SD1.5's v1-inference.yaml; the SDXL-shaped one: no attention at level 1, stacks of 2 at levels 2 and 4 (ldm
    # takes one depth for every level: 10 blocks at level 2 and 12 at level 4, "auto" picks both as on SDXL).
    common = {"in_channels": 4, "out_channels": 4, "model_channels": 32, "num_res_blocks": 2, "legacy": False}
    sd15 = {"attention_resolutions": (4, 2, 1), "channel_mult": (1, 2, 4, 4), "num_heads": 8, "context_dim": CONTEXT}
    sdxl = {"attention_resolutions": (4, 2), "channel_mult": (1, 2, 4), "num_head_channels": 16}
    sdxl["context_dim"] = [CONTEXT, CONTEXT]  # one per block of a stack
    return _seeded(
        lambda: UNetModel(
            image_size=32,
            use_spatial_transformer=True,
            transformer_depth=2 if xl else 1,
            use_linear_in_transformer=xl,
            use_checkpoint=False,
            **common,
            **(sdxl if xl else sd15),
        )
    )


BUILDERS = {
    "diffusers_sd15": lambda: _diffusers("sd15"),
    "diffusers_sdxl": lambda: _diffusers("sdxl"),
    "ldm_sd15": lambda: _ldm(False),
    "ldm_sdxl": lambda: _ldm(True),
}


@dataclass(frozen=True)
class Model:
    unet: nn.Module
    blocks: list[tuple[nn.Module, int]]  # tome_core.transformer_blocks: each block with its level
    family: str


class Models(dict):
    """Each UNet built on first use."""

    def __missing__(self, name: str) -> Model:
        unet = BUILDERS[name]()
        self[name] = Model(unet, tome_core.transformer_blocks(unet), tome_core.model_family(unet))
        return self[name]


@pytest.fixture(scope="module")
def models() -> Models:
    return Models()


@dataclass(frozen=True)
class Ran:
    """What one block computed on in a call: per part (`PARTS`) its tokens, beside the tokens of its level's grid."""

    level: int
    grid: int
    seen: dict[str, int]

    @property
    def changed(self) -> set[str]:
        return {part for part in PARTS if self.seen[part] != self.grid}

    @property
    def merged(self) -> bool:
        """Tokens merged (pooled keys/values alone do not count)."""
        return bool(self.changed - {"kv"})


def _run(model: Model, size: tuple[int, int]) -> list[Ran]:
    """One call at `size` (pixels): what each transformer block computed on, in forward order."""
    width, height = size
    seen: list[dict[str, int]] = [{} for _ in model.blocks]
    handles = []
    for index, (block, _level) in enumerate(model.blocks):
        parts = {
            "block": block.norm1,
            "attn1": block.attn1.to_q,
            "kv": block.attn1.to_k,
            "attn2": block.attn2.to_q,
            "ff": block.ff.net[0],
        }
        for part, module in parts.items():

            def record(module: nn.Module, args: tuple[Any, ...], index: int = index, part: str = part) -> None:
                seen[index][part] = args[0].shape[1]

            handles.append(module.register_forward_pre_hook(record))
    generator = torch.Generator().manual_seed(0)
    latent = torch.randn(1, 4, height // 8, width // 8, generator=generator)
    timestep = torch.full((1,), 500.0)
    context = torch.randn(1, 77, CONTEXT, generator=generator)
    unet = model.unet
    try:
        with torch.no_grad():
            if hasattr(unet, "down_blocks"):
                added = None
                if getattr(unet.config, "addition_embed_type", None) == "text_time":
                    added = {"text_embeds": torch.zeros(1, 1280), "time_ids": torch.zeros(1, 6)}
                unet(latent, timestep, encoder_hidden_states=context, added_cond_kwargs=added)
            else:
                stack = next(m for m in unet.modules() if hasattr(m, "transformer_blocks"))
                unet(latent, timestep, context=[context] * len(stack.transformer_blocks))  # ldm: one per block
    finally:
        for handle in handles:
            handle.remove()
    grids = {level: math.ceil(height // 8 / level) * math.ceil(width // 8 / level) for _, level in model.blocks}
    return [Ran(level, grids[level], parts) for (_block, level), parts in zip(model.blocks, seen)]


def _family_words(text: str, family: str) -> str:
    """The part of the config's words for `family` (the whole text when it speaks of every family alike)."""
    label = re.escape(FAMILY_LABELS[family])
    found = re.search(rf"(?:^|; ){label}: (.*?)(?=; (?:SD1/SD2|SDXL): |$)", text)
    return found.group(1) if found else text


def _kinds(ran: list[Ran]) -> dict[str, int]:
    """Per kind of module, in `TomeStats.modules`' names, the blocks it ran in pooled or merged."""
    out = {"kv": 0, "attn1": 0, "attn2": 0, "ff": 0}
    for block in ran:
        out["kv"] += block.seen["kv"] < block.seen["attn1"]
        for name in ("attn1", "attn2", "ff"):
            out[name] += block.seen[name] < block.grid
    return {name: count for name, count in out.items() if count}


def _check(model: Model, config: TomeConfig, size: tuple[int, int], words: str | None) -> set[int]:
    """Patch, run one call at `size` and compare every word with what ran; the levels that merged (not pooled)."""
    width, height = size
    tome_core.apply_patch(model.unet, config)
    if config.step_start > 0 or config.step_end < 1:
        tome_core.set_step(model.unet, math.ceil(config.step_start * 10), 10)  # a step inside the window
    try:
        ran = _run(model, size)
        stats = tome_core.stats(model.unet)
    finally:
        tome_core.remove_patch(model.unet)
    assert stats is not None
    acting = [block for block in ran if block.changed]

    # describe: per level, the blocks, those that merge or pool, the tokens self-attention attends to; and the
    # levels unmerged_levels calls too small, where nothing merged.
    unmerged = set(unmerged_levels(config, model.family, width, height))
    for info in tome_core.describe(model.unet, height, width, config):
        here = [block for block in ran if block.level == info.level]
        assert (info.blocks, {block.grid for block in here}) == (len(here), {info.tokens})
        if info.level in unmerged:
            assert info.merging and not any(block.merged for block in here), info
        else:
            assert len([block for block in here if block.changed]) == info.merging, info
        assert {block.seen["kv"] for block in here if block.changed} <= {info.tokens_after}, info
    assert unmerged <= {info.level for info in tome_core.describe(model.unet, height, width, config)}

    # stats: what the hooks say ran, by kind of module, and the levels the config selects.
    assert stats.applied == len(acting)
    assert dict(stats.modules) == _kinds(ran)
    assert {block.level for block in acting} <= stats.levels

    # The config's words (at a size where every cell fits): each kind they name ran, and only those.
    if words is not None:
        text = _family_words(words, model.family)
        module_wise = [block.seen for block in acting if block.seen["block"] == block.grid]
        phrase = re.search(r"merging [\d.]+ of the tokens \(([a-z/]+)-attention\)", text)
        attention = phrase.group(1).split("/") if phrase else []
        claims = {
            "whole": "whole blocks merged" in text,
            "self": "self" in attention,
            "cross": "cross" in attention,
            "mlp": "for the MLP" in text,
            "kv": "keys/values pooled" in text,
        }
        kinds = {
            "whole": any(block.seen["block"] < block.grid for block in acting),
            "self": any(seen["attn1"] < seen["block"] for seen in module_wise),
            "cross": any(seen["attn2"] < seen["block"] for seen in module_wise),
            "mlp": any(seen["ff"] < seen["block"] for seen in module_wise),
            "kv": any(block.seen["kv"] < block.seen["attn1"] for block in acting),
        }
        assert claims == kinds, text
    return {block.level for block in ran if block.merged}


#: Custom settings: every mode, matching, set of modules, strides, levels, shared plans and a step window.
CUSTOM: dict[str, dict[str, Any]] = {
    "defaults": {},
    "every module, global matching": {"merge_crossattn": True, "merge_mlp": True, "matching": "global"},
    "every module, local: whole blocks": {"merge_crossattn": True, "merge_mlp": True, "ratio": 0.4},
    "whole blocks, one plan per stack": {"merge_crossattn": True, "merge_mlp": True, "share_plan": True},
    "every module, MLP at its own ratio": {"merge_crossattn": True, "merge_mlp": True, "mlp_ratio": 0.3},
    "whole from level 4, attention above": {
        "merge_crossattn": True,
        "merge_mlp": True,
        "mlp_min_downsample": 4,
        "max_downsample": 4,
        "sx": 4,
        "sy": 2,
    },
    "kv": {"mode": "kv", "sx": 4, "sy": 4},
    "kv, cross-attention and MLP merged, shared": {
        "mode": "kv",
        "merge_crossattn": True,
        "merge_mlp": True,
        "mlp_ratio": 0.3,
        "share_plan": True,
    },
    "merge at 2 to 4, pool elsewhere": {"pool_kv": True, "min_downsample": 2, "max_downsample": 4, "sx": 4, "sy": 4},
    "pool elsewhere, nowhere else": {"pool_kv": True, "max_downsample": 8},
    "cross-attention only": {"ratio": 0.3, "merge_attn": False, "merge_crossattn": True},
    "MLP only, from level 2": {"merge_attn": False, "merge_mlp": True, "mlp_ratio": 0.4, "mlp_min_downsample": 2},
    "tomesd-like, fixed partitions": {"use_rand": False, "matching": "global", "max_downsample": 2, "sx": 4},
    "step window": {"step_start": 0.5, "merge_crossattn": True, "merge_mlp": True, "share_plan": True},
    "level 1 only": {"max_downsample": 1},
}

#: Each custom setting on one UNet of each layout, alternating the implementations.
CASES = [
    pytest.param(unet, CUSTOM[name], id=f"{unet}-{name}")
    for n, name in enumerate(CUSTOM)
    for unet in (("diffusers_sd15", "ldm_sdxl") if n % 2 else ("ldm_sd15", "diffusers_sdxl"))
]


@pytest.mark.parametrize(("unet", "fields"), CASES)
def test_custom_words_are_what_the_blocks_ran(models: Models, unet: str, fields: dict[str, Any]) -> None:
    model = models[unet]
    config = TomeConfig(**fields)
    large = _check(model, config, LARGE, describe_config(config))
    for size in (SMALL, ODD) if unet.startswith("diffusers") else (SMALL,):
        assert set(unmerged_levels(config, model.family, *size)) == large - _check(model, config, size, None), size


@pytest.mark.parametrize("preset", [p.name for p in presets()])
@pytest.mark.parametrize("unet", list(BUILDERS))
def test_preset_words_are_what_the_blocks_ran(models: Models, unet: str, preset: str) -> None:
    model = models[unet]
    family = model.family
    config = get_preset(preset).config(family)
    large = _check(model, config, LARGE, preset_details(preset, family))
    small = _check(model, config, SMALL, None)
    assert set(unmerged_levels(config, family, *SMALL)) == large - small
    assert ("too small" in preset_hint(preset, family, SMALL)) == bool(large - small)


def test_a_step_outside_the_window_runs_unmerged(models: Models) -> None:
    model = models["diffusers_sd15"]
    tome_core.apply_patch(model.unet, step_start=0.5)
    tome_core.set_step(model.unet, 2, 10)
    try:
        ran = _run(model, SMALL)
        stats = tome_core.stats(model.unet)
    finally:
        tome_core.remove_patch(model.unet)
    assert stats is not None and (stats.active_calls, stats.applied, stats.modules) == (0, 0, ())
    assert not any(block.changed for block in ran)
