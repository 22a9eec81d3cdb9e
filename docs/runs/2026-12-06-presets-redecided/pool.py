"""Pooled keys/values vs subsampled, on the trained DiT."""

import contextlib
import math
import sys

import torch

from tome_bench import trained_fidelity as tf
from tome_bench.trained_dit import load
from tome_core import dit

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)

_orig = (dit._row, dit._take, dit._own_bias)


@contextlib.contextmanager
def pooled(weighted=True):
    def row(table, draw):
        return table  # [S, K]: every slot

    def take(x, index, dim):
        if index.dim() == 2:
            s, k = index.shape
            g = x.index_select(dim, index.reshape(-1))
            g = g.unflatten(dim % x.dim(), (s, k))
            return g.mean(dim % x.dim())
        return _orig[1](x, index, dim)

    def own_bias(state, tokens, after, plan, like):
        length = tokens.before + tokens.generated + after
        cell = plan.st * plan.sy * plan.sx
        per = (math.log(cell) if weighted else 0.0) / int(like.shape[-1])
        return torch.full((length, 1), per, dtype=like.dtype)

    dit._row, dit._take, dit._own_bias = row, take, own_bias
    try:
        yield
    finally:
        dit._row, dit._take, dit._own_bias = _orig


m = load()
g = torch.Generator().manual_seed(0)
noise = torch.randn(4, 3, 64, 64, generator=g)
labels = torch.arange(4)
for n in (12, 4):
    base = tf.generate(m, noise, labels, n)
    eps = tf.change(tf.generate(m, noise + 1e-3 * torch.randn_like(noise), labels, n), base)
    print(f"{n} steps: noise 1e-3 perturbation -> {eps:.4f}")
    if n == 12:
        print("11 steps", round(tf.change(tf.generate(m, noise, labels, 11), base), 4))
    for fields in (
        {"mode": "kv", "sx": 2, "sy": 2},
        {"mode": "kv", "sx": 3, "sy": 3, "block_start": 0.2},
        {"mode": "kv", "sx": 2, "sy": 2, "block_start": 0.5},
    ):
        sub = tf._measure(m, noise, labels, n, base, fields, own_key=True)
        with pooled():
            pw = tf._measure(m, noise, labels, n, base, fields, own_key=True)
            pa = tf._measure(m, noise, labels, n, base, fields, own_key=False)
        print(n, fields, f"subsample+own {sub:.4f}  pooled+own {pw:.4f}  pooled alone {pa:.4f}", flush=True)
