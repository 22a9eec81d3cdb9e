"""What differs between the torch releases the hosts ship (2.0 to today), in one place: torch.compile's names.

The WebUIs ship torch 2.0 to 2.9, ComfyUI and diffusers whatever the user installed; `torch.compiler.is_compiling`
and `torch.compiler.disable` appeared in 2.1-2.3, `torch._dynamo` has had both since 2.0. Nothing here imports
`torch._dynamo` before it is needed: that import takes about a second.
"""

from __future__ import annotations

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
