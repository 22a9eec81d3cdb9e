"""ToMe on a ComfyUI model: a clone that carries one sampling-scoped wrapper, never a changed module.

ComfyUI's `ModelPatcher.clone()` shares the diffusion model (the `nn.Module`) with the original, and ComfyUI has no
patch point for the transformer block's feed-forward, which the SDXL presets merge. So the clone carries a wrapper
of ComfyUI's `outer_sample` (`ModelPatcher.add_wrapper_with_key`, `comfy.patcher_extension.WrappersMP.OUTER_SAMPLE`):
it runs only when a sampler samples with this clone, applies `tome_core.apply_patch` to the diffusion model for the
duration of that sampling and removes it in `finally`, so the original model, other clones and an interrupted or
failed prompt never see our hooks. Applying once per sampling (not per UNet call) keeps the core's per-grid index
tables for the whole sampling; docs/comfyui-contract.md has the ComfyUI facts this relies on.

A diffusion transformer (Flux, Chroma, Wan, Qwen-Image, SD3, Lumina 2: a model `tome_core.find_layout` describes) gets the core's
keys/values subsampling. Its blocks call ComfyUI's attention function, which hands the call to
`transformer_options["optimized_attention_override"]` when there is one (`comfy.ldm.modules.attention.wrap_attn`).
So the wrapper tells the core that the host intercepts attention (`tome_core.set_attention_interceptor(..., "host")`)
and puts an override in this sampling's own options (`AttentionOverride`) that asks the core for the subsampled
keys/values (`tome_core.reduce_attention`) and passes the call on, to an override another node set before (a
SageAttention patch) or to ComfyUI's function; in `finally` the other node's override is put back. Whatever kernel
runs the attention, it gets the reduced keys. In the blocks ToMe reduces, where ComfyUI's attention function is
one of PyTorch's and no other node set an override, every query also keeps its own key: the core answers those
self-attention calls itself (`tome_core.reduced_attention`: PyTorch's kernels, which return the log-sum-exp it needs);
the other attention calls go on as before. A diffusion model ToMe does not know (HiDream, HunyuanVideo) runs
unchanged, and the log says so once per sampling, naming ComfyUI's model config and the model's class.

Per sampling the wrapper also
- resolves a preset for the model's family from ComfyUI's model config (`model.model_config`),
- follows the step window from the sampler's step callback (host values, no device read-back per UNet call),
- skips ComfyUI's built-in TomePatchModel on the same model for this sampling (ours runs, never both), and
- logs once, through `logging.getLogger("tome")`, each kind of merging that ran with its block counts, the size
  sampled and the preset's speed-up there (`tome_core.words.speed_words`), why fewer blocks merged than selected,
  and also when the sampling was interrupted or failed; each line starts with `ToMe <version>` (`LOG_HEAD`), so a
  bug report that quotes it says which version ran. A sampling of part of a schedule (KSamplerAdvanced's start and
  end steps, SplitSigmas) names that part (`schedule_part`): Wan 2.2 14B's two experts, one ToMe node each, are the
  same architecture, and only the sigmas a sampling gets tell the high-noise expert's line from the low-noise one's.

Under ComfyUI's TorchCompileModel (before or after our node: both clones carry both wrappers) the patch goes on the
module the compiled wrapper runs, which traces it once per setting and size (tome_core's patch docstring); the line
then says the UNet ran under torch.compile and with which backend.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

import tome_core
from tome_comfy.attention import LOG_HEAD, AttentionOverride
from tome_core import TomeConfig, TomeStats
from tome_core.compat import eager, uncompiled
from tome_core.families import LAYOUTS, Layout, figures_family
from tome_core.patch import set_whole_block_guard
from tome_core.words import FAMILY_LABELS, not_reached_words, speed_words

log = logging.getLogger("tome")

#: ComfyUI's `comfy.patcher_extension.WrappersMP.OUTER_SAMPLE`: a wrapper around `CFGGuider.outer_sample`.
OUTER_SAMPLE = "outer_sample"
#: The key our wrapper is stored under on a `ModelPatcher` (one ToMe per model: a later node replaces it).
WRAPPER_KEY = "tome_sd"
#: Where ComfyUI's built-in token merging node (TomePatchModel) defines its attn1 patches. ComfyUI loads
#: comfy_extras files under their path without extension as the module name ("/.../comfy_extras/nodes_tomesd"),
#: so the patch functions' `__module__` is matched on its last two parts, whatever the separator.
BUILTIN_MODULE = ("comfy_extras", "nodes_tomesd")


def is_builtin_tomesd(func: Any) -> bool:
    """Whether an attn1 patch function comes from ComfyUI's TomePatchModel (by its defining module)."""
    parts = re.split(r"[./\\]", getattr(func, "__module__", None) or "")
    return tuple(parts[-2:]) == BUILTIN_MODULE


#: ComfyUI's torch.compile wrapper (`comfy_api.torch_helpers.set_torch_compile_wrapper`, used by its
#: TorchCompileModel node): an APPLY_MODEL wrapper under this key puts the compiled module in place for each model
#: call; the arguments it compiled with are kept in `model_options` under `COMPILE_KWARGS`.
COMPILE_WRAPPER = ("apply_model", "torch.compile")
COMPILE_KWARGS = "torch_compile_kwargs"


