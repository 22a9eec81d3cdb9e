"""An experiment, not in the library: LTX-2's refit stand-in with its audio-to-video attention's output projection
scaled by `damp` (before `strengthen` sets the blocks' update), the share of the velocity's response its video
self-attention and that attention then carry (attn_share.py's measure), and the naive port's change of one call
(each query keeping its own key: `apply_patch(mode="kv", sx=2, sy=2)`, where the panel's port drops it).

    PYTHONPATH=. python docs/runs/2026-12-06-refit-video/ltx2_damp.py 1 0.3 0.1 0.03
"""

from __future__ import annotations

import sys

import torch

import tome_core
from tome_bench import dit_standin
from tome_bench.dit_standin import FAMILIES, change, one_call
from tome_bench.refit import VARIANTS

torch.set_num_threads(1)
family = FAMILIES["ltx2"]
refit = VARIANTS["refit"]


def scale(module, args, out):
    return tuple(o * 0.9 if isinstance(o, torch.Tensor) else o for o in out) if isinstance(out, tuple) else out * 0.9


for damp in (float(v) for v in sys.argv[1:]):

    def surgery(model, fam, seed, damp=damp):
        refit(model, fam, seed)
        for block in model.transformer_blocks:
            block.audio_to_video_attn.to_out[0].weight.mul_(damp)
            block.audio_to_video_attn.to_out[0].bias.mul_(damp)

    model = dit_standin.build(family, surgery, 0)
    base = one_call(model, family, 0)
    shares = {}
    for part in ("attn1", "audio_to_video_attn"):
        handles = [b.get_submodule(part).register_forward_hook(scale) for b in model.transformer_blocks]
        shares[part] = change(one_call(model, family, 0), base) / 0.1
        for handle in handles:
            handle.remove()
    tome_core.apply_patch(model, mode="kv", sx=2, sy=2)
    port = change(one_call(model, family, 0), base)
    tome_core.remove_patch(model)
    print(
        f"damp {damp}: attn1 {shares['attn1']:.3f}, audio_to_video {shares['audio_to_video_attn']:.3f};"
        f" naive port one call {port:.4f}",
        flush=True,
    )
