"""The lab's trained DiT and its attention profile (issue 57): the committed weights load and run on the committed
evaluation crops, the profile at middle noise is the one docs/dit.md states (through the run's profile.json), and the
training step learns. Nothing here needs scikit-image or trains the model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tome_core
from tome_bench import attention_profile, trained_dit

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "docs" / "runs" / "2026-12-06-trained-dit"
#: The profile's figures are sums of float32 softmax weights over the same inputs: they agree to far below this.
TOLERANCE = 2e-3


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_the_weights_are_fp16_and_at_most_16_mb() -> None:
    assert trained_dit.WEIGHTS.stat().st_size <= 16 * 2**20
    assert {t.dtype for t in load_file(str(trained_dit.WEIGHTS)).values()} == {torch.float16}
    assert trained_dit.EVAL.stat().st_size <= 2**20


def test_the_committed_model_runs_on_the_evaluation_crops_and_predicts_the_flow() -> None:
    """Its velocity at sigma 0.5 is far closer to noise - x0 than no prediction (zero) is."""
    model = trained_dit.load()
    x0, label = trained_dit.eval_set()
    assert x0.shape[1:] == (3, 2 * trained_dit.EVAL_SIDE, 2 * trained_dit.EVAL_SIDE) and len(label) == len(x0)
    x0, label = x0[:2], label[:2]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.5)
    with torch.no_grad():
        out = model(0.5 * x0 + 0.5 * noise, sigma, label)
        loss = trained_dit.flow_loss(model, x0, label, sigma, noise).item()
    assert out.shape == x0.shape and torch.isfinite(out).all()
    assert loss < 0.5 * (noise - x0).square().mean().item()


def _docs_row(result: dict) -> str:
    return attention_profile.table({"trained": {"0.5": result}}).splitlines()[-1]


def test_the_profile_at_middle_noise_is_the_one_the_docs_state() -> None:
    """Recomputed on the committed weights and crops, the figures equal profile.json's, and docs/dit.md shows
    profile.json's row."""
    recorded = json.loads((RUN / "profile.json").read_text())["trained"]["0.5"]
    measured = attention_profile.trained([0.5])["0.5"]
    for field in attention_profile.FIELDS:
        assert measured["mean"][field] == pytest.approx(recorded["mean"][field], abs=TOLERANCE), field
    assert measured["mean"]["sink_at"] == recorded["mean"]["sink_at"]
    assert _docs_row(recorded) in (ROOT / "docs" / "dit.md").read_text()


def test_the_profile_of_uniform_attention_is_the_share_of_each_region() -> None:
    """Every key weighted 1 / L: each figure is its region's share of the keys, the entropy log L."""
    layout = attention_profile.Layout(4, (1, 6, 6), 4)
    length = layout.tokens + layout.text
    row = attention_profile.Profile(layout).row(torch.full((1, 2, length, length), 1 / length))
    within2 = (layout.distance() <= 2).sum(-1).float().mean().item()
    assert row["own"] == pytest.approx(1 / length, rel=1e-5)
    assert row["text"] == pytest.approx(4 / length, rel=1e-5)
    assert row["within2"] == pytest.approx(within2 / length, rel=1e-5)
    assert row["max_key"] == pytest.approx(1 / length, rel=1e-5)
    assert row["entropy"] == pytest.approx(1.0, rel=1e-5)
    assert layout.where(0) == "text 0" and layout.where(4 + 6 + 2) == "image (1, 2)"


def test_the_profile_reads_an_image_first_sequence() -> None:
    layout = attention_profile.Layout(0, (1, 4, 4), 3)
    assert layout.where(5) == "image (1, 1)" and layout.where(17) == "text 1"


#: A reduced config of the same class: one block of each kind, two heads of 16 channels.
TINY = {**trained_dit.CONFIG, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16}
TINY |= {"num_attention_heads": 2, "axes_dims_rope": (4, 6, 6)}


def test_training_steps_on_a_repeated_batch_lower_the_loss() -> None:
    """Two smooth random "photographs" (no scikit-image): ten steps of the training code cut the flow loss at a fixed
    sigma and noise."""
    torch.manual_seed(0)
    model = trained_dit.TrainedDiT(2, TINY).train()
    g = torch.Generator().manual_seed(0)
    x0 = torch.nn.functional.interpolate(torch.randn(2, 3, 4, 4, generator=g), size=16, mode="bilinear")
    label, sigma = torch.tensor([0, 1]), torch.full((2,), 0.5)
    noise = torch.randn(x0.shape, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = trained_dit.flow_loss(model, x0, label, sigma, noise).item()
    losses = [trained_dit.train_step(model, opt, x0, label, g) for _ in range(10)]
    after = trained_dit.flow_loss(model, x0, label, sigma, noise).item()
    assert all(math.isfinite(v) for v in losses)
    assert after < 0.8 * before


def test_training_crops_fit_their_photograph_at_some_scale() -> None:
    """Crops of the grid asked for; a scale the crop does not fit in is never drawn."""
    pyramids = [[torch.randn(3, 40, 64), torch.randn(3, 20, 32)], [torch.randn(3, 64, 64), torch.randn(3, 32, 32)]]
    x, label = trained_dit.crops(pyramids, 16, 5, torch.Generator().manual_seed(0))
    assert x.shape == (5, 3, 32, 32) and label.shape == (5,) and set(label.tolist()) <= {0, 1}


def test_the_trained_fidelity_job_measures_every_preset_and_its_references() -> None:
    """`python -m tome_bench trained-fidelity` at 4 steps (the last inside every preset's step window), one sample:
    the naive port and every preset with and without each query's own key, the model left unpatched after each."""
    from tome_bench import trained_fidelity

    found = trained_fidelity.panel([4], 1, log=lambda _: None)
    names = [r["name"] for r in found["rows"]]
    assert names == ["naive port (kv 2x2, every block)", *(p.name for p in tome_core.presets())]
    assert all(r["change"] > 0 for r in found["rows"])
    assert all(r["without own key"] > 0 for r in found["rows"][1:])
    assert not tome_core.is_patched(trained_dit.load().transformer)
