"""The extension in an SD.Next-shaped host (`webui_stub.sdnext`): diffusers pipelines, no per-step callback.

The stand-in runs SD.Next's callback order (docs/hosts.md) over tiny real diffusers UNets: the first pass is set in
`process_batch`, the hires and refiner passes are seen through the adapter's watch on the UNet's calls; the built-in
token merging (tomesd / ToDo) is applied from the settings in `process_pre` and removed in `process_post`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import errors, script_callbacks, shared
from webui_stub import harness, sdnext
from webui_stub.harness import custom_args, tome_args

import tome_core
from tome_core import TomeConfig
from tome_webui import hosts

FIRST = TomeConfig(ratio=0.5)
OWN = {"hr_mode": "own", "hr_preset": "custom", "hr_ratio": 0.3, "hr_sx": 4, "hr_sy": 4, "hr_max_downsample": "2"}
NOTE = "ToMe note"


@pytest.fixture(autouse=True)
def _sdnext_callbacks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """SD.Next's `on_after_process` registrar, present in the stub's script_callbacks only for these tests."""
    monkeypatch.setattr(script_callbacks, "on_after_process", sdnext.on_after_process, raising=False)
    yield
    shared.opts.data.clear()


@pytest.fixture
def pipe() -> sdnext.Pipeline:
    return sdnext.build_pipeline("diffusers_sd1", seed=0)


def clean(unet: torch.nn.Module) -> bool:
    """No patch of ours and no hook of anyone's left on the UNet."""
    hooks = [m for m in unet.modules() if m._forward_pre_hooks or m._forward_hooks]
    return not tome_core.is_patched(unet) and not hooks


def baseline(pipe: sdnext.Pipeline, tab: str = "txt2img", **kwargs: Any) -> list[torch.Tensor]:
    p, _ = sdnext.SDNextWebUI(pipe, extension=False).run(tab, **kwargs)
    return sdnext.outputs(p)


# ---------------------------------------------------------------------------------------------- the host


def test_adapter_takes_the_unet_of_a_pipeline_and_none_of_a_transformer_pipeline(pipe: sdnext.Pipeline) -> None:
    host = hosts.host_of(pipe)
    assert host.name == "sdnext"
    assert host.unet(pipe) is pipe.unet
    assert hosts.unet_of(sdnext.TransformerPipeline()) is None
    flux = sdnext.FluxPipeline()
    assert hosts.unet_of(flux) is flux.transformer
    assert hosts.host_of(sdnext.TransformerPipeline()).name == "sdnext"


def test_first_pass_merges_without_a_note_and_leaves_the_unet_clean(pipe: sdnext.Pipeline) -> None:
    webui = sdnext.SDNextWebUI(pipe)
    p, processed = webui.run(tome=custom_args())
    assert sdnext.passes(p) == {(0, "first"): FIRST}
    assert processed is not None
    assert processed.extra_generation_params["ToMe ratio"] == "0.5"
    assert NOTE not in processed.extra_generation_params and "ToMe error" not in processed.extra_generation_params
    assert clean(pipe.unet) and errors.reported == []


@pytest.mark.parametrize(
    ("hires", "expected"),
    [
        ({}, (FIRST, FIRST)),
        (OWN, (FIRST, TomeConfig(ratio=0.3, sx=4, sy=4, max_downsample=2))),
        ({"hr_mode": "off"}, (FIRST, None)),
    ],
)
def test_hires_pass_is_seen_from_the_unet_calls_and_gets_its_config(
    pipe: sdnext.Pipeline, hires: dict[str, Any], expected: tuple[TomeConfig, TomeConfig | None]
) -> None:
    webui = sdnext.SDNextWebUI(pipe)
    p, processed = webui.run(tome=custom_args(**hires), enable_hr=True, n_iter=2, steps=2)
    assert sdnext.passes(p) == {
        (0, "first"): expected[0],
        (0, "hires"): expected[1],
        (1, "first"): expected[0],
        (1, "hires"): expected[1],
    }
    assert processed is not None and NOTE not in processed.extra_generation_params
    assert clean(pipe.unet) and errors.reported == []


