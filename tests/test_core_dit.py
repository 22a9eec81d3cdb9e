"""Diffusion transformers (tome_core.dit): every family diffusers has that ToMe reduces, on tiny real models.

Per family: the patch changes the output and reduces keys/values in every block it selects; removed, the model is
bitwise the unpatched one; every text and reference key reaches attention, and every kept key of the generated grid
is the model's own key at the centre of its cell, rotary embedding applied; compiled with fullgraph, one graph for
a whole sampling, equal to eager; bad settings and models ToMe does not handle get errors that name them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.overrides import TorchFunctionMode

import tome_core
from tome_core.compat import attention_lse, plain_attention_lse
from tome_core.dit import AttentionHook, draw_slot
from tome_core.hooks import timestep_arg
from tome_core.merge import kv_index, kv_table
from tome_core.words import describe_config

import dit_models
from dit_models import TEXT, TINY, H, Tiny, W, run

NAMES = tuple(TINY)


@pytest.fixture(params=NAMES)
def tiny(request: pytest.FixtureRequest) -> Tiny:
    return TINY[request.param]()


#: The attention kernels: scaled_dot_product_attention, and the one the core calls itself in a reduced block, where
#: each query keeps its own key (`tome_core.compat.attention_lse`, on the CPU).
ATTENTION = (F.scaled_dot_product_attention, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu)


class KeysSeen(TorchFunctionMode):
    """Records the keys and masks every attention kernel call gets (after anything that changed them)."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[torch.Tensor] = []
        self.masks: list[torch.Tensor | None] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in ATTENTION:
            key = args[1] if len(args) > 1 else kwargs["key"]
            self.keys.append(key.detach().clone())
            self.masks.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
        return func(*args, **kwargs)


def attends(mask: torch.Tensor) -> torch.Tensor:
    """A mask as booleans (True: attends), from booleans or the additive mask the core's own attention kernel gets."""
    return mask if mask.dtype == torch.bool else mask == 0


def keys_of(model: nn.Module, tiny: Tiny) -> list[torch.Tensor]:
    with KeysSeen() as seen:
        run(model, tiny)
    return seen.keys


