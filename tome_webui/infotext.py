"""Infotext: the one table of our keys, writing them, and reading them back into the controls.

Key table (`KEYS`, derived from the `tome_core.field_specs()` labels: "ToMe " + the label in lower case,
punctuation turned into spaces)::

    ratio            ToMe ratio              hr_mode            ToMe hires
    max_downsample   ToMe max downsample     hr_ratio           ToMe hires ratio
    sx               ToMe stride x           hr_max_downsample  ToMe hires max downsample
    sy               ToMe stride y           hr_sx              ToMe hires stride x
    use_rand         ToMe random partitions  hr_sy              ToMe hires stride y
    merge_attn       ToMe merge self attention
    merge_crossattn  ToMe merge cross attention
    merge_mlp        ToMe merge MLP
    seed             ToMe seed
    mode             ToMe mode
    matching         ToMe matching
    step_start       ToMe start at step
    step_end         ToMe end at step

plus `ToMe builtin: disabled` (the WebUI's own token merging would have run and was switched off for this job)
`ToMe error: ...` (the args were invalid; ToMe did not run) and `ToMe note: ...` (ToMe merged in fewer blocks than
its settings select, and why: e.g. `merged in 0 of 16 blocks (attention replaced by another extension)`, or the
model has no UNet).

Keys hold only letters, digits and spaces (WebUI 1.6 parses keys as `[\\w ]+`), never collide with the
built-in `Token merging ratio` keys, and values are never shaped like `2x2` (which the WebUI splits in two).
The non-advanced fields are always written when ToMe ran (`ToMe ratio` marks that it ran); advanced fields only
when they differ from the default; the hires keys only for a txt2img job with Hires fix, the hires settings only
in "own" mode. A missing key reads back as its default.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from tome_webui.params import (
    ARG_NAMES,
    FIELD_NAMES,
    HIRES_FIELDS,
    TomeArgsError,
    TomeJob,
    coerce,
    field_of,
    spec,
    ui_value,
)

log = logging.getLogger("tome")

PREFIX = "ToMe"


def _key(label: str) -> str:
    words = re.sub(r"[^A-Za-z0-9]+", " ", label).strip()
    return words[:1].lower() + words[1:]


#: The one table: script arg name -> infotext key, for every arg but `enabled`.
KEYS: Mapping[str, str] = MappingProxyType(
    {
        **{name: f"{PREFIX} {_key(spec(name).label)}" for name in FIELD_NAMES},
        "hr_mode": f"{PREFIX} hires",
        **{f"hr_{name}": f"{PREFIX} hires {_key(spec(name).label)}" for name in HIRES_FIELDS},
    }
)
BUILTIN_KEY = f"{PREFIX} builtin"
ERROR_KEY = f"{PREFIX} error"
#: What ToMe could not do as configured (blocks that did not merge and why, a model without a UNet).
NOTE_KEY = f"{PREFIX} note"
#: Name of the `enabled` entry in `infotext_fields`, used only to match it between tabs for "Send to img2img";
#: never written (whether ToMe ran is read from `ToMe ratio`).
ENABLED_NAME = f"{PREFIX} enabled"
#: Every key this extension writes.
ALL_KEYS: frozenset[str] = frozenset((*KEYS.values(), BUILTIN_KEY, ERROR_KEY, NOTE_KEY))
#: The key whose presence says "ToMe ran for this image".
MARKER_KEY = KEYS["ratio"]


def format_value(value: Any) -> str:
    """An infotext value: "True"/"False", "0.5" (the shortest text that reads back as the same float), "2", "auto"."""
    return repr(value) if isinstance(value, float) else str(value)


def entries(job: TomeJob, *, with_hires: bool) -> dict[str, str]:
    """The infotext entries of a job (`with_hires`: a txt2img job with Hires fix)."""
    out: dict[str, str] = {}
    for name in FIELD_NAMES:
        value = getattr(job.first, name)
        if value is not None and (not spec(name).advanced or value != spec(name).default):
            out[KEYS[name]] = format_value(value)
    if with_hires:
        out[KEYS["hr_mode"]] = job.hires_mode
        if job.hires_mode == "own" and job.hires is not None:
            for name in HIRES_FIELDS:
                out[KEYS[f"hr_{name}"]] = format_value(getattr(job.hires, name))
    return out


def without_ours(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `extra_generation_params` without any of our keys."""
    return {key: value for key, value in params.items() if key not in ALL_KEYS}


# ---------------------------------------------------------------------------------------------- reading back


class InfotextField(str):
    """An `infotext_fields` entry key that is both a name and a reader.

    As a string it equals its infotext key, so the gallery's "Send to img2img" (which matches entries of both
    tabs by name) copies the control. As a callable (the WebUI calls callables first, in UI paste and in the
    API `infotext` field) it returns the control's value with the control's own type, so "False" becomes a real
    False and ints stay ints, or None to leave the control as it is. It never raises.
    """

    reader: Callable[[Mapping[str, Any]], Any]

    def __new__(cls, name: str, reader: Callable[[Mapping[str, Any]], Any]) -> InfotextField:
        obj = super().__new__(cls, name)
        obj.reader = reader
        return obj

    def __call__(self, params: Mapping[str, Any]) -> Any:
        try:
            return self.reader(params)
        except TomeArgsError as exc:
            log.warning("ToMe: cannot restore %r from the infotext: %s", str(self), exc)
            return None


def has_tome(params: Mapping[str, Any]) -> bool:
    """Whether parsed infotext parameters come from an image made with ToMe."""
    return MARKER_KEY in params


def read(params: Mapping[str, Any], arg_name: str) -> Any:
    """The canonical value of one arg in parsed infotext parameters of an image made with ToMe."""
    if arg_name == "enabled":
        return has_tome(params)
    key = KEYS[arg_name]
    if key in params:
        return coerce(arg_name, params[key], key)
    if arg_name == "hr_mode":
        return "same"
    if arg_name.startswith("hr_"):
        return read(params, field_of(arg_name))  # not in "own" mode: the hires controls follow the first pass
    return spec(arg_name).default


def _reader(arg_name: str) -> Callable[[Mapping[str, Any]], Any]:
    if arg_name == "enabled":
        return has_tome

    def reader(params: Mapping[str, Any]) -> Any:
        return ui_value(arg_name, read(params, arg_name)) if has_tome(params) else None

    return reader


def field(arg_name: str) -> InfotextField:
    """The `infotext_fields` key of one arg."""
    return InfotextField(ENABLED_NAME if arg_name == "enabled" else KEYS[arg_name], _reader(arg_name))


def paste_fields(components: Iterable[Any], arg_names: Iterable[str] = ARG_NAMES) -> list[tuple[Any, InfotextField]]:
    """`Script.infotext_fields` for the components `ui()` returns, in arg order."""
    return [(component, field(name)) for component, name in zip(components, arg_names)]


def send_to_names(arg_names: Iterable[str]) -> list[str]:
    """`Script.paste_field_names`: the entries "Send to img2img" copies (those both tabs have)."""
    return [str(field(name)) for name in arg_names if name != "hr_mode" and not name.startswith("hr_")]
