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

diffusers' attention backends (`model.set_attention_backend("sage")`, the `attention_backend(...)` context manager)
call their library from `diffusers.models.attention_dispatch`, never through scaled_dot_product_attention: for a
reduced block's forward, `diffusers_backend` routes the block's processor to diffusers' native backend, the core
answers its scaled_dot_product_attention call with the library function that module imported (`DIFFUSERS_KERNELS`),
and every call the core does not answer runs the user's backend (`HostBackend.run`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
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


# ---------------------------------------------------------------------------------------------- diffusers' backends

#: diffusers' backends that call scaled_dot_product_attention themselves: the core reaches them as they are.
DIFFUSERS_NATIVE = frozenset({"native", "_native_cudnn", "_native_efficient", "_native_flash", "_native_math"})
#: Where `attention_dispatch` keeps a backend's function in its Hub kernel registry, not as a module attribute.
HUB = "hub"
#: diffusers' backends whose library returns the log-sum-exp, each called with the keywords diffusers calls it with:
#: backend -> (adapter, the function's attribute in `attention_dispatch` (dotted) or `HUB`, what the stats call it).
DIFFUSERS_KERNELS: Mapping[str, tuple[Callable[..., LseKernel], str, str]] = MappingProxyType(
    {
        "sage": (sage, "sageattn", "SageAttention"),
        "sage_hub": (sage, HUB, "SageAttention (Hub kernel)"),
        **{
            f"_sage_{name}": (sage, f"sageattn_{name}", f"SageAttention sageattn_{name}")
            for name in (
                "qk_int8_pv_fp8_cuda",
                "qk_int8_pv_fp8_cuda_sm90",
                "qk_int8_pv_fp16_cuda",
                "qk_int8_pv_fp16_triton",
            )
        },
        "flash": (flash, "flash_attn_func", "flash-attn"),
        "flash_hub": (flash, HUB, "flash-attn (Hub kernel)"),
        "_flash_3": (flash, "flash_attn_3_func", "flash-attn 3"),
        "_flash_3_hub": (flash, HUB, "flash-attn 3 (Hub kernel)"),
        "xformers": (xformers, "xops.memory_efficient_attention_partial", "xformers"),
    }
)

#: The backends whose kernel the core runs, as the stats' reasons name them.
RUNS = "it runs under 'native', 'sage', 'flash', '_flash_3', 'xformers' and their variants"


@dataclass(frozen=True)
class HostBackend:
    """The attention backend a diffusers processor calls, where that is not scaled_dot_product_attention: `kernel`
    its library as the core calls it, or None where the core cannot (`why`: the block then runs as without ToMe).
    `backend` is what the processor resolved (its own, else diffusers' active one), `dispatch` diffusers'
    `attention_dispatch` module."""

    name: str
    kernel: LseKernel | None
    why: str
    processor: Any
    dispatch: Any
    backend: Any

    def route(self) -> Callable[[], None]:
        """Sends the processor's calls to diffusers' native backend (scaled_dot_product_attention, where the core
        answers them) until the returned function puts the processor's own backend back as it was: its own value,
        or none of its own."""
        processor = self.processor
        had = "_attention_backend" in processor.__dict__
        old = processor.__dict__.get("_attention_backend")
        processor._attention_backend = self.dispatch.AttentionBackendName.NATIVE

        def restore() -> None:
            if had:
                processor._attention_backend = old
            else:
                del processor._attention_backend

        return restore

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """A scaled_dot_product_attention call ([B, H, L, D]) the native backend made, run by the user's backend as
        the processor would have called it ([B, L, H, D]): the calls the core does not answer with `kernel`."""
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        out = self.dispatch.dispatch_attention_fn(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
            backend=self.backend,
        )
        return out.transpose(1, 2)


def diffusers_backend(processor: Any, dispatch: Any) -> HostBackend | None:
    """The backend diffusers' attention `processor` calls now, as the core reaches it; None where the core reaches
    it as it is (diffusers' native backends, a processor that calls scaled_dot_product_attention itself).
    `dispatch`: diffusers' `attention_dispatch` module, whose library functions the backends call."""
    if processor is None or not hasattr(processor, "_attention_backend"):
        return None
    backend = processor._attention_backend
    if backend is None:
        # dispatch_attention_fn runs the process-wide backend then: the last set_attention_backend, the
        # `attention_backend(...)` context manager, or DIFFUSERS_ATTN_BACKEND.
        backend = getattr(getattr(dispatch, "_AttentionBackendRegistry", None), "_active_backend", None)
    if backend is None:
        return None
    name = str(getattr(backend, "value", backend))
    if name in DIFFUSERS_NATIVE:
        return None
    found = DIFFUSERS_KERNELS.get(name)
    if found is None:
        why = f"diffusers' attention backend {name!r} calls a kernel ToMe cannot run ({RUNS})"
        return HostBackend(name, None, why, processor, dispatch, backend)
    if getattr(processor, "_parallel_config", None) is not None:
        why = f"diffusers' attention backend {name!r} runs with context parallelism"
        return HostBackend(name, None, why, processor, dispatch, backend)
    adapter, where, label = found
    if where == HUB:
        function = getattr(getattr(dispatch, "_HUB_KERNELS_REGISTRY", {}).get(name), "kernel_fn", None)
    else:
        function = dispatch
        for part in where.split("."):
            function = getattr(function, part, None)
    if not callable(function):
        why = f"diffusers' attention backend {name!r} has no {'Hub kernel' if where == HUB else where} loaded"
        return HostBackend(name, None, why, processor, dispatch, backend)
    return HostBackend(name, adapter(function, label), "", processor, dispatch, backend)
