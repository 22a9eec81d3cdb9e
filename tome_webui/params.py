"""The script's arguments: their positional order, the dict form, and how both become a `TomeJob`.

This is the API contract of `alwayson_scripts: {"tome": {"args": [...]}}`.

Positional form
    The args are the values of the components `ui()` returns, in `ARG_NAMES` order::

        enabled, ratio, max_downsample, sx, sy, use_rand, merge_attn, merge_crossattn, merge_mlp, seed,
        mode, matching, step_start, step_end, hr_mode, hr_ratio, hr_max_downsample, hr_sx, hr_sy

    (every `TomeConfig` field in `tome_core.field_specs()` order between `enabled` and `hr_mode`). img2img has no
    Hires fix pass group, so its args stop after `step_end` (`IMG2IMG_ARG_NAMES`). A shorter list keeps the
    defaults for the missing tail, as the WebUI does. Values may be given as their JSON types or as the strings
    the UI shows: `max_downsample` is "auto", 1, 2, 4 or 8; `seed` is an integer or -1/null for the fixed
    default; `hr_mode` is "same", "own" or "off" (or the labels "Same as first pass", "Own settings", "Off").

Dict form
    A single JSON object as the only arg::

        {"enabled": true, "ratio": 0.5, "sx": 2, "sy": 2, "max_downsample": "auto",
         "hires": "same" | "off" | {"ratio": 0.7, "sx": 2, "sy": 2, "max_downsample": "auto"},
         ...any other TomeConfig field by name}

    Missing fields take the `TomeConfig` defaults, `enabled` defaults to true (sending settings means "use
    them"), `hires` defaults to "same", and a missing key in the `hires` object takes the first pass's value.

Invalid input raises `TomeArgsError`, whose message names the argument and its allowed values. Nothing is
guessed: a value that is not valid for its field is an error, never clamped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tome_core import FieldSpec, TomeConfig, field_specs

#: The script's `title()`, which is also its API key: `alwayson_scripts: {"tome": ...}` (matched in any case).
TITLE = "ToMe"
#: Every TomeConfig field, in `field_specs()` order.
FIELD_NAMES: tuple[str, ...] = tuple(spec.name for spec in field_specs())
#: The fields the Hires fix pass may set on its own; the other fields follow the first pass.
HIRES_FIELDS: tuple[str, ...] = tuple(name for name in FIELD_NAMES if name in ("ratio", "max_downsample", "sx", "sy"))
#: Hires fix pass modes: merge as in the first pass, with own settings, or not at all.
HIRES_MODES: tuple[str, ...] = ("same", "own", "off")
HIRES_MODE_LABELS: Mapping[str, str] = MappingProxyType(
    {"same": "Same as first pass", "own": "Own settings", "off": "Off"}
)
#: The positional order of the script's args in txt2img (= the order of the components `ui()` returns).
ARG_NAMES: tuple[str, ...] = ("enabled", *FIELD_NAMES, "hr_mode", *(f"hr_{name}" for name in HIRES_FIELDS))
#: img2img has no Hires fix pass group: its args are this prefix of `ARG_NAMES`.
IMG2IMG_ARG_NAMES: tuple[str, ...] = ARG_NAMES[: ARG_NAMES.index("hr_mode")]
#: Keys of the dict form.
DICT_KEYS: tuple[str, ...] = ("enabled", *FIELD_NAMES, "hires")
#: The UI shows `seed=None` ("use the core's fixed default") as this number.
SEED_NONE = -1

_SPECS: Mapping[str, FieldSpec] = MappingProxyType({spec.name: spec for spec in field_specs()})


class TomeArgsError(ValueError):
    """Invalid script arguments. `str(error)` names the argument and its allowed values."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where} {message}")
        self.where = where


@dataclass(frozen=True)
class TomeJob:
    """What one generation does: the first-pass config and the Hires fix pass's.

    `first` may be a no-op config (ratio 0) so that only the hires pass merges; `hires` is None when the
    hires pass must not merge (`hires_mode == "off"`).
    """

    first: TomeConfig
    hires_mode: str
    hires: TomeConfig | None

    def config_for(self, is_hr_pass: bool) -> TomeConfig | None:
        """The config a pass runs with, or None when that pass must not merge."""
        config = self.hires if is_hr_pass else self.first
        return None if config is None or config.is_noop else config


# ---------------------------------------------------------------------------------------------- values


def spec(name: str) -> FieldSpec:
    """The `FieldSpec` of a TomeConfig field name."""
    return _SPECS[name]


def field_of(arg_name: str) -> str:
    """The TomeConfig field an arg name sets: "hr_ratio" -> "ratio"; "ratio" -> "ratio"."""
    return arg_name[3:] if arg_name.startswith("hr_") and arg_name != "hr_mode" else arg_name


def allowed(arg_name: str) -> str:
    """The allowed values of an arg, as error messages state them."""
    if arg_name == "enabled":
        return "true or false"
    if arg_name == "hr_mode":
        return "one of " + ", ".join(repr(m) for m in HIRES_MODES)
    text = spec(field_of(arg_name)).allowed()
    if field_of(arg_name) == "seed":
        text += f" ({SEED_NONE} means None)"
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


def coerce(arg_name: str, value: Any, where: str | None = None) -> Any:
    """Turn one raw arg (JSON value, UI value or infotext string) into its canonical value, or raise.

    Canonical values are what `TomeConfig` takes: bools, ints, floats, "auto", None for the default seed;
    `hr_mode` becomes "same"/"own"/"off".
    """
    where = where or arg_name
    try:
        if arg_name == "enabled":
            return _to_bool(value)
        if arg_name == "hr_mode":
            text = str(value).strip().lower() if isinstance(value, str) else None
            for mode, label in HIRES_MODE_LABELS.items():
                if text in (mode, label.lower()):
                    return mode
            raise ValueError(value)
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
        if field_of(arg_name) == "seed" and number == SEED_NONE:
            return None
        return s.check(number)
    except (TypeError, ValueError):
        raise _error(where, arg_name, value) from None


