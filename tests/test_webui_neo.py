"""The extension in a Forge Neo-shaped host (`webui_stub.neo`): Forge 2's order and model objects, Neo's own
`apply_token_merging` (with its epsilon scaling), its diffusion transformers (Flux, Flux.2, Chroma, Lumina 2,
Z-Image, Wan, Qwen-Image reduced; Anima named and left alone), its built-in Torch Compile Integrated and a step cache
shaped like its Spectrum, each as read from Neo's tree and seen running it (docs/hosts.md)."""

from __future__ import annotations

import html
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import errors, sd_models, shared
from webui_stub import forge, neo
from webui_stub.harness import custom_args, tome_args

import tome_core
from tome_core import TomeConfig, figures, get_preset
from tome_core.words import FAMILY_LABELS, speed_words
from tome_webui import hosts, ui

FIRST = TomeConfig(ratio=0.5)
NOTE = "ToMe note"


@pytest.fixture(autouse=True)
def _neo_builtin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(forge, "apply_token_merging", neo.apply_token_merging)
    yield
    shared.opts.data.clear()


@pytest.fixture
def engine() -> neo.StableDiffusion:
    return neo.StableDiffusion(forge.build_unet(forge.SD1_DEPTHS, seed=0))


class Seen:
    """Records, right before each sampling, whether the built-in and the epsilon scaling are on the patcher."""

    def __init__(self) -> None:
        self.samplings: list[tuple[bool, bool]] = []

    def __call__(self, patcher: forge.UnetPatcher) -> forge.UnetPatcher:
        holder = type("E", (), {"forge_objects": forge.ForgeObjects(patcher)})()
        self.samplings.append((forge.builtin_patched(holder), neo.epsilon_scaling(patcher)))
        return patcher


def test_neo_engine_is_handled_by_the_forge_adapter(engine: neo.StableDiffusion) -> None:
    assert hosts.host_of(engine).name == "forge"
    assert hosts.unet_of(engine) is engine.forge_objects.unet.model.diffusion_model


@pytest.mark.parametrize(
    ("hires", "expected"),
    [({}, FIRST), ({"hr_mode": "off"}, None)],
)
def test_hires_pass_after_the_discarded_hook_call(
    engine: neo.StableDiffusion, hires: dict[str, Any], expected: TomeConfig | None
) -> None:
    webui = neo.NeoWebUI(engine, lazy=True)
    p, processed = webui.run(tome=custom_args(**hires), enable_hr=True, n_iter=2, steps=2)
    seen = {(r.iteration, r.pass_name): r.config for r in p.sampler.records}
    assert seen == {(0, "first"): FIRST, (0, "hires"): expected, (1, "first"): FIRST, (1, "hires"): expected}
    assert NOTE not in processed.extra_generation_params
    assert not tome_core.is_patched(engine.forge_objects.unet.model.diffusion_model) and errors.reported == []


def test_epsilon_scaling_is_a_post_cfg_function_on_eps_models_only() -> None:
    shared.opts.data["scaling_factor"] = 1.02
    eps, flow = neo.StableDiffusion(forge.build_unet()), neo.Wan()
    for model in (eps, flow):
        neo.apply_token_merging(model, 0.0)
    assert neo.epsilon_scaling(eps.forge_objects.unet) and not neo.epsilon_scaling(flow.forge_objects.unet)
    assert not forge.builtin_patched(eps)


def test_builtin_off_keeps_the_epsilon_scaling(engine: neo.StableDiffusion) -> None:
    webui = neo.NeoWebUI(engine, lazy=False)
    shared.opts.data.update({"token_merging_ratio": 0.3, "scaling_factor": 1.02})
    seen = Seen()
    p, processed = webui.run(tome=custom_args(), enable_hr=True, steps=2, sampler=neo.NeoSampler(other_extension=seen))
    assert seen.samplings == [(False, True), (False, True)]  # first pass, hires pass
    assert processed.extra_generation_params["ToMe builtin"] == "disabled"
    assert all(r.config == FIRST for r in p.sampler.records)
    assert shared.opts.data["token_merging_ratio"] == 0.3


