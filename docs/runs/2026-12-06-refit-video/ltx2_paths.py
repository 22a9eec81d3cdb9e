"""Which path carries LTX-2's refit stand-in's video velocity: one call at sigma 0.5 with one kind of module's output
scaled by 0.9 in every block, the relative change of the velocity over 0.1 (attn_share.py's measure per module).

    PYTHONPATH=. python docs/runs/2026-12-06-refit-video/ltx2_paths.py
"""

from __future__ import annotations

import torch

from tome_bench.dit_standin import FAMILIES, build, change, one_call
from tome_bench.refit import VARIANTS

torch.set_num_threads(1)
family = FAMILIES["ltx2"]
model = build(family, VARIANTS["refit"], 0)
base = one_call(model, family, 0)


def scale(module, args, out):
    return tuple(o * 0.9 if isinstance(o, torch.Tensor) else o for o in out) if isinstance(out, tuple) else out * 0.9


for part in ("attn1", "attn2", "audio_to_video_attn", "ff", "audio_attn1", "video_to_audio_attn", "audio_ff"):
    handles = [block.get_submodule(part).register_forward_hook(scale) for block in model.transformer_blocks]
    print(f"ltx2 refit {part}: d rel v / d scale {change(one_call(model, family, 0), base) / 0.1:.3f}", flush=True)
    for handle in handles:
        handle.remove()
