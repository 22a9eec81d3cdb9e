"""How a stand-in's velocity depends on its input, its time and its text: one call at sigma 0.5 against another
sample, sigma 0.2, and other text states.

PYTHONPATH=. python docs/runs/2026-11-28-dit-fidelity-nextdit/time.py flux,chroma,...  (time.log)
"""

import sys

import torch

from tome_bench.dit_standin import FAMILIES, VARIANTS, _inputs, build, call, change

torch.set_num_threads(1)
for name in sys.argv[1].split(","):
    family = FAMILIES[name]
    model = build(family, VARIANTS["stand-in"])
    noise, natural, text = _inputs(family, 0)
    other_noise, other_natural, _ = _inputs(family, 1)
    latent, other = 0.5 * noise + 0.5 * natural, 0.5 * other_noise + 0.5 * other_natural
    with torch.no_grad():
        base = call(model, family, latent, 0.5, text)
        by_x = call(model, family, other, 0.5, text)
        by_t = call(model, family, latent, 0.2, text)
        by_text = call(model, family, latent, 0.5, torch.randn_like(text))
    print(
        f"{name:8} dv/dx {change(by_x, base):.3f}  dv/dt {change(by_t, base):.3f}  dv/dtext {change(by_text, base):.3f}",
        flush=True,
    )
