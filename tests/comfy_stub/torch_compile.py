"""ComfyUI's TorchCompileModel node and `comfy_api.torch_helpers.set_torch_compile_wrapper`, as
docs/comfyui-contract.md ("torch.compile") describes them: the node compiles the clone's diffusion model when it
runs, and an APPLY_MODEL wrapper puts the compiled module in the BaseModel's `diffusion_model` for each model call
and the original back in `finally`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .patcher import APPLY_MODEL, ModelPatcher, WrapperExecutor

COMPILE_KEY = "torch.compile"
TORCH_COMPILE_KWARGS = "torch_compile_kwargs"


def compile_wrapper(compiled: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    def wrapper(executor: WrapperExecutor, *args: Any, **kwargs: Any) -> Any:
        originals: dict[str, Any] = {}
        try:
            for key, value in compiled.items():
                originals[key] = getattr(executor.class_obj, key)
                setattr(executor.class_obj, key, value)
            return executor(*args, **kwargs)
        finally:
            for key, value in originals.items():
                setattr(executor.class_obj, key, value)

    return wrapper


def set_torch_compile_wrapper(
    model: ModelPatcher,
    backend: Any,
    options: dict[str, Any] | None = None,
    mode: str | None = None,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    keys: tuple[str, ...] = ("diffusion_model",),
) -> None:
    """torch.compile each of `keys` (`get_model_object`) now, and swap it in around every `apply_model`."""
    model.remove_wrappers_with_key(APPLY_MODEL, COMPILE_KEY)
    kwargs = {"backend": backend, "options": options, "mode": mode, "fullgraph": fullgraph, "dynamic": dynamic}
    compiled = {key: torch.compile(model.get_model_object(key), **kwargs) for key in keys}
    model.add_wrapper_with_key(APPLY_MODEL, COMPILE_KEY, compile_wrapper(compiled))
    model.model_options[TORCH_COMPILE_KWARGS] = kwargs


def torch_compile_model(model: ModelPatcher, backend: Any = "inductor") -> ModelPatcher:
    """The TorchCompileModel node (`comfy_extras/nodes_torch_compile.py`): a clone with the compile wrapper."""
    clone = model.clone()
    set_torch_compile_wrapper(clone, backend)
    return clone