@pytest.mark.parametrize("tab", ["txt2img", "img2img"])
def test_off_is_bitwise_the_host_without_the_extension(pipe: sdnext.Pipeline, tab: str) -> None:
    hires = {"enable_hr": True} if tab == "txt2img" else {}
    alone = baseline(pipe, tab, **hires)
    webui = sdnext.SDNextWebUI(pipe)
    on, _ = webui.run(tab, tome=custom_args(img2img=tab == "img2img"), **hires)
    off, processed = webui.run(tab, tome=tome_args(False, img2img=tab == "img2img"), **hires)
    assert all(torch.equal(a, b) for a, b in zip(alone, sdnext.outputs(off), strict=True))
    assert not torch.equal(alone[-1], sdnext.outputs(on)[-1])
    assert processed is not None and not any(key.startswith("ToMe") for key in processed.extra_generation_params)
    assert clean(pipe.unet)


def test_refiner_pipeline_gets_the_first_pass_config_on_its_own_unet(pipe: sdnext.Pipeline) -> None:
    refiner = sdnext.build_pipeline("diffusers_sd1", seed=1, name="refiner")
    webui = sdnext.SDNextWebUI(pipe, refiner=refiner)
    p, processed = webui.run(tome=custom_args(hr_mode="off"), enable_hr=True, steps=2)
    seen = {(c.pass_name, c.pipeline): c.config for c in p.calls}
    assert seen == {("first", "base"): FIRST, ("hires", "base"): None, ("refiner", "refiner"): FIRST}
    assert processed is not None and NOTE not in processed.extra_generation_params
    assert clean(pipe.unet) and clean(refiner.unet)


def test_sdxl_pipeline_resolves_a_preset_for_sdxl() -> None:
    pipe = sdnext.build_pipeline("diffusers_sdxl", seed=2)
    webui = sdnext.SDNextWebUI(pipe)
    p, processed = webui.run(tome=tome_args(True, preset="fast"))
    assert processed is not None
    (config,) = set(sdnext.passes(p).values())
    assert config == tome_core.get_preset("fast").config("sdxl")
    assert processed.extra_generation_params["ToMe preset"] == "fast"


# ---------------------------------------------------------------------------------------------- built-in


@pytest.mark.parametrize(("method", "ratio_key"), [("ToDo", "todo_ratio"), ("ToMe", "tome_ratio")])
def test_builtin_is_switched_off_while_ours_runs_and_comes_back_after(
    pipe: sdnext.Pipeline, method: str, ratio_key: str
) -> None:
    webui = sdnext.SDNextWebUI(pipe)
    shared.opts.data.update({"token_merging_method": method, ratio_key: 0.5})
    p, processed = webui.run(tome=custom_args(), enable_hr=True, steps=2)
    assert processed is not None
    assert all(call.config is not None and not call.todo for call in p.calls)
    assert processed.extra_generation_params["ToMe builtin"] == "disabled"
    assert method not in processed.extra_generation_params  # the built-in's own infotext key
    assert shared.opts.data["token_merging_method"] == method  # the setting is restored
    off, processed = webui.run(tome=tome_args(False))
    assert processed is not None and processed.extra_generation_params[method] == 0.5  # the built-in as before
    assert all(call.todo == (method == "ToDo") for call in off.calls)


def test_per_request_builtin_ratio_is_switched_off_in_the_infotext_too(pipe: sdnext.Pipeline) -> None:
    webui = sdnext.SDNextWebUI(pipe)
    p = webui.make_p(tome=custom_args())
    p.token_merging_method, p.tome_ratio = "ToMe", 0.4
    processed = sdnext.process_images(p)
    assert processed is not None
    assert processed.extra_generation_params["ToMe builtin"] == "disabled"
    assert "ToMe" not in processed.extra_generation_params and ", ToMe: " not in processed.infotexts[0]


