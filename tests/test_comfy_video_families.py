"""The ComfyUI nodes on HunyuanVideo and LTX-Video (issue 58), driven through ComfyUI-shaped stand-ins whose classes
carry ComfyUI's module names (tests/comfy_stub/dit.py: `HunyuanVideo`, `LTXVModel`): every preset changes the
output and the model is bitwise its own without the node; the text, a reference latent, the first latent frame and
LTXVAddGuide's guide frames keep every key, the generated grid one key per cell, each the model's own; LTX-Video's
cross-attention to the text passes unchanged; HunyuanImage 2.1 (the same class, 2-D) is not taken for a video."""

from __future__ import annotations

import logging
from typing import Any

import comfy_stub.dit as stub_dit
import pytest
import torch
from comfy_stub.patcher import ModelPatcher
from comfy_stub.sampling import BaseModel, latent_format, sample

import tome_core
from tome_comfy import NODE_CLASS_MAPPINGS
from tome_comfy.inputs import advanced_widgets
from tome_comfy.nodes import TOME_ADVANCED_NODE, TOME_NODE
from tome_core.dit import AttentionHook

PRESETS = [p.label for p in tome_core.presets()]
TEXT = 5  # the stand-in sampler's text tokens (tests/comfy_stub/sampling.py `sample`)
FRAMES, SIZE = 5, 8  # a 5-frame 8x8 latent: HunyuanVideo 4x4 patches a frame, LTXV 8x8 tokens


class HunyuanVideo:
    """`comfy.supported_models.HunyuanVideo`: only the class name matters to the nodes."""


class LTXV:
    """`comfy.supported_models.LTXV`."""


#: name -> (diffusion model class, model config, the model's timestep per sigma at the stand-in's sigmas up to 8):
#: HunyuanVideo a flow model (1000 * sigma), LTXV a FLUX-type one (sigma; the model scales it by 1000 itself).
MODELS: dict[str, tuple[type, type, float]] = {
    "hunyuanvideo": (stub_dit.HunyuanVideo, HunyuanVideo, 1000 / 8),
    "ltx": (stub_dit.LTXVModel, LTXV, 1 / 8),
}


def load(name: str, seed: int = 0) -> ModelPatcher:
    cls, config, per_sigma = MODELS[name]
    return ModelPatcher(BaseModel(stub_dit._seeded(cls, seed), config(), latent_format("X"), per_sigma))


def tome(model: ModelPatcher, preset: str = "Balanced") -> ModelPatcher:
    return NODE_CLASS_MAPPINGS[TOME_NODE]().patch(model, preset)[0]


def tome_advanced(model: ModelPatcher, **changes: Any) -> ModelPatcher:
    values = {w.name: w.default for w in advanced_widgets()}
    return NODE_CLASS_MAPPINGS[TOME_ADVANCED_NODE]().patch(model, **{**values, **changes})[0]


def untouched(module: torch.nn.Module) -> bool:
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in module.modules())
    return (
        hooks == 0 and not tome_core.is_patched(module) and not any("forward" in m.__dict__ for m in module.modules())
    )


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_each_preset_changes_the_output_and_without_the_node_it_is_bitwise_the_reference(
    name: str, preset: str, caplog: Any
) -> None:
    model = load(name)
    reference = sample(model, frames=FRAMES, size=SIZE)
    caplog.set_level(logging.INFO, logger="tome")
    merged = sample(tome(model, preset), frames=FRAMES, size=SIZE)
    assert not torch.equal(merged, reference)
    assert torch.equal(sample(model, frames=FRAMES, size=SIZE), reference)
    assert untouched(model.model.diffusion_model)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "tome"]
    assert f"({preset} for {name}): keys/values subsampled" in line, line


