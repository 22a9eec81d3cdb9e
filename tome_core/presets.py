"""Named speed settings: one choice for speed against fidelity, resolved per model family.

Per family (SD1.x/SD2.x "sd", SDXL "sdxl", and the diffusion transformers of `tome_core.families`: "flux", "wan",
...) the presets form a ladder: from Quality to Fastest each takes less GPU time than the one before. Each is held to a
reference users know (`REFERENCES`: on UNets Quality to ToDo's default, the others to tomesd's): `Preset.fidelity`
records how much it changes the image beside that reference, measured on a model built to attend like a trained one
(docs/fidelity.md), and among the presets held to one reference the faster changes the image more. Their speed-ups
per size are in `tome_core.figures` (the table the lab writes). `Preset.config(family)` is the `TomeConfig` that
runs; `apply_patch(model, preset="fast")` picks the family from the model. A Hires fix pass runs the same values,
resolved for the model that runs it: its larger latent already makes each preset gain more there. What users read
of them is `tome_core.words`'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tome_core.config import TomeConfig
from tome_core.families import DIT_FAMILIES

#: The UNet families a preset is resolved for (`tome_core.model_family`): what an A1111-style WebUI runs.
FAMILIES: tuple[str, ...] = ("sd", "sdxl")
#: Every family a preset is resolved for: the UNets' and the diffusion transformers'.
ALL_FAMILIES: tuple[str, ...] = (*FAMILIES, *(f.name for f in DIT_FAMILIES))


def _frozen(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(values))


#: The references a preset is held to, in users' words (`Fidelity.reference`): what users know from tomesd (and the
#: WebUIs' built-in token merging) and from ToDo, each at the first level with attention of the model (level 1 on
#: SD1/SD2, level 2 on SDXL, where tomesd's own default merges nothing).
#: On diffusion transformers, references a DiT user can reproduce: the UNet recipe ported as it is, and a step saving.
REFERENCES: Mapping[str, str] = MappingProxyType(
    {
        "tomesd's default": "tomesd's default (ratio 0.5, 2×2 cells, self-attention, the first level with attention)",
        "ToDo's default": "ToDo's default (keys/values from the tokens subsampled 2×2, the first level with attention)",
        "keys/values 2×2 in every block": "keys/values subsampled 2×2 in every block (ToDo ported to a diffusion"
        " transformer as it is)",
        "dropping steps for the same time": "the same generation with as many fewer steps as save no more time than"
        " the preset",
    }
)


@dataclass(frozen=True)
class Fidelity:
    """How much a preset changes the image, beside the reference users know that it is held to.

    `change` is the relative change of one UNet call's output under the preset over that under the reference
    (`REFERENCES`), side by side: below 1 the preset changes the image less. `generation`, where measured, is the
    same ratio for the final latent of a whole generation from white noise: errors of every step add up there, and
    the two can rank a preset differently against its reference. Measured on a stand-in model, the real architecture
    with random weights whose attention behaves like a trained model's (tome_bench.standin, fitted to published
    real-weight relations of one call): a random-weight UNet attends uniformly, and there pooling keys/values or
    merging deep levels looks free. `setting` names the runs (docs/fidelity.md).
    """

    reference: str
    change: float | None  # None: a step saving, which has no one-call figure (`generation` alone)
    setting: str
    generation: float | None = None
    source: str = ""  # where a diffusion transformer's figure comes from, in users' words (`TRAINED_WORDS`)


@dataclass(frozen=True)
class Preset:
    """A named setting: `TomeConfig` fields per model family, and what each was measured at."""

    name: str
    label: str
    help: str
    families: Mapping[str, Mapping[str, Any]]  # family -> TomeConfig fields (others keep their defaults)
    fidelity: Mapping[str, Fidelity]  # family -> its change beside its reference

    def config(self, family: str) -> TomeConfig:
        """The config this preset runs with on a model of `family` (`ALL_FAMILIES`)."""
        if family not in self.families:
            raise ValueError(f"model family must be one of {', '.join(map(repr, ALL_FAMILIES))}, got {family!r}")
        return TomeConfig(**self.families[family])


# Chosen (issue 38) on the stand-ins, beside tomesd's and ToDo's defaults run as their own code runs them: Quality
# changes the image no more than ToDo's default, Balanced no more than tomesd's default, Fast and Fastest more, each
# faster than the one below; each saves at least the GPU work of its reference (tome_bench.gpu_estimate), adds at
# most 10% kernel-launching operations (tests/test_gpu_budget.py), and the ladder rises per step (docs/fidelity.md).
# On models that attend like trained ones the first level with attention carries the detail and deeper levels cost
# more change per time saved than subsampling keys/values there; what pays on a GPU is few, large kernels:
# subsampling is one copy per block, a block merged whole one merge and one unmerge. Chosen on one call (the measure
# of the published relations the stand-ins are fitted to); over a whole generation from white noise tomesd's and
# ToDo's defaults change the image about as much, and every preset but Quality more than tomesd's (`Fidelity`).
#
# SD1/SD2: Quality and Balanced subsample self-attention's keys/values at level 1 only (2x2: ToDo's default; 4x4).
# Fast and Fastest also merge the level-2 and level-4 blocks whole (0.55 and 0.95 of the tokens).
# SDXL: every preset subsamples keys/values 2x2 at level 2; Balanced to Fastest also merge the sixty level-4 blocks (six
# stacks of ten) whole, one plan, one merge and one unmerge per stack.
_WHOLE = {"merge_crossattn": True, "merge_mlp": True, "share_plan": True, "pool_kv": True}
_SD_DEEP = {**_WHOLE, "min_downsample": 2, "max_downsample": 4}
_SDXL_DEEP = {**_WHOLE, "min_downsample": 4, "max_downsample": 4}

_FIDELITY_SD = (
    "an SD1.5 built to attend like a trained one (tome_bench.standin), 512 px: one UNet call at t=500 from a natural-spectrum start; a whole generation: 8 DPM++ 2M"
    " steps from white noise (2026-11-27)"
)
_FIDELITY_SDXL = (
    "an SDXL built to attend like a trained one (tome_bench.standin), 1024 px: one UNet call at t=500 from a natural-spectrum start; a whole generation: 4 DPM++ 2M"
    " steps from white noise (2026-11-27)"
)
_TODO, _TOMESD = "ToDo's default", "tomesd's default"
_PORT, _STEPS = "keys/values 2×2 in every block", "dropping steps for the same time"
#: Where a diffusion transformer's figures come from: the one model here that learned its attention (its profile beside
#: the papers': docs/dit.md). The tied stand-ins' figures of 2026-11-29 (4-10x a trained model's share on a query's
#: own token) are withdrawn; the stand-ins re-fitted to the trained profile (tome_bench.refit) match its attention
#: shares but not how its generations respond: on Flux.1's class they put Balanced at 1.0x the step saving where the
#: trained DiT gives 4.2x, and rank the step windows against the naive port the other way round
#: (docs/runs/2026-12-06-presets-redecided). No family is given their figures: docs/dit.md keeps them as the record.
_FIDELITY_TRAINED = (
    "a Flux.1-class DiT trained here (tome_bench.trained_dit: 2.3 M parameters, 2 double + 4 single blocks, 32×32"
    " tokens of 8×8 px at a 1024 px scene's scale): 12 flow-matching Euler steps from white noise, 4 samples (2026-12-06)"
)
_FIDELITY_TRAINED_VIDEO = (
    "a Wan-class video DiT trained here (tome_bench.trained_video: 2.1 M parameters, 6 blocks, 5 latent frames of"
    " 16×16 tokens, camera moves over photographs at a scene's scale): 12 flow-matching Euler steps from white noise,"
    " 4 samples (2026-12-06)"
)
#: What users read of where a DiT figure comes from (`tome_core.words.change_words`).
TRAINED_WORDS = "on a DiT trained here, 12 steps"
TRAINED_VIDEO_WORDS = "on a video DiT trained here, 12 steps"
#: The families measured on a model trained here (its class is theirs): the record, and its words.
_TRAINED: Mapping[str, tuple[str, str]] = MappingProxyType(
    {"flux": (_FIDELITY_TRAINED, TRAINED_WORDS), "wan": (_FIDELITY_TRAINED_VIDEO, TRAINED_VIDEO_WORDS)}
)


def _fidelity(
    reference: str, sd: tuple[float, float | None], sdxl: tuple[float, float | None], **dits: tuple[Any, ...]
) -> Mapping[str, Fidelity]:
    """(one call, a whole generation) per UNet family; per diffusion transformer measured on the trained DiT (`dits`:
    family -> (reference, a whole generation))."""
    held = {
        "sd": Fidelity(reference, sd[0], _FIDELITY_SD, sd[1]),
        "sdxl": Fidelity(reference, sdxl[0], _FIDELITY_SDXL, sdxl[1]),
    }
    for family, (held_to, generation) in dits.items():
        assert family in _TRAINED, family  # no figure from attention unlike a trained model's
        record, words = _TRAINED[family]
        held[family] = Fidelity(held_to, None, record, generation, words)
    return _frozen(held)


def _kv(cells: int, block_start: float, frames: int = 1, rows: int | None = None) -> Mapping[str, Any]:
    """Keys/values subsampled over cells x cells tokens (`rows` rows where not `cells`; and `frames` frames) from
    `block_start` of the depth on."""
    sy = cells if rows is None else rows
    return _frozen({"mode": "kv", "sx": cells, "sy": sy, "st": frames, "block_start": block_start})


def _late(fields: Mapping[str, Any], step_start: float) -> Mapping[str, Any]:
    """`fields` run from `step_start` of the steps on (the steps before run the model as it is)."""
    return _frozen({**fields, "step_start": step_start})


#: Flux.1's merged setting: the last blocks (the single-stream blocks from three quarters of the depth) run on merged
#: generated tokens, one per 2x2 cell, each token merged into the most similar destination of its band; keys/values
#: subsampled 2x2 in the other blocks.
_FLUX_MERGED = _frozen({"mode": "merge", "ratio": 0.75, "sx": 2, "sy": 2, "block_start": 0.75, "pool_kv": True})

# Diffusion transformers keep every text and reference token; the generated tokens' keys/values are subsampled, every
# query kept (AsymRnR, arXiv 2412.11706: on DiTs reducing keys/values is far safer than reducing queries), and each
# query also attends to its own key, the kept keys weighing as the cells they stand for
# (tome_core.dit.AttentionHook.attend). Which token of each cell is kept changes from step to step
# (tome_core.dit.draw_slot).
#: Per family, Quality, Balanced, Fast and Fastest, re-decided (issue 57) on the Flux.1-class DiT trained here
#: (tome_bench.trained_dit) and the re-fitted stand-ins (tome_bench.refit), whose attention falls off with distance as
#: trained DiTs' does (docs/dit.md): there a generation changes least per time saved when the reduction runs in the
#: last steps only (the first steps lay the image out), in every block, with small cells; the ladder widens the step
#: window. On the trained DiT, Flux.1's merged setting in the last steps changed a generation least for its time
#: (docs/runs/2026-12-06-presets-redecided). Launches are priced as host time against the call's GPU work
#: (tome_bench.gpu_estimate.HIDDEN), which hides them at every size in the table: every block reduces. No setting
#: tried stays within the change of dropping steps for the same time on the trained DiT (the words say by how much).
_DIT_IMAGE = (_late(_kv(2, 0.0), 0.75), _late(_kv(2, 0.0), 0.5), _late(_kv(3, 0.0), 0.5), _late(_kv(3, 0.0), 0.25))
#: Wan, re-decided on the Wan-class video DiT trained here (tome_bench.trained_video; its attention falls off in
#: time as in space, docs/dit.md): from half of the steps on, Quality keeps one key of each pair of columns (1.18x
#: at 832x480x81 where 2x2 from three quarters of the steps gave 1.13x, for as much change at 8 steps and less at 4),
#: and Fast one of each 2x2 cell of every other frame (1.37x, changing a generation 6-14% less than 3x3 cells at
#: 1.38x at 4, 8 and 12 steps); Balanced and Fastest stay (docs/runs/2026-12-06-trained-video: sweep.log).
_DIT_WAN = (
    _late(_kv(2, 0.0, rows=1), 0.5),
    _late(_kv(2, 0.0), 0.5),
    _late(_kv(2, 0.0, frames=2), 0.5),
    _late(_kv(3, 0.0), 0.25),
)
_DIT_LADDERS: Mapping[str, tuple[Mapping[str, Any], ...]] = _frozen(
    {
        "flux": tuple(_late(_FLUX_MERGED, start) for start in (0.75, 0.5, 0.25, 0.0)),
        "wan": _DIT_WAN,
        **{family.name: _DIT_IMAGE for family in DIT_FAMILIES if family.name not in ("flux", "wan")},
    }
)


def _dits(rung: int) -> dict[str, Mapping[str, Any]]:
    """Each diffusion transformer family's setting at `rung` of its ladder (0: Quality ... 3: Fastest)."""
    return {family.name: _DIT_LADDERS[family.name][rung] for family in DIT_FAMILIES}