def test_apply_reduces_every_selected_block_and_remove_is_bitwise(tiny: Tiny) -> None:
    model = tiny.build()
    base = run(model, tiny)
    tome_core.apply_patch(model, sx=2, sy=2)
    assert tome_core.model_family(model) == tiny.family
    out = run(model, tiny)
    stats = tome_core.stats(model)
    assert stats is not None and stats.selected == stats.total > 0
    assert stats.applied == stats.selected and stats.grid_misses == 0, stats
    assert stats.modules == (("kv", stats.selected), ("own", stats.selected))  # each query's own key too
    assert not torch.equal(out, base)
    tome_core.remove_patch(model)
    assert not tome_core.is_patched(model)
    assert torch.equal(run(model, tiny), base)
    assert not any(m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("cells", [(1, 2, 2), (1, 3, 3), (2, 2, 2)], ids=["2x2", "3x3-ragged", "2x2x2"])
def test_text_and_reference_keys_whole_and_kept_keys_carry_their_rotary_position(
    tiny: Tiny, cells: tuple[int, int, int]
) -> None:
    """The first block's keys are computed from the same inputs patched or not: the keys it attends to under the
    patch are exactly the unpatched keys at `kv_index`: every text and reference token, and of the generated
    grid one token of each cell (the call's slot, drawn from its timestep), as the model rotated it for its own
    position."""
    st, sy, sx = cells
    model = tiny.build()
    full = keys_of(model, tiny)[tiny.first]
    tome_core.apply_patch(model, sx=sx, sy=sy, st=st)
    reduced = keys_of(model, tiny)[tiny.first]
    tome_core.remove_patch(model)
    dim = -2 if full.shape[-2] == tiny.before + tiny.grid[0] * tiny.grid[1] * tiny.grid[2] + tiny.after else 1
    slot = int(draw_slot(timestep_arg((), tiny.inputs(0))))
    index = kv_index(tiny.before, tiny.grid, tiny.after, st, sy, sx, "cpu", slot)
    assert torch.equal(reduced, full.index_select(dim, index))
    kept = set(index.tolist())
    n = tiny.before + tiny.grid[0] * tiny.grid[1] * tiny.grid[2]
    assert set(range(tiny.before)) <= kept  # text (and Wan's first frame)
    assert set(range(n, n + tiny.after)) <= kept  # reference images, or text placed last
    t, h, w = tiny.grid
    assert len(kept) == tiny.before + tiny.after + -(-t // st) * -(-h // sy) * -(-w // sx)


def test_block_window_and_step_window(tiny: Tiny) -> None:
    model = tiny.build()
    tome_core.apply_patch(model, sx=2, sy=2, block_start=0.5)
    run(model, tiny)
    stats = tome_core.stats(model)
    assert stats is not None and stats.selected == sum(1 for i in range(stats.total) if i / stats.total >= 0.5)
    assert stats.applied == stats.selected
    tome_core.apply_patch(model, sx=2, sy=2, step_start=0.5)
    tome_core.set_step(model, 0, 4)
    run(model, tiny)
    assert tome_core.stats(model).applied == 0  # type: ignore[union-attr]
    tome_core.set_step(model, 2, 4)
    run(model, tiny)
    assert tome_core.stats(model).applied == tome_core.stats(model).selected  # type: ignore[union-attr]
    tome_core.remove_patch(model)


def test_presets_resolve_for_the_family(tiny: Tiny) -> None:
    model = tiny.build()
    for preset in tome_core.presets():
        tome_core.apply_patch(model, preset=preset.name)
        assert tome_core.get_config(model) == preset.config(tiny.family)
        tome_core.set_step(model, 99, 100)  # the last step: inside every preset's step window
        run(model, tiny)
        stats = tome_core.stats(model)
        assert stats is not None and stats.applied == stats.selected > 0, (preset.name, stats)
    tome_core.remove_patch(model)


class GraphCounter:
    def __init__(self) -> None:
        self.graphs: list[fx.GraphModule] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs.append(gm)
        return gm.forward


@pytest.mark.parametrize("name", ["flux", "wan", "wan22-i2v", "qwen", "sd3", "hunyuanvideo", "ltx", "ltx2"])
def test_compiled_fullgraph_one_graph_per_sampling_equal_to_eager(name: str, fresh_dynamo: None) -> None:
    tiny = TINY[name]()
    model = tiny.build()
    tome_core.apply_patch(model, preset="balanced")
    eager = [run(model, tiny, seed=seed) for seed in range(3)]
    counter = GraphCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for seed, expected in enumerate(eager):
        with torch.no_grad():
            out = compiled(**tiny.inputs(seed))[0]
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert len(counter.graphs) == 1
    stats = tome_core.stats(model)
    assert stats is not None and stats.applied == stats.selected > 0
    tome_core.remove_patch(model)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"mode": "merge"}, "TomeConfig.ratio=0.5"),
        ({"ratio": 0.3}, "TomeConfig.ratio"),
        ({"merge_mlp": True}, "TomeConfig.merge_mlp"),
        ({"max_downsample": 2}, "TomeConfig.max_downsample"),
        ({"st": 9}, "TomeConfig.st"),
        ({"block_start": 0.6, "block_end": 0.5}, "TomeConfig.block_start"),
    ],
)
def test_settings_a_dit_cannot_run_are_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    tiny = TINY["flux"]()
    model = tiny.build()
    with pytest.raises(ValueError, match=named):
        tome_core.apply_patch(model, **fields)
    assert not tome_core.is_patched(model)


def test_a_model_not_handled_is_named() -> None:
    from diffusers import CogVideoXTransformer3DModel

    model = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, num_layers=1, text_embed_dim=32
    )
    with pytest.raises(TypeError, match="CogVideoXTransformer3DModel is not a model ToMe patches") as caught:
        tome_core.apply_patch(model, preset="balanced")
    assert "Flux.1" in str(caught.value) and "Wan" in str(caught.value)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize(("name", "captions"), [*((name, None) for name in NAMES), ("lumina2", (TEXT, 4))])
