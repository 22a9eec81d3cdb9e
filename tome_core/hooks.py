"""One patched module: the instance `forward` a patch installs and takes away again, never the class's.

Shared by the UNet patch (`tome_core.patch`) and the diffusion-transformer patch (`tome_core.dit`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


class Hook:
    """One patched module: its instance `forward` is this object's `forward` until `uninstall`.

    A bound method of a long-lived object, not a closure or a partial: torch.compile guards on the values this
    object holds, not on its identity, so re-patching with the same settings reuses a compiled graph.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.inner: Callable[..., Any] | None = None  # an instance forward someone else set before us
        self.own: Callable[..., Any] = type(module).forward  # the class's forward, as the module had it
        self.passthrough = False  # removed while another wrapper still calls us

    def install(self) -> None:
        # The class's forward as it is now: the WebUIs swap attention forwards on the class when a model loads or
        # a setting changes, never during a generation, and a patch lasts one generation.
        self.own = type(self.module).forward
        self.inner = self.module.__dict__.get("forward")
        self.module.forward = self.forward  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self.module.__dict__.get("forward") == self.forward:
            if self.inner is None:
                del self.module.__dict__["forward"]
            else:
                self.module.forward = self.inner  # type: ignore[method-assign]
        else:
            # Another wrapper went on after ours and holds it: stay in its chain, doing nothing.
            self.passthrough = True

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward as it was before ours."""
        if self.inner is not None:
            return self.inner(*args, **kwargs)
        return self.own(self.module, *args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def unmark(state: Any) -> None:
    """Undo the mark a patch state's call put on the latent (`state.unmark`), once; a call that raised leaves it."""
    if state.unmark is not None:
        state.unmark, undo = None, state.unmark
        undo()


def uninstall(state: Any) -> None:
    """Take a patch state's module hooks (`state.handles`) and installed forwards (`state.hooks`, the last installed
    first) away, after undoing a mark a failed call left."""
    unmark(state)
    for handle in state.handles:
        handle.remove()
    state.handles.clear()
    for hook in reversed(state.hooks):
        hook.uninstall()
    state.hooks.clear()


def timestep_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The timestep a model's forward got: by its name (diffusers `timestep`, ldm and ComfyUI `timesteps`, Z-Image
    `t`), else the second positional argument (every UNet's and ComfyUI's DiTs')."""
    for name in ("timestep", "timesteps", "t"):
        if name in kwargs:
            return kwargs[name]
    return args[1] if len(args) > 1 else None