def test_builtin_applied_anyway_is_taken_off_without_the_epsilon_scaling(
    engine: neo.StableDiffusion, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forge, "apply_token_merging", lambda e, ratio: neo.apply_token_merging(e, 0.4))
    webui = neo.NeoWebUI(engine, lazy=False)
    shared.opts.data["scaling_factor"] = 1.05
    seen = Seen()
    _, processed = webui.run(tome=custom_args(), sampler=neo.NeoSampler(other_extension=seen))
    assert seen.samplings == [(False, True)]
    assert processed.extra_generation_params["ToMe builtin"] == "disabled"


# ---------------------------------------------------------------------------------------------- transformers

#: The family each reduced engine's presets resolve for: Neo builds Flux.2 with its Flux.1 class, the adapter knows.
FAMILY = {
    neo.Flux: "flux",
    neo.Flux2: "flux2",
    neo.Chroma: "chroma",
    neo.Lumina2: "lumina2",
    neo.ZImage: "zimage",
    neo.Wan: "wan",
    neo.QwenImage: "qwen",
}
#: Forge Neo's Qwen-Image takes the Wan VAE's [B, C, 1, H, W] latent (the core's layout reads it as one frame).
REDUCED = list(neo.REDUCED_ENGINES)


def module_of(engine: Any) -> torch.nn.Module:
    return engine.forge_objects.unet.model.diffusion_model


def equal_outputs(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.sampler.outputs(), b.sampler.outputs(), strict=True))


@pytest.mark.parametrize("model", REDUCED, ids=lambda m: m.__name__)
def test_a_diffusion_transformer_is_reduced_in_both_passes(model: type[neo.Flux]) -> None:
    """Flux, Flux.2, Chroma, Lumina 2, Z-Image, Wan, Qwen-Image: the preset resolved for the engine's family in the first and the hires
    pass, every block it selects reduced (no note), the image changed, the infotext in the transformer's fields,
    nothing left patched."""
    engine = model()
    base, _ = neo.NeoWebUI(engine, extension=False, lazy=False).run(enable_hr=True, steps=2)
    webui = neo.NeoWebUI(engine, lazy=True)
    p, processed = webui.run(tome=tome_args(preset="balanced"), enable_hr=True, steps=2)
    expected = get_preset("balanced").config(FAMILY[model])
    assert [(r.pass_name, r.config) for r in p.sampler.records] == [("first", expected)] * 2 + [("hires", expected)] * 2
    params = processed.extra_generation_params
    assert NOTE not in params and errors.reported == []
    assert params["ToMe preset"] == "balanced" and params["ToMe mode"] == expected.mode
    start = None if expected.block_start == TomeConfig().block_start else repr(expected.block_start)
    assert params.get("ToMe start at block") == start  # every block: the default
    assert ("ToMe ratio" in params) == (expected.mode == "merge")  # Flux.1's merged blocks' ratio alone
    assert not equal_outputs(p, base)
    assert not tome_core.is_patched(module_of(engine))
    off, processed = webui.run(tome=tome_args(False), enable_hr=True, steps=2)
    assert equal_outputs(off, base) and not any(key.startswith("ToMe") for key in processed.extra_generation_params)


@pytest.mark.parametrize("model", neo.UNHANDLED_ENGINES, ids=lambda m: m.__name__)
def test_a_transformer_tome_does_not_reduce_is_named_and_runs_unchanged(
    model: type[neo.Flux], caplog: pytest.LogCaptureFixture
) -> None:
    """Anima (a Cosmos transformer): never a silent no-op. The note names the class in the core's words,
    the log adds what ToMe does patch, and the image is the host's."""
    engine = model()
    name = type(module_of(engine)).__name__
    p0, _ = neo.NeoWebUI(engine, extension=False, lazy=False).run()
    webui = neo.NeoWebUI(engine, lazy=True)
    with caplog.at_level(logging.WARNING, logger="tome"):
        p, processed = webui.run(tome=custom_args())
    assert processed.extra_generation_params[NOTE] == f"not applied: {name} is not a model ToMe patches"
    logged = [r.message for r in caplog.records]
    assert any(f"not applied: {name} is not a model ToMe patches: it patches" in line for line in logged)
    assert equal_outputs(p0, p) and errors.reported == []


