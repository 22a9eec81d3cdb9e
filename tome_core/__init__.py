"""ToMe for Stable Diffusion: token merging for LDM/SGM and diffusers UNets, in pure PyTorch.

`apply_patch(model, ratio=0.5)` patches a model in place and `remove_patch(model)` restores it exactly.
"""

from tome_core.config import LEVELS, FieldSpec, TomeConfig, auto_levels, field_spec, field_specs
from tome_core.patch import (
    LevelInfo,
    TomeStats,
    apply_patch,
    describe,
    find_unet,
    get_config,
    is_patched,
    remove_patch,
    reset_stats,
    set_step,
    stats,
)

__all__ = [
    "LEVELS",
    "FieldSpec",
    "LevelInfo",
    "TomeConfig",
    "TomeStats",
    "apply_patch",
    "auto_levels",
    "describe",
    "field_spec",
    "field_specs",
    "find_unet",
    "get_config",
    "is_patched",
    "remove_patch",
    "reset_stats",
    "set_step",
    "stats",
]
