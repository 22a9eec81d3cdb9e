"""ToMe for Stable Diffusion: token merging for LDM/SGM and diffusers UNets and token reduction for diffusion
transformers (Flux, Wan, Qwen-Image, SD3.5, ...), in pure PyTorch.

`apply_patch(model, ratio=0.5)` patches a model in place and `remove_patch(model)` restores it exactly;
`apply_patch(model, preset="fast")` applies one of the named speed settings in `presets()`, which prints as a table
(`presets_table()`). `__version__` is the version of sd-webui-tome (`tome_core.version`).
"""

from tome_core.config import LEVELS, FieldSpec, TomeConfig, auto_levels, field_spec, field_specs
from tome_core.families import DIT_FAMILIES, Family, Layout, Tokens, find_layout
from tome_core.figures import Speed
from tome_core.patch import (
    TomeStats,
    apply_patch,
    block_table,
    blocks_per_level,
    check_config,
    describe,
    describe_layout,
    find_model,
    find_unet,
    get_config,
    is_patched,
    model_family,
    reduce_attention,
    reduced_attention,
    remove_patch,
    reset_stats,
    set_attention_interceptor,
    set_step,
    stats,
    transformer_blocks,
)
from tome_core.plan import BlockPlan, BlockShape, BlockTable, LevelInfo, layout_table
from tome_core.presets import ALL_FAMILIES, DEFAULT_PRESET, FAMILIES, Fidelity, Preset, get_preset
from tome_core.version import __version__
from tome_core.words import presets, presets_table

__all__ = [
    "ALL_FAMILIES",
    "DEFAULT_PRESET",
    "DIT_FAMILIES",
    "FAMILIES",
    "LEVELS",
    "BlockPlan",
    "BlockShape",
    "BlockTable",
    "Family",
    "Fidelity",
    "FieldSpec",
    "Layout",
    "LevelInfo",
    "Preset",
    "Speed",
    "Tokens",
    "TomeConfig",
    "TomeStats",
    "__version__",
    "apply_patch",
    "auto_levels",
    "block_table",
    "blocks_per_level",
    "check_config",
    "describe",
    "describe_layout",
    "field_spec",
    "field_specs",
    "find_layout",
    "find_model",
    "find_unet",
    "get_config",
    "get_preset",
    "is_patched",
    "layout_table",
    "model_family",
    "presets",
    "presets_table",
    "reduce_attention",
    "reduced_attention",
    "remove_patch",
    "reset_stats",
    "set_attention_interceptor",
    "set_step",
    "stats",
    "transformer_blocks",
]
