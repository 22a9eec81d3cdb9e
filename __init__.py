"""ComfyUI's entry point for this repository as a custom node folder (`ComfyUI/custom_nodes/sd-webui-tome`).

ComfyUI imports this file and reads `NODE_CLASS_MAPPINGS` and `NODE_DISPLAY_NAME_MAPPINGS`; it imports only the
ComfyUI adapter (`tome_comfy`), which loads torch and `tome_core` lazily. The AUTOMATIC1111-style WebUIs never import
this file (they load `scripts/tome.py`), so the same checkout serves both hosts.

ComfyUI imports the folder under a name made from its path, so our packages, which import each other by their
top-level names (`tome_core`, `tome_comfy`), need this folder on `sys.path`, as the WebUI puts it there for its
scripts.
"""

import os
import sys

_ROOT = os.path.dirname(os.path.abspath(__file__))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tome_comfy import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: E402 (needs the path above)

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