def compiled_with(model_options: Mapping[str, Any]) -> str | None:
    """How this sampling's UNet is compiled by ComfyUI's torch.compile wrapper, in the log's words; None without it."""
    kind, key = COMPILE_WRAPPER
    wrappers = model_options.get("transformer_options", {}).get("wrappers", {}).get(kind, {})
    if not wrappers.get(key):
        return None
    kwargs = model_options.get(COMPILE_KWARGS) or {}
    backend = kwargs.get("backend")
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
    details = [f"backend {name}"] if backend is not None else []
    details += [f"mode {kwargs['mode']}"] if kwargs.get("mode") else []
    details += ["fullgraph"] if kwargs.get("fullgraph") else []
    return f"under torch.compile ({', '.join(details)})" if details else "under torch.compile"


#: ComfyUI model config classes (`comfy.supported_models`) per preset family; subclasses (SSD-1B, Vega, KOALA,
#: instruct-pix2pix; FluxSchnell, FluxInpaint; ChromaRadiance; WAN21_I2V, WAN22_T2V and the other Wan variants, which
#: derive from WAN21_T2V at a125cd84) are found through the class's MRO. Other configs fall back to the model: the
#: UNet's structure, or the diffusion transformer's layout (`tome_core.find_layout`). A diffusion transformer gets
#: ToMe only where the core has a layout for its class; the config names the family its preset resolves for.
FAMILY_CONFIGS: Mapping[str, frozenset[str]] = {
    "sdxl": frozenset({"SDXL", "SDXLRefiner"}),
    "sd": frozenset({"SD15", "SD20"}),
    "flux": frozenset({"Flux"}),
    "chroma": frozenset({"Chroma"}),
    "flux2": frozenset({"Flux2"}),
    "qwen": frozenset({"QwenImage"}),
    "zimage": frozenset({"ZImage"}),
    "lumina2": frozenset({"Lumina2"}),
    "sd3": frozenset({"SD3"}),
    "wan": frozenset({"WAN21_T2V", "WAN22_T2V", "WAN22"}),
    "hunyuanvideo": frozenset({"HunyuanVideo"}),  # also its I2V and SkyReels configs, which derive from it
    "ltx": frozenset({"LTXV"}),
}
#: Where ComfyUI's attention function looks for another function to run instead
#: (`comfy.ldm.modules.attention.wrap_attn`, in `transformer_options`).
ATTENTION_OVERRIDE = "optimized_attention_override"
#: Pixels per latent cell (spatial, temporal), by the name of the model's latent format class
#: (`comfy.latent_formats`); every other format: 8 and 4 (the SD, SDXL, Flux and Wan 2.1 VAEs).
LATENT_SCALE: Mapping[str, tuple[int, int]] = {"Wan22": (16, 4), "ChromaRadiance": (1, 1), "LTXV": (32, 8)}
#: Attention modules another node can replace (`patches_replace`), and the config flag that merges them.
_REPLACEABLE = (("attn1", "merge_attn", "self-attention"), ("attn2", "merge_crossattn", "cross-attention"))


@dataclass(frozen=True)
class TomeRequest:
    """What a node asked for: a preset by name (resolved per model family when sampling starts) or a config."""

    preset: str | None = None
    config: TomeConfig | None = None

    def __post_init__(self) -> None:
        if (self.preset is None) == (self.config is None):
            raise TypeError("TomeRequest takes a preset or a config")
        if self.preset is not None:
            tome_core.get_preset(self.preset)  # ValueError naming the known presets

    def resolve(self, family: str) -> TomeConfig:
        if self.config is not None:
            return self.config
        return tome_core.get_preset(str(self.preset)).config(family)

    def label(self, family: str | None) -> str:
        if self.config is not None:
            return "custom settings"
        name = tome_core.get_preset(str(self.preset)).label
        return f"{name} for {family}" if family else name

    def speed(self, family: str, size: tuple[int, int, int] | None) -> str:
        """The log's words for the size sampled: a preset's speed-up there from the lab's table
        (`tome_core.words.speed_words`: "about 1.13× faster per step at 1024×1024 (NVIDIA H200, estimated)"), else
        just the size ("at 1024×1024"; custom settings and sizes or families without figures); "" without a
        size."""
        if size is None:
            return ""
        if self.preset is not None:
            words = speed_words(str(self.preset), family, size if size[2] > 1 else size[:2])
            if words:
                return words
        return f"at {size_text(size)}"


def attach(model: Any, request: TomeRequest) -> Any:
    """A clone of ComfyUI `ModelPatcher` `model` that runs ToMe with `request` whenever it samples.

    `model` itself is never changed. A ToMe wrapper already on `model` (an earlier ToMe node) is replaced: one
    ToMe per model, the last node's settings run.
    """
    if not hasattr(model, "add_wrapper_with_key"):
        raise TypeError(
            f"ToMe needs a ComfyUI model (ModelPatcher with add_wrapper_with_key, ComfyUI 0.3.10 or newer),"
            f" got {type(model).__name__}"
        )
    if request.config is not None:
        check_for_model(model, request.config)
    clone = model.clone()
    if clone.get_wrappers(OUTER_SAMPLE, WRAPPER_KEY):
        log.info(
            "ToMe: this model already carries ToMe settings from an earlier node; this node's settings replace them"
        )
        clone.remove_wrappers_with_key(OUTER_SAMPLE, WRAPPER_KEY)
    clone.add_wrapper_with_key(OUTER_SAMPLE, WRAPPER_KEY, TomeSampling(request))
    return clone


