"""Never silent: what ToMe really did in each sampling pass, compared with what the accordion asked for.

The core counts, per pass, the transformer blocks the config selects and those that really merged tokens (or
pooled keys/values) at least once (`tome_core.stats`). When the two differ, `note` explains it in one line for
the infotext and the log, e.g. ``merged in 0 of 16 blocks (attention replaced by another extension)``.

The counts are those of the config the pass really ran (a preset resolved for the model), whichever modules it
merges: a block counts as merged when any of its merged modules (self-/cross-attention, MLP) merged, and with
one plan per stack the blocks that reuse the stack's plan count too. A diffusion transformer's block counts when its
joint attention ran on subsampled keys/values; the core reaches that attention where it calls PyTorch's
scaled_dot_product_attention, so a block whose attention runs another kernel counts as planned and not reached, and the
note says so: with the core's reasons where it knows them (`TomeStats.not_reached`: a diffusers attention backend
whose kernel it cannot run, say), else `OTHER_KERNEL`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tome_core import TomeStats
from tome_core.dit import NOT_PLAIN
from tome_core.words import not_reached_words

PASS_LABELS: Mapping[str, str] = {"first": "first pass", "hires": "hires pass", "img2img": "img2img"}
#: The one way torch.compile keeps ToMe's hooks out. A patch changes the patched modules' `forward`, which the guards
#: of a graph compiled before it check, so that graph is traced again with the patch in it (Forge Neo's, reForge's
#: and SD.Next's compile keep those guards; Neo's filter drops only guards on `transformer_options`). A host that
#: drops the guards on modules (`torch.compiler.skip_guard_on_all_nn_modules_unsafe`, say) runs the old graph.
STALE_GRAPH = "a torch.compile graph traced before the patch, run with its guards on modules dropped"
#: Why a diffusion transformer's attention was not reached: ToMe subsamples keys/values where PyTorch's
#: scaled_dot_product_attention is called, and the hosts choose the kernel at start-up (Forge Neo: SageAttention,
#: FlashAttention, xformers, or its einsum "basic" attention on a CPU; `--use-pytorch-cross-attention` selects SDPA).
OTHER_KERNEL = (
    "its attention ran another kernel than PyTorch's scaled_dot_product_attention (SageAttention, FlashAttention,"
    " xformers or basic attention; in Forge Neo start with --use-pytorch-cross-attention), or another extension"
    " replaced it"
)


#: Why a query did not keep its own key in a block that subsampled keys/values (`tome_core.dit.AttentionHook.attend`
#: answers only plain self-attention calls of [B, H, L, D] tensors, no dropout, causal mask or grouped heads).
OWN_KEY_SKIPPED = f"{NOT_PLAIN}: the kept keys alone there"


@dataclass(frozen=True)
class PassReport:
    """One sampling pass: the core's counts and the sampler steps the WebUI reported for it."""

    stats: TomeStats
    steps: int
    transformer: bool = False  # a diffusion transformer (blocks, not UNet levels)
    stopped: tuple[int, int] | None = None  # (last step run, from 0, of steps): the pass stopped early (an interrupt)


def _levels(levels: frozenset[int]) -> str:
    return ", ".join(str(level) for level in sorted(levels)) or "none"


def explain(report: PassReport) -> str | None:
    """Why fewer blocks merged than the config selects, with the counts; None when all of them did. A diffusion
    transformer's blocks have no levels: its window selects them, and its attention kernel may be another's."""
    s, dit = report.stats, report.transformer
    verb = "subsampled keys/values in" if dit else "pooled keys/values in" if s.mode == "kv" else "merged in"
    if s.selected == 0:
        if dit:
            return f"{verb} 0 of {s.total} blocks (the block window selects none of this model's blocks)"
        return (
            f"{verb} 0 of 0 blocks (no transformer block at the selected downsampling levels "
            f"{_levels(s.levels)}; this model has them at {_levels(s.block_levels)}: try max downsample auto)"
        )
    if s.unet_calls == 0:
        if report.steps == 0:
            return None  # the pass did not sample (or the host does not say): nothing to compare
        return (
            f"{verb} 0 of {s.selected} blocks (the {'model' if dit else 'UNet'} ran without ToMe's hooks: another"
            f" extension replaced its forward, or {STALE_GRAPH})"
        )
    if s.applied >= s.selected:
        return _own_key_short(s) if dit else None
    reasons = []
    if s.planned < s.selected:
        if s.block_calls == 0:
            reasons.append(f"the blocks ran without ToMe's hooks: another extension replaced them, or {STALE_GRAPH}")
        elif s.active_calls == 0 and report.stopped is not None:
            step, total = report.stopped
            reasons.append(f"the generation stopped after step {step + 1} of {total}, before the step window")
        elif s.active_calls == 0:
            reasons.append("the step window excluded every step")
        elif dit:
            reasons.append("the model's inputs did not show where the image's tokens are")
        elif s.grid_misses:
            reasons.append("their token count did not fit the latent size")
        elif s.mode == "merge":
            reasons.append("the image is too small for the strides and ratio to merge a token")
        else:
            reasons.append("no token grid at this size")
    if s.reached < s.planned:
        reasons.extend(not_reached_words(s, OTHER_KERNEL if dit else "attention replaced by another extension"))
    if s.applied < s.reached:
        reasons.append(
            "their token count did not fit the latent size"
            if dit
            else "tokens changed by another extension before ToMe"
        )
    return f"{verb} {s.applied} of {s.selected} blocks ({'; '.join(reasons)})"


def _own_key_short(s: TomeStats) -> str | None:
    """Where a diffusion transformer's blocks subsampled keys/values but not every query kept its own key (an
    attention call the core could not run itself), how many did; None when all of them did."""
    kinds = dict(s.modules)
    pooled, own = kinds.get("kv", 0), kinds.get("own", 0)
    if own >= pooled:
        return None
    why = "; ".join(f"{reason}: the kept keys alone there" for reason, _ in s.own_key_off) or OWN_KEY_SKIPPED
    return (
        f"subsampled keys/values in {s.applied} of {s.selected} blocks; each query's own key joined the kept keys in"
        f" {own} of the {pooled} that subsampled them ({why})"
    )


def note(reports: Mapping[str, PassReport]) -> str | None:
    """The infotext note of one batch: each pass that fell short, prefixed by its name when there are several."""
    lines = []
    for name, report in reports.items():
        text = explain(report)
        if text is not None:
            lines.append(f"{PASS_LABELS.get(name, name)}: {text}" if len(reports) > 1 else text)
    return "; ".join(lines) or None
