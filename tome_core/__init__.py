"""ToMe for Stable Diffusion: token merging for LDM/SGM and diffusers UNets, in pure PyTorch.

`apply_patch(model, ratio=0.5)` patches a model in place and `remove_patch(model)` restores it exactly;
`apply_patch(model, preset="fast")` applies one of the named speed settings in `presets()`, which prints as a table
(`presets_table()`). `__version__` is the version of sd-webui-tome (`tome_core.version`).
"""

from tome_core.config import LEVELS, FieldSpec, TomeConfig, auto_levels, field_spec, field_specs
from tome_core.patch import (
    TomeStats,
    apply_patch,
    block_table,
    blocks_per_level,
    describe,
    describe_layout,
    find_unet,
    get_config,
    is_patched,
    model_family,
    remove_patch,
    reset_stats,
    set_step,
    stats,
    transformer_blocks,
)
from tome_core.plan import BlockPlan, BlockShape, BlockTable, LevelInfo, layout_table
from tome_core.presets import (
    DEFAULT_PRESET,
    FAMILIES,
    Fidelity,
    Preset,
    Speed,
    get_preset,
    presets,
    presets_table,
)
from tome_core.version import __version__

__all__ = [
    "DEFAULT_PRESET",
    "FAMILIES",
    "LEVELS",
    "BlockPlan",
    "BlockShape",
    "BlockTable",
    "Fidelity",
    "FieldSpec",
    "LevelInfo",
    "Preset",
    "Speed",
    "TomeConfig",
    "TomeStats",
    "__version__",
    "apply_patch",
    "auto_levels",
    "block_table",
    "blocks_per_level",
    "describe",
    "describe_layout",
    "field_spec",
    "field_specs",
    "find_unet",
    "get_config",
    "get_preset",
    "is_patched",
    "layout_table",
    "model_family",
    "presets",
    "presets_table",
    "remove_patch",
    "reset_stats",
    "set_step",
    "stats",
    "transformer_blocks",
]