_PRESETS: tuple[Preset, ...] = (
    Preset(
        "quality",
        "Quality",
        "Smallest change to the image: self-attention attends to keys/values subsampled 2x2 at the first level"
        " with attention, every query kept (ToDo's default).",
        families=_frozen(
            {
                "sd": _frozen({"mode": "kv", "max_downsample": 1}),
                "sdxl": _frozen({"mode": "kv", "min_downsample": 2, "max_downsample": 2}),
                **_dits(0),
            }
        ),
        fidelity=_fidelity(
            _TODO,
            (1.0, 1.0),
            (1.0, 1.0),
            flux=(_PORT, 0.16),
            wan=(_STEPS, 3.70),
        ),
    ),
    Preset(
        "balanced",
        "Balanced",
        "The default: SD1/SD2 subsample keys/values 4x4 at level 1; SDXL subsamples them 2x2 at level 2 and merges"
        " 0.3 of the tokens of its level-4 blocks, whole.",
        families=_frozen(
            {
                "sd": _frozen({"mode": "kv", "sx": 4, "sy": 4, "max_downsample": 1}),
                "sdxl": _frozen({**_SDXL_DEEP, "ratio": 0.3}),
                **_dits(1),
            }
        ),
        fidelity=_fidelity(
            _TOMESD,
            (0.94, 1.24),
            (0.92, 1.37),
            flux=(_STEPS, 4.15),
            wan=(_STEPS, 2.95),
        ),
    ),
    Preset(
        "fast",
        "Fast",
        "Faster: SD1/SD2 also merge 0.55 of the tokens of the level-2 and level-4 blocks whole (4x4 cells); SDXL"
        " merges half the tokens of its level-4 blocks.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_DEEP, "ratio": 0.55, "sx": 4, "sy": 4}),
                "sdxl": _frozen({**_SDXL_DEEP, "ratio": 0.5}),
                **_dits(2),
            }
        ),
        fidelity=_fidelity(
            _TOMESD,
            (1.40, 1.50),
            (1.18, 1.78),
            flux=(_STEPS, 9.37),
            wan=(_STEPS, 3.90),
        ),
    ),
    Preset(
        "fastest",
        "Fastest",
        "The most speed, softer detail, for drafts: SD1/SD2 subsample keys/values 8x8 at level 1 and merge 0.95 of the"
        " tokens of the level-2 and level-4 blocks whole; SDXL merges 0.7 of the tokens of its level-4 blocks.",
        families=_frozen(
            {
                "sd": _frozen({**_SD_DEEP, "ratio": 0.95, "sx": 8, "sy": 8}),
                "sdxl": _frozen({**_SDXL_DEEP, "ratio": 0.7}),
                **_dits(3),
            }
        ),
        fidelity=_fidelity(
            _TOMESD,
            (2.26, 2.19),
            (1.43, 2.17),
            flux=(_STEPS, 8.49),
            wan=(_STEPS, 4.88),
        ),
    ),
)

#: The preset the WebUI starts with.
DEFAULT_PRESET = "balanced"


def all_presets() -> tuple[Preset, ...]:
    """Every preset, from the most faithful to the fastest (`tome_core.presets()` prints them as a table)."""
    return _PRESETS


def get_preset(name: str) -> Preset:
    """The preset called `name`; ValueError naming the known ones otherwise."""
    for preset in _PRESETS:
        if preset.name == name:
            return preset
    raise ValueError(f"preset must be one of {', '.join(repr(p.name) for p in _PRESETS)}, got {name!r}")
