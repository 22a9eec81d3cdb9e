# ruff: noqa: E402  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""The full-size flux stand-in's mean attention profile at sigma 0.5 (as tests/test_refit_standin.profile), per variant."""

import sys

import torch

torch.set_num_threads(1)
from tome_bench import attention_profile, dit_standin, refit

family = dit_standin.FAMILIES["flux"]
for variant in sys.argv[1:]:
    model = dit_standin.build(family, refit.VARIANTS[variant], 0)
    grid = (1, family.latent[-2] // 2, family.latent[-1] // 2)
    layout = attention_profile.Layout(family.text, grid, family.text)
    noise, natural, states = dit_standin.sample_inputs(family, 0)
    with attention_profile.Profile(layout) as seen:
        dit_standin.call(model, family, 0.5 * natural + 0.5 * noise, 0.5, states)
    m = attention_profile.summary(seen.rows)
    print(
        variant,
        {
            k: (round(v, 3) if isinstance(v, float) else [round(x, 4) for x in v][:6])
            for k, v in m.items()
            if k in ("own", "ring1", "within2", "within4", "text", "rings", "heads_within4")
        },
        flush=True,
    )
