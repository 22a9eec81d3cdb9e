"""HunyuanVideo, HunyuanVideo 1.5, LTX-Video and LTX-2 in diffusers (issue 58): what tests/test_core_dit.py checks of
every family runs on their tiny models too (tests/dit_models.py's TINY); here what is their own. LTX's text is
cross-attention's and LTX-2's audio a stream of its own: only the video's self-attention gets fewer keys, every
other attention its own keys exactly; compiled with fullgraph, one graph for a sampling, equal to eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

import tome_core

from dit_models import AUDIO, FRAMES, TEXT, TINY, H, W, run


class Keys(TorchFunctionMode):
    """The key of every scaled_dot_product_attention call, named by the attention module that made it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.running: list[str] = []
        self.seen: list[tuple[str, torch.Tensor]] = []
        names = {module: name for name, module in model.named_modules()}
        self.handles = [
            module.register_forward_pre_hook(lambda m, args: self.running.append(names[m]))
            for module in model.modules()
            if type(module).__name__ in ("LTXAttention", "LTX2Attention")
        ]

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (F.scaled_dot_product_attention, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu):
            self.seen.append((self.running[-1], args[1] if len(args) > 1 else kwargs["key"]))
        return func(*args, **kwargs)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def keys(model: nn.Module, name: str) -> list[tuple[str, torch.Tensor]]:
    recorder = Keys(model)
    try:
        with recorder:
            run(model, TINY[name]())
    finally:
        recorder.close()
    return recorder.seen


@pytest.mark.parametrize("name", ["ltx", "ltx2", "ltx2-keyframe"])
def test_only_the_videos_self_attention_gets_fewer_keys(name: str) -> None:
    """Every attention but the video's self-attention (`attn1`) keeps its keys: LTX's cross-attention to the text,
    and LTX-2's audio self-attention, its cross-attention to the text, and the attention between video and audio
    (the audio's queries over the video's keys included: the audio stream is never reduced)."""
    tiny = TINY[name]()
    model = tiny.build()
    full = keys(model, name)
    tome_core.apply_patch(model, sx=2, sy=2)
    reduced = keys(model, name)
    tome_core.remove_patch(model)
    assert [n for n, _ in reduced] == [n for n, _ in full]
    kept = tiny.before + tiny.after + tiny.grid[0] * (H // 2) * (W // 2)
    video = tiny.before + tiny.after + tiny.grid[0] * H * W
    lengths = {n.split(".")[-1]: (k.shape[-2], r.shape[-2]) for (n, k), (_, r) in zip(full, reduced)}
    assert lengths.pop("attn1") == (video, kept)
    assert lengths.pop("attn2") == (TEXT, TEXT)
    if name.startswith("ltx2"):
        assert lengths == {
            "audio_attn1": (AUDIO, AUDIO),
            "audio_attn2": (TEXT, TEXT),
            "audio_to_video_attn": (AUDIO, AUDIO),  # the video's queries over the audio's keys
            "video_to_audio_attn": (video, video),  # the audio's queries over the video's keys
        }
    # The text's keys in every block, and the first block's audio before the streams meet: bitwise the unpatched.
    same = [n for n, _ in full if n.endswith("attn2") or n == "transformer_blocks.0.audio_attn1"]
    assert same and all(torch.equal(k, r) for (n, k), (_, r) in zip(full, reduced) if n in same)


def test_the_condition_pipelines_coordinates_place_the_grid_after_the_conditions_ahead_of_it() -> None:
    """LTX-Video's condition pipeline passes no `num_frames`: `video_coords` place the generated grid, read once per
    coordinates tensor (the pipeline makes one per generation)."""
    tiny = TINY["ltx-condition"]()
    model = tiny.build()
    tome_core.apply_patch(model, sx=2, sy=2)
    inputs = tiny.inputs(0)
    state = next(v for v in vars(model).values() if isinstance(v, tome_core.dit.DitState))
    seen: list[Any] = []
    model.register_forward_pre_hook(lambda m, a, k: seen.append(state.tokens), with_kwargs=True)
    for _ in range(2):
        with torch.no_grad():
            model(**inputs)
    tome_core.remove_patch(model)
    assert seen == [tome_core.Tokens(2 * H * W, (FRAMES - 1, H, W), 0)] * 2
    assert len(state.memo) == 1  # read back once, at the first call