def test_other_extensions_attention_processors_survive_ours(pipe: sdnext.Pipeline) -> None:
    """Ours adds forward hooks only; the built-in's ToDo removal (which resets every processor) does not run."""
    webui = sdnext.SDNextWebUI(pipe)
    shared.opts.data.update({"token_merging_method": "ToDo", "todo_ratio": 0.5})
    for attn in sdnext.self_attention_modules(pipe.unet):
        attn.set_processor(sdnext.OtherExtensionProcessor())
    before = {id(attn): attn.processor for attn in sdnext.attention_modules(pipe.unet)}
    p, processed = webui.run(tome=custom_args(), enable_hr=True, steps=2)
    assert processed is not None and NOTE not in processed.extra_generation_params
    assert {id(attn): attn.processor for attn in sdnext.attention_modules(pipe.unet)} == before
    assert all(call.config == FIRST for call in p.calls)


# ---------------------------------------------------------------------------------------------- API


@pytest.mark.parametrize(
    ("api_args", "expected"),
    [
        ([True, 0.4], TomeConfig(ratio=0.4)),  # SD.Next hands the request's raw (short) list to the script
        ([{"ratio": 0.3, "sx": 4}], TomeConfig(ratio=0.3, sx=4)),
        ([{"preset": "quality"}], tome_core.get_preset("quality").config("sd")),
    ],
)
def test_api_args_reach_the_script_as_sent(pipe: sdnext.Pipeline, api_args: list[Any], expected: TomeConfig) -> None:
    webui = sdnext.SDNextWebUI(pipe)
    p = webui.make_p(api_args=api_args, is_api=True)
    processed = sdnext.process_images(p)
    assert processed is not None and "ToMe error" not in processed.extra_generation_params
    assert set(sdnext.passes(p).values()) == {expected}


def test_invalid_api_args_leave_tome_off_with_the_error_in_the_infotext(pipe: sdnext.Pipeline) -> None:
    alone = baseline(pipe)
    webui = sdnext.SDNextWebUI(pipe)
    p = webui.make_p(api_args=[True, 5], is_api=True)
    processed = sdnext.process_images(p)
    assert processed is not None
    assert processed.extra_generation_params["ToMe error"] == "ratio (args[1]) must be a number in [0, 0.95], got 5"
    assert all(torch.equal(a, b) for a, b in zip(alone, sdnext.outputs(p), strict=True))


# ---------------------------------------------------------------------------------------------- never silent


def test_pipeline_without_a_unet_gets_a_note_and_runs_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    """A transformer of a class ToMe does not reduce: the note names it in the core's words, the log once more with
    what ToMe does patch."""
    webui = sdnext.SDNextWebUI(sdnext.TransformerPipeline())
    with caplog.at_level(logging.WARNING, logger="tome"):
        _, processed = webui.run(tome=custom_args(), enable_hr=True)
    assert processed is not None
    assert processed.extra_generation_params[NOTE] == "not applied: Linear is not a model ToMe patches"
    head = f"ToMe {tome_core.__version__}: not applied: Linear is not a model ToMe patches"
    full, note = [r.message for r in caplog.records]
    assert full.startswith(f"{head}: it patches UNets") and note == head
    assert errors.reported == []


def test_a_flux_pipeline_is_reduced_through_its_transformer() -> None:
    """SD.Next with a diffusers Flux pipeline: the adapter hands `pipeline.transformer` to the core, the preset
    resolves for Flux.1, both passes run reduced (the hires pass through the image-to-image pipeline made from the
    base one), nothing is left, and off is bitwise the pipeline without ToMe."""
    pipe = sdnext.FluxPipeline()
    base = sdnext.SDNextWebUI(pipe, extension=False)
    alone, _ = base.run(enable_hr=True, steps=2)
    webui = sdnext.SDNextWebUI(pipe)
    p, processed = webui.run(tome=tome_args(preset="fast"), enable_hr=True, steps=2)
    fast = tome_core.get_preset("fast").config("flux")
    assert sdnext.passes(p) == {(0, "first"): fast, (0, "hires"): fast}
    assert processed is not None and NOTE not in processed.extra_generation_params
    assert processed.extra_generation_params["ToMe preset"] == "fast"
    # Flux.1's presets run their last blocks on merged tokens: the infotext records that ratio.
    assert processed.extra_generation_params.get("ToMe ratio") == (str(fast.ratio) if fast.mode == "merge" else None)
    assert not all(torch.equal(a, b) for a, b in zip(sdnext.outputs(alone), sdnext.outputs(p), strict=True))
    assert clean(pipe.transformer) and errors.reported == []
    off, _ = webui.run(tome=tome_args(False), enable_hr=True, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(sdnext.outputs(alone), sdnext.outputs(off), strict=True))


