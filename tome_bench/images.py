"""Their own model, their own eyes (`python -m tome_bench images --checkpoint FILE`): one prompt and seed through a
user's checkpoint, unpatched and at each preset, decoded with the checkpoint's own VAE into one labelled grid.

Everything comes from the one single-file checkpoint (the A1111/ComfyUI layout), converted with diffusers' own
single-file helpers and configs read from the tensors' shapes, so nothing is downloaded: the UNet
(`archs.load_checkpoint`), the VAE (`load_vae`; it decodes in float32: SDXL's overflows in fp16) and the prompt's
text encoder(s) (`load_text_encoders`) when CLIP's tokenizer is in the local Hugging Face cache (as the WebUI reads
it offline), else seeded random text states, and the grid, the table and the console say so.

Per variant the same start latent, generator, text states and sampler run through a diffusers pipeline patched the
way the library patches one; variants run round-robin after an untimed 1-step generation of each. Under each image:
the speed (the sampler's time, unpatched over patched, in this process), the PSNR against the unpatched image, the
high-frequency energy kept (`hf_energy`, as ToDo, arXiv 2402.13573, reports detail kept) and the latent change.
Writes OUT/images.png (its PNG text chunk "tiles" lists the labels), OUT/images/<variant>.png, images.json and
images.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tome_core
from tome_bench import archs, generate, options, report, run
from tome_bench.options import Defaults, Options
from tome_bench.timing import timed_call

#: The VAE's latent scale per family (SD1.x and SDXL base), applied before decoding as the pipelines do.
VAE_SCALING = {"sd": 0.18215, "sdxl": 0.13025}
#: Where CLIP's tokenizer is looked for (the Hub name; only the local cache is read).
CLIP_TOKENIZER = "openai/clip-vit-large-patch14"
#: The high-frequency cutoff of `hf_energy`, as a fraction of the Nyquist frequency: 0.25 keeps periods shorter than
#: 8 px, the size of one latent cell, the finest detail a token holds and the first that merging averages away.
HF_CUTOFF = 0.25
#: Tiles narrower than this (px) are enlarged by a whole factor, so that the labels under them fit.
MIN_TILE = 256
#: Text prefixes of the single-file layout.
VAE_PREFIX = "first_stage_model."
CLIP_L_PREFIXES = {"sd": "cond_stage_model.transformer.", "sdxl": "conditioner.embedders.0.transformer."}
OPEN_CLIP_PREFIX = "conditioner.embedders.1.model."
#: CLIP's attention heads are 64 wide (ViT-L: 768 / 12, bigG: 1280 / 20); the tensors do not store the count.
HEAD_WIDTH = 64


def _read(path: str, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors whose names start with one of `prefixes` (nothing else is read)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        names = [k for k in f.keys() if k.startswith(prefixes)]  # noqa: SIM118 (safe_open is not iterable)
        return {k: f.get_tensor(k) for k in names}


def _count(state: Mapping[str, torch.Tensor], pattern: str) -> int:
    """How many distinct numbers `pattern` ('encoder.down.{}.block.0.conv1.weight') takes in `state`'s names."""
    regex = re.compile(re.escape(pattern).replace(r"\{\}", r"(\d+)"))
    return len({m.group(1) for k in state if (m := regex.fullmatch(k))})


# ---------------------------------------------------------------------------------------------- the VAE


def vae_config(ldm: Mapping[str, torch.Tensor], scaling_factor: float) -> dict[str, Any]:
    """diffusers `AutoencoderKL` arguments read from an LDM VAE's tensor shapes (names without the prefix)."""
    levels = _count(ldm, "encoder.down.{}.block.0.conv1.weight")
    return {
        "in_channels": int(ldm["encoder.conv_in.weight"].shape[1]),
        "out_channels": int(ldm["decoder.conv_out.weight"].shape[0]),
        "down_block_types": ["DownEncoderBlock2D"] * levels,
        "up_block_types": ["UpDecoderBlock2D"] * levels,
        "block_out_channels": [int(ldm[f"encoder.down.{i}.block.0.conv2.weight"].shape[0]) for i in range(levels)],
        "layers_per_block": _count(ldm, "encoder.down.0.block.{}.conv1.weight"),
        "latent_channels": int(ldm["decoder.conv_in.weight"].shape[1]),
        "scaling_factor": scaling_factor,
    }


