"""Reduced attention + residual cached from a full-attention step (DiTFastAttn's residual sharing), on the trained DiT."""

import contextlib

import torch
import torch.nn.functional as F

from tome_bench import trained_fidelity as tf
from tome_bench.trained_dit import load
from tome_core import dit

torch.set_num_threads(2)
orig = dit.AttentionHook.attend


@contextlib.contextmanager
def residual(every):
    cache = {}

    def attend(self, state, query, key, value, mask, scale, kernel=None):
        out = orig(self, state, query, key, value, mask, scale, kernel)
        if out is None:
            return out
        step = state.step[0] if state.step else 0
        if step % every == 0:
            full = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
            cache[id(self)] = full - out
            return full
        r = cache.get(id(self))
        return out if r is None else out + r

    dit.AttentionHook.attend = attend
    try:
        yield
    finally:
        dit.AttentionHook.attend = orig


m = load()
g = torch.Generator().manual_seed(0)
noise = torch.randn(4, 3, 64, 64, generator=g)
labels = torch.arange(4)
for n in (12, 8, 4):
    base = tf.generate(m, noise, labels, n)
    for fields in (
        {"mode": "kv", "sx": 2, "sy": 2},
        {"mode": "kv", "sx": 3, "sy": 3, "block_start": 0.2},
        {"mode": "kv", "sx": 4, "sy": 4, "block_start": 0.2},
    ):
        res = [f"{n} {fields}"]
        for every in (2, 3, 4, 6):
            if every > n:
                continue
            with residual(every):
                res.append(f"every {every}: {tf._measure(m, noise, labels, n, base, fields, own_key=True):.4f}")
        print("  ".join(res), flush=True)
