"""ComfyUI's entry point for this repository as a custom node folder (`ComfyUI/custom_nodes/sd-webui-tome`).

ComfyUI imports this file and reads `NODE_CLASS_MAPPINGS` and `NODE_DISPLAY_NAME_MAPPINGS`; it imports only the
ComfyUI adapter (`tome_comfy`), which loads torch and `tome_core` lazily. The AUTOMATIC1111-style WebUIs never import
this file (they load `scripts/tome.py`), so the same checkout serves both hosts.

ComfyUI imports the folder under a name made from its path and does not put it on `sys.path`, while our packages
import each other by their top-level names (`tome_core`, `tome_comfy`). This folder must not go on `sys.path`
either: ComfyUI runs many custom nodes in one process, and `import scripts`, `install`, `tests` or `examples` in
any of them would then find ours. So a finder answers for exactly our two package names, from this folder, and
for nothing else; `sys.path` stays as it was.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

_ROOT = os.path.dirname(os.path.abspath(__file__))
#: The only top-level names this folder provides to the process.
PACKAGES = ("tome_core", "tome_comfy")


class TomePackageFinder(importlib.abc.MetaPathFinder):
    """Finds `tome_core` and `tome_comfy` (and, through their `__path__`, their submodules) in one checkout."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"TomePackageFinder({self.root!r})"

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in PACKAGES:
            return None
        folder = os.path.join(self.root, fullname)
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )


def _install_finder(root: str) -> None:
    """Put our finder in front of `sys.meta_path`, once; refuse a copy of our packages loaded from elsewhere."""
    for name in PACKAGES:
        loaded = sys.modules.get(name)
        where = os.path.dirname(os.path.abspath(getattr(loaded, "__file__", None) or "")) if loaded else None
        if loaded is not None and where != os.path.join(root, name):
            raise ImportError(
                f"sd-webui-tome in {root}: another copy of {name} is already loaded from {where}; remove one of the"
                " two checkouts from custom_nodes"
            )
    # By name and root, not by class: ComfyUI may execute this file again (a reload), which makes a new class.
    if not any(type(f).__name__ == "TomePackageFinder" and getattr(f, "root", None) == root for f in sys.meta_path):
        # In front, so a `tome_core` elsewhere on sys.path cannot replace ours under our nodes; it answers for our
        # two names only, so it shadows nothing else.
        sys.meta_path.insert(0, TomePackageFinder(root))


_install_finder(_ROOT)

from tome_comfy import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: E402 (needs the finder above)

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