@pytest.mark.parametrize("model", neo.TRANSFORMER_ENGINES, ids=lambda m: m.__name__)
def test_the_loaded_family_is_the_engines(model: type[neo.Flux]) -> None:
    """The hint under Speed speaks of the loaded transformer's family (Flux.2 included); none for one ToMe does not
    reduce."""
    engine = model()
    neo.NeoWebUI(engine, lazy=False)
    assert sd_models.model_data.sd_model is engine
    assert ui.loaded_family() == FAMILY.get(model)
    assert hosts.host_of(engine).unet(engine) is (module_of(engine) if model in FAMILY else None)


class Wan5B(neo.Wan):
    """Wan 2.2 TI2V 5B: Neo's Wan class, its patch embedding taking the Wan 2.2 VAE's 48 latent channels."""

    repo = "Wan-AI/Wan2.2-TI2V-5B"

    @staticmethod
    def transformer() -> torch.nn.Module:
        from backend.nn.wan import WanModel

        return WanModel(in_dim=48)


@pytest.mark.parametrize("preset", ["balanced", "fastest"])
def test_a_wan22_5b_shows_the_5bs_figures_in_wans_words(preset: str) -> None:
    """Issue 58: the hint under Speed of a loaded Wan 2.2 TI2V 5B gives the 5B's rows of the speed table
    (`tome_core.families.figures_family`), in its line and its tooltip, not the 14B's; its presets, label and
    change stay Wan's."""
    neo.NeoWebUI(Wan5B(), lazy=False)
    assert ui.loaded_family() == "wan"
    page = {"width": 832, "height": 480, "hires": False, "hr_scale": 2, "send": 3, "controls": {"preset": preset}}
    rendered = ui.note_function(False)(type("Event", (), {"_data": json.dumps(page)})())
    line = html.unescape(rendered)
    five, fourteen = (speed_words(preset, name, (832, 480)) for name in ("wan22-5b", "wan"))
    assert five and fourteen and five != fourteen  # the test tells them apart
    assert five in line and fourteen not in line
    assert f"{FAMILY_LABELS['wan']}: " in line
    tooltip = html.unescape(re.search(r' title="([^"]*)"', rendered).group(1))  # type: ignore[union-attr]
    rows = {name: table_words(name, preset) for name in ("wan22-5b", "wan")}
    assert f"faster per step: {rows['wan22-5b']}" in tooltip and rows["wan"] not in tooltip


def table_words(name: str, preset: str) -> str:
    """A figures family's speed-ups at each size of the speed table, as the tooltip lists them."""
    found = [figures.speed(name, preset, *size) for size in figures.sizes(name, preset)]
    return ", ".join(f"{f.speedup:.2f}\u00d7 at {f.size[0]}\u00d7{f.size[1]}" for f in found if f is not None)


def wan_note(engine: Any, batch_size: float | None, *, preset: str = "balanced", img2img: bool = False) -> str:
    """The note under Speed for an 832x480 page with `batch_size` in Neo's Batch Size (its "Frames" in the Wan UI
    preset), `engine` loaded."""
    neo.NeoWebUI(engine, lazy=False)
    page = {"width": 832, "height": 480, "batch_size": batch_size, "send": 1, "controls": {"preset": preset}}
    if not img2img:
        page.update(hires=False, hr_scale=2)
    return html.unescape(ui.note_function(img2img)(type("Event", (), {"_data": json.dumps(page)})()))


