"""The refit settings' fit for the video stand-ins: each family's profile at sigma 0.5 (its Family.joint_layout)
for a few `Refit(content=, text=, depth=)` settings, beside the trained DiT's (own 0.046, 8 neighbours 0.195, within 2 0.370,
within 4 0.532, text 0.056).

    PYTHONPATH=. python docs/runs/2026-12-06-refit-video/fit.py hunyuanvideo 0.2:2.0 1.2:5.0 0.2::1-4 ...
"""

from __future__ import annotations

import sys
import time

import torch

from tome_bench import attention_profile as ap
from tome_bench.dit_standin import FAMILIES, build, call, sample_inputs
from tome_bench.refit import Refit

torch.set_num_threads(1)
name = sys.argv[1]
family = FAMILIES[name]
noise, natural, states = sample_inputs(family, 0)
for setting in sys.argv[2:]:
    content, text, *rest = (float(v) if v else None for v in setting.replace("-", ":").split(":"))
    depth = (rest[0], rest[1]) if rest else None
    start = time.time()
    model = build(family, Refit(depth=depth, content=content, text=text), 0)
    with torch.no_grad(), ap.Profile(ap.Layout(*family.joint_layout())) as seen:
        call(model, family, 0.5 * natural + 0.5 * noise, 0.5, states)
    m = ap.summary(seen.rows)
    figures = " ".join(f"{f} {m[f]:.3f}" for f in ("own", "ring1", "within2", "within4", "text", "entropy"))
    heads = "{:.2f}-{:.2f}".format(*m["heads_within4"])
    blocks = " ".join(f"{r['text']:.3f}" for r in seen.rows)
    print(
        f"{name} content {content} text {text} depth {depth}: {figures} heads {heads}; text per block {blocks}"
        f" [{time.time() - start:.0f} s]",
        flush=True,
    )
