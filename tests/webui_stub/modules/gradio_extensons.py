"""Like modules/gradio_extensons.py (sic, v1.6+): gradio components take `tooltip=`, sent to the page as a prop.

Importing this patches gradio for the whole process, as the WebUI does at startup, so only the browser test's page
server (a subprocess) imports it. `tome_webui.compat.tooltip_kwargs` detects the patch by the `modules.` module
name of `IOComponent.__init__`; the page then carries every help text as `props.webui_tooltip` in
`window.gradio_config`, where the WebUI's hints.js (and javascript/tome.js) read it.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

original_IOComponent_init = gr.components.IOComponent.__init__
original_Block_get_config = gr.blocks.Block.get_config


def IOComponent_init(self: Any, *args: Any, **kwargs: Any) -> None:
    self.webui_tooltip = kwargs.pop("tooltip", None)
    original_IOComponent_init(self, *args, **kwargs)
    # The WebUI also tags every component with a gradio-<type> class for its CSS.
    self.elem_classes = [f"gradio-{self.get_block_name()}", *(self.elem_classes or [])]


def Block_get_config(self: Any) -> dict[str, Any]:
    config = original_Block_get_config(self)
    tooltip = getattr(self, "webui_tooltip", None)
    if tooltip:
        config["webui_tooltip"] = tooltip
    return config


gr.components.IOComponent.__init__ = IOComponent_init
gr.blocks.Block.get_config = Block_get_config
