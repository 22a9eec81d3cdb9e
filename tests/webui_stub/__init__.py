"""A stand-in for the AUTOMATIC1111 WebUI, for the extension's CPU tests (no WebUI checkout needed).

`modules/` mirrors the few WebUI modules the extension touches (scripts, shared, script_callbacks,
ui_components, processing, sd_models, errors), following docs/webui-contract.md: the callback order of
`process_images` (section 2.3) for v1.10 and for v1.6-1.9 (no `process_before_every_sampling`), swallowed
callback exceptions, the built-in token merging's bookkeeping, model swaps. `harness` loads `scripts/tome.py`
the way the WebUI does and runs generations with a fake sampler that records what each step saw.

Importing this package puts its folder (for `modules`) and the repository root (for `tome_core`, `tome_webui`)
on `sys.path`, as the WebUI would.
"""

from __future__ import annotations

import sys
from pathlib import Path

STUB_DIR = Path(__file__).resolve().parent
REPO_DIR = STUB_DIR.parents[1]

for _path in (str(REPO_DIR), str(STUB_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