@pytest.mark.parametrize("img2img", [False, True])
@pytest.mark.parametrize("preset", ["balanced", "fastest"])
@pytest.mark.parametrize(
    ("engine", "rows", "batch_size", "frames"),
    [
        (neo.Wan, "wan", 81, 81),
        (neo.Wan, "wan", 33, 33),
        (neo.Wan, "wan", 83, 81),  # Neo rounds down to 4k+1 frames (`process_images_inner`)
        (Wan5B, "wan22-5b", 81, 81),
        (neo.Wan, "wan", 1, 1),  # a single image
        (neo.Wan, "wan", 4, 1),
        (neo.Wan, "wan", None, 1),  # a page without the control
    ],
)
def test_a_wan_in_neo_gets_the_figure_at_its_frame_count(
    engine: type[neo.Wan], rows: str, batch_size: int | None, frames: int, preset: str, img2img: bool
) -> None:
    """Neo's Wan makes one video of the batch size's frames (`process_images_inner`, rounded down to 4k+1): the hint
    gives the speed table's figure at that many frames, not a bound at one frame."""
    line = wan_note(engine(), batch_size, preset=preset, img2img=img2img)
    expected = speed_words(preset, rows, (832, 480, frames))
    assert expected and expected in line
    if frames > 1:
        assert figures.speed(rows, preset, 832, 480, frames).bound == ""  # type: ignore[union-attr]
        assert f"832\u00d7480, {frames} frames" in line and speed_words(preset, rows, (832, 480)) not in line


@pytest.mark.parametrize(("engine", "family"), [(neo.QwenImage, "qwen"), (neo.Flux, "flux")])
def test_other_neo_models_keep_the_one_frame_figure(engine: type[neo.Flux], family: str) -> None:
    """Qwen-Image takes the Wan VAE too (`is_wan`) but is no Wan repo, so Neo makes a batch of images of it, as of
    Flux: their hints stay at the image's size whatever the batch size."""
    built = engine()
    line = wan_note(built, 81)
    assert line == wan_note(built, 1) and "frames" not in line
    assert ui.loaded_family() == family


@pytest.mark.parametrize(("engine", "tokens"), [(neo.Wan, 52 * 30), (Wan5B, 26 * 15)])
def test_the_token_hint_counts_a_wan_tokens_by_its_patch(engine: type[neo.Wan], tokens: int) -> None:
    """A token of Wan 2.1/2.2 14B covers 16x16 px (8x VAE, 2x2 patches); of Wan 2.2 TI2V 5B 32x32 px (16x VAE)."""
    neo.NeoWebUI(engine(), lazy=False)
    page = {"width": 832, "height": 480, "send": 1, "controls": {"preset": "custom", "mode": "kv", "sx": 2, "sy": 2}}
    rendered = html.unescape(ui.note_function(True)(type("Event", (), {"_data": json.dumps(page)})()))
    assert f">{tokens} \u2192 " in rendered


def test_custom_settings_a_transformer_cannot_run_are_refused_in_the_note() -> None:
    """The custom controls' defaults (ToMe's merge at ratio 0.5): the core refuses them for a DiT, whose merged blocks
    merge whole cells; the note gives its message, the image is the host's; keys/values subsampling as Custom runs."""
    engine = neo.Flux()
    p0, _ = neo.NeoWebUI(engine, extension=False, lazy=False).run()
    webui = neo.NeoWebUI(engine, lazy=False)
    p, processed = webui.run(tome=custom_args())
    module = module_of(engine)
    with pytest.raises(ValueError) as refused:
        tome_core.dit.check_config(TomeConfig(), type(module).__name__, tome_core.find_layout(module), module)
    assert processed.extra_generation_params[NOTE] == f"not applied: {refused.value}"
    assert equal_outputs(p0, p) and not tome_core.is_patched(module_of(engine))
    kv, processed = webui.run(tome=custom_args(mode="kv", sx=2, sy=2))
    assert NOTE not in processed.extra_generation_params and not equal_outputs(p0, kv)
    assert {r.config for r in kv.sampler.records} == {TomeConfig(mode="kv", sx=2, sy=2)}


