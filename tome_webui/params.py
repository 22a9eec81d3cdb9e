"""The script's arguments: their positional order, the dict form, and how both become a `TomeJob`.

This is the API contract of `alwayson_scripts: {"tome": {"args": [...]}}`.

Speed presets
    `preset` picks one of the named speed settings of `tome_core.presets()` ("quality", "balanced", "fast",
    "fastest") or "custom" (the detailed settings). A preset is resolved when each sampling pass starts, for the
    model that runs it (SD1.x/SD2.x or SDXL, `tome_core.model_family`), so a hires checkpoint or refiner of
    another family gets that family's values. The infotext records the preset and the values that ran (`tome_webui.infotext`).

Positional form
    The args are the values of the components `ui()` returns, in `ARG_NAMES` order. Positions never move: the
    args of the first release keep their indices and every later arg is appended::

        index  txt2img args
        0      enabled
        1-13   ratio, max_downsample, sx, sy, use_rand, merge_attn, merge_crossattn, merge_mlp, seed,
               mode, matching, step_start, step_end
        14-18  hr_mode, hr_ratio, hr_max_downsample, hr_sx, hr_sy
        19-22  mlp_ratio, share_plan, preset, hr_preset
        23     mlp_min_downsample
        24-25  min_downsample, pool_kv
        26-28  st, block_start, block_end                     (19 on: appended after the first release)

    img2img has no Hires fix pass group: its args are the txt2img order without the hires ones
    (`IMG2IMG_ARG_NAMES`: 0 enabled, 1-13 the same fields, 14-22 mlp_ratio, share_plan, preset,
    mlp_min_downsample, min_downsample, pool_kv, st, block_start, block_end), so its first 14 positions are those of
    txt2img too. A shorter list keeps the defaults for
    the missing tail, except that a missing `preset` or `hr_preset` means "custom": a list written before presets
    existed keeps its meaning. The WebUI fills missing args itself, with the values of a freshly built `ui()`
    (`Api.init_default_script_args`), where the speed selectors start at `UI_PRESET_DEFAULT`: the default preset
    as an object of its own, which no request and no page can send, so the script tells a preset left out from one
    given (see `UI_PRESET_DEFAULT`). The API check in `tome_webui.api` also completes such a list with "custom".
    With a preset other than "custom", the detailed settings in the list (the fields; in own hires mode also
    hr_ratio ... hr_sy with an hr_preset other than "custom") are not used.

    Values may be given as their JSON types or as the strings the UI shows: `max_downsample` is "auto", 1, 2,
    4 or 8; an optional number (`seed`, `mlp_ratio`) is a number or -1/null for its default (None); `hr_mode` is
    "same", "own" or "off" (or the labels "Same as first pass", "Own settings", "Off"); `preset` and
    `hr_preset` are "quality", "balanced", "fast", "fastest" or "custom" (or their labels).

Dict form
    A single JSON object as the only arg::

        {"enabled": true, "preset": "fast",
         "hires": "same" | "off" | {"preset": "fastest"} | {"ratio": 0.7, "sx": 2, "sy": 2, "max_downsample": "auto"},
         ...any TomeConfig field by name}

    `enabled` defaults to true (sending settings means "use them"), `hires` to "same". Without "preset" the
    dict means "custom" and its fields are the settings (missing ones take the `TomeConfig` defaults), as
    before presets existed. With a preset, fields given next to it are laid over the preset's values for the
    model that runs (like `tome_core.apply_patch(model, preset="fast", ratio=0.4)`); the infotext then records
    the result as custom values, which paste back exactly. The `hires` object takes either a preset or its own
    settings: missing keys of its own settings follow the first pass (a preset's values included).

Hires fix pass
    "same": the first pass's preset (resolved for the hires pass's model) or the same custom settings. "own":
    the own preset (`hr_preset`), or with `hr_preset` "custom"
    the first pass's values with own ratio, max downsample and strides. "off": no merging.

Invalid input raises `TomeArgsError`, whose message names the argument and its allowed values. Nothing is
guessed: a value that is not valid for its field is an error, never clamped. Every arg is checked, also when ToMe
is off: the API check (`validate_request_args`) and the script (`resolve`, from `before_process`) apply the same
rules and the same refusals to the same args, so a request means the same whether or not the check is installed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import tome_core
from tome_core import FieldSpec, TomeConfig, field_specs, get_preset, presets

#: The script's `title()`, which is also its API key: `alwayson_scripts: {"tome": ...}` (matched in any case).
TITLE = "ToMe"
#: Every TomeConfig field, in `field_specs()` order.
FIELD_NAMES: tuple[str, ...] = tuple(spec.name for spec in field_specs())
#: The fields the Hires fix pass may set on its own ("Own settings", custom); the other fields follow the first pass.
HIRES_FIELDS: tuple[str, ...] = tuple(name for name in FIELD_NAMES if name in ("ratio", "max_downsample", "sx", "sy"))
#: Hires fix pass modes: merge as in the first pass, with own settings, or not at all.
HIRES_MODES: tuple[str, ...] = ("same", "own", "off")
HIRES_MODE_LABELS: Mapping[str, str] = MappingProxyType(
    {"same": "Same as first pass", "own": "Own settings", "off": "Off"}
)
#: The speed selector's value for "the detailed settings".
CUSTOM = "custom"
#: The speed selector's values: the presets, from the most faithful to the fastest, then "custom".
PRESET_CHOICES: tuple[str, ...] = (*(preset.name for preset in presets()), CUSTOM)
PRESET_LABELS: Mapping[str, str] = MappingProxyType(
    {**{preset.name: preset.label for preset in presets()}, CUSTOM: "Custom"}
)
#: The args that pick a preset.
PRESET_ARGS: tuple[str, ...] = ("preset", "hr_preset")
#: What the speed selectors start at in the UI (and so what the WebUI fills in for args a request leaves out).
DEFAULT_PRESET = tome_core.DEFAULT_PRESET

#: The fields of the first release, in their positional order (positions are a contract: never reorder).
V1_FIELDS: tuple[str, ...] = (
    "ratio",
    "max_downsample",
    "sx",
    "sy",
    "use_rand",
    "merge_attn",
    "merge_crossattn",
    "merge_mlp",
    "seed",
    "mode",
    "matching",
    "step_start",
    "step_end",
)
HIRES_ARGS: tuple[str, ...] = tuple(f"hr_{name}" for name in HIRES_FIELDS)
#: Args added after the first release, in the order they were added: new args are only ever appended here.
APPENDED_ARGS: tuple[str, ...] = (
    "mlp_ratio",
    "share_plan",
    "preset",
    "hr_preset",
    "mlp_min_downsample",
    "min_downsample",
    "pool_kv",
    "st",
    "block_start",
    "block_end",
)
#: The positional order of the script's args in txt2img (= the order of the components `ui()` returns). A field
#: added to TomeConfig later and not yet listed in APPENDED_ARGS lands at the end.
ARG_NAMES: tuple[str, ...] = (
    "enabled",
    *V1_FIELDS,
    "hr_mode",
    *HIRES_ARGS,
    *APPENDED_ARGS,
    *(name for name in FIELD_NAMES if name not in V1_FIELDS and name not in APPENDED_ARGS),
)
#: The args of the Hires fix pass group (txt2img only).
HIRES_ARG_NAMES: tuple[str, ...] = ("hr_mode", *HIRES_ARGS, "hr_preset")
#: img2img has no Hires fix pass group: its args are `ARG_NAMES` without the hires ones, in the same order.
IMG2IMG_ARG_NAMES: tuple[str, ...] = tuple(name for name in ARG_NAMES if name not in HIRES_ARG_NAMES)
#: Keys of the dict form, and of its `hires` object.
DICT_KEYS: tuple[str, ...] = ("enabled", "preset", *FIELD_NAMES, "hires")
HIRES_DICT_KEYS: tuple[str, ...] = ("preset", *HIRES_FIELDS)
#: The UI shows None ("use the default") of an optional number field (`seed`, `mlp_ratio`) as this number.
OPTIONAL_NONE = -1
#: What a positional list that stops before an arg means for it, where that differs from the UI default.
POSITIONAL_MISSING: Mapping[str, Any] = MappingProxyType(dict.fromkeys(PRESET_ARGS, CUSTOM))


class _FilledIn(str):
    """The type of `UI_PRESET_DEFAULT`: a str, so gradio, the WebUI and JSON treat it as the preset name it is."""

    __slots__ = ()


#: The value the speed selectors are built with (`tome_webui.ui.preset_radio`): `DEFAULT_PRESET` as an object of
#: its own. The WebUI fills each arg an API request leaves out with the value of a freshly built control
#: (`Api.init_default_script_args`, then a shallow copy per request), so a preset arg that *is* this object was not
#: in the request and means "custom" (`POSITIONAL_MISSING`). The page sends the selector's value as a plain string,
#: and an infotext the API applies is converted into a new object: both are presets given.
UI_PRESET_DEFAULT: str = _FilledIn(DEFAULT_PRESET)

_SPECS: Mapping[str, FieldSpec] = MappingProxyType({spec.name: spec for spec in field_specs()})

assert set(V1_FIELDS) <= set(FIELD_NAMES) and len(set(ARG_NAMES)) == len(ARG_NAMES)

Changes = tuple[tuple[str, Any], ...]


class TomeArgsError(ValueError):
    """Invalid script arguments. `str(error)` names the argument and its allowed values."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where} {message}")
        self.where = where


