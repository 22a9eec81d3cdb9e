"""Refusing invalid ToMe args in API requests with HTTP 422, before generation starts.

The WebUI swallows exceptions raised in script callbacks (they are logged and generation goes on), so the script
itself cannot make a request fail. Instead `on_app_started` installs `TomeRequestValidator`, an ASGI middleware
on the WebUI's FastAPI app. For `POST /sdapi/v1/txt2img` and `/sdapi/v1/img2img` it reads the JSON body, finds
the `alwayson_scripts` entry whose key is our title in any case (`"tome"`, as the WebUI matches it), checks its
`args` with the parser the script uses (`tome_webui.params`, with the tab's positional order), and answers::

    HTTP 422 {"detail": "ToMe (alwayson_scripts['tome']): ratio (args[1]) must be a number in [0, 0.95], got 5"}

It also completes a positional list that stops before `preset`/`hr_preset` with the UI defaults and "custom" for
the preset args (`tome_webui.params.pad_positional`) and passes it on re-serialized, so that a list written before
the speed presets existed keeps its meaning. Any other valid (or unrelated) request passes through byte for byte.

The check is not what gives a request its meaning: the script parses its args with the same parser and the same
rules (`tome_webui.params.resolve`), so a request that arrives while the check is not installed (after the server
started, before the app-started callbacks ran; a host where it cannot be installed; a caller that builds `p`
itself) means the same. The script reads a preset the WebUI filled in for a list that stops early as "custom"
(`tome_webui.params.UI_PRESET_DEFAULT`), and refuses what the check refuses: ToMe does not run and the message is
written into the response's `info` as `extra_generation_params["ToMe error"]` (see `tome_webui.lifecycle`). Only
a request's shape is the check's alone (an entry that is not an object, args that are not a list, more values
than the script has): the WebUI consumes those before the script sees any args.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from tome_webui.params import TITLE, TomeArgsError, pad_positional, validate_request_args

log = logging.getLogger("tome")

#: Request paths checked, matched at the end of the path (a `--subpath` prefix is fine).
GENERATION_PATHS: tuple[str, ...] = ("/sdapi/v1/txt2img", "/sdapi/v1/img2img")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _entries(payload: Any) -> list[tuple[str, Any]]:
    """The (key, entry) pairs of our script in a request body's `alwayson_scripts`."""
    if not isinstance(payload, dict):
        return []  # FastAPI answers malformed bodies itself
    scripts = payload.get("alwayson_scripts")
    if not isinstance(scripts, dict):
        return []
    return [(key, entry) for key, entry in scripts.items() if isinstance(key, str) and key.lower() == TITLE.lower()]


def request_error(payload: Any, *, is_img2img: bool = False) -> str | None:
    """Why a txt2img (or img2img) request body is to be refused for its ToMe entry, or None to let it through."""
    for key, entry in _entries(payload):
        where = f"{TITLE} (alwayson_scripts[{key!r}])"
        if not isinstance(entry, dict):
            return f'{where} must be an object like {{"args": [...]}}, got {type(entry).__name__}'
        if "args" not in entry:
            continue
        try:
            validate_request_args(entry["args"], is_img2img=is_img2img)
        except TomeArgsError as exc:
            return f"{where}: {exc}"
    return None


def padded_request(payload: Any, *, is_img2img: bool = False) -> Any:
    """A valid request body whose positional ToMe args stop before the preset args, completed so that the missing
    presets mean "custom" (`tome_webui.params.pad_positional`); None when the body needs no change."""
    changed = None
    for key, entry in _entries(payload):
        args = entry.get("args") if isinstance(entry, dict) else None
        if not isinstance(args, list) or not args or isinstance(args[0], dict):
            continue
        padded = pad_positional(args, is_img2img=is_img2img)
        if padded is not None:
            changed = changed or {**payload, "alwayson_scripts": dict(payload["alwayson_scripts"])}
            changed["alwayson_scripts"][key] = {**entry, "args": padded}
    return changed


def _generation_path(scope: Scope) -> str | None:
    """The generation endpoint a request goes to ("/sdapi/v1/txt2img" or "/sdapi/v1/img2img"), else None."""
    if scope.get("type") != "http" or scope.get("method") != "POST":
        return None
    path = str(scope.get("path", "")).rstrip("/")
    return next((known for known in GENERATION_PATHS if path.endswith(known)), None)


class TomeRequestValidator:
    """ASGI middleware: 422 for generation requests whose ToMe args are invalid; everything else untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = _generation_path(scope)
        if path is None:
            await self.app(scope, receive, send)
            return
        is_img2img = path.endswith("img2img")
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
        error = request_error(payload, is_img2img=is_img2img)
        if error is not None:
            log.warning("ToMe: refused API request: %s", error)
            await _send_json(send, 422, {"detail": error})
            return
        padded = padded_request(payload, is_img2img=is_img2img)
        if padded is not None:
            body = json.dumps(padded).encode("utf-8")
            headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode("ascii"))]}
            log.debug("ToMe: positional args without presets completed with preset 'custom'")
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
