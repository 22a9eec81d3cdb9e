"""An SD.Next-shaped stand-in (vladmandic/sdnext master 058a7f0), written here from the facts in docs/hosts.md.

* `Pipeline`: the loaded model, a diffusers-pipeline-like object (class name `DiffusionPipeline`: scheduler,
  `components`, `.unet`, a tiny real diffusers `UNet2DConditionModel`); calling it runs `steps` UNet evaluations
  (cond and uncond in one batch) and fires `on_step_end` after each, like SD.Next's `diffusers_callback` (which
  raises to interrupt). `TransformerPipeline` has `.transformer` and no UNet, of a class ToMe does not reduce;
  `FluxPipeline` holds a tiny real diffusers `FluxTransformer2DModel` (`tests/dit_models.py`), called with packed
  tokens and position ids as diffusers' Flux pipeline calls it.
* The built-in token merging of `modules/token_merge.py`: `process_pre` applies it from the settings alone
  (`token_merging_method` "ToMe"/"ToDo", `tome_ratio`/`todo_ratio`; `p` is not passed), `process_post` removes it;
  ToDo swaps every `attn1.processor` and its removal resets every attention processor to `AttnProcessor2_0`
  (another extension's processors too). The infotext's `ToMe`/`ToDo` keys read `p` first, then the settings.
* `SDNextRunner`: no `process_before_every_sampling`, no `before_hr`; each callback gets
  `p.per_script_args[title]` (the API's raw args) when present, else the runner's slice; exceptions are reported
  and swallowed. `on_cfg_denoiser` is never fired; `on_after_process` always is.
* `process_images`: SD.Next's order: `before_process` → override_settings (unknown keys skipped, values equal to
  the setting dropped, restored afterwards) → `process` → per batch `before_process_batch`, `process_batch`, then
  the base pass (`process_pre` → pipeline → `process_post`), the hires pass (`p.is_hr_pass = True`, `init_hr`,
  `process_pre`, the image-to-image pipeline made from the base one (the same UNet), `process_post`), the refiner
  pass (`p.is_refiner_pass`, `shared.sd_refiner`) → `postprocess_batch` → infotext; `postprocess` only when the
  generation was not interrupted; `on_after_process` in `finally`. A RuntimeError inside a pipeline call marks the
  generation interrupted (SD.Next logs it and returns what it has).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from modules import errors, processing, scripts, sd_models, shared
from torch import nn

import tome_core
from tome_webui.params import ARG_NAMES, IMG2IMG_ARG_NAMES, TITLE
from webui_stub import harness

import tiny_models

TOKEN_MERGING_DEFAULTS: dict[str, Any] = {"token_merging_method": "None", "tome_ratio": 0.0, "todo_ratio": 0.0}


# ---------------------------------------------------------------------------------------------- attention processors


class AttnProcessor2_0:
    """diffusers' default processor (what ToDo's removal puts everywhere)."""

    def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None, **kw: Any) -> Any:
        from diffusers.models.attention_processor import AttnProcessor2_0 as Real

        return Real()(attn, hidden_states, encoder_hidden_states, **kw)


class ToDoProcessor(AttnProcessor2_0):
    """The built-in ToDo: self-attention keys/values downsampled (here: every second token)."""

    def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None, **kw: Any) -> Any:
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states[:, ::2]
        return super().__call__(attn, hidden_states, encoder_hidden_states, **kw)


class OtherExtensionProcessor(AttnProcessor2_0):
    """Another extension's processor (an IP-Adapter or a style-align one): the default attention, marked."""


def attention_modules(unet: nn.Module) -> list[nn.Module]:
    return [m for m in unet.modules() if hasattr(m, "set_processor") and hasattr(m, "processor")]


def self_attention_modules(unet: nn.Module) -> list[nn.Module]:
    return [block.attn1 for _, block in tiny_models.transformer_blocks(unet)]


# ---------------------------------------------------------------------------------------------- pipelines


class Scheduler:
    def __init__(self) -> None:
        self.timesteps = torch.tensor([])
        self.step_index: int | None = None


