"""The ComfyUI nodes on diffusion transformers (issue 43), driven through the ComfyUI-shaped stand-in: tiny Flux, Wan,
SD3, Lumina 2 and Z-Image models whose classes carry ComfyUI's module names and whose attention goes through a stand-in of ComfyUI's
`wrap_attn` / `optimized_attention_override` (tests/comfy_stub/dit.py)."""

from __future__ import annotations

import logging
import math
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

import comfy_stub.dit as stub_dit
import pytest
import torch
import torch.nn.functional as F
from comfy_stub.dit import Flux
from comfy_stub.model_management import InterruptProcessingException
from comfy_stub.patcher import APPLY_MODEL, DIFFUSION_MODEL, OUTER_SAMPLE, ModelPatcher, copy_nested_dicts
from comfy_stub.sampling import load_checkpoint, sample
from comfy_stub.torch_compile import set_torch_compile_wrapper

import tome_core
from tome_comfy import NODE_CLASS_MAPPINGS
from tome_comfy.inputs import advanced_widgets
from tome_comfy.nodes import TOME_ADVANCED_NODE, TOME_NODE
from tome_comfy.sampling import ATTENTION_OVERRIDE
from tome_core import figures
from tome_core.dit import AttentionHook
from tome_core.merge import kv_index
from tome_core.words import speed_words

HEAD = f"ToMe {tome_core.__version__}"
PRESETS = [p.label for p in tome_core.presets()]
#: Sampling arguments per stand-in: Flux a 16x16 latent (an 8x8 patch grid: 128x128 px), Wan a 5-frame 8x8 latent
#: (4x4 patches per frame: 64x64 px, 17 frames).
TEXT = 5  # the stand-in's text tokens (tests/comfy_stub/sampling.py `sample`)
#: Lumina 2: the cond keeps its 5 caption tokens, the uncond 3 (Gemma's attention mask), in one batch.
CAPTIONS = (TEXT, 3)
LUMINA_MASK = torch.tensor([[1] * n + [0] * (TEXT - n) for n in CAPTIONS])
ARGS: dict[str, dict[str, Any]] = {
    "flux": {},
    "wan": {"frames": 5, "size": 8},
    "lumina2": {"attention_mask": LUMINA_MASK, "num_tokens": TEXT},
    "sd3": {},
    "zimage": {},
}


def tome(model: ModelPatcher, preset: str = "Balanced") -> ModelPatcher:
    return NODE_CLASS_MAPPINGS[TOME_NODE]().patch(model, preset)[0]


def tome_advanced(model: ModelPatcher, **changes: Any) -> ModelPatcher:
    values = {w.name: w.default for w in advanced_widgets()}
    return NODE_CLASS_MAPPINGS[TOME_ADVANCED_NODE]().patch(model, **{**values, **changes})[0]


def fields(preset: str, family: str) -> dict[str, Any]:
    """The preset's settings for `family`, as tome_core.presets holds them."""
    return dict(tome_core.get_preset(preset.lower()).families[family])


def windowed(preset: str, family: str) -> bool:
    """Whether the preset reduces only some of the steps (a step window): its speed is then said over a generation."""
    f = fields(preset, family)
    return f.get("step_start", 0.0) > 0 or f.get("step_end", 1.0) < 1


def steps_reduced(preset: str, family: str, steps: int = 4) -> int:
    """How many of `steps` sampler steps lie in the preset's step window (step i of n at fraction i/n)."""
    f = fields(preset, family)
    return sum(1 for i in range(steps) if f.get("step_start", 0.0) <= i / steps < f.get("step_end", 1.0))


def kinds(preset: str, family: str, total: int = 4) -> str:
    """What the log says a preset ran in a model of `total` blocks, from its config: in merge mode the blocks from
    block_start of the depth run on merged tokens and the others subsample keys/values (pool_kv); in kv mode the
    blocks from block_start subsample keys/values."""
    f = fields(preset, family)
    window = sum(1 for i in range(total) if i / total >= f["block_start"])
    own = "keys/values subsampled (each query's own key kept)"
    if f["mode"] == "merge":
        return f"generated tokens merged in {window} and {own} in {total - window} of {total} blocks"
    return f"{own} in {window} of {total} blocks"


def reduce_every_call(model: ModelPatcher, family: str) -> ModelPatcher:
    """The family's Fastest where its step window covers every step (Flux.1's), else Fastest's own fields without
    its step window (custom settings): a node that reduces every model call of a sampling."""
    if steps_reduced("Fastest", family, 100) == 100:
        return tome(model, "Fastest")
    f = {k: v for k, v in fields("Fastest", family).items() if k not in ("step_start", "step_end")}
    return tome_advanced(model, **f)


def dm(model: ModelPatcher) -> torch.nn.Module:
    return model.model.diffusion_model


def hook_count(module: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in module.modules())


def untouched(module: torch.nn.Module) -> bool:
    """Nothing of ToMe left on the model: no hooks, no state, every forward the class's."""
    return (
        hook_count(module) == 0
        and not tome_core.is_patched(module)
        and not any("forward" in m.__dict__ for m in module.modules())
    )


def tome_lines(caplog: Any) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "tome"]


@pytest.fixture(params=["flux", "wan", "lumina2", "zimage", "sd3"])
def family(request: Any) -> str:
    return request.param


# ---------------------------------------------------------------------------------------------- presets, off, clean


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_changes_the_output_and_without_the_node_it_is_bitwise_the_reference(
    family: str, preset: str
) -> None:
    model = load_checkpoint(family)
    reference = sample(model, **ARGS[family])
    merged = sample(tome(model, preset), **ARGS[family])
    assert not torch.equal(merged, reference)
    assert torch.equal(sample(model, **ARGS[family]), reference)
    assert untouched(dm(model))
    assert ATTENTION_OVERRIDE not in model.model_options["transformer_options"]


