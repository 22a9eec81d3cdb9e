"""The lab's diffusion transformers: the stand-ins attend like trained models (by content, not uniformly), the
panel runs its references beside the presets, and the GPU estimate traces the full-size configs' way of calling."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import tome_core
from tome_bench import dit_archs, dit_standin

#: The stand-in's Flux.1 at a test's size: the same surgery on two blocks a stream and a 12 x 12 grid.
TINY_FLUX = replace(
    dit_standin.FAMILIES["flux"],
    config={**dit_standin.FAMILIES["flux"].config, "num_layers": 1, "num_single_layers": 1},
    latent=(16, 24, 24),
)


class Entropy(TorchFunctionMode):
    """The mean entropy of each self-attention call's weights, as a share of log N."""

    def __init__(self) -> None:
        super().__init__()
        self.shares: list[float] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k = (args[0], args[1]) if len(args) > 1 else (kwargs["query"], kwargs["key"])
            weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
            entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1).mean()
            self.shares.append(float(entropy) / math.log(k.shape[-2]))
        return func(*args, **kwargs)


def entropy(sharpness: float | None) -> float:
    model = dit_standin.build(TINY_FLUX, sharpness)
    with Entropy() as seen:
        dit_standin.one_call(model, TINY_FLUX, 0)
    return sum(seen.shares) / len(seen.shares)


def test_the_stand_in_attends_by_content_where_random_weights_attend_uniformly() -> None:
    random, stand_in, sharper = entropy(None), entropy(0.85), entropy(1.0)
    assert random > 0.85  # nearly uniform: subsampling keys/values would look free
    assert sharper < stand_in < random - 0.1


def test_the_panel_runs_the_references_beside_the_presets() -> None:
    names = [v.name for v in dit_standin.variants("flux", (1024, 1024, 1), {"balanced": 1.2})]
    assert names[:4] == [p.name for p in tome_core.presets()]
    assert "naive port (kv 2x2, every block)" in names and "fewer steps (balanced's 1.20x)" in names


def test_the_estimate_traces_a_dit_call_and_each_preset_saves_work() -> None:
    """The meta trace of the tiny Flux.1 the GPU job's dry run uses: every preset patches it (its ids read on the
    CPU), saves estimated GPU work, and adds few launching operations."""
    rows = dit_archs.estimate_rows(dit_archs.DIT_ARCHS["flux-tiny"], ["balanced", "fastest"])
    assert [r.variant for r in rows] == ["balanced", "fastest"]
    assert all(r.flops < r.base_flops for r in rows)


@pytest.mark.parametrize("name", sorted(dit_archs.TABLE_ARCH.values()))
def test_the_full_size_configs_build_on_the_meta_device(name: str) -> None:
    arch = dit_archs.DIT_ARCHS[name]
    model = arch.build()
    assert tome_core.model_family(model) == arch.family
    assert sum(p.numel() for p in model.parameters()) > 1e9  # the full-size model, not a reduced one
