"""The "ToMe note": what each pass really merged against what its config selects, and why it fell short."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tome_core import TomeStats
from tome_webui.report import PassReport, explain, note

FULL = TomeStats(
    mode="merge",
    total=16,
    selected=5,
    planned=5,
    reached=5,
    applied=5,
    unet_calls=40,
    active_calls=40,
    block_calls=200,
    grid_misses=0,
    levels=frozenset({1}),
    block_levels=frozenset({1, 2, 4, 8}),
)


def report(steps: int = 20, **changes: object) -> PassReport:
    return PassReport(stats=replace(FULL, **changes), steps=steps)


@pytest.mark.parametrize(
    ("changes", "steps", "expected"),
    [
        ({}, 20, None),
        ({"applied": 6}, 20, None),
        ({"unet_calls": 0, "active_calls": 0}, 0, None),  # the pass did not sample: nothing to compare
        (
            {"unet_calls": 0, "active_calls": 0, "planned": 0, "reached": 0, "applied": 0},
            20,
            "merged in 0 of 5 blocks (the UNet ran without ToMe's hooks: another extension replaced its forward, or "
            "a torch.compile graph traced before the patch, run with its guards on modules dropped)",
        ),
        (
            {
                "selected": 0,
                "planned": 0,
                "reached": 0,
                "applied": 0,
                "levels": frozenset({1}),
                "block_levels": frozenset({2, 4}),
            },
            20,
            "merged in 0 of 0 blocks (no transformer block at the selected downsampling levels 1; this model has "
            "them at 2, 4: try max downsample auto)",
        ),
        (
            {"planned": 0, "reached": 0, "applied": 0, "block_calls": 0},
            20,
            "merged in 0 of 5 blocks (the blocks ran without ToMe's hooks: another extension replaced them, or a "
            "torch.compile graph traced before the patch, run with its guards on modules dropped)",
        ),
        (
            {"planned": 0, "reached": 0, "applied": 0, "active_calls": 0},
            20,
            "merged in 0 of 5 blocks (the step window excluded every step)",
        ),
        (
            {"planned": 3, "reached": 3, "applied": 3, "grid_misses": 4},
            20,
            "merged in 3 of 5 blocks (their token count did not fit the latent size)",
        ),
        (
            {"planned": 0, "reached": 0, "applied": 0},
            20,
            "merged in 0 of 5 blocks (the image is too small for the strides and ratio to merge a token)",
        ),
        ({"reached": 2, "applied": 2}, 20, "merged in 2 of 5 blocks (attention replaced by another extension)"),
        ({"applied": 4}, 20, "merged in 4 of 5 blocks (tokens changed by another extension before ToMe)"),
        (
            {"mode": "kv", "reached": 0, "applied": 0},
            20,
            "pooled keys/values in 0 of 5 blocks (attention replaced by another extension)",
        ),
    ],
)
def test_explain(changes: dict[str, object], steps: int, expected: str | None) -> None:
    assert explain(report(steps, **changes)) == expected


def test_note_names_passes_only_when_there_are_several() -> None:
    short = report(reached=0, applied=0)
    assert note({"first": short}) == "merged in 0 of 5 blocks (attention replaced by another extension)"
    assert note({"first": report(), "hires": short}) == (
        "hires pass: merged in 0 of 5 blocks (attention replaced by another extension)"
    )
    assert note({"first": short, "hires": short}).count("pass: merged in 0 of 5") == 2
    assert note({"first": report(), "hires": report()}) is None
    assert note({}) is None


def test_a_transformer_s_note_says_where_queries_did_not_keep_their_own_key() -> None:
    """The words users read say each query also attends to its own key on a diffusion transformer: where the blocks
    subsampled keys/values but an attention call was not one the core could answer itself (not a plain four-tensor
    self-attention), the note says in how many blocks the own key joined; all of them: no note."""
    dit = {"mode": "kv", "selected": 3, "planned": 3, "reached": 3, "applied": 3}

    def pass_report(own: int) -> PassReport:
        return PassReport(replace(FULL, **dit, modules=(("kv", 3), ("own", own))), steps=20, transformer=True)

    assert explain(pass_report(3)) is None
    assert explain(pass_report(1)) == (
        "subsampled keys/values in 3 of 3 blocks; each query's own key joined the kept keys in 1 of the 3 that"
        " subsampled them (its attention call was not a plain self-attention ToMe could run itself: the kept keys"
        " alone there)"
    )
    merged = replace(FULL, mode="merge", modules=(("kv", 2), ("attn1", 2), ("ff", 2)))
    assert explain(PassReport(merged, steps=20, transformer=True)) == (
        "subsampled keys/values in 5 of 5 blocks; each query's own key joined the kept keys in 0 of the 2 that"
        " subsampled them (its attention call was not a plain self-attention ToMe could run itself: the kept keys"
        " alone there)"
    )
    assert explain(PassReport(merged, steps=20)) is None  # a UNet's blocks: no own key to keep
    # The core says why (issue 58: a kernel that returned no log-sum-exp), and the note passes it on.
    sage3 = replace(FULL, **dit, modules=(("kv", 3),), own_key_off=(("SageAttention 3 returned no log-sum-exp", 3),))
    assert explain(PassReport(sage3, steps=20, transformer=True)) == (
        "subsampled keys/values in 3 of 3 blocks; each query's own key joined the kept keys in 0 of the 3 that"
        " subsampled them (SageAttention 3 returned no log-sum-exp: the kept keys alone there)"
    )


def test_a_transformer_s_note_gives_the_core_s_reasons_for_blocks_not_reached() -> None:
    """Where the core knows why planned blocks were not reached (`TomeStats.not_reached`: a diffusers attention
    backend whose kernel it cannot run), the note says that instead of the generic other-kernel words; blocks its
    reasons leave out still get those words."""
    why = "diffusers' attention backend 'flex' calls a kernel ToMe cannot run"
    dit = {"mode": "kv", "selected": 3, "planned": 3, "reached": 0, "applied": 0}
    known = replace(FULL, **dit, not_reached=((why, 3),))
    assert explain(PassReport(known, steps=20, transformer=True)) == f"subsampled keys/values in 0 of 3 blocks ({why})"
    partly = replace(FULL, **dit, not_reached=((why, 1), ("context parallelism", 1)))
    assert explain(PassReport(partly, steps=20, transformer=True)) == (
        f"subsampled keys/values in 0 of 3 blocks ({why} (1); context parallelism (1); its attention ran another"
        " kernel than PyTorch's scaled_dot_product_attention (SageAttention, FlashAttention, xformers or basic"
        " attention; in Forge Neo start with --use-pytorch-cross-attention), or another extension replaced it)"
    )
    assert note({"first": PassReport(known, steps=20, transformer=True)}) == (
        f"subsampled keys/values in 0 of 3 blocks ({why})"
    )
