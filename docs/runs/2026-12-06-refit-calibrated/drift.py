# ruff: noqa: E402, B023  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""Velocity drift between sigma 0.5 and 0.45 at a fixed input (one call), trained DiT vs Refit(update, time) on flux."""

import sys

import torch

torch.set_num_threads(1)
from tome_bench import dit_standin as ds
from tome_bench import refit
from tome_bench import trained_dit as td


def drift(f, d=0.05):
    v = f(0.5)
    return float((f(0.5 - d) - v).norm() / v.norm())


with torch.no_grad():
    if sys.argv[1] == "trained":
        m = td.load()
        x0, lab = td.eval_set()
        x0, lab = x0[:4], lab[:4]
        x = 0.5 * x0 + 0.5 * torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
        f = lambda s: m(x, torch.full((4,), s), lab)
        print("trained", [round(drift(f, d), 4) for d in (0.05, 1 / 132)])
    else:
        fam = ds.FAMILIES[sys.argv[1]]
        for t in sys.argv[3:]:
            model = ds.build(fam, refit.Refit(update=float(sys.argv[2]), time=None if t == "1" else float(t)), 0)
            n, nat, text = ds.sample_inputs(fam, 0)
            x = 0.5 * n + 0.5 * nat
            f = lambda s: ds.call(model, fam, x, s, text)
            print(sys.argv[1], sys.argv[2], t, [round(drift(f, d), 4) for d in (0.05, 1 / 132)], flush=True)
