"""How much each re-fitted stand-in's velocity depends on its (reduced) self-attention: one call at sigma 0.5 with
every self-attention's output scaled by 0.9 (hooks on the modules ToMe reduces: tome_bench.refit._positional), the
relative change of the velocity over 0.1 (the calibrated run's diag2.py measure: trained DiT 0.32, Flux.1 refit 0.33).

    PYTHONPATH=. python docs/runs/2026-12-06-refit-video/attn_share.py flux wan hunyuanvideo ltx ltx2
"""

from __future__ import annotations

import sys

import torch

from tome_bench.dit_standin import FAMILIES, build, change, one_call
from tome_bench.refit import VARIANTS, _attentions, _positional

torch.set_num_threads(1)
for name in sys.argv[1:]:
    family = FAMILIES[name]
    for variant in ("refit", "calibrated"):
        model = build(family, VARIANTS[variant], 0)
        base = one_call(model, family, 0)

        def scale(module, args, out):
            return (
                tuple(o * 0.9 if isinstance(o, torch.Tensor) else o for o in out)
                if isinstance(out, tuple)
                else out * 0.9
            )

        handles = [m.register_forward_hook(scale) for n, m in _attentions(model) if _positional(n)]
        moved = one_call(model, family, 0)
        for h in handles:
            h.remove()
        print(
            f"{name} {variant}: d rel v / d scale of the self-attention outputs {change(moved, base) / 0.1:.3f}",
            flush=True,
        )
