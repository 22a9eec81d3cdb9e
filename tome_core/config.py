"""The one description of every ToMe parameter.

`TomeConfig` is frozen and validated on construction. Everything else (the WebUI controls, API parsing,
infotext keys, XYZ axes, the benchmark's options) reads the field table from `field_specs()` instead of
restating names, defaults or ranges.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

MaxDownsample = Literal["auto"] | int

#: The downsampling levels a Stable Diffusion UNet has (1 = full latent resolution).
LEVELS: tuple[int, ...] = (1, 2, 4, 8)


@dataclass(frozen=True)
class FieldSpec:
    """What a caller may put in one `TomeConfig` field."""

    name: str
    label: str
    help: str
    kind: type  # float, int, bool or str; a field with choices may mix "auto" and ints
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    choices: tuple[Any, ...] | None = None
    optional: bool = False  # None is allowed
    advanced: bool = False  # shown folded away in UIs

    def allowed(self) -> str:
        """A human-readable statement of the allowed values, used in every error message."""
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind is bool:
            text = "true or false"
        elif self.minimum is not None and self.maximum is not None:
            word = "an integer" if self.kind is int else "a number"
            text = f"{word} in [{_num(self.minimum)}, {_num(self.maximum)}]"
        else:
            text = "an integer" if self.kind is int else "a number"
        return text + (" or None" if self.optional else "")

    def check(self, value: Any) -> Any:
        """`value` normalised for this field (2.0 -> 2 for an int field); TypeError/ValueError naming the field."""
        return _check(self, value)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _spec(kind: type, label: str, help: str, **kw: Any) -> Any:
    """Declare a dataclass field whose metadata carries its `FieldSpec` (name filled in later)."""
    default = kw.pop("default")
    return field(default=default, metadata={"spec": dict(kind=kind, label=label, help=help, default=default, **kw)})


@dataclass(frozen=True)
class TomeConfig:
    """Every ToMe parameter, its default and allowed range. Invalid values raise on construction.

    Field names and defaults follow tomesd's `apply_patch` keywords where tomesd has them, so
    `tome_core.apply_patch(model, ratio=0.5, sx=2, ...)` is a drop-in call.
    """

    ratio: float = _spec(
        float,
        "Ratio",
        "Share of tokens merged away in each patched block. Higher is faster and less faithful. At most"
        " 1 - 1/(sx*sy), what the strides' cells leave to merge (0.75 with 2x2): a higher ratio is refused, naming"
        " the maximum.",
        default=0.5,
        minimum=0.0,
        maximum=0.95,
        step=0.05,
    )
    max_downsample: MaxDownsample = _spec(
        int,
        "Max downsample",
        "Merge in blocks at most this many times downsampled (1, 2, 4, 8). 'auto' = the first level with attention"
        " (1 on SD1/SD2), plus deeper levels holding more transformer blocks (2 and 4 on SDXL). Deeper: faster,"
        " less detail.",
        default="auto",
        choices=("auto", *LEVELS),
    )
    sx: int = _spec(
        int,
        "Stride x",
        "Width of the cell holding one destination token (in 'kv' mode: the cell that keeps one key/value)."
        " Larger strides allow higher ratios, at most 1 - 1/(sx*sy), but match coarser; a ratio above that, or 1x1"
        " cells with a ratio above 0 (nothing to merge), is refused.",
        default=2,
        minimum=1,
        maximum=8,
        step=1,
    )
    sy: int = _spec(
        int,
        "Stride y",
        "Height of the cell holding one destination token (in 'kv' mode: the cell that keeps one key/value)."
        " Larger strides allow higher ratios, at most 1 - 1/(sx*sy), but match coarser; a ratio above that, or 1x1"
        " cells with a ratio above 0 (nothing to merge), is refused.",
        default=2,
        minimum=1,
        maximum=8,
        step=1,
    )
    use_rand: bool = _spec(
        bool,
        "Random partitions",
        "Pick each cell's destination at random (seeded) instead of its top-left token; avoids grid artifacts.",
        default=True,
        advanced=True,
    )
    merge_attn: bool = _spec(
        bool,
        "Merge self-attention",
        "Merge tokens for self-attention: most of the speed-up, little fidelity cost.",
        default=True,
        advanced=True,
    )
    merge_crossattn: bool = _spec(
        bool,
        "Merge cross-attention",
        "Also merge for cross-attention: a little faster, follows the prompt less closely.",
        default=False,
        advanced=True,
    )
    merge_mlp: bool = _spec(
        bool,
        "Merge MLP",
        "Also merge for the feed-forward layer: faster, clearly less detail.",
        default=False,
        advanced=True,
    )
    seed: int | None = _spec(
        int,
        "Seed",
        "Seed of the random partitions' hash (None: a fixed default). Changes which tokens merge,"
        " so the image varies slightly per seed; the WebUI's noise RNG is never touched.",
        default=None,
        minimum=0,
        maximum=2**32 - 1,
        step=1,
        optional=True,
        advanced=True,
    )

    mode: str = _spec(
        str,
        "Mode",
        "'merge': ToMe, merge similar tokens and copy results back. 'kv': keep every query, attend to keys/values"
        " subsampled, one per sx*sy cell (ToDo): no matching cost, keeps more detail per token, saves less at low"
        " resolution. In 'kv' mode self-attention pools; cross-attention and the MLP still merge (at the ratio and"
        " MLP ratio) when turned on.",
        default="merge",
        choices=("merge", "kv"),
    )
    matching: str = _spec(
        str,
        "Matching",
        "'local': each token merges only into the most similar destination of its own band of cells (a row of"
        " cells, sy token rows), and each band keeps the same share of its tokens: cheap, nearby matches, one batched"
        " matrix product per merge, and a block whose every module merges at one ratio merges whole. 'global': into"
        " the most similar destination anywhere, as tomesd does (costly at high resolution), module by module.",
        default="local",
        choices=("local", "global"),
        advanced=True,
    )
    step_start: float = _spec(
        float,
        "Start at step",
        "Fraction of the sampling steps after which merging starts (0 = from the first step). Later: the layout"
        " steps run unmerged, more faithful composition, less speed-up.",
        default=0.0,
        minimum=0.0,
        maximum=1.0,
        step=0.05,
        advanced=True,
    )
    step_end: float = _spec(
        float,
        "End at step",
        "Fraction of the sampling steps after which merging stops; lower keeps the last steps' fine detail.",
        default=1.0,
        minimum=0.0,
        maximum=1.0,
        step=0.05,
        advanced=True,
    )

    mlp_ratio: float | None = _spec(
        float,
        "MLP ratio",
        "Share of tokens merged for the feed-forward layer when 'Merge MLP' is on (None: the ratio). The"
        " feed-forward is most of an SDXL step: merging it at a lower ratio than attention keeps more detail. At"
        " most 1 - 1/(sx*sy), as the ratio: a higher one is refused.",
        default=None,
        minimum=0.0,
        maximum=0.95,
        step=0.05,
        optional=True,
        advanced=True,
    )
    share_plan: bool = _spec(
        bool,
        "One plan per stack",
        "Match tokens once per transformer stack and UNet call (at the stack's first block; the single-block stacks"
        " of a level, as in SD1/SD2, share one match per level) and merge every block of it with that plan: a stack"
        " of blocks merged whole (SDXL runs 10 per stack) then stays merged from its first block to its last, one"
        " merge and one unmerge for the stack. Far fewer GPU kernels, slightly less faithful.",
        default=False,
        advanced=True,
    )

    mlp_min_downsample: int = _spec(
        int,
        "MLP from downsample",
        "Merge for the feed-forward only in blocks at least this many times downsampled (1: wherever merging"
        " runs). SDXL's level-2 blocks hold the finest detail: merging their feed-forward costs much fidelity and"
        " saves little time, so the SDXL presets start at 4.",
        default=1,
        choices=LEVELS,
        advanced=True,
    )

    min_downsample: int = _spec(
        int,
        "Merge from downsample",
        "Merge only in blocks at least this many times downsampled (1: from the first level max downsample"
        " selects). With 'Pool keys/values elsewhere', the shallower levels pool instead.",
        default=1,
        choices=LEVELS,
        advanced=True,
    )
    pool_kv: bool = _spec(
        bool,
        "Pool keys/values elsewhere",
        "In the levels with transformer blocks that do not merge (outside 'Merge from downsample' to 'Max"
        " downsample'), self-attention attends to keys/values subsampled, one per sx*sy cell, as in 'kv' mode: one small"
        " kernel per block, for speed where merging would cost more fidelity (or more GPU launches) than it saves.",
        default=False,
        advanced=True,
    )

    st: int = _spec(
        int,
        "Stride t",
        "Frames in the cell that keeps one key/value, for video models (Wan): 2 subsamples keys/values over pairs"
        " of latent frames too. Images have one frame: 1 keeps every frame.",
        default=1,
        minimum=1,
        maximum=4,
        step=1,
        advanced=True,
    )
    block_start: float = _spec(
        float,
        "Start at block",
        "Fraction of the model's transformer blocks, in forward order, that run unreduced before reduction starts"
        " (0 = from the first block). Early blocks lay out the image: reducing there costs most fidelity (AsymRnR,"
        " arXiv 2412.11706).",
        default=0.0,
        minimum=0.0,
        maximum=0.95,
        step=0.05,
        advanced=True,
    )
    block_end: float = _spec(
        float,
        "End at block",
        "Fraction of the model's transformer blocks after which reduction stops (1 = to the last block).",
        default=1.0,
        minimum=0.05,
        maximum=1.0,
        step=0.05,
        advanced=True,
    )

    def __post_init__(self) -> None:
        for spec in field_specs():
            object.__setattr__(self, spec.name, _check(spec, getattr(self, spec.name)))
        if self.step_start >= self.step_end:
            raise ValueError(
                f"TomeConfig.step_start must be less than step_end, got step_start={self.step_start},"
                f" step_end={self.step_end}"
            )
        if self.block_start >= self.block_end:
            raise ValueError(
                f"TomeConfig.block_start must be less than block_end, got block_start={self.block_start},"
                f" block_end={self.block_end}"
            )
        if self.max_downsample != "auto" and self.min_downsample > int(self.max_downsample):
            raise ValueError(
                f"TomeConfig.min_downsample={self.min_downsample} is above max_downsample={self.max_downsample}:"
                " no level would merge; lower min_downsample or raise max_downsample"
            )
        self._check_strides()

    def _check_strides(self) -> None:
        """The strides' rule: a cell of sx*sy tokens keeps one of them, so a ratio the config merges with may be at
        most 1 - 1/(sx*sy) (`max_ratio`): 1x1 cells leave nothing to merge, and nothing to pool in kv mode. Any
        ratio above that is refused, naming the fields and the maximum, never capped: the value a user sees is the
        value that runs. A ratio the config does not use (`ratios_by_kind`) is not checked."""
        where = f"strides sx={self.sx}, sy={self.sy}"
        if self.sx * self.sy == 1 and self.mode == "kv" and self.merge_attn:
            raise ValueError(
                f"TomeConfig.sx={self.sx}, sy={self.sy}: mode 'kv' pools self-attention's keys/values over sx*sy"
                " cells, and cells of one token leave nothing to pool; raise sx or sy (or turn merge_attn off)"
            )
        used: dict[str, tuple[float, str]] = {}  # field -> (its value, what uses it where that is not plain)
        if self.merge_crossattn or (self.merge_attn and self.mode == "merge"):
            used["ratio"] = (self.ratio, "")
        if self.merge_mlp and self.mlp_ratio is not None:
            used["mlp_ratio"] = (self.mlp_ratio, "")
        elif self.merge_mlp:
            used.setdefault("ratio", (self.ratio, " (the feed-forward's ratio while mlp_ratio is None)"))
        for name, (ratio, role) in used.items():
            if ratio <= self.max_ratio + 1e-9:
                continue
            if self.sx * self.sy == 1:
                raise ValueError(
                    f"TomeConfig.{name}={ratio}{role} with {where} leaves nothing to merge: a cell of one token"
                    f" keeps it (at most 1 - 1/(sx*sy) = 0); raise sx or sy, or set {name} to 0"
                )
            raise ValueError(
                f"TomeConfig.{name}={ratio}{role} is more than {where} can merge: at most 1 - 1/(sx*sy) ="
                f" {self.max_ratio:.4g}; lower {name} or raise sx or sy"
            )

    # ------------------------------------------------------------------ derived values

    @property
    def max_ratio(self) -> float:
        """The largest share of tokens the strides let merge: 1 - 1/(sx*sy)."""
        return 1.0 - 1.0 / (self.sx * self.sy)

    @property
    def ratios_by_kind(self) -> dict[str, float]:
        """The ratio of each kind of merged module in use: "attn" (self/cross) and "mlp" (`mlp_ratio`, else the
        ratio); what each block merges where is `tome_core.plan`'s."""
        out = {}
        # In kv mode self-attention pools its keys/values instead of merging: no ratio of its own.
        if self.merge_crossattn or (self.merge_attn and self.mode == "merge"):
            out["attn"] = self.ratio
        if self.merge_mlp:
            out["mlp"] = self.ratio if self.mlp_ratio is None else self.mlp_ratio
        return out

    @property
    def is_noop(self) -> bool:
        """True when the patch cannot change any output."""
        if self.sx * self.sy == 1:
            return True
        pools = (self.mode == "kv" and self.merge_attn) or self.pool_kv
        return not pools and all(ratio <= 0.0 for ratio in self.ratios_by_kind.values())

    def block_selected(self, index: int, count: int) -> bool:
        """Whether the `index`-th of `count` transformer blocks (forward order) lies in the block window."""
        return self.block_start <= index / count < self.block_end

    def active_at(self, fraction: float) -> bool:
        """Whether merging runs at this point of sampling (fraction of steps done, in [0, 1])."""
        return self.step_start <= fraction < self.step_end or (self.step_end >= 1.0 and fraction >= 1.0)

    # ------------------------------------------------------------------ conversions

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, base: TomeConfig | None = None) -> TomeConfig:
        """Build from a mapping of field names; unknown names raise `ValueError` listing the known ones."""
        if not isinstance(values, Mapping):
            raise TypeError(f"TomeConfig values must be a mapping of field names, got {type(values).__name__}")
        known = {s.name for s in field_specs()}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown TomeConfig field(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}"
            )
        start = base.to_dict() if base is not None else {}
        start.update(values)
        return cls(**start)

    def replace(self, **changes: Any) -> TomeConfig:
        return self.from_dict(changes, base=self)


