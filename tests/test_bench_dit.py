"""The lab's diffusion transformers: the stand-ins attend like trained models (by content, not uniformly), the
panel runs its references beside the presets, and the GPU estimate traces the full-size configs' way of calling."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import tome_core
from tome_bench import dit_archs, dit_fidelity, dit_standin
from tome_bench.gpu_estimate import GPUS, trace
from tome_core import figures
from tome_core.families import DIT_FAMILIES, FIGURES_FAMILIES, figures_family

ROOT = Path(__file__).resolve().parents[1]

#: The config keys of each family's block counts.
_BLOCKS = ("num_layers", "num_single_layers", "n_layers", "n_refiner_layers", "num_refiner_layers")
#: The families the panel gained after Flux.1 and Wan.
NEW = ("chroma", "flux2", "qwen", "zimage", "lumina2", "sd3")
#: The video families it gained with issue 58: HunyuanVideo (its text joint in the sequence, after the video),
#: LTX-Video (its text cross-attended, one latent cell a token) and LTX-2 (LTX-Video's layout and an audio stream).
VIDEO = ("hunyuanvideo", "ltx", "ltx2")


def tiny(name: str) -> dit_standin.Family:
    """A stand-in family at a test's size: the same surgery on one block of each kind and a 12 x 12 grid (of each
    frame of a video)."""
    family = dit_standin.FAMILIES[name]
    blocks = {key: 1 for key in _BLOCKS if key in family.config}
    side = 12 * family.patch
    return replace(family, config={**family.config, **blocks}, latent=(*family.latent[:-2], side, side))


TINY_FLUX = tiny("flux")


class Entropy(TorchFunctionMode):
    """The mean entropy of each self-attention call's weights, as a share of log N."""

    def __init__(self) -> None:
        super().__init__()
        self.shares: list[float] = []
        self.tied: list[bool] = []  # per self-attention call (as many keys as queries): whether they are equal

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k = (args[0], args[1]) if len(args) > 1 else (kwargs["query"], kwargs["key"])
            weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
            entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1).mean()
            self.shares.append(float(entropy) / math.log(k.shape[-2]))
            if q.shape[-2] == k.shape[-2]:
                self.tied.append(torch.equal(q, k))
        return func(*args, **kwargs)


def entropy(sharpness: float | None, family: dit_standin.Family = TINY_FLUX) -> float:
    model = dit_standin.build(family, sharpness)
    with Entropy() as seen:
        dit_standin.one_call(model, family, 0)
    return sum(seen.shares) / len(seen.shares)


def test_the_stand_in_attends_by_content_where_random_weights_attend_uniformly() -> None:
    random, stand_in, sharper = entropy(None), entropy(0.85), entropy(1.0)
    assert random > 0.85  # nearly uniform: subsampling keys/values would look free
    assert sharper < stand_in < random - 0.1


@pytest.mark.parametrize("name", NEW + VIDEO)
def test_every_attention_of_the_stand_in_compares_tokens_with_one_projection(name: str) -> None:
    """Each family's surgery finds the query/key projections of every attention module (separate, fused with the
    MLP as in Flux.2's single blocks, or one key head to three query heads as in Lumina 2): in each self-attention
    call the keys equal the queries, and attention is sharper than with random weights."""
    family = tiny(name)
    model = dit_standin.build(family, None)
    assert tome_core.model_family(model) == name
    named = [(n, m) for n, m in model.named_modules() if hasattr(m, "processor")]
    # LTX-2's attention between its video and audio streams reads queries and keys of two widths: left as built.
    between = sum(n.endswith(("audio_to_video_attn", "video_to_audio_attn")) for n, _ in named)
    # Cross-attention (LTX-Video's attn2: text keys, fewer than its queries) is tied too but is no self-attention call.
    crossed = sum(n.endswith("attn2") for n, _ in named)
    assert dit_standin.surgery(model, family, 0.85) == len(named) - between
    with Entropy() as seen:
        dit_standin.one_call(model, family, 0)
    assert len(seen.tied) == len(named) - between - crossed and all(seen.tied)
    assert entropy(0.85, family) < entropy(None, family) - 0.1