class DiffusionPipeline:
    """The base class name tomesd and SD.Next look for; holds the pipeline's components."""

    def __init__(self, **components: Any) -> None:
        self.scheduler = Scheduler()
        self._components = components
        for name, value in components.items():
            setattr(self, name, value)
        self.sd_checkpoint_info = "stand-in"

    @property
    def components(self) -> dict[str, Any]:
        return dict(self._components)


@dataclass
class Call:
    """One UNet evaluation as the stand-in's pipeline made it."""

    pass_name: str
    iteration: int
    pipeline: str
    config: tome_core.TomeConfig | None
    todo: bool
    output: torch.Tensor


class Pipeline(DiffusionPipeline):
    """A text-to-image pipeline over a tiny diffusers UNet; `img2img()` is the pipeline made from it (same UNet)."""

    def __init__(self, unet: nn.Module, *, name: str = "base", task: str = "txt2img") -> None:
        super().__init__(unet=unet)
        self.name = name
        self.task = task
        self.applied_tome = 0
        self.applied_todo = 0

    def img2img(self) -> Pipeline:
        """Like `set_diffuser_pipe(..., IMAGE_2_IMAGE)`: a new pipeline object sharing the components."""
        pipe = Pipeline(self.unet, name=self.name, task="img2img")
        pipe.applied_tome, pipe.applied_todo = self.applied_tome, self.applied_todo
        return pipe

    def __call__(self, p: Any, pass_name: str, steps: int, size: int, calls: list[Call]) -> torch.Tensor:
        g = torch.Generator().manual_seed(1234 + p.iteration)
        inputs = tiny_models.make_inputs(batch=2, height=size, width=size, seed=7 + p.iteration)
        x = torch.randn(2, 4, size, size, generator=g)
        self.scheduler.timesteps = torch.linspace(999, 0, steps)
        for step in range(steps):
            self.scheduler.step_index = step
            t = torch.full((2,), float(self.scheduler.timesteps[step]))
            added = None
            if getattr(self.unet.config, "addition_embed_type", None) == "text_time":  # SDXL
                added = {"text_embeds": inputs.text_embeds, "time_ids": inputs.time_ids}
            with torch.no_grad():
                x = self.unet(x, t, encoder_hidden_states=inputs.context, added_cond_kwargs=added, return_dict=False)[0]
            todo = any(isinstance(m.processor, ToDoProcessor) for m in self_attention_modules(self.unet))
            calls.append(Call(pass_name, p.iteration, self.name, tome_core.get_config(self.unet), todo, x.clone()))
            on_step_end(p, pass_name, step)
        return x


class TransformerPipeline(DiffusionPipeline):
    """Flux / Qwen-Image: a transformer, no UNet."""

    def __init__(self) -> None:
        super().__init__(transformer=nn.Linear(4, 4))
        self.applied_tome = 0
        self.applied_todo = 0

    def img2img(self) -> TransformerPipeline:
        return self

    def __call__(self, p: Any, pass_name: str, steps: int, size: int, calls: list[Call]) -> torch.Tensor:
        x = torch.zeros(1, 4, size, size)
        for step in range(steps):
            x = x + self.transformer(x.transpose(1, -1)).transpose(1, -1)
            on_step_end(p, pass_name, step)
        return x


class FluxPipeline(DiffusionPipeline):
    """Flux.1 in diffusers: a transformer over packed tokens (a `size` x `size` grid of them; the hires pass's is
    twice as wide), the text first, the grid read from `img_ids`; `img2img()` shares the transformer."""

    def __init__(self, transformer: nn.Module | None = None, *, task: str = "txt2img") -> None:
        import dit_models

        super().__init__(transformer=transformer if transformer is not None else dit_models.flux().build())
        self.name = "base"
        self.task = task
        self.applied_tome = 0
        self.applied_todo = 0

    def img2img(self) -> FluxPipeline:
        return FluxPipeline(self.transformer, task="img2img")

    def __call__(self, p: Any, pass_name: str, steps: int, size: int, calls: list[Call]) -> torch.Tensor:
        import dit_models

        g = torch.Generator().manual_seed(1234 + p.iteration)
        x = torch.randn(2, size * size, 16, generator=g)
        text = torch.randn(2, dit_models.TEXT, 32, generator=g)
        pooled = torch.randn(2, 16, generator=g)
        self.scheduler.timesteps = torch.linspace(1, 0, steps + 1)[:-1]
        for step in range(steps):
            self.scheduler.step_index = step
            with torch.no_grad():
                x = self.transformer(
                    hidden_states=x,
                    encoder_hidden_states=text,
                    pooled_projections=pooled,
                    timestep=torch.full((2,), float(self.scheduler.timesteps[step])),
                    img_ids=dit_models._ids(size, size),
                    txt_ids=torch.zeros(dit_models.TEXT, 3),
                    return_dict=False,
                )[0]
            calls.append(Call(pass_name, p.iteration, self.name, tome_core.get_config(self.transformer), False, x))
            on_step_end(p, pass_name, step)
        return x


