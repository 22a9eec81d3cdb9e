"""The estimated speed-ups (H200 cost model) of local.py's settings at Flux.1-dev 1024² and Wan 2.1 14B 832x480x81,
with the step saving at each interpolated from the logs' dropped-step changes (12 steps)."""

import math

from tome_bench import trained_fidelity as tf

DROPS = {
    "flux": {12: 0.0, 11: 0.0372, 10: 0.0265, 9: 0.0519, 8: 0.0595},
    "wan": {12: 0.0, 11: 0.0272, 10: 0.0573, 9: 0.0635, 8: 0.0984},
}
SETTINGS = {
    "flux": [
        {"mode": "kv", "sx": 2, "sy": 2, "step_start": 0.5},
        {"mode": "kv", "sx": 2, "sy": 2, "step_start": 0.0},
        {"mode": "kv", "sx": 4, "sy": 4, "step_start": 0.5},
    ],
    "wan": [
        {"mode": "kv", "sx": 2, "sy": 2, "step_start": 0.5},
        {"mode": "kv", "sx": 2, "sy": 2, "step_start": 0.0},
        {"mode": "kv", "sx": 4, "sy": 4, "step_start": 0.5},
        {"mode": "kv", "sx": 2, "sy": 1, "st": 1, "step_start": 0.5},
        {"mode": "kv", "sx": 2, "sy": 2, "st": 2, "step_start": 0.5},
        {"mode": "kv", "sx": 3, "sy": 3, "st": 1, "step_start": 0.25},
    ],
}
for which, rows in SETTINGS.items():
    drops = DROPS[which]
    for fields in rows:
        speed = tf.speedup(which, fields)
        saved = 12 - 12 / speed
        k = math.floor(saved)
        lo, hi = drops.get(12 - k), drops.get(12 - k - 1)
        ref = "n/a (below 8 steps)" if lo is None or hi is None else f"{lo + (saved - k) * (hi - lo):.4f}"
        print(f"{which} {fields}: {speed:.3f}x, step saving {ref}", flush=True)