@dataclass(frozen=True)
class TomeJob:
    """What one generation does, resolved per pass for the model that runs it (`pass_config`).

    `first`: the detailed ("custom") settings of the first pass. `preset`: the first pass's preset, or "custom"
    for `first`; `changes`: values laid over the preset (XYZ plot values, dict-form fields next to a preset).
    The Hires fix pass (`hires_mode` "same", "own" or "off") starts from `hires_preset`, or
    with "custom" from the first pass's config, and lays `hires_changes` over it. In "same" mode those are the
    first pass's preset and changes; in "own" mode the own preset, or the own ratio, max downsample and strides.
    """

    first: TomeConfig
    hires_mode: str = "same"
    preset: str = CUSTOM
    changes: Changes = ()
    hires_preset: str = CUSTOM
    hires_changes: Changes = ()

    def needs_family(self, is_hr_pass: bool) -> bool:
        """Whether the pass's config depends on the model family (it uses a preset)."""
        if not is_hr_pass:
            return self.preset != CUSTOM
        return self.hires_mode != "off" and (self.hires_preset != CUSTOM or self.preset != CUSTOM)

    def pass_config(self, is_hr_pass: bool, family: str | None = None) -> TomeConfig | None:
        """The config a pass runs with on a model of `family` ("sd"/"sdxl"), no-ops included; None when the hires
        pass is off. `family` may be None only when `needs_family` is False (ValueError otherwise)."""
        if not is_hr_pass:
            if self.preset == CUSTOM:
                return self.first
            return _overlay(get_preset(self.preset).config(_family(family)), self.changes)
        if self.hires_mode == "off":
            return None
        if self.hires_preset == CUSTOM:
            base = self.pass_config(False, family)
            assert base is not None
        else:
            base = get_preset(self.hires_preset).config(_family(family))
        return _overlay(base, self.hires_changes) if self.hires_changes else base

    def config_for(self, is_hr_pass: bool, family: str | None = None) -> TomeConfig | None:
        """The config a pass patches the model with, or None when that pass must not merge."""
        config = self.pass_config(is_hr_pass, family)
        return None if config is None or config.is_noop else config

    def may_merge(self, is_hr_pass: bool) -> bool:
        """Whether the pass merges on some model (a preset always does; custom settings unless a no-op)."""
        if self.needs_family(is_hr_pass):
            return True
        return self.config_for(is_hr_pass) is not None