# ---------------------------------------------------------------------------------------------- no leaks


@pytest.mark.parametrize("where", [("first", 1), ("hires", 0)])
def test_interrupted_generation_skips_postprocess_yet_leaves_nothing(
    pipe: sdnext.Pipeline, where: tuple[str, int]
) -> None:
    alone = baseline(pipe, enable_hr=True, steps=2)
    webui = sdnext.SDNextWebUI(pipe)
    p, _ = webui.run(tome=custom_args(), enable_hr=True, steps=2, interrupt_at=where)
    assert shared.state.interrupted and p.tome_run is not None  # postprocess did not run
    assert clean(pipe.unet)  # on_after_process did the cleaning
    off, _ = webui.run(tome=tome_args(False), enable_hr=True, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(alone, sdnext.outputs(off), strict=True))


def test_failed_pipeline_call_leaves_nothing(pipe: sdnext.Pipeline) -> None:
    webui = sdnext.SDNextWebUI(pipe)
    p, _ = webui.run(tome=custom_args(), enable_hr=True, fail_at="hires")
    assert shared.state.interrupted and [c.pass_name for c in p.calls] == ["first"] * 3
    assert clean(pipe.unet)


# ---------------------------------------------------------------------------------------------- torch.compile


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize(
    ("options", "hires"),
    [(sdnext.COMPILE_OPTIONS, False), (("repeated", "dynamic"), True)],
    ids=["UNet wrapped", "blocks compiled in place, hires"],
)
def test_compiled_model_runs_tome_merged(options: tuple[str, ...], hires: bool) -> None:
    """SD.Next compiles the UNet when the model loads (a wrapper at `pipe.unet` by default; its transformer blocks in
    place without "components"). The patch goes on the UNet module, the compiled graphs trace again with ToMe's
    hooks in them, and the images are the eager merged ones (the hires pass seen from the UNet's calls). A second
    generation compiles nothing; one without ToMe gives the compiled images without ToMe again.

    The wrapper runs the first pass only: its dynamic shapes trace slowly, and the hires pass is the same path.
    FIRST merges at level 1 only, so a two-level UNet shows it all and traces in half the time."""
    eager, _ = sdnext.SDNextWebUI(sdnext.build_pipeline("diffusers_sd1_small", seed=0)).run(
        tome=custom_args(), enable_hr=hires, steps=2
    )
    pipe = sdnext.build_pipeline("diffusers_sd1_small", seed=0)
    graphs = harness.GraphCounter()
    sdnext.compile_torch(pipe, graphs, options)
    webui = sdnext.SDNextWebUI(pipe)
    plain, _ = webui.run(tome=tome_args(False), enable_hr=hires, steps=2)
    compiled = graphs.graphs
    merged, processed = webui.run(tome=custom_args(), enable_hr=hires, steps=2)
    assert processed is not None and NOTE not in processed.extra_generation_params
    expected = {(0, "first"): FIRST, (0, "hires"): FIRST} if hires else {(0, "first"): FIRST}
    assert sdnext.passes(merged) == expected
    pairs = zip(sdnext.outputs(merged), sdnext.outputs(eager), strict=True)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in pairs)
    assert not torch.equal(sdnext.outputs(merged)[-1], sdnext.outputs(plain)[-1])
    assert graphs.graphs > compiled  # traced again with the patch
    after_merged = graphs.graphs
    webui.run(tome=custom_args(), enable_hr=hires, steps=2)
    off, _ = webui.run(tome=tome_args(False), enable_hr=hires, steps=2)
    assert graphs.graphs == after_merged
    assert all(torch.equal(a, b) for a, b in zip(sdnext.outputs(off), sdnext.outputs(plain), strict=True))
    assert clean(getattr(pipe.unet, "_orig_mod", pipe.unet)) and errors.reported == []
