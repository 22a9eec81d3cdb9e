"""ModelPatcher and WrapperExecutor as ComfyUI has them (comfy/model_patcher.py, comfy/patcher_extension.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

OUTER_SAMPLE = "outer_sample"  # WrappersMP.OUTER_SAMPLE
APPLY_MODEL = "apply_model"  # WrappersMP.APPLY_MODEL: around BaseModel._apply_model, class_obj the BaseModel
DIFFUSION_MODEL = "diffusion_model"  # WrappersMP.DIFFUSION_MODEL: around UNetModel._forward


def copy_nested_dicts(value: dict[str, Any]) -> dict[str, Any]:
    """`patcher_extension.copy_nested_dicts`: dicts copied recursively, lists copied, other values shared."""
    out = value.copy()
    for key, item in value.items():
        if isinstance(item, dict):
            out[key] = copy_nested_dicts(item)
        elif isinstance(item, list):
            out[key] = item.copy()
    return out


def merge_nested_dicts(target: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """`merge_nested_dicts(..., copy_dict1=False)`: `source` merged into `target` in place, lists extended."""
    for key, item in source.items():
        if isinstance(item, dict):
            merge_nested_dicts(target.setdefault(key, {}), item)
        elif isinstance(item, list):
            target.setdefault(key, []).extend(item)
        else:
            target[key] = item
    return target


def get_all_wrappers(wrapper_type: str, transformer_options: dict[str, Any]) -> list[Callable[..., Any]]:
    """`patcher_extension.get_all_wrappers`: every wrapper of a type from `transformer_options["wrappers"]`, in
    the order of their keys."""
    return [w for ws in transformer_options.get("wrappers", {}).get(wrapper_type, {}).values() for w in ws]


class WrapperExecutor:
    """Calls the wrappers in list order, each with the executor of the rest; the last calls the original."""

    def __init__(self, original: Callable[..., Any], class_obj: Any, wrappers: list[Callable[..., Any]], idx: int = 0):
        self.original, self.class_obj, self.wrappers, self.idx = original, class_obj, list(wrappers), idx

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return WrapperExecutor(self.original, self.class_obj, self.wrappers, self.idx + 1).execute(*args, **kwargs)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        if self.idx == len(self.wrappers):
            return self.original(*args, **kwargs)
        return self.wrappers[self.idx](self, *args, **kwargs)


class ModelPatcher:
    """What the nodes see of ComfyUI's ModelPatcher: `.model` (a BaseModel) is shared by every clone."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.model_options: dict[str, Any] = {"transformer_options": {}}
        self.wrappers: dict[str, dict[str, list[Callable[..., Any]]]] = {}
        self.object_patches: dict[str, Any] = {}
        self.parent: ModelPatcher | None = None

    def clone(self) -> ModelPatcher:
        n = ModelPatcher(self.model)
        n.model_options = copy.deepcopy(self.model_options)  # ComfyUI deep-copies the options
        n.object_patches = self.object_patches.copy()
        n.wrappers = {k: {k1: w1.copy() for k1, w1 in w.items()} for k, w in self.wrappers.items()}
        n.parent = self
        return n

    # wrappers
    def add_wrapper_with_key(self, wrapper_type: str, key: str, wrapper: Callable[..., Any]) -> None:
        self.wrappers.setdefault(wrapper_type, {}).setdefault(key, []).append(wrapper)

    def remove_wrappers_with_key(self, wrapper_type: str, key: str) -> None:
        self.wrappers.get(wrapper_type, {}).pop(key, None)

    def get_wrappers(self, wrapper_type: str, key: str) -> list[Callable[..., Any]]:
        return self.wrappers.get(wrapper_type, {}).get(key, [])

    # transformer patches
    def set_model_patch(self, patch: Callable[..., Any], name: str) -> None:
        to = self.model_options["transformer_options"]
        to.setdefault("patches", {})
        to["patches"][name] = [*to["patches"].get(name, []), patch]

    def set_model_attn1_patch(self, patch: Callable[..., Any]) -> None:
        self.set_model_patch(patch, "attn1_patch")

    def set_model_attn1_output_patch(self, patch: Callable[..., Any]) -> None:
        self.set_model_patch(patch, "attn1_output_patch")

    def set_model_attn1_replace(
        self, patch: Callable[..., Any], block_name: str, number: int, index: int | None = None
    ) -> None:
        self.model_options = set_model_options_patch_replace(
            self.model_options, patch, "attn1", block_name, number, index
        )

    def set_model_sampler_post_cfg_function(self, function: Callable[..., Any]) -> None:
        self.model_options["sampler_post_cfg_function"] = [
            *self.model_options.get("sampler_post_cfg_function", []),
            function,
        ]

    # objects
    def add_object_patch(self, name: str, obj: Any) -> None:
        self.object_patches[name] = obj

    def get_model_object(self, name: str) -> Any:
        if name in self.object_patches:
            return self.object_patches[name]
        return getattr(self.model, name)


def set_model_options_patch_replace(
    model_options: dict[str, Any], patch: Callable[..., Any], name: str, block_name: str, number: int, index: int | None
) -> dict[str, Any]:
    """`model_patcher.set_model_options_patch_replace`: copies the dicts on the way, keys (block, number[, index])."""
    to = model_options["transformer_options"].copy()
    replace = to.get("patches_replace", {}).copy()
    table = replace.get(name, {}).copy()
    table[(block_name, number) if index is None else (block_name, number, index)] = patch
    replace[name] = table
    to["patches_replace"] = replace
    return {**model_options, "transformer_options": to}
