"""Text and reference keys weighed as one token each, on every family's stand-in (2026-11-29, CPU).

- prop: the core of ac0ffd9 as it is. The kept keys weigh as the cells they stand for by one log(cell) added to the
  kept keys' log-sum-exp against the own key: out = lerp(v_own, out_kept, sigmoid(lse_kept + log(cell) - s_own)).
  The text and reference keys among the kept ones weigh as a cell too (against the own key), and a text query's kept
  image keys as one token.
- keyed: log(cell) added to the logits of the kept generated keys only, in the kept keys' attention (ToMe's
  proportional attention, per key): text and reference keys weigh one token for every query;
  out = lerp(v_own, out_kept, sigmoid(lse_kept - s_own)). The attention then runs with a mask (keyed.diff: the core
  with this from 4x4 cells on, not adopted: README.md).
- count: one log on the kept keys' log-sum-exp as prop, of the tokens the kept keys stand for over their count,
  (text + generated kept x cell) / (text + generated kept), instead of cell (not adopted: README.md).

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-text-weight/compare.py flux,qwen prop,keyed balanced 2
"""

from __future__ import annotations

import math
import sys

import torch

import tome_core
from tome_bench.dit_standin import FAMILIES, VARIANTS, build, change, generate
from tome_core import dit
from tome_core.compat import additive, attention_lse

VARIANT = {"name": "prop"}
CORE = dit.AttentionHook.attend


def attend(
    self: dit.AttentionHook,
    state: dit.DitState,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: object,
    scale: float | None,
) -> torch.Tensor | None:
    if VARIANT["name"] == "prop":
        return CORE(self, state, query, key, value, mask, scale)
    if VARIANT["name"] == "count":
        return count(self, state, query, key, value, mask, scale)
    tokens = state.tokens
    reduced = self.reduce(state, key, value, -2, mask)
    if reduced is None or tokens is None:
        return None
    after = tokens.after_in(int(key.shape[-2]))
    scale = scale if scale is not None else 1.0 / float(query.shape[-1]) ** 0.5
    index = dit._index(state, tokens, after, self.plan, key.device)  # [K]
    cell = self.plan.sx * self.plan.sy * self.plan.st
    generated = (index >= tokens.before) & (index < tokens.before + tokens.generated)
    bias = torch.where(generated, math.log(cell), 0.0).to(query.dtype)  # [K]
    bias = bias.reshape(1, 1, 1, -1) if bias.dim() == 1 else bias.reshape(bias.shape[0], 1, 1, -1)
    if isinstance(reduced[2], torch.Tensor):
        bias = bias + additive(reduced[2], query.dtype)
    out, lse = attention_lse(query, reduced[0], reduced[1], bias, scale)  # [B, H, L, D], [B, H, L]
    # [L] or [B, 1, L]: the own token among the kept keys
    kept = torch.zeros(*index.shape[:-1], int(key.shape[-2]), dtype=torch.bool).scatter(-1, index, True)
    kept = kept if index.dim() == 1 else kept.unsqueeze(1)
    s = (query * key).sum(-1) * scale  # [B, H, L] the own key's logit
    self.own_key = True
    w = torch.where(kept, 1.0, torch.sigmoid(lse - s))
    return torch.lerp(value, out, w.to(value.dtype).unsqueeze(-1))


def count(
    self: dit.AttentionHook,
    state: dit.DitState,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: object,
    scale: float | None,
) -> torch.Tensor | None:
    """One log on the kept keys' log-sum-exp as the core's, of the tokens the kept keys stand for over their count:
    (unreduced + generated kept x cell) / (unreduced + generated kept) instead of cell."""
    tokens = state.tokens
    reduced = self.reduce(state, key, value, -2, mask)
    if reduced is None or tokens is None:
        return None
    after = tokens.after_in(int(key.shape[-2]))
    scale = scale if scale is not None else 1.0 / float(query.shape[-1]) ** 0.5
    index = dit._index(state, tokens, after, self.plan, key.device)  # [K] or [B, K]
    cell = self.plan.sx * self.plan.sy * self.plan.st
    generated = ((index >= tokens.before) & (index < tokens.before + tokens.generated)).sum(-1, keepdim=True)
    total = int(index.shape[-1])
    stands = (total - generated + generated * cell).float() / total  # [1] or [B, 1]
    out, lse = attention_lse(query, reduced[0], reduced[1], reduced[2], scale)
    kept = torch.zeros(*index.shape[:-1], int(key.shape[-2]), dtype=torch.bool).scatter(-1, index, True)
    kept = kept if index.dim() == 1 else kept.unsqueeze(1)
    s = (query * key).sum(-1) * scale
    self.own_key = True
    bias = stands.log() if index.dim() == 1 else stands.log().view(-1, 1, 1)
    w = torch.where(kept, 1.0, torch.sigmoid(lse + bias - s))
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
                got = sum(change(generate(model, family, steps, s), b) for s, b in enumerate(base)) / seeds
                tome_core.remove_patch(model)
                print(f"{name} {setting} {variant}: {got:.4f} ({got / ref:.2f}x)", flush=True)