def _overlay(base: TomeConfig, changes: Changes) -> TomeConfig:
    """`base` with `changes` laid over it. A max downsample given below the first level `base` merges from (a preset's
    `min_downsample`, which the hires controls do not show) merges from level 1 instead: the value the user set is
    the one that runs, and nothing is refused for a field the user never saw."""
    values = dict(changes)
    top = values.get("max_downsample")
    if "min_downsample" not in values and top not in (None, "auto") and int(top) < base.min_downsample:
        values["min_downsample"] = 1
    return base.replace(**values)


def _family(family: str | None) -> str:
    if family is None:
        raise ValueError(f"a preset needs the model family ({', '.join(map(repr, tome_core.ALL_FAMILIES))}) to resolve")
    return family


# ---------------------------------------------------------------------------------------------- values


def spec(name: str) -> FieldSpec:
    """The `FieldSpec` of a TomeConfig field name."""
    return _SPECS[name]


def field_of(arg_name: str) -> str:
    """The TomeConfig field an arg name sets: "hr_ratio" -> "ratio"; "ratio" -> "ratio"."""
    return arg_name[3:] if arg_name in HIRES_ARGS else arg_name


def is_field_arg(arg_name: str) -> bool:
    """Whether an arg sets a TomeConfig field (of the first pass, or its hires twin)."""
    return field_of(arg_name) in _SPECS


