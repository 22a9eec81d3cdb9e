"""Infotext: the one table of our keys, writing them, and reading them back into the controls.

Key table (`KEYS`, derived from the `tome_core.field_specs()` labels: "ToMe " + the label with its first word in
lower case unless an acronym, punctuation turned into spaces)::

    preset           ToMe preset             hr_mode            ToMe hires
    ratio            ToMe ratio              hr_preset          ToMe hires preset
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
    mlp_ratio        ToMe MLP ratio
    share_plan       ToMe one plan per stack
    mlp_min_downsample  ToMe MLP from downsample

`HIRES_KEYS` gives every field a hires key the same way ("ToMe hires " + label: `ToMe hires MLP ratio`, ...); the
four of `hr_ratio` ... `hr_sy` are the ones above. Also `ToMe builtin: disabled` (the WebUI's own token merging
would have run and was switched off for this job), `ToMe error: ...` (the args were invalid; ToMe did not run) and
`ToMe note: ...` (ToMe merged in fewer blocks than its settings select, and why: e.g. `merged in 0 of 16 blocks
(attention replaced by another extension)`, or the model has no UNet), and `ToMe version` (`tome_core.__version__`,
beside any other key of ours: which version made the image, for bug reports; no control reads it back).

What is written, for a job that ran (`entries`):

* `ToMe preset` when the first pass used a preset as it is (absent: custom settings, as in images made before
  presets existed). A preset with values laid over it (XYZ plot, dict-form fields) is recorded as custom values.
* The values the first pass ran with, resolved for the model that ran: the non-advanced fields always
  (`ToMe ratio` also marks that ToMe ran), the advanced ones when they differ from the default. On a diffusion
  transformer (Flux, Wan, ...) only the fields it runs (`tome_core.dit.DIT_FIELDS`: `ToMe mode`, the strides,
  `ToMe start at block`, ...; with merged blocks also the ratio; `ToMe mode` then marks that ToMe ran): the others
  mean nothing there and paste back as their defaults.
* txt2img with Hires fix: `ToMe hires` (`same`, `own`, `off`), `ToMe hires preset` in own mode with a preset,
  and the hires pass's values: in own mode always its ratio, max downsample and strides, and any other field
  whose value differs from the first pass's. A "same" pass that custom settings could not reproduce (a preset
  with values laid over it, on a hires model of another family) is recorded as `own` with its values.

A preset resolves per model, so these values are written once a pass knows its model (`tome_webui.lifecycle`
updates them after each batch, before its infotexts are written).

Reading back (paste, and the API's `infotext` field): the preset selectors and every control; a missing
`ToMe preset` reads as custom, a missing field as its default, a missing hires value as the first pass's. So
an image pastes with its preset selected and the detailed controls holding exactly what ran: switching to
Custom keeps the image's values. Hires values without an `hr_*` control (`ToMe hires MLP ratio`, ...) are a
record only: the hires pass's preset (or "same") reproduces them.

Keys hold only letters, digits and spaces (WebUI 1.6 parses keys as `[\\w ]+`), never collide with the
built-in `Token merging ratio` keys, and values are never shaped like `2x2` (which the WebUI splits in two).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from tome_core import FAMILIES, TomeConfig
from tome_core.dit import DIT_FIELDS, MERGE_FIELDS
from tome_webui.params import (
    ARG_NAMES,
    CUSTOM,
    FIELD_NAMES,
    HIRES_ARG_NAMES,
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
    """A label as key words: punctuation to spaces, the first word in lower case unless it is an acronym."""
    first, _, rest = re.sub(r"[^A-Za-z0-9]+", " ", label).strip().partition(" ")
    if not (len(first) > 1 and first.isupper()):
        first = first[:1].lower() + first[1:]
    return f"{first} {rest}".strip()


#: The hires key of every field: "ToMe hires " + its label.
HIRES_KEYS: Mapping[str, str] = MappingProxyType(
    {name: f"{PREFIX} hires {_key(spec(name).label)}" for name in FIELD_NAMES}
)
#: The one table: script arg name -> infotext key, for every arg but `enabled`.
KEYS: Mapping[str, str] = MappingProxyType(
    {
        **{name: f"{PREFIX} {_key(spec(name).label)}" for name in FIELD_NAMES},
        "preset": f"{PREFIX} preset",
        "hr_mode": f"{PREFIX} hires",
        "hr_preset": f"{PREFIX} hires preset",
        **{f"hr_{name}": HIRES_KEYS[name] for name in HIRES_FIELDS},
    }
)
BUILTIN_KEY = f"{PREFIX} builtin"
ERROR_KEY = f"{PREFIX} error"
#: What ToMe could not do as configured (blocks that did not merge and why, a model without a UNet).
NOTE_KEY = f"{PREFIX} note"
#: The extension's version, written with our other keys. A record, not a setting: paste ignores it, as it ignores any
#: key no control names, so an image pastes the same into any version.
VERSION_KEY = f"{PREFIX} version"
#: Name of the `enabled` entry in `infotext_fields`, used only to match it between tabs for "Send to img2img";
#: never written (whether ToMe ran is read from `ToMe ratio` or `ToMe preset`).
ENABLED_NAME = f"{PREFIX} enabled"
#: The keys of the settings and the values that ran (rewritten after each batch).
VALUE_KEYS: frozenset[str] = frozenset((*KEYS.values(), *HIRES_KEYS.values()))
#: Every key this extension writes.
ALL_KEYS: frozenset[str] = frozenset((*VALUE_KEYS, BUILTIN_KEY, ERROR_KEY, NOTE_KEY, VERSION_KEY))
#: The keys whose presence says "ToMe ran for this image": `ToMe ratio` is written whenever a UNet's values are,
#: `ToMe mode` whenever any values are (a diffusion transformer's have no ratio), `ToMe preset` for a preset.
MARKER_KEYS: tuple[str, ...] = (KEYS["ratio"], KEYS["preset"], KEYS["mode"])


def format_value(value: Any) -> str:
    """An infotext value: "True"/"False", "0.5" (the shortest text that reads back as the same float), "2", "auto"."""
    return repr(value) if isinstance(value, float) else str(value)


def _resolved(job: TomeJob, is_hr_pass: bool, family: str | None) -> TomeConfig | None:
    """The config a pass ran with (None: off, or a preset whose model family is not known)."""
    if job.needs_family(is_hr_pass) and family is None:
        return None
    return job.pass_config(is_hr_pass, family)


def entries(job: TomeJob, *, with_hires: bool, families: Mapping[bool, str] | None = None) -> dict[str, str]:
    """The infotext entries of a job (`with_hires`: a txt2img job with Hires fix).

    `families` maps `is_hr_pass` to the model family that pass ran on; a preset's values are written only for a
    known family (a pass that did not run takes the other pass's).
    """
    families = families or {}
    out: dict[str, str] = {}
    preset = job.preset if not job.changes else CUSTOM
    if preset != CUSTOM:
        out[KEYS["preset"]] = preset
    family = families.get(False) or families.get(True)
    first = _resolved(job, False, family)
    if first is not None:
        for name in fields_of(family, first):
            value = getattr(first, name)
            if value is not None and (not spec(name).advanced or value != spec(name).default):
                out[KEYS[name]] = format_value(value)
    if not with_hires:
        return out
    mode = job.hires_mode
    hires = _resolved(job, True, families.get(True) or families.get(False))
    if mode == "same" and preset == CUSTOM and first is not None and hires is not None and hires != first:
        mode = "own"  # a preset with values laid over it, resolved for another family: own settings reproduce it
    out[KEYS["hr_mode"]] = mode
    if mode == "own" and job.hires_preset != CUSTOM and not job.hires_changes:
        out[KEYS["hr_preset"]] = job.hires_preset
    if hires is not None:
        for name in fields_of(families.get(True) or families.get(False), hires, first):
            value = getattr(hires, name)
            always = mode == "own" and name in HIRES_FIELDS
            differs = first is not None and value != getattr(first, name)
            # An optional field the first pass set and the hires pass leaves unset is written as "None", which
            # reads back as None: otherwise pasting would give the hires pass the first pass's value.
            if differs or (value is not None and (always or first is None)):
                out[HIRES_KEYS[name]] = format_value(value)
    return out


def fields_of(family: str | None, *configs: TomeConfig | None) -> tuple[str, ...]:
    """The fields written for a pass on a model of `family`: every field on a UNet (or an unknown family), on a
    diffusion transformer those it runs with the `configs`' modes (`tome_core.dit`: keys/values subsampling, or merged
    blocks, which add the ratio)."""
    if family is None or family in FAMILIES:
        return FIELD_NAMES
    runs = MERGE_FIELDS if any(c is not None and c.mode == "merge" for c in configs) else DIT_FIELDS
    return tuple(name for name in FIELD_NAMES if name in runs)


def without_ours(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `extra_generation_params` without any of our keys."""
    return {key: value for key, value in params.items() if key not in ALL_KEYS}


