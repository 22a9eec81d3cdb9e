# ruff: noqa: E402, RUF007  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""Per-call change of the naive port and of Quality's late merge by sigma, along the unpatched 12-step trajectory."""

import sys

import torch

torch.set_num_threads(1)
import tome_core
from tome_bench import dit_standin as ds
from tome_bench import refit
from tome_bench import trained_dit as td
from tome_core.patch import STATE_ATTR, find_model

which = sys.argv[1]
if which == "trained":
    model = td.load()
    tr = model.transformer
    _, labels = td.eval_set()
    labels = labels[:4]
    noise = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    f = lambda x, s: model(x, torch.full((4,), s), labels)
else:
    fam = ds.FAMILIES["flux"]
    r = refit.VARIANTS["refit"] if len(sys.argv) < 3 else eval("refit." + sys.argv[2])
    tr = ds.build(fam, r, 0)
    noise, _, text = ds.sample_inputs(fam, 0)
    f = lambda x, s: ds.call(tr, fam, x, s, text)
with torch.no_grad():
    x = noise
    s = torch.linspace(1, 0, 13).tolist()
    rows = []
    for k, (a, b) in enumerate(zip(s, s[1:])):
        v = f(x, a)
        out = []
        for kw in ({"mode": "kv", "sx": 2, "sy": 2}, {"preset": "quality"}, {"preset": "balanced"}):
            tome_core.apply_patch(tr, **kw)
            st = find_model(tr).__dict__.get(STATE_ATTR)
            if "preset" not in kw:
                st.own_key = False
            tome_core.set_step(tr, k, 12)
            out.append(round(ds.change(f(x, a), v), 3))
            tome_core.remove_patch(tr)
        rows.append((round(a, 2), round(float(v.norm() / x.norm()), 2), *out))
        x = x + (b - a) * v
    print(which, "(sigma, |v|/|x|, port, quality, balanced) per step:", rows)
