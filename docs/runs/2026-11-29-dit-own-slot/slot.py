"""Keys/values subsampled per query slot on the DiT stand-ins (2026-11-29, CPU): a prototype, not the core's code.

Today every query of a reduced block attends to the text and one token per cell, the same token for all queries
(the call's drawn slot). Here a query at slot r of its cell attends to the text and the slot-r token of every cell,
so it always sees its own token; text and trailing queries keep the drawn slot. The attention work is the same;
the queries, keys and values are gathered per slot (one scaled_dot_product_attention over heads x slots) and the
text queries run in a second one. It replaces the core's interception of scaled_dot_product_attention
(`tome_core.dit._SdpaKeys`) in this process only.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-own-slot/slot.py fidelity zimage,flux2 stand-in balanced
    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-own-slot/slot.py diagonal flux,flux2,zimage
    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-own-slot/slot.py estimate zimage,flux2 [joint]
    (fidelity ... balanced slot,joint: both ways per slot beside the core's)
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

#: "slot"; "joint" (the text queries in every slot's attention, answered from slot 0's: one attention, no second
#: one and no concatenation); "ordered" (the cost alone, for the estimate, of per-slot attention on tokens that a
#: window's first block put in slot order: no query or output gathers, each slot's keys the text and a contiguous
#: run; it computes the wrong attention on tokens in raster order, so never with `fidelity`); "plain" (the core's);
#: "diagonal" (record the own-token share, unreduced)
MODE = {"attention": "slot"}
DIAGONAL: list[float] = []
_CORE = dit._SdpaKeys.__torch_function__
_NAMES = ("query", "key", "value", "attn_mask")
_TABLES: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_LABELS = {"plain": "drawn slot", "slot": "per slot", "joint": "per slot, text in each"}


def _slots(tokens: Any, after: int, plan: Any, device: torch.device) -> tuple[Any, ...]:
    """(the slots S, every slot's keys [S*K], every slot's queries [S*m], each generated token's slot [n] and place
    in it [n], and for "joint" each token's slot [L] and place [L] in the rows of the table), once per layout: a
    token a ragged cell repeats answers from its first slot."""
    key = (tokens.before, tokens.grid, after, plan.st, plan.sy, plan.sx, str(device))
    if key not in _TABLES:
        table = dit._kept(tokens, after, plan, device)  # [S, K]
        slots, width = int(table.shape[0]), int(table.shape[1]) - tokens.before - after
        cells = table[:, tokens.before : tokens.before + width].reshape(-1)  # [S*m]
        first = torch.full((tokens.generated,), slots * width, dtype=torch.long, device=device)
        first = first.scatter_reduce(0, cells - tokens.before, torch.arange(slots * width, device=device), "amin")
        slot, place = first // width, first % width
        zero = torch.zeros(tokens.before + after, dtype=torch.long, device=device)
        rest = torch.arange(tokens.before + after, device=device)
        rest = torch.where(rest < tokens.before, rest, rest + width)  # the text and trailing tokens' place in a row
        joint = (
            torch.cat([zero[: tokens.before], slot, zero[tokens.before :]]),
            torch.cat([rest[: tokens.before], place + tokens.before, rest[tokens.before :]]),
        )
        _TABLES[key] = (slots, table.reshape(-1), cells, slot, place, *joint)
    return _TABLES[key]


def _slot_attention(self: Any, func: Any, given: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    q, k, v = given["query"], given["key"], given["value"]
    tokens = self.state.tokens
    length = int(k.shape[-2])
    after = None if tokens is None else tokens.after_in(length)
    if after is None or tokens.shift or given.get("attn_mask") is not None or q.dim() != 4 or q.shape[-2] != length:
        return None
    slots, keys, queries, slot, place, joint_slot, joint_place = _slots(tokens, after, self.hook.plan, k.device)
    heads, before, n = int(q.shape[1]), tokens.before, tokens.generated
    if MODE["attention"] == "ordered":
        self.hook.reached = self.hook.applied = True
        return _ordered_cost(func, q, k, v, slots, before, n, kwargs)
    if MODE["attention"] == "joint":
        self.hook.reached = self.hook.applied = True
        qg, kg, vg = (t.index_select(-2, keys).unflatten(-2, (slots, -1)).flatten(1, 2) for t in (q, k, v))
        return func(qg, kg, vg, **kwargs).unflatten(1, (heads, slots))[:, :, joint_slot, joint_place]
    qg = q.index_select(-2, queries).unflatten(-2, (slots, -1)).flatten(1, 2)  # [B, H*S, m, D]
    kg = k.index_select(-2, keys).unflatten(-2, (slots, -1)).flatten(1, 2)  # [B, H*S, K, D]
    vg = v.index_select(-2, keys).unflatten(-2, (slots, -1)).flatten(1, 2)
    out = func(qg, kg, vg, **kwargs).unflatten(1, (heads, slots))[:, :, slot, place]  # [B, H, n, D]
    self.hook.reached = self.hook.applied = True
    if not before and not after:
        return out
    row = dit._index(self.state, tokens, after, self.hook.plan, k.device)  # the drawn slot, as the core keeps
    rest = torch.cat([q[..., :before, :], q[..., before + n :, :]], dim=-2)
    rest = func(rest, k.index_select(-2, row), v.index_select(-2, row), **kwargs)
    return torch.cat([rest[..., :before, :], out, rest[..., before:, :]], dim=-2)


def _ordered_cost(func: Any, q: Any, k: Any, v: Any, slots: int, before: int, n: int, kwargs: Any) -> Any:
    """Per-slot attention with the generated tokens in slot order: the queries of a slot and its cells' keys are
    contiguous runs, and folding the slots into the batch is a view of the [B, L, H, D] layout attention gets; each
    slot's keys are the other tokens (text before and after the grid) and its run: one concatenation for keys and
    one for values; the other tokens' queries attend to slot 0's keys."""
    batch, heads, length, dim = q.shape
    width, rest = n // slots, length - n

    def grouped(t: Any) -> Any:  # [B, H, n, D] of slot-ordered tokens -> [B*S, H, m, D], a view
        return t.transpose(1, 2)[:, before : before + n].unflatten(1, (slots, width)).flatten(0, 1).transpose(1, 2)

    def others(t: Any) -> Any:  # [B, L - n, H, D]: the text before and after the grid
        t = t.transpose(1, 2)
        return torch.cat([t[:, :before], t[:, before + n :]], dim=1)

    def with_text(t: Any) -> Any:  # [B*S, H, T+m, D]: the text beside each slot's run
        text = others(t).unsqueeze(1).expand(batch, slots, rest, heads, dim)
        cells = t.transpose(1, 2)[:, before : before + n].unflatten(1, (slots, width))
        return torch.cat([text, cells], dim=2).flatten(0, 1).transpose(1, 2)

    kg, vg = with_text(k), with_text(v)
    out = func(grouped(q), kg, vg, **kwargs)  # [B*S, H, m, D]
    out = out.transpose(1, 2).unflatten(0, (batch, slots)).flatten(1, 2).transpose(1, 2)  # [B, H, n, D]
    if not rest:
        return out
    text = func(others(q).transpose(1, 2), kg[:batch], vg[:batch], **kwargs)  # [B, H, L - n, D]
    return torch.cat([text[..., :before, :], out, text[..., before:, :]], dim=-2)


def _intercept(self: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
    kwargs = kwargs or {}
    if func is not F.scaled_dot_product_attention or MODE["attention"] == "plain":
        return _CORE(self, func, types, args, kwargs)
    given = dict(zip(_NAMES, args))
    given.update({name: kwargs.pop(name) for name in _NAMES if name in kwargs})
    if MODE["attention"] == "diagonal":
        q, k = given["query"], given["key"]
        if q.shape[-2] == k.shape[-2] and given.get("attn_mask") is None:
            scale = kwargs.get("scale") or 1 / math.sqrt(q.shape[-1])
            p = torch.softmax((q @ k.transpose(-1, -2)) * scale, -1)
            DIAGONAL.append(float(p.diagonal(dim1=-2, dim2=-1).mean()))
        return func(*(given[name] for name in _NAMES if name in given), **kwargs)
    out = _slot_attention(self, func, given, kwargs)
    if out is None:  # not the joint sequence, or masked: the core's subsampling
        return _CORE(self, func, types, tuple(given[name] for name in _NAMES if name in given), kwargs)
    return out


dit._SdpaKeys.__torch_function__ = _intercept


def fidelity(
    families: list[str], variant: str, presets: list[str], modes: tuple[str, ...] = ("slot",), steps: int = 12
) -> None:
    """Each preset's change of a whole generation, with the core's subsampling and per slot, beside dropping steps
    for the same time as the core's speed table gives (12 flow-matching Euler steps, 2 samples, as the panel)."""
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
            for mode in ("plain", *modes):
                MODE["attention"] = mode
                tome_core.apply_patch(model, preset=preset)
                got[mode] = sum(change(generate(model, family, steps, s), b) for s, b in enumerate(base)) / seeds
                tome_core.remove_patch(model)
            per = {m: f"{c:.4f}" + (f" ({c / ref:.2f}x)" if fewer < steps else "") for m, c in got.items()}
            shown = " | ".join(f"{_LABELS[m]} {per[m]}" for m in ("plain", *modes))
            print(f"{name} {variant} {preset}: speed-up {speed:.3f}, {fewer} steps {ref:.4f} | {shown}", flush=True)


def diagonal(families: list[str], variant: str = "stand-in") -> None:
    """The mean share of a query's self-attention on its own token (two steps, every block's joint attention)."""
    for name in families:
        family = FAMILIES[name]
        model = build(family, VARIANTS[variant])
        MODE["attention"], DIAGONAL[:] = "diagonal", []
        tome_core.apply_patch(model, mode="kv", sx=2, sy=2)  # only to intercept every block's attention
        generate(model, family, 2, 0)
        tome_core.remove_patch(model)
        share = sum(DIAGONAL) / max(len(DIAGONAL), 1)
        print(f"{name} {variant}: own token's share of self-attention {share:.3f} ({len(DIAGONAL)} attentions)")


if __name__ == "__main__":
    torch.set_num_threads(1)
    job, names = sys.argv[1], sys.argv[2].split(",")
    if job == "fidelity":
        fidelity(
            names, sys.argv[3], sys.argv[4].split(","), tuple(sys.argv[5].split(",")) if sys.argv[5:] else ("slot",)
        )
    elif job == "diagonal":
        diagonal(names)
    else:  # estimate [slot|joint|ordered]
        MODE["attention"] = sys.argv[3] if sys.argv[3:] else "slot"
        sys.exit(estimate.main(["--dit", "--arch", ",".join(names)]))