def test_each_query_attends_to_the_kept_keys_and_its_own(
    name: str, captions: tuple[int, ...] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every family: in a reduced block every query attends to the text's and reference keys, the call's kept key of
    each cell, and its own key, exactly dense attention masked so (per sample where captions differ in length, their
    padding still masked), the kept keys weighing as the 4 tokens of their cell (+log 4 on their logits) beside the
    own key's one; the words users read say so."""
    tiny = dit_models.lumina2(captions) if captions else TINY[name]()
    model = tiny.build()
    seen: list[tuple[torch.Tensor, ...]] = []
    attend = AttentionHook.attend

    def spy(hook: AttentionHook, state: Any, q: Any, k: Any, v: Any, mask: Any, scale: Any, kernel: Any = None) -> Any:
        out = attend(hook, state, q, k, v, mask, scale, kernel)
        seen.append((q, k, v, mask, out, state.draw))
        return out

    monkeypatch.setattr(AttentionHook, "attend", spy)
    tome_core.apply_patch(model, sx=2, sy=2)
    run(model, tiny)
    stats = tome_core.stats(model)
    assert stats is not None and stats.applied == stats.selected == len(seen) > 0, stats
    n = math.prod(tiny.grid)
    for q, k, v, mask, out, draw in seen:
        length = int(k.shape[-2])
        kept = torch.zeros(q.shape[0], 1, length, length, dtype=torch.bool)
        for sample, caption in enumerate(captions or (tiny.before,) * q.shape[0]):
            index = kv_index(caption, tiny.grid, length - caption - n, 1, 2, 2, "cpu", int(draw))
            kept[sample, :, :, index] = True
        bias = torch.where(kept, math.log(4), -math.inf)  # [B, 1, L, L]: what each key adds to a query's logit
        bias = torch.where(torch.eye(length, dtype=torch.bool) & ~kept, 0.0, bias)  # the own key counts once
        if mask is not None:
            bias = bias.masked_fill(~attends(mask).expand_as(bias), -math.inf)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        rows = (bias > -math.inf).any(-1, keepdim=True)  # a padding query that attends to nothing is not compared
        torch.testing.assert_close(out * rows, expected * rows, rtol=1e-5, atol=1e-5)
    tome_core.remove_patch(model)
    config = tome_core.get_preset("balanced").config(tiny.family)
    assert "each query also attending to its own key" in describe_config(config, tiny.family)  # what users read


@pytest.mark.parametrize("mask", [None, "bool", "additive"])
def test_attention_with_its_log_sum_exp_equals_scaled_dot_product_attention(mask: str | None) -> None:
    """The attention the own key joins (`attention_lse`, the CPU's kernel, and the plain operations other devices
    run): the output scaled_dot_product_attention gives, and the log-sum-exp of the scaled, masked scores."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen) for n in (10, 6, 6))
    allowed = torch.rand(2, 1, 1, 6, generator=gen) > 0.3
    allowed[..., 0] = True
    given = {None: None, "bool": allowed, "additive": torch.zeros(allowed.shape).masked_fill(~allowed, -1e9)}[mask]
    additive = None if mask is None else torch.zeros(allowed.shape).masked_fill(~allowed, -float("inf"))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=given, scale=0.3)
    scores = q @ k.transpose(-1, -2) * 0.3 + (0 if additive is None else additive)
    for out, lse in (attention_lse(q, k, v, given, 0.3), plain_attention_lse(q, k, v, additive, 0.3)):
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse, torch.logsumexp(scores, -1), rtol=1e-5, atol=1e-5)


def test_host_interceptor_subsamples_what_the_host_hands_it() -> None:
    """ComfyUI's adapter intercepts attention itself: with the "host" interceptor the block runs unchanged unless
    the host calls `reduce_attention`, which subsamples along the dimension it names."""
    tiny = TINY["flux"]()
    model = tiny.build()
    base = run(model, tiny)
    tome_core.apply_patch(model, sx=2, sy=2)
    tome_core.set_attention_interceptor(model, "host")
    assert torch.equal(run(model, tiny), base)
    stats = tome_core.stats(model)
    assert stats is not None and stats.planned == stats.selected and stats.reached == 0 and stats.applied == 0
    key = torch.randn(2, 2, tiny.before + 64, 16)
    assert tome_core.reduce_attention(model, key, key, 2) is None  # no block running: nothing to do
    with pytest.raises(ValueError, match="interceptor"):
        tome_core.set_attention_interceptor(model, "flash")
    tome_core.remove_patch(model)


# ---------------------------------------------------------------------------------------------- merged blocks (Flux.1)

MERGE = {"mode": "merge", "ratio": 0.75, "sx": 2, "sy": 2, "block_start": 0.5, "pool_kv": True}


class BlockInputs:
    """Records what the attention of each single-stream block of a diffusers Flux model is called with (inside the
    block: what the block runs on)."""

    def __init__(self, model: nn.Module) -> None:
        self.calls: list[dict[str, Any]] = []
        self.handles = [
            block.attn.register_forward_pre_hook(self.hook, with_kwargs=True)
            for block in model.single_transformer_blocks
        ]

    def hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls.append(dict(kwargs))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("name", ["flux", "flux-kontext"])
def test_merged_blocks_keep_text_and_references_and_carry_their_destinations_positions(name: str) -> None:
    """Flux.1's merged window: the window's blocks get one token per 2x2 cell of the generated grid and the text and
    reference tokens whole; the rotary embedding they get is the model's own at the text, at each merged token's
    destination (the cell centre) and at the references; removed, bitwise."""
    tiny = TINY[name]()
    model = tiny.build()
    base = run(model, tiny)
    plain = BlockInputs(model)
    run(model, tiny)
    plain.remove()
    tome_core.apply_patch(model, **MERGE)
    merged = BlockInputs(model)
    out = run(model, tiny)
    merged.remove()
    stats = tome_core.stats(model)
    assert stats is not None and stats.applied == stats.selected == stats.total
    assert dict(stats.modules) == {
        "kv": 2,
        "own": 2,
        "attn1": 2,
        "ff": 2,
    }  # 2 double (pooled, own key), 2 single (merged)
    _, h, w = tiny.grid
    cells = (h // 2) * (w // 2)
    for before, after in zip(plain.calls, merged.calls):
        # The joint stream: the text whole, one token per cell, the references whole.
        assert after["hidden_states"].shape[1] == tiny.before + cells + tiny.after
        assert before["hidden_states"].shape[1] == tiny.before + h * w + tiny.after
        cos, sin = before["image_rotary_emb"]
        centres = torch.tensor([(2 * r + 1) * w + 2 * c + 1 for r in range(h // 2) for c in range(w // 2)])
        n = tiny.before + h * w
        index = torch.cat([torch.arange(tiny.before), centres + tiny.before, torch.arange(n, n + tiny.after)])
        assert torch.equal(after["image_rotary_emb"][0], cos.index_select(0, index))
        assert torch.equal(after["image_rotary_emb"][1], sin.index_select(0, index))
    assert out.shape == base.shape and not torch.equal(out, base)
    tome_core.remove_patch(model)
    assert torch.equal(run(model, tiny), base)


def test_merged_window_compiles_to_one_graph(fresh_dynamo: None) -> None:
    tiny = TINY["flux"]()
    model = tiny.build()
    tome_core.apply_patch(model, preset="fastest")
    assert tome_core.get_config(model).mode == "merge"  # type: ignore[union-attr]
    eager = [run(model, tiny, seed=seed) for seed in range(2)]
    counter = GraphCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for seed, expected in enumerate(eager):
        with torch.no_grad():
            torch.testing.assert_close(compiled(**tiny.inputs(seed))[0], expected, rtol=1e-5, atol=1e-5)
    assert len(counter.graphs) == 1
    tome_core.remove_patch(model)


@pytest.mark.parametrize(
    ("name", "fields", "named"),
    [
        ("wan", MERGE, "TomeConfig.mode='merge' does not run"),
        ("chroma", MERGE, "TomeConfig.mode='merge' does not run"),
        ("flux", {**MERGE, "ratio": 0.5}, "TomeConfig.ratio=0.5"),
    ],
)
def test_merge_refused_where_it_cannot_run(name: str, fields: dict[str, Any], named: str) -> None:
    tiny = TINY[name]()
    model = tiny.build()
    with pytest.raises(ValueError, match=re.escape(named)):
        tome_core.apply_patch(model, **fields)
    assert not tome_core.is_patched(model)


def test_a_controlnet_call_runs_the_window_unmerged() -> None:
    """A ControlNet adds a residual per token between blocks: such a call keeps every token (the shapes would not
    match), and says so in the counts (planned, not applied)."""
    tiny = TINY["flux"]()
    model = tiny.build()
    tome_core.apply_patch(model, **{**MERGE, "pool_kv": False})
    hidden = model.config.num_attention_heads * model.config.attention_head_dim
    control = [torch.zeros(2, 64, hidden)]
    with torch.no_grad():
        model(**tiny.inputs(0), controlnet_block_samples=control, controlnet_single_block_samples=control)
    stats = tome_core.stats(model)
    assert stats is not None and stats.applied == 0 and stats.block_calls == stats.selected
    tome_core.remove_patch(model)


def test_captions_of_different_lengths_keep_each_samples_caption_and_its_grid() -> None:
    """Lumina 2 lays out each sample as [its caption, its image, padding]: with captions of 7 and 4 tokens the
    second sample's grid starts 3 tokens earlier. Each sample keeps its own caption's keys and one key of each cell
    of its own grid (the call's slot), and the mask follows the keys it masks (the padding stays masked)."""
    tiny = dit_models.lumina2((TEXT, 4))
    model = tiny.build()
    base = run(model, tiny)
    with KeysSeen() as full:
        run(model, tiny)
    tome_core.apply_patch(model, sx=2, sy=2)
    with KeysSeen() as seen:
        out = run(model, tiny)
    stats = tome_core.stats(model)
    assert stats is not None and stats.applied == stats.selected == stats.total and stats.grid_misses == 0, stats
    assert not torch.equal(out, base)
    key, mask, reduced, reduced_mask = full.keys[2], full.masks[2], seen.keys[2], seen.masks[2]
    assert mask is not None and reduced_mask is not None
    length, n = int(key.shape[-2]), H * W
    for sample, caption in enumerate((TEXT, 4)):
        slot = int(draw_slot(timestep_arg((), tiny.inputs(0))))
        index = kv_index(caption, (1, H, W), length - caption - n, 1, 2, 2, "cpu", slot)
        assert torch.equal(reduced[sample], key[sample].index_select(-2, index))
        assert torch.equal(attends(reduced_mask[sample]), mask[sample].index_select(-1, index))
    assert not bool(attends(reduced_mask[1, ..., -(TEXT - 4) :]).any())  # the second sample's padding, still masked
    tome_core.remove_patch(model)
    assert torch.equal(run(model, tiny), base)


@pytest.mark.parametrize("name", ["zimage", "lumina2"])
def test_a_bare_model_whose_timestep_rises_reads_its_step_window_the_right_way(name: str) -> None:
    """diffusers' Z-Image and Lumina 2 get t from 0 at the start of sampling to 1 at its end (Flux gets a sigma
    from 1 down): a window over the first half of the steps reduces at t=0.1 and not at t=0.9."""
    tiny = TINY[name]()
    model = tiny.build()
    keyword = "t" if name == "zimage" else "timestep"
    applied = []
    for t in (0.1, 0.9):
        tome_core.apply_patch(model, sx=2, sy=2, step_end=0.5)
        run(model, tiny, **{keyword: torch.full((2,), t)})
        applied.append(tome_core.stats(model).applied)  # type: ignore[union-attr]
        tome_core.remove_patch(model)
    assert applied[0] > 0 and applied[1] == 0, applied


def test_each_step_keeps_another_token_of_each_cell_and_cond_and_uncond_the_same(tiny: Tiny) -> None:
    """Over a sampling the kept token of each cell changes with the timestep (the error of subsampling then averages
    out over the steps instead of adding up): each call keeps the slot `draw_slot` gives its timestep, every call of
    one step the same, and over eight steps more than one slot."""
    model = tiny.build()
    name = next(k for k in ("timestep", "timesteps", "t") if k in tiny.inputs(0))
    slots = []
    for fraction in (1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125):
        timestep = tiny.inputs(0)[name] * (2 * fraction)  # Wan 2.2 image-to-video's first frame: 0 at every step
        with KeysSeen() as seen:
            run(model, tiny, **{name: timestep})
        full = seen.keys[tiny.first]
        tome_core.apply_patch(model, sx=2, sy=2)
        for _ in range(2):  # cond, then uncond: the same step
            with KeysSeen() as seen:
                run(model, tiny, **{name: timestep})
            slot = int(draw_slot(timestep))
            dim = -2 if full.shape[-2] == tiny.before + math.prod(tiny.grid) + tiny.after else 1
            index = kv_index(tiny.before, tiny.grid, tiny.after, 1, 2, 2, "cpu", slot)
            assert torch.equal(seen.keys[tiny.first], full.index_select(dim, index))
        tome_core.remove_patch(model)
        slots.append(slot % 4)
    assert len(set(slots)) > 1, slots


@pytest.mark.parametrize("per", ["token", "frame"])
def test_a_timestep_per_token_or_frame_draws_the_steps_slot_not_the_kept_first_frames(per: str) -> None:
    """Wan 2.2 TI2V 5B's image-to-video gives the first latent frame (the reference image) timestep 0 at every step:
    diffusers' pipelines with `expand_timesteps` one per token [B, F*H*W], ComfyUI's and Forge Neo's Wan 2.2 one per
    latent frame [B, F]. The draw follows the step's timestep (the noisy tokens'), as a [B] timestep t draws, so it
    still changes from step to step, the same for cond and uncond."""
    cells = H * W if per == "token" else 1
    slots = []
    for t in (999.0, 937.5, 875.0, 750.0, 625.0, 500.0, 250.0, 125.0):
        timestep = dit_models.expanded_timestep(t, 2, 5, cells)
        slot = int(draw_slot(timestep))
        assert slot == int(draw_slot(torch.full((2,), t)))
        slots.append(slot % 4)
    assert len(set(slots)) > 1, slots


def test_a_bare_wan22_image_to_video_reads_its_step_window_from_the_noisy_tokens() -> None:
    """A bare Wan 2.2 TI2V 5B (no pipeline, no `set_step`) with a window over the first half of the steps reduces at
    t=900 and not at t=100, though its first frame's tokens get 0 at both."""
    tiny = TINY["wan22-i2v"]()
    model = tiny.build()
    layout = tome_core.find_layout(model)
    assert layout is not None and layout.family == "wan"
    applied = []
    for t in (900.0, 100.0):
        tome_core.apply_patch(model, sx=2, sy=2, step_end=0.5)
        run(model, tiny, timestep=dit_models.expanded_timestep(t, 1, dit_models.FRAMES, H * W))
        applied.append(tome_core.stats(model).applied)  # type: ignore[union-attr]
        tome_core.remove_patch(model)
    assert applied[0] > 0 and applied[1] == 0, applied


def test_every_slot_keeps_one_token_per_cell_and_the_slots_cover_the_grid() -> None:
    for grid, cells in (
        ((1, 8, 8), (1, 2, 2)),
        ((1, 7, 9), (1, 3, 3)),
        ((5, 12, 20), (2, 4, 4)),
        ((3, 5, 5), (2, 2, 2)),
    ):
        table = kv_table(3, grid, 2, *cells, "cpu")
        t, h, w = grid
        n = t * h * w
        assert table.shape == (math.prod(cells), 3 + math.prod(-(-a // b) for a, b in zip(grid, cells)) + 2)
        assert torch.equal(table[0], kv_index(3, grid, 2, *cells, "cpu"))  # slot 0: each cell's centre
        for row in table:
            assert len(set(row.tolist())) == len(row) and row[:3].tolist() == [0, 1, 2]
            assert row[-2:].tolist() == [3 + n, 4 + n]
        assert set(table[:, 3:-2].reshape(-1).tolist()) == set(range(3, 3 + n))


@pytest.mark.parametrize("name", ["flux", "zimage"])
def test_under_autocast_the_own_key_runs_in_the_dtype_attention_would(name: str) -> None:
    """Under autocast a model's query, key and value can reach attention in different dtypes (Z-Image's rotary
    embedding in float32 beside a 16-bit value), which scaled_dot_product_attention casts to autocast's dtype: the
    core's own attention does the same, so every reduced block still keeps each query's own key, close to the float32
    patched output."""
    tiny = TINY[name]()
    model = tiny.build()
    tome_core.apply_patch(model, sx=2, sy=2)
    reference = run(model, tiny)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(model, tiny)
    stats = tome_core.stats(model)
    assert stats is not None and dict(stats.modules)["own"] == stats.selected > 0
    assert (out.float() - reference).norm() / reference.norm() < 0.05
    tome_core.remove_patch(model)
