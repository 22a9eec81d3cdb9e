"""Forge Neo's `backend/attention.py`, the part its transformers call: `attention_function(q, k, v, heads, mask=None,
skip_reshape=False)`, [B, H, L, D] with `skip_reshape` (Flux), else [B, L, H*D]; it returns [B, L, H*D].

Neo picks the kernel once, at import, from its command line: SageAttention, FlashAttention, xformers, PyTorch's
scaled_dot_product_attention (`--use-pytorch-cross-attention`, and the default on NVIDIA GPUs), else the einsum
"basic" attention (a CPU's default). The stand-in starts with PyTorch's; a test picks the basic one by
monkeypatching `attention_function`, as Neo started on a CPU would have it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, skip_reshape: bool) -> Any:
    if skip_reshape:
        return q, k, v
    b = q.shape[0]
    return tuple(t.view(b, -1, heads, t.shape[-1] // heads).transpose(1, 2) for t in (q, k, v))


def _merge(out: torch.Tensor) -> torch.Tensor:
    b, h, n, d = out.shape
    return out.transpose(1, 2).reshape(b, n, h * d)


def attention_pytorch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    mask: Any = None,
    skip_reshape: bool = False,
    **_: Any,
) -> torch.Tensor:
    q, k, v = _split(q, k, v, heads, skip_reshape)
    return _merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def attention_basic(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    mask: Any = None,
    skip_reshape: bool = False,
    **_: Any,
) -> torch.Tensor:
    q, k, v = _split(q, k, v, heads, skip_reshape)
    weights = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
    if mask is not None:
        weights = weights + mask
    return _merge(torch.einsum("bhij,bhjd->bhid", weights.softmax(dim=-1), v))


attention_function = attention_pytorch
