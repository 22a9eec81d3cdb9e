"""Milder settings on the trained DiT (a check beside trained-fidelity.json): keys/values 2x2 from 0.8 and 0.5 of the
depth, in every block in half of the steps; the naive port on the untrained architecture.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-06-trained-dit/milder.py
"""

import torch

from tome_bench import trained_fidelity as tf
from tome_bench.trained_dit import TrainedDiT, load

torch.set_num_threads(2)
m = load()
g = torch.Generator().manual_seed(0)
noise = torch.randn(4, 3, 64, 64, generator=g)
labels = torch.arange(4)
for n in (12,):
    base = tf.generate(m, noise, labels, n)
    print("repeat", tf.change(tf.generate(m, noise, labels, n), base))
    for fields in (
        {"mode": "kv", "sx": 2, "sy": 2, "block_start": 0.8},
        {"mode": "kv", "sx": 2, "sy": 2, "block_start": 0.5},
        {"mode": "kv", "sx": 2, "sy": 2},
    ):
        for own in (True, False):
            print(
                fields, "own" if own else "alone", round(tf._measure(m, noise, labels, n, base, fields, own_key=own), 4)
            )
    # half the steps at the end only: step window
    print(
        "kv2 last half steps",
        round(
            tf._measure(m, noise, labels, n, base, {"mode": "kv", "sx": 2, "sy": 2, "step_start": 0.5}, own_key=True), 4
        ),
    )
    print(
        "kv2 first half steps",
        round(
            tf._measure(m, noise, labels, n, base, {"mode": "kv", "sx": 2, "sy": 2, "step_end": 0.5}, own_key=True), 4
        ),
    )
# random weights model
torch.manual_seed(0)
r = TrainedDiT(m.null)
r.eval().requires_grad_(False)
base = tf.generate(r, noise, labels, 12)
print("random kv2", round(tf._measure(r, noise, labels, 12, base, {"mode": "kv", "sx": 2, "sy": 2}, own_key=False), 4))
