# ruff: noqa: E402, RUF007  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""Hypothesis 3 (velocity's dependence on attention vs MLP) and trajectory straightness, trained vs refit stand-in."""

import sys

import torch

torch.set_num_threads(1)
from tome_bench import dit_standin as ds
from tome_bench import refit
from tome_bench import trained_dit as td


def scaled_hooks(model, kind, eps):
    hs = []
    for name, m in model.named_modules():
        last = name.split(".")[-1]
        if (kind == "attn" and last == "attn") or (kind == "mlp" and last in ("ff", "ff_context", "proj_mlp")):

            def hook(mod, a, out):
                if isinstance(out, tuple):
                    return tuple(o * (1 + eps) if isinstance(o, torch.Tensor) else o for o in out)
                return out * (1 + eps)

            hs.append(m.register_forward_hook(hook))
    return hs


which = sys.argv[1]
if which == "trained":
    model = td.load()
    tr = model.transformer
    x0, labels = td.eval_set()
    x0, labels = x0[:4], labels[:4]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    f = lambda x, s: model(x, torch.full((4,), s), labels)
    xs = 0.5 * x0 + 0.5 * noise
else:
    fam = ds.FAMILIES["flux"]
    tr = ds.build(fam, refit.VARIANTS["refit"], 0)
    noise, natural, text = ds.sample_inputs(fam, 0)
    f = lambda x, s: ds.call(tr, fam, x, s, text)
    xs = 0.5 * noise + 0.5 * natural
with torch.no_grad():
    v = f(xs, 0.5)
    for kind in ("attn", "mlp"):
        hs = scaled_hooks(tr, kind, 0.05)
        dv = f(xs, 0.5) - v
        for h in hs:
            h.remove()
        print(kind, "sensitivity (rel dv / eps)", round(float(dv.norm() / v.norm() / 0.05), 3))
    # time dependence at fixed x
    print("v(x,0.45) vs v(x,0.5) rel", round(float((f(xs, 0.45) - v).norm() / v.norm()), 4))
    # straightness along a 12-step generation
    x = noise
    sig = torch.linspace(1, 0, 13).tolist()
    vs = []
    for a, b in zip(sig, sig[1:]):
        vv = f(x, a)
        vs.append(vv)
        x = x + (b - a) * vv
    cos = [
        round(float(torch.nn.functional.cosine_similarity(p.flatten(), q.flatten(), 0)), 3) for p, q in zip(vs, vs[1:])
    ]
    print("cos consecutive v", cos)
    print("|v| per step / |noise|", [round(float(vv.norm() / noise.norm()), 2) for vv in vs])
    total = x - noise
    print(
        "|final - noise|/|noise|",
        round(float(total.norm() / noise.norm()), 3),
        "straightness |sum v dt| / sum|v dt|",
        round(float(total.norm() / sum(vv.norm() / 12 for vv in vs)), 3),
    )