def test_another_attention_kernel_is_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neo on a CPU (or with SageAttention, FlashAttention, xformers) does not call PyTorch's SDPA, where ToMe
    subsamples keys/values: the blocks are planned and not reached, the note says so, the image is the host's."""
    import backend.attention

    monkeypatch.setattr(backend.attention, "attention_function", backend.attention.attention_basic)
    engine = neo.Flux()
    # Four steps: the last lies in Quality's step window (from 0.75 of the steps on).
    p0, _ = neo.NeoWebUI(engine, extension=False, lazy=False).run(steps=4)
    p, processed = neo.NeoWebUI(engine, lazy=False).run(tome=tome_args(preset="quality"), steps=4)
    note = processed.extra_generation_params[NOTE]
    assert note.startswith("subsampled keys/values in 0 of ") and "--use-pytorch-cross-attention" in note
    assert equal_outputs(p0, p)


def test_failed_generation_leaves_the_transformer_clean_for_the_next() -> None:
    engine = neo.Flux()
    p0, _ = neo.NeoWebUI(engine, extension=False, lazy=False).run()
    webui = neo.NeoWebUI(engine, lazy=False)
    p = webui.make_p("txt2img", tome_args(preset="fastest"), sampler=neo.NeoSampler(fail_at=("first", 1)))
    with pytest.raises(RuntimeError):
        forge.process_images(p, to_load=engine)
    assert tome_core.is_patched(module_of(engine))  # postprocess did not run, as in the host
    off, _ = neo.NeoWebUI(engine, lazy=False).run(tome=tome_args(False))
    assert not tome_core.is_patched(module_of(engine)) and equal_outputs(p0, off)


# ---------------------------------------------------------------------------------------------- Spectrum


def test_spectrum_and_tome_compose() -> None:
    """Neo's step cache wraps the model call on a clone of the patcher (before ours, a built-in) and skips the model
    on the steps it forecasts: ToMe reduces the steps that run, says nothing is missing, and leaves Spectrum's own
    image when off."""
    engine = neo.Flux()
    steps, spectrum = 6, (True, 2, 1)
    alone = neo.NeoWebUI(engine, extension=False, lazy=False)
    cached, _ = alone.run(steps=steps, spectrum=spectrum)
    assert alone.spectrum.forecasts > 0 and alone.spectrum.calls < steps * 1
    webui = neo.NeoWebUI(engine, lazy=False)
    both, processed = webui.run(tome=tome_args(preset="balanced"), steps=steps, spectrum=spectrum)
    assert NOTE not in processed.extra_generation_params and errors.reported == []
    assert webui.spectrum.forecasts == alone.spectrum.forecasts and webui.spectrum.calls == alone.spectrum.calls
    assert not equal_outputs(both, cached)
    off, _ = webui.run(tome=tome_args(False), steps=steps, spectrum=spectrum)
    assert equal_outputs(off, cached) and not tome_core.is_patched(module_of(engine))
    # Spectrum forecasts from what ToMe's steps returned: the same as ToMe alone on the steps both run
    plain, _ = webui.run(tome=tome_args(preset="balanced"), steps=steps)
    assert torch.equal(plain.sampler.outputs()[0], both.sampler.outputs()[0])


def test_off_is_bitwise_the_host_without_the_extension(engine: neo.StableDiffusion) -> None:
    p0, _ = neo.NeoWebUI(engine, extension=False, lazy=False).run(enable_hr=True, steps=2)
    webui = neo.NeoWebUI(engine, lazy=False)
    webui.run(tome=custom_args(), enable_hr=True, steps=2)
    off, processed = webui.run(tome=tome_args(False), enable_hr=True, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(p0.sampler.outputs(), off.sampler.outputs(), strict=True))
    assert not any(key.startswith("ToMe") for key in processed.extra_generation_params)


# ---------------------------------------------------------------------------------------------- Torch Compile


def is_compiled(engine: neo.StableDiffusion) -> bool:
    return isinstance(engine.forge_objects.unet.model.diffusion_model, torch._dynamo.eval_frame.OptimizedModule)


