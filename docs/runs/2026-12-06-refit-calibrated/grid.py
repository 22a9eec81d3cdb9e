# ruff: noqa: E402  (one-off diagnostics: threads set before the heavy imports; closures called in their loop)
"""The generation response (12 steps, seed 0) of Refit(update=U, time=T) on a family: port, presets, 11/10 steps."""

import json
import sys

import torch

torch.set_num_threads(1)
import tome_core
from tome_bench import dit_standin as ds
from tome_bench import refit
from tome_core.patch import STATE_ATTR, find_model

fam_name, u, t = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
fam = ds.FAMILIES[fam_name]
vel = float(sys.argv[4]) if len(sys.argv) > 4 else None
model = ds.build(fam, refit.Refit(update=u, time=t if t != 1 else None, velocity=vel), 0)
base = ds.generate(model, fam, 12, 0)
res = {}


def gen(**kw):
    tome_core.apply_patch(model, **kw)
    if "preset" not in kw:
        find_model(model).__dict__[STATE_ATTR].own_key = False
    g = ds.change(ds.generate(model, fam, 12, 0), base)
    tome_core.remove_patch(model)
    return round(g, 4)


res["port"] = gen(mode="kv", sx=2, sy=2)
for p in ("quality", "balanced", "fast", "fastest"):
    res[p] = gen(preset=p)
for n in (11, 10):
    res[f"{n}"] = round(ds.change(ds.generate(model, fam, n, 0), base), 4)
res["port/11"] = round(res["port"] / res["11"], 2)
res["/port"] = [round(res[p] / res["port"], 2) for p in ("quality", "balanced", "fast", "fastest")]
print(fam_name, u, t, vel, json.dumps(res), flush=True)
