"""A stand-in `sageattention` package for live ComfyUI runs on the CPU (tests/test_live_comfy_kernels.py): put
tests/kernel_standins on the server's PYTHONPATH and start it with `--use-sage-attention`; ComfyUI then imports
`sageattn` from here and runs `attention_sage` with it. The kernel is tests/attention_kernels.py's (SageAttention
2.x's signature, INT8-rounded q/k, smooth_k, the natural-log lse with the kernel's own correction; fp16/bf16 only).
Never on any path but that server's, and never shipped."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location(
    "tome_test_attention_kernels", Path(__file__).resolve().parents[2] / "attention_kernels.py"
)
assert _spec is not None and _spec.loader is not None
_kernels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kernels)

__version__ = "2.2.0+tome.standin"
log = logging.getLogger("sageattention_standin")


def sageattn(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    """`sageattention.sageattn`; logs each call that asks for the log-sum-exp (the live check counts them)."""
    if kwargs.get("return_lse"):
        log.info(
            "tome stand-in sageattn: return_lse=True, %s, %s keys",
            q.dtype,
            k.shape[-2 if kwargs.get("tensor_layout", "HND") == "HND" else 1],
        )
    return _kernels.sageattn(q, k, v, **kwargs)


def sageattn_varlen(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("the stand-in has no varlen kernel")
