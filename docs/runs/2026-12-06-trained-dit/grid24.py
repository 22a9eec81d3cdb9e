"""The trained model's profile on the evaluation crops' central 24x24 tokens (the stand-ins' grid; the same content
scale, a smaller window) beside the 32x32 crops, at each sigma: how the figures move with the grid.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-06-trained-dit/grid24.py > docs/runs/2026-12-06-trained-dit/grid24.log
"""

from __future__ import annotations

import torch

from tome_bench import attention_profile, trained_dit
from tome_bench.attention_profile import Layout, Profile, summary

if __name__ == "__main__":
    torch.set_num_threads(1)
    model = trained_dit.load()
    x0, label = trained_dit.eval_set()
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    results = {}
    for side in (32, 24):
        start = (x0.shape[-1] - 2 * side) // 2
        window = slice(start, start + 2 * side)
        x, n = x0[..., window, window], noise[..., window, window]
        layout = Layout(trained_dit.TEXT, (1, side, side), trained_dit.TEXT)
        per = {}
        for sigma in attention_profile.SIGMAS:
            with torch.no_grad(), Profile(layout) as profile:
                model((1 - sigma) * x + sigma * n, torch.full((len(x),), sigma), label)
            per[str(sigma)] = {"mean": summary(profile.rows)}
        results[f"trained {side}x{side}"] = per
    print(attention_profile.table(results))