def allowed(arg_name: str) -> str:
    """The allowed values of an arg, as error messages state them."""
    if arg_name == "enabled":
        return "true or false"
    if arg_name == "hr_mode":
        return "one of " + ", ".join(repr(m) for m in HIRES_MODES)
    if arg_name in PRESET_ARGS:
        return "one of " + ", ".join(repr(p) for p in PRESET_CHOICES)
    s = spec(field_of(arg_name))
    text = s.allowed()
    if s.optional:
        text += f" ({OPTIONAL_NONE} means None)"
    return text


def _error(where: str, arg_name: str, value: Any) -> TomeArgsError:
    return TomeArgsError(where, f"must be {allowed(arg_name)}, got {value!r}")


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(value)


def _to_number(value: Any) -> float | int:
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        return float(value.strip())
    raise ValueError(value)


def _choice(value: Any, labels: Mapping[str, str]) -> str:
    """A value or its label (any case) -> the value."""
    text = value.strip().lower() if isinstance(value, str) else None
    for name, label in labels.items():
        if text in (name, label.lower()):
            return name
    raise ValueError(value)


def coerce(arg_name: str, value: Any, where: str | None = None) -> Any:
    """Turn one raw arg (JSON value, UI value or infotext string) into its canonical value, or raise.

    Canonical values are what `TomeConfig` takes: bools, ints, floats, "auto", None for an optional number's
    default; `hr_mode` becomes "same"/"own"/"off", `preset`/`hr_preset` a preset name or "custom".
    """
    where = where or arg_name
    try:
        if arg_name == "enabled":
            return _to_bool(value)
        if arg_name == "hr_mode":
            return _choice(value, HIRES_MODE_LABELS)
        if arg_name in PRESET_ARGS:
            return _choice(value, PRESET_LABELS)
        s = spec(field_of(arg_name))
        if s.optional and (value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))):
            return None
        if s.kind is bool:
            return _to_bool(value)
        if s.choices is not None and isinstance(value, str) and value.strip().lower() in s.choices:
            return value.strip().lower()
        if s.kind is str:
            raise ValueError(value)
        number = _to_number(value)
        if s.optional and number == OPTIONAL_NONE:
            return None
        return s.check(number)
    except (TypeError, ValueError):
        raise _error(where, arg_name, value) from None


def ui_value(arg_name: str, value: Any) -> Any:
    """The value a UI component holds for a canonical value (the type of the component's default)."""
    if arg_name in ("enabled", "hr_mode", *PRESET_ARGS):
        return value
    s = spec(field_of(arg_name))
    if s.optional and value is None:
        return float(OPTIONAL_NONE) if s.kind is float else OPTIONAL_NONE
    if s.choices is not None:
        return str(value)
    if s.kind is float:
        return float(value)
    return value


def defaults() -> dict[str, Any]:
    """The canonical default of every arg: what `ui()` starts with (and so what the WebUI fills in)."""
    values: dict[str, Any] = {"enabled": False}
    values.update({name: spec(name).default for name in FIELD_NAMES})
    values["hr_mode"] = "same"
    values.update({f"hr_{name}": spec(name).default for name in HIRES_FIELDS})
    values.update(dict.fromkeys(PRESET_ARGS, DEFAULT_PRESET))
    return values


def arg_names(is_img2img: bool) -> tuple[str, ...]:
    """The positional order of one tab's args."""
    return IMG2IMG_ARG_NAMES if is_img2img else ARG_NAMES


def pad_positional(args: Sequence[Any], *, is_img2img: bool) -> list[Any] | None:
    """A positional list that stops before `preset`/`hr_preset`, completed so that the WebUI cannot fill those
    with the UI default: the other missing args get the UI defaults (what the WebUI would put there), the
    preset args "custom". None when nothing is missing."""
    names = arg_names(is_img2img)
    if all(len(args) > names.index(name) for name in PRESET_ARGS if name in names):
        return None
    start = {name: ui_value(name, value) for name, value in defaults().items()}
    start.update(POSITIONAL_MISSING)
    return [*args, *(start[name] for name in names[len(args) :])]


