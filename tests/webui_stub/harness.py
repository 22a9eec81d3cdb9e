"""Run generations through the stand-in WebUI with the extension loaded from scripts/tome.py.

`WebUI(version, models)` resets the stand-in, loads `scripts/tome.py` the way the WebUI does (module name
"tome.py", every Script subclass in its namespace registered), builds a txt2img and an img2img runner, and makes
`models["main"]` the current checkpoint. `webui.txt2img(args, ...)` / `webui.img2img(...)` run `process_images`
with a `FakeSampler` that, at each step, fires `on_cfg_denoiser` and records which model ran and which ToMe
config it carried. Versions: "1.6" (no process_before_every_sampling, no `params.denoiser`), "1.8" (no
process_before_every_sampling, `params.denoiser.p`), "1.10".
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modules import errors, processing, script_callbacks, scripts, sd_models, shared
from torch import fx, nn

import tome_core
from tome_core import TomeConfig
from tome_webui.params import ARG_NAMES, IMG2IMG_ARG_NAMES, TITLE, defaults, ui_value
from webui_stub import REPO_DIR

import tiny_models

VERSIONS = ("1.6", "1.8", "1.10")
STATE_ATTR = "_tome_sd_state"  # documented in docs/core-api.md


def reset() -> None:
    script_callbacks.clear_callbacks()
    scripts.scripts_data.clear()
    sd_models.reset()
    shared.opts.data.clear()
    errors.reported.clear()


def load_extension() -> types.ModuleType:
    """Execute scripts/tome.py like modules/script_loading.load_module and register its Script classes."""
    path = REPO_DIR / "scripts" / "tome.py"
    spec = importlib.util.spec_from_file_location("tome.py", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scripts.register_scripts_from_module(module, str(path), str(REPO_DIR))
    return module


def tome_args(enabled: bool = True, *, img2img: bool = False, **values: Any) -> list[Any]:
    """Positional script args as the UI sends them (defaults, then `values` by arg name)."""
    names = IMG2IMG_ARG_NAMES if img2img else ARG_NAMES
    start = {name: ui_value(name, value) for name, value in defaults().items()}
    start.update(enabled=enabled, **values)
    return [start[name] for name in names]


def custom_args(enabled: bool = True, *, img2img: bool = False, **values: Any) -> list[Any]:
    """Positional script args with both speed selectors at Custom: the detailed settings run."""
    return tome_args(enabled, img2img=img2img, **{"preset": "custom", "hr_preset": "custom", **values})


def script_args(tab: str, tome: Sequence[Any] | Mapping[str, Any] | None) -> tuple[Any, ...]:
    """The runner's flat args, like Api.init_script_args: [selected script index] + ours (defaults, then given)."""
    names = IMG2IMG_ARG_NAMES if tab == "img2img" else ARG_NAMES
    ours = [ui_value(name, defaults()[name]) for name in names]
    given = [tome] if isinstance(tome, Mapping) else list(tome or [])
    ours[: len(given)] = given[: len(ours)]
    return (0, *ours)