def outputs(p: Any) -> list[torch.Tensor]:
    return p.sampler.outputs()


def close(a: Any, b: Any) -> bool:
    """The same images up to float rounding (compiled against eager)."""
    return all(torch.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(outputs(a), outputs(b), strict=True))


def equal(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(outputs(a), outputs(b), strict=True))


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("preset", ["guard_filter_fn", "cudagraphs"])
def test_torch_compile_integrated_runs_tome_merged_and_compiled(engine: neo.StableDiffusion, preset: str) -> None:
    """Neo's wrapper is at `diffusion_model` before ours patches (its `process_batch`): the patch goes on the module
    it wraps, the wrapper traces once more, and the image is the eager merged one, not the compiled one without ToMe.
    A second generation compiles nothing; one without ToMe is the compiled image without ToMe again (no leak).

    "cudagraphs" traces what "dynamic" traces (dynamic shapes) with fullgraph=True on top, where any graph break
    fails; "dynamic" itself runs in the live suite (tests/test_live_webui.py)."""
    webui = neo.NeoWebUI(engine, lazy=False)
    eager, _ = webui.run(tome=custom_args(), steps=3)
    without, _ = webui.run(tome=tome_args(False), compile_preset=preset, steps=3)
    assert is_compiled(engine) and webui.graphs.graphs == 1
    merged, processed = webui.run(tome=custom_args(), steps=3)  # "Automatic": the same wrapper
    assert is_compiled(engine) and NOTE not in processed.extra_generation_params
    assert webui.graphs.graphs == 2  # traced again, once, with the patch
    assert close(merged, eager) and not torch.equal(outputs(merged)[-1], outputs(without)[-1])
    assert {r.config for r in merged.sampler.records} == {FIRST}
    again, processed = webui.run(tome=custom_args(), steps=3)
    assert NOTE not in processed.extra_generation_params and equal(again, merged)
    off, processed = webui.run(tome=tome_args(False), steps=3)
    assert equal(off, without) and not any(key.startswith("ToMe") for key in processed.extra_generation_params)
    assert webui.graphs.graphs == 2  # the second generation reused ToMe's graph, the last one the first graph
    assert not tome_core.is_patched(engine.forge_objects.unet.model.diffusion_model) and errors.reported == []


@pytest.mark.usefixtures("fresh_dynamo")
def test_torch_compile_integrated_named_in_every_request_merges_each_time(engine: neo.StableDiffusion) -> None:
    """torch.compile pops `guard_filter_fn` out of the config Neo keeps, so naming that preset again builds a new
    wrapper in every request (Automatic keeps the old one): each new wrapper runs ToMe merged too."""
    webui = neo.NeoWebUI(engine, lazy=False)
    eager, _ = webui.run(tome=custom_args(), steps=2)
    wrappers = []
    for _ in range(2):
        p, processed = webui.run(tome=custom_args(), compile_preset="guard_filter_fn", steps=2)
        wrappers.append(engine.forge_objects.unet.model.diffusion_model)
        assert NOTE not in processed.extra_generation_params and close(p, eager)
    assert wrappers[0] is not wrappers[1]


@pytest.mark.usefixtures("fresh_dynamo")
def test_torch_compile_integrated_with_hires_merges_both_passes(engine: neo.StableDiffusion) -> None:
    webui = neo.NeoWebUI(engine, lazy=False)
    eager, _ = webui.run(tome=custom_args(hr_mode="own", hr_ratio=0.3), enable_hr=True, steps=2)
    webui.run(tome=tome_args(False), compile_preset="guard_filter_fn", enable_hr=True, steps=2)
    merged, processed = webui.run(tome=custom_args(hr_mode="own", hr_ratio=0.3), enable_hr=True, steps=2)
    assert NOTE not in processed.extra_generation_params and close(merged, eager)
    graphs = webui.graphs.graphs
    webui.run(tome=custom_args(hr_mode="own", hr_ratio=0.3), enable_hr=True, steps=2)
    assert webui.graphs.graphs == graphs


