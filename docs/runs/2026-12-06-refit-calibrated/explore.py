# ruff: noqa: E402  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""Prototype knobs on a family's refit stand-in: block update target, x0 parameterisation. Prints the generation
response (12 steps, seed 0): port, presets, 11 steps; and one-call port change, final/noise cosine."""

import json
import sys
import time

import torch

torch.set_num_threads(1)
import tome_core
from tome_bench import dit_standin as ds
from tome_bench import refit
from tome_core.dit import DitState
from tome_core.patch import STATE_ATTR, find_model

fam_name, update, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
tc = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
vk = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
orig_strengthen, feed_call = ds.strengthen, ds.call


def orig_call(model, family, latent, sigma, text):
    return vk * feed_call(model, family, latent, 0.5 + tc * (sigma - 0.5), text)


ds.call = orig_call
ds.strengthen = lambda m, f, target=None: orig_strengthen(m, f, update)
if mode == "x0":

    def call(model, family, latent, sigma, text):
        return (latent - orig_call(model, family, latent, sigma, text)) / sigma

    ds.call = call
elif mode.startswith("mix"):  # v = a*(x - F)/sigma + (1-a)*F ...
    a = float(mode[3:])

    def call(model, family, latent, sigma, text):
        f = orig_call(model, family, latent, sigma, text)
        return a * (latent - f) / sigma + (1 - a) * f

    ds.call = call
fam = ds.FAMILIES[fam_name]
t = time.time()
model = ds.build(fam, refit.VARIANTS["refit"], 0)
res = {
    "build": round(time.time() - t, 1),
    "updates": round(sum(ds.updates(model, fam)) / len(ds.updates(model, fam)), 3),
}
noise, natural, text = ds.sample_inputs(fam, 0)
base = ds.generate(model, fam, 12, 0)
res["cos(final,noise)"] = round(float(torch.nn.functional.cosine_similarity(base.flatten(), noise.flatten(), 0)), 3)
bc = ds.one_call(model, fam, 0)


def measure(**kw):
    tome_core.apply_patch(model, **kw)
    st = find_model(model).__dict__.get(STATE_ATTR)
    if "preset" not in kw and isinstance(st, DitState):
        st.own_key = False
    c = ds.change(ds.one_call(model, fam, 0), bc)
    g = ds.change(ds.generate(model, fam, 12, 0), base)
    tome_core.remove_patch(model)
    return round(c, 4), round(g, 4)


res["port"] = measure(mode="kv", sx=2, sy=2)
for p in ("quality", "balanced", "fast", "fastest"):
    res[p] = measure(preset=p)
for n in (11, 10):
    res[f"{n} steps"] = round(ds.change(ds.generate(model, fam, n, 0), base), 4)
g = res["port"][1]
res["port/11"] = round(g / res["11 steps"], 2)
res["Q/port,B/port,F/port,Fst/port"] = [round(res[p][1] / g, 2) for p in ("quality", "balanced", "fast", "fastest")]
print(fam_name, update, mode, tc, vk, json.dumps(res), flush=True)
