"""WebUI glue for sd-webui-tome: everything `scripts/tome.py` delegates to.

Modules:
    params     the script args: positional order (`ARG_NAMES`), the dict form, speed presets, parsing into a `TomeJob`
    infotext   the infotext key table (`KEYS`), writing, and reading back into the controls
    lifecycle  applying/removing the patch per pass, the built-in token merging, the callbacks (one for every host)
    hosts      one adapter per host (A1111; Forge 2/Neo, reForge, Forge Classic; SD.Next): the UNet or diffusion
               transformer ToMe patches, its family, and the built-in on a model
    report     the "ToMe note": blocks that really merged per pass against those the config selects, and why
    ui         the accordion (`build`) and the element ids (`ELEM_ITEMS`)
    api        the HTTP 422 check of API requests (`TomeRequestValidator`)
    xyz        the XYZ plot axes
    compat     what differs between WebUI versions

WebUI modules (`modules.*`) are imported only inside functions, so importing this package has no side effects.
All submodules are imported here, while the extension root is on `sys.path` (A1111 puts it there only while
`scripts/tome.py` loads).
"""

from tome_webui import api, compat, hosts, infotext, lifecycle, params, report, ui, xyz
from tome_webui.infotext import KEYS
from tome_webui.params import ARG_NAMES, IMG2IMG_ARG_NAMES, TITLE, TomeArgsError, TomeJob
from tome_webui.ui import ELEM_ITEMS

__all__ = [
    "ARG_NAMES",
    "ELEM_ITEMS",
    "IMG2IMG_ARG_NAMES",
    "KEYS",
    "TITLE",
    "TomeArgsError",
    "TomeJob",
    "api",
    "compat",
    "hosts",
    "infotext",
    "lifecycle",
    "params",
    "report",
    "ui",
    "xyz",
]
