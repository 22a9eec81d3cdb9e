# ruff: noqa: E402  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""Diagnostics: trained DiT vs flux refit stand-in."""

import sys
import time

import torch

torch.set_num_threads(1)
import tome_core
from tome_bench import dit_standin as ds
from tome_bench import refit
from tome_bench import trained_dit as td
from tome_bench.trained_fidelity import generate as tgen


def block_updates(blocks, fn):
    seen = []

    def rec(m, a, k, out):
        before = ds._tensors(a, k)[0]
        after = [
            t
            for t in (out if isinstance(out, tuple) else (out,))
            if isinstance(t, torch.Tensor) and t.shape == before.shape
        ]
        if after:
            seen.append(float((after[-1] - before).norm() / before.norm()))

    hs = [b.register_forward_hook(rec, with_kwargs=True) for b in blocks]
    try:
        fn()
    finally:
        for h in hs:
            h.remove()
    return seen


def value_sim(model, fn, grid, text, image_first=False):
    """cos sim of value vectors of horizontally adjacent image tokens, and of random pairs; per attention module"""
    res = []

    def rec(m, a, out):
        v = out.detach()[0]  # [N, C]
        n = grid[0] * grid[1]
        img = v[:n] if image_first else v[-n:] if v.shape[0] >= n else None
        if v.shape[0] == n:
            img = v
        if v.shape[0] < n:
            return
        img = img.view(grid[0], grid[1], -1)
        img = img - img.mean((0, 1), keepdim=True)
        c = torch.nn.functional.cosine_similarity
        adj = float(c(img[:, 1:], img[:, :-1], dim=-1).mean())
        flat = img.flatten(0, 1)
        p = torch.randperm(len(flat), generator=torch.Generator().manual_seed(0))
        rnd = float(c(flat, flat[p], dim=-1).mean())
        # relative difference energy of 2x2 subsampling: ||v - avg2x2(v)||/||v||
        g = img.permute(2, 0, 1)[None]
        pooled = torch.nn.functional.avg_pool2d(g, 2)
        up = pooled.repeat_interleave(2, -1).repeat_interleave(2, -2)
        det = float((g - up).norm() / g.norm())
        res.append((adj, rnd, det))

    hs = []
    for name, mod in model.named_modules():
        if name.endswith("to_v"):
            hs.append(mod.register_forward_hook(rec))
    try:
        fn()
    finally:
        for h in hs:
            h.remove()
    return res


def latent_detail(x, tokgrid=True):
    """fraction of energy lost by 2x2 token averaging (of packed tokens: 4x4 latent px)"""
    x = x - x.mean((-2, -1), keepdim=True)
    p = torch.nn.functional.avg_pool2d(x, 4)
    up = p.repeat_interleave(4, -1).repeat_interleave(4, -2)
    return float((x - up).norm() / x.norm())


which = sys.argv[1]
out = {}
if which == "trained":
    model = td.load()
    tr = model.transformer
    x0, labels = td.eval_set()
    x0 = x0[:4]
    labels = labels[:4]
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(x0.shape, generator=g)
    xs = 0.5 * x0 + 0.5 * noise
    sig = torch.full((4,), 0.5)
    call = lambda x=xs, s=sig: model(x, s, labels)
    out["updates"] = block_updates(ds.blocks(tr), call)
    out["values"] = value_sim(tr, call, (32, 32), 8)
    v = call()
    out["|v|/|x|"] = float(v.norm() / xs.norm())
    # input dependence: relative change of v for relative perturbation of x
    d = 0.01 * torch.randn(xs.shape, generator=g) * xs.norm() / xs.numel() ** 0.5
    out["dv/dx rel"] = float(((model(xs + d, sig, labels) - v).norm() / v.norm()) / (d.norm() / xs.norm()))
    # port one call change
    tome_core.apply_patch(tr, mode="kv", sx=2, sy=2)
    st = tr.__dict__.get("_tome_state")
    from tome_core.patch import STATE_ATTR

    st = tr.__dict__.get(STATE_ATTR)
    st.own_key = False
    out["port call"] = float((call() - v).norm() / v.norm())
    tome_core.remove_patch(tr)
    # generation stats
    for n in (12,):
        base = tgen(model, noise, labels, n)
        out["final/noise"] = float(base.norm() / noise.norm())
        out["cos(final,noise)"] = float(torch.nn.functional.cosine_similarity(base.flatten(), noise.flatten(), dim=0))
        out["detail final"] = latent_detail(base)
        out["detail x0"] = latent_detail(x0)
    out["sample_detail"] = latent_detail(x0)
elif which == "standin":
    var = sys.argv[2] if len(sys.argv) > 2 else "refit"
    fam = ds.FAMILIES["flux"]
    t = time.time()
    model = ds.build(fam, refit.VARIANTS[var] if var in refit.VARIANTS else eval(var), 0)
    out["build s"] = time.time() - t
    noise, natural, text = ds.sample_inputs(fam, 0)
    xs = 0.5 * noise + 0.5 * natural
    call = lambda x=xs: ds.call(model, fam, x, 0.5, text)
    out["updates"] = block_updates(ds.blocks(model), call)
    out["values"] = value_sim(model, call, (24, 24), 32)
    v = call()
    out["|v|/|x|"] = float(v.norm() / xs.norm())
    g = torch.Generator().manual_seed(5)
    d = 0.01 * torch.randn(xs.shape, generator=g) * xs.norm() / xs.numel() ** 0.5
    out["dv/dx rel"] = float(((call(xs + d) - v).norm() / v.norm()) / (d.norm() / xs.norm()))
    from tome_core.patch import STATE_ATTR

    tome_core.apply_patch(model, mode="kv", sx=2, sy=2)
    st = ds.find_model(model).__dict__.get(STATE_ATTR) if hasattr(ds, "find_model") else None
    from tome_core.patch import find_model

    st = find_model(model).__dict__.get(STATE_ATTR)
    st.own_key = False
    out["port call"] = float((call() - v).norm() / v.norm())
    tome_core.remove_patch(model)
    base = ds.generate(model, fam, 12, 0)
    out["final/noise"] = float(base.norm() / noise.norm())
    out["cos(final,noise)"] = float(torch.nn.functional.cosine_similarity(base.flatten(), noise.flatten(), dim=0))
    out["detail final"] = latent_detail(base)
    out["detail natural"] = latent_detail(natural)
for k, v in out.items():
    if k == "values":
        print(k, [tuple(round(a, 3) for a in t) for t in v])
    elif isinstance(v, list):
        print(k, [round(a, 3) for a in v])
    else:
        print(k, round(v, 4))
