"""Where a query's self-attention goes on each stand-in (one call at sigma 0.5, natural-spectrum start): the text, its
own token, the rings of tokens 1, 2, 3 and 4 or more cells away (Chebyshev distance on the 24x24 grid), and the
entropy over log N. The column means over every joint attention of the call, then each attention's row.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-proportional/shares.py flux,flux2,qwen,zimage
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from tome_bench.dit_standin import FAMILIES, VARIANTS, build, one_call

SIDE = 24  # the stand-ins' token grid at 384 px


class Shares(TorchFunctionMode):
    """Per joint attention: [text, own, ring 1, ring 2, ring 3, ring >= 4, entropy / log N], image queries' mean."""

    def __init__(self, text: int) -> None:
        super().__init__()
        self.text = text
        self.rows: list[list[float]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q = args[0] if args else kwargs["query"]
            k = args[1] if len(args) > 1 else kwargs["key"]
            n = SIDE * SIDE
            if q.shape[-2] == self.text + n:
                scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
                p = torch.softmax(scores, -1)[..., self.text :, :]  # [B, H, n, L]: the image's queries
                image = p[..., self.text :]  # [B, H, n, n]
                rows, cols = torch.arange(n) // SIDE, torch.arange(n) % SIDE
                ring = torch.maximum((rows[:, None] - rows).abs(), (cols[:, None] - cols).abs())  # [n, n]
                row = [p[..., : self.text].sum(-1).mean().item()]
                row += [(image * (ring == j)).sum(-1).mean().item() for j in range(4)]
                row.append((image * (ring >= 4)).sum(-1).mean().item())
                entropy = -(p.clamp_min(1e-12).log() * p).sum(-1).mean().item()
                self.rows.append([*row, entropy / math.log(q.shape[-2])])
        return func(*args, **kwargs)


if __name__ == "__main__":
    torch.set_num_threads(1)
    for name in sys.argv[1].split(","):
        family = FAMILIES[name]
        model = build(family, VARIANTS["stand-in"])
        with Shares(family.text) as shares:
            one_call(model, family, 0)
        rows = torch.tensor(shares.rows)
        means = " ".join(f"{v:.3f}" for v in rows.mean(0))
        print(name, len(rows), "text, own, ring1, ring2, ring3, >=4, entropy:", means)
        for i, row in enumerate(rows):
            print("  ", i, " ".join(f"{v:.3f}" for v in row))
