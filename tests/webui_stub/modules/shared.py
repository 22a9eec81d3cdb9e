"""Like modules/shared.py: `opts` keeps settings in `opts.data` (only those saved or set, as in config.json)."""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "token_merging_ratio": 0.0,
    "token_merging_ratio_hr": 0.0,
    "token_merging_ratio_img2img": 0.0,
}


class Options:
    def __init__(self) -> None:
        object.__setattr__(self, "data", {})

    def __getattr__(self, key: str) -> Any:
        data = object.__getattribute__(self, "data")
        if key in data:
            return data[key]
        if key in DEFAULTS:
            return DEFAULTS[key]
        raise AttributeError(key)

    def __setattr__(self, key: str, value: Any) -> None:
        self.data[key] = value

    def set(self, key: str, value: Any, is_api: bool = False, run_callbacks: bool = True) -> bool:
        self.data[key] = value
        return True

    def get_default(self, key: str) -> Any:
        return DEFAULTS.get(key)


opts = Options()
