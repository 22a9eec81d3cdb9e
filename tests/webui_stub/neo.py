"""A Forge Neo-shaped stand-in, on top of `webui_stub.forge`.

Read from Neo's tree (`nolanlane/sd-webui-forge-classic` at 3df257ae13e3, a squashed copy of Haoming02's `neo`
branch; see docs/hosts.md) and checked against it running here. Neo keeps Forge 2's model objects and callback order
(`modules/processing.py`): `sd_model.forge_objects.unet` is a patcher reset to `forge_objects_after_applying_lora`
before every sampling, `apply_token_merging` adds `TomePatcher` attn1 patches when the ratio is above 0, and the
hires pass calls `process_before_every_sampling` twice (the first call's patches are thrown away). What differs from
Forge 2, modelled here:

* `modules/sd_models.py: apply_token_merging` then adds Neo's epsilon scaling (`backend/misc/eps.py:
  EpsilonScaling.patch`) when the `scaling_factor` setting is above 1 and `sd_model.model_config.model_type.name`
  is "EPS": a clone of the patcher with a function in `model_options["sampler_post_cfg_function"]`. Taking the
  built-in off must keep it.
* Engines (`backend/diffusion_engine/`): `StableDiffusion` and `StableDiffusionXL` hold an ldm UNet; the others hold
  a transformer as `forge_objects.unet.model.diffusion_model` (Flux, Flux2, Chroma, Lumina2, ZImage, Anima, Wan,
  QwenImage; `is_wan` on Wan, QwenImage and Anima, which take the Wan VAE's 5-D latent). Each holds a tiny
  transformer of the class Neo's loader builds for it (`backend/loader.py`; `webui_stub/backend/nn/`): Flux and Flux2
  `IntegratedFluxTransformer2DModel`, Chroma `IntegratedChromaTransformer2DModel`, Wan `WanModel`, QwenImage
  `QwenImageTransformer2DModel`, Lumina2 and ZImage `NextDiT`, Anima `Anima`. Their attention goes through
  `backend.attention.attention_function` (PyTorch's SDPA here; a test may pick the basic einsum one, a CPU's default).
  Neo loads no SD2.x checkpoint. Building an engine stands for Neo's loader loading its checkpoint: it sets
  `backend.args.dynamic_args["wan"]` to whether the checkpoint's Hugging Face repo names Wan (`repo`), which with
  `is_wan` makes `process_images_inner` generate one video whose frame count is the batch size.
* The sampler calls the patcher's `model_options["model_function_wrapper"]` around the model when one is set
  (`backend/sampling`, as ComfyUI): Neo's `Spectrum Integrated` (in Haoming02's `neo` branch after 3df257ae,
  `extensions-builtin/sd_forge_spectrum`) sets one on a clone of the patcher in its `process_before_every_sampling`
  and, on the steps it forecasts, returns an extrapolation of earlier outputs without calling the model.
  `SpectrumForForge` here does the same with a simple linear forecast (written here, not Neo's forecaster).
* The built-in `Torch Compile Integrated` (`extensions-builtin/sd_forge_compile/scripts/compile.py`, loaded before
  every user extension): `before_process_batch` puts the plain module back at `kmodel.diffusion_model` (for LoRA);
  `process_batch` puts `torch.compile(module, **config)` there (Neo's three configs, its guard filter included),
  kept from one generation to the next while its preset is "Automatic" (the default, so also for API requests that
  do not name it) and removed by "Disable". Dynamo traces the stand-in UNet for real, with a counting backend.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass
from typing import Any

import torch
from backend import args as backend_args
from modules import script_callbacks, scripts, sd_models, shared
from torch import nn

import tome_core
from tome_webui.params import ARG_NAMES, IMG2IMG_ARG_NAMES, TITLE
from webui_stub import forge, harness

_forge_builtin = forge.apply_token_merging  # the tests put `apply_token_merging` below in its place
POST_CFG = "sampler_post_cfg_function"


class StableDiffusion(forge.Engine):
    """Neo's SD1.5 engine (`backend/diffusion_engine/sd15.py`): Forge 2's shape plus `is_wan` and a model config."""

    model_type = "EPS"
    repo = ""  # the Hugging Face repo Neo's loader guesses for the checkpoint (`estimated_config.huggingface_repo`)

    def __init__(self, diffusion_model: nn.Module, *, is_sdxl: bool = False) -> None:
        super().__init__(diffusion_model, is_sdxl=is_sdxl)
        self.is_wan = False
        backend_args.dynamic_args["wan"] = "Wan" in self.repo  # as `backend/loader.py` sets it on every load
        self.model_config = types.SimpleNamespace(model_type=types.SimpleNamespace(name=self.model_type))


class StableDiffusionXL(StableDiffusion):
    def __init__(self, diffusion_model: nn.Module) -> None:
        super().__init__(diffusion_model, is_sdxl=True)


def _seeded(build: Any) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build().eval()


class Flux(StableDiffusion):
    """A transformer model, no UNet: the tiny transformer of the class Neo's loader builds for the engine.
    `model_type` as Neo's huggingface_guess model list gives it."""

    model_type = "FLUX"
    wan = False  # `is_wan`: the model uses the Wan VAE (5-D latents)
    frames: int | None = None  # latent frames of a 5-D latent ([B, C, T, H, W]); None: [B, C, H, W]

    @staticmethod
    def transformer() -> nn.Module:
        from backend.nn.flux import IntegratedFluxTransformer2DModel

        return IntegratedFluxTransformer2DModel()

    def __init__(self) -> None:
        super().__init__(_seeded(self.transformer))
        self.is_wan = self.wan