def test_presets_resolve_for_the_family_of_comfyuis_model_config(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="tome")
    for name, family, args in (
        ("flux-schnell", "flux", {}),
        ("chroma", "chroma", {}),
        ("wan-i2v", "wan", ARGS["wan"]),
        ("wan22", "wan", ARGS["wan"]),
        ("lumina2", "lumina2", ARGS["lumina2"]),
        ("sd3", "sd3", {}),
        ("zimage", "zimage", {}),
    ):
        caplog.clear()
        sample(tome(load_checkpoint(name), "Fast"), **args)
        ((_, line),) = tome_lines(caplog)
        own = " (each query's own key kept)"  # what ran there: ComfyUI's PyTorch attention, no other override
        first = "generated tokens merged in " if fields("Fast", family)["mode"] == "merge" else "keys/values"
        assert line.startswith(f"{HEAD} (Fast for {family}): {first}"), name
        assert f"keys/values subsampled{own} in " in line, name


def test_the_log_gives_the_blocks_the_size_sampled_and_the_presets_speed_there(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="tome")
    sample(tome(load_checkpoint("flux"), "Balanced"), size=16)
    speed = speed_words("balanced", "flux", (128, 128)) or "at 128\u00d7128"
    assert tome_lines(caplog) == [
        (
            "INFO",
            f"{HEAD} (Balanced for flux): {kinds('Balanced', 'flux')}, text and reference tokens whole,"
            f" attention by PyTorch; {speed}",
        )
    ]
    caplog.clear()
    sample(tome(load_checkpoint("wan22"), "Fastest"), **ARGS["wan"])  # Wan 2.2's VAE: 16 pixels per latent cell
    ((_, line),) = tome_lines(caplog)
    assert line.endswith(f"; {speed_words('fastest', 'wan', (128, 128, 17)) or 'at 128×128, 17 frames'}")


def test_the_speed_figure_is_the_tables_at_the_size_sampled(monkeypatch: Any, caplog: Any) -> None:
    """Issue 44: the figure at the size the user generates, saying whether it is estimated or measured, and where."""
    seen: list[tuple[Any, ...]] = []

    def speed(family: str, preset: str, width: int, height: int, frames: int = 1) -> figures.Speed:
        seen.append((family, preset, width, height, frames))
        source = figures.Source("NVIDIA H100", measured=True, what="a test table")
        return figures.Speed(1.5 if width > 128 else 1.25, (width, height, frames), source)

    monkeypatch.setattr(figures, "speed", speed)
    caplog.set_level(logging.INFO, logger="tome")
    model = tome(load_checkpoint("flux"), "Fast")
    sample(model, size=16)
    sample(model, size=24)  # a hires second sampler: its own size
    lines = [line for _, line in tome_lines(caplog)]
    per = "over a generation" if windowed("Fast", "flux") else "per step"  # a step window: the table's average
    assert lines[0].endswith(f"; about 1.25\u00d7 faster {per} at 128\u00d7128 (NVIDIA H100, measured)")
    assert lines[1].endswith(f"; about 1.50\u00d7 faster {per} at 192\u00d7192 (NVIDIA H100, measured)")
    assert seen == [("flux", "fast", 128, 128, 1), ("flux", "fast", 192, 192, 1)]


def test_each_sampler_of_a_split_schedule_names_its_part_of_the_noise_schedule(caplog: Any) -> None:
    """Issue 58: Wan 2.2 14B's workflow runs two models, each with its ToMe node, through two KSamplerAdvanced over
    one schedule: the high-noise expert from step 0 to 4 (leftover noise returned), the low-noise expert from step 4
    to the end. The models cannot tell which expert they are; each line says which part of the schedule it sampled
    (the sampling's sigmas beside the model's `sigma_max`). A whole schedule adds nothing. Fastest: its window (from
    a quarter of the steps on) holds steps of every part."""
    sigmas = [*torch.linspace(8.0, 0.1, 8).tolist(), 0.0]  # the stand-in's schedule of 8 steps (comfy_stub.sampling)
    caplog.set_level(logging.INFO, logger="tome")
    sample(tome(load_checkpoint("wan"), "Fastest"), steps=8, last_step=4, **ARGS["wan"])
    sample(tome(load_checkpoint("wan", seed=1), "Fastest"), steps=8, start_step=4, **ARGS["wan"])
    sample(tome(load_checkpoint("wan"), "Fastest"), steps=8, start_step=2, last_step=6, **ARGS["wan"])
    sample(tome(load_checkpoint("sdxl"), "Fast"), steps=8, start_step=6)  # an SDXL refiner's part: a UNet's line
    sample(tome(load_checkpoint("wan"), "Fastest"), steps=8, **ARGS["wan"])
    high, low, middle, refiner, whole = (line for _, line in tome_lines(caplog))
    part = "part of the noise schedule"
    assert high.startswith(
        f"{HEAD} (Fastest for wan) on the high-noise {part}, 4 steps from sigma 8 to {sigmas[4]:.3g}: keys/values"
    )
    assert low.startswith(f"{HEAD} (Fastest for wan) on the low-noise {part}, 4 steps from sigma {sigmas[4]:.3g} to 0:")
    assert middle.startswith(
        f"{HEAD} (Fastest for wan) on a middle {part}, 4 steps from sigma {sigmas[2]:.3g} to {sigmas[6]:.3g}:"
    )
    assert refiner.startswith(f"{HEAD} (Fast for sdxl) on the low-noise {part}, 2 steps from sigma {sigmas[6]:.3g}")
    assert whole.startswith(f"{HEAD} (Fastest for wan): keys/values")


def test_an_interrupt_leaves_nothing_patched_and_the_next_sampling_is_bitwise(family: str, caplog: Any) -> None:
    model = load_checkpoint(family)
    reference = sample(model, **ARGS[family])

    def interrupt(step: int, *args: Any) -> None:
        if step == 1:
            raise InterruptProcessingException()  # what ComfyUI's progress hook raises after a step

    caplog.set_level(logging.INFO, logger="tome")
    assert steps_reduced("Fastest", family) >= 3  # its window holds step 1 of 4: the second call ran reduced
    with pytest.raises(InterruptProcessingException):
        sample(tome(model, "Fastest"), callback=interrupt, **ARGS[family])
    assert untouched(dm(model))
    assert torch.equal(sample(model, **ARGS[family]), reference)
    ((level, line),) = tome_lines(caplog)
    assert level == "INFO"
    first = "generated tokens merged" if fields("Fastest", family)["mode"] == "merge" else "keys/values"
    assert line.startswith(f"{HEAD} (Fastest for {family}): sampling interrupted after 2 model calls; {first}")


