"""How much faster each preset makes one model call, per model family and image size: the table users' words read.

The lab writes `speed_table.json` next to this module (`python -m tome_bench estimate --write`; a GPU run's
measured rows replace estimated ones, `gpu-job --write`): per family, preset and size (width, height, frames) the
unpatched call's GPU time over the patched one's, and where each figure comes from (a GPU, estimated or measured).
The library carries no estimator: it reads the table, and between two sizes of it interpolates in the logarithm of
the token count (what a preset's gain follows).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

TABLE = Path(__file__).with_name("speed_table.json")

Size = tuple[int, int, int]  # width, height (pixels), frames


@dataclass(frozen=True)
class Source:
    """Where figures come from: "NVIDIA H200", measured or estimated, and how."""

    device: str
    measured: bool
    what: str


@dataclass(frozen=True)
class Speed:
    """One preset's speed-up at one size: the unpatched call's GPU time over the patched one's."""

    speedup: float
    size: Size  # the size asked for
    source: Source
    bound: str = ""  # "" inside the table's sizes; "at most" below its smallest, "at least" above its largest

    @property
    def exact(self) -> bool:
        return not self.bound


@dataclass(frozen=True)
class _Table:
    sources: Mapping[str, Source]
    rows: Mapping[tuple[str, str], tuple[tuple[Size, float, str], ...]]  # (family, preset) -> sorted by tokens


@cache
def _table(path: Path = TABLE) -> _Table:
    """The table, read once (it changes only when the lab rewrites the file); empty when there is none."""
    if not path.exists():
        return _Table(MappingProxyType({}), MappingProxyType({}))
    data = json.loads(path.read_text(encoding="utf-8"))
    sources = {name: Source(s["device"], bool(s["measured"]), s.get("what", "")) for name, s in data["sources"].items()}
    rows: dict[tuple[str, str], list[tuple[Size, float, str]]] = {}
    for row in data["rows"]:
        size = (int(row["width"]), int(row["height"]), int(row.get("frames", 1)))
        rows.setdefault((row["family"], row["preset"]), []).append((size, float(row["speedup"]), row["source"]))
    ordered = {key: tuple(sorted(found, key=lambda r: _tokens(r[0]))) for key, found in rows.items()}
    return _Table(MappingProxyType(sources), MappingProxyType(ordered))


def _tokens(size: Size) -> int:
    return size[0] * size[1] * size[2]


def sizes(family: str, preset: str) -> tuple[Size, ...]:
    """The sizes the table holds for a preset on a family, smallest first."""
    return tuple(size for size, _, _ in _table().rows.get((family, preset), ()))


def speed(family: str, preset: str, width: int, height: int, frames: int = 1) -> Speed | None:
    """The preset's speed-up at width x height (x frames) on a family: the table's figure at that size, else
    interpolated in the log of the token count between the two sizes around it, else the nearest size's
    figure, marked as a bound ("at most" below the smallest size: merging gains less on fewer tokens). None when the
    table has no row for the family and preset."""
    table = _table()
    rows = table.rows.get((family, preset), ())
    if not rows:
        return None
    size: Size = (width, height, frames)
    tokens = math.log(_tokens(size))
    below = [r for r in rows if math.log(_tokens(r[0])) <= tokens + 1e-9]
    above = [r for r in rows if math.log(_tokens(r[0])) >= tokens - 1e-9]
    if not below:
        return Speed(rows[0][1], size, table.sources[rows[0][2]], "at most")
    if not above:
        return Speed(rows[-1][1], size, table.sources[rows[-1][2]], "at least")
    low, high = below[-1], above[0]
    exact = next((r for r in rows if r[0] == size), None)
    if exact is not None:
        return Speed(exact[1], size, table.sources[exact[2]])
    a, b = math.log(_tokens(low[0])), math.log(_tokens(high[0]))
    share = 0.0 if b == a else (tokens - a) / (b - a)
    value = low[1] + share * (high[1] - low[1])
    # An interpolated figure is as measured as the less measured of its two ends.
    source = table.sources[low[2]] if not table.sources[low[2]].measured else table.sources[high[2]]
    return Speed(round(value, 3), size, source)