class Calls:
    """Every attention call the core's hook was handed: (key, its sequence dimension, what `reduce` returned)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[torch.Tensor, int, Any]] = []
        real = AttentionHook.reduce

        def spy(hook: AttentionHook, state: Any, key: torch.Tensor, value: torch.Tensor, dim: int, *rest: Any) -> Any:
            out = real(hook, state, key, value, dim, *rest)
            self.calls.append((key, dim % key.dim(), out))
            return out

        monkeypatch.setattr(AttentionHook, "reduce", spy)


def guide() -> torch.Tensor:
    """[1, 3, 64] LTXVAddGuide's pixel coordinates (frame, row, column) of one guide frame of 8x8 tokens at frame 16."""
    rows, columns = torch.meshgrid(torch.arange(SIZE) * 32.0, torch.arange(SIZE) * 32.0, indexing="ij")
    return torch.stack([torch.full((SIZE, SIZE), 16.0), rows, columns]).flatten(1)[None]


@pytest.mark.parametrize(
    ("name", "args", "before", "grid", "after"),
    [
        # HunyuanVideo: a reference latent (one frame, 4x4 tokens) and the first latent frame whole, 4 frames of 4x4,
        # then the text (its last two tokens padding, masked).
        (
            "hunyuanvideo",
            {
                "frames": FRAMES,
                "ref_latent": torch.linspace(-1, 1, 64).reshape(1, 1, 1, 8, 8).repeat(1, 4, 1, 1, 1),
                "attention_mask": torch.tensor([[1, 1, 1, 0, 0]]),
            },
            16 + 16,
            (4, 4, 4),
            TEXT,
        ),
        # LTXV: the first latent frame whole, 4 frames of 8x8, then a guide frame appended in time, whole.
        ("ltx", {"latent": torch.zeros(1, 4, FRAMES + 1, SIZE, SIZE), "keyframe_idxs": guide()}, 64, (4, 8, 8), 64),
    ],
)
def test_text_reference_and_guide_keys_stay_whole_and_kept_keys_are_the_models_own(
    monkeypatch: pytest.MonkeyPatch, name: str, args: dict[str, Any], before: int, grid: tuple[int, ...], after: int
) -> None:
    spy = Calls(monkeypatch)
    sample(tome_advanced(load(name), mode="kv", sx=2, sy=2), steps=2, size=SIZE, **args)
    reduced = [(key, dim, out) for key, dim, out in spy.calls if out is not None]
    generated = grid[0] * grid[1] * grid[2]
    kept = generated // 4
    assert len(reduced) == 2 * (4 if name == "hunyuanvideo" else 2)  # two steps (cond and uncond one call), every block
    for key, dim, (new_key, new_value, _mask) in reduced:
        length = key.shape[dim]
        assert length == before + generated + after
        assert new_key.shape[dim] == new_value.shape[dim] == before + kept + after
        assert torch.equal(new_key.narrow(dim, 0, before), key.narrow(dim, 0, before))
        assert torch.equal(new_key.narrow(dim, before + kept, after), key.narrow(dim, length - after, after))
        rows = key.narrow(dim, before, generated).movedim(dim, 0).flatten(1)
        for row in new_key.narrow(dim, before, kept).movedim(dim, 0).flatten(1):
            assert (rows == row).all(dim=1).any()  # the key of one generated token, exactly
    if name == "ltx":  # cross-attention to the text is not the hooked self-attention: it never reaches `reduce`
        assert all(key.shape[dim] != TEXT for key, dim, _ in spy.calls)


def test_hunyuanimage_on_the_same_class_is_not_taken_for_a_video() -> None:
    """HunyuanImage 2.1 runs on HunyuanVideo's class with a 2-D patch: no layout describes it (yet), so the node
    leaves it alone rather than reading its image as a video."""
    image = stub_dit._seeded(lambda: stub_dit.HunyuanVideo(patch=(1, 2)), 0)
    assert tome_core.find_layout(image) is None
    assert tome_core.find_layout(stub_dit._seeded(stub_dit.HunyuanVideo, 0)).family == "hunyuanvideo"
