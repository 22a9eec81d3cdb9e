"""Each query's own key and value added back to the subsampled attention (2026-11-29, CPU): a prototype.

docs/runs/2026-11-29-dit-own-slot found that a query's largest share of self-attention is on its own token, and
that a reduced block takes it from three queries in four of a 2x2 cell. Regrouping the queries per slot restores it
but costs half the saving in gathers. Here every query keeps the core's keys (text, reference and the call's drawn
token of each cell) and gets its own key and value added as one more key: the attention over the kept keys returns
its log-sum-exp, and the own key joins it exactly:

    out = lerp(v_own, out_kept, sigmoid(lse_kept - s_own)),   s_own = q . k_own * scale

(a query whose own token is already kept gets weight 1: exactly the core's output). Five elementwise kernels per
block beside the attention, no gather. It replaces the core's interception of scaled_dot_product_attention
(`tome_core.dit._SdpaKeys`) in this process only.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-own-key/own.py fidelity zimage,flux2 stand-in balanced,fastest
    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-own-key/own.py estimate zimage,flux2
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
import torch.nn.functional as F

import tome_core
from tome_bench import estimate
from tome_bench.dit_fidelity import SIZES
from tome_bench.dit_standin import FAMILIES, VARIANTS, build, change, generate
from tome_core import dit, figures

MODE = {"attention": "own"}
_CORE = dit._SdpaKeys.__torch_function__
_NAMES = ("query", "key", "value", "attn_mask")
_BIAS: dict[tuple[Any, ...], torch.Tensor] = {}


def _bias(state: Any, tokens: Any, after: int, plan: Any, length: int, like: torch.Tensor) -> torch.Tensor:
    """[L] (or [B, L]): 0 where a query's own token is not among the kept keys, +inf where it is (weight 1); the
    table of every slot once per layout, its row once per call (as the core's kept-token table)."""
    device = like.device
    key = ("own", tokens.before, tokens.grid, after, tokens.shift, plan.st, plan.sy, plan.sx, str(device), like.dtype)
    row = state.rows.get(key)
    if row is None:
        table = _BIAS.get(key)
        if table is None:
            kept = dit._kept(tokens, after, plan, device)  # [S, K] or [S, B, K]
            table = _BIAS[key] = torch.zeros((*kept.shape[:-1], length), dtype=like.dtype, device=device).scatter(
                -1, kept, math.inf
            )
        row = state.rows[key] = dit._row(table, state.draw)
    return row


def _lse_attention(q: Any, k: Any, v: Any, mask: Any, scale: float) -> tuple[Any, Any]:
    """(out [B, H, L, D], log-sum-exp [B, H, L] float32): the CPU's flash kernel; on the estimate's meta device
    scaled_dot_product_attention (priced as the fused kernel) and an empty log-sum-exp (CUDA's flash and
    memory-efficient kernels write it beside the output)."""
    if q.device.type == "meta":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return out, torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=scale)


def _own(self: Any, func: Any, given: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    q, k, v, mask = given["query"], given["key"], given["value"], given.get("attn_mask")
    if q.dim() != 4 or q.shape[-2] != k.shape[-2] or kwargs.get("is_causal") or kwargs.get("dropout_p"):
        return None
    tokens = self.state.tokens
    if tokens is None or tokens.after_in(int(k.shape[-2])) is None:
        return None
    reduced = self.hook.reduce(self.state, k, v, -2, mask)
    if reduced is None:
        return None
    kk, vk, mk = reduced
    after = tokens.after_in(int(k.shape[-2]))
    if isinstance(mk, torch.Tensor) and mk.dtype == torch.bool:
        mk = torch.zeros(mk.shape, dtype=q.dtype, device=q.device).masked_fill(~mk, -math.inf)
    scale = kwargs.get("scale") or 1 / math.sqrt(q.shape[-1])
    out, lse = _lse_attention(q, kk, vk, mk, scale)  # [B, H, L, D], [B, H, L]
    bias = _bias(self.state, tokens, after, self.hook.plan, int(q.shape[-2]), q)  # [L] or [B, L]
    if bias.dim() == 2:
        bias = bias[:, None]
    s = (q * k).sum(-1)  # [B, H, L]: each query's score of its own key (unscaled)
    x = torch.add(bias, s, alpha=-scale).add_(lse).sigmoid_()  # [B, H, L]: the kept keys' share
    return torch.lerp(v, out, x.unsqueeze(-1))


def _intercept(self: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
    kwargs = kwargs or {}
    if func is not F.scaled_dot_product_attention or MODE["attention"] == "plain":
        return _CORE(self, func, types, args, kwargs)
    given = dict(zip(_NAMES, args))
    given.update({name: kwargs.pop(name) for name in _NAMES if name in kwargs})
    out = _own(self, func, given, kwargs)
    if out is None:
        return _CORE(self, func, types, tuple(given[name] for name in _NAMES if name in given), kwargs)
    return out


dit._SdpaKeys.__torch_function__ = _intercept


def fidelity(families: list[str], variant: str, presets: list[str], steps: int = 12) -> None:
    """Each preset's change of a whole generation with the core's subsampling and with the own key added, beside
    dropping steps for the same time as the core's speed table gives (12 flow-matching Euler steps, 2 samples)."""
    seeds = 2
    for name in families:
        family = FAMILIES[name]
        model = build(family, VARIANTS[variant])
        base = [generate(model, family, steps, s) for s in range(seeds)]
        for preset in presets:
            speed = figures.speed(name, preset, *SIZES[name]).speedup
            fewer = max(1, math.ceil(steps / speed - 1e-9))
            ref = sum(change(generate(model, family, fewer, s), b) for s, b in enumerate(base)) / seeds
            got = {}
            for mode in ("plain", "own"):
                MODE["attention"] = mode
                tome_core.apply_patch(model, preset=preset)
                got[mode] = sum(change(generate(model, family, steps, s), b) for s, b in enumerate(base)) / seeds
                tome_core.remove_patch(model)
            per = {m: f"{c:.4f}" + (f" ({c / ref:.2f}x)" if fewer < steps else "") for m, c in got.items()}
            print(
                f"{name} {variant} {preset}: speed-up {speed:.3f}, {fewer} steps {ref:.4f} | drawn slot {per['plain']}"
                f" | own key added {per['own']}",
                flush=True,
            )


if __name__ == "__main__":
    torch.set_num_threads(1)
    job, names = sys.argv[1], sys.argv[2].split(",")
    if job == "fidelity":
        fidelity(names, sys.argv[3], sys.argv[4].split(","))
    else:
        sys.exit(estimate.main(["--dit", "--arch", ",".join(names)]))