def check_for_model(model: Any, config: TomeConfig) -> None:
    """Refuse, at the node, custom settings the model cannot run: on a diffusion transformer the core's own rules
    (UNet-only fields at their defaults, merging only where its blocks can run on merged tokens), a ValueError
    naming the field, as `tome_core.apply_patch` would raise when sampling starts. UNet settings were checked by
    `TomeConfig` already."""
    getter = getattr(model, "get_model_object", None)
    module = getter("diffusion_model") if callable(getter) else None
    module = uncompiled(module) if isinstance(module, nn.Module) else None
    if module is not None and tome_core.find_layout(module) is not None:
        tome_core.check_config(module, config)


class TomeSampling:
    """The `outer_sample` wrapper: ToMe on the diffusion model for one sampling, removed in `finally`."""

    def __init__(self, request: TomeRequest) -> None:
        self.request = request

    def __repr__(self) -> str:
        return f"TomeSampling({self.request!r})"

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        guider = executor.class_obj  # the CFGGuider sampling; its model_options are this sampling's own copy
        patcher = guider.model_patcher
        size = sampled_size(patcher, executor.original, args, kwargs)
        part = schedule_part(patcher, executor.original, args, kwargs)
        run = start_run(self.request, patcher, guider.model_options, size)
        if run is None:
            return executor(*args, **kwargs)
        run.part = part
        try:
            args, kwargs = run.follow_steps(executor.original, args, kwargs)
            output = executor(*args, **kwargs)
        except BaseException as exc:
            run.report(stopped=exc)  # an interrupt raises out of the step callback: what ran until then
            raise
        else:
            run.report()
            return output
        finally:
            run.stop()


def config_family(patcher: Any) -> str | None:
    """The preset family ComfyUI's model config names (`FAMILY_CONFIGS`), else None."""
    config = getattr(getattr(patcher, "model", None), "model_config", None)
    names = {cls.__name__ for cls in type(config).__mro__} if config is not None else set()
    return next((family for family, classes in FAMILY_CONFIGS.items() if names & classes), None)


def model_family(patcher: Any, unet: nn.Module) -> str | None:
    """ "sd" or "sdxl" for a UNet, from ComfyUI's model config, else from the UNet's structure; None without UNet
    transformer blocks (a diffusion transformer's family: `dit_family`)."""
    family = config_family(patcher)
    if family in tome_core.FAMILIES:
        return family
    if tome_core.find_layout(unet) is not None:
        return None
    try:
        return tome_core.model_family(unet)
    except TypeError as exc:
        log.debug("ToMe: no preset family for %s: %s", type(unet).__name__, exc)
        return None


def dit_family(patcher: Any, layout: Layout) -> str:
    """The family a diffusion transformer's preset resolves for: the one ComfyUI's model config names, else (a
    config this adapter does not know, or one naming a family the presets do not have) its layout's."""
    family = config_family(patcher)
    if family is None or family in tome_core.FAMILIES or family not in tome_core.ALL_FAMILIES:
        return layout.family
    return family


def config_name(patcher: Any) -> str:
    config = getattr(getattr(patcher, "model", None), "model_config", None)
    return type(config).__name__ if config is not None else type(getattr(patcher, "model", patcher)).__name__


def comfy_dits() -> str:
    """The diffusion transformers ToMe reduces in ComfyUI (the core's layouts for ComfyUI's classes), in users'
    words."""
    labels = dict.fromkeys(FAMILY_LABELS.get(lay.family, lay.family) for lay in LAYOUTS if lay.host == "ComfyUI")
    return ", ".join(labels)


def size_text(size: tuple[int, int, int]) -> str:
    return f"{size[0]}\u00d7{size[1]}" + (f", {size[2]} frames" if size[2] > 1 else "")


