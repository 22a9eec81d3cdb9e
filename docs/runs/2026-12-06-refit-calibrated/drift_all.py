# ruff: noqa: E402, B023  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""Per family: the calibrated variant's velocity drift (sigma 0.5 -> 0.45 and 0.5 - 1/132, same input), the refit's,
its block update and ||v||/||x|| (trained DiT: 0.082 / 0.015, 0.375, 1.90)."""

import sys

import torch

torch.set_num_threads(1)
from tome_bench import dit_standin as ds
from tome_bench import refit


def drift(f, d):
    v = f(0.5)
    return round(float((f(0.5 - d) - v).norm() / v.norm()), 3)


with torch.no_grad():
    for name in sys.argv[1].split(","):
        fam = ds.FAMILIES[name]
        for variant in ("refit", "calibrated"):
            model = ds.build(fam, refit.VARIANTS[variant], 0)
            n, nat, text = ds.sample_inputs(fam, 0)
            x = 0.5 * n + 0.5 * nat
            f = lambda s: ds.call(model, fam, x, s, text)
            u = ds.updates(model, fam)
            print(
                name,
                variant,
                "drift",
                drift(f, 0.05),
                drift(f, 1 / 132),
                "update",
                round(sum(u) / len(u), 3),
                "|v|/|x|",
                round(ds.velocity_ratio(model, fam), 2),
                flush=True,
            )