class GraphCounter:
    """A torch.compile backend that runs each graph dynamo captures as it is and counts them: dynamo traces, guards
    and recompiles as it does for the hosts' inductor, without generating kernels (seconds, not minutes)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs += 1
        return gm.forward


def webui_model(kind: str = "ldm_sd1", seed: int = 0) -> nn.Module:
    """A tiny WebUI-like model: the UNet at `.model.diffusion_model`."""
    return tiny_models.WebUILike(tiny_models.build_unet(kind, seed))


class Denoiser:
    """Stands in for CFGDenoiser (v1.8+ passes it as `params.denoiser`)."""

    def __init__(self, p: Any) -> None:
        self.p = p


@dataclass(frozen=True)
class StepRecord:
    pass_name: str
    iteration: int
    step: int
    total: int
    model: str
    config: TomeConfig | None
    core_step: tuple[int, int] | None
    hooks: int
    builtin: float


class FakeSampler:
    """Samples by firing on_cfg_denoiser each step and, with `run_unet`, running the tiny UNet (slower)."""

    def __init__(
        self,
        webui: WebUI,
        *,
        run_unet: bool = False,
        fail_at: tuple[str, int] | None = None,
        stop_at: tuple[str, int] | None = None,
        refiner: nn.Module | None = None,
        refiner_switch_at: int = 1,
        latent: int = 8,
    ) -> None:
        self.webui = webui
        self.latent = latent  # the first pass's latent side; the hires pass's is twice it
        self.run_unet = run_unet
        self.fail_at = fail_at
        self.stop_at = stop_at  # (pass, step): interrupted there; the sampler returns its last latent, as A1111's
        self.refiner = refiner
        self.refiner_switch_at = refiner_switch_at
        self.records: list[StepRecord] = []
        self.outputs: list[Any] = []

    def sample(self, p: Any, pass_name: str, steps: int) -> Any:
        size = 2 * self.latent if pass_name == "hires" else self.latent  # the tiny UNets downsample 3 times
        inputs = tiny_models.make_inputs(batch=1, height=size, width=size, seed=7)
        out = None
        for step in range(steps):
            if self.stop_at == (pass_name, step):
                break  # sd_samplers_common.InterruptedException, caught by launch_sampling
            if self.refiner is not None and pass_name != "hires" and step == self.refiner_switch_at:
                sd_models.reload_model_weights(info=self.refiner)  # like sd_samplers_common.apply_refiner
            script_callbacks.cfg_denoiser_callback(self.webui.cfg_params(p, step, steps))
            model = p.sd_model
            self.records.append(self.record(p, pass_name, step, steps, model))
            if self.fail_at == (pass_name, step):
                raise RuntimeError(f"sampler failed in the {pass_name} pass")
            if self.run_unet:
                out = tiny_models.forward(model, inputs)
                self.outputs.append(out)
        return out

    def record(self, p: Any, pass_name: str, step: int, steps: int, model: Any) -> StepRecord:
        unet = model.model.diffusion_model if hasattr(model, "model") else None
        state = getattr(unet, STATE_ATTR, None)
        return StepRecord(
            pass_name=pass_name,
            iteration=p.iteration,
            step=step,
            total=steps,
            model=self.webui.name_of(model),
            config=tome_core.get_config(model) if unet is not None else None,
            core_step=getattr(state, "step", None),
            hooks=tiny_models.hook_count(model) if unet is not None else 0,
            builtin=float(getattr(model, "applied_token_merged_ratio", 0) or 0),
        )

    def passes(self) -> list[tuple[str, int, str, TomeConfig | None]]:
        """(pass, iteration, model, config) at the first step of each pass; asserts the config held all pass long."""
        out: list[tuple[str, int, str, TomeConfig | None]] = []
        for record in self.records:
            key = (record.pass_name, record.iteration, record.model, record.config)
            if record.step == 0 or out[-1][:3] != key[:3]:
                out.append(key)
            else:
                assert out[-1] == key, f"config changed inside a pass: {out[-1]} -> {key}"
        return out


class WebUI:
    """The stand-in WebUI with the extension loaded."""

    def __init__(self, version: str = "1.10", models: Mapping[str, nn.Module] | None = None) -> None:
        assert version in VERSIONS
        reset()
        self.version = version
        self.models = dict(models or {"main": webui_model()})
        self.module = load_extension()
        runner_class = scripts.ScriptRunner if version == "1.10" else scripts.LegacyScriptRunner
        self.runners: dict[str, Any] = {}
        for tab, is_img2img in (("txt2img", False), ("img2img", True)):
            runner = runner_class()
            runner.initialize_scripts(is_img2img)
            runner.setup_without_ui({TITLE: len(IMG2IMG_ARG_NAMES if is_img2img else ARG_NAMES)})
            self.runners[tab] = runner
        sd_models.load(self.models["main"], main=True)

    def script(self, tab: str = "txt2img") -> Any:
        (script,) = [s for s in self.runners[tab].alwayson_scripts if s.title() == TITLE]
        return script

    def name_of(self, model: Any) -> str:
        for name, known in self.models.items():
            if known is model:
                return name
        return type(model).__name__

    def cfg_params(self, p: Any, step: int, total: int) -> script_callbacks.CFGDenoiserParams:
        args = (None, None, None, step, total, None, None)
        if self.version == "1.6":
            return script_callbacks.LegacyCFGDenoiserParams(*args)
        return script_callbacks.CFGDenoiserParams(*args, denoiser=Denoiser(p))

    def script_args(self, tab: str, tome: Sequence[Any] | Mapping[str, Any] | None) -> tuple[Any, ...]:
        return script_args(tab, tome)

    def make_p(self, tab: str, tome: Any = None, sampler: FakeSampler | None = None, **kwargs: Any) -> Any:
        cls = (
            processing.StableDiffusionProcessingImg2Img
            if tab == "img2img"
            else processing.StableDiffusionProcessingTxt2Img
        )
        return cls(
            scripts=self.runners[tab],
            script_args=self.script_args(tab, tome),
            sampler=sampler or FakeSampler(self),
            **kwargs,
        )

    def txt2img(self, tome: Any = None, **kwargs: Any) -> tuple[Any, processing.Processed]:
        p = self.make_p("txt2img", tome, **kwargs)
        return p, processing.process_images(p)

    def img2img(self, tome: Any = None, **kwargs: Any) -> tuple[Any, processing.Processed]:
        p = self.make_p("img2img", tome, **kwargs)
        return p, processing.process_images(p)

    def patched(self) -> dict[str, bool]:
        return {name: tome_core.is_patched(model) for name, model in self.models.items()}


# ---------------------------------------------------------------------------------------------- XYZ plot


def install_xyz_module() -> types.ModuleType:
    """A module shaped like scripts/xyz_grid.py (AxisOption classes, axis_options), registered as "xyz_grid.py"."""
    module = types.ModuleType("xyz_grid.py")

    class AxisOption:
        def __init__(
            self,
            label: str,
            type: Any,
            apply: Any,
            format_value: Any = None,
            confirm: Any = None,
            cost: float = 0.0,
            choices: Any = None,
        ) -> None:
            self.label = label
            self.type = type
            self.apply = apply
            self.format_value = format_value
            self.confirm = confirm
            self.cost = cost
            self.choices = choices

    class AxisOptionImg2Img(AxisOption):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.is_img2img = True

    class AxisOptionTxt2Img(AxisOption):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.is_img2img = False

    class XyzScript(scripts.Script):
        def title(self) -> str:
            return "X/Y/Z plot"

    XyzScript.__module__ = "xyz_grid.py"
    module.AxisOption = AxisOption
    module.AxisOptionImg2Img = AxisOptionImg2Img
    module.AxisOptionTxt2Img = AxisOptionTxt2Img
    module.axis_options = [AxisOption("Nothing", str, lambda p, x, xs: None)]
    scripts.scripts_data.append(scripts.ScriptClassData(XyzScript, "xyz_grid.py", "", module))
    return module


def run_xyz_cells(p: Any, module: types.ModuleType, axes: Mapping[str, Sequence[Any]]) -> list[processing.Processed]:
    """Like xyz_grid's cell loop for one axis (label -> values): confirm, then per value a shallow copy of p."""
    ((label, values),) = axes.items()
    (option,) = [o for o in module.axis_options if o.label == label]
    values = [option.type(v) for v in values]
    if option.confirm:
        option.confirm(p, values)
    results = []
    for value in values:
        pc = copy.copy(p)
        option.apply(pc, value, values)
        results.append(processing.process_images(pc))
    return results


