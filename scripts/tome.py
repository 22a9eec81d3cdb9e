"""Token Merging (ToMe) for the AUTOMATIC1111 WebUI: the always-visible "ToMe" script.

Thin on purpose: the logic lives in `tome_webui` (WebUI glue) and `tome_core` (the patch). Both are imported here
at top level because A1111 puts the extension root on `sys.path` only while this file loads. `Script` is reached
as `scripts.Script`: importing the name would register the base class as a script too.

API: `alwayson_scripts: {"tome": {"args": [...]}}`, in the order `tome_webui.ARG_NAMES` documents, or
`{"args": [{"preset": "fast"}]}` / `{"args": [{"ratio": 0.5, ...}]}` (see `tome_webui.params`). Invalid args get
HTTP 422 (`tome_webui.api`).
"""

from __future__ import annotations

from typing import Any

from modules import script_callbacks, scripts

import tome_core  # noqa: F401  (imported while the extension root is on sys.path)
import tome_webui


class ToMeScript(scripts.Script):
    section = "accordions"
    create_group = False
    sorting_priority = 20  # Forge only: after Hires fix and Refiner

    def __init__(self) -> None:
        super().__init__()
        self.tome_runtime = tome_webui.lifecycle.Runtime()

    def title(self) -> str:
        return tome_webui.TITLE

    def show(self, is_img2img: bool) -> Any:
        return scripts.AlwaysVisible

    def ui(self, is_img2img: bool) -> list[Any]:
        return tome_webui.ui.build(self, is_img2img)

    def before_process(self, p: Any, *args: Any) -> None:
        self.tome_runtime.before_process(p, args, is_img2img=bool(self.is_img2img))

    def process_batch(self, p: Any, *args: Any, **kwargs: Any) -> None:
        self.tome_runtime.process_batch(p)

    def before_hr(self, p: Any, *args: Any) -> None:
        self.tome_runtime.before_hr(p)

    def process_before_every_sampling(self, p: Any, *args: Any, **kwargs: Any) -> None:
        self.tome_runtime.before_every_sampling(p)

    def postprocess_batch(self, p: Any, *args: Any, **kwargs: Any) -> None:
        self.tome_runtime.postprocess_batch(p)

    def postprocess(self, p: Any, processed: Any, *args: Any) -> None:
        self.tome_runtime.postprocess(p)


script_callbacks.on_before_ui(tome_webui.xyz.register_axes)
script_callbacks.on_app_started(tome_webui.api.on_app_started)
script_callbacks.on_cfg_denoiser(tome_webui.lifecycle.on_cfg_denoiser)
script_callbacks.on_model_loaded(tome_webui.lifecycle.on_model_loaded)
script_callbacks.on_script_unloaded(tome_webui.lifecycle.on_script_unloaded)
if hasattr(script_callbacks, "on_after_process"):  # SD.Next: fires also when postprocess is skipped (interrupt)
    script_callbacks.on_after_process(tome_webui.lifecycle.on_after_process)