def test_a_failed_sampling_leaves_nothing_patched_and_says_why(caplog: Any) -> None:
    model = load_checkpoint("flux")

    def fail(step: int, *args: Any) -> None:
        raise RuntimeError("out of memory")

    caplog.set_level(logging.INFO, logger="tome")
    with pytest.raises(RuntimeError):
        sample(tome(model), callback=fail)
    assert untouched(dm(model))
    ((level, line),) = tome_lines(caplog)
    assert level == "WARNING" and "sampling failed (RuntimeError) after 1 model call;" in line


# ---------------------------------------------------------------------------------------------- exact where it must be


class ReduceSpy:
    """Records every attention call the adapter hands the core and the keys, values and mask it reduced them to: those
    of `tome_core.reduce_attention`, and of the core's own attention (`tome_core.reduced_attention`, Z-Image and
    Lumina 2), as the block's hook reduced them ([B, H, L, D]: the sequence in dimension 2)."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, int, Any]] = []
        self.masks: list[Any] = []  # the mask of each call, as handed over
        self.real = tome_core.reduce_attention
        self.real_hook = AttentionHook.reduce

    def __call__(
        self, model: Any, key: torch.Tensor, value: torch.Tensor, dim: int, mask: Any = None, *names: str
    ) -> Any:
        seen = len(self.calls)
        out = self.real(model, key, value, dim, mask, *names)
        if len(self.calls) == seen:  # no block's hook took it (recorded there)
            self.record(key, dim, out, mask)
        return out

    def hook(
        self, hook: Any, state: Any, key: torch.Tensor, value: torch.Tensor, dim: int, mask: Any = None, *names: str
    ) -> Any:
        out = self.real_hook(hook, state, key, value, dim, mask, *names)
        self.record(key, dim % key.dim(), out, mask)
        return out

    def record(self, key: torch.Tensor, dim: int, out: Any, mask: Any) -> None:
        self.calls.append((key, dim, out))
        self.masks.append(mask)


@pytest.fixture
def spy(monkeypatch: Any) -> ReduceSpy:
    found = ReduceSpy()
    monkeypatch.setattr(tome_core, "reduce_attention", found)
    monkeypatch.setattr(AttentionHook, "reduce", lambda hook, *args: found.hook(hook, *args))
    return found


@pytest.mark.parametrize(
    ("name", "args", "before", "grid", "after"),
    [
        # Kontext: text (5), the 8x8 image grid, an 8x8-latent reference image (4x4 tokens) after it.
        ("flux", {"ref_latents": [torch.linspace(-1, 1, 64).reshape(1, 1, 8, 8).repeat(1, 4, 1, 1)]}, 5, (8, 8), 16),
        # Wan: the first latent frame (an image-to-video model's reference image, 4x4 tokens) whole, then 4 frames.
        ("wan", ARGS["wan"], 16, (4, 4, 4), 0),
        # SD3: two register tokens and the text (5), then the 8x8 image grid.
        ("sd3", {}, 2 + 5, (8, 8), 0),
        # Z-Image: the text (5) padded to 32 tokens, then the 8x8 image grid.
        ("zimage", {}, 32, (8, 8), 0),
    ],
)
def test_text_and_reference_keys_stay_whole_and_kept_keys_carry_their_own_position(
    spy: ReduceSpy, name: str, args: dict[str, Any], before: int, grid: tuple[int, ...], after: int
) -> None:
    """Every reduced attention call keeps the keys of the text and reference tokens bitwise, and of the generated
    grid one key per 2x2 cell, each bitwise the key of that token (rotary position applied by the model): nothing
    merged, nothing moved."""
    model = load_checkpoint(name)
    seen: list[Any] = []
    callback = lambda *_: seen.append(tome_core.stats(dm(model)))
    sample(tome_advanced(model, mode="kv", sx=2, sy=2, use_rand=False), steps=2, callback=callback, **args)
    reduced = [(key, dim, out) for key, dim, out in spy.calls if out is not None]
    assert reduced and len(reduced) == len(spy.calls) - sum(1 for _, _, out in spy.calls if out is None)
    generated = 1
    for n in grid:
        generated *= n
    kept = generated // 4
    for key, dim, (new_key, new_value, _) in reduced:
        length = key.shape[dim]
        assert length == before + generated + after
        assert new_key.shape[dim] == new_value.shape[dim] == before + kept + after
        head, tail = key.narrow(dim, 0, before), key.narrow(dim, length - after, after)
        assert torch.equal(new_key.narrow(dim, 0, before), head)
        assert torch.equal(new_key.narrow(dim, before + kept, after), tail)
        rows = key.narrow(dim, before, generated).movedim(dim, 0).flatten(1)
        for row in new_key.narrow(dim, before, kept).movedim(dim, 0).flatten(1):
            assert (rows == row).all(dim=1).any()  # the key of one generated token, exactly
    if name == "wan":  # cross-attention to the text passes unchanged
        assert any(out is None and key.shape[dim] == TEXT for key, dim, out in spy.calls)
    if name == "sd3":  # SD3.5 Medium's image-only attention passes unchanged, and is not counted a miss
        assert any(out is None and key.shape[dim] == generated for key, dim, out in spy.calls)
        assert seen and all(s is not None and s.applied == s.selected == 4 and s.grid_misses == 0 for s in seen), seen


def test_captions_of_different_lengths_in_one_batch_keep_each_samples_caption_and_grid(spy: ReduceSpy) -> None:
    """ComfyUI's Lumina 2 batches cond and uncond with captions of 5 and 3 tokens: each sample's joint sequence is its
    caption, its 8x8 image grid, then padding. Every reduced call keeps per sample its own caption's keys and one key
    of its own grid per 2x2 cell, and each mask value moves with the key it masks."""
    sample(tome_advanced(load_checkpoint("lumina2"), mode="kv", sx=2, sy=2), steps=2, **ARGS["lumina2"])
    reduced = [(call, mask) for call, mask in zip(spy.calls, spy.masks) if call[2] is not None]
    assert len(reduced) == 2 * 2  # two main blocks a call, two calls; the refiners' calls pass unchanged
    n = 8 * 8
    for (key, dim, (new_key, _value, new_mask)), mask in reduced:
        length = int(key.shape[dim])
        assert length == max(CAPTIONS) + n and int(new_key.shape[dim]) == max(CAPTIONS) + n // 4
        matches = []  # the slots (which token of each cell) that give every sample's keys and mask of this call
        for slot in range(4):
            tables = [kv_index(c, (1, 8, 8), length - c - n, 1, 2, 2, "cpu", slot) for c in CAPTIONS]
            if all(
                torch.equal(new_key[i], key[i].index_select(dim - 1, index))
                and torch.equal(new_mask[i], mask[i].index_select(-1, index))
                for i, index in enumerate(tables)
            ):
                matches.append(slot)
        assert len(matches) == 1, matches  # one slot for the whole batch: cond and uncond alike


@pytest.mark.parametrize("name", ["flux", "chroma", "wan-i2v", "sd3", "zimage", "lumina2"])
def test_queries_attend_to_the_kept_keys_and_their_own(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every family in ComfyUI: the override hands the core ComfyUI's tensors ([B, H, L, D] or [B, L, H*D]) and
    additive mask, and the core's attention (`tome_core.reduced_attention`) answers every query from its caption's
    and reference keys, the kept key of each cell weighing as the cell's 4 tokens, and its own key: dense attention
    masked and weighted so, per sample (Lumina 2 batches captions of two lengths), in ComfyUI's output layout."""
    seen: list[tuple[Any, ...]] = []
    attend = AttentionHook.attend

    def spy(hook: AttentionHook, state: Any, q: Any, k: Any, v: Any, mask: Any, scale: Any, kernel: Any = None) -> Any:
        out = attend(hook, state, q, k, v, mask, scale, kernel)
        if out is not None:  # not SD3.5 Medium's second attention, over the image alone: left as it is
            seen.append((q, k, v, mask, out, state.draw, state.tokens))
        return out

    monkeypatch.setattr(AttentionHook, "attend", spy)
    family = name.split("-")[0]
    sample(tome_advanced(load_checkpoint(name), mode="kv", sx=2, sy=2), steps=2, **ARGS.get(family, {}))
    assert len(seen) >= 2 * 2  # two blocks or more a call, two calls
    for q, k, v, mask, out, draw, tokens in seen:
        length, n = int(k.shape[2]), math.prod(tokens.grid)
        kept = torch.zeros(q.shape[0], 1, length, length, dtype=torch.bool)
        for i, shift in enumerate(tokens.shift or (0,) * q.shape[0]):
            before = tokens.before + shift
            kept[i, :, :, kv_index(before, tokens.grid, length - before - n, 1, 2, 2, "cpu", int(draw))] = True
        bias = torch.where(kept, math.log(4), -math.inf)  # what each key adds to a query's logit
        bias = torch.where(torch.eye(length, dtype=torch.bool) & ~kept, 0.0, bias)  # the own key counts once
        if mask is not None:
            bias = bias.masked_fill(mask.expand_as(bias) != 0, -math.inf)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