# ---------------------------------------------------------------------------------------------- parsing


class _Follow:
    """A hires value not given: it follows the first pass (whatever its preset resolves to)."""

    def __repr__(self) -> str:
        return "<follows the first pass>"


FOLLOW = _Follow()


def _from_positional(args: Sequence[Any], names: Sequence[str]) -> dict[str, Any]:
    if len(args) > len(names):
        raise TomeArgsError("args", f"has {len(args)} values, at most {len(names)} allowed: {', '.join(names)}")
    named = defaults()
    named.update(POSITIONAL_MISSING)
    named.update(zip(names, args))
    named.update({name: POSITIONAL_MISSING[name] for name in PRESET_ARGS if named[name] is UI_PRESET_DEFAULT})
    return named


def _check_dict_alone(args: Sequence[Any], names: Sequence[str]) -> None:
    """The dict form is one value: after it, only what the WebUI fills in for args a request leaves out (the UI
    defaults) may follow, so the check and the script, which sees the WebUI's filling, refuse the same lists."""
    filled = {name: ui_value(name, value) for name, value in defaults().items()}
    extra = [
        f"{name} (args[{index}])"
        for index, (name, value) in enumerate(zip(names[1:], args[1:]), start=1)
        if value is not UI_PRESET_DEFAULT and (type(value) is not type(filled[name]) or value != filled[name])
    ]
    if extra:
        raise TomeArgsError("args", f"must hold the dict alone when args[0] is a dict, got {', '.join(extra)} too")
    if len(args) > len(names):
        raise TomeArgsError("args", f"must hold the dict alone when args[0] is a dict, got {len(args)} values")


def _from_dict(values: Mapping[Any, Any]) -> dict[str, Any]:
    unknown = [key for key in values if key not in DICT_KEYS]
    if unknown:
        raise TomeArgsError(
            "args[0]", f"has unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(DICT_KEYS)}"
        )
    named = defaults()
    named.update(enabled=True, preset=CUSTOM, hr_preset=CUSTOM)
    named.update({key: value for key, value in values.items() if key != "hires"})
    named.update(dict.fromkeys(HIRES_ARGS, FOLLOW))
    hires = values.get("hires")
    if hires is None or isinstance(hires, str):
        mode = coerce("hr_mode", "same" if hires is None else hires, "hires")
        if mode == "own":
            raise TomeArgsError("hires", "must be 'same', 'off' or an object of hires settings, got 'own'")
        named["hr_mode"] = mode
    elif isinstance(hires, Mapping):
        unknown = [key for key in hires if key not in HIRES_DICT_KEYS]
        if unknown:
            raise TomeArgsError(
                "hires",
                f"has unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(HIRES_DICT_KEYS)}",
            )
        named["hr_mode"] = "own"
        named["hr_preset"] = hires.get("preset", CUSTOM)
        named.update({f"hr_{name}": value for name, value in hires.items() if name != "preset"})
        if coerce("hr_preset", named["hr_preset"], "hires.preset") != CUSTOM and len(hires) > 1:
            raise TomeArgsError(
                "hires",
                "takes either a 'preset' or its own settings (ratio, max_downsample, sx, sy), not both, got"
                f" {dict(hires)!r}",
            )
    else:
        raise TomeArgsError("hires", f"must be 'same', 'off' or an object of hires settings, got {hires!r}")
    return named


def _where(name: str, from_dict: bool, names: Sequence[str]) -> str:
    """How an error names an arg: "ratio (args[1])" for the positional form, "hires.ratio" for the dict form."""
    if not from_dict:
        return f"{name} (args[{names.index(name)}])" if name in names else name
    if name == "hr_mode":
        return "hires"
    return f"hires.{field_of(name) if name != 'hr_preset' else 'preset'}" if name in HIRES_ARG_NAMES else name


