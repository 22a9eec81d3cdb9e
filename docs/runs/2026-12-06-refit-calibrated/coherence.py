# ruff: noqa: E402, B023, RUF007  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""Velocity coherence along a 12-step generation: cos(v_k, v_0) and cos(v_k, v_11); trained vs Refit(update, time)."""

import sys

import torch

torch.set_num_threads(1)
from tome_bench import dit_standin as ds
from tome_bench import refit
from tome_bench import trained_dit as td

cs = lambda a, b: round(float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0)), 3)
with torch.no_grad():
    if sys.argv[1] == "trained":
        m = td.load()
        _, lab = td.eval_set()
        lab = lab[:4]
        noise = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        f = lambda x, s: m(x, torch.full((4,), s), lab)
        runs = [("trained", f, noise)]
    else:
        fam = ds.FAMILIES["flux"]
        runs = []
        for t in sys.argv[3:]:
            model = ds.build(fam, refit.Refit(update=float(sys.argv[2]), time=None if t == "1" else float(t)), 0)
            noise, _, text = ds.sample_inputs(fam, 0)
            runs.append(
                (f"flux {sys.argv[2]} {t}", (lambda model: lambda x, s: ds.call(model, fam, x, s, text))(model), noise)
            )
    for name, f, noise in runs:
        x = noise
        s = torch.linspace(1, 0, 13).tolist()
        vs = []
        for a, b in zip(s, s[1:]):
            v = f(x, a)
            vs.append(v)
            x = x + (b - a) * v
        print(
            name,
            "cos(v_k, v_0)",
            [cs(v, vs[0]) for v in vs],
            "cos(v_k,v_last)",
            [cs(v, vs[-1]) for v in vs],
            flush=True,
        )
