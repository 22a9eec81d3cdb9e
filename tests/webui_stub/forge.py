"""A Forge-shaped stand-in (Forge 2's `backend/`, and the Forge 1 forks reForge / Forge Classic), written here.

It follows what docs/webui-contract.md section 9 and the issue record of Forge's behaviour, not Forge's code:

* `ForgeUNet`: a small ldm-shaped UNet (`input_blocks` / `middle_block` / `output_blocks`) whose blocks are
  called with `transformer_options`. Its `BasicTransformerBlock` runs the patcher's `attn1_patch` functions
  (after which `attn1` gets the full `context` and `value` explicitly), an `attn1` replace patch (which skips
  the attention module and calls its projections directly) and `attn1_output_patch` functions.
* `UnetPatcher`: a ComfyUI-style patcher: `.model.diffusion_model`, `model_options`, `clone()` (deep-copies the
  options), `set_model_attn1_patch` / `set_model_attn1_output_patch` / `set_model_attn1_replace`.
* `Engine`: the loaded model, not an `nn.Module`, with `forge_objects` and the two copies the host resets it to.
  `FakeInitialModel` is what `sd_model` is before the first load.
* `apply_token_merging`: the host's built-in, a `TomePatcher` whose attn1 patches halve and restore the queries.
* `process_images`: the callback order of Forge 2: the model loads after `before_process`; before every batch
  and every sampling `forge_objects` is reset; in the hires pass `process_before_every_sampling` runs twice and
  the first call's patches are thrown away; `postprocess_batch` runs before the batch's infotext.

`ForgeWebUI` loads `scripts/tome.py` into the stand-in (or not, for the "without the extension" baseline) and runs
generations whose sampler evaluates the real stand-in UNet, so outputs can be compared bitwise.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from modules import processing, script_callbacks, scripts, sd_models, shared
from torch import nn

import tome_core
from tome_webui.params import ARG_NAMES, IMG2IMG_ARG_NAMES, TITLE
from webui_stub import harness

CHANNELS = 32
CONTEXT_DIM = 16
CONTEXT_TOKENS = 5
#: attention depth per downsampling level (levels 1, 2, 4; 4 is the deepest and holds the middle block too)
SD1_DEPTHS: Mapping[int, int] = {1: 2, 2: 1, 4: 1}
SDXL_DEPTHS: Mapping[int, int] = {1: 0, 2: 1, 4: 2}


# ---------------------------------------------------------------------------------------------- the UNet


class CrossAttention(nn.Module):
    def __init__(self, dim: int, context_dim: int | None = None, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(context_dim or dim, dim, bias=False)
        self.to_v = nn.Linear(context_dim or dim, dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(dim, dim))

    def forward(
        self, x: torch.Tensor, context: Any = None, value: Any = None, transformer_options: Any = None
    ) -> torch.Tensor:
        context = x if context is None else context
        value = context if value is None else value
        return self.to_out(attention(self.to_q(x), self.to_k(context), self.to_v(value), self.heads))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, Nq, C] x [B, Nk, C] x [B, Nk, C] -> [B, Nq, C]."""
    b, n, c = q.shape
    split = lambda t: t.reshape(b, t.shape[1], heads, c // heads).transpose(1, 2)
    out = F.scaled_dot_product_attention(split(q), split(k), split(v))
    return out.transpose(1, 2).reshape(b, n, c)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn1 = CrossAttention(dim)
        self.attn2 = CrossAttention(dim, CONTEXT_DIM)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, context: Any = None, transformer_options: Any = None) -> torch.Tensor:
        options = dict(transformer_options or {})
        patches = options.pop("patches", {})
        replace = options.pop("patches_replace", {}).get("attn1", {})
        n = self.norm1(x)
        ctx, value = None, None
        if "attn1_patch" in patches:
            ctx = value = n
            for fn in patches["attn1_patch"]:
                n, ctx, value = fn(n, ctx, value, options)
        key = (*options.get("block", ("", 0)), options.get("block_index", 0))
        if key in replace:
            ctx = n if ctx is None else ctx
            value = ctx if value is None else value
            a = self.attn1
            n = a.to_out(replace[key](a.to_q(n), a.to_k(ctx), a.to_v(value), options))
        else:
            n = self.attn1(n, context=ctx, value=value, transformer_options=options)
        for fn in patches.get("attn1_output_patch", ()):
            n = fn(n, options)
        x = x + n
        x = x + self.attn2(self.norm2(x), context=context, transformer_options=options)
        return x + self.ff(self.norm3(x))