@pytest.mark.usefixtures("fresh_dynamo")
def test_torch_compile_disabled_in_the_same_generation_merges(engine: neo.StableDiffusion) -> None:
    """Neo's script takes its wrapper off in `process_batch`, before ours patches: the UNet merges as without it."""
    webui = neo.NeoWebUI(engine, lazy=False)
    webui.run(tome=tome_args(False), compile_preset="guard_filter_fn", steps=2)
    p, processed = webui.run(tome=custom_args(), compile_preset="Disable", steps=2)
    assert not is_compiled(engine)
    assert NOTE not in processed.extra_generation_params
    assert [r.config for r in p.sampler.records] == [FIRST, FIRST]
    assert not tome_core.is_patched(engine.forge_objects.unet.model.diffusion_model)


@pytest.mark.usefixtures("fresh_dynamo")
def test_torch_compile_integrated_reduces_a_transformer() -> None:
    """Neo's compile wrapper around its Flux transformer: the patch goes on the module it wraps, the wrapper traces
    once more and runs reduced (close to the eager reduced image); a second generation compiles nothing; off gives
    the compiled image without ToMe again."""
    engine = neo.Flux()
    webui = neo.NeoWebUI(engine, lazy=False)
    eager, _ = webui.run(tome=tome_args(preset="fast"), steps=2)
    without, _ = webui.run(tome=tome_args(False), compile_preset="guard_filter_fn", steps=2)
    assert is_compiled(engine)
    reduced, processed = webui.run(tome=tome_args(preset="fast"), steps=2)
    assert NOTE not in processed.extra_generation_params and close(reduced, eager)
    assert not torch.equal(outputs(reduced)[-1], outputs(without)[-1])
    graphs = webui.graphs.graphs
    again, _ = webui.run(tome=tome_args(preset="fast"), steps=2)
    assert webui.graphs.graphs == graphs and equal(again, reduced)
    off, _ = webui.run(tome=tome_args(False), steps=2)
    assert equal(off, without) and not tome_core.is_patched(module_of(engine)) and errors.reported == []


class _Keys(torch.overrides.TorchFunctionMode):
    """The keys of every scaled_dot_product_attention call."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[torch.Tensor] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        # scaled_dot_product_attention, or the kernel the core calls itself where each query keeps its own key
        if func in (
            torch.nn.functional.scaled_dot_product_attention,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
        ):
            self.keys.append(args[1].detach().clone())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("multiple", "caption"), [(32, 32), (None, 7)], ids=["Z-Image", "Lumina 2"])
def test_neo_nextdit_keeps_the_whole_caption_and_subsamples_its_own_grid(multiple: int | None, caption: int) -> None:
    """Neo's `NextDiT`: the caption (7 tokens; Z-Image pads it to 32), then the 8x8 grid. In the first joint block
    (after the caption's and the image's refiners) the keys under the patch are the unpatched keys of every caption
    token and one token of each 2x2 cell (the call's slot)."""
    from backend.nn.lumina import NextDiT

    from tome_core.dit import draw_slot
    from tome_core.merge import kv_index

    torch.manual_seed(0)
    model = NextDiT(pad_tokens_multiple=multiple).eval()
    x, context = torch.randn(2, 4, 16, 16), torch.randn(2, 7, forge.CONTEXT_DIM)

    def first_joint_keys() -> torch.Tensor:
        with _Keys() as seen, torch.no_grad():
            model(x, torch.full((2,), 0.5), context)
        return seen.keys[2]

    full = first_joint_keys()
    tome_core.apply_patch(model, sx=2, sy=2)
    reduced = first_joint_keys()
    tome_core.remove_patch(model)
    slot = int(draw_slot(torch.full((2,), 0.5)))  # the call's timestep picks which token of each cell
    index = kv_index(caption, (1, 8, 8), int(full.shape[-2]) - caption - 64, 1, 2, 2, "cpu", slot)
    assert torch.equal(reduced, full.index_select(-2, index))