class Flux2(Flux):
    pass  # Neo builds Flux.2 (Klein) with its Flux.1 class


class Chroma(Flux):
    @staticmethod
    def transformer() -> nn.Module:
        from backend.nn.chroma import IntegratedChromaTransformer2DModel

        return IntegratedChromaTransformer2DModel()


class Lumina2(Flux):
    model_type = "FLOW"

    @staticmethod
    def transformer() -> nn.Module:
        from backend.nn.lumina import NextDiT

        return NextDiT()


class ZImage(Lumina2):
    @staticmethod
    def transformer() -> nn.Module:
        from backend.nn.lumina import NextDiT

        return NextDiT(pad_tokens_multiple=32)  # Neo's Z-Image config pads captions and images to 32 tokens


class Wan(Flux):
    model_type = "FLOW"
    repo = "Wan-AI/Wan2.1-T2V-14B"
    wan = True
    frames = 3

    @staticmethod
    def transformer() -> nn.Module:
        from backend.nn.wan import WanModel

        return WanModel()


class QwenImage(Wan):
    repo = "Qwen/Qwen-Image"  # the Wan VAE (`is_wan`) but no Wan repo: Neo makes a batch of images of it
    frames = 1

    @staticmethod
    def transformer() -> nn.Module:
        from backend.nn.qwen import QwenImageTransformer2DModel

        return QwenImageTransformer2DModel()


class Anima(Flux):
    model_type = "EPS"  # no override in the model list: the base class's EPS, so the epsilon scaling applies
    wan = True
    frames = 1

    @staticmethod
    def transformer() -> nn.Module:
        from backend.nn.anima import Anima as AnimaTransformer

        return AnimaTransformer()


TRANSFORMER_ENGINES: tuple[type[Flux], ...] = (Flux, Flux2, Chroma, Lumina2, ZImage, Anima, Wan, QwenImage)
#: The engines whose transformer `tome_core` reduces (its Forge Neo layouts), and those it names and leaves alone.
REDUCED_ENGINES: tuple[type[Flux], ...] = (Flux, Flux2, Chroma, Lumina2, ZImage, Wan, QwenImage)
UNHANDLED_ENGINES: tuple[type[Flux], ...] = (Anima,)


class EpsilonScaling:
    @staticmethod
    def patch(model: forge.UnetPatcher, scaling_factor: float) -> forge.UnetPatcher:
        def epsilon_scaling_function(args: dict[str, torch.Tensor]) -> torch.Tensor:
            x = args["input"]
            return x - (x - args["denoised"]) / scaling_factor

        clone = model.clone()
        clone.model_options[POST_CFG] = [*clone.model_options.get(POST_CFG, []), epsilon_scaling_function]
        return clone


def apply_token_merging(engine: Any, ratio: float) -> None:
    """Neo's `sd_models.apply_token_merging`: the built-in merging, then its epsilon scaling."""
    _forge_builtin(engine, ratio)
    factor = float(shared.opts.data.get("scaling_factor", 1.0))
    if factor > 1.0 and engine.model_config.model_type.name == "EPS":
        engine.forge_objects.unet = EpsilonScaling.patch(engine.forge_objects.unet, factor)


def epsilon_scaling(patcher: forge.UnetPatcher) -> bool:
    """Whether Neo's epsilon scaling is on the patcher."""
    return any("EpsilonScaling." in fn.__qualname__ for fn in patcher.model_options.get(POST_CFG, []))


# ---------------------------------------------------------------------------------------------- Torch Compile


COMPILE_TITLE = "Torch Compile Integrated"
COMPILE_PRESETS = ("guard_filter_fn", "dynamic", "cudagraphs")


def skip_torch_compile_dict(guard_entries: list[Any]) -> list[bool]:
    """Neo's guard filter (after ComfyUI's): every guard whose name mentions `transformer_options` is dropped."""
    return [("transformer_options" not in entry.name) for entry in guard_entries]


