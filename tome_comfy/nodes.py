"""The two ComfyUI nodes: *ToMe* (a speed preset) and *ToMe (advanced)* (every `TomeConfig` field).

Both take a MODEL and return a clone carrying ToMe (`tome_comfy.sampling.attach`); the input is never changed.
The classic form (`INPUT_TYPES`, `FUNCTION`) works in every ComfyUI; `v3_nodes` builds the same two nodes on the V3
schema (`comfy_api.latest.io.ComfyNode`) for a ComfyUI that has it. Importing this module imports neither torch nor
ComfyUI: the input table and the adapter load when ComfyUI first asks for the inputs or runs a node.
"""

from __future__ import annotations

import inspect
from typing import Any

#: Node ids: what saved workflows and API prompts store; never renamed.
TOME_NODE = "tome_ToMe"
TOME_ADVANCED_NODE = "tome_ToMeAdvanced"
#: The names ComfyUI shows, which its node search ranks by. The front-end (comfyui-frontend-package 1.27) searches
#: a node's id and display name only, and ranks a name equal to the query above one that starts with it, before it
#: looks at how often a node is used; ComfyUI's built-in TomePatchModel starts with "tome" and has a usage count, we
#: have none. So the preset node is called exactly "ToMe", the first hit for "tome" and "ToMe"; the advanced node
#: carries "token merging", the first hit for that. docs/comfyui-contract.md has the front-end's ranking facts.
DISPLAY_NAMES = {TOME_NODE: "ToMe", TOME_ADVANCED_NODE: "ToMe advanced (token merging)"}
#: More words the node search finds both nodes by, where ComfyUI and its front-end support them: the classic
#: `SEARCH_ALIASES` attribute and the V3 schema's `search_aliases` (newer than ComfyUI 0.3.64, which ignores them).
SEARCH_ALIASES = ("ToMe", "token merging", "tomesd", "speed up sampling", "faster")
CATEGORY = "model_patches/ToMe"
DESCRIPTIONS = {
    TOME_NODE: "Token merging (ToMe for SD) on the model for the samplers it feeds: a speed preset, resolved when"
    " sampling starts for the model's family: SD1.x/SD2.x and SDXL (tokens merged, keys/values subsampled), and the"
    " diffusion transformers Flux.1, Chroma, Qwen-Image, SD3.5, Lumina 2 and Wan (keys/values of the generated tokens"
    " subsampled, text and reference-image tokens kept whole). Other models run unchanged and the log says so. For a"
    " hires workflow put a second ToMe node on the second sampler's model; each sampling's log line gives the speed-up"
    " at the size it sampled and, where two samplers share one schedule (Wan 2.2 14B's high-noise and low-noise"
    " models, a refiner), which part of the noise schedule it sampled.",
    TOME_ADVANCED_NODE: "Token merging (ToMe for SD) with every setting of the core (the same table as the WebUI"
    " extension's). On a diffusion transformer (Flux.1, Chroma, Qwen-Image, SD3.5, Lumina 2, Wan) set mode to kv: the"
    " cells (sx, sy, st), the block window (block_start, block_end), the step window and random partitions apply there; the"
    " node refuses UNet-only settings, naming the field.",
}


def description(node_id: str) -> str:
    """What ComfyUI shows as the node's description: its words, for the preset node each preset's speed-ups and
    change of the image beside its reference (the preset input's tooltip words, `tome_comfy.inputs.preset_text`),
    and last the version, which a user reporting a problem finds there and at the start of each line a sampling
    logs."""
    from tome_core import __version__

    text = DESCRIPTIONS[node_id]
    if node_id == TOME_NODE:
        from tome_comfy.inputs import preset_text
        from tome_core import presets

        text += "\n\n" + "\n".join(f"{p.label}: {preset_text(p)}" for p in presets())
    return f"{text}\n\nToMe version {__version__}"


class _DescriptionWhenRead:
    """A node class's `DESCRIPTION`, made when read: ComfyUI reads it when it lists the nodes (`server.py`
    `node_info`, as it calls `INPUT_TYPES`), not when it imports the package. The preset words and the version come
    from `tome_core`, which loads torch; the package import stays without torch."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def __get__(self, instance: object, owner: type | None = None) -> str:
        return description(self.node_id)


def run_preset(model: Any, preset: str) -> Any:
    """The ToMe node: `model`'s clone with the preset labelled `preset` (ValueError naming the input otherwise)."""
    from tome_comfy.inputs import preset_by_label
    from tome_comfy.sampling import TomeRequest, attach

    by_label = preset_by_label()
    if preset not in by_label:
        raise ValueError(f"input 'preset' must be one of {', '.join(by_label)}, got {preset!r}")
    return attach(model, TomeRequest(preset=by_label[preset].name))


