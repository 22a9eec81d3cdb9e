"""Like modules/scripts.py: Script, AlwaysVisible, scripts_data and runners that swallow callback errors.

`ScriptRunner` behaves like v1.10 (has `process_before_every_sampling`); `LegacyScriptRunner` like v1.6-1.9.
"""

from __future__ import annotations

import inspect
import re
from collections import namedtuple
from typing import Any

from modules import errors

AlwaysVisible = object()
ScriptClassData = namedtuple("ScriptClassData", ["script_class", "path", "basedir", "module"])
scripts_data: list[ScriptClassData] = []


class Script:
    name: str | None = None
    section: str | None = None
    filename: str | None = None
    args_from: int | None = None
    args_to: int | None = None
    alwayson = False
    is_txt2img = False
    is_img2img = False
    create_group = True
    infotext_fields: list[Any] | None = None
    paste_field_names: list[str] | None = None

    def title(self) -> str:
        raise NotImplementedError()

    def ui(self, is_img2img: bool) -> Any:
        pass

    def show(self, is_img2img: bool) -> Any:
        return True

    def before_process(self, p: Any, *args: Any) -> None:
        pass

    def process(self, p: Any, *args: Any) -> None:
        pass

    def before_process_batch(self, p: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def process_batch(self, p: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def before_hr(self, p: Any, *args: Any) -> None:
        pass

    def process_before_every_sampling(self, p: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def postprocess_batch(self, p: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def postprocess(self, p: Any, processed: Any, *args: Any) -> None:
        pass

    def elem_id(self, item_id: str) -> str:
        need_tabname = self.show(True) == self.show(False)
        tabkind = "img2img" if self.is_img2img else "txt2img"
        tabname = f"{tabkind}_" if need_tabname else ""
        title = re.sub(r"[^a-z_0-9]", "", re.sub(r"\s", "_", self.title().lower()))
        return f"script_{tabname}{title}_{item_id}"


def register_scripts_from_module(module: Any, path: str = "", basedir: str = "") -> None:
    """As the WebUI does: every Script subclass in the module's namespace, imported ones included."""
    for script_class in module.__dict__.values():
        if inspect.isclass(script_class) and issubclass(script_class, Script):
            scripts_data.append(ScriptClassData(script_class, path, basedir, module))


class _Runner:
    def __init__(self) -> None:
        self.scripts: list[Script] = []
        self.alwayson_scripts: list[Script] = []
        self.inputs: list[Any] = [None]
        self.infotext_fields: list[Any] = []
        self.paste_field_names: list[str] = []

    def initialize_scripts(self, is_img2img: bool) -> None:
        for data in scripts_data:
            script = data.script_class()
            script.filename = data.path
            script.is_txt2img = not is_img2img
            script.is_img2img = is_img2img
            if script.show(is_img2img) is AlwaysVisible:
                script.alwayson = True
                self.scripts.append(script)
                self.alwayson_scripts.append(script)

    def setup_ui(self) -> None:
        """Call each script's ui() (inside the caller's gr.Blocks) and record its args slice."""
        for script in self.alwayson_scripts:
            script.args_from = len(self.inputs)
            controls = script.ui(script.is_img2img)
            if controls is not None:
                script.name = script.title().lower()
                self.inputs.extend(controls)
            script.args_to = len(self.inputs)
            if script.infotext_fields is not None:
                self.infotext_fields += script.infotext_fields
            if script.paste_field_names is not None:
                self.paste_field_names += script.paste_field_names

    def setup_without_ui(self, arg_counts: dict[str, int]) -> None:
        """Set args slices without gradio (faster); `arg_counts` by script title."""
        for script in self.alwayson_scripts:
            script.args_from = len(self.inputs)
            self.inputs.extend([None] * arg_counts[script.title()])
            script.args_to = len(self.inputs)

    def _each(self, method: str, p: Any, *before: Any, **kwargs: Any) -> None:
        for script in self.alwayson_scripts:
            try:
                args = p.script_args[script.args_from : script.args_to]
                getattr(script, method)(p, *before, *args, **kwargs)
            except Exception:
                errors.report(f"Error running {method}: {script.filename}", exc_info=True)

    def before_process(self, p: Any) -> None:
        self._each("before_process", p)

    def process(self, p: Any) -> None:
        self._each("process", p)

    def before_process_batch(self, p: Any, **kwargs: Any) -> None:
        self._each("before_process_batch", p, **kwargs)

    def process_batch(self, p: Any, **kwargs: Any) -> None:
        self._each("process_batch", p, **kwargs)

    def before_hr(self, p: Any) -> None:
        self._each("before_hr", p)

    def postprocess_batch(self, p: Any, images: Any, **kwargs: Any) -> None:
        self._each("postprocess_batch", p, images=images, **kwargs)

    def postprocess(self, p: Any, processed: Any) -> None:
        self._each("postprocess", p, processed)


class ScriptRunner(_Runner):
    """v1.10+."""

    def process_before_every_sampling(self, p: Any, **kwargs: Any) -> None:
        self._each("process_before_every_sampling", p, **kwargs)


class LegacyScriptRunner(_Runner):
    """v1.6-1.9: no process_before_every_sampling."""