def preset_config(preset: str, backend: Any) -> dict[str, Any] | None:
    """Neo's `match preset` in `process_batch`: a new dict per call, with `backend` in place of Neo's "inductor" and
    "cudagraphs" (the stand-in's counting backend; dynamo traces, guards and recompiles as it does for Neo's)."""
    configs: dict[str, dict[str, Any]] = {
        "guard_filter_fn": {
            "backend": backend,
            "dynamic": False,
            "fullgraph": False,
            "options": {"guard_filter_fn": skip_torch_compile_dict},
        },
        "dynamic": {"backend": backend, "dynamic": True, "fullgraph": False},
        "cudagraphs": {"backend": backend, "dynamic": True, "fullgraph": True},
    }
    return configs.get(preset)


class TorchCompileForForge(scripts.Script):
    """Neo's built-in compile script: swaps `kmodel.diffusion_model` for a `torch.compile` wrapper per batch.

    As Neo's, the config dict is handed to `torch.compile` itself, which pops `guard_filter_fn` out of its `options`:
    the config kept as `kmodel._compile_config` then has `options={}`, so naming "guard_filter_fn" again compiles a
    new wrapper while "Automatic" puts the kept one back. Neo's `__init__` also sets
    `torch._dynamo.config.cache_size_limit = 256` for the whole process; the stand-in changes no global setting.
    `backend`: what the wrappers compile with (`NeoWebUI` gives each host its own `harness.GraphCounter`).
    """

    backend: Any = "eager"

    def title(self) -> str:
        return COMPILE_TITLE

    def show(self, is_img2img: bool) -> Any:
        return scripts.AlwaysVisible

    def before_process_batch(self, p: Any, *args: Any, **kwargs: Any) -> None:
        kmodel = p.sd_model.forge_objects.unet.model
        if hasattr(kmodel, "_compile_config"):
            kmodel._compiled_backup = kmodel.diffusion_model
            kmodel.diffusion_model = kmodel._model_backup

    def process_batch(self, p: Any, preset: str = "Automatic", *args: Any, **kwargs: Any) -> None:
        kmodel = p.sd_model.forge_objects.unet.model
        compiled = hasattr(kmodel, "_compile_config")
        if not (compiled if preset == "Automatic" else preset != "Disable"):
            if compiled:
                self.restore(kmodel)
            return
        config = preset_config(preset, self.backend) or kmodel._compile_config
        if compiled:
            if kmodel._compile_config == config:
                kmodel.diffusion_model = kmodel._compiled_backup
                del kmodel._compiled_backup
                return
            self.restore(kmodel)
        kmodel._model_backup = kmodel.diffusion_model
        kmodel.diffusion_model = torch.compile(kmodel.diffusion_model, **config)
        kmodel._compile_config = config

    @staticmethod
    def restore(kmodel: Any) -> None:
        kmodel.diffusion_model = kmodel._model_backup
        del kmodel._compile_config, kmodel._compiled_backup, kmodel._model_backup


# ---------------------------------------------------------------------------------------------- Spectrum


SPECTRUM_TITLE = "Spectrum Integrated"
WRAPPER = "model_function_wrapper"


class SpectrumForForge(scripts.Script):
    """A step cache shaped like Neo's `Spectrum Integrated`: in `process_before_every_sampling` (a built-in, so before
    ours) it clones the patcher and sets a `model_function_wrapper` that runs the model for the first `warmup` steps
    and then every `window`-th step, and on the others returns a forecast (here: the last output plus the last
    change) without calling the model. Args: `[enable, window, warmup]`. `calls` counts the model calls it let
    through, `forecasts` the steps it answered itself."""

    calls = 0
    forecasts = 0

    def title(self) -> str:
        return SPECTRUM_TITLE

    def show(self, is_img2img: bool) -> Any:
        return scripts.AlwaysVisible

    def process_before_every_sampling(
        self, p: Any, enable: bool = False, window: int = 2, warmup: int = 1, *args: Any, **kwargs: Any
    ) -> None:
        if not enable:
            return
        script = self
        seen: list[float] = []
        outputs: list[torch.Tensor] = []

        def spectrum_unet_wrapper(model_function: Any, call: dict[str, Any]) -> torch.Tensor:
            x, t = call["input"], call["timestep"]
            step = float(t.reshape(-1)[0])
            if not seen or step != seen[-1]:
                seen.append(step)
            index = len(seen) - 1
            if index < warmup or (index - warmup) % window == window - 1 or len(outputs) < 2:
                out = model_function(x, t, **call["c"])
                outputs[:] = [*outputs[-1:], out]
                type(script).calls += 1
                return out
            type(script).forecasts += 1
            return outputs[-1] + (outputs[-1] - outputs[-2])

        clone = p.sd_model.forge_objects.unet.clone()
        clone.model_options[WRAPPER] = spectrum_unet_wrapper
        p.sd_model.forge_objects.unet = clone


