"""Like modules/errors.py: `report` logs an exception the WebUI swallowed; tests read `reported`."""

from __future__ import annotations

import logging
import traceback

log = logging.getLogger("webui_stub")

reported: list[str] = []


def report(message: str, *, exc_info: bool = False) -> None:
    text = message + ("\n" + traceback.format_exc() if exc_info else "")
    reported.append(text)
    log.error(text)
