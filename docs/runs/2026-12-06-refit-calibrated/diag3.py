# ruff: noqa: E402, RUF007  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""Is the generation chaotic? Final-latent change for a tiny perturbation of the starting noise (12 steps)."""

import sys

import torch

torch.set_num_threads(1)
from tome_bench import dit_standin as ds
from tome_bench import refit
from tome_bench import trained_dit as td
from tome_bench.trained_fidelity import generate as tgen

which = sys.argv[1]
g = torch.Generator().manual_seed(7)
if which == "trained":
    model = td.load()
    x0, labels = td.eval_set()
    labels = labels[:4]
    noise = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    gen = lambda n, steps=12: tgen(model, n, labels, steps)
else:
    fam = ds.FAMILIES["flux"]
    model = ds.build(fam, refit.VARIANTS["refit"], 0)
    noise, _, text = ds.sample_inputs(fam, 0)

    def gen(n, steps=12):
        x = n
        s = torch.linspace(1, 0, steps + 1).tolist()
        for a, b in zip(s, s[1:]):
            x = x + (b - a) * ds.call(model, fam, x, a, text)
        return x


with torch.no_grad():
    base = gen(noise)
    d = torch.randn(noise.shape, generator=g)
    for eps in (1e-4, 1e-3, 1e-2):
        out = gen(noise + eps * d)
        print(
            which,
            "noise perturbation",
            eps,
            "final change",
            round(ds.change(out, base), 5),
            "gain",
            round(ds.change(out, base) / eps * float(base.norm() / (d.norm())), 2),
            flush=True,
        )
    diff = gen(noise, 11) - base
    # where is the 11-step change? per-token energy concentration
    e = diff.pow(2).sum(1).flatten()
    top = e.sort(descending=True).values
    print(
        which,
        "11-step change",
        round(ds.change(base + diff, base), 4),
        "share of energy in top 1% positions",
        round(float(top[: max(1, len(top) // 100)].sum() / top.sum()), 3),
    )
