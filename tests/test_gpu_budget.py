"""Every preset is lean on a GPU's host: at most 10% more kernel-launching operations per UNet call than the
unpatched UNet, on the real SD1.5 and SDXL architectures (diffusers configs, fp16, batch 2).

Eager on a fast GPU below 2048 px a call's wall clock follows how many kernels Python dispatches, so this bound
keeps every preset within a few percent of the unpatched call where the host bounds it. Counted on a meta-device
trace (`tome_bench.gpu_estimate`: no weights, no arithmetic, seconds for SDXL); views and allocations launch
nothing, SDPA is one kernel as on a GPU.
"""

from __future__ import annotations

import pytest

import tome_core
from tome_bench.gpu_estimate import meta_unet, trace_call

#: The most kernel-launching operations a preset may add, as a share of the unpatched call's.
OPS_BUDGET = 0.10
SIZES = {"sd15": (512, 768, 1024), "sdxl": (1024,)}


@pytest.fixture(scope="module")
def unets() -> dict[str, object]:
    return {arch: meta_unet(arch) for arch in SIZES}


@pytest.mark.parametrize("preset", [p.name for p in tome_core.presets()])
@pytest.mark.parametrize(("arch", "size"), [(a, s) for a, sizes in SIZES.items() for s in sizes])
def test_preset_adds_at_most_a_tenth_more_launching_ops(unets: dict, arch: str, size: int, preset: str) -> None:
    unet = unets[arch]
    base = trace_call(unet, arch, size)
    ours = trace_call(unet, arch, size, lambda u: tome_core.apply_patch(u, preset=preset))
    added = ours.launching / base.launching - 1
    assert ours.launching > base.launching  # the preset merges at all
    assert added <= OPS_BUDGET, (
        f"{preset} on {arch} at {size} px adds {ours.launching - base.launching} ops (+{100 * added:.1f}%):"
        f" {sorted((ours.names() - base.names()).items(), key=lambda kv: -kv[1])}"
    )


def test_the_trace_counts_what_a_gpu_launches(unets: dict) -> None:
    # The unpatched SD1.5 call: SDPA as one fused kernel per attention (32), every convolution and linear layer
    # once, and no view, allocation or no-op copy.
    tr = trace_call(unets["sd15"], "sd15", 512)
    names = tr.names()
    assert names["attention"] == 32
    assert names["convolution"] == 98
    assert names["addmm"] + names["mm"] == 184
    assert not {"view", "empty", "transpose", "_safe_softmax", "dropout"} & set(names)
    assert tr.kernels > tr.launching  # a convolution's bias is a kernel of its own, dispatched with it
