"""sd-webui-tome installer step: installs nothing and needs no network.

The WebUI runs this file as a subprocess on every launch (not under `--skip-install`, and once after "Install
from URL"). The extension is pure PyTorch on top of what the WebUI already ships, so all this does is say clearly
when the installed torch is too old for it: the core needs torch>=2.0 for
`register_forward_pre_hook(with_kwargs=True)`.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import shlex
import sys

log = logging.getLogger("tome")

MIN_TORCH = (2, 0)


def skip_install(argv: list[str]) -> bool:
    """Whether the WebUI was started with --skip-install: our argv, COMMANDLINE_ARGS, or `launch.args`."""
    if "--skip-install" in argv or "--skip-install" in shlex.split(os.environ.get("COMMANDLINE_ARGS", "")):
        return True
    try:
        import launch  # the WebUI's launcher (PYTHONPATH is the WebUI root when the WebUI runs us)
    except ImportError:
        log.debug("sd-webui-tome: not run by the WebUI (no launch module)")
        return False
    return bool(getattr(getattr(launch, "args", None), "skip_install", False))


def torch_version() -> tuple[int, int] | None:
    """(major, minor) of the installed torch, read from its metadata (torch is not imported), or None."""
    try:
        text = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def main(argv: list[str]) -> int:
    if skip_install(argv):
        log.info("sd-webui-tome: --skip-install given; nothing to do")
        return 0
    version = torch_version()
    if version is None:
        log.warning("sd-webui-tome: torch is not installed in this environment; ToMe cannot run without torch>=2.0")
    elif version < MIN_TORCH:
        log.warning(
            "sd-webui-tome: torch %d.%d is too old: ToMe needs torch>=%d.%d"
            " (register_forward_pre_hook(with_kwargs=True)). The extension will not patch any model;"
            " upgrade torch (the WebUI 1.6+ ships 2.0.1 or newer).",
            *version,
            *MIN_TORCH,
        )
    else:
        log.info("sd-webui-tome: torch %d.%d is fine; nothing to install", *version)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    sys.exit(main(sys.argv[1:]))
