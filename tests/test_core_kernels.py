"""Each query's own key under the kernels people run for speed (issue 58): SageAttention 2, flash-attn and xformers
return the log-sum-exp the own key joins through (`tome_core.kernels`), each in its own layout and convention; the
stand-ins (tests/attention_kernels.py) follow those, SageAttention's INT8 rounding and `smooth_k` shift included."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import tome_core
from tome_core import kernels
from tome_core.dit import AttentionHook
from tome_core.merge import kv_index

import attention_kernels as lib
from dit_models import TINY, run

KERNELS = {
    "sage": lambda: kernels.sage(lib.sageattn),
    "flash": lambda: kernels.flash(lib.flash_attn_func),
    "xformers": lambda: kernels.xformers(lib.memory_efficient_attention_partial),
}


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, before: int, grid: Any, draw: int) -> torch.Tensor:
    """Exact attention (float32) over the text keys, the call's kept key of each 2x2 cell weighing as its 4 tokens,
    and each query's own key once: what the own key's combine computes."""
    length, n = int(k.shape[-2]), math.prod(grid)
    kept = torch.zeros(length, length, dtype=torch.bool)
    kept[:, kv_index(before, grid, length - before - n, 1, 2, 2, "cpu", draw)] = True
    bias = torch.where(kept, math.log(4), -math.inf)
    bias = torch.where(torch.eye(length, dtype=torch.bool) & ~kept, 0.0, bias)
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias)


def kept_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, before: int, grid: Any, draw: int) -> torch.Tensor:
    """Exact attention over the text keys and the kept keys alone (the kernel's own task, to measure its error)."""
    length, n = int(k.shape[-2]), math.prod(grid)
    index = kv_index(before, grid, length - before - n, 1, 2, 2, "cpu", draw)
    return F.scaled_dot_product_attention(q.float(), k[..., index, :].float(), v[..., index, :].float())


def spied(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, kernel: Any) -> list[tuple[Any, ...]]:
    """Runs a patched tiny Flux (2x2 cells) with every reduced block's attention also run in `dtype` by `kernel`;
    returns (q, k, v, out, draw, tokens) of each, in `dtype`."""
    seen: list[tuple[Any, ...]] = []
    attend = AttentionHook.attend

    def spy(hook: AttentionHook, state: Any, q: Any, k: Any, v: Any, mask: Any, scale: Any, given: Any = None) -> Any:
        out = attend(hook, state, q, k, v, mask, scale, given)
        half = [t.to(dtype) for t in (q, k, v)]
        seen.append((*half, attend(hook, state, *half, mask, scale, kernel), int(state.draw), state.tokens))
        return out

    monkeypatch.setattr(AttentionHook, "attend", spy)
    tiny = TINY["flux"]()
    model = tiny.build()
    tome_core.apply_patch(model, sx=2, sy=2)
    run(model, tiny)
    stats = tome_core.stats(model)
    tome_core.remove_patch(model)
    assert stats is not None and stats.applied == stats.selected > 0 and seen
    return seen


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(KERNELS))
def test_the_own_key_joins_through_each_kernels_log_sum_exp(
    name: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under SageAttention 2 (INT8 q/k, smooth_k), flash-attn and xformers (their layouts, xformers' padded lse and
    float32 output) the combine equals exact attention over [kept keys, own key] within the kernel's own error on
    the kept keys (twice it, and the rounding of one output in `dtype`)."""
    for q, k, v, out, draw, tokens in spied(monkeypatch, dtype, KERNELS[name]()):
        assert out.dtype == dtype and out.shape == q.shape
        expected = reference(q, k, v, tokens.before, tokens.grid, draw)
        alone = KERNELS[name]().run(*_kept(q, k, v, tokens, draw), None, q.shape[-1] ** -0.5)[0].float()
        kernel_error = (alone - kept_only(q, k, v, tokens.before, tokens.grid, draw)).abs().max()
        error = (out.float() - expected).abs().max()
        ulp = torch.finfo(dtype).eps * float(v.abs().max())
        assert float(error) <= 2 * float(kernel_error) + 2 * ulp, (name, float(error), float(kernel_error), ulp)


def _kept(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tokens: Any, draw: int) -> tuple[torch.Tensor, ...]:
    length, n = int(k.shape[-2]), math.prod(tokens.grid)
    index = kv_index(tokens.before, tokens.grid, length - tokens.before - n, 1, 2, 2, "cpu", draw)
    return q, k[..., index, :], v[..., index, :]


def test_a_log_sum_exp_in_another_convention_does_not_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above can fail: SageAttention's lse without the kernel's own correction (base 2, smoothed scores)
    weighs the own key wrongly, far outside the kernel's error."""
    worst = 0.0
    for q, k, v, out, draw, tokens in spied(monkeypatch, torch.float16, kernels.sage(lib.sageattn_raw_lse)):
        worst = max(worst, float((out.float() - reference(q, k, v, tokens.before, tokens.grid, draw)).abs().max()))
    right = 0.0
    for q, k, v, out, draw, tokens in spied(monkeypatch, torch.float16, kernels.sage(lib.sageattn)):
        right = max(right, float((out.float() - reference(q, k, v, tokens.before, tokens.grid, draw)).abs().max()))
    assert worst > 10 * right, (worst, right)


def test_a_kernel_without_log_sum_exp_runs_the_kept_keys_alone_and_says_so() -> None:
    """SageAttention 3 (no lse, whatever is asked): its output over the kept keys stands, and the stats name it and
    why the own key was off."""
    tiny = TINY["flux"]()
    model = tiny.build()
    tome_core.apply_patch(model, sx=2, sy=2)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    kernel = kernels.sage(lib.sageattn3, "SageAttention 3")
    attend = AttentionHook.attend

    def with_sage3(
        hook: AttentionHook, state: Any, q: Any, k: Any, v: Any, mask: Any, scale: Any, _: Any = None
    ) -> Any:
        out = attend(hook, state, q.half(), k.half(), v.half(), mask, scale, kernel)
        seen.append((out, lib.sageattn(*_kept(q.half(), k.half(), v.half(), state.tokens, int(state.draw)))))
        return out.to(q.dtype)

    try:
        AttentionHook.attend = with_sage3  # type: ignore[method-assign]
        run(model, tiny)
    finally:
        AttentionHook.attend = attend  # type: ignore[method-assign]
    stats = tome_core.stats(model)
    tome_core.remove_patch(model)
    assert seen and all(torch.equal(out, alone) for out, alone in seen)
    assert stats is not None and dict(stats.modules).get("own", 0) == 0
    assert stats.kernels == (("SageAttention 3", stats.applied),)
    assert stats.own_key_off == (("SageAttention 3 returned no log-sum-exp", stats.applied),)


def test_a_kernel_states_what_it_cannot_run() -> None:
    q = torch.zeros(1, 1, 4, 8)
    assert kernels.sage(lib.sageattn).fits(q, None) == "SageAttention does not run float32"
    assert kernels.flash(lib.flash_attn_func).fits(q.half(), torch.zeros(1, 1, 4, 4)) == (
        "flash-attn takes no attention mask"
    )
    assert kernels.xformers(lib.memory_efficient_attention_partial).fits(q, None) is None
    assert kernels.pytorch().fits(q, torch.zeros(1, 1, 4, 4)) is None