def _apply_overrides(named: dict[str, Any], changed: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Lay XYZ-plot values (`p.tome_xyz`) over the args. Any value axis implies enabled unless one says otherwise.

    A field value is laid over the first pass's preset (`changed`); a hires ratio turns the hires pass to its own
    custom settings (the others following the first pass unless it already had its own); a hires preset turns
    the hires pass to "own".
    """
    for name, value in overrides.items():
        if name in FIELD_NAMES:
            named[name] = value
            changed[name] = value
        elif name == "hr_ratio":
            own = coerce("hr_mode", named["hr_mode"], "hr_mode") == "own"
            if not own or coerce("hr_preset", named["hr_preset"], "hr_preset") != CUSTOM:
                named.update(dict.fromkeys(HIRES_ARGS, FOLLOW))
                named.update(hr_mode="own", hr_preset=CUSTOM)
            named[name] = value
        elif name == "hr_preset":
            named.update(hr_mode="own", hr_preset=value)
        else:
            named[name] = value
    if overrides and "enabled" not in overrides:
        named["enabled"] = True


def resolve(
    args: Sequence[Any],
    overrides: Mapping[str, Any] | None = None,
    *,
    is_img2img: bool = False,
) -> TomeJob | None:
    """The job the script args ask for, or None when ToMe is off.

    `args` is the tab's positional list or a list holding the dict form (followed, in the script, by what the
    WebUI fills in). `overrides` (from the XYZ plot) are laid over it by arg name. Every arg is checked, also when
    ToMe is off: this is the API check's parser too (`validate_request_args`). Raises `TomeArgsError`.
    """
    names = arg_names(is_img2img)
    from_dict = bool(args) and isinstance(args[0], Mapping)
    if from_dict:
        _check_dict_alone(args, names)
    named = _from_dict(args[0]) if from_dict else _from_positional(args, names)
    changed: dict[str, Any] = {key: named[key] for key in args[0] if key in FIELD_NAMES} if from_dict else {}
    if overrides:
        _apply_overrides(named, changed, overrides)
    enabled = coerce("enabled", named["enabled"], _where("enabled", from_dict, names))
    checked = ARG_NAMES if from_dict else names  # a dict's hires settings are checked in img2img too
    values = {
        name: coerce(name, named[name], _where(name, from_dict, names)) for name in checked if named[name] is not FOLLOW
    }
    first = _config({name: values[name] for name in FIELD_NAMES}, "")
    preset = values["preset"]
    changes: Changes = (
        () if preset == CUSTOM else tuple((name, values[name]) for name in FIELD_NAMES if name in changed)
    )
    hires_mode = "same" if is_img2img else values["hr_mode"]
    if hires_mode == "own":
        hires_preset = values["hr_preset"]
        own = {name: values[f"hr_{name}"] for name in HIRES_FIELDS if f"hr_{name}" in values}
        hires_changes: Changes = tuple(own.items()) if hires_preset == CUSTOM else ()
    else:
        hires_preset, hires_changes = preset, changes
    job = TomeJob(
        first=first,
        hires_mode=hires_mode,
        preset=preset,
        changes=changes,
        hires_preset=hires_preset,
        hires_changes=hires_changes,
    )
    _check_job(job)
    return job if enabled else None


def _config(values: Mapping[str, Any], which: str) -> TomeConfig:
    try:
        return TomeConfig(**values)
    except (TypeError, ValueError) as exc:  # a rule across fields (step_start < step_end); single values are checked
        raise TomeArgsError(f"{which}settings".strip(), f"are invalid: {exc}") from None


def _check_job(job: TomeJob) -> None:
    """Resolve both passes for every model family, so that a rule across fields fails now, not mid-generation."""
    uses_preset = job.needs_family(False) or job.needs_family(True)
    families: tuple[str | None, ...] = tome_core.ALL_FAMILIES if uses_preset else (None,)
    for family in families:
        for is_hr_pass, which in ((False, "settings"), (True, "hires settings")):
            try:
                job.pass_config(is_hr_pass, family)
            except (TypeError, ValueError) as exc:
                on = f" (on {family} models)" if family else ""
                raise TomeArgsError(which, f"are invalid{on}: {exc}") from None


def validate_request_args(args: Any, *, is_img2img: bool = False) -> None:
    """The API check: raise `TomeArgsError` unless `args` (from a request body) is valid for the tab: `resolve`'s
    rules, plus the request's shape the WebUI consumes before the script sees any args (a list)."""
    if not isinstance(args, list):
        raise TomeArgsError("args", f"must be a list, got {type(args).__name__}")
    resolve(args, is_img2img=is_img2img)
