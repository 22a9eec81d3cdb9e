"""ToMe's attention override in ComfyUI: subsampled keys/values for every kernel, each query's own key where the
kernel gives the log-sum-exp.

ComfyUI's attention functions (`comfy.ldm.modules.attention`: `attention_pytorch`, `attention_sage`, `attention_flash`,
`attention_xformers`, ... chosen by `--use-sage-attention` and the like) hand every call to
`transformer_options["optimized_attention_override"]` (`wrap_attn`). While a diffusion transformer samples with ToMe,
that is `AttentionOverride`. In a block ToMe reduces it runs the function's own kernel on the kept keys/values and
joins each query's own key through the kernel's log-sum-exp (`tome_core.reduced_attention`):

| ComfyUI's function | the kernel it calls, taken from that function's module | log-sum-exp |
|---|---|---|
| attention_pytorch, _basic, _split, _sub_quad | PyTorch's attention kernels | yes |
| attention_sage | `sageattn` (SageAttention 2.x, `return_lse=True`) | yes, but without a mask |
| attention_flash | `flash_attn_func` (flash-attn 2/3, `return_attn_probs=True`) | yes, but without a mask |
| attention_xformers | `xformers.ops.memory_efficient_attention_partial` | yes, but without a mask |

Anything else (SageAttention 3, an int8 kernel, another node's override set before ours: KJNodes' patches,
ComfyUI's SageAttention 3 node) runs as it would, with the reduced keys/values: the core cannot take a log-sum-exp
from it, and the log says the own key was off there, why, and what ran (`TomeStats.kernels`, `.own_key_off`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import tome_core
from tome_core import kernels
from tome_core.kernels import LseKernel

log = logging.getLogger("tome")
#: How every line ToMe logs in ComfyUI starts (a bug report that quotes it says which version ran).
LOG_HEAD = f"ToMe {tome_core.__version__}"

#: ComfyUI's attention functions whose work PyTorch's kernels do (`attention_pytorch`, or plain operations).
TORCH_ATTENTION = frozenset({"attention_pytorch", "attention_basic", "attention_split", "attention_sub_quad"})


def comfy_kernel(func: Callable[..., Any]) -> tuple[LseKernel | None, str]:
    """(the kernel ComfyUI's attention function `func` runs, as the core calls it; None where it gives no
    log-sum-exp, with why). The library function is the one `func`'s own module imported (`func.__globals__`), so
    a build of SageAttention or flash-attn another node swapped in there is the one that runs."""
    name = getattr(func, "__name__", type(func).__name__)
    if name in TORCH_ATTENTION:
        return kernels.pytorch(), ""
    found = getattr(func, "__globals__", {})
    if name == "attention_sage" and callable(found.get("sageattn")):
        return kernels.sage(_guarded(found["sageattn"])), ""
    if name == "attention_flash" and callable(found.get("flash_attn_func")):
        return kernels.flash(_guarded(found["flash_attn_func"])), ""
    partial = getattr(getattr(found.get("xformers"), "ops", None), "memory_efficient_attention_partial", None)
    if name == "attention_xformers" and callable(partial):
        return kernels.xformers(_guarded(partial)), ""
    return None, f"ComfyUI's {name} gives no log-sum-exp"


class KernelFailed(RuntimeError):
    """The kernel library refused the kept keys/values (a head size or GPU it does not support): ComfyUI's own
    function then runs the call, as it falls back itself when the library fails."""


def _guarded(library: Callable[..., Any]) -> Callable[..., Any]:
    """`library`, its failures raised as `KernelFailed` (and only its: ToMe's own errors stay what they are)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return library(*args, **kwargs)
        except Exception as error:  # whatever the library raises: the override logs it and falls back
            raise KernelFailed(f"{type(error).__name__}: {error}") from error

    return call


def callable_name(func: Any) -> str:
    """What the log calls an attention function or override: its module and qualified name."""
    qualname = getattr(func, "__qualname__", None) or type(func).__qualname__
    module = getattr(func, "__module__", None) or type(func).__module__
    return f"{module}.{qualname}" if module else qualname


class AttentionOverride:
    """The attention override ToMe puts in a sampling's `transformer_options` while a diffusion transformer samples:
    ComfyUI's attention function hands it every call (`override(func, q, k, v, heads, ..., transformer_options=...)`,
    `func` the function itself). In a block ToMe reduces:

    * where `func`'s kernel returns the log-sum-exp (`comfy_kernel`) and no other node set an override, the core
      answers the call (`tome_core.reduced_attention`): that kernel over the kept keys/values, each query's own key
      joined, in the layout the call asked for;
    * else the core subsamples the keys and values of the generated tokens (`tome_core.reduce_attention`, text and
      reference tokens whole) and the call goes on with them to the override another node set before ours
      (`previous`, e.g. a SageAttention patch), else to `func`.

    The sequence dimension follows ComfyUI's layouts: [B, H, L, D] with `skip_reshape` (Flux, NextDiT), else
    [B, L, H*D] (Wan, Qwen-Image, SD3.5). A mask whose last dimension runs over the keys is subsampled with them.
    """

    NAMES = ("q", "k", "v", "heads", "mask")

    def __init__(self, model: nn.Module, previous: Callable[..., Any] | None) -> None:
        # Read, never written, while the model runs: a compiled graph treats them as constants (a counter here
        # would be a guard that fails at every call).
        self.model = model
        self.previous = previous
        self.previous_name = callable_name(previous) if previous is not None else ""
        # The kernels that failed on the kept keys in this sampling, each logged once (a build that refuses every
        # call would otherwise log every attention call); written on the failure path only, which runs eagerly.
        self.failed: set[str] = set()

    def __repr__(self) -> str:
        return f"tome_AttentionOverride({type(self.model).__name__}, previous={self.previous!r})"

    def __call__(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        given = dict(zip(self.NAMES, args))
        query, key, value = (given.get(name, kwargs.get(name)) for name in ("q", "k", "v"))
        mask = given["mask"] if "mask" in given else kwargs.get("mask")
        heads = given.get("heads", kwargs.get("heads"))
        if self.previous is not None:
            ran = f"another node's attention override ({self.previous_name})"
            why = "that override returns no log-sum-exp"
        else:
            kernel, why = comfy_kernel(func)
            ran = kernel.name if kernel is not None else getattr(func, "__name__", "ComfyUI's attention")
            if kernel is not None and isinstance(query, torch.Tensor):
                refused = kernel.fits(query, mask)
                if refused is None:
                    try:
                        out = self.own_key_attention(query, key, value, heads, mask, kwargs, kernel)
                    except KernelFailed as error:  # as ComfyUI's attention_sage and _flash: its function falls back
                        if kernel.name not in self.failed:
                            self.failed.add(kernel.name)
                            log.warning(
                                "%s: %s failed on the kept keys/values (%s); %s runs the call (logged once a sampling)",
                                LOG_HEAD,
                                ran,
                                error,
                                func,
                            )
                        refused, out = f"{kernel.name} failed: {error}", None
                    if out is not None:
                        return out
                why = refused or why
                ran = getattr(func, "__name__", ran)  # the host's function runs the call, falling back as it does
        dim = 2 if kwargs.get("skip_reshape") else 1
        reduced = tome_core.reduce_attention(self.model, key, value, dim, mask, ran, why)
        if reduced is not None:
            key, value, mask = reduced
            args = (
                tuple({"k": key, "v": value, "mask": mask}.get(name, arg) for name, arg in zip(self.NAMES, args))
                + args[len(self.NAMES) :]
            )
            for name, new in (("k", key), ("v", value)):
                if name in kwargs:
                    kwargs[name] = new
            if "mask" not in given and "mask" in kwargs:
                kwargs["mask"] = mask
        if self.previous is not None:
            return self.previous(func, *args, **kwargs)
        return func(*args, **kwargs)

    def own_key_attention(
        self, query: Any, key: Any, value: Any, heads: Any, mask: Any, kwargs: dict[str, Any], kernel: LseKernel
    ) -> torch.Tensor | None:
        """The core's attention with each query's own key (`tome_core.reduced_attention`, the kept keys' attention
        run by `kernel`) from ComfyUI's tensors, [B, H, L, D] with `skip_reshape` (Flux, NextDiT) or [B, L, H*D]
        (Wan, Qwen-Image, SD3.5; SD3.5's values [B, L, H, D]), and its mask shapes, else None. The output in the
        layout the call asked for."""
        if not all(isinstance(t, torch.Tensor) for t in (query, key, value)):
            return None
        if not kwargs.get("skip_reshape"):
            # [B, L, H*D], or [B, L, H, D] (SD3.5's values: `mmdit.split_qkv`), viewed as ComfyUI's functions view them
            if query.dim() != 3 or not isinstance(heads, int) or heads <= 0 or query.shape[-1] % heads:
                return None
            if key.shape != query.shape or value.shape[:2] != query.shape[:2] or value.dim() not in (3, 4):
                return None
            per_head = value.shape[2] % heads == 0 if value.dim() == 3 else value.shape[2] == heads
            if not per_head:
                return None
            query, key = (t.unflatten(-1, (heads, -1)).transpose(1, 2) for t in (query, key))
            value = (value if value.dim() == 4 else value.unflatten(-1, (heads, -1))).transpose(1, 2)
        if isinstance(mask, torch.Tensor) and mask.dim() < 4:  # as ComfyUI's attention functions broadcast it
            mask = mask.unsqueeze(0) if mask.dim() == 2 else mask
            mask = mask.unsqueeze(1)
        out = tome_core.reduced_attention(self.model, query, key, value, mask, kernel=kernel)
        if out is None or kwargs.get("skip_output_reshape"):
            return out
        return out.transpose(1, 2).flatten(2)
