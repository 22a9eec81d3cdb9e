"""The version of sd-webui-tome, written here and nowhere else.

A WebUI extension is a plain git clone that pip never installed, so the code cannot ask package metadata for its
version; pyproject.toml reads it from this file instead: setuptools through `attr:` (from the source, without
importing the package, while the value is a string literal) and the Comfy registry through `[tool.comfy.version]`
(a text match on the assignment line: one `X.Y.Z` string on it, nothing else in this file assigns a version).
The hosts show it where a user reports a problem from: the WebUI's infotext (`ToMe version`) and log lines, the
ComfyUI nodes' description and log line.
"""

__version__ = "0.1.0"
