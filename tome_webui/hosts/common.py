"""What every host adapter asks of a module: does ToMe patch it, and if not, why (in the core's words)."""

from __future__ import annotations

from typing import Any

from torch import nn

import tome_core


def patchable(module: Any) -> bool:
    """Whether ToMe patches `module` (or the module a torch.compile wrapper around it runs): a UNet, or a diffusion
    transformer of a family `tome_core` reduces. Cheap enough for every sampler step: no walk of the module tree."""
    inner = getattr(module, "_orig_mod", module)
    if not isinstance(inner, nn.Module):
        return False
    return any(hasattr(inner, name) for name in ("input_blocks", "down_blocks")) or (
        tome_core.find_layout(inner) is not None
    )


def not_handled(module: Any, owner: Any = None) -> str:
    """Why ToMe does not patch `module` (the model's denoiser; `owner`, the host's model object, when there is none):
    the core's message naming its class and what ToMe patches (`tome_core.find_model`'s TypeError)."""
    target = module if isinstance(module, nn.Module) else owner
    try:
        tome_core.find_model(target)
    except TypeError as exc:
        return str(exc)
    return f"{type(target).__name__} has no UNet or diffusion transformer to patch"


def short_reason(message: str) -> str:
    """The core's message up to the list of what ToMe patches: "NextDiT is not a model ToMe patches", for the
    infotext (the log gets the whole message)."""
    head, _, _ = message.partition(": it patches")
    return head
