"""What differs between the torch releases the hosts ship (2.0 to today), in one place: torch.compile's names.

The WebUIs ship torch 2.0 to 2.9, ComfyUI and diffusers whatever the user installed; `torch.compiler.is_compiling`
and `torch.compiler.disable` appeared in 2.1-2.3, `torch._dynamo` has had both since 2.0. Nothing here imports
`torch._dynamo` before it is needed: that import takes about a second.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

F = TypeVar("F", bound=Callable[..., Any])


def is_compiling() -> bool:
    """True while torch.compile traces the calling code (False when it runs eagerly or compiled)."""
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if check is None:
        dynamo = getattr(torch, "_dynamo", None)
        check = getattr(dynamo, "is_compiling", None)
    return bool(check()) if check is not None else False


def eager(fn: F) -> F:
    """`fn`, always run eagerly, never traced into a graph: torch.compile calls it as it is.

    For the bookkeeping that must run on the host around a compiled UNet (counts, the step window, per-call index
    tensors). A module hook called by `nn.Module.__call__` of a compiled module is a frame of its own: so marked,
    it runs as plain Python instead of being compiled again for every new value of the counters it updates.
    """
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:  # torch 2.0
        from torch._dynamo import disable
    return disable(fn)  # type: ignore[no-any-return]


def uncompiled(module: nn.Module) -> nn.Module:
    """The module a `torch.compile(module)` wrapper (`OptimizedModule`) runs, or `module` itself.

    The wrapper proxies attribute reads to it; patches go on the module it wraps, which its graph traces.
    """
    while type(module).__name__ == "OptimizedModule" and isinstance(module._modules.get("_orig_mod"), nn.Module):
        module = module._modules["_orig_mod"]
    return module


def static_sizes(x: torch.Tensor) -> Callable[[], None] | None:
    """Mark the last two dimensions of `x` (the latent's height and width) static for torch.compile, for one call;
    returns what takes the mark off again (None when nothing was marked).

    Under dynamo's automatic dynamic shapes (a second size recompiles with symbolic sizes: diffusers'
    `torch.compile` and ComfyUI's TorchCompileModel both leave `dynamic` at None) every grid, cell count and
    merge size would become a symbolic expression, and proving their equalities made dynamo trace a patched SD1
    UNet several times longer than the plain one (6.6x, tiny UNet; minutes on SD1.5). A merge plan is made for one
    grid anyway, so a new latent size compiles one static graph instead. The batch keeps whatever dynamo chose.
    The mark is the host's tensor's attribute, which dynamo's guards read: it must not outlive the call (a UNet
    unpatched and called again with the same tensor would otherwise compile anew). A no-op until something has
    imported `torch._dynamo` (nothing compiles before that) and on torch 2.0, which has no `mark_static`.
    """
    mark_static = getattr(sys.modules.get("torch._dynamo"), "mark_static", None)
    if mark_static is None or x.dim() < 2 or hasattr(x, "_dynamo_static_indices"):
        return None  # a tensor the host marked itself keeps its marks
    mark_static(x, x.dim() - 2)
    mark_static(x, x.dim() - 1)

    def unmark() -> None:
        for name in ("_dynamo_static_indices", "_has_dynamo_dim_marking"):
            if name in x.__dict__:
                delattr(x, name)

    return unmark


def attention_lse(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, H, L, D], log-sum-exp [B, H, L] float32) of softmax attention over `key`/`value` ([B, H, K, D]),
    `mask` (bool: True attends, or added to the scores) broadcast to [B, H, L, K].

    scaled_dot_product_attention does not return the log-sum-exp; its kernels write it beside the output (to run a
    backward pass), so they are called here as it calls them: the CPU's flash kernel; on a GPU (and the estimate's
    meta device) flash attention for 16-bit tensors without a mask, else the memory-efficient kernel (padding the
    mask as it does); anything else, or a torch without them, in plain operations."""
    aten = torch.ops.aten
    length = query.shape[-2]
    mask = None if mask is None else additive(mask, query.dtype)  # the kernels add it in the queries' precision
    device = query.device.type
    if device == "cpu" and hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=mask, scale=scale
        )
        return out, lse
    if device in ("cuda", "meta"):
        half = query.dtype in (torch.float16, torch.bfloat16) and query.shape[-1] % 8 == 0 and query.shape[-1] <= 256
        if mask is None and half:
            found = aten._scaled_dot_product_flash_attention(query, key, value, 0.0, False, False, scale=scale)
            return found[0], found[1]
        if mask is not None:
            # The memory-efficient kernel reads the mask with a stride aligned to 16 elements.
            keys = mask.shape[-1]
            if keys % 16:
                mask = torch.nn.functional.pad(mask, (0, 16 - keys % 16))[..., :keys]
            mask = mask.expand(query.shape[0], query.shape[1], length, keys)
        found = aten._scaled_dot_product_efficient_attention(query, key, value, mask, True, 0.0, False, scale=scale)
        return found[0], found[1][..., :length]
    return plain_attention_lse(query, key, value, mask, scale)


def attention_dtype(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The query, key and value in one dtype, as scaled_dot_product_attention gets them: as they are when they share
    one; under autocast (where a model's float32 rotary embedding can meet a 16-bit value) cast to autocast's dtype,
    as autocast casts that function's inputs; else None (scaled_dot_product_attention would refuse them)."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) == 1:
        return tensors
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return None
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) for t in tensors)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An attention mask as what it adds to the scores, in `dtype`: from booleans (True: attends) 0 or -inf."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -float("inf"))
    return mask if mask.dtype == dtype else mask.to(dtype)


def plain_attention_lse(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention_lse` in plain operations (an additive `mask`): any device, the scores held whole."""
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scale  # [B, H, L, K]
    if mask is not None:
        scores = scores + mask
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, L]
    return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)).to(value.dtype), value), lse