def auto_levels(blocks_per_level: Mapping[int, int]) -> frozenset[int]:
    """The levels `max_downsample="auto"` merges, given how many transformer blocks each level holds.

    The first level with attention (1 on SD1/SD2, 2 on SDXL, where tomesd's default of 1 merges nothing), plus
    any deeper level holding more transformer blocks than it: SDXL keeps 60 of its 70 blocks at level 4, so
    merging only level 2 would leave most of its attention untouched.
    """
    levels = sorted(level for level, count in blocks_per_level.items() if count > 0)
    if not levels:
        return frozenset()
    first = levels[0]
    return frozenset([first, *(lv for lv in levels[1:] if blocks_per_level[lv] > blocks_per_level[first])])


def field_specs() -> tuple[FieldSpec, ...]:
    """The field table, in declaration order."""
    return tuple(FieldSpec(name=f.name, **f.metadata["spec"]) for f in dataclasses.fields(TomeConfig))


def field_spec(name: str) -> FieldSpec:
    for spec in field_specs():
        if spec.name == name:
            return spec
    raise KeyError(name)


def _fail(spec: FieldSpec, value: Any, exc: type[Exception]) -> Exception:
    return exc(f"TomeConfig.{spec.name} must be {spec.allowed()}, got {value!r}")


def _check(spec: FieldSpec, value: Any) -> Any:
    """Validate and normalise one field value; raise TypeError/ValueError naming the field."""
    if value is None:
        if spec.optional:
            return None
        raise _fail(spec, value, TypeError)
    if spec.kind is bool:
        if isinstance(value, bool):
            return value
        raise _fail(spec, value, TypeError)
    if spec.choices is not None:
        if spec.kind is str and not isinstance(value, str):
            raise _fail(spec, value, TypeError)
        if isinstance(value, str):
            if value in spec.choices:
                return value
            raise _fail(spec, value, ValueError)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(spec, value, TypeError)
        if float(value).is_integer() and int(value) in spec.choices:
            return int(value)
        raise _fail(spec, value, ValueError)
    if spec.kind is str:
        if isinstance(value, str):
            return value
        raise _fail(spec, value, TypeError)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(spec, value, TypeError)
    if spec.kind is int:
        if not float(value).is_integer():
            raise _fail(spec, value, ValueError)
        value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise _fail(spec, value, ValueError)
    if spec.minimum is not None and value < spec.minimum:
        raise _fail(spec, value, ValueError)
    if spec.maximum is not None and value > spec.maximum:
        raise _fail(spec, value, ValueError)
    return value
