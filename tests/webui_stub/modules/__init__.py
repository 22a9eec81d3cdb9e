"""Stand-in for the WebUI's `modules` package (see tests/webui_stub/__init__.py)."""
