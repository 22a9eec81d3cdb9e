"""Refusing invalid ToMe args in API requests with HTTP 422, before generation starts.

The WebUI swallows exceptions raised in script callbacks (they are logged and generation goes on), so the script
itself cannot make a request fail. Instead `on_app_started` installs `TomeRequestValidator`, an ASGI middleware
on the WebUI's FastAPI app. For `POST /sdapi/v1/txt2img` and `/sdapi/v1/img2img` it reads the JSON body, finds
the `alwayson_scripts` entry whose key is our title in any case (`"tome"`, as the WebUI matches it), checks its
`args` with the parser the script uses (`tome_webui.params`), and answers::

    HTTP 422 {"detail": "ToMe (alwayson_scripts['tome']): ratio (args[1]) must be a number in [0, 0.95], got 5"}

A valid (or unrelated) request passes through byte for byte. As a second line, if invalid args reach the script
anyway (the middleware could not be installed, or a caller builds `p` itself), ToMe does not run and the message
is written into the response's `info` as `extra_generation_params["ToMe error"]` (see `tome_webui.lifecycle`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from tome_webui.params import TITLE, TomeArgsError, validate_request_args

log = logging.getLogger("tome")

#: Request paths checked, matched at the end of the path (a `--subpath` prefix is fine).
GENERATION_PATHS: tuple[str, ...] = ("/sdapi/v1/txt2img", "/sdapi/v1/img2img")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def request_error(payload: Any) -> str | None:
    """Why a txt2img/img2img request body is to be refused for its ToMe entry, or None to let it through."""
    if not isinstance(payload, dict):
        return None  # FastAPI answers malformed bodies itself
    scripts = payload.get("alwayson_scripts")
    if not isinstance(scripts, dict):
        return None
    for key, entry in scripts.items():
        if not isinstance(key, str) or key.lower() != TITLE.lower():
            continue
        where = f"{TITLE} (alwayson_scripts[{key!r}])"
        if not isinstance(entry, dict):
            return f'{where} must be an object like {{"args": [...]}}, got {type(entry).__name__}'
        if "args" not in entry:
            continue
        try:
            validate_request_args(entry["args"])
        except TomeArgsError as exc:
            return f"{where}: {exc}"
    return None


def _is_generation_request(scope: Scope) -> bool:
    return (
        scope.get("type") == "http"
        and scope.get("method") == "POST"
        and str(scope.get("path", "")).rstrip("/").endswith(GENERATION_PATHS)
    )


class TomeRequestValidator:
    """ASGI middleware: 422 for generation requests whose ToMe args are invalid; everything else untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_generation_request(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away: let the app see it
                await self.app(scope, _replay(b"".join(chunks), message, receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None  # not JSON: FastAPI answers with its own 422
        error = request_error(payload)
        if error is not None:
            log.warning("ToMe: refused API request: %s", error)
            await _send_json(send, 422, {"detail": error})
            return
        await self.app(scope, _replay(body, None, receive), send)


def _replay(body: bytes, last: Message | None, receive: Receive) -> Receive:
    """A `receive` that hands out the body already read (and then the message that ended reading), then the rest."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if last is not None:
        pending.append(last)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


async def _send_json(send: Send, status: int, content: dict[str, Any]) -> None:
    body = json.dumps(content).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(app: Any) -> bool:
    """Add `TomeRequestValidator` to a FastAPI/Starlette app once; True if it was added now.

    The app has already started (its middleware stack is built), so this resets the stack to be rebuilt on the
    next request, as the WebUI's own `setup_middleware` does.
    """
    for middleware in getattr(app, "user_middleware", ()):
        if getattr(getattr(middleware, "cls", None), "__name__", "") == TomeRequestValidator.__name__:
            return False
    app.middleware_stack = None
    app.add_middleware(TomeRequestValidator)
    return True


def on_app_started(demo: Any, app: Any) -> None:
    """`script_callbacks.on_app_started`: install the request check on the WebUI's app."""
    try:
        added = install(app)
    except (AttributeError, RuntimeError, TypeError) as exc:
        log.warning("ToMe: API requests with invalid ToMe args will not be refused (no middleware: %s)", exc)
        return
    if added:
        log.debug("ToMe: API request check installed")
