"""Stand-ins of the attention kernels people run for speed, written from their signatures and documented semantics
(none of their code): what `tome_core.kernels` calls, on the CPU.

    sageattn           SageAttention 2.x: q/k quantized to INT8 per block of 64 tokens (per head), `smooth_k`
                       subtracting the keys' mean first (the scores shift by -sm_scale * q.mean(k), which the kernel
                       adds back to the lse it returns), the lse kept in base 2 inside and returned in natural log;
                       fp16/bf16 only; `attn_mask` ignored, as the real kernel's **kwargs ignores it
    sageattn_raw_lse   the same, but returning the lse of the smoothed scores in base 2 (what a wrapper that skipped
                       the kernel's own correction would hand on): the combine must notice
    sageattn3          SageAttention 3 (`sageattn3_blackwell`) and int8 kernels: no lse, whatever is asked
    flash_attn_func    flash-attn 2: [B, L, H, D], `return_attn_probs=True` -> (out, softmax_lse [B, H, L], None)
    memory_efficient_attention_partial
                       xformers: [B, L, H, D] -> (out float32 unless `output_dtype`, lse [B, H, L padded to 32])
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch

LOG2E = 1.44269504  # the constant SageAttention divides its base-2 lse by
BLOCK = 64  # tokens per quantization block


def _int8(x: torch.Tensor) -> torch.Tensor:
    """x [B, H, L, D] rounded as per-block INT8 quantization leaves it: one scale per 64 tokens of a head."""
    b, h, n, d = x.shape
    pad = -n % BLOCK
    blocks = torch.nn.functional.pad(x.float(), (0, 0, 0, pad)).view(b, h, -1, BLOCK, d)  # [B, H, n/64, 64, D]
    scale = blocks.abs().amax(dim=(-1, -2), keepdim=True).clamp_min(1e-8) / 127
    return (torch.round(blocks / scale) * scale).view(b, h, -1, d)[:, :, :n]


def _hnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "HND":
        return x
    if layout == "NHD":
        return x.transpose(1, 2)
    raise ValueError(f"tensor_layout must be 'HND' or 'NHD', got {layout!r}")


def _sage(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str, sm_scale: float | None, smooth_k: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out in q's layout and dtype, lse base 2 of the scores as quantized, correction [B, H, L] float32)."""
    if q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype:
        raise TypeError("Input tensors must be in dtype of torch.float16 or torch.bfloat16")
    q, k, v = (_hnd(t, layout) for t in (q, k, v))
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    mean = k.float().mean(dim=-2, keepdim=True) if smooth_k else torch.zeros_like(k[..., :1, :], dtype=torch.float32)
    correction = (q.float() @ mean.transpose(-1, -2)).squeeze(-1)  # [B, H, L]
    scores = (_int8(q) @ _int8(k.float() - mean).transpose(-1, -2)) * scale  # [B, H, L, K] float32
    lse2 = torch.logsumexp(scores, dim=-1) * LOG2E
    out = (torch.softmax(scores, dim=-1).to(torch.float16) @ v.to(torch.float16)).to(q.dtype)
    return _hnd(out, layout), lse2, correction


def sageattn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: float | None = None,
    return_lse: bool = False,
    smooth_k: bool = True,
    **kwargs: Any,
) -> Any:
    assert not is_causal
    out, lse2, correction = _sage(q, k, v, tensor_layout, sm_scale, smooth_k)
    if not return_lse:
        return out
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    return out, lse2 / LOG2E + correction * scale if smooth_k else lse2 / LOG2E


def sageattn_raw_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> Any:
    out, lse2, _ = _sage(q, k, v, kwargs.get("tensor_layout", "HND"), kwargs.get("sm_scale"), True)
    return (out, lse2) if kwargs.get("return_lse") else out


def sageattn3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    kwargs.pop("return_lse", None)
    return sageattn(q, k, v, **kwargs)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    return_attn_probs: bool = False,
    **kwargs: Any,
) -> Any:
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    assert dropout_p == 0.0 and not causal
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    scores = (q.float().transpose(1, 2) @ k.float().transpose(1, 2).transpose(-1, -2)) * scale  # [B, H, L, K]
    out = (torch.softmax(scores, dim=-1) @ v.float().transpose(1, 2)).to(q.dtype).transpose(1, 2)  # [B, L, H, D]
    return (out, torch.logsumexp(scores, dim=-1), None) if return_attn_probs else out


def memory_efficient_attention_partial(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: Any = None,
    p: float = 0.0,
    scale: float | None = None,
    *,
    op: Any = None,
    output_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if attn_bias is not None:
        raise ValueError("memory_efficient_attention_partial takes no tensor bias")
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    scores = (query.float().transpose(1, 2) @ key.float().transpose(1, 2).transpose(-1, -2)) * scale
    out = (torch.softmax(scores, dim=-1) @ value.float().transpose(1, 2)).transpose(1, 2)  # [B, L, H, D] float32
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, L]
    pad = -lse.shape[-1] % 32
    lse = torch.nn.functional.pad(lse, (0, pad), value=math.inf)  # padded rows hold garbage in xformers too
    return out.to(output_dtype or torch.float32), lse


def memory_efficient_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: Any = None,
    p: float = 0.0,
    scale: float | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """xformers' full attention ([B, L, H, D], a tensor bias [B, H, L, K] allowed), in the query's dtype; `p` and
    `scale` may come in place, as diffusers' xformers backend passes them."""
    assert p == 0.0
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=scale).transpose(1, 2)


#: `import xformers; xformers.ops...`, as ComfyUI's attention module reaches it.
xformers = types.SimpleNamespace(
    ops=types.SimpleNamespace(
        memory_efficient_attention=memory_efficient_attention,
        memory_efficient_attention_partial=memory_efficient_attention_partial,
    )
)