def update(params: dict[str, Any], fresh: Mapping[str, str]) -> None:
    """Replace our value entries in `extra_generation_params` (in place) by `fresh`; other keys stay where they are."""
    for key in [key for key in params if key in VALUE_KEYS and key not in fresh]:
        del params[key]
    params.update(fresh)


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
    return any(key in params for key in MARKER_KEYS)


def read(params: Mapping[str, Any], arg_name: str) -> Any:
    """The canonical value of one arg in parsed infotext parameters of an image made with ToMe."""
    if arg_name == "enabled":
        return has_tome(params)
    key = KEYS[arg_name]
    if key in params:
        return coerce(arg_name, params[key], key)
    if arg_name == "preset":
        return CUSTOM  # older images, and custom settings
    if arg_name == "hr_mode":
        return "same"
    if arg_name == "hr_preset":
        # "own" without a hires preset is own custom settings; otherwise, if the user switches to "Own settings",
        # the first pass's preset gives what "same" gave
        return CUSTOM if read(params, "hr_mode") == "own" else read(params, "preset")
    if arg_name in HIRES_ARG_NAMES:
        return read(params, field_of(arg_name))  # no hires value: the hires controls follow the first pass
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
    return [str(field(name)) for name in arg_names if name not in HIRES_ARG_NAMES]