#: Settings > Compile, "Torch compile options" (`cuda_compile_options`), SD.Next's default.
COMPILE_OPTIONS: tuple[str, ...] = ("repeated", "dynamic", "components")


def compile_torch(pipe: Pipeline, backend: Any, options: tuple[str, ...] = COMPILE_OPTIONS) -> None:
    """SD.Next's torch.compile of "Model" at load (`modules/sd_models.py: load_diffuser` → `modules/
    sd_models_compile.py: compile_diffusers, compile_torch`), with `backend` for its `cuda_compile_backend`.

    With "components" the pipeline goes through `apply_function_to_model`, and `compile_torch` reads "repeated" on the
    pipeline, which has no `compile_repeated_blocks`: `pipe.unet = torch.compile(unet, ...)`, a wrapper. Without it,
    `compile_torch` gets the UNet itself, and with "repeated" `UNet2DConditionModel.compile_repeated_blocks` compiles
    every `BasicTransformerBlock` in place (`module.compile`). fullgraph and dynamic follow the options; mode is
    `cuda_compile_mode` ("default"). SD.Next also sets `suppress_errors` (on unless "verbose") and inductor options
    for the whole process; the stand-in changes no global setting.
    """
    settings = {"backend": backend, "fullgraph": "fullgraph" in options, "dynamic": "dynamic" in options}
    if "components" not in options and "repeated" in options:
        pipe.unet.compile_repeated_blocks(**settings)
    else:
        pipe.unet = torch.compile(pipe.unet, **settings)


def build_pipeline(kind: str = "diffusers_sd1", seed: int = 0, *, name: str = "base") -> Pipeline:
    return Pipeline(tiny_models.build_unet(kind, seed), name=name)


def on_step_end(p: Any, pass_name: str, step: int) -> None:
    """Like SD.Next's `diffusers_callback`: raises to stop the pipeline when the generation is interrupted."""
    interrupt_at = getattr(p, "interrupt_at", None)
    if interrupt_at == (pass_name, step):
        shared.state.interrupted = True
    if shared.state.interrupted:
        raise AssertionError("Interrupted...")


# ---------------------------------------------------------------------------------------------- built-in merging


def setting(key: str) -> Any:
    return shared.opts.data.get(key, TOKEN_MERGING_DEFAULTS[key])


def apply_token_merging(pipe: Any) -> None:
    """`token_merge.apply_token_merging(shared.sd_model)`: from the settings only."""
    method, tome, todo = (setting(k) for k in TOKEN_MERGING_DEFAULTS)
    if method == "ToMe" and tome > 0:
        pipe.applied_tome = tome  # tomesd itself is not run by the stand-in: the bookkeeping is what matters here
    if method == "ToDo" and todo > 0 and hasattr(pipe, "unet"):
        for attn in self_attention_modules(pipe.unet):
            attn.set_processor(ToDoProcessor())
        pipe.applied_todo = todo


def remove_token_merging(pipe: Any) -> None:
    if getattr(pipe, "applied_todo", 0) > 0:
        for attn in attention_modules(pipe.unet):  # every processor, whoever set it
            attn.set_processor(AttnProcessor2_0())
    pipe.applied_tome = pipe.applied_todo = 0