def load_vae(path: str, spec: archs.Arch, device: torch.device) -> nn.Module:
    """The checkpoint's VAE as a diffusers `AutoencoderKL` in float32 on `device`; ValueError when it has none."""
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    state = _read(path, (VAE_PREFIX,))
    if "first_stage_model.encoder.conv_in.weight" not in state:
        raise ValueError(
            f"{path} holds no VAE (first_stage_model.* tensors): --images decodes with the checkpoint's own VAE"
        )
    config = vae_config({k[len(VAE_PREFIX) :]: v for k, v in state.items()}, VAE_SCALING[spec.family])
    vae = AutoencoderKL(**config)
    converted = convert_ldm_vae_checkpoint(state, config)
    vae.load_state_dict({k: v.float() for k, v in converted.items()})
    return vae.to(device).eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------------- the prompt


@dataclass
class TextEncoders:
    """The pipeline's text components (empty when the prompt falls back to seeded states) and what the grid says."""

    parts: dict[str, Any]
    note: str

    @property
    def encoded(self) -> bool:
        return bool(self.parts)


def load_tokenizer(source: str, pad_token: str | None = None) -> Any:
    """CLIP's tokenizer from a folder or the local Hugging Face cache, never from the network; ValueError if absent.

    transformers 5 returns a tokenizer holding only its special tokens when the vocabulary files are missing, instead
    of raising: a byte-level CLIP vocabulary has at least 512 entries.
    """
    from transformers import CLIPTokenizer

    extra = {} if pad_token is None else {"pad_token": pad_token}
    try:
        tokenizer = CLIPTokenizer.from_pretrained(source, local_files_only=True, **extra)
    except (OSError, ValueError) as exc:
        raise ValueError(f"no CLIP tokenizer at {source!r} on this machine ({type(exc).__name__})") from None
    if len(tokenizer) < 512:
        raise ValueError(f"no CLIP tokenizer vocabulary at {source!r} on this machine (not in the local cache)")
    return tokenizer


def _text_config(tokenizer: Any, **values: Any) -> Any:
    from transformers import CLIPTextConfig

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    return CLIPTextConfig(pad_token_id=tokenizer.pad_token_id, **ids, **values)


