"""ComfyUI custom nodes for sd-webui-tome: the same `tome_core` as the WebUI extension, as two MODEL -> MODEL nodes.

Modules:
    nodes     the nodes *ToMe* (preset) and *ToMe (advanced)*, classic and V3 forms
    inputs    the node inputs, generated from `tome_core.field_specs()` and `tome_core.presets()`
    sampling  the clone and its sampling-scoped wrapper: patch for one sampling, step window, never-silent log

`NODE_CLASS_MAPPINGS` holds the classic node classes (see `PREFER_V3` for why not the V3 ones). Importing this package imports neither torch nor the WebUI glue: `sampling` and `inputs` (and with
them torch and `tome_core`) load when ComfyUI first lists the inputs or runs a node.
"""

from __future__ import annotations

import importlib.util
import logging

from tome_comfy.nodes import CLASSIC_NODES, DISPLAY_NAMES, v3_nodes

log = logging.getLogger("tome")


#: Register the V3 form where ComfyUI has it. Off: at ComfyUI a125cd8 (0.3.64) `execution.validate_inputs` checks a
#: combo's options only for the classic list-typed input (`isinstance(input_type, list)`), so a V3 Combo value outside
#: its options would reach the node instead of being refused by validation; the classic form gets min, max and
#: choices all checked by ComfyUI. The V3 classes (`nodes.v3_nodes`) are the same inputs on the same table.
PREFER_V3 = False


def node_classes(prefer_v3: bool = PREFER_V3) -> dict[str, type]:
    """The node classes to register: V3 when `prefer_v3` and `comfy_api.latest` exists, classic otherwise."""
    if not prefer_v3 or importlib.util.find_spec("comfy_api") is None:
        return dict(CLASSIC_NODES)
    try:
        from comfy_api.latest import io
    except ImportError as exc:  # a ComfyUI from before the V3 schema
        log.info("ToMe: no V3 node schema in this ComfyUI (%s); registering the classic node form", exc)
        return dict(CLASSIC_NODES)
    return v3_nodes(io)


NODE_CLASS_MAPPINGS: dict[str, type] = node_classes()
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = dict(DISPLAY_NAMES)

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "node_classes"]