#: ComfyUI's attention functions beside PyTorch's, the library each calls, and the name the log gives its kernel.
KERNEL_PATHS = {
    "attention_sage": ("sageattn", "SageAttention"),
    "attention_flash": ("flash_attn_func", "flash-attn"),
    "attention_xformers": ("memory_efficient_attention_partial", "xformers"),
}


def library_calls(monkeypatch: pytest.MonkeyPatch, function: str) -> list[dict[str, Any]]:
    """ComfyUI runs `function` (as `--use-sage-attention` and the like make it); returns the keywords of every call
    of the kernel library it imports, as they happen."""
    calls: list[dict[str, Any]] = []
    name = KERNEL_PATHS[function][0]
    owner = stub_dit.xformers.ops if function == "attention_xformers" else stub_dit
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    monkeypatch.setattr(stub_dit, "optimized_attention", getattr(stub_dit, function))
    return calls


@pytest.mark.parametrize("function", list(KERNEL_PATHS))
def test_under_sage_flash_and_xformers_queries_keep_their_own_key(
    function: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Issue 58: ComfyUI started with --use-sage-attention (flash, xformers), models in 16 bits: in a reduced block
    ToMe runs the kernel ComfyUI's function would call (the library its module imported), asking for the
    log-sum-exp, over the kept keys, and joins each query's own key; the log names the kernel. The latent is the
    one PyTorch's attention gives with the same combine, to the kernel's rounding."""
    caplog.set_level(logging.INFO, logger="tome")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = sample(tome(load_checkpoint("flux"), "Balanced"))
        calls = library_calls(monkeypatch, function)
        caplog.clear()
        out = sample(tome(load_checkpoint("flux"), "Balanced"))
    asked = [c for c in calls if c.get("return_lse") or c.get("return_attn_probs") or "output_dtype" in c]
    # Balanced for flux subsamples keys/values in 3 blocks (merge mode: the others run merged) in the steps of its
    # window: every one through the kernel, with its log-sum-exp.
    assert "keys/values subsampled (each query's own key kept) in 3 of 4 blocks" in kinds("Balanced", "flux")
    assert len(asked) == 3 * steps_reduced("Balanced", "flux") > 0
    ((_, line),) = tome_lines(caplog)
    kernel = KERNEL_PATHS[function][1]
    assert (
        f"keys/values subsampled (each query's own key kept) in 3 of 4 blocks, text and reference tokens whole, attention by {kernel};"
        in line
    )
    assert (out - reference).abs().max() < 0.05 * reference.abs().max()


def test_where_the_kernel_cannot_take_the_call_comfyuis_function_runs_it_and_the_log_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """SageAttention takes no mask (Lumina 2's captions) and runs no float32: ComfyUI's attention_sage runs those
    calls with the reduced keys/values, as it would have (ignoring the mask; falling back to PyTorch), and the log
    says each query's own key was off there, and why."""
    caplog.set_level(logging.INFO, logger="tome")
    library_calls(monkeypatch, "attention_sage")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sample(tome(load_checkpoint("lumina2"), "Balanced"), **ARGS["lumina2"])
    ((_, line),) = tome_lines(caplog)
    assert (
        ", attention by attention_sage; each query's own key off in 2 of 2: SageAttention takes no attention mask;"
        in line
    )
    assert "(each query's own key kept)" not in line
    caplog.clear()
    sample(tome(load_checkpoint("flux"), "Balanced"))
    ((_, line),) = tome_lines(caplog)
    assert (
        "attention by attention_sage; each query's own key off in 3 of 3: SageAttention does not run float32;" in line
    )


def test_a_kernel_that_fails_on_the_kept_keys_is_logged_and_comfyuis_function_runs_the_call(
    monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="tome")

    def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("Unsupported head_dim: 16")

    monkeypatch.setattr(stub_dit, "sageattn", unsupported)
    monkeypatch.setattr(stub_dit, "optimized_attention", stub_dit.attention_sage)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sample(tome(load_checkpoint("flux"), "Balanced"))
    lines = tome_lines(caplog)
    assert (
        lines[0][0] == "WARNING"
        and "SageAttention failed on the kept keys/values (ValueError: Unsupported head_dim: 16)" in lines[0][1]
    )
    assert sum("failed on the kept keys" in text for _, text in lines) == 1  # once a sampling, not every call
    assert (
        "attention by attention_sage; each query's own key off in 3 of 3: SageAttention failed: ValueError"
        in lines[-1][1]
    )


def test_another_nodes_override_runs_with_the_reduced_keys_and_the_log_names_it(caplog: Any) -> None:
    """An override another node set before ours (ComfyUI's SageAttention 3 node, KJNodes' patches) returns no
    log-sum-exp: it runs every call, with the reduced keys/values in ToMe's blocks, and the log names it and says
    each query's own key was off."""
    caplog.set_level(logging.INFO, logger="tome")

    def sage3_node(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    model = load_checkpoint("flux")
    model.model_options["transformer_options"][ATTENTION_OVERRIDE] = sage3_node
    sample(tome(model, "Balanced"))
    ((_, line),) = tome_lines(caplog)
    name = f"{__name__}.test_another_nodes_override_runs_with_the_reduced_keys_and_the_log_names_it.<locals>.sage3_node"
    assert (
        f", attention by another node's attention override ({name}); each query's own key off in 3 of 3: that override"
        " returns no log-sum-exp;" in line
    )


def test_a_chained_override_is_still_called_with_the_reduced_keys_and_put_back(spy: ReduceSpy) -> None:
    """An override another node set (a SageAttention patch) keeps running every attention call, with the reduced
    keys/values where ToMe reduces; afterwards it is the override of the model again, and ToMe's is gone."""
    lengths: list[int] = []

    def sage_like(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        lengths.append(int(args[1].shape[2 if kwargs.get("skip_reshape") else 1]))
        return func(*args, **kwargs)

    model = load_checkpoint("flux")
    with_sage = model.clone()
    with_sage.model_options["transformer_options"][ATTENTION_OVERRIDE] = sage_like
    sample(with_sage, steps=2)
    plain = list(lengths)
    lengths.clear()
    both = sample(tome(with_sage, "Fastest"), steps=2)
    assert len(lengths) == len(plain) == len(spy.calls)
    assert lengths == [int(out[0].shape[dim]) if out else int(key.shape[dim]) for key, dim, out in spy.calls]
    assert min(lengths) < min(plain)
    passing = model.clone()  # an override that passes every call on, as the chained one should have
    passing.model_options["transformer_options"][ATTENTION_OVERRIDE] = lambda func, *a, **kw: func(*a, **kw)
    assert torch.equal(both, sample(tome(passing, "Fastest"), steps=2))
    # Under another override queries do not keep their own key (its kernel runs), and the log does not claim it.
    assert not torch.equal(both, sample(tome(model, "Fastest"), steps=2))
    assert with_sage.model_options["transformer_options"][ATTENTION_OVERRIDE] is sage_like
    lengths.clear()
    sample(with_sage, steps=2)
    assert lengths == plain


# ---------------------------------------------------------------------------------------------- never silent


def test_a_dit_tome_does_not_reduce_gets_one_warning_naming_its_config_and_class(caplog: Any) -> None:
    model = load_checkpoint("hidream")
    reference = sample(model)
    caplog.set_level(logging.INFO, logger="tome")
    assert torch.equal(sample(tome(model, "Fast")), reference)
    ((level, line),) = tome_lines(caplog)
    assert level == "WARNING"
    assert line.startswith(f"{HEAD}: ComfyUI model HiDream (diffusion model UnknownDiT) is ")
    assert line.endswith("ToMe does nothing, the model runs unchanged")
    assert "Flux.1" in line and "Wan" in line


@pytest.fixture
def teacache_like() -> Iterator[ModelPatcher]:
    """ComfyUI-TeaCache and MagCache replace the Flux model's `forward_orig` (an object patch) with their own loop,
    which calls the blocks without `transformer_options`: ComfyUI's attention then sees no override."""
    model = load_checkpoint("flux")
    module = dm(model)

    def forward_orig(self: Flux, img: Any, img_ids: Any, txt: Any, txt_ids: Any, timesteps: Any, options: Any) -> Any:
        return Flux.forward_orig(self, img, img_ids, txt, txt_ids, timesteps, {})

    module.forward_orig = types.MethodType(forward_orig, module)
    try:
        yield model
    finally:
        del module.forward_orig


def test_a_forward_that_drops_transformer_options_says_tome_could_not_apply(
    teacache_like: ModelPatcher, caplog: Any
) -> None:
    reference = sample(teacache_like)
    caplog.set_level(logging.INFO, logger="tome")
    # Keys/values alone (subsampled through the attention override), in every block and step: nothing runs.
    assert torch.equal(sample(tome_advanced(teacache_like, mode="kv", sx=2, sy=2)), reference)
    assert tome_lines(caplog) == [
        (
            "WARNING",
            f"{HEAD} (custom settings): could not apply in 4 of 4 selected blocks (keys/values subsampled in 0 of 4"
            " blocks): ToMe's attention override was not called: another node replaced the model's forward or"
            " dropped transformer_options (TeaCache, MagCache...); the model ran unchanged",
        )
    ]
    # Flux.1's presets also merge the tokens of their last blocks (block hooks, not the override): those still run,
    # so the model did not run unchanged, and the warning names the blocks that could not apply and those that did.
    caplog.clear()
    assert fields("Balanced", "flux")["mode"] == "merge"
    assert not torch.equal(sample(tome(teacache_like, "Balanced")), reference)
    assert tome_lines(caplog) == [
        (
            "WARNING",
            f"{HEAD} (Balanced for flux): could not apply in 3 of 4 selected blocks (generated tokens merged in 1 of 4"
            " blocks): ToMe's attention override was not called: another node replaced the model's forward or"
            " dropped transformer_options (TeaCache, MagCache...)",
        )
    ]


def test_comfyuis_tome_patch_model_on_a_dit_is_said_to_do_nothing(caplog: Any) -> None:
    def merge(q: Any, k: Any, v: Any, extra: Any) -> Any:
        return q, k, v

    def unmerge(n: Any, extra: Any) -> Any:
        return n

    for fn in (merge, unmerge):
        fn.__module__ = "/opt/ComfyUI/comfy_extras/nodes_tomesd"
    model = load_checkpoint("flux")
    with_builtin = model.clone()
    with_builtin.set_model_attn1_patch(merge)
    with_builtin.set_model_attn1_output_patch(unmerge)
    caplog.set_level(logging.INFO, logger="tome")
    assert torch.equal(sample(tome(with_builtin)), sample(tome(model)))
    assert (
        "WARNING",
        f"{HEAD}: ComfyUI's TomePatchModel is on this model too: it does nothing on a diffusion transformer"
        " (Flux.1); ToMe (Balanced for flux) runs",
    ) in tome_lines(caplog)


@pytest.mark.parametrize(
    ("name", "changes", "named"),
    [
        # The advanced node's defaults are a UNet's settings (merge at ratio 0.5): refused on either DiT, naming a
        # field (which one is the core's rule for that model).
        ("flux", {}, r"TomeConfig\.\w+"),
        ("wan", {}, r"TomeConfig\.\w+"),
        ("flux", {"mode": "kv", "max_downsample": "2"}, r"TomeConfig\.max_downsample=2 does not apply"),
        ("wan", {"mode": "kv", "merge_mlp": True}, r"TomeConfig\.merge_mlp=True does not apply"),
    ],
)
def test_custom_settings_a_dit_cannot_run_are_refused_at_the_node_naming_the_field(
    name: str, changes: dict[str, Any], named: str
) -> None:
    model = load_checkpoint(name)
    with pytest.raises(ValueError, match=named):
        tome_advanced(model, **changes)
    assert model.wrappers == {}


def test_custom_settings_on_a_dit_run_as_set(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="tome")
    model = load_checkpoint("wan")
    window = sample(tome_advanced(model, mode="kv", st=2, block_start=0.5), **ARGS["wan"])
    assert not torch.equal(window, sample(tome_advanced(model, mode="kv", st=2), **ARGS["wan"]))
    assert tome_lines(caplog)[0] == (
        "INFO",
        f"{HEAD} (custom settings): keys/values subsampled (each query's own key kept) in 1 of 3 blocks, text and reference tokens whole,"
        " attention by PyTorch; at 64\u00d764, 17 frames",
    )


def test_flux_blocks_merged_whole_are_named_in_the_log(caplog: Any) -> None:
    """The core's merge mode on a ComfyUI Flux (blocks run on merged generated tokens), beside keys/values
    subsampled outside the window: the log names each kind with the core's own counts; off again, bitwise."""
    model = load_checkpoint("flux")
    reference = sample(model)
    caplog.set_level(logging.INFO, logger="tome")
    merged = sample(tome_advanced(model, mode="merge", ratio=0.75, block_start=0.5, pool_kv=True))
    assert not torch.equal(merged, reference)
    assert tome_lines(caplog) == [
        (
            "INFO",
            f"{HEAD} (custom settings): generated tokens merged in 2 and keys/values subsampled (each query's own key"
            " kept) in 2 of 4 blocks, text and reference tokens whole, attention by PyTorch; at 128\u00d7128",
        )
    ]
    assert torch.equal(sample(model), reference) and untouched(dm(model))


# ---------------------------------------------------------------------------------------------- composing


def easycache_like(model: ModelPatcher) -> ModelPatcher:
    """What ComfyUI's EasyCache node adds (comfy_extras/nodes_easycache.py at a125cd84), reduced to what ToMe can
    observe: an OUTER_SAMPLE wrapper that gives the sampling a fresh copy of the guider's model options (restored
    in `finally`), and a DIFFUSION_MODEL wrapper that skips every other model call of the sampling, returning the
    last call's change added to its input."""
    clone = model.clone()

    def outer(executor: Any, *args: Any, **kwargs: Any) -> Any:
        guider = executor.class_obj
        original = guider.model_options
        guider.model_options = copy_nested_dicts(original)
        guider.model_options["transformer_options"]["easycache_like"] = {"calls": 0, "diff": None}
        try:
            return executor(*args, **kwargs)
        finally:
            guider.model_options = original

    def forward(executor: Any, *args: Any, **kwargs: Any) -> Any:
        x, options = args[0], args[-1]
        state = options["easycache_like"]
        state["calls"] += 1
        if state["calls"] % 2 == 0 and state["diff"] is not None:
            return x + state["diff"]
        out = executor(*args, **kwargs)
        state["diff"] = out - x
        return out

    clone.add_wrapper_with_key(OUTER_SAMPLE, "easycache", outer)
    clone.add_wrapper_with_key(DIFFUSION_MODEL, "easycache", forward)
    return clone


def test_with_easycache_in_either_order_the_image_is_the_same(family: str, caplog: Any) -> None:
    model = load_checkpoint(family)
    cached = sample(easycache_like(model), **ARGS[family])
    caplog.set_level(logging.INFO, logger="tome")
    first = sample(easycache_like(tome(model, "Fast")), **ARGS[family])
    second = sample(tome(easycache_like(model), "Fast"), **ARGS[family])
    assert torch.equal(first, second) and not torch.equal(first, cached)
    lines = tome_lines(caplog)
    assert len(lines) == 2 and lines[0] == lines[1] and lines[0][0] == "INFO"
    assert untouched(dm(model))


def step_cache_from(model: ModelPatcher, first: int, every: int = 1, where: str = DIFFUSION_MODEL) -> ModelPatcher:
    """A step cache as EasyCache and LazyCache run late in a generation: from step `first` on, of each `every` steps
    it runs the model in the first and reuses the last model call's change (added to its input) in the others
    (every=1: in all). `where` it wraps: around the diffusion model's inner forward (EasyCache: the model's forward
    and its hooks still run, its blocks do not) or around the whole model call (APPLY_MODEL, where LazyCache's
    PREDICT_NOISE wrapper sits: the model is not called). Steps are told apart by their sigma."""
    clone = model.clone()
    state: dict[str, Any] = {"sigmas": [], "diff": None}

    def forward(executor: Any, *args: Any, **kwargs: Any) -> Any:
        x = args[0]
        sigma = float((args[1] if where == APPLY_MODEL else args[-1]["sigmas"]).flatten()[0])
        if sigma not in state["sigmas"]:
            state["sigmas"].append(sigma)
        step = state["sigmas"].index(sigma)
        if step >= first and (every == 1 or (step - first) % every):
            return x + state["diff"]
        out = executor(*args, **kwargs)
        state["diff"] = out - x
        return out

    clone.add_wrapper_with_key(where, "step_cache", forward)
    return clone


@pytest.mark.parametrize("where", [DIFFUSION_MODEL, APPLY_MODEL])
def test_a_step_cache_that_reuses_every_windowed_step_is_named_not_the_window(where: str, caplog: Any) -> None:
    """A step cache (EasyCache, LazyCache) that reuses the model's output in every step of the preset's step window
    leaves ToMe nothing to reduce: the log names the cache and the window's steps, as a warning. It said "the step
    window excluded every step" at INFO (LazyCache) or "the model's inputs did not show where the generated tokens
    sit" (EasyCache), where the first are the words for settings whose window holds none of the sampling's steps."""
    preset, steps = "Balanced", 8
    window = [i for i in range(steps) if fields(preset, "flux").get("step_start", 0) <= i / steps]
    assert 0 < len(window) < steps
    caplog.set_level(logging.INFO, logger="tome")
    sample(step_cache_from(tome(load_checkpoint("flux"), preset), first=window[0], where=where), steps=steps)
    ((level, line),) = tome_lines(caplog)
    assert "the step window excluded every step" not in line, line
    assert level == "WARNING" and f"in all {len(window)} steps of the step window" in line and "step cache" in line


def test_an_interrupt_before_the_step_window_says_so_not_that_the_window_excluded_every_step(caplog: Any) -> None:
    """Interrupted before the window's first step, the line says the sampling stopped before it (at INFO, as every
    interrupt); the window holds steps of the sampling, so it excluded none."""
    preset, steps = "Balanced", 8
    first = min(i for i in range(steps) if fields(preset, "flux").get("step_start", 0) <= i / steps)

    def interrupt(step: int, *rest: Any) -> None:
        if step == first - 2:
            raise InterruptProcessingException()

    caplog.set_level(logging.INFO, logger="tome")
    with pytest.raises(InterruptProcessingException):
        sample(tome(load_checkpoint("flux"), preset), steps=steps, callback=interrupt)
    ((level, line),) = tome_lines(caplog)
    assert level == "INFO" and "sampling interrupted after" in line, line
    assert "the sampling stopped before the blocks ran in a step of the step window" in line, line


def test_a_step_cache_that_reuses_some_windowed_steps_says_in_how_many_the_model_ran(caplog: Any) -> None:
    """Where the cache reuses some of the window's steps, the line says in how many of them the model ran (and so
    ToMe reduced), not only its block counts."""
    preset, steps = "Balanced", 8
    window = [i for i in range(steps) if fields(preset, "flux").get("step_start", 0) <= i / steps]
    caplog.set_level(logging.INFO, logger="tome")
    sample(step_cache_from(tome(load_checkpoint("flux"), preset), first=window[0], every=2), steps=steps)
    ((level, line),) = tome_lines(caplog)
    ran = len(window) // 2
    assert level == "INFO" and f"in {ran} of the step window's {len(window)} steps" in line, line
    assert "a step cache reused the model's output in the others" in line, line


class GraphCounter:
    """A torch.compile backend that counts the graphs dynamo hands it and runs each as captured."""

    __name__ = "graph_counter"

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs.append(gm)
        return gm.forward


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_model_compiled_as_an_object_patch_is_reduced_in_the_module_it_runs(caplog: Any) -> None:
    """ComfyUI-TeaCache's CompileModel puts `torch.compile(diffusion_model)` in as an object patch (ComfyUI sets it
    on the model while it is loaded): ToMe patches the module the compiled wrapper runs."""
    model = load_checkpoint("flux")
    eager = sample(reduce_every_call(model, "flux"), steps=3)  # every step reduced: one graph
    counter = GraphCounter()
    compiled = model.clone()
    compiled.add_object_patch("diffusion_model", torch.compile(dm(model), backend=counter))
    original = model.model.diffusion_model
    caplog.set_level(logging.INFO, logger="tome")
    model.model.diffusion_model = compiled.get_model_object("diffusion_model")  # what ComfyUI's loading does
    try:
        out = sample(reduce_every_call(compiled, "flux"), steps=3)
    finally:
        model.model.diffusion_model = original
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5 * float(eager.abs().max()))
    assert len(counter.graphs) == 1
    ((level, line),) = tome_lines(caplog)
    assert level == "INFO" and f"(Fastest for flux): {kinds('Fastest', 'flux')}" in line
    assert untouched(original)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize(
    ("name", "order", "fullgraph"),
    [
        ("flux", "ToMe, then TorchCompileModel", False),  # the node's own arguments (fullgraph off)
        ("flux", "TorchCompileModel, then ToMe", False),
        ("flux", "ToMe, then TorchCompileModel", True),
        ("wan", "TorchCompileModel, then ToMe", True),
        ("zimage", "ToMe, then TorchCompileModel", True),  # each query's own key: the core runs the attention
    ],
)
def test_under_torch_compile_model_in_either_order_the_dit_is_reduced_in_one_graph(
    name: str, order: str, fullgraph: bool, caplog: Any
) -> None:
    """ComfyUI's TorchCompileModel before or after our node: the sampling runs reduced inside one compiled graph
    (equal to eager ToMe), also with fullgraph=True (the override and the core trace without a break)."""
    model = load_checkpoint(name)
    eager = sample(reduce_every_call(model, name), steps=3, **ARGS[name])  # every step reduced: one graph
    counter = GraphCounter()

    def compiled(patcher: ModelPatcher) -> ModelPatcher:
        clone = patcher.clone()
        set_torch_compile_wrapper(clone, counter, fullgraph=fullgraph)
        return clone

    merged = (
        compiled(reduce_every_call(model, name))
        if order.startswith("ToMe")
        else reduce_every_call(compiled(model), name)
    )
    caplog.set_level(logging.INFO, logger="tome")
    out = sample(merged, steps=3, **ARGS[name])
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5 * float(eager.abs().max()))
    assert len(counter.graphs) == 1  # one graph for the whole sampling
    ((level, line),) = tome_lines(caplog)
    assert level == "INFO" and " keys/values subsampled" in line
    assert f"under torch.compile (backend graph_counter{', fullgraph' if fullgraph else ''})" in line
    assert untouched(dm(model))


def test_the_flux_example_workflow_puts_the_tome_node_between_the_model_and_its_sampler() -> None:
    """examples/comfyui_tome_flux.json, dragged into ComfyUI: links consistent, the ToMe node on the KSampler's
    MODEL input, fed by the diffusion-model loader."""
    import json
    from pathlib import Path

    workflow = json.loads((Path(__file__).resolve().parents[1] / "examples" / "comfyui_tome_flux.json").read_text())
    nodes = {node["id"]: node for node in workflow["nodes"]}
    links = {link[0]: link for link in workflow["links"]}
    for node in nodes.values():
        for slot, put in enumerate(node.get("inputs", [])):
            link = links[put["link"]]
            assert (link[3], link[4], link[5]) == (node["id"], slot, put["type"])
        for slot, out in enumerate(node.get("outputs", [])):
            assert all(links[i][1:3] == [node["id"], slot] for i in out["links"])
    (tome,) = [n for n in nodes.values() if n["type"] == "tome_ToMe"]
    (sampler,) = [n for n in nodes.values() if n["type"] == "KSampler"]
    assert links[tome["inputs"][0]["link"]][1] == next(n["id"] for n in nodes.values() if n["type"] == "UNETLoader")
    assert links[sampler["inputs"][0]["link"]][1] == tome["id"]
    assert tome["widgets_values"] == [tome_core.get_preset(tome_core.DEFAULT_PRESET).label]


def test_a_wan22_5b_is_told_from_the_14b_for_its_figures() -> None:
    """Issue 58: ComfyUI's Wan 2.2 TI2V 5B (48 latent channels into its patch embedding) reads the 5B's rows of the
    speed table in the log, a 14B (16 channels, 36 for image-to-video) Wan's; both run Wan's presets."""
    assert tome_core.families.figures_family(stub_dit.WanModel(in_dim=48), "wan") == "wan22-5b"
    assert tome_core.families.figures_family(stub_dit.WanModel(in_dim=16), "wan") == "wan"
    assert tome_core.families.figures_family(stub_dit.WanModel(in_dim=48), "flux") == "flux"


def test_the_log_gives_the_core_s_reasons_for_blocks_not_reached() -> None:
    """Where the core says why planned blocks were not reached (`TomeStats.not_reached`), the log gives that
    instead of the override's usual reason; blocks its reasons leave out still get the usual one. ComfyUI's
    samplings record none today (the override reaches every kernel): the stats are built here."""
    from dataclasses import replace

    from tome_comfy.sampling import explain_dit

    why = "diffusers' attention backend 'flex' calls a kernel ToMe cannot run"
    stats = tome_core.TomeStats(
        mode="kv",
        total=4,
        selected=3,
        planned=3,
        reached=0,
        applied=0,
        unet_calls=2,
        active_calls=2,
        block_calls=6,
        grid_misses=0,
        levels=frozenset(),
        block_levels=frozenset(),
        not_reached=((why, 3),),
    )
    head = "could not apply in 3 of 3 selected blocks (keys/values subsampled in 0 of 4 blocks): "
    assert explain_dit(stats) == f"{head}{why}; the model ran unchanged"
    partly = explain_dit(replace(stats, not_reached=((why, 2),)))
    assert partly == f"{head}{why}; ToMe's attention override was not called: another node replaced the model's" + (
        " forward or dropped transformer_options (TeaCache, MagCache...); the model ran unchanged"
    )


def test_a_split_schedule_counts_each_step_where_it_lies_in_the_whole_schedule(caplog: Any) -> None:
    """Issue 58: Wan 2.2 14B's two samplings of one 8-step schedule, Balanced (from half of the steps on) on both
    experts: the steps the window holds are the generation's last half, all in the low-noise expert (ComfyUI's
    `percent_to_sigma` places each sigma), as a diffusers pipeline running both counts them. Counted within each
    part, the high-noise expert's last two steps (the generation's third and fourth) were reduced too."""
    alone = sample(load_checkpoint("wan"), steps=8, last_step=4, **ARGS["wan"])
    caplog.set_level(logging.INFO, logger="tome")
    high = sample(tome(load_checkpoint("wan"), "Balanced"), steps=8, last_step=4, **ARGS["wan"])
    sample(tome(load_checkpoint("wan", seed=1), "Balanced"), steps=8, start_step=4, **ARGS["wan"])
    assert torch.equal(high, alone)  # the window holds none of the high-noise expert's steps
    (high_level, high_line), (_, low_line) = tome_lines(caplog)
    assert "the step window excluded every step" in high_line and high_level == "INFO"  # the settings, not a failure
    assert "on the low-noise part" in low_line and re.search(
        r"subsampled \(each query's own key kept\) in (\d+) of \1 ", low_line
    )
