"""Each query's own key, four ways, on every family's stand-in at the Balanced of 2026-11-29 (2026-11-29, CPU).

- none: the kept keys alone (the published naive recipe).
- own: the own key joins the kept keys, each kept key counted once (the core's rule for Z-Image and Lumina 2
  before this run): out = lerp(v_own, out_kept, sigmoid(lse_kept - s_own)).
- prop: the kept keys weigh as the cells they stand for (ToMe's proportional attention), the own key once:
  sigmoid(lse_kept + log(cell) - s_own); a query whose own token is kept keeps the kept keys' output.
- prop-exact: as prop, and a query whose own token is kept counts it once too (the kept keys' output
  extrapolated away from it: w = 1 / (1 + c exp(s_own - lse_kept - log cell)), c = 1 - cell).

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-proportional/compare.py flux2,sd3 none,own,prop,prop-exact balanced

compare-*.log ran this on the core of 7dac926 (whose own key was `own` for Z-Image and Lumina 2, the others `none`),
with the own key forced on for every family; `balanced` was then the presets of 7dac926. On the core after this run
the presets differ: pass a setting (`mode='kv',sx=2,sy=2,block_start=0.2`) to rerun the same comparison.
"""

from __future__ import annotations

import math
import sys

import torch

import tome_core
from tome_bench.dit_standin import FAMILIES, VARIANTS, build, change, generate
from tome_core import dit
from tome_core.compat import attention_lse

VARIANT = {"name": "prop"}


def attend(
    self: dit.AttentionHook,
    state: dit.DitState,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: object,
    scale: float | None,
) -> torch.Tensor | None:
    tokens = state.tokens
    reduced = self.reduce(state, key, value, -2, mask)
    if reduced is None or tokens is None:
        return None
    after = tokens.after_in(int(key.shape[-2]))
    scale = scale if scale is not None else 1.0 / float(query.shape[-1]) ** 0.5
    out, lse = attention_lse(query, reduced[0], reduced[1], reduced[2], scale)  # [B, H, L, D], [B, H, L]
    kept = torch.zeros(int(key.shape[-2]), dtype=torch.bool)  # [L]: the own token among the kept keys
    kept[dit._index(state, tokens, after, self.plan, key.device)] = True
    cell = self.plan.sx * self.plan.sy * self.plan.st
    s = (query * key).sum(-1) * scale  # [B, H, L] the own key's logit
    self.own_key = True
    name = VARIANT["name"]
    if name == "own":
        w = torch.where(kept, 1.0, torch.sigmoid(lse - s))
    elif name == "prop":
        w = torch.where(kept, 1.0, torch.sigmoid(lse + math.log(cell) - s))
    elif name == "prop-exact":
        c = torch.where(kept, 1.0 - cell, 1.0)
        w = 1.0 / (1.0 + c * torch.exp(s - lse - math.log(cell)))
    else:
        raise ValueError(name)
    return torch.lerp(value, out, w.to(value.dtype).unsqueeze(-1))


if __name__ == "__main__":
    torch.set_num_threads(1)
    dit.AttentionHook.attend = attend
    names, variants, settings = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3].split(";")
    steps, seeds = 12, int(sys.argv[4]) if sys.argv[4:] else 1
    for name in names:
        family = FAMILIES[name]
        model = build(family, VARIANTS["stand-in"])
        base = [generate(model, family, steps, s) for s in range(seeds)]
        ref = sum(change(generate(model, family, steps - 1, s), b) for s, b in enumerate(base)) / seeds
        print(f"{name} 11 steps: {ref:.4f}", flush=True)
        for setting in settings:
            fields = {"preset": setting} if "=" not in setting else eval(f"dict({setting})")
            for variant in variants:
                VARIANT["name"] = variant
                tome_core.apply_patch(model, **fields)
                state = getattr(model, tome_core.patch.STATE_ATTR)
                state.own_key = variant != "none"
                got = sum(change(generate(model, family, steps, s), b) for s, b in enumerate(base)) / seeds
                tome_core.remove_patch(model)
                print(f"{name} {setting} {variant}: {got:.4f} ({got / ref:.2f}x)", flush=True)