@pytest.mark.parametrize("name", list(dit_standin.FAMILIES))
def test_every_stand_in_s_blocks_change_the_stream_as_much(name: str) -> None:
    """Each family's stand-in blocks change their residual stream by BLOCK_UPDATE on average (as built, Flux.1's add
    2-3% and Chroma's, the same blocks, 15-25%: a stand-in that passes its input through makes any change inside
    attention look free); the random model is left as built."""
    family = tiny(name)
    seen = dit_standin.updates(dit_standin.build(family, 0.85), family)
    random = dit_standin.build(family, None)
    assert len(seen) == len(dit_standin.blocks(random))
    assert sum(seen) / len(seen) == pytest.approx(dit_standin.BLOCK_UPDATE, rel=0.05)
    assert not any(block._forward_hooks for block in dit_standin.blocks(random))


@pytest.mark.parametrize("name", NEW + VIDEO)
def test_a_stand_in_generates_and_every_preset_comes_off_exactly(name: str) -> None:
    """One call and a generation as the family's pipeline runs them; each preset applies, generates, and once
    removed leaves the model's output bit for bit as it was; the naive port changes it."""
    family = tiny(name)
    model = dit_standin.build(family, 0.85)
    base = dit_standin.one_call(model, family, 0)
    assert base.shape == (1, *family.latent) and bool(base.isfinite().all())
    assert bool(dit_standin.generate(model, family, 2, 0).isfinite().all())
    for preset in tome_core.presets():
        tome_core.apply_patch(model, preset=preset.name)
        assert bool(dit_standin.generate(model, family, 2, 0).isfinite().all())
        tome_core.remove_patch(model)
        assert torch.equal(dit_standin.one_call(model, family, 0), base)
    tome_core.apply_patch(model, mode="kv", sx=2, sy=2)
    assert dit_standin.change(dit_standin.one_call(model, family, 0), base) > 0
    tome_core.remove_patch(model)
    assert torch.equal(dit_standin.one_call(model, family, 0), base)


@pytest.mark.parametrize("name", VIDEO)
def test_a_video_stand_in_is_fed_as_its_diffusers_pipeline_feeds_it(name: str) -> None:
    """The timestep the pipeline passes (its flow-matching scheduler's, sigma * 1000), HunyuanVideo's embedded
    guidance (the pipeline's default guidance scale, times 1000), LTX-Video's latent packed into tokens and back by
    the pipeline's own methods at its rotary scale (8 frames and 32 px per latent cell, over the default frame rate);
    the velocity is the model's output as it is (both pipelines step their scheduler with it, not negated)."""
    import inspect

    from diffusers import HunyuanVideoPipeline, LTX2Pipeline, LTXPipeline

    family = tiny(name)
    model = dit_standin.build(family, None)
    seen: dict[str, Any] = {}
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: seen.update(kwargs), with_kwargs=True)
    noise, natural, text = dit_standin.sample_inputs(family, 0)
    latent = 0.7 * noise + 0.3 * natural
    with torch.no_grad():
        out = dit_standin.call(model, family, latent, 0.3, text)
        handle.remove()
        raw = model(**seen)[0]
    assert seen["timestep"].tolist() == pytest.approx([300.0])
    if name == "hunyuanvideo":
        scale = inspect.signature(HunyuanVideoPipeline.__call__).parameters["guidance_scale"].default
        assert seen["guidance"].tolist() == [scale * 1000]
        assert torch.equal(seen["hidden_states"], latent) and torch.equal(out, raw)
    else:
        pipeline = LTXPipeline if name == "ltx" else LTX2Pipeline
        rate = inspect.signature(pipeline.__call__).parameters["frame_rate"].default
        if name == "ltx":
            assert tuple(seen["rope_interpolation_scale"]) == pytest.approx((8 / rate, 32, 32))
        else:  # LTX-2: the frame rate, `sigma` as the timestep, audio as long as the video's 33 frames (25 a second)
            assert seen["fps"] == rate and seen["sigma"].tolist() == pytest.approx([300.0])
            assert seen["audio_hidden_states"].shape[1] == seen["audio_num_frames"] == round(33 / rate * 25)
        assert torch.equal(seen["hidden_states"], pipeline._pack_latents(latent, 1, 1))
        f, h, w = family.grid
        assert (seen["num_frames"], seen["height"], seen["width"]) == (f, h, w)
        assert torch.equal(out, pipeline._unpack_latents(raw, f, h, w, 1, 1))