def ui_value(arg_name: str, value: Any) -> Any:
    """The value a UI component holds for a canonical value (the type of the component's default)."""
    if arg_name in ("enabled", "hr_mode"):
        return value
    s = spec(field_of(arg_name))
    if s.optional and value is None:
        return SEED_NONE
    if s.choices is not None:
        return str(value)
    if s.kind is float:
        return float(value)
    return value


def defaults() -> dict[str, Any]:
    """The canonical default of every arg: what `ui()` starts with and what a short args list keeps."""
    values: dict[str, Any] = {"enabled": False}
    values.update({name: spec(name).default for name in FIELD_NAMES})
    values["hr_mode"] = "same"
    values.update({f"hr_{name}": spec(name).default for name in HIRES_FIELDS})
    return values


# ---------------------------------------------------------------------------------------------- parsing


def _from_positional(args: Sequence[Any]) -> dict[str, Any]:
    if len(args) > len(ARG_NAMES):
        raise TomeArgsError("args", f"has {len(args)} values, at most {len(ARG_NAMES)} allowed: {', '.join(ARG_NAMES)}")
    named = defaults()
    named.update(zip(ARG_NAMES, args))
    return named


def _from_dict(values: Mapping[Any, Any]) -> dict[str, Any]:
    unknown = [key for key in values if key not in DICT_KEYS]
    if unknown:
        raise TomeArgsError(
            "args[0]", f"has unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(DICT_KEYS)}"
        )
    named = defaults()
    named["enabled"] = True
    named.update({key: value for key, value in values.items() if key != "hires"})
    hires = values.get("hires")
    if hires is None or isinstance(hires, str):
        mode = coerce("hr_mode", "same" if hires is None else hires, "hires")
        if mode == "own":
            raise TomeArgsError("hires", "must be 'same', 'off' or an object of hires settings, got 'own'")
        named["hr_mode"] = mode
        hires = {}
    elif isinstance(hires, Mapping):
        unknown = [key for key in hires if key not in HIRES_FIELDS]
        if unknown:
            raise TomeArgsError(
                "hires", f"has unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(HIRES_FIELDS)}"
            )
        named["hr_mode"] = "own"
    else:
        raise TomeArgsError("hires", f"must be 'same', 'off' or an object of hires settings, got {hires!r}")
    for name in HIRES_FIELDS:
        named[f"hr_{name}"] = hires.get(name, named[name])
    return named


def _where(name: str, from_dict: bool) -> str:
    """How an error names an arg: "ratio (args[1])" for the positional form, "hires.ratio" for the dict form."""
    if not from_dict:
        return f"{name} (args[{ARG_NAMES.index(name)}])"
    if name == "hr_mode":
        return "hires"
    return f"hires.{field_of(name)}" if name.startswith("hr_") else name


def _apply_overrides(named: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Lay XYZ-plot values (`p.tome_xyz`) over the args. Any value axis implies enabled unless one says otherwise."""
    for name, value in overrides.items():
        if name == "hr_ratio" and coerce("hr_mode", named["hr_mode"], "hr_mode") != "own":
            named.update({f"hr_{f}": named[f] for f in HIRES_FIELDS})
            named["hr_mode"] = "own"
        named[name] = value
    if overrides and "enabled" not in overrides:
        named["enabled"] = True


def resolve(
    args: Sequence[Any],
    overrides: Mapping[str, Any] | None = None,
    *,
    is_img2img: bool = False,
    strict: bool = False,
) -> TomeJob | None:
    """The job the script args ask for, or None when ToMe is off.

    `args` is the positional list or a one-element list holding the dict form. `overrides` (from the XYZ plot)
    are laid over it by arg name. When ToMe is off, the other args are not checked unless `strict` (the API
    check refuses any invalid request). Raises `TomeArgsError`.
    """
    from_dict = bool(args) and isinstance(args[0], Mapping)
    if from_dict and len(args) > 1 and strict:
        raise TomeArgsError("args", f"must hold the dict alone when args[0] is a dict, got {len(args)} values")
    named = _from_dict(args[0]) if from_dict else _from_positional(args)
    if overrides:
        _apply_overrides(named, overrides)
    enabled = coerce("enabled", named["enabled"], _where("enabled", from_dict))
    if not enabled and not strict:
        return None
    values = {name: coerce(name, named[name], _where(name, from_dict)) for name in ARG_NAMES}
    first = _config(values, FIELD_NAMES, from_dict)
    hires: TomeConfig | None = None
    if is_img2img or values["hr_mode"] == "same":
        hires = first
    elif values["hr_mode"] == "own":
        hires = _config({**values, **{f: values[f"hr_{f}"] for f in HIRES_FIELDS}}, FIELD_NAMES, from_dict, "hires ")
    return TomeJob(first=first, hires_mode=values["hr_mode"], hires=hires) if enabled else None


def _config(values: Mapping[str, Any], names: Sequence[str], from_dict: bool, which: str = "") -> TomeConfig:
    try:
        return TomeConfig(**{name: values[name] for name in names})
    except (TypeError, ValueError) as exc:  # a rule across fields (step_start < step_end); single values are checked
        raise TomeArgsError(f"{which}settings".strip(), f"are invalid: {exc}") from None


def validate_request_args(args: Any) -> None:
    """The API check: raise `TomeArgsError` unless `args` (from a request body) is valid for either tab."""
    if not isinstance(args, list):
        raise TomeArgsError("args", f"must be a list, got {type(args).__name__}")
    resolve(args, strict=True)