def builtin_infotext(p: Any) -> dict[str, Any]:
    """`processing_info`: the built-in's keys, reading `p` first, then the settings."""

    def get(key: str) -> Any:
        value = getattr(p, key, None)
        return value if value is not None else setting(key)

    method = get("token_merging_method")
    if method == "ToMe" and get("tome_ratio"):
        return {"ToMe": get("tome_ratio")}
    if method == "ToDo" and get("todo_ratio"):
        return {"ToDo": get("todo_ratio")}
    return {}


# ---------------------------------------------------------------------------------------------- scripts


class SDNextRunner(scripts._Runner):
    """SD.Next's ScriptRunner: no `process_before_every_sampling`, no `before_hr`; args from `p.per_script_args`."""

    def _each(self, method: str, p: Any, *before: Any, **kwargs: Any) -> None:
        for script in self.alwayson_scripts:
            try:
                args = p.per_script_args.get(script.title(), p.script_args[script.args_from : script.args_to])
                getattr(script, method)(p, *before, *args, **kwargs)
            except Exception:
                errors.report(f"Error running {method}: {script.filename}", exc_info=True)

    before_hr = None  # type: ignore[assignment]


class State:
    def __init__(self) -> None:
        self.interrupted = False


# ---------------------------------------------------------------------------------------------- processing


class _SDNextFields:
    """What SD.Next's processing objects carry beyond the A1111 ones the stub has."""

    def _sdnext_init(self, interrupt_at: Any = None, fail_at: Any = None) -> None:
        self.interrupt_at = interrupt_at
        self.fail_at = fail_at
        self.per_script_args: dict[str, Any] = {}
        self.is_refiner_pass = False
        self.token_merging_method: str | None = None
        self.tome_ratio: float | None = None
        self.todo_ratio: float | None = None
        self.calls: list[Call] = []


