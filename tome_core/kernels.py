"""Attention kernels that give each query's own key what it needs: the kept keys' output and log-sum-exp.

A reduced block's queries attend to the kept keys/values and to their own key (`tome_core.dit.AttentionHook.attend`):
the two join through the log-sum-exp of the kept keys' scores, which PyTorch's kernels return beside the output
(`tome_core.compat.attention_lse`), and so do the kernels people run for speed:

* SageAttention 2.x: `sageattn(q, k, v, tensor_layout=..., is_causal=..., sm_scale=..., return_lse=True)` returns
  `(out, lse)`, lse float32 [B, H, L] in natural log of the exact scores' sum (scores from INT8 q/k; with `smooth_k`
  the kernel adds back the sm_scale * q.mean(k) it took out). SageAttention 3 and int8 kernels return none.
* flash-attn 2: `flash_attn_func(q, k, v, ..., return_attn_probs=True)` returns `(out, softmax_lse, S_dmask)`
  on [B, L, H, D] tensors; flash-attn 3 returns `(out, softmax_lse)`.
* xformers: `ops.memory_efficient_attention_partial(q, k, v, ...)` returns `(out, lse)` on [B, L, H, D] tensors,
  lse [B, H, >= L] (padded), out float32 unless `output_dtype` says otherwise.

The core imports none of them: a host hands over the function it would call itself (ComfyUI's `sageattn` from the
module of its attention function, say), so the kernel that runs is the one the user chose, never a replacement.
A kernel that gives no log-sum-exp (a build whose `sageattn` ignores `return_lse`) still runs once with the kept
keys; `LseKernel.run` then returns its output with lse None, and the block runs without the own key, saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tome_core.compat import attention_lse

#: What a kernel returns: out [B, H, L, D] in the queries' dtype, lse [B, H, L] float32 or None.
Found = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class LseKernel:
    """One attention kernel, as the core calls it: `run(q, k, v, mask, scale)` on [B, H, L, D] / [B, H, K, D]
    tensors (mask additive or boolean, broadcast to [B, H, L, K], or None) -> `Found`. `name` is what logs and
    infotexts say ran; `masks` whether it takes a mask (a call with one goes to the host's own function)."""

    name: str
    run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any, float], Found]
    masks: bool = False
    #: dtypes the kernel runs (None: any); a call in another goes to the host's function, which falls back itself.
    dtypes: frozenset[torch.dtype] | None = None

    def fits(self, query: torch.Tensor, mask: Any) -> str | None:
        """None when the kernel can run this call, else why not (the log's words)."""
        if mask is not None and not self.masks:
            return f"{self.name} takes no attention mask"
        if self.dtypes is not None and query.dtype not in self.dtypes:
            return f"{self.name} does not run {str(query.dtype).removeprefix('torch.')}"
        return None


HALF = frozenset({torch.float16, torch.bfloat16})


def pytorch() -> LseKernel:
    """PyTorch's attention kernels (flash, memory-efficient, the CPU's), called as scaled_dot_product_attention
    calls them: any dtype, masks too."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float) -> Found:
        return attention_lse(q, k, v, mask, scale)

    return LseKernel("PyTorch", run, masks=True)


def sage(sageattn: Callable[..., Any], name: str = "SageAttention") -> LseKernel:
    """SageAttention 2.x's `sageattn` (or one of its `sageattn_qk_int8_*` kernels: the same keywords)."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float) -> Found:
        found = sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=scale, return_lse=True)
        if isinstance(found, tuple) and len(found) == 2 and isinstance(found[1], torch.Tensor):
            return found[0], found[1].float()
        return _alone(found)

    return LseKernel(name, run, dtypes=HALF)


def flash(flash_attn_func: Callable[..., Any], name: str = "flash-attn") -> LseKernel:
    """flash-attn 2's or 3's `flash_attn_func` ([B, L, H, D] tensors)."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float) -> Found:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, L, H, D]
        # No dropout_p: flash-attn 3's function has none (2's defaults to 0).
        found = flash_attn_func(q, k, v, softmax_scale=scale, causal=False, return_attn_probs=True)
        if isinstance(found, tuple) and len(found) >= 2 and isinstance(found[1], torch.Tensor):
            return found[0].transpose(1, 2), found[1].float()
        out, _ = _alone(found)
        return out.transpose(1, 2), None

    return LseKernel(name, run, dtypes=HALF)


def xformers(partial: Callable[..., Any], name: str = "xformers") -> LseKernel:
    """xformers' `ops.memory_efficient_attention_partial` ([B, L, H, D] tensors; its lse may be padded)."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float) -> Found:
        length = int(q.shape[-2])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, L, H, D]
        out, lse = partial(q, k, v, attn_bias=None, scale=scale, output_dtype=q.dtype)
        return out.transpose(1, 2), lse[..., :length].float()

    return LseKernel(name, run)


def _alone(found: Any) -> Found:
    """A kernel's output without a log-sum-exp: the first of a tuple, or the tensor itself."""
    out = found[0] if isinstance(found, tuple) else found
    return out, None