class NeoWebUI(forge.ForgeWebUI):
    """The Forge stand-in with Neo's built-ins loaded before the extension, as `extensions-builtin/` is: Torch
    Compile Integrated, and a Spectrum-like step cache."""

    def __init__(self, engine: Any, *, extension: bool = True, lazy: bool = True) -> None:
        harness.reset()
        self.graphs = harness.GraphCounter()  # the graphs Torch Compile Integrated's wrappers compiled
        compile_script = type(TorchCompileForForge.__name__, (TorchCompileForForge,), {"backend": self.graphs})
        self.spectrum = type(SpectrumForForge.__name__, (SpectrumForForge,), {"calls": 0, "forecasts": 0})
        scripts.scripts_data.append(scripts.ScriptClassData(compile_script, "compile.py", "", None))
        scripts.scripts_data.append(scripts.ScriptClassData(self.spectrum, "spectrum.py", "", None))
        self.engine = engine
        self.module = harness.load_extension() if extension else None
        self.runners = {}
        for tab, is_img2img in (("txt2img", False), ("img2img", True)):
            runner = scripts.ScriptRunner()
            runner.initialize_scripts(is_img2img)
            counts = {COMPILE_TITLE: 1, SPECTRUM_TITLE: 3, TITLE: len(IMG2IMG_ARG_NAMES if is_img2img else ARG_NAMES)}
            if not extension:
                del counts[TITLE]
            runner.setup_without_ui(counts)
            self.runners[tab] = runner
        if lazy:
            sd_models.model_data.sd_model = forge.FakeInitialModel()
        else:
            sd_models.load(engine, main=True)

    def make_p(
        self,
        tab: str,
        tome: Any = None,
        sampler: forge.ForgeSampler | None = None,
        compile_preset: str = "Automatic",
        spectrum: tuple[bool, int, int] = (False, 2, 1),
        **kwargs: Any,
    ) -> Any:
        p = super().make_p(tab, tome, sampler or NeoSampler(), **kwargs)
        p.script_args = (p.script_args[0], compile_preset, *spectrum, *p.script_args[1:])
        return p


@dataclass
class NeoSampler(forge.ForgeSampler):
    """Forge's stand-in sampler, calling what Neo calls: `kmodel.diffusion_model`, a `torch.compile` wrapper while
    Torch Compile Integrated is on (traced by dynamo for real, with the stand-in's counting backend), through the
    patcher's `model_function_wrapper` when one is set (Spectrum). The latent is 5-D for the engines on the Wan VAE
    (`Flux.frames`). Records the config ToMe put on the model, UNet or transformer."""

    def sample(self, p: Any, pass_name: str, steps: int) -> torch.Tensor:
        engine = p.sd_model
        if self.other_extension is not None:
            engine.forge_objects.unet = self.other_extension(engine.forge_objects.unet)
        size = 2 * self.latent if pass_name == "hires" else self.latent
        g = torch.Generator().manual_seed(1234 + p.iteration)
        frames = getattr(engine, "frames", None)
        x = torch.randn(2, 4, *(() if frames is None else (frames,)), size, size, generator=g)
        context = torch.randn(2, forge.CONTEXT_TOKENS, forge.CONTEXT_DIM, generator=g)
        for step in range(steps):
            script_callbacks.cfg_denoiser_callback(
                script_callbacks.CFGDenoiserParams(None, None, None, step, steps, None, None, harness.Denoiser(p))
            )
            patcher = engine.forge_objects.unet
            module = patcher.model.diffusion_model
            options = copy.copy(patcher.model_options.get("transformer_options", {}))
            t = torch.full((2,), 999.0 * (1 - step / steps))
            wrapper = patcher.model_options.get(WRAPPER)
            if self.fail_at == (pass_name, step):
                raise RuntimeError(f"sampler failed in the {pass_name} pass")
            with torch.no_grad():
                if wrapper is None:
                    x = module(x, t, context=context, transformer_options=options)
                else:
                    call = {"input": x, "timestep": t, "c": {"context": context, "transformer_options": options}}
                    x = wrapper(lambda x, t, module=module, **c: module(x, t, **c), call)
            inner = getattr(module, "_orig_mod", module)
            config = tome_core.get_config(inner) if hosts_patch(inner) else None
            self.records.append(forge.Sampled(pass_name, p.iteration, config, forge.builtin_patched(engine), x.clone()))
        return x


def hosts_patch(module: nn.Module) -> bool:
    """Whether `tome_core` patches this module (a UNet, or a transformer of a family it reduces)."""
    return isinstance(module, forge.ForgeUNet) or tome_core.find_layout(module) is not None
