# ruff: noqa: E402  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""Per attention module at sigma 0.5 (inputs held fixed: each module's own input recorded unpatched): relative change
of its image output under the naive port; and the share of attention mass each query puts within its own 2x2 cell."""

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
    x0, labels = td.eval_set()
    x0, labels = x0[:4], labels[:4]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    xs = 0.5 * x0 + 0.5 * noise
    f = lambda: model(xs, torch.full((4,), 0.5), labels)
else:
    fam = ds.FAMILIES["flux"]
    r = refit.VARIANTS["refit"] if len(sys.argv) < 3 else eval("refit." + sys.argv[2])
    tr = ds.build(fam, r, 0)
    noise, nat, text = ds.sample_inputs(fam, 0)
    f = lambda: ds.call(tr, fam, 0.5 * noise + 0.5 * nat, 0.5, text)
mods = [m for n, m in tr.named_modules() if n.endswith(".attn")]
outs = {}


def rec(key):
    def hook(m, a, k, out):
        o = out[0] if isinstance(out, tuple) else out
        outs.setdefault(key, []).append(o.detach().clone())

    return hook


with torch.no_grad():
    hs = [m.register_forward_hook(rec(i), with_kwargs=True) for i, m in enumerate(mods)]
    f()
    tome_core.apply_patch(tr, mode="kv", sx=2, sy=2)
    find_model(tr).__dict__[STATE_ATTR].own_key = False
    f()
    tome_core.remove_patch(tr)
    for h in hs:
        h.remove()
res = [round(float((v[1] - v[0]).norm() / v[0].norm()), 3) for k, v in sorted(outs.items())]
print(which, "attention output change under the port, per block (cumulative, not isolated):", res)