@pytest.mark.parametrize("name", list(dit_standin.FAMILIES))
def test_every_family_has_a_step_saving_reference_per_preset_at_the_size_users_run(name: str) -> None:
    # A video family's step saving is its presets' speed-up on a video (HunyuanVideo's Balanced: 1.27x at most at
    # 1024², 1.47x at 1280 x 720 x 129).
    assert (dit_fidelity.SIZES[name][2] > 1) == (len(dit_standin.FAMILIES[name].latent) == 4)
    names = [v.name for v in dit_fidelity.variants(name, dit_fidelity.SIZES[name])]
    assert sum(n.startswith("fewer steps") for n in names) == len(tome_core.presets())


def test_the_panel_runs_the_references_beside_the_presets() -> None:
    names = [v.name for v in dit_fidelity.variants("flux", (1024, 1024, 1), {"balanced": 1.2})]
    assert names[:4] == [p.name for p in tome_core.presets()]
    assert "naive port (kv 2x2, every block)" in names and "fewer steps (balanced's 1.20x)" in names


def test_the_estimate_traces_a_dit_call_and_each_preset_saves_work() -> None:
    """The meta trace of the tiny Flux.1 the GPU job's dry run uses: every preset patches it (its ids read on the
    CPU), saves estimated GPU work, and adds few launching operations."""
    rows = dit_archs.estimate_rows(dit_archs.DIT_ARCHS["flux-tiny"], ["balanced", "fastest"])
    assert [r.variant for r in rows] == ["balanced", "fastest"]
    assert all(r.flops < r.base_flops for r in rows)


@pytest.mark.parametrize("family", list(dit_archs.TABLE_ARCH))
def test_every_family_s_presets_stay_within_the_launching_budget(family: str) -> None:
    """Every family on its full-size config at the size its presets were chosen at (1024² for images), H200 estimate, each query keeping its own key (five more
    kernels in each reduced block, `AttentionHook.attend`): the launching operations every preset adds cost no time
    in an eager call (issue 57: priced as host time against the call's GPU time, the host's launches hide behind
    the GPU's work, `EstimateRow.hidden`) or are at most 10% more; every preset holds no more memory at its peak
    than the unpatched call (the trace's live tensors) but the patch's index tables (+0.005% at most), and each saves
    more GPU work than the one before."""
    arch = dit_archs.DIT_ARCHS[dit_archs.TABLE_ARCH[family]]
    rows = dit_archs.estimate_rows(arch, [p.name for p in tome_core.presets()], sizes=[dit_archs.chosen_at(family)])
    assert all(r.hidden or r.ops_added <= 0.10 for r in rows), [
        (r.variant, f"{r.ops_added:+.1%}", f"host {r.host_ms:.1f} ms for {r.gpu_ms:.1f} ms of GPU work") for r in rows
    ]
    assert all(0 < r.peak_bytes <= r.base_peak_bytes * 1.0001 for r in rows), [(r.variant, r.peak_ratio) for r in rows]
    speedups = [r.speedup for r in rows]
    assert speedups[0] > 1 and speedups == sorted(set(speedups)), speedups


@pytest.mark.parametrize("name", sorted(dit_archs.TABLE_ARCH.values()))
def test_the_full_size_configs_build_on_the_meta_device(name: str) -> None:
    arch = dit_archs.DIT_ARCHS[name]
    model = arch.build()
    assert tome_core.model_family(model) == arch.family
    assert sum(p.numel() for p in model.parameters()) > 1e9  # the full-size model, not a reduced one


def test_wan22_5b_is_a_wan_to_the_core_and_gets_its_pipeline_s_timestep_per_token() -> None:
    """Wan 2.2 TI2V 5B (48 latent channels, 16x VAE): the core reduces it as a Wan, and its estimate's inputs are
    its pipelines' (`expand_timesteps`): a timestep per token [B, F*H*W] of the grid at 1280x704, 121 frames."""
    arch = dit_archs.DIT_ARCHS["wan22-5b"]
    model = arch.build()
    assert tome_core.model_family(model) == "wan" and arch.family == "wan"
    assert 4e9 < sum(p.numel() for p in model.parameters()) < 6e9
    inputs = arch.inputs((1280, 704, 121))
    assert inputs["hidden_states"].shape == (1, 48, 31, 44, 80)
    assert inputs["timestep"].shape == (1, 31 * 22 * 40)
    # the "wan" rows are the 14B's (one architecture a family's rows); the 5B's are its own (`figures_family`)
    assert dit_archs.TABLE_ARCH["wan"] == "wan-14b" and dit_archs.TABLE_ARCH["wan22-5b"] == "wan22-5b"