def run_advanced(model: Any, **values: Any) -> Any:
    """The advanced node: `model`'s clone with the config of `values` (errors name the input)."""
    from tome_comfy.inputs import config_from_inputs
    from tome_comfy.sampling import TomeRequest, attach

    return attach(model, TomeRequest(config=config_from_inputs(values)))


# ---------------------------------------------------------------------------------------------- classic form


class TomeModel:
    """*ToMe*: MODEL in, MODEL out, with a speed preset."""

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = CATEGORY
    DESCRIPTION = _DescriptionWhenRead(TOME_NODE)
    SEARCH_ALIASES = list(SEARCH_ALIASES)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        from tome_comfy.inputs import classic_input, preset_widgets

        required: dict[str, Any] = {"model": ("MODEL", {"tooltip": "The model to sample with ToMe."})}
        required.update((w.name, classic_input(w)) for w in preset_widgets())
        return {"required": required}

    def patch(self, model: Any, preset: str) -> tuple[Any]:
        return (run_preset(model, preset),)


class TomeModelAdvanced:
    """*ToMe (advanced)*: MODEL in, MODEL out, with every `TomeConfig` field."""

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = CATEGORY
    DESCRIPTION = _DescriptionWhenRead(TOME_ADVANCED_NODE)
    SEARCH_ALIASES = list(SEARCH_ALIASES)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        from tome_comfy.inputs import advanced_widgets, classic_input

        required: dict[str, Any] = {"model": ("MODEL", {"tooltip": "The model to sample with ToMe."})}
        required.update((w.name, classic_input(w)) for w in advanced_widgets())
        return {"required": required}

    def patch(self, model: Any, **values: Any) -> tuple[Any]:
        return (run_advanced(model, **values),)


CLASSIC_NODES: dict[str, type] = {TOME_NODE: TomeModel, TOME_ADVANCED_NODE: TomeModelAdvanced}


# ---------------------------------------------------------------------------------------------- V3 schema


def _takes(func: Any, keyword: str) -> bool:
    """Whether `func` (a class: its constructor) accepts `keyword`, by name or through **kwargs."""
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):  # no signature to read: pass nothing it may refuse
        return False
    return keyword in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def v3_nodes(io: Any) -> dict[str, type]:
    """The two nodes as V3 `io.ComfyNode` classes; `io` is ComfyUI's `comfy_api.latest.io`."""
    from tome_comfy.inputs import Widget, advanced_widgets, preset_widgets

    def v3_input(widget: Widget) -> Any:
        common = {"default": widget.default, "tooltip": widget.tooltip}
        if widget.kind == "COMBO":
            return io.Combo.Input(widget.name, options=list(widget.options or ()), **common)
        if widget.kind == "BOOLEAN":
            return io.Boolean.Input(widget.name, **common)
        number = io.Int if widget.kind == "INT" else io.Float
        return number.Input(widget.name, min=widget.minimum, max=widget.maximum, step=widget.step, **common)

    def schema(node_id: str, widgets: tuple[Widget, ...]) -> Any:
        search = {"search_aliases": list(SEARCH_ALIASES)} if _takes(io.Schema, "search_aliases") else {}
        return io.Schema(
            node_id=node_id,
            display_name=DISPLAY_NAMES[node_id],
            category=CATEGORY,
            description=description(node_id),
            inputs=[io.Model.Input("model", tooltip="The model to sample with ToMe."), *map(v3_input, widgets)],
            outputs=[io.Model.Output()],
            **search,
        )

    class TomeModelV3(io.ComfyNode):
        @classmethod
        def define_schema(cls) -> Any:
            return schema(TOME_NODE, preset_widgets())

        @classmethod
        def execute(cls, model: Any, preset: str) -> Any:
            return io.NodeOutput(run_preset(model, preset))

    class TomeModelAdvancedV3(io.ComfyNode):
        @classmethod
        def define_schema(cls) -> Any:
            return schema(TOME_ADVANCED_NODE, advanced_widgets())

        @classmethod
        def execute(cls, model: Any, **values: Any) -> Any:
            return io.NodeOutput(run_advanced(model, **values))

    return {TOME_NODE: TomeModelV3, TOME_ADVANCED_NODE: TomeModelAdvancedV3}