def _bind(outer_sample: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
    return inspect.signature(outer_sample).bind(*args, **kwargs)


def sampled_size(
    patcher: Any, outer_sample: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[int, int, int] | None:
    """(width, height, frames) in pixels of what this sampling makes, from the noise's shape (host values) and the
    model's latent format (`LATENT_SCALE`); None where the arguments hold no latent."""
    try:
        noise = _bind(outer_sample, args, kwargs).arguments.get("noise")
    except TypeError as exc:  # another signature than ComfyUI's outer_sample: the log goes without the size
        log.debug("ToMe: no size for the log: %s", exc)
        return None
    shape = getattr(noise, "shape", None)
    if shape is None or len(shape) not in (4, 5):
        return None
    latent = getattr(getattr(patcher, "model", None), "latent_format", None)
    spatial, temporal = LATENT_SCALE.get(type(latent).__name__, (8, 4))
    frames = (int(shape[2]) - 1) * temporal + 1 if len(shape) == 5 else 1
    return int(shape[-1]) * spatial, int(shape[-2]) * spatial, frames


#: How far below the model's `sigma_max` a first sigma still counts as the schedule's start: ComfyUI's schedulers
#: start at `sigma_max` up to float rounding, and a sampling started one step later lies well below (Wan's shift-8
#: schedule of 100 steps: its second sigma 0.13% below 1).
SIGMA_MAX_TOLERANCE = 1e-4


def model_sampling(patcher: Any) -> Any:
    """ComfyUI's `model_sampling` object of the model (its schedule), None where the model has none."""
    getter = getattr(patcher, "get_model_object", None)
    try:
        return getter("model_sampling") if callable(getter) else None
    except (AttributeError, TypeError, ValueError, RuntimeError) as exc:  # another host's model: no schedule read
        log.debug("ToMe: no model_sampling: %s", exc)
        return None


def sigma_max(patcher: Any) -> float | None:
    """The sigma a full schedule of this model starts at (ComfyUI's `model_sampling.sigma_max`), None where the
    model has no such object."""
    value = getattr(model_sampling(patcher), "sigma_max", None)
    return float(value) if value is not None else None


def _sigma_text(sigma: float) -> str:
    return f"{sigma:.3g}"


def schedule_part(patcher: Any, outer_sample: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """ " on the high-noise part of the noise schedule, 10 steps from sigma 1 to 0.875" for a sampling that starts at
    the model's `sigma_max` and stops before sigma 0 (KSamplerAdvanced returning leftover noise: Wan 2.2 14B's
    high-noise expert), "the low-noise part" for one that starts below it and ends at 0 (the low-noise expert, an
    SDXL refiner, a hires pass), "a middle part" for one that does neither; "" for a whole schedule or without the
    sigmas. The log's words for it, after the head: the models of a split schedule cannot tell their part apart,
    their sampling can."""
    try:
        sigmas = _bind(outer_sample, args, kwargs).arguments.get("sigmas")
    except TypeError as exc:  # another signature than ComfyUI's outer_sample: the log goes without the part
        log.debug("ToMe: no sigmas for the log: %s", exc)
        return ""
    if not isinstance(sigmas, torch.Tensor) or sigmas.dim() != 1 or sigmas.shape[0] < 2:
        return ""
    top = sigma_max(patcher)
    if top is None:
        return ""
    # Two values read back once per sampling, before it runs (ComfyUI keeps the sigmas on the model's device).
    first, last = (float(v) for v in sigmas[[0, -1]].tolist())
    starts = first >= top * (1 - SIGMA_MAX_TOLERANCE)
    ends = last == 0
    if starts and ends:
        return ""
    part = "the high-noise part" if starts else "the low-noise part" if ends else "a middle part"
    steps = int(sigmas.shape[0]) - 1
    count = "1 step" if steps == 1 else f"{steps} steps"
    return f" on {part} of the noise schedule, {count} from sigma {_sigma_text(first)} to {_sigma_text(last)}"


#: The resolution of a step's place in its schedule handed to the core (`tome_core.set_step(model, place, PLACES)`).
PLACES = 10_000


def schedule_places(patcher: Any, sigmas: torch.Tensor) -> list[float] | None:
    """Each sigma's place in the model's whole schedule, 0 at its start to 1 at its end: the percent that ComfyUI's
    `model_sampling.percent_to_sigma` maps to it (the convention of ComfyUI's own start/end percents), found by
    bisection on host floats; None where the model has no such mapping."""
    to_sigma = getattr(model_sampling(patcher), "percent_to_sigma", None)
    if to_sigma is None:
        return None
    places = []
    for sigma in sigmas.tolist():  # one read back per sampling, before it runs (schedule_part reads two)
        low, high = 0.0, 1.0
        for _ in range(30):  # percent_to_sigma falls as the percent rises
            middle = (low + high) / 2
            low, high = (middle, high) if float(to_sigma(middle)) > sigma else (low, middle)
        places.append(high if sigma <= 0 else (low + high) / 2)
    return places


def comfy_blocks(unet: nn.Module) -> Iterator[tuple[str, tuple[str, int, int], int]]:
    """Each transformer block of a ComfyUI UNet: its label ("input.4.0"), the key ComfyUI's `patches_replace`
    looks up ((block name, number, index in its stack)) and its downsampling level (1 = full resolution).

    ComfyUI numbers the blocks as `UNetModel._forward` sets `transformer_options["block"]` and
    `SpatialTransformer.forward` sets `"block_index"`; levels change after a stage holding a Down/Upsample.
    """
    level = 1
    for name in ("input", "middle", "output"):
        stage = getattr(unet, f"{name}_blocks" if name != "middle" else "middle_block", None)
        if stage is None:
            continue
        stages = [stage] if name == "middle" else list(stage)
        for number, block in enumerate(stages):
            for module in block.modules():
                stack = getattr(module, "transformer_blocks", None)
                if isinstance(stack, nn.ModuleList):
                    for index in range(len(stack)):
                        yield f"{name}.{number}.{index}", (name, number, index), level
            kinds = {type(m).__name__ for m in block.modules()}
            if any(k.startswith("Downsample") for k in kinds):
                level *= 2
            elif any(k.startswith("Upsample") for k in kinds):
                level = max(1, level // 2)


def attention_replaced(kwargs: Mapping[str, Any], positions: range) -> bool:
    """Whether another node replaced self- or cross-attention (ComfyUI's `patches_replace`: PAG, SAG, IP-Adapter,
    attention couple...) in this call of a transformer block at one of `positions` of its stack (the block's
    `transformer_options` say which block it is). Such blocks run unmerged: a replacement may map every token back
    to its image position (tome_core.patch.set_whole_block_guard)."""
    options = kwargs.get("transformer_options") or {}
    replace = options.get("patches_replace") or {}
    block = options.get("block")
    if not replace or block is None:
        return False
    for target in ("attn1", "attn2"):
        table = replace.get(target) or {}
        if tuple(block[:2]) in table or any((block[0], block[1], p) in table for p in positions):
            return True
    return False


def drop_builtin_tomesd(model_options: dict[str, Any]) -> int:
    """Remove ComfyUI's TomePatchModel patches from this sampling's model options; how many were removed."""
    patches = model_options.get("transformer_options", {}).get("patches", {})
    removed = 0
    for name in ("attn1_patch", "attn1_output_patch"):
        funcs = patches.get(name)
        if not funcs:
            continue
        kept = [f for f in funcs if not is_builtin_tomesd(f)]
        removed += len(funcs) - len(kept)
        # The guider's copy of the options, never the model's own. An empty list must go: its mere key makes
        # ComfyUI's block pass keys/values to attn1 explicitly, another attention path than without patches.
        if kept:
            patches[name] = kept
        else:
            del patches[name]
    return removed


def start_run(
    request: TomeRequest, patcher: Any, model_options: dict[str, Any], size: tuple[int, int, int] | None = None
) -> _Run | None:
    """ToMe on this sampling's diffusion model: a UNet run, a diffusion transformer run, or None (and one warning)
    for a model ToMe does not reduce. `model_options` are the sampling's own (the guider's copy)."""
    # A node may have put a torch.compile wrapper there as an object patch (ComfyUI-TeaCache's CompileModel): the
    # patch goes on the module it runs, as in tome_core.apply_patch.
    module = uncompiled(patcher.get_model_object("diffusion_model"))
    layout = tome_core.find_layout(module)
    if layout is not None:
        return _DitRun.begin(request, patcher, module, layout, model_options, size)
    family = model_family(patcher, module)
    if family is None:
        log.warning(
            "%s: ComfyUI model %s (diffusion model %s) is neither a UNet with transformer blocks nor a diffusion"
            " transformer ToMe reduces (%s): ToMe does nothing, the model runs unchanged",
            LOG_HEAD,
            config_name(patcher),
            type(module).__name__,
            comfy_dits(),
        )
        return None
    return _UNetRun.begin(request, patcher, module, family, model_options, size)


class _Run:
    """One sampling with ToMe: the patched model, the step callback, the report; `_UNetRun` and `_DitRun` add what
    their models need."""

    #: What the log calls one call of the model.
    CALL = "model call"

    def __init__(
        self,
        request: TomeRequest,
        patcher: Any,
        unet: nn.Module,
        family: str,
        config: TomeConfig,
        size: tuple[int, int, int] | None = None,
    ) -> None:
        self.request, self.patcher, self.unet, self.family, self.config = request, patcher, unet, family, config
        self.size = size
        self.compiled: str | None = None  # `compiled_with`: the model runs under ComfyUI's torch.compile wrapper
        self.part = ""  # `schedule_part`: the part of a split schedule this sampling ran, in the log's words
        # With a step window: how many of this sampling's steps it holds, and in how many of them the blocks ran (a
        # step cache such as EasyCache reuses the model's output in some steps and skips its blocks there).
        self.window_steps: int | None = None  # None: no step window
        self.window_ran = 0
        self.finished = False

    # ------------------------------------------------------------------ during sampling

    def follow_steps(
        self, outer_sample: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """With a step window: the sampler's step callback also tells the core the next step (host values)."""
        config = self.config
        if config.step_start <= 0 and config.step_end >= 1:
            return args, kwargs
        bound = _bind(outer_sample, args, kwargs)
        sigmas = bound.arguments["sigmas"]
        total = max(int(sigmas.shape[-1]) - 1, 1)  # the shape is on the host: no device read
        original = bound.arguments.get("callback")
        unet = self.unet
        # A part of a split schedule (Wan 2.2 14B's two experts) counts its steps where they lie in the whole
        # schedule, as a pipeline that runs both does: counted within the part, the high-noise expert's last steps
        # would be reduced as if they were the generation's.
        places = schedule_places(self.patcher, sigmas) if self.part else None

        def place(step: int) -> tuple[int, int]:
            if places is None:
                return step, total
            return round(places[min(step, total)] * PLACES), PLACES

        tome_core.set_step(unet, *place(0))
        inside = [config.active_at(place(step)[0] / place(step)[1]) for step in range(total)]
        self.window_steps, self.window_ran = sum(inside), 0
        seen = 0

        def callback(step: int, *rest: Any, **kw: Any) -> Any:
            nonlocal seen
            if 0 <= int(step) < total and inside[int(step)]:  # the core's counts read in the window's steps only
                stats = tome_core.stats(unet)
                runs = (stats.window_runs or 0) if stats is not None else 0
                self.window_ran += runs > seen
                seen = runs
            tome_core.set_step(unet, *place(int(step) + 1))  # called after step `step`: the next one runs
            return original(step, *rest, **kw) if original is not None else None

        bound.arguments["callback"] = callback
        return bound.args, bound.kwargs

    # ------------------------------------------------------------------ after sampling

    def report(self, stopped: BaseException | None = None) -> None:
        """One line per sampling: what ran with its counts and the size sampled, or why fewer blocks merged than
        selected; `stopped`: the exception that ended the sampling early (an interrupt, an error)."""
        stats = tome_core.stats(self.unet)
        if stats is None:
            return
        head = f"{LOG_HEAD} ({self.request.label(self.family)}){self.part}"
        self.finished = stopped is None
        if stopped is not None:
            interrupted = "Interrupt" in type(stopped).__name__  # ComfyUI's InterruptProcessingException
            what = "sampling interrupted" if interrupted else f"sampling failed ({type(stopped).__name__})"
            level = logging.INFO if interrupted else logging.WARNING
            if stats.unet_calls == 0:
                log.log(level, "%s: %s before the first %s: nothing %s", head, what, self.CALL, self.NOTHING)
                return
            calls = f"1 {self.CALL}" if stats.unet_calls == 1 else f"{stats.unet_calls} {self.CALL}s"
            head = f"{head}: {what} after {calls};"
        else:
            level, head = logging.INFO, f"{head}:"
        self.log_line(stats, level, head)

    #: What the log says did not happen when a sampling stopped before the model ran.
    NOTHING = "merged"

    def log_line(self, stats: TomeStats, level: int, head: str) -> None:
        raise NotImplementedError

    def speed(self) -> str:
        """ "; about 1.13× faster per step at 1024×1024 (NVIDIA H200, estimated)", "; at 1024×1024" or "": the
        figures of this model's architecture (`tome_core.families.figures_family`: Wan 2.2 5B's, not the 14B's)."""
        words = self.request.speed(figures_family(self.unet, self.family), self.size)
        return f"; {words}" if words else ""

    def stop(self) -> None:
        tome_core.remove_patch(self.unet)


class _UNetRun(_Run):
    """A UNet's sampling: the merging hooks, and a watch for blocks whose attention another node replaced."""

    CALL = "UNet call"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handle: RemovableHandle | None = None
        self.calls = 0
        self.replaced: Counter[tuple[str, str]] = Counter()  # (module, block label) -> UNet calls it was replaced
        self.builtin_skipped = 0

    @classmethod
    def begin(
        cls,
        request: TomeRequest,
        patcher: Any,
        unet: nn.Module,
        family: str,
        model_options: dict[str, Any],
        size: tuple[int, int, int] | None,
    ) -> _UNetRun:
        config = request.resolve(family)
        run = cls(request, patcher, unet, family, config, size)
        run.builtin_skipped = drop_builtin_tomesd(model_options)
        run.compiled = compiled_with(model_options)
        if run.builtin_skipped:
            log.warning(
                "%s: ComfyUI's TomePatchModel is on this model too; ToMe (%s) runs and the built-in is skipped for"
                " this sampling (never both)",
                LOG_HEAD,
                request.label(family),
            )
        tome_core.apply_patch(unet, config)
        try:
            set_whole_block_guard(unet, attention_replaced)
            run.watch()
        except BaseException:
            tome_core.remove_patch(unet)
            raise
        return run

    def watch(self) -> None:
        """Count, per UNet call, selected blocks whose merged attention another node replaced (PAG, SAG,
        IP-Adapter, attention couple): the module ToMe hooks does not run there in that call."""
        stats = tome_core.stats(self.unet)
        levels = stats.levels if stats is not None else frozenset()
        targets = [(module, word) for module, flag, word in _REPLACEABLE if getattr(self.config, flag)]
        blocks = [(label, key) for label, key, level in comfy_blocks(self.unet) if level in levels]

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.calls += 1
            replace = (kwargs.get("transformer_options") or {}).get("patches_replace") or {}
            for target, _ in targets:
                table = replace.get(target)
                if table:
                    for label, key in blocks:
                        if key in table or key[:2] in table:
                            self.replaced[(target, label)] += 1

        # Host bookkeeping, never traced: a torch.compile wrapper runs the UNet's own hooks outside its graph.
        self.handle = self.unet.register_forward_pre_hook(eager(hook), with_kwargs=True)

    def log_line(self, stats: TomeStats, level: int, head: str) -> None:
        problem = explain(stats, self.replaced, self.calls)
        if problem is None:
            kinds = ", ".join(f"{kind} in {count}" for kind, count in kind_counts(stats))
            log.log(
                level,
                "%s ran in %d of %d selected blocks (%d transformer blocks)%s: %s%s",
                head,
                stats.applied,
                stats.selected,
                stats.total,
                f" {self.compiled}" if self.compiled else "",
                kinds or "nothing to merge",
                self.speed(),
            )
        else:
            log.warning("%s %s%s", head, problem, f" ({self.compiled})" if self.compiled else "")

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        super().stop()


class _DitRun(_Run):
    """A diffusion transformer's sampling: the core's patch with the host interceptor, and our attention override
    in this sampling's `transformer_options` (another node's put back afterwards)."""

    NOTHING = "reduced"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options: dict[str, Any] | None = None  # the transformer_options our override was put in
        self.override: AttentionOverride | None = None
        self.had_previous = False

    @classmethod
    def begin(
        cls,
        request: TomeRequest,
        patcher: Any,
        module: nn.Module,
        layout: Layout,
        model_options: dict[str, Any],
        size: tuple[int, int, int] | None,
    ) -> _DitRun:
        family = dit_family(patcher, layout)
        config = request.resolve(family)
        run = cls(request, patcher, module, family, config, size)
        run.compiled = compiled_with(model_options)
        if drop_builtin_tomesd(model_options):
            log.warning(
                "%s: ComfyUI's TomePatchModel is on this model too: it does nothing on a diffusion transformer"
                " (%s); ToMe (%s) runs",
                LOG_HEAD,
                FAMILY_LABELS.get(family, family),
                request.label(family),
            )
        tome_core.apply_patch(module, config)  # ValueError naming a field the model cannot run
        try:
            tome_core.set_attention_interceptor(module, "host")
            run.install(model_options)
        except BaseException:
            run.uninstall()
            tome_core.remove_patch(module)
            raise
        return run

    def install(self, model_options: dict[str, Any]) -> None:
        options = model_options.setdefault("transformer_options", {})
        self.had_previous = ATTENTION_OVERRIDE in options
        self.override = AttentionOverride(self.unet, options.get(ATTENTION_OVERRIDE))
        self.options = options
        options[ATTENTION_OVERRIDE] = self.override

    def window_words(self) -> str:
        """ ", in 2 of the step window's 4 steps (...)" where a step cache reused the model's output in some of the
        steps the window holds, so ToMe reduced only the others; else ""."""
        if not self.finished or not 0 < self.window_ran < (self.window_steps or 0):
            return ""
        return (
            f", in {self.window_ran} of the step window's {self.window_steps} steps (a step cache reused the model's"
            " output in the others)"
        )

    def uninstall(self) -> None:
        options, override = self.options, self.override
        self.options = None
        if options is None or override is None or options.get(ATTENTION_OVERRIDE) is not override:
            return  # another wrapper replaced the options or the override since: theirs to put back
        if self.had_previous:
            options[ATTENTION_OVERRIDE] = override.previous
        else:
            del options[ATTENTION_OVERRIDE]

    def log_line(self, stats: TomeStats, level: int, head: str) -> None:
        compiled = f" {self.compiled}" if self.compiled else ""
        problem = explain_dit(stats, self.window_steps, stopped=not self.finished)
        if problem is None:
            log.log(
                level,
                "%s %s of %d blocks%s, text and reference tokens whole%s%s%s",
                head,
                dit_kinds(stats),
                stats.total,
                self.window_words(),
                compiled,
                dit_attention(stats),
                self.speed(),
            )
        else:
            # A window that holds none of this sampling's steps is the settings working (Wan 2.2's high-noise
            # expert under a window of the later steps), and a sampling stopped before it an interrupt: not a
            # failure, said at the sampling's level. A step cache that reused every windowed step is a warning.
            windowed_out = (
                stats.unet_calls > 0 and stats.active_calls == 0 and not (self.window_steps and self.finished)
            )
            compiled = f" ({self.compiled})" if self.compiled else ""
            log.log(level if windowed_out else logging.WARNING, "%s %s%s", head, problem, compiled)

    def stop(self) -> None:
        self.uninstall()
        super().stop()


#: The log's words for what ran in a diffusion transformer's blocks, by the core's kind (`TomeStats.modules`).
DIT_KIND_WORDS: Mapping[str, str] = {"kv": "keys/values subsampled", "attn1": "generated tokens merged"}


def dit_kinds(stats: TomeStats) -> str:
    """ "keys/values subsampled in 51", or with merged blocks "generated tokens merged in 20 and keys/values
    subsampled in 31": the core's own per-kind block counts."""
    counts = dict(stats.modules)
    words = dict(DIT_KIND_WORDS)
    if counts.get("own") and counts["own"] == counts.get("kv"):
        words["kv"] += " (each query's own key kept)"
    parts = [f"{words[kind]} in {counts[kind]}" for kind in ("attn1", "kv") if counts.get(kind)]
    return " and ".join(parts) or f"keys/values subsampled in {stats.applied}"


def dit_attention(stats: TomeStats) -> str:
    """ ", attention by SageAttention", and where queries did not keep their own key in every block that
    subsampled keys/values, in how many they did not and why: what ran, from the core's counts
    (`TomeStats.kernels`, `TomeStats.own_key_off`)."""
    kernels = stats.kernels
    if not kernels:
        return ""
    ran = kernels[0][0] if len(kernels) == 1 else " and ".join(f"{name} in {n}" for name, n in kernels)
    words = f", attention by {ran}"
    counts = dict(stats.modules)
    if stats.own_key_off and counts.get("own", 0) < counts.get("kv", 0):
        why = "; ".join(
            f"{reason}" + (f" ({n})" if len(stats.own_key_off) > 1 else "") for reason, n in stats.own_key_off
        )
        off = counts.get("kv", 0) - counts.get("own", 0)
        words += f"; each query's own key off in {off} of {counts.get('kv', 0)}: {why}"
    return words


def window_reason(window_steps: int | None, stopped: bool) -> str:
    """Why the blocks never ran in the step window's steps: the window held none of the sampling's steps (the
    settings working: Wan 2.2's high-noise expert under a window of the later steps), the sampling stopped before
    them, or a step cache reused the model's output in all of them (EasyCache skips the model's blocks there,
    LazyCache the whole call)."""
    if not window_steps:
        return "the step window excluded every step"
    if stopped:
        return "the sampling stopped before the blocks ran in a step of the step window"
    return (
        f"a step cache (EasyCache, LazyCache...) reused the model's output in all {window_steps} steps of the step"
        " window, so the blocks ToMe reduces never ran there"
    )


def explain_dit(stats: TomeStats, window_steps: int | None = None, stopped: bool = False) -> str | None:
    """Why a diffusion transformer's keys/values were subsampled in fewer blocks than selected; None when in all.
    `window_steps`: how many of the sampling's steps its step window holds (None: not known); `stopped`: the
    sampling ended early (an interrupt, an error)."""
    s = stats
    if s.selected == 0:
        return f"reduces none of the {s.total} blocks: the block window holds none (raise block_end)"
    reasons = []
    if s.unet_calls == 0:
        reasons.append("the diffusion model ran without ToMe's hooks (another node replaced it)")
    elif s.planned < s.selected:
        if s.block_calls == 0:
            reasons.append("the blocks ran without ToMe's hooks (another node replaced them)")
        elif s.active_calls == 0 or s.window_runs == 0:
            reasons.append(window_reason(window_steps, stopped))
        else:
            reasons.append("the model's inputs did not show where the generated tokens sit")
    if s.reached < s.planned:
        # The core's reasons where it knows them (`TomeStats.not_reached`), else the override's usual one.
        reasons.extend(
            not_reached_words(
                s,
                "ToMe's attention override was not called: another node replaced the model's forward or dropped"
                " transformer_options (TeaCache, MagCache...)",
            )
        )
    if s.applied < s.reached:
        reasons.append(
            "the attention sequence did not hold the tokens ToMe expected (text, image and reference tokens)"
        )
    if not reasons:
        return None
    unchanged = "; the model ran unchanged" if s.applied == 0 else ""
    return (
        f"could not apply in {s.selected - s.applied} of {s.selected} selected blocks ({dit_kinds(s)} of {s.total}"
        f" blocks): {'; '.join(reasons)}{unchanged}"
    )


#: The log's words for each kind of merging, by the module it runs in (the core's names in `TomeStats.modules`).
KIND_WORDS: Mapping[str, str] = {
    "kv": "keys/values pooled for self-attention",
    "attn1": "self-attention merged",
    "attn2": "cross-attention merged",
    "ff": "feed-forward (MLP) merged",
}


def kind_counts(stats: TomeStats) -> list[tuple[str, int]]:
    """Each kind of merging that ran in the selected blocks, in the log's words, with its block count: the core's
    own per-module counts (`TomeStats.modules`, what its hooks saw run; the blocks it selects are its plan's)."""
    return [(KIND_WORDS[name], count) for name, count in stats.modules if name in KIND_WORDS and count]


def explain(stats: TomeStats, replaced: Mapping[tuple[str, str], int], calls: int) -> str | None:
    """Why fewer blocks merged than selected (or attention was replaced in some calls); None when all merged."""
    s = stats
    verb = "ran in"
    if s.selected == 0:
        levels = ", ".join(map(str, sorted(s.levels))) or "none"
        have = ", ".join(map(str, sorted(s.block_levels))) or "none"
        return (
            f"{verb} 0 of 0 blocks: no transformer block at the selected downsampling levels {levels}; this model"
            f" has them at {have} (try max_downsample auto)"
        )
    reasons = []
    if s.unet_calls == 0:
        reasons.append("the UNet ran without ToMe's hooks (torch.compile, or another node replaced its forward)")
    elif s.planned < s.selected:
        if s.block_calls == 0:
            reasons.append("the blocks ran without ToMe's hooks (torch.compile, or another node replaced them)")
        elif s.active_calls == 0:
            reasons.append("the step window excluded every step")
        elif s.grid_misses:
            reasons.append("their token count did not fit the latent size")
        else:
            reasons.append("nothing to merge at this size")
    if s.reached < s.planned:
        reasons.append("attention replaced by another node in every call")
    if s.applied < s.reached:
        reasons.append("tokens changed by another node before ToMe")
    if replaced:
        by_module: dict[str, list[str]] = {}
        for (target, label), count in sorted(replaced.items()):
            by_module.setdefault(target, []).append(f"{label} ({count} of {calls} UNet calls)")
        words = dict((m, w) for m, _, w in _REPLACEABLE)
        reasons.extend(
            f"{words[target]} replaced by another node (PAG, SAG, IP-Adapter, attention couple...) in"
            f" {', '.join(labels)}; ToMe leaves replaced attention alone"
            for target, labels in by_module.items()
        )
    if not reasons:
        return None
    return f"{verb} {s.applied} of {s.selected} selected blocks: {'; '.join(reasons)}"