@pytest.mark.parametrize("name", list(dit_standin.FAMILIES))
def test_every_stand_in_s_output_depends_on_the_time(name: str) -> None:
    """A trained model's velocity at sigma 0.2 is not its velocity at 0.5. With random weights Lumina 2's time
    embedding (sinusoids of its time in [0, 1]) barely moved the output (1.7% on the full stand-in, 22-59% in the
    other families), so dropping a step changed a generation by 0.1%: its stand-in reads the time as Z-Image's model
    does (`Family.time_scale`)."""
    family = tiny(name)
    model = dit_standin.build(family, 0.85)
    noise, natural, text = dit_standin.sample_inputs(family, 0)
    latent = 0.5 * noise + 0.5 * natural
    with torch.no_grad():
        at = {sigma: dit_standin.call(model, family, latent, sigma, text) for sigma in (0.2, 0.5)}
    # One block of each kind, a 12 x 12 grid: 0.06 (Lumina 2) to 0.36 (Chroma) apart; Lumina 2 as built: 0.004.
    assert dit_standin.change(at[0.2], at[0.5]) > 0.04


def test_a_fused_rms_norm_counts_as_the_one_kernel_cuda_launches() -> None:
    """torch.nn.RMSNorm (F.rms_norm) is one `_fused_rms_norm` kernel on CUDA where the meta device runs eight
    operations; a norm written out by hand (diffusers' RMSNorm) launches its operations on a GPU too."""
    x = torch.empty(2, 16, 64, device="meta", dtype=torch.float16)
    norm = torch.nn.RMSNorm(64, device="meta", dtype=torch.float16)
    fused, _ = trace(lambda: norm(x))
    assert [op.name for op in fused.ops] == ["rms_norm"] and fused.launching == 1
    assert fused.ops[0].bytes == 2 * x.numel() * 2 + 64 * 2  # the input, the output, the weight
    by_hand, _ = trace(lambda: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype))
    assert by_hand.launching > 4


def test_the_host_time_per_launch_is_the_profiles() -> None:
    """`GpuSpec.host_us` is the median host time per aten operation of the profiled eager calls the host bounded
    (wall clock over 1.5x the GPU's busy time): the H200 run of 2026-11-27."""
    rows = json.loads((ROOT / "docs/runs/2026-11-27-h200/gpu.json").read_text())["rows"]
    bound = [
        1e3 * r["wall_ms"] / r["aten_calls_per_call"]
        for r in rows
        if r.get("part") == "eager" and r.get("wall_ms") and r["wall_ms"] > 1.5 * r["gpu_busy_ms"]
    ]
    assert len(bound) > 20 and GPUS["h200"].host_us == pytest.approx(statistics.median(bound), abs=0.01)


def test_every_family_has_table_figures_or_says_why_not() -> None:
    """Every family's presets have rows in the speed table, or the lab says why not; an architecture with figures of
    its own (Wan 2.2 5B) has rows under its own key and is its family's model to the core."""
    figures_only = set(FIGURES_FAMILIES)
    assert {f.name for f in DIT_FAMILIES} == (set(dit_archs.TABLE_ARCH) - figures_only) | set(dit_archs.NOT_ESTIMATED)
    for key, family in FIGURES_FAMILIES.items():
        arch = dit_archs.DIT_ARCHS[dit_archs.TABLE_ARCH[key]]
        assert arch.family == family and figures_family(arch.build(), family) == key


def test_a_wan22_5b_reads_its_own_figures() -> None:
    """Issue 58: a Wan 2.2 5B at its size reads the 5B's speed-up, not the 14B's, which has 4x the tokens there."""
    five, fourteen = (figures.speed(key, "balanced", 1280, 704, 121) for key in ("wan22-5b", "wan"))
    assert five is not None and fourteen is not None and five.exact
    # The share of the time each saves (a step window saves in its steps alone, the same share of them for both).
    assert 1 - 1 / five.speedup < 0.8 * (1 - 1 / fourteen.speedup), (five.speedup, fourteen.speedup)