class SpatialTransformer(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(8, CHANNELS)
        self.proj_in = nn.Linear(CHANNELS, CHANNELS)
        self.transformer_blocks = nn.ModuleList(BasicTransformerBlock(CHANNELS) for _ in range(depth))
        self.proj_out = nn.Linear(CHANNELS, CHANNELS)

    def forward(self, x: torch.Tensor, context: torch.Tensor, transformer_options: dict[str, Any]) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.proj_in(self.norm(x).flatten(2).transpose(1, 2))  # [B, h*w, C]
        for index, block in enumerate(self.transformer_blocks):
            transformer_options["block_index"] = index
            tokens = block(tokens, context=context, transformer_options=transformer_options)
        return x + self.proj_out(tokens).transpose(1, 2).reshape(b, c, h, w)


class ResBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(8, CHANNELS)
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.emb = nn.Linear(CHANNELS, CHANNELS)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return x + self.conv(F.silu(self.norm(x))) + self.emb(emb)[:, :, None, None]


class Downsample(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.op = nn.Conv2d(CHANNELS, CHANNELS, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class Upsample(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)

    def forward(self, x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
        return self.conv(F.interpolate(x, size=tuple(size), mode="nearest"))


class Stage(nn.ModuleList):
    """One input/middle/output block: res block, optional attention, optional resampler."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor, options: dict[str, Any], size: Any = None
    ) -> torch.Tensor:
        for layer in self:
            if isinstance(layer, ResBlock):
                x = layer(x, emb)
            elif isinstance(layer, SpatialTransformer):
                x = layer(x, context, options)
            elif isinstance(layer, Upsample):
                x = layer(x, size)
            else:
                x = layer(x)
        return x


class ForgeUNet(nn.Module):
    """ldm-shaped: levels 1, 2, 4; `depths` says how many transformer blocks each level's attention has."""

    def __init__(self, depths: Mapping[int, int]) -> None:
        super().__init__()
        self.levels = (1, 2, 4)
        self.time = nn.Linear(CHANNELS, CHANNELS)
        self.conv_in = nn.Conv2d(4, CHANNELS, 3, padding=1)

        def stage(level: int, resample: type[nn.Module] | None) -> Stage:
            layers: list[nn.Module] = [ResBlock()]
            if depths.get(level):
                layers.append(SpatialTransformer(depths[level]))
            if resample is not None:
                layers.append(resample())
            return Stage(layers)

        self.input_blocks = nn.ModuleList(
            stage(level, Downsample if i < len(self.levels) - 1 else None) for i, level in enumerate(self.levels)
        )
        self.middle_block = stage(self.levels[-1], None)
        self.output_blocks = nn.ModuleList(
            stage(level, Upsample if i < len(self.levels) - 1 else None)
            for i, level in enumerate(reversed(self.levels))
        )
        self.out = nn.Conv2d(CHANNELS, 4, 3, padding=1)

    def forward(
        self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor, transformer_options: dict[str, Any]
    ) -> torch.Tensor:
        transformer_options["original_shape"] = list(x.shape)
        freqs = torch.exp(-math.log(10000) * torch.arange(CHANNELS // 2) / (CHANNELS // 2))
        angles = timesteps[:, None].float() * freqs[None]
        emb = self.time(torch.cat([angles.cos(), angles.sin()], dim=1))
        h = self.conv_in(x)
        skips = []  # the input of each input block, added back before the output block of the same level
        for index, block in enumerate(self.input_blocks):
            transformer_options["block"] = ("input", index)
            skips.append(h)
            h = block(h, emb, context, transformer_options)
        transformer_options["block"] = ("middle", 0)
        h = self.middle_block(h, emb, context, transformer_options)
        for index, block in enumerate(self.output_blocks):
            transformer_options["block"] = ("output", index)
            h = h + skips.pop()
            h = block(h, emb, context, transformer_options, size=skips[-1].shape[-2:] if skips else None)
        return self.out(h)


def build_unet(depths: Mapping[int, int] = SD1_DEPTHS, seed: int = 0) -> ForgeUNet:
    """A fresh random-weight stand-in UNet; the caller's global RNG state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ForgeUNet(depths).eval()


class NotAUNet(nn.Module):
    """A Flux/Chroma/SD3-like diffusion model: a transformer without UNet stages."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: Any, transformer_options: Any) -> Any:
        return self.proj(x)


# ---------------------------------------------------------------------------------------------- the patcher


class KModel(nn.Module):
    def __init__(self, diffusion_model: nn.Module) -> None:
        super().__init__()
        self.diffusion_model = diffusion_model


class UnetPatcher:
    def __init__(self, model: KModel, model_options: dict[str, Any] | None = None) -> None:
        self.model = model
        self.model_options: dict[str, Any] = model_options or {"transformer_options": {}}

    def clone(self) -> UnetPatcher:
        return UnetPatcher(self.model, copy.deepcopy(self.model_options))

    def _patches(self) -> dict[str, list[Any]]:
        return self.model_options.setdefault("transformer_options", {}).setdefault("patches", {})

    def set_model_attn1_patch(self, fn: Callable[..., Any]) -> None:
        self._patches().setdefault("attn1_patch", []).append(fn)

    def set_model_attn1_output_patch(self, fn: Callable[..., Any]) -> None:
        self._patches().setdefault("attn1_output_patch", []).append(fn)

    def set_model_attn1_replace(self, fn: Callable[..., Any], block: str, number: int, index: int) -> None:
        replace = self.model_options.setdefault("transformer_options", {}).setdefault("patches_replace", {})
        replace.setdefault("attn1", {})[(block, number, index)] = fn


@dataclass
class ForgeObjects:
    unet: UnetPatcher

    def shallow_copy(self) -> ForgeObjects:
        return ForgeObjects(self.unet)


class Engine:
    """The loaded model (like a ForgeDiffusionEngine): not an nn.Module, no `.model`."""

    def __init__(self, diffusion_model: nn.Module, *, is_sdxl: bool = False) -> None:
        self.forge_objects = ForgeObjects(UnetPatcher(KModel(diffusion_model)))
        self.forge_objects_original = self.forge_objects.shallow_copy()
        self.forge_objects_after_applying_lora = self.forge_objects.shallow_copy()
        self.is_sdxl = is_sdxl
        self.is_sd1 = not is_sdxl


class FakeInitialModel:
    """What Forge 2 holds as `sd_model` before the first checkpoint is loaded."""

    def __init__(self) -> None:
        self.cond_stage_model = None


class TomePatcher:
    """The host's built-in: merges queries in an attn1 patch and restores them in an attn1 output patch."""

    def patch(self, model: UnetPatcher, ratio: float) -> UnetPatcher:
        kept: list[int] = []

        def tomesd_m(q: Any, k: Any, v: Any, extra_options: Any) -> Any:
            kept[:] = [q.shape[1]]
            return q[:, ::2], k, v

        def tomesd_u(n: Any, extra_options: Any) -> Any:
            return n.repeat_interleave(2, dim=1)[:, : kept[0]]

        clone = model.clone()
        clone.set_model_attn1_patch(tomesd_m)
        clone.set_model_attn1_output_patch(tomesd_u)
        return clone


def apply_token_merging(engine: Engine, ratio: float) -> None:
    if ratio > 0:
        engine.forge_objects.unet = TomePatcher().patch(engine.forge_objects.unet, ratio)


def reforge_torch_compile(engine: Engine, backend: Any) -> nn.Module:
    """reForge's `--torch-compile`, at model load (`modules_forge/forge_loader.py: load_model_for_a1111` calls
    `modules_forge/unet_patcher.py: UnetPatcher.compile_model`): the UNet at `forge_objects.unet.model.
    diffusion_model` becomes `torch.compile(unet, backend=..., fullgraph=False, dynamic=True)` (its inductor settings,
    `mode` "default"), once, before any generation. reForge also sets `suppress_errors=True` and
    `cache_size_limit=32` for the whole process; the stand-in changes no global setting. Returns the plain UNet
    (reForge's `sd_model.model.diffusion_model`, set before the compile)."""
    kmodel = engine.forge_objects.unet.model
    unet = kmodel.diffusion_model
    kmodel.diffusion_model = torch.compile(unet, backend=backend, fullgraph=False, dynamic=True)
    return unet


def builtin_patched(engine: Any) -> bool:
    patches = engine.forge_objects.unet.model_options.get("transformer_options", {}).get("patches", {})
    return any(getattr(fn, "__qualname__", "").startswith("TomePatcher.") for fns in patches.values() for fn in fns)


# ---------------------------------------------------------------------------------------------- generations


@dataclass
class Sampled:
    pass_name: str
    iteration: int
    config: tome_core.TomeConfig | None
    builtin: bool
    output: torch.Tensor


@dataclass
class ForgeSampler:
    """Evaluates the engine's UNet through its patcher, one call per step (cond and uncond in one batch).

    `other_extension(patcher) -> patcher` runs right before sampling, like another extension's
    `process_before_every_sampling` (an attention replace patch, say). `diffusion_model` is called as the host
    calls it: a `torch.compile` wrapper there (reForge's `--torch-compile`) or a UNet compiled in place runs
    compiled (give it `harness.GraphCounter` as its backend: dynamo traces, without generating kernels).
    """

    other_extension: Callable[[UnetPatcher], UnetPatcher] | None = None
    fail_at: tuple[str, int] | None = None
    latent: int = 8  # the first pass's latent side; the hires pass's is twice it
    records: list[Sampled] = field(default_factory=list)

    def sample(self, p: Any, pass_name: str, steps: int) -> torch.Tensor:
        engine = p.sd_model
        if self.other_extension is not None:
            engine.forge_objects.unet = self.other_extension(engine.forge_objects.unet)
        size = 2 * self.latent if pass_name == "hires" else self.latent
        g = torch.Generator().manual_seed(1234 + p.iteration)
        x = torch.randn(2, 4, size, size, generator=g)
        context = torch.randn(2, CONTEXT_TOKENS, CONTEXT_DIM, generator=g)
        for step in range(steps):
            script_callbacks.cfg_denoiser_callback(
                script_callbacks.CFGDenoiserParams(None, None, None, step, steps, None, None, harness.Denoiser(p))
            )
            if self.fail_at == (pass_name, step):
                raise RuntimeError(f"sampler failed in the {pass_name} pass")
            patcher = engine.forge_objects.unet
            module = patcher.model.diffusion_model
            options = copy.copy(patcher.model_options.get("transformer_options", {}))
            t = torch.full((2,), 999.0 * (1 - step / steps))
            with torch.no_grad():
                x = module(x, t, context=context, transformer_options=options)
            unet = getattr(module, "_orig_mod", module)
            config = tome_core.get_config(unet) if isinstance(unet, ForgeUNet) else None
            self.records.append(Sampled(pass_name, p.iteration, config, builtin_patched(engine), x.clone()))
        return x

    def outputs(self) -> list[torch.Tensor]:
        return [r.output for r in self.records]


def reset_forge_objects(engine: Engine, which: str) -> None:
    engine.forge_objects = getattr(engine, which).shallow_copy()


def process_images(p: Any, *, to_load: Any) -> processing.Processed:
    """Forge 2's order for one generation (`to_load`: the engine a lazy first load brings in)."""
    if p.scripts is not None:
        p.scripts.before_process(p)
    if isinstance(sd_models.model_data.sd_model, FakeInitialModel):
        sd_models.load(to_load, main=True)
    stored = {k: shared.opts.data[k] for k in p.override_settings if k in shared.opts.data}
    try:
        for k, v in p.override_settings.items():
            shared.opts.set(k, v, is_api=True, run_callbacks=False)
        return _inner(p)
    finally:
        if p.override_settings_restore_afterwards:
            for k, v in stored.items():
                setattr(shared.opts, k, v)


def _every_sampling(p: Any) -> None:
    p.scripts.process_before_every_sampling(p, x=None, noise=None, c=None, uc=None)


def _inner(p: Any) -> processing.Processed:
    p.scripts.process(p)
    images, infotexts = [], []
    for n in range(p.n_iter):
        p.iteration = n
        engine = p.sd_model
        reset_forge_objects(engine, "forge_objects_original")
        batch = {"batch_number": n, "prompts": [p.prompt], "seeds": [p.seed + n], "subseeds": [0]}
        p.scripts.before_process_batch(p, **batch)
        reset_forge_objects(engine, "forge_objects_after_applying_lora")
        p.scripts.process_batch(p, **batch)
        first = "img2img" if isinstance(p, processing.StableDiffusionProcessingImg2Img) else "first"
        reset_forge_objects(engine, "forge_objects_after_applying_lora")
        apply_token_merging(engine, p.get_token_merging_ratio())
        _every_sampling(p)
        samples = p.sampler.sample(p, first, p.steps)
        if getattr(p, "enable_hr", False):
            p.is_hr_pass = True
            p.scripts.before_hr(p)
            _every_sampling(p)  # its patches are thrown away by the reset below
            reset_forge_objects(engine, "forge_objects_after_applying_lora")
            apply_token_merging(engine, p.get_token_merging_ratio(for_hr=True))
            _every_sampling(p)
            samples = p.sampler.sample(p, "hires", p.hr_second_pass_steps)
            p.is_hr_pass = False
        p.scripts.postprocess_batch(p, samples, batch_number=n)
        images.append(samples)
        infotexts.append(processing.create_infotext(p, n))
    res = processing.Processed(p, images, infotexts)
    p.scripts.postprocess(p, res)
    return res


class ForgeWebUI:
    """The Forge stand-in with the extension loaded (`extension=False`: the host alone, for baselines)."""

    def __init__(self, engine: Any, *, extension: bool = True, lazy: bool = True) -> None:
        harness.reset()
        self.engine = engine
        self.module = harness.load_extension() if extension else None
        self.runners: dict[str, Any] = {}
        for tab, is_img2img in (("txt2img", False), ("img2img", True)):
            runner = scripts.ScriptRunner()
            runner.initialize_scripts(is_img2img)
            counts = {TITLE: len(IMG2IMG_ARG_NAMES if is_img2img else ARG_NAMES)} if extension else {}
            runner.setup_without_ui(counts)
            self.runners[tab] = runner
        if lazy:
            sd_models.model_data.sd_model = FakeInitialModel()
        else:
            sd_models.load(engine, main=True)

    def make_p(self, tab: str, tome: Any = None, sampler: ForgeSampler | None = None, **kwargs: Any) -> Any:
        cls = (
            processing.StableDiffusionProcessingImg2Img
            if tab == "img2img"
            else processing.StableDiffusionProcessingTxt2Img
        )
        args = harness.script_args(tab, tome) if self.module is not None else (0,)
        return cls(scripts=self.runners[tab], script_args=args, sampler=sampler or ForgeSampler(), **kwargs)

    def run(self, tab: str = "txt2img", tome: Any = None, **kwargs: Any) -> tuple[Any, processing.Processed]:
        p = self.make_p(tab, tome, **kwargs)
        return p, process_images(p, to_load=self.engine)
