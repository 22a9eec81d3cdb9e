"""Change on the trained DiT vs estimated speed-up at Flux.1-dev 1024² for kv settings."""

import itertools
import json
import math
from pathlib import Path

import torch

import tome_core
from tome_bench import dit_archs
from tome_bench import trained_fidelity as tf
from tome_bench.gpu_estimate import GPUS, estimate
from tome_bench.trained_dit import load

torch.set_num_threads(2)
arch = dit_archs.DIT_ARCHS["flux-dev"]
meta = arch.build()
size = (1024, 1024, 1)
gpu = GPUS["h200"]
base_ms = estimate(dit_archs.trace_call(arch, meta, size), gpu).gpu_ms


def speed(fields):
    e = estimate(dit_archs.trace_call(arch, meta, size, lambda m: tome_core.apply_patch(m, **fields)), gpu)
    return base_ms / e.gpu_ms


m = load()
g = torch.Generator().manual_seed(0)
noise = torch.randn(4, 3, 64, 64, generator=g)
labels = torch.arange(4)
steps = (12, 8)
bases = {n: tf.generate(m, noise, labels, n) for n in steps}
drops = {n: {k: tf.change(tf.generate(m, noise, labels, k), bases[n]) for k in range(max(1, n - 3), n)} for n in steps}
print("step drops", {n: {k: round(v, 4) for k, v in d.items()} for n, d in drops.items()}, flush=True)
rows = []
cands = []
for cells, bs, ss in itertools.product((2, 3, 4), (0.0, 0.35, 0.5, 0.65, 0.8), (0.0, 0.5)):
    cands.append({"mode": "kv", "sx": cells, "sy": cells, "block_start": bs, "step_start": ss})
cands.append({"mode": "kv", "sx": 2, "sy": 1, "block_start": 0.0})
cands.append({"mode": "kv", "sx": 2, "sy": 1, "block_start": 0.5})
for f in cands:
    s = speed({k: v for k, v in f.items() if k != "step_start"})
    # a step window saves time only in its steps
    frac = 1.0 - f.get("step_start", 0.0)
    t = 1.0 / (frac / s + (1 - frac))
    row = {"fields": f, "speedup": round(t, 4)}
    for n in steps:
        row[n] = round(tf._measure(m, noise, labels, n, bases[n], f, own_key=True), 4)
        # the step saving: fraction of a step the same time buys, interpolated between dropped-step changes
        save = n - n / t  # steps' worth of time saved
        k = math.floor(save)
        frac_k = save - k
        lo = 0.0 if k == 0 else drops[n].get(n - k, float("nan"))
        hi = drops[n].get(n - k - 1, float("nan"))
        row[f"ref{n}"] = round(lo + frac_k * (hi - lo), 4)
    rows.append(row)
    print(row, flush=True)
Path("sweep.json").write_text(json.dumps(rows, indent=1))