def _load_into(model: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> nn.Module:
    """Load `state` into `model`, matching names with or without the `text_model.` level (transformers 4 writes it,
    5 leaves it out of `CLIPTextModel`); ValueError naming what does not fit."""
    expected = model.state_dict()
    fitted: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        bare = key.removeprefix("text_model.")
        name = next((k for k in (key, bare, f"text_model.{bare}") if k in expected), None)
        if name is not None:
            fitted[name] = value.to(expected[name].dtype)
    missing = sorted(set(expected) - set(fitted) - {k for k in expected if k.endswith("position_ids")})
    wrong = [k for k, v in fitted.items() if v.shape != expected[k].shape]
    if missing or wrong:
        raise ValueError(f"the checkpoint's {what} does not fit: missing {missing[:3]}, other shape {wrong[:3]}")
    model.load_state_dict(fitted, strict=False)
    return model.eval().requires_grad_(False)


def clip_l(state: Mapping[str, torch.Tensor], prefix: str, tokenizer: Any) -> nn.Module:
    """OpenAI CLIP's text encoder (SD1.x, SDXL's first) from the `prefix` tensors, its config from their shapes."""
    from transformers import CLIPTextModel

    sd = {k[len(prefix) :].removeprefix("text_model."): v for k, v in state.items() if k.startswith(prefix)}
    vocab, hidden = sd["embeddings.token_embedding.weight"].shape
    config = _text_config(
        tokenizer, vocab_size=int(vocab), hidden_size=int(hidden), num_attention_heads=max(1, int(hidden) // HEAD_WIDTH),
        intermediate_size=int(sd["encoder.layers.0.mlp.fc1.weight"].shape[0]), hidden_act="quick_gelu",
        num_hidden_layers=_count(sd, "encoder.layers.{}.self_attn.q_proj.weight"),
        max_position_embeddings=int(sd["embeddings.position_embedding.weight"].shape[0]),
    )  # fmt: skip
    return _load_into(CLIPTextModel(config), sd, "CLIP text encoder")


def open_clip_g(state: Mapping[str, torch.Tensor], tokenizer: Any) -> nn.Module:
    """SDXL's second text encoder (OpenCLIP, with its projection) from the open_clip-layout tensors."""
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint
    from transformers import CLIPTextModelWithProjection

    p = OPEN_CLIP_PREFIX
    vocab, hidden = state[f"{p}token_embedding.weight"].shape
    config = _text_config(
        tokenizer, vocab_size=int(vocab), hidden_size=int(hidden), num_attention_heads=max(1, int(hidden) // HEAD_WIDTH),
        intermediate_size=int(state[f"{p}transformer.resblocks.0.mlp.c_fc.weight"].shape[0]), hidden_act="gelu",
        num_hidden_layers=_count(state, p + "transformer.resblocks.{}.ln_1.weight"),
        max_position_embeddings=int(state[f"{p}positional_embedding"].shape[0]),
        projection_dim=int(state[f"{p}text_projection"].shape[1]),
    )  # fmt: skip
    model = CLIPTextModelWithProjection(config)
    return _load_into(model, convert_open_clip_checkpoint(model, dict(state), prefix=p), "OpenCLIP text encoder")


def load_text_encoders(
    path: str, spec: archs.Arch, device: torch.device, dtype: torch.dtype, tokenizer_source: str = CLIP_TOKENIZER
) -> TextEncoders:
    """The checkpoint's text encoder(s) and tokenizer(s) for the pipeline, or none and why (seeded text states)."""
    fam = spec.family
    fallback = "seeded random text states, not the prompt"
    try:
        tokenizer = load_tokenizer(tokenizer_source)
    except ValueError as exc:
        return TextEncoders({}, f"{fallback}: {exc}; the prompt is encoded once {tokenizer_source} is in the cache")
    prefixes = (CLIP_L_PREFIXES[fam], *([OPEN_CLIP_PREFIX] if fam == "sdxl" else []))
    state = _read(path, prefixes)
    if not any(k.startswith(CLIP_L_PREFIXES[fam]) for k in state):
        return TextEncoders({}, f"{fallback}: the checkpoint holds no {CLIP_L_PREFIXES[fam]}* text encoder")
    try:
        parts: dict[str, Any] = {"text_encoder": clip_l(state, CLIP_L_PREFIXES[fam], tokenizer), "tokenizer": tokenizer}
        if fam == "sdxl":
            # SDXL's second tokenizer is CLIP's, padding with "!" as OpenCLIP does.
            second = load_tokenizer(tokenizer_source, pad_token="!")
            parts.update(text_encoder_2=open_clip_g(state, second), tokenizer_2=second)
    except (KeyError, ValueError) as exc:
        return TextEncoders({}, f"{fallback}: {exc}")
    vocab = min(m.config.vocab_size for k, m in parts.items() if k.startswith("text_encoder"))
    if len(tokenizer) > vocab:
        return TextEncoders(
            {}, f"{fallback}: the tokenizer's {len(tokenizer)} tokens do not fit the {vocab} of the encoder"
        )
    for key in ("text_encoder", "text_encoder_2"):
        if key in parts:
            parts[key] = parts[key].to(device=device, dtype=dtype)
    names = "the checkpoint's CLIP text encoder" + (" and OpenCLIP text encoder" if fam == "sdxl" else "")
    return TextEncoders(parts, f"the prompt, encoded by {names}")


def prompt_inputs(pipe: Any, spec: archs.Arch, prompt: str, device: torch.device) -> dict[str, torch.Tensor]:
    """The pipeline's prompt embeddings for `prompt` and an empty negative prompt, from its own `encode_prompt`."""
    with torch.inference_mode():
        if spec.text_time:
            cond, uncond, pooled, uncond_pooled = pipe.encode_prompt(prompt, device=device, negative_prompt="")
            pooled_embeds = {"pooled_prompt_embeds": pooled, "negative_pooled_prompt_embeds": uncond_pooled}
            return {"prompt_embeds": cond, "negative_prompt_embeds": uncond, **pooled_embeds}
        cond, uncond = pipe.encode_prompt(prompt, device, 1, True, negative_prompt="")
    return {"prompt_embeds": cond, "negative_prompt_embeds": uncond}


# ---------------------------------------------------------------------------------------------- the measures


def luminance(image: torch.Tensor) -> torch.Tensor:
    """[3, H, W] RGB in [0, 1] -> [H, W] luma (ITU-R BT.601 weights), float64."""
    r, g, b = image.double()
    return 0.299 * r + 0.587 * g + 0.114 * b


def hf_energy(image: torch.Tensor, cutoff: float = HF_CUTOFF) -> float:
    """The image's high-frequency energy: the power of its luma's 2D FFT above `cutoff` x Nyquist in radius.

    ToDo (arXiv 2402.13573) reports how much high-frequency detail a method keeps; `hf_kept` is this energy of a
    patched image over the unpatched one's (below 1: detail lost, above 1: detail or noise added)."""
    y = luminance(image)
    height, width = y.shape
    power = torch.fft.fft2(y - y.mean()).abs().square()
    fy = torch.fft.fftfreq(height, dtype=torch.float64)[:, None]
    radius = torch.hypot(fy, torch.fft.fftfreq(width, dtype=torch.float64)[None, :])
    return float(power[radius > cutoff * 0.5].sum())


def hf_kept(image: torch.Tensor, base: torch.Tensor) -> float | None:
    """`hf_energy(image) / hf_energy(base)`; None when the base has none."""
    reference = hf_energy(base)
    return hf_energy(image) / reference if reference > 0 else None


def psnr(image: torch.Tensor, base: torch.Tensor) -> float | None:
    """PSNR in dB of two images in [0, 1] (peak 1); None when identical."""
    mse = float((image.double() - base.double()).square().mean())
    return None if mse == 0.0 else 10.0 * math.log10(1.0 / mse)


# ---------------------------------------------------------------------------------------------- the run


@dataclass
class Tile:
    """One variant: its label, what it ran (TomeConfig fields as resolved for the model; None unpatched), its timed
    generations and measures."""

    variant: str
    label: str
    fields: dict[str, Any] | None
    times_s: list[float] = field(default_factory=list)
    speed: float | None = None
    psnr_db: float | None = None
    hf_kept: float | None = None
    latent_change: float | None = None
    error: str | None = None

    @property
    def seconds(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None

    def lines(self) -> list[str]:
        """The label under its image."""
        if self.error is not None:
            return [self.label, "failed", self.error[:40]]
        if self.fields is None:
            return [self.label, f"{_seconds(self.seconds)} (the reference)", "", ""]
        psnr_text = "identical" if self.psnr_db is None else f"PSNR {self.psnr_db:.1f} dB"
        speed = f"speed {self.speed or 0:.2f}x ({_seconds(self.seconds)})"
        return [
            self.label,
            speed,
            f"{psnr_text}, HF kept {_num(self.hf_kept)}",
            f"latent change {_num(self.latent_change, '.4f')}",
        ]


def _seconds(value: float | None) -> str:
    """'12 s', '3.4 s', '0.045 s': two or three significant digits."""
    if value is None:
        return "-"
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s" if value >= 1 else f"{value:.2g} s"


def _num(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _variants(opts: Options) -> list[tuple[str, str, str | None]]:
    """(variant, label, preset) of the unpatched model and each preset."""
    labels = {p.name: p.label for p in tome_core.presets()}
    return [("unpatched", "unpatched", None)] + [(name, labels[name], name) for name in opts.presets]


def _decode(pipe: Any, latents: torch.Tensor) -> torch.Tensor:
    """[1, 4, h, w] final latent -> [3, H, W] float32 image in [0, 1] on the CPU, in float32 by the VAE."""
    vae = pipe.vae
    with torch.inference_mode():
        image = vae.decode(latents.to(device=vae.device, dtype=torch.float32) / vae.config.scaling_factor).sample
    return (image[0].float().cpu() / 2 + 0.5).clamp(0, 1)


Outputs = dict[str, tuple[torch.Tensor, torch.Tensor]]


def generate_all(opts: Options, pipe: Any, inputs: generate.GenInputs) -> tuple[list[Tile], Outputs]:
    """Every variant's generations, round-robin: (tiles, variant -> (final latent, decoded image) of its first).

    Round 0 is untimed and runs one sampler step per variant: one-time costs (kernel selection, allocator growth, a
    patch's tables per grid) would otherwise land on each variant's first timed generation."""
    from tqdm import tqdm

    variants = _variants(opts)
    tiles = [Tile(v, label, None) for v, label, _ in variants]
    outputs: Outputs = {}
    with tqdm(total=len(tiles) * (opts.repeats + 1), unit="image", file=sys.stderr) as bar:
        for rep in range(-1, opts.repeats):
            for tile, (_, _, preset) in zip(tiles, variants):
                bar.set_postfix_str(tile.label + (" (1 step, untimed)" if rep < 0 else ""))
                if tile.error is not None:
                    bar.update(1)
                    continue
                kwargs = inputs.kwargs(steps=1 if rep < 0 else None)
                try:
                    if preset is not None:
                        tome_core.apply_patch(pipe, preset=preset)
                        config = tome_core.get_config(pipe)
                        tile.fields = {} if config is None else config.to_dict()
                    seconds, out, _ = timed_call(partial(pipe, **kwargs), opts.device, clock_name=opts.clock)
                except Exception as exc:  # one preset failing must not cost the others: its tile says why
                    if preset is None:
                        raise
                    tile.error = f"{type(exc).__name__}: {exc}"
                    continue
                finally:
                    tome_core.remove_patch(pipe)
                    bar.update(1)
                if rep >= 0:
                    tile.times_s.append(seconds)
                if rep == 0:
                    latents = out.images if hasattr(out, "images") else out[0]
                    outputs[tile.variant] = (latents.float().cpu(), _decode(pipe, latents))
    return tiles, outputs


def measure(tiles: Sequence[Tile], outputs: Outputs) -> None:
    """Fill each tile's speed, PSNR, HF kept and latent change against the unpatched tile."""
    base = tiles[0]
    base_latent, base_image = outputs[base.variant]
    for tile in tiles:
        if tile.error is not None or tile.variant not in outputs:
            continue
        latent, image = outputs[tile.variant]
        tile.speed = (base.seconds or 0.0) / (tile.seconds or 1.0)
        tile.psnr_db = psnr(image, base_image)
        tile.hf_kept = hf_kept(image, base_image)
        tile.latent_change = run.deviation(latent, base_latent)


# ---------------------------------------------------------------------------------------------- the grid


def to_pil(image: torch.Tensor) -> Any:
    from PIL import Image

    array = (image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    return Image.fromarray(array)


def draw_grid(images: Sequence[Any], tiles: Sequence[Tile], caption: Sequence[str]) -> Any:
    """One row of tiles, each image with its label lines under it, and the caption lines under the row. The PNG
    text chunk "tiles" (see `save_grid`) lists the labels, for a program to read."""
    from PIL import Image, ImageDraw, ImageFont

    width, height = images[0].size
    scale = max(1, math.ceil(MIN_TILE / width))
    cell_w, cell_h = width * scale, height * scale
    font = ImageFont.load_default(size=max(12, cell_w // 22))
    line_h = int(font.size * 1.35)
    pad = line_h // 2
    label_h = pad + line_h * max(len(t.lines()) for t in tiles)
    grid_w = len(images) * cell_w + (len(images) + 1) * pad
    # The default font's glyphs average about 0.55 of its size in width.
    caption = [part for line in caption for part in textwrap.wrap(line, max(20, int(grid_w / (font.size * 0.55))))]
    grid = Image.new("RGB", (grid_w, pad + cell_h + label_h + pad + line_h * len(caption) + pad), "white")
    draw = ImageDraw.Draw(grid)
    for i, (image, tile) in enumerate(zip(images, tiles)):
        x = pad + i * (cell_w + pad)
        grid.paste(image.resize((cell_w, cell_h), Image.NEAREST), (x, pad))
        for j, line in enumerate(tile.lines()):
            draw.text((x, pad + cell_h + pad + j * line_h), line, fill="black", font=font)
    y = pad + cell_h + label_h + pad
    for j, line in enumerate(caption):
        draw.text((pad, y + j * line_h), line, fill="dimgray", font=font)
    return grid


def save_grid(grid: Any, path: Path, tiles: Sequence[Tile]) -> None:
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("tiles", json.dumps([t.lines() for t in tiles]))
    grid.save(path, pnginfo=info)


def format_table(tiles: Sequence[Tile]) -> str:
    lines = [
        "| variant | seconds | speed | PSNR dB | HF kept | latent change |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for t in tiles:
        if t.error is not None:
            lines.append(f"| {t.label} | failed: {t.error} | | | | |")
            continue
        psnr_text = "identical" if t.fields is not None and t.psnr_db is None else _num(t.psnr_db, ".2f")
        lines.append(
            f"| {t.label} | {_num(t.seconds, '.2f')} | {_num(t.speed, '.2f')}x | {psnr_text} | {_num(t.hf_kept)}"
            f" | {_num(t.latent_change, '.4f')} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main


#: The prompt unless --prompt says otherwise.
PROMPT = "a lighthouse on a rocky coast at sunset, waves, detailed photograph"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tome_bench images", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="a single-file SD1.5 or SDXL .safetensors")
    p.add_argument("--prompt", default=PROMPT, help=f"the prompt (default {PROMPT!r})")
    p.add_argument("--steps", type=int, default=20, help="sampler steps (default 20)")
    p.add_argument("--scheduler", choices=options.SCHEDULERS, default="euler", help="sampler (default euler)")
    p.add_argument("--guidance", type=float, default=7.0, help="classifier-free guidance (default 7)")
    defaults = {"arch": "the checkpoint's", "sizes": "the architecture's native one", "presets": "all", "repeats": 1}
    keys = ("arch", "sizes", "presets", "repeats", "seed", "device", "dtype", "threads", "clock", "out")
    return options.add(p, *keys, defaults=defaults | {"device": "cuda where available", "out": "bench-out"})


def parse_options(argv: Sequence[str]) -> Options:
    def make(a: argparse.Namespace) -> Options:
        if not os.path.isfile(a.checkpoint) or not a.checkpoint.endswith(".safetensors"):
            raise ValueError(f"--checkpoint must be a .safetensors file, got {a.checkpoint!r}")
        a.arch = a.arch or archs.checkpoint_arch(a.checkpoint)
        cuda = a.device is None and a.clock != "cpu" and torch.cuda.is_available()
        opts = options.build("images", a, Defaults({}, 1, presets="all"), "cuda" if cuda else None)
        if len(opts.arches) != 1 or len(opts.sizes) != 1 or a.steps < 1:
            raise ValueError(f"images makes one grid of one architecture at one size, got {a.arch} at {a.sizes}")
        opts.steps, opts.scheduler, opts.guidance, opts.prompt = a.steps, a.scheduler, a.guidance, a.prompt
        return opts

    return options.parse(build_parser(), argv, make)


def main(argv: Sequence[str], tokenizer_source: str = CLIP_TOKENIZER) -> int:
    """Generate, decode, measure, and write the grid and the numbers; 0 when the unpatched image is finite, 2 when
    the checkpoint does not hold the architecture's UNet or a VAE."""
    opts = parse_options(argv)
    assert opts.checkpoint is not None and opts.steps is not None
    started = time.perf_counter()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    spec = opts.arches[0]
    height, width = opts.sizes_of(spec.name)[0]
    print(f"loading {opts.checkpoint} ({spec.label}) ...", file=sys.stderr, flush=True)
    unet = archs.build_unet(spec, opts.dtype, opts.device, opts.seed)
    try:
        archs.load_checkpoint(unet, opts.checkpoint, spec)
        vae = load_vae(opts.checkpoint, spec, opts.device)
    except ValueError as exc:  # a checkpoint of another model or without a VAE: say which, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = load_text_encoders(opts.checkpoint, spec, opts.device, opts.dtype, tokenizer_source)
    print(f"text: {text.note}", file=sys.stderr, flush=True)
    pipe = generate.build_pipeline(spec, unet, opts.scheduler, name=opts.checkpoint, parts={"vae": vae, **text.parts})
    common = {"steps": opts.steps, "guidance": opts.guidance, "dtype": opts.dtype, "device": opts.device}
    inputs = generate.make_gen_inputs(
        spec, height, width, latent_kind="noise", seed=opts.seed, scheduler=opts.scheduler, **common
    )
    if text.encoded:
        inputs.fixed.update(prompt_inputs(pipe, spec, opts.prompt, opts.device))
    tiles, outputs = generate_all(opts, pipe, inputs)
    measure(tiles, outputs)

    where = str(opts.device) if opts.device.type != "cuda" else torch.cuda.get_device_name(opts.device)
    size = run.size_label((height, width))
    caption = [
        f"{Path(opts.checkpoint).name}, {spec.label}, {size} px, seed {opts.seed},"
        f" {opts.steps} {report.SCHEDULER_LABELS[opts.scheduler]} steps, guidance {opts.guidance:g}",
        f"prompt: {opts.prompt!r}" if text.encoded else f"text: {text.note}",
        f"speed: sampler time on {where} ({opts.dtype_name}), unpatched over this, median of {opts.repeats} in one"
        " process; HF kept: high-frequency energy (periods under 8 px) over the unpatched image's",
    ]
    opts.out.mkdir(parents=True, exist_ok=True)
    folder = opts.out / "images"
    folder.mkdir(exist_ok=True)
    pictures = [to_pil(outputs[t.variant][1] if t.variant in outputs else torch.ones(3, height, width)) for t in tiles]
    for tile, picture in zip(tiles, pictures):
        if tile.variant in outputs:
            picture.save(folder / f"{tile.variant}.png")
    paths = [opts.out / "images.png", opts.out / "images.json", opts.out / "images.md"]
    save_grid(draw_grid(pictures, tiles, caption), paths[0], tiles)
    wall = time.perf_counter() - started
    table = format_table(tiles)
    data = {
        "command": [*report.COMMAND, "images", *argv],
        "checkpoint": opts.checkpoint,
        "arch": spec.name,
        "size": size,
    }
    data |= {"prompt": opts.prompt, "text": text.note, "prompt_encoded": text.encoded, "seed": opts.seed}
    data |= {"steps": opts.steps, "scheduler": opts.scheduler, "guidance": opts.guidance, "device": where}
    data |= {"dtype": opts.dtype_name, "clock": opts.clock, "repeats": opts.repeats, "hf_cutoff_of_nyquist": HF_CUTOFF}
    data |= {"rows": [{**asdict(t), "seconds": t.seconds} for t in tiles], "wall_s": wall}
    paths[1].write_text(json.dumps(data, indent=2))
    title = f"# Your checkpoint, unpatched and at each preset: {Path(opts.checkpoint).name}"
    command = f"Command: `{report.command_line(['images', *argv])}`"
    paths[2].write_text(
        "\n".join([title, "", command, "", *[f"- {c}" for c in caption], "", "![grid](images.png)", "", table, ""])
    )
    print(table)
    print(f"\ntext: {text.note}")
    print(f"wrote {', '.join(map(str, paths))} and {folder}/ ({wall:.1f} s)")
    base = outputs.get(tiles[0].variant)
    return 0 if base is not None and torch.isfinite(base[1]).all() else 1
