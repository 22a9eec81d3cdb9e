"""The lab's trained Wan-class video model (issue 57): the committed weights predict the flow on the committed
evaluation clips far better than an untrained model, its attention falls off with distance in space and in time (as
Radial Attention, arXiv 2506.19852, finds on trained video DiTs), and the run's trained-fidelity.json holds the
figures the panel computes. Nothing here needs scikit-image or trains the model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tome_core
from tome_bench import attention_profile, trained_dit, trained_fidelity, trained_video
from tome_core import figures
from tome_core.patch import STATE_ATTR

RUN = Path(__file__).resolve().parents[1] / "docs" / "runs" / "2026-12-06-trained-video"
#: The fidelity figures are relative L2 distances of float32 generations from the same noise: they agree far below.
TOLERANCE = 1e-3


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model() -> trained_video.TrainedWan:
    return trained_video.load()


def test_the_weights_are_fp16_and_at_most_16_mb() -> None:
    assert trained_video.WEIGHTS.stat().st_size <= 16 * 2**20
    assert {t.dtype for t in load_file(str(trained_video.WEIGHTS)).values()} == {torch.float16}
    assert trained_video.EVAL.stat().st_size <= 2**20


def test_the_held_out_flow_loss_is_far_below_an_untrained_models(model: trained_video.TrainedWan) -> None:
    """On two committed evaluation clips (a static one and a pan) at sigma 0.5: the trained model's flow loss is
    under a third of the same class's at its initialisation."""
    x0, label = trained_video.eval_set()
    assert x0.shape[1:] == (3, trained_video.FRAMES, 32, 32) and len(label) == len(x0)
    x0, label = x0[:2], label[:2]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.5)
    torch.manual_seed(0)
    untrained = trained_video.TrainedWan(len(trained_video.PHOTOS)).eval()
    with torch.no_grad():
        loss = trained_dit.flow_loss(model, x0, label, sigma, noise).item()
        before = trained_dit.flow_loss(untrained, x0, label, sigma, noise).item()
    assert math.isfinite(loss) and loss < before / 3, (loss, before)


def test_its_attention_falls_off_with_distance_in_space_and_time(model: trained_video.TrainedWan) -> None:
    """At sigma 0.5 on an evaluation clip (a slow pan), mean over blocks: each query's own token, its 26 neighbours
    (over frames, rows, columns) and its own position in the adjacent frames take several times the share uniform
    attention gives them; the weight per key falls with the distance in the query's frame and with the distance in
    frames at the query's position."""
    x0, label = trained_video.eval_set()
    x0, label = x0[1:2], label[1:2]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    layout = attention_profile.Layout(0, (trained_video.FRAMES, 16, 16), 0)
    with attention_profile.Profile(layout) as profile, torch.no_grad():
        model(0.5 * x0 + 0.5 * noise, torch.full((1,), 0.5), label)
    assert len(profile.rows) == trained_video.BLOCKS
    m = attention_profile.summary(profile.rows)
    n = layout.tokens
    assert m["own"] > 5 / n and m["ring1"] > 5 * 26 / n and m["own_adjacent_frames"] > 5 * 1.6 / n, m
    space, frames = m["space_rings"], m["frame_rings"]
    assert space[0] > space[1] > space[2] > space[4], space
    assert frames[0] > frames[1] > frames[2], frames


def test_the_video_profile_of_uniform_attention_is_the_share_of_each_region() -> None:
    """Every key weighted 1 / n: the temporal shares are their regions' share of the keys; every ring's weight per
    key is 1 / n."""
    layout = attention_profile.Layout(0, (3, 4, 4), 0)
    n = layout.tokens
    row = attention_profile.Profile(layout).row(torch.full((1, 2, n, n), 1 / n))
    assert row["own_other_frames"] == pytest.approx(2 / n, rel=1e-5)
    assert row["own_adjacent_frames"] == pytest.approx((1 + 2 + 1) / 3 / n, rel=1e-5)
    assert row["frame_rings"] == pytest.approx([1 / n] * 3, rel=1e-5)
    assert row["space_rings"][:4] == pytest.approx([1 / n] * 4, rel=1e-5)
    assert row["ring1"] == pytest.approx((layout.distance() == 1).sum(-1).float().mean().item() / n, rel=1e-5)


