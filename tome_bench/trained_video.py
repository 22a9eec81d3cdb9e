"""A small Wan-class video DiT trained on camera moves over photographs, so that the temporal attention the video
presets reduce can be measured on a model that learned it (issue 57).

The model is diffusers' `WanTransformer3DModel` (its 3D RoPE over (frame, row, column), self-attention over the whole
video, text by cross-attention), with BLOCKS blocks of 4 heads of 32 channels, trained on the CPU by rectified flow
on clips made by moving a camera over the photographs tome_bench.trained_dit trains on. Its "text" is a learned set
of TEXT tokens per photograph, plus a null label the training drops to one time in ten, as trained_dit's.

A clip is 17 video frames, 5 latent frames as Wan's VAE packs them (the first frame alone, then 4 frames per latent
frame: here their mean); each frame's latent is the photograph seen through a moving window, at trained_dit's scale
(LATENT_PX photo px per latent px at zoom 1: a token, Wan's 1x2x2 patch, is 8x8 photo px, 1/64 of the scene's
width). The camera pans at a constant speed (SPEEDS, latent px per video frame, in a random direction; 0: a static
clip) and zooms smoothly (ZOOMS: the window's size over the clip, one way or the other), starting at a random scale
of trained_dit.SCALES; clips are flipped left-right one time in two. Training mixes grids of 16x16 and 12x20 tokens
at a constant count of tokens per step (GRIDS); the evaluation clips are 16x16 tokens at scale 1.

    .venv/bin/pip install --no-deps -r requirements-lab.txt    # scikit-image, only to retrain
    setsid nohup nice -n 10 .venv/bin/python -m tome_bench.trained_video train --minutes 50 > train.log 2>&1 &

The weights (fp16) and the evaluation clips are committed (WEIGHTS, EVAL): `load` and `eval_set` need neither
scikit-image nor training. The attention profile that reads them: `python -m tome_bench attention-profile --models
trained-wan`; the presets on it: `python -m tome_bench trained-fidelity --model wan`.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tome_bench.trained_dit import (
    EVAL_PHOTOS,
    HELD_OUT,
    LATENT_PX,
    PHOTOS,
    SCALES,
    TEXT,
    eval_loss,
    loop,
    parameters,
    photo,
    save,
    train_step,
)

#: Latent frames of a clip (17 video frames: the first alone, then 4 per latent frame, as Wan's VAE packs them).
FRAMES = 5
#: Video frames per latent frame after the first.
FRAME_GROUP = 4
#: Pan speeds, latent px per video frame (a token is 2 latent px): static, slow .. fast (8 tokens over a clip).
SPEEDS = (0.0, 0.125, 0.25, 0.5, 1.0)
#: The window's size at the clip's end over its start: a zoom out (> 1) or in (< 1) drawn up to this far.
ZOOMS = 1.3
#: (rows, columns) of tokens -> clips per step: about 3800 tokens per step whatever the grid.
GRIDS = MappingProxyType({(16, 16): 3, (12, 20): 3})
#: Grid (rows, columns) of the evaluation clips and the profile.
EVAL_GRID = (16, 16)
#: Blocks of the transformer.
BLOCKS = 6
#: The transformer: Wan 2.1's class (its layout: the tiny test model's, tests/dit_models.py) at 2.1 M
#: parameters; the latent is RGB (3 channels) as trained_dit's.
CONFIG = MappingProxyType(
    {
        "patch_size": (1, 2, 2),
        "num_attention_heads": 4,
        "attention_head_dim": 32,
        "in_channels": 3,
        "out_channels": 3,
        "text_dim": 64,
        "freq_dim": 64,
        "ffn_dim": 768,
        "num_layers": BLOCKS,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "rope_max_seq_len": 64,
    }
)
DATA = Path(__file__).resolve().parent / "data"
WEIGHTS = DATA / "trained_wan.safetensors"
EVAL = DATA / "trained_wan_eval.safetensors"


class TrainedWan(nn.Module):
    """The Wan transformer and its labels' learned text: `labels` photographs and a null label (the last)."""

    def __init__(self, labels: int, config: Mapping[str, Any] = CONFIG) -> None:
        super().__init__()
        import diffusers

        self.transformer = diffusers.WanTransformer3DModel(**config)
        self.text = nn.Parameter(torch.randn(labels + 1, TEXT, config["text_dim"]))

    @property
    def null(self) -> int:
        return self.text.shape[0] - 1

    def forward(self, latent: torch.Tensor, sigma: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """latent [B, 3, F, H, W], sigma [B], label [B] (long) -> velocity [B, 3, F, H, W], as Wan's pipeline calls
        the model (the scheduler's timestep, sigma * 1000)."""
        return self.transformer(
            hidden_states=latent, timestep=sigma * 1000, encoder_hidden_states=self.text[label], return_dict=False
        )[0]


# -- data (scikit-image only here) ---------------------------------------------------------------------------------


def bases(image: torch.Tensor) -> list[torch.Tensor]:
    """Per entry of SCALES, `image` [3, H, W] at twice the latent's resolution (antialiased): the camera samples it
    and halves the result, so a window between pixels stays sharp."""
    return [
        F.interpolate(image[None], scale_factor=2 / (LATENT_PX * s), mode="bilinear", antialias=True)[0] for s in SCALES
    ]


def _frame_times() -> torch.Tensor:
    """[FRAMES, FRAME_GROUP] the video frames (0 .. 16) each latent frame averages; the first holds frame 0 alone."""
    times = torch.arange(1, 1 + (FRAMES - 1) * FRAME_GROUP).view(FRAMES - 1, FRAME_GROUP).float()
    return torch.cat([torch.zeros(1, FRAME_GROUP), times])


def clip(
    base: torch.Tensor, grid: tuple[int, int], g: torch.Generator, speed: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """(latent [3, FRAMES, 2 rows, 2 columns], the move) a camera move over `base` [3, H, W] (twice the latent's
    resolution): a pan at `speed` (default: one of SPEEDS) in a random direction and a smooth zoom, its window kept
    inside the photograph."""
    rows, cols = 2 * grid[0], 2 * grid[1]  # latent px of a frame
    height, width = base.shape[-2:]
    last = (FRAMES - 1) * FRAME_GROUP
    if speed is None:
        speed = SPEEDS[int(torch.randint(len(SPEEDS), (), generator=g))]
    static = speed == 0.0
    zoom = 1.0 if static else math.exp((2 * float(torch.rand((), generator=g)) - 1) * math.log(ZOOMS))
    # The largest window (base px) the move reaches must fit; a zoom that cannot is dropped.
    big = 2 * max(1.0, zoom)
    if big * rows > height or big * cols > width:
        zoom, big = 1.0, 2.0
    angle = 2 * math.pi * float(torch.rand((), generator=g))
    travel = 2 * speed * last  # base px
    dx, dy = travel * math.cos(angle), travel * math.sin(angle)
    # Shrink the pan until the window's path fits in the photograph.
    room_x, room_y = width - big * cols, height - big * rows
    fit = min(1.0, room_x / abs(dx) if dx else 1.0, room_y / abs(dy) if dy else 1.0)
    dx, dy = dx * fit, dy * fit
    x0 = float(torch.rand((), generator=g)) * (room_x - abs(dx)) + max(0.0, -dx) + big * cols / 2
    y0 = float(torch.rand((), generator=g)) * (room_y - abs(dy)) + max(0.0, -dy) + big * rows / 2
    t = _frame_times().flatten() / last  # [FRAMES * FRAME_GROUP] in [0, 1]
    ease = 0.5 - 0.5 * torch.cos(math.pi * t)  # the camera starts and stops smoothly
    size = 2 * zoom**ease  # base px per window px
    cx, cy = x0 + dx * ease, y0 + dy * ease
    theta = torch.zeros(len(t), 2, 3)
    theta[:, 0, 0] = size * cols / width
    theta[:, 1, 1] = size * rows / height
    theta[:, 0, 2] = 2 * cx / width - 1
    theta[:, 1, 2] = 2 * cy / height - 1
    where = F.affine_grid(theta, [len(t), 3, rows * 2, cols * 2], align_corners=False)
    seen = F.grid_sample(base[None].expand(len(t), -1, -1, -1), where, mode="bilinear", align_corners=False)
    seen = F.avg_pool2d(seen, 2)  # [FRAMES * FRAME_GROUP, 3, rows, cols]: back to the latent's resolution
    frames = seen.view(FRAMES, FRAME_GROUP, 3, rows, cols).mean(1)  # the VAE's 4 frames per latent frame
    move = {"speed": speed * fit, "zoom": zoom}
    return frames.permute(1, 0, 2, 3).contiguous(), move


def clips(
    pyramids: Sequence[Sequence[torch.Tensor]], grid: tuple[int, int], count: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(latents [count, 3, FRAMES, 2 rows, 2 columns], labels [count]): camera moves over random photographs
    (`pyramids`: per photograph its bases per scale) at a random scale the window fits in, flipped left-right one
    time in two."""
    out, labels = [], torch.randint(len(pyramids), (count,), generator=g)
    for label in labels.tolist():
        fits = [b for b in pyramids[label] if b.shape[-2] >= 4 * grid[0] * ZOOMS and b.shape[-1] >= 4 * grid[1] * ZOOMS]
        fits = fits or [pyramids[label][0]]
        x, _ = clip(fits[int(torch.randint(len(fits), (), generator=g))], grid, g)
        out.append(x.flip(-1) if torch.rand((), generator=g) < 0.5 else x)
    return torch.stack(out), labels


def make_eval_set(count: int = 8, seed: int = 1) -> dict[str, torch.Tensor]:
    """`count` clips of EVAL_GRID tokens at scale 1 from EVAL_PHOTOS, a speed of SPEEDS each in turn (two static):
    {"latents": [count, 3, FRAMES, 32, 32] fp16, "labels": [count] (index in PHOTOS), "speeds": [count]}."""
    g = torch.Generator().manual_seed(seed)
    photos = [bases(photo(name))[0] for name in EVAL_PHOTOS]
    out, labels, speeds = [], [], []
    for i in range(count):
        which = i % len(EVAL_PHOTOS)
        x, move = clip(photos[which], EVAL_GRID, g, SPEEDS[i % len(SPEEDS)])
        out.append(x)
        labels.append(PHOTOS.index(EVAL_PHOTOS[which]))
        speeds.append(move["speed"])
    return {"latents": torch.stack(out).half(), "labels": torch.tensor(labels), "speeds": torch.tensor(speeds)}


def eval_set() -> tuple[torch.Tensor, torch.Tensor]:
    """(latents [N, 3, FRAMES, 32, 32] float32, labels [N]) of the committed evaluation clips."""
    from safetensors.torch import load_file

    tensors = load_file(str(EVAL))
    return tensors["latents"].float(), tensors["labels"]


# -- training ------------------------------------------------------------------------------------------------------


def load(path: Path = WEIGHTS) -> TrainedWan:
    """The trained model from its fp16 weights, in float32, eval mode, without gradients."""
    from safetensors.torch import load_file

    model = TrainedWan(len(PHOTOS))
    model.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    return model.eval().requires_grad_(False)


def train(
    minutes: float, lr: float, seed: int, log_every: int, out: Path, eval_out: Path, max_steps: int | None = None
) -> None:
    """Train for `minutes` of wall clock (or `max_steps`; cosine learning rate over the minutes, 50 steps' warm-up),
    logging the mean training loss every `log_every` steps and the held-out loss at sigma 0.1/0.5/0.9 every 10 logs;
    weights saved at each held-out figure and at the end."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    evals = make_eval_set()
    eval_out.parent.mkdir(parents=True, exist_ok=True)
    save_file(evals, str(eval_out), metadata={"photos": json.dumps(EVAL_PHOTOS), "grid": json.dumps(EVAL_GRID)})
    x_eval, label_eval = evals["latents"].float(), evals["labels"]
    pyramids = [bases(photo(name)) for name in PHOTOS]
    model = TrainedWan(len(PHOTOS)).train()
    grids = list(GRIDS)
    meta = {"config": dict(CONFIG), "photos": PHOTOS, "minutes": minutes, "lr": lr, "seed": seed}
    print(f"parameters {parameters(model)} photos {len(PHOTOS)} grids {list(GRIDS.items())} lr {lr}", flush=True)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        grid = grids[step % len(grids)]
        return clips(pyramids, grid, GRIDS[grid], g)

    def held_out(m: nn.Module) -> list[float]:
        return eval_loss(m, x_eval, label_eval, HELD_OUT)

    def save_at(step: int) -> None:
        save(model, out, {**meta, "steps": step})

    loop(model, batch, train_step, held_out, g, minutes, lr, log_every, save_at, max_steps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tome_bench.trained_video", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="job", required=True)
    run = sub.add_parser("train", help="train from scratch (needs scikit-image: requirements-lab.txt)")
    run.add_argument("--minutes", type=float, default=50.0)
    run.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (a timing test)")
    run.add_argument("--lr", type=float, default=1e-3)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--log-every", type=int, default=20)
    run.add_argument("--out", type=Path, default=WEIGHTS)
    run.add_argument("--eval-out", type=Path, default=EVAL)
    args = parser.parse_args(argv)
    train(args.minutes, args.lr, args.seed, args.log_every, args.out, args.eval_out, args.max_steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
