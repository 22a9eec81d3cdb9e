"""A gradio 3.41 page that mounts the ToMe accordion the way the WebUI does, for tests/test_browser_ui.py.

What it stands in for (docs/webui-contract.md sections 1.5, 3.2, 3.3):
  * the WebUI's patched gradio (`tooltip=` becomes `props.webui_tooltip`): tests/webui_stub/modules/gradio_extensons.py
  * script.js / ui.js / inputAccordion.js globals: tests/browser/webui_standins.js, injected into <head> before
    javascript/tome.js, the way `modules/ui_gradio_extensions.py` patches gradio's TemplateResponse (it also
    watches the page's timers, for the test that tome.js leaves none)
  * the WebUI controls tome.js reads: `#<tab>_prompt` (marks the UI as loaded), `#<tab>_width`, `#<tab>_height`,
    `#<tab>_batch_size` (up to Forge Neo's 241 frames of a Wan video), and in txt2img the Hires fix InputAccordion `#txt2img_hr` with `#txt2img_hr_scale`, `#txt2img_hr_resize_x|y`
  * the script: scripts/tome.py loaded like the WebUI loads it, its `ui()` built by the stand-in ScriptRunner in
    each tab (so the element ids are the real `script_<tab>_tome_<item>`)

Run it by hand to look at the UI:  .venv/bin/python tests/browser/page.py --port 7861
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS_DIR = HERE.parent
REPO_DIR = TESTS_DIR.parent
#: Injected into <head> in this order: the WebUI's globals first, as the WebUI loads its own scripts first.
HEAD_SCRIPTS: tuple[Path, ...] = (HERE / "webui_standins.js", REPO_DIR / "javascript" / "tome.js")

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no network calls from the page server
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))  # webui_stub, tiny_models

import gradio as gr  # noqa: E402
import webui_stub  # noqa: E402, F401  (first: puts the stand-in `modules` and the repository on sys.path)
from modules import gradio_extensons, scripts  # noqa: E402, F401  (gradio_extensons patches gradio on import)
from modules.ui_components import InputAccordion  # noqa: E402
from webui_stub import harness  # noqa: E402

#: The WebUI's Hires fix sliders tome.js reads: (item, label, minimum, maximum, value, step).
HIRES_SLIDERS: tuple[tuple[str, str, float, float, float, float], ...] = (
    ("hr_scale", "Upscale by", 1, 4, 2, 0.05),
    ("hr_resize_x", "Resize width to", 0, 2048, 0, 8),
    ("hr_resize_y", "Resize height to", 0, 2048, 0, 8),
)


def head_html() -> str:
    """The <script> tags the WebUI would put into <head> (inlined here: no `file=` route to allow).

    Each is named by a `sourceURL` comment, so stack traces (the stand-ins' timer watch) tell which one ran.
    """
    return "".join(
        f"<script>\n{path.read_text(encoding='utf-8')}\n//# sourceURL={path.name}\n</script>\n" for path in HEAD_SCRIPTS
    )


def inject_head(html: str) -> None:
    """Like `modules.ui_gradio_extensions.reload_javascript`: add `html` before </head> of every page served."""
    original = gr.routes.templates.TemplateResponse

    def template_response(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], str):
            # gradio 3.41 calls TemplateResponse(name, context); Starlette 1.x (what pip resolves next to gradio
            # 3.41 today; the WebUI pins fastapi 0.94) only takes TemplateResponse(request, name, context).
            name, context, *rest = args
            args = (context["request"], name, context, *rest)
        res = original(*args, **kwargs)
        res.body = res.body.replace(b"</head>", f"{html}</head>".encode())
        res.init_headers()
        return res

    gr.routes.templates.TemplateResponse = template_response


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Where the page's log of the calls it received is read (`GET`), as JSON: `{"calls": [{"t", "path", "fn_index"}]}`.
CALLS_PATH = "/tome-test/calls"


class CallLog:
    """ASGI middleware: records every event call the page makes (`POST .../run/<name>`, `.../api/<name>`), with
    its time and `fn_index`, and answers `GET /tome-test/calls` with them; with `delay`, holds each call that long
    first, as a busy WebUI does (so the page shows gradio's pending state as it does in the real WebUI)."""

    def __init__(self, app: ASGIApp, delay: float = 0.0) -> None:
        self.app = app
        self.delay = delay
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope.get("type") == "http" and path == CALLS_PATH:
            body = json.dumps({"calls": self.calls}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if scope.get("type") != "http" or scope.get("method") != "POST" or not path.startswith(("/run/", "/api/")):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            fn_index = json.loads(raw).get("fn_index")
        except (ValueError, AttributeError):
            fn_index = None
        self.calls.append({"t": time.time(), "path": path, "fn_index": fn_index})
        if self.delay:
            await asyncio.sleep(self.delay)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def log_calls(delay: float) -> None:
    """Add `CallLog` to every app gradio creates (before its server starts)."""
    original = gr.routes.App.create_app

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = original(*args, **kwargs)
        app.add_middleware(CallLog, delay=delay)
        return app

    gr.routes.App.create_app = staticmethod(create_app)


def build() -> gr.Blocks:
    harness.load_extension()
    # System fonts only: the default theme would fetch a web font, and the test browser has no network.
    theme = gr.themes.Default(font=["sans-serif"], font_mono=["monospace"])
    blocks = gr.Blocks(title="sd-webui-tome UI test page", theme=theme, analytics_enabled=False)
    with blocks as demo, gr.Tabs(elem_id="tabs"):
        for tab in ("txt2img", "img2img"):
            with gr.Tab(tab, id=tab, elem_id=f"tab_{tab}"):
                controls = [gr.Textbox(label="Prompt", lines=1, elem_id=f"{tab}_prompt")]
                with gr.Row():
                    controls.append(gr.Slider(64, 2048, 512, step=8, label="Width", elem_id=f"{tab}_width"))
                    controls.append(gr.Slider(64, 2048, 512, step=8, label="Height", elem_id=f"{tab}_height"))
                    controls.append(gr.Slider(1, 241, 1, step=1, label="Batch size", elem_id=f"{tab}_batch_size"))
                if tab == "txt2img":
                    with InputAccordion(False, label="Hires. fix", elem_id="txt2img_hr") as enable_hr:
                        controls.append(enable_hr)
                        with gr.Row():
                            for item, label, low, high, value, step in HIRES_SLIDERS:
                                slider = gr.Slider(low, high, value, step=step, label=label, elem_id=f"txt2img_{item}")
                                controls.append(slider)
                runner = scripts.ScriptRunner()
                runner.initialize_scripts(tab == "img2img")
                runner.setup_ui()
                # As in the WebUI, every control is an input of Generate; gradio 3 renders a component that
                # is no event's input as disabled.
                generate = gr.Button("Generate", elem_id=f"{tab}_generate")
                generate.click(fn=lambda *args: None, inputs=[*controls, *runner.inputs[1:]], queue=False)
    return demo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=7861)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to hold each event call (a busy server)")
    args = parser.parse_args(argv)
    inject_head(head_html())
    log_calls(args.delay)
    demo = build()
    print(f"tome test page: http://127.0.0.1:{args.port}", flush=True)
    demo.launch(server_name="127.0.0.1", server_port=args.port, show_api=False, quiet=True)


if __name__ == "__main__":
    main()
