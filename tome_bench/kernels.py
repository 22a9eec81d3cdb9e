"""The attention kernels the core calls itself on a GPU, checked and timed first by the GPU job (`gpu_job.Job.run`):
the ones each query's own key reads the log-sum-exp from (`tome_core.compat.attention_lse`: flash attention, or the
memory-efficient kernel with a mask), which nothing on the CPU runs.

Each takes the job's device (`gpu_job.Device`: its torch device, dtype, `sync` and `strict`) and appends its lines
to the job's `checks`.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

import torch

from tome_core import kernels as core_kernels
from tome_core.compat import additive, attention_lse, plain_attention_lse

#: The kernel libraries people run for speed, as the core calls them (`tome_core.kernels`): what the job names,
#: the module and function, and the core's adapter. Installed ones are checked and timed; the others are named.
LIBRARIES: tuple[tuple[str, str, str, Callable[..., core_kernels.LseKernel]], ...] = (
    ("SageAttention 2", "sageattention", "sageattn", core_kernels.sage),
    ("flash-attn 2", "flash_attn", "flash_attn_func", core_kernels.flash),
    ("flash-attn 3", "flash_attn_interface", "flash_attn_func", core_kernels.flash),
    ("xformers", "xformers.ops", "memory_efficient_attention_partial", core_kernels.xformers),
)

#: Where a block's kept generated keys would weigh as their cells by their logits (4x4 cells, x2 frames on Wan):
#: heads, queries, kept keys (rounded to 16: the kernel alone, no padding of the mask).
MASKED_SHAPES = {"Flux.1-dev 1024 px": (24, 4608, 768), "Wan 2.1 1.3B 480p": (12, 32760, 2544)}


def check_own_key(device: Any, checks: list[str]) -> str | None:
    """What is wrong, or None: the kernels agree on this device with the plain operations, in its dtype, with and
    without a mask (off by more than 0.02 stops a strict device)."""
    gen = torch.Generator(device=device.device).manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 64, generator=gen, device=device.device, dtype=device.dtype) for n in (300, 90, 90))
    mask = torch.rand(2, 1, 1, 90, generator=gen, device=device.device) > 0.2
    for masked in (None, mask):
        out, lse = attention_lse(q, k, v, masked, 0.125)
        scores_mask = None if masked is None else additive(masked, torch.float32)
        ref, ref_lse = plain_attention_lse(q.float(), k.float(), v.float(), scores_mask, 0.125)
        error = max(float((out.float() - ref).abs().max()), float((lse - ref_lse).abs().max()))
        line = f"own key's attention {'with' if masked is not None else 'without'} a mask: off by {error:.2g}"
        if error > 2e-2 and device.strict:
            return line + " from the plain operations (tome_core.compat.attention_lse)"
        checks.append(line)
    return None


def time_masked_attention(device: Any, checks: list[str], calls: int = 20) -> None:
    """Attention with a per-key bias (hence the memory-efficient kernel) against flash attention, at `MASKED_SHAPES`:
    whether docs/runs/2026-11-29-text-weight/keyed.diff pays, and the rate its estimate would price masked attention
    at (the diff's `MASKED_ATTENTION_RATE` assumes half). Off a GPU (the dry run, the tests): tiny shapes."""
    shapes = MASKED_SHAPES if device.device.type == "cuda" else {name: (2, 96, 32) for name in MASKED_SHAPES}
    gen = torch.Generator(device=device.device).manual_seed(0)
    for name, (heads, length, kept) in shapes.items():
        q, k, v = (
            torch.randn(1, heads, n, 128, generator=gen, device=device.device, dtype=device.dtype)
            for n in (length, kept, kept)
        )
        bias = torch.zeros(1, 1, 1, kept, device=device.device, dtype=device.dtype)  # [1, 1, 1, K]: a weight per key
        ms = {
            label: _ms(device, calls, attention_lse, q, k, v, mask, 0.125)
            for label, mask in (("flash", None), ("masked", bias))
        }
        rate = ms["flash"] / ms["masked"]
        checks.append(f"masked attention at {name}: {ms['masked']:.3f} ms, flash {ms['flash']:.3f} ms: rate {rate:.2f}")


def check_libraries(device: Any, checks: list[str], calls: int = 20) -> None:
    """Each library of `LIBRARIES` installed here, run as the core runs it at the Flux.1-dev 1024 px shape of
    `MASKED_SHAPES` (24 heads, 4608 queries, 768 kept keys): its output and log-sum-exp against the plain operations
    in float32, and its time against PyTorch's kernel; a library that is not installed is named (the job cannot
    install one: the GPU machine reaches no index). Off a GPU nothing runs: the dry run only names them."""
    heads, length, kept = MASKED_SHAPES["Flux.1-dev 1024 px"]
    for name, module, attr, adapter in LIBRARIES:
        try:
            library = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as error:  # the line says so: the next run knows what to bring
            checks.append(f"{name}: not installed here ({type(error).__name__})")
            continue
        if device.device.type != "cuda":
            checks.append(f"{name}: installed, not run off a GPU")
            continue
        gen = torch.Generator(device=device.device).manual_seed(0)
        q, k, v = (
            torch.randn(1, heads, n, 128, generator=gen, device=device.device, dtype=torch.float16)
            for n in (length, kept, kept)
        )
        kernel = adapter(library)
        try:
            out, lse = kernel.run(q, k, v, None, 128**-0.5)
        except Exception as error:  # a build the adapter does not fit: the line says how, the job goes on
            checks.append(f"{name}: failed as the core calls it ({type(error).__name__}: {error})")
            continue
        ref, ref_lse = plain_attention_lse(q.float(), k.float(), v.float(), None, 128**-0.5)
        lse_error = "no lse" if lse is None else f"lse off by {float((lse - ref_lse).abs().max()):.2g}"
        ms = _ms(device, calls, kernel.run, q, k, v, None, 128**-0.5)
        ms_pytorch = _ms(device, calls, attention_lse, q, k, v, None, 128**-0.5)
        checks.append(
            f"{name}: out off by {float((out.float() - ref).abs().max()):.2g}, {lse_error}; {ms:.3f} ms against"
            f" PyTorch's {ms_pytorch:.3f} ms"
        )


def _ms(device: Any, calls: int, call: Callable[..., Any], *args: Any) -> float:
    """Milliseconds per `call(*args)`, after one call to warm up, the device synchronised around the loop."""
    call(*args)
    device.sync()
    start = time.perf_counter()
    for _ in range(calls):
        call(*args)
    device.sync()
    return 1e3 * (time.perf_counter() - start) / calls