class Txt2Img(processing.StableDiffusionProcessingTxt2Img, _SDNextFields):
    def __init__(self, *, interrupt_at: Any = None, fail_at: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sdnext_init(interrupt_at, fail_at)

    def init_hr(self) -> None:
        self.hr_upscale_to_x, self.hr_upscale_to_y = self.width * 2, self.height * 2


class Img2Img(processing.StableDiffusionProcessingImg2Img, _SDNextFields):
    def __init__(self, *, interrupt_at: Any = None, fail_at: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sdnext_init(interrupt_at, fail_at)


#: SD.Next's extra callback registrars, installed into the stub's `script_callbacks` by the tests' fixture.
after_process_callbacks: list[Callable[[Any], None]] = []


def on_after_process(callback: Callable[[Any], None]) -> None:
    after_process_callbacks.append(callback)


def after_process_callback(p: Any) -> None:
    for callback in list(after_process_callbacks):
        try:
            callback(p)
        except Exception:
            errors.report("Error executing callback after_process", exc_info=True)


def process_images(p: Any) -> processing.Processed | None:
    p.scripts.before_process(p)
    stored: dict[str, Any] = {}
    for key, value in list(p.override_settings.items()):
        if key not in shared.opts.data and key not in TOKEN_MERGING_DEFAULTS:
            continue  # not a registered option
        if setting(key) == value:
            p.override_settings.pop(key)
    for key in p.override_settings:
        stored[key] = shared.opts.data.get(key, TOKEN_MERGING_DEFAULTS.get(key))
    try:
        for key, value in p.override_settings.items():
            shared.opts.data[key] = value
        return _inner(p)
    finally:
        after_process_callback(p)
        if p.override_settings_restore_afterwards:
            shared.opts.data.update(stored)


def _pass(p: Any, pipe: Any, pass_name: str, steps: int, size: int) -> Any:
    """One pipeline call between `process_pre` and `process_post` (both always run, like SD.Next's try/finally)."""
    apply_token_merging(pipe)
    try:
        if p.fail_at == pass_name:
            raise RuntimeError(f"pipeline failed in the {pass_name} pass")
        return pipe(p, pass_name, steps, size, p.calls)
    except AssertionError:
        return None  # "Interrupted..."
    except RuntimeError as exc:
        shared.state.interrupted = True
        errors.report(f"Processing: {exc}")
        return None
    finally:
        remove_token_merging(pipe)


def _inner(p: Any) -> processing.Processed | None:
    p.scripts.process(p)
    images, infotexts = [], []
    for n in range(p.n_iter):
        p.iteration = n
        if shared.state.interrupted:
            break
        batch = {"batch_number": n, "prompts": [p.prompt], "seeds": [p.seed + n], "subseeds": [0]}
        p.scripts.before_process_batch(p, **batch)
        p.scripts.process_batch(p, **batch)
        base = sd_models.model_data.sd_model
        first = "img2img" if isinstance(p, Img2Img) else "first"
        samples = _pass(p, base if first == "first" else base.img2img(), first, p.steps, 8)
        if not shared.state.interrupted and getattr(p, "enable_hr", False):
            p.is_hr_pass = True
            p.init_hr()
            samples = _pass(p, base.img2img(), "hires", p.hr_second_pass_steps, 16)
            p.is_hr_pass = False
        refiner = getattr(sd_models.model_data, "sd_refiner", None)
        if not shared.state.interrupted and refiner is not None:
            p.is_refiner_pass = True
            samples = _pass(p, refiner.img2img(), "refiner", 2, 16 if p.enable_hr else 8)
            p.is_refiner_pass = False
        if shared.state.interrupted:
            break
        p.scripts.postprocess_batch(p, samples, batch_number=n)
        images.append(samples)
        p.extra_generation_params.update(builtin_infotext(p))
        infotexts.append(processing.create_infotext(p, n))
    res = processing.Processed(p, images, infotexts)
    if not shared.state.interrupted:
        p.scripts.postprocess(p, res)
    return res


# ---------------------------------------------------------------------------------------------- the host


@dataclass
class SDNextWebUI:
    """The SD.Next stand-in with the extension loaded (`extension=False`: the host alone, for baselines)."""

    pipe: Any
    extension: bool = True
    refiner: Any = None
    runners: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        harness.reset()
        after_process_callbacks.clear()
        shared.state = State()
        sd_models.model_data.sd_refiner = self.refiner
        self.module = harness.load_extension() if self.extension else None
        for tab, is_img2img in (("txt2img", False), ("img2img", True)):
            runner = SDNextRunner()
            runner.initialize_scripts(is_img2img)
            counts = {TITLE: len(IMG2IMG_ARG_NAMES if is_img2img else ARG_NAMES)} if self.extension else {}
            runner.setup_without_ui(counts)
            self.runners[tab] = runner
        sd_models.load(self.pipe, main=True)

    def make_p(self, tab: str = "txt2img", tome: Any = None, *, api_args: Any = None, **kwargs: Any) -> Any:
        """`tome`: the UI's full positional args; `api_args`: what an API request sent (`p.per_script_args`)."""
        cls = Img2Img if tab == "img2img" else Txt2Img
        args = harness.script_args(tab, tome) if self.module is not None else (0,)
        p = cls(scripts=self.runners[tab], script_args=args, **kwargs)
        if api_args is not None:
            p.per_script_args[TITLE] = api_args
        return p

    def run(self, tab: str = "txt2img", tome: Any = None, **kwargs: Any) -> tuple[Any, processing.Processed | None]:
        shared.state.interrupted = False
        p = self.make_p(tab, tome, **kwargs)
        return p, process_images(p)


def outputs(p: Any) -> list[torch.Tensor]:
    return [call.output for call in p.calls]


def passes(p: Any) -> dict[tuple[int, str], tome_core.TomeConfig | None]:
    """(iteration, pass) -> the config the pass ran with; asserts it held for every call of the pass."""
    seen: dict[tuple[int, str], tome_core.TomeConfig | None] = {}
    for call in p.calls:
        key = (call.iteration, call.pass_name)
        assert seen.setdefault(key, call.config) == call.config, f"config changed inside {key}"
    return seen


def clone_pipeline(pipe: Pipeline) -> Pipeline:
    """A pipeline with a deep copy of the UNet (for a baseline that cannot share hooks with the one tested)."""
    return Pipeline(copy.deepcopy(pipe.unet), name=pipe.name)
