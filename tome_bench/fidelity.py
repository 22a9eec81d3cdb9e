"""Fidelity on models that attend like trained ones: the references the presets are held to.

tomesd's default (ratio 0.5, 2x2 cells, self-attention only, global matching) and ToDo's default (self-attention's
keys/values from the tokens subsampled 2x2, arXiv 2402.13573), each at the first level with attention of a family:
level 1 on SD1/SD2, level 2 on SDXL (where tomesd's own default, max_downsample 1, merges nothing).
"""

from __future__ import annotations

from typing import Any

#: The first level with attention per model family.
TOP_LEVEL = {"sd": 1, "sdxl": 2}


def references(family: str) -> dict[str, dict[str, Any]]:
    """name -> TomeConfig fields of each reference at `family`'s first level with attention, in our core (ToDo's
    subsampling as our 2x2 average pooling, the same cost on a GPU)."""
    top = TOP_LEVEL[family]
    level = {"min_downsample": top, "max_downsample": top}
    return {
        "ref-tomesd": {"ratio": 0.5, "matching": "global", **level},
        "ref-todo": {"mode": "kv", **level},
    }
