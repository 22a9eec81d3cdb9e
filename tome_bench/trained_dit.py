"""A small Flux.1-class DiT trained on photographs, so that the attention the stand-ins imitate can be measured on a
model that learned it (issue 57).

The model is diffusers' `FluxTransformer2DModel` (its RoPE over (0, row, column) ids and its joint text stream), with
2 double-stream and 4 single-stream blocks of 4 heads of 32 channels, trained on the CPU by rectified flow on the
colour photographs scikit-image ships in its wheel. Its "text" is a learned set of TEXT tokens per photograph (and a
pooled vector per photograph, where Flux reads CLIP's), plus a null label the training drops to one time in ten.

The latent stands in for a VAE's, at Flux's scale: each photograph is resized so that its long side is SCENE (512)
px, a whole scene, and downsampled (antialiased) by LATENT_PX (4) into an RGB latent; Flux's 2x2 packing then makes
a token of 8x8 photo px. A token of a 1024 px Flux image covers 16x16 px of a 1024 px scene, the same fraction of
a scene: neighbouring tokens then differ about as much as they do in the images users make, where a busy crop at a
coarser scale would make them differ more. Training zooms out too (SCALES: a token of up to 16x16 photo px) and
mixes grids of 16, 24 and 32 tokens a side at a constant count of tokens per step; the evaluation crops are 32x32
tokens at scale 1.

    .venv/bin/pip install --no-deps -r requirements-lab.txt    # scikit-image, only to retrain
    nohup nice -n 10 .venv/bin/python -m tome_bench.trained_dit train --minutes 55 > train.log 2>&1 &

The weights (fp16) and the evaluation crops are committed (WEIGHTS, EVAL): `load` and `eval_set` need neither
scikit-image nor training. The attention profile that reads them: tome_bench.attention_profile.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tome_bench.dit_families import pack, unpack
from tome_bench.dit_inputs import ids

#: The training photographs (scikit-image's wheel holds them; "motorcycle" is `stereo_motorcycle()`'s left view,
#: "camera" is grey and repeated over RGB).
PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "rocket", "motorcycle", "retina", "hubble_deep_field")
#: The photographs the committed evaluation crops come from: public domain (astronaut: NASA) and CC0 (chelsea, coffee).
EVAL_PHOTOS = ("astronaut", "chelsea", "coffee")
#: Long side of a photograph, px: a whole scene, as a 1024 px image is one.
SCENE = 512
#: Photo px per latent px at scale 1 (a token, 2x2 latent px, is 8x8 photo px: 1/64 of the scene's width).
LATENT_PX = 4
#: Zoom-outs the training crops are taken at (token = 8 * scale photo px).
SCALES = (1.0, 1.25, 1.5, 2.0)
#: Grid side (tokens) -> crops per step: about 4100 image tokens per step whatever the grid.
GRIDS = MappingProxyType({16: 16, 24: 7, 32: 4})
#: Grid side of the evaluation crops and the profile.
EVAL_SIDE = 32
#: Text tokens per label.
TEXT = 8
#: Per-channel (RGB) pixel mean and spread of the photographs: the latent comes out near zero mean and unit variance,
#: as a VAE's latent is shifted and scaled.
MEAN, STD = (0.46, 0.33, 0.30), (0.32, 0.25, 0.25)
#: The transformer: Flux.1's class at 2.4 M parameters.
CONFIG = MappingProxyType(
    {
        "patch_size": 1,
        "in_channels": 12,
        "num_layers": 2,
        "num_single_layers": 4,
        "attention_head_dim": 32,
        "num_attention_heads": 4,
        "joint_attention_dim": 64,
        "pooled_projection_dim": 64,
        "axes_dims_rope": (8, 12, 12),
    }
)
DATA = Path(__file__).resolve().parent / "data"
WEIGHTS = DATA / "trained_flux.safetensors"
EVAL = DATA / "trained_flux_eval.safetensors"


class TrainedDiT(nn.Module):
    """The Flux transformer and its labels' learned text: `labels` photographs and a null label (the last)."""

    def __init__(self, labels: int, config: Mapping[str, Any] = CONFIG) -> None:
        super().__init__()
        import diffusers

        self.transformer = diffusers.FluxTransformer2DModel(**config)
        self.text = nn.Parameter(torch.randn(labels + 1, TEXT, config["joint_attention_dim"]))
        self.pooled = nn.Parameter(torch.zeros(labels + 1, config["pooled_projection_dim"]))

    @property
    def null(self) -> int:
        return self.text.shape[0] - 1

    def forward(self, latent: torch.Tensor, sigma: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """latent [B, 3, H, W], sigma [B], label [B] (long) -> velocity [B, 3, H, W], as the Flux pipeline calls the
        model (packed 2x2 patches, the sigma as its timestep, text ids zero)."""
        h, w = latent.shape[-2] // 2, latent.shape[-1] // 2
        out = self.transformer(
            hidden_states=pack(latent),
            encoder_hidden_states=self.text[label],
            pooled_projections=self.pooled[label],
            timestep=sigma,
            img_ids=ids(h, w, 3),
            txt_ids=torch.zeros(TEXT, 3),
            return_dict=False,
        )[0]
        return unpack(out, tuple(latent.shape))


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- data (scikit-image only here) ---------------------------------------------------------------------------------


def photo(name: str) -> torch.Tensor:
    """[3, H, W] photograph `name`, long side SCENE px, normalised (MEAN, STD)."""
    import skimage.data

    image = skimage.data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(skimage.data, name)()
    pixels = torch.from_numpy(image.copy()).float() / 255
    if pixels.ndim == 2:
        pixels = pixels[..., None].expand(-1, -1, 3)
    pixels = pixels.permute(2, 0, 1)[None]
    pixels = F.interpolate(pixels, scale_factor=SCENE / max(pixels.shape[-2:]), mode="bilinear", antialias=True)
    return ((pixels[0] - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]).contiguous()


def latents(image: torch.Tensor) -> list[torch.Tensor]:
    """Per entry of SCALES, [3, H / f, W / f] the latent of `image` [3, H, W], f = LATENT_PX * scale (antialiased)."""
    return [
        F.interpolate(image[None], scale_factor=1 / (LATENT_PX * s), mode="bilinear", antialias=True)[0] for s in SCALES
    ]


def crops(pyramids: Sequence[Sequence[torch.Tensor]], side: int, count: int, g: torch.Generator) -> tuple[Any, Any]:
    """(latents [count, 3, 2 side, 2 side], labels [count]): random crops of random photographs (`pyramids`, per
    photograph its latents per scale) at a random scale the crop fits in, flipped left-right one time in two."""
    size = 2 * side
    out, labels = [], torch.randint(len(pyramids), (count,), generator=g)
    for label in labels.tolist():
        fits = [x for x in pyramids[label] if min(x.shape[-2:]) >= size]
        x = fits[int(torch.randint(len(fits), (), generator=g))]
        top = int(torch.randint(x.shape[-2] - size + 1, (), generator=g))
        left = int(torch.randint(x.shape[-1] - size + 1, (), generator=g))
        x = x[:, top : top + size, left : left + size]
        out.append(x.flip(-1) if torch.rand((), generator=g) < 0.5 else x)
    return torch.stack(out), labels


def make_eval_set(count: int = 8, seed: int = 1) -> dict[str, torch.Tensor]:
    """`count` crops of EVAL_SIDE tokens a side at scale 1 from EVAL_PHOTOS: {"latents": [count, 3, 64, 64] fp16,
    "labels": [count] (index in PHOTOS)}."""
    g = torch.Generator().manual_seed(seed)
    pyramids = [latents(photo(name))[:1] for name in EVAL_PHOTOS]
    x, which = crops(pyramids, EVAL_SIDE, count, g)
    labels = torch.tensor([PHOTOS.index(EVAL_PHOTOS[i]) for i in which.tolist()])
    return {"latents": x.half().contiguous(), "labels": labels}


def eval_set() -> tuple[torch.Tensor, torch.Tensor]:
    """(latents [N, 3, 64, 64] float32, labels [N]) of the committed evaluation crops."""
    from safetensors.torch import load_file

    tensors = load_file(str(EVAL))
    return tensors["latents"].float(), tensors["labels"]


# -- training ------------------------------------------------------------------------------------------------------


def flow_loss(
    model: TrainedDiT, x0: torch.Tensor, label: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """Rectified flow: the model's velocity at x = (1 - sigma) x0 + sigma noise against noise - x0, mean squared.
    x0, noise [B, 3, H, W] or [B, 3, F, H, W]; sigma, label [B]."""
    s = sigma.view(-1, *[1] * (x0.ndim - 1))  # images [B, 3, H, W] and clips [B, 3, F, H, W] alike
    return F.mse_loss(model((1 - s) * x0 + s * noise, sigma, label), noise - x0)


def train_step(
    model: TrainedDiT, opt: torch.optim.Optimizer, x0: torch.Tensor, label: torch.Tensor, g: torch.Generator
) -> float:
    """One optimiser step on the crops x0 [B, 3, H, W] of photographs `label` [B]: a logit-normal sigma per crop (SD3's
    sampling, most weight at middle noise), the null label one time in ten (for guidance). The loss before it."""
    label = torch.where(torch.rand(len(label), generator=g) < 0.1, model.null, label)
    sigma = torch.sigmoid(torch.randn(len(x0), generator=g))
    loss = flow_loss(model, x0, label, sigma, torch.randn(x0.shape, generator=g))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


@torch.no_grad()
def eval_loss(model: TrainedDiT, x0: torch.Tensor, label: torch.Tensor, sigmas: Sequence[float]) -> list[float]:
    """The flow loss per sigma on fixed crops with fixed noise (seed 0): the training's held-out figure."""
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    return [flow_loss(model, x0, label, torch.full((len(x0),), s), noise).item() for s in sigmas]


def save(model: TrainedDiT, path: Path, meta: Mapping[str, Any]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={k: json.dumps(v) for k, v in meta.items()})


def load(path: Path = WEIGHTS) -> TrainedDiT:
    """The trained model from its fp16 weights, in float32, eval mode, without gradients."""
    from safetensors.torch import load_file

    model = TrainedDiT(len(PHOTOS))
    model.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    return model.eval().requires_grad_(False)


def train(minutes: float, lr: float, seed: int, log_every: int, out: Path, eval_out: Path) -> None:
    """Train for `minutes` of wall clock (cosine learning rate over that time, 50 steps' warm-up), logging the mean
    training loss every `log_every` steps and the held-out loss at sigma 0.1/0.5/0.9 every 10 logs; weights saved
    at each held-out figure and at the end."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    evals = make_eval_set()
    eval_out.parent.mkdir(parents=True, exist_ok=True)
    save_file(evals, str(eval_out), metadata={"photos": json.dumps(EVAL_PHOTOS), "side": str(EVAL_SIDE)})
    x_eval, label_eval = evals["latents"].float(), evals["labels"]
    pyramids = [latents(photo(name)) for name in PHOTOS]
    model = TrainedDiT(len(PHOTOS)).train()
    sides = list(GRIDS)
    meta = {"config": dict(CONFIG), "photos": PHOTOS, "minutes": minutes, "lr": lr, "seed": seed}
    print(f"parameters {parameters(model)} photos {len(PHOTOS)} grids {dict(GRIDS)} lr {lr}", flush=True)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        side = sides[step % len(sides)]
        return crops(pyramids, side, GRIDS[side], g)

    def held_out(m: nn.Module) -> list[float]:
        return eval_loss(m, x_eval, label_eval, HELD_OUT)

    loop(
        model, batch, train_step, held_out, g, minutes, lr, log_every, lambda n: save(model, out, {**meta, "steps": n})
    )


#: The noise levels of the held-out loss the training logs.
HELD_OUT = (0.1, 0.5, 0.9)


def loop(
    model: nn.Module,
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    step_fn: Callable[..., float],
    held_out: Callable[[nn.Module], list[float]],
    g: torch.Generator,
    minutes: float,
    lr: float,
    log_every: int,
    save_at: Callable[[int], None] | None = None,
    max_steps: int | None = None,
) -> int:
    """The training loop the lab's trained models share: `minutes` of wall clock (or `max_steps`), AdamW with a
    cosine learning rate over the minutes and 50 steps' warm-up; `batch(step)` -> (x0, label), `step_fn(model, opt,
    x0, label, g)` -> loss. Logs the mean training loss every `log_every` steps and `held_out(model)` (at HELD_OUT)
    every 10 logs, calling `save_at(step)` there and at the end. Returns the steps run."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    start, step, recent = time.monotonic(), 0, []
    while (elapsed := time.monotonic() - start) < minutes * 60 and (max_steps is None or step < max_steps):
        decay = 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * elapsed / (minutes * 60)))
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 50) * decay
        x0, label = batch(step)
        recent.append(step_fn(model, opt, x0, label, g))
        step += 1
        if step % log_every == 0:
            rate = opt.param_groups[0]["lr"]
            line = f"step {step} min {elapsed / 60:.1f} lr {rate:.2e} loss {sum(recent) / len(recent):.4f}"
            recent = []
            if step % (10 * log_every) == 0:
                model.eval()
                held = held_out(model)
                model.train()
                line += " held-out(0.1/0.5/0.9) " + "/".join(f"{v:.4f}" for v in held)
                if save_at is not None:
                    save_at(step)
            print(line, flush=True)
    model.eval()
    held = held_out(model)
    if save_at is not None:
        save_at(step)
    print(
        f"done: steps {step} min {(time.monotonic() - start) / 60:.1f} held-out(0.1/0.5/0.9) "
        + "/".join(f"{v:.4f}" for v in held),
        flush=True,
    )
    return step


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tome_bench.trained_dit", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="job", required=True)
    run = sub.add_parser("train", help="train from scratch (needs scikit-image: requirements-lab.txt)")
    run.add_argument("--minutes", type=float, default=55.0)
    run.add_argument("--lr", type=float, default=1e-3)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--log-every", type=int, default=20)
    run.add_argument("--out", type=Path, default=WEIGHTS)
    run.add_argument("--eval-out", type=Path, default=EVAL)
    args = parser.parse_args(argv)
    train(args.minutes, args.lr, args.seed, args.log_every, args.out, args.eval_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