def test_the_panel_runs_wans_ladder_on_the_video_model(model: trained_video.TrainedWan) -> None:
    """The model's class picks Wan's family: each preset patches it with Wan's setting, not Flux.1's merged one."""
    assert tome_core.model_family(model.transformer) == "wan"
    for preset in tome_core.presets():
        tome_core.apply_patch(model.transformer, preset=preset.name)
        try:
            state = model.transformer.__dict__[STATE_ATTR]
            assert state.config == preset.config("wan") != preset.config("flux"), preset.name
        finally:
            tome_core.remove_patch(model.transformer)


def test_the_fidelity_json_holds_the_figures_the_panel_computes(model: trained_video.TrainedWan) -> None:
    """The cheapest case of the trained-fidelity.json Wan's presets now carry (docs/runs/2026-12-06-wan-redecided),
    recomputed: at 4 steps and its 4 samples, the naive port's change and Quality's (its last two steps reduced);
    each row's step reference at Wan 2.1 14B 832x480x81's speed."""
    found = json.loads((RUN.parent / "2026-12-06-wan-redecided" / "trained-fidelity.json").read_text())
    assert found["model"] == "wan" and found["size"] == [832, 480, 81]
    rows = {r["name"]: r for r in found["rows"] if r["steps"] == 4}
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(found["samples"], *trained_fidelity.MODELS["wan"].latent, generator=g)
    labels = torch.arange(found["samples"]) % model.null
    base = trained_fidelity.generate(model, noise, labels, 4)
    port = trained_fidelity._measure(model, noise, labels, 4, base, {"mode": "kv", "sx": 2, "sy": 2}, own_key=False)
    quality = trained_fidelity._measure(model, noise, labels, 4, base, {"preset": "quality"}, own_key=True)
    assert rows["naive port (kv 2x2, every block)"]["change"] == pytest.approx(port, abs=TOLERANCE)
    assert rows["quality"]["change"] == pytest.approx(quality, abs=TOLERANCE)
    for preset in tome_core.presets():
        speed = figures.speed("wan", preset.name, 832, 480, 81).speedup
        assert rows[preset.name]["speedup"] == speed
        assert rows[preset.name]["fewer steps"] == math.ceil(4 / speed - 1e-9)


def test_camera_moves_stay_inside_the_photograph_and_static_clips_stand_still() -> None:
    """A clip of the grid asked for; a static clip's frames are one frame; a pan's frames differ, more at the faster
    speed."""
    g = torch.Generator().manual_seed(0)
    base = torch.nn.functional.interpolate(torch.randn(1, 3, 24, 32, generator=g), size=(96, 128), mode="bicubic")[0]
    still, move = trained_video.clip(base, (8, 12), g, speed=0.0)
    assert still.shape == (3, trained_video.FRAMES, 16, 24) and move["speed"] == 0.0
    assert torch.allclose(still, still[:, :1].expand_as(still))
    steps = []
    for speed in (0.25, 1.0):
        x, _ = trained_video.clip(base, (8, 12), torch.Generator().manual_seed(1), speed=speed)
        assert torch.isfinite(x).all()
        steps.append((x[:, 1:] - x[:, :-1]).abs().mean().item())
    assert 0 < steps[0] < steps[1], steps


#: A reduced config of the same class: one block, two heads of 16 channels.
TINY = {**trained_video.CONFIG, "num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 16, "ffn_dim": 64}


def test_training_steps_on_a_repeated_batch_lower_the_loss() -> None:
    """Two smooth random clips (no scikit-image): ten steps of the training code cut the flow loss at a fixed sigma
    and noise."""
    torch.manual_seed(0)
    model = trained_video.TrainedWan(2, TINY).train()
    g = torch.Generator().manual_seed(0)
    x0 = torch.nn.functional.interpolate(torch.randn(2, 3, 3, 4, 4, generator=g), size=(3, 8, 8), mode="trilinear")
    label, sigma = torch.tensor([0, 1]), torch.full((2,), 0.5)
    noise = torch.randn(x0.shape, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = trained_dit.flow_loss(model, x0, label, sigma, noise).item()
    losses = [trained_video.train_step(model, opt, x0, label, g) for _ in range(10)]
    after = trained_dit.flow_loss(model, x0, label, sigma, noise).item()
    assert all(math.isfinite(v) for v in losses)
    assert after < 0.8 * before