# ---------------------------------------------------------------------------------------------- infotext

#: Copies of the WebUI's parse rules (modules/infotext_utils.py; 1.6 allowed only [\w ]+ in keys).
RE_PARAM = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
RE_PARAM_16 = re.compile(r'\s*([\w ]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
RE_IMAGESIZE = re.compile(r"^(\d+)x(\d+)$")


def parse_generation_parameters(text: str, regex: re.Pattern[str] = RE_PARAM) -> dict[str, Any]:
    """The key/value part of infotext_utils.parse_generation_parameters."""
    lastline = text.strip().split("\n")[-1]
    if len(regex.findall(lastline)) < 3:
        lastline = ""
    res: dict[str, Any] = {}
    for k, v in regex.findall(lastline):
        if v[0] == '"' and v[-1] == '"':
            v = json.loads(v)
        m = RE_IMAGESIZE.match(v)
        if m is not None:
            res[f"{k}-1"] = m.group(1)
            res[f"{k}-2"] = m.group(2)
        else:
            res[k] = v
    return res


UNCHANGED = object()


def ui_paste(fields: Sequence[tuple[Any, Any]], params: Mapping[str, Any]) -> list[Any]:
    """What connect_paste's paste_func sets on each component (UNCHANGED for gr.update())."""
    out: list[Any] = []
    for component, key in fields:
        v = key(params) if callable(key) else params.get(key, None)
        if v is None:
            out.append(UNCHANGED)
            continue
        valtype = type(component.value)
        if valtype is bool and v == "False":
            out.append(False)
        elif valtype is int:
            out.append(float(v))
        else:
            out.append(valtype(v))
    return out


def api_infotext(fields: Sequence[tuple[Any, Any]], params: Mapping[str, Any]) -> list[Any]:
    """What Api.apply_infotext puts into the script args (None: not mentioned)."""
    out: list[Any] = []
    for component, key in fields:
        value = key(params) if callable(key) else params.get(key)
        if value is not None:
            target_type = type(component.value)
            if not isinstance(value, target_type):
                value = target_type(value)
        out.append(value)
    return out
