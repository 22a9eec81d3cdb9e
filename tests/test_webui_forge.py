"""The extension in a Forge-shaped host (Forge 2; the same model shape as reForge / Forge Classic's forge_objects).

The stand-in (`webui_stub.forge`) evaluates a real small UNet through a ComfyUI-style patcher, in Forge 2's
callback order: lazy model load after `before_process`, `forge_objects` reset before every sampling, the
discarded first `process_before_every_sampling` call of the hires pass, the built-in `TomePatcher`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import errors, sd_models, shared
from webui_stub import forge, harness
from webui_stub.harness import custom_args, tome_args

import tome_core
from tome_core import TomeConfig
from tome_webui import hosts

FIRST = TomeConfig(ratio=0.5)
OWN = {"hr_mode": "own", "hr_preset": "custom", "hr_ratio": 0.3, "hr_sx": 4, "hr_sy": 4, "hr_max_downsample": "2"}
NOTE = "ToMe note"


@pytest.fixture
def engine() -> forge.Engine:
    return forge.Engine(forge.build_unet(forge.SD1_DEPTHS, seed=0))


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    shared.opts.data.clear()


def patched(engine: forge.Engine) -> bool:
    return tome_core.is_patched(engine.forge_objects_original.unet.model.diffusion_model)


def replace_all_attn1(patcher: forge.UnetPatcher) -> forge.UnetPatcher:
    """Another extension (StyleAlign, reference-only) replacing self-attention in every block."""
    clone = patcher.clone()
    unet = clone.model.diffusion_model
    for stage, stages in (
        ("input", unet.input_blocks),
        ("middle", [unet.middle_block]),
        ("output", unet.output_blocks),
    ):
        for number, block in enumerate(stages):
            for layer in block:
                for index, _ in enumerate(getattr(layer, "transformer_blocks", ())):
                    clone.set_model_attn1_replace(
                        lambda q, k, v, extra: forge.attention(q, k, v, 2), stage, number, index
                    )
    return clone


def pass_through_attn1_patch(patcher: forge.UnetPatcher) -> forge.UnetPatcher:
    """Another extension's attn1 patch that changes nothing, after which Forge passes keys/values explicitly."""
    clone = patcher.clone()
    clone.set_model_attn1_patch(lambda n, context, value, extra: (n, context, value))
    return clone


# ---------------------------------------------------------------------------------------------- the host


def test_host_adapter_finds_the_unet_and_the_placeholder(engine: forge.Engine) -> None:
    host = hosts.host_of(engine)
    assert host.name == "forge"
    assert host.unet(engine) is engine.forge_objects.unet.model.diffusion_model
    placeholder = forge.FakeInitialModel()
    assert hosts.host_of(placeholder).is_placeholder(placeholder)
    assert hosts.unet_of(placeholder) is None
    assert hosts.unet_of(forge.Engine(forge.NotAUNet())) is None


def test_first_generation_loads_lazily_and_merges_without_a_note(engine: forge.Engine) -> None:
    webui = forge.ForgeWebUI(engine, lazy=True)
    p, processed = webui.run(tome=custom_args())
    assert [(r.pass_name, r.config) for r in p.sampler.records] == [("first", FIRST)] * 3
    assert processed.extra_generation_params["ToMe ratio"] == "0.5"
    assert NOTE not in processed.extra_generation_params and "ToMe error" not in processed.extra_generation_params
    assert not patched(engine) and errors.reported == []


@pytest.mark.parametrize("tab", ["txt2img", "img2img"])
def test_off_is_bitwise_the_host_without_the_extension(engine: forge.Engine, tab: str) -> None:
    alone = forge.ForgeWebUI(engine, extension=False, lazy=False)
    p0, _ = alone.run(tab)
    webui = forge.ForgeWebUI(engine, lazy=False)
    on, _ = webui.run(tab, tome=custom_args(img2img=tab == "img2img"))
    off, processed = webui.run(tab, tome=tome_args(False, img2img=tab == "img2img"))
    assert all(torch.equal(a, b) for a, b in zip(p0.sampler.outputs(), off.sampler.outputs(), strict=True))
    assert not torch.equal(p0.sampler.outputs()[-1], on.sampler.outputs()[-1])
    assert not any(key.startswith("ToMe") for key in processed.extra_generation_params)
    assert not patched(engine)


@pytest.mark.parametrize(
    ("hires", "expected"),
    [
        ({}, [FIRST, FIRST]),
        (OWN, [FIRST, TomeConfig(ratio=0.3, sx=4, sy=4, max_downsample=2)]),
        ({"hr_mode": "off"}, [FIRST, None]),
    ],
)
def test_hires_pass_gets_its_config_after_the_discarded_hook_call(
    engine: forge.Engine, hires: dict[str, Any], expected: list[TomeConfig | None]
) -> None:
    webui = forge.ForgeWebUI(engine, lazy=False)
    p, processed = webui.run(tome=custom_args(**hires), enable_hr=True, n_iter=2, steps=2)
    seen = {(r.iteration, r.pass_name): r.config for r in p.sampler.records}
    assert seen == {
        (0, "first"): expected[0],
        (0, "hires"): expected[1],
        (1, "first"): expected[0],
        (1, "hires"): expected[1],
    }
    assert NOTE not in processed.extra_generation_params
    assert not patched(engine) and errors.reported == []


@pytest.mark.parametrize("tab", ["txt2img", "img2img"])
def test_builtin_is_switched_off_while_ours_runs(engine: forge.Engine, tab: str) -> None:
    webui = forge.ForgeWebUI(engine, lazy=False)
    shared.opts.data["token_merging_ratio"] = 0.3
    p, processed = webui.run(tab, tome=custom_args(img2img=tab == "img2img"))
    assert all(r.config == FIRST and not r.builtin for r in p.sampler.records)
    assert processed.extra_generation_params["ToMe builtin"] == "disabled"
    assert shared.opts.data["token_merging_ratio"] == 0.3
    off, processed = webui.run(tab, tome=tome_args(False, img2img=tab == "img2img"))
    assert all(r.config is None and r.builtin for r in off.sampler.records)  # the built-in as before


def test_builtin_applied_anyway_is_taken_off_this_sampling_only(
    engine: forge.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = forge.apply_token_merging
    monkeypatch.setattr(forge, "apply_token_merging", lambda e, ratio: original(e, 0.4))
    webui = forge.ForgeWebUI(engine, lazy=False)
    p, processed = webui.run(tome=custom_args(), enable_hr=True, steps=2)
    assert all(r.config is not None and not r.builtin for r in p.sampler.records)
    assert processed.extra_generation_params["ToMe builtin"] == "disabled"
    assert not forge.builtin_patched(type("E", (), {"forge_objects": engine.forge_objects_after_applying_lora})())
    assert NOTE not in processed.extra_generation_params


# ---------------------------------------------------------------------------------------------- never silent


@pytest.mark.parametrize(("mode", "verb"), [("merge", "merged in"), ("kv", "pooled keys/values in")])
def test_attention_replaced_by_another_extension_is_noted(
    engine: forge.Engine, mode: str, verb: str, caplog: pytest.LogCaptureFixture
) -> None:
    sampler = forge.ForgeSampler(other_extension=replace_all_attn1)
    alone = forge.ForgeWebUI(engine, extension=False, lazy=False)
    p0, _ = alone.run(sampler=forge.ForgeSampler(other_extension=replace_all_attn1), n_iter=2)
    webui = forge.ForgeWebUI(engine, lazy=False)
    with caplog.at_level(logging.WARNING, logger="tome"):
        p, processed = webui.run(tome=custom_args(mode=mode), sampler=sampler, n_iter=2)
    note = f"{verb} 0 of 4 blocks (attention replaced by another extension)"
    assert processed.extra_generation_params[NOTE] == note
    assert all(f"ToMe note: {note}" in text for text in processed.infotexts)
    # one log line per generation, with the version a bug report needs
    assert [r.message for r in caplog.records] == [f"ToMe {tome_core.__version__}: {note}"]
    # Nothing merged, so the images are the host's own.
    assert all(torch.equal(a, b) for a, b in zip(p0.sampler.outputs(), p.sampler.outputs(), strict=True))


def test_hires_pass_note_names_the_pass(engine: forge.Engine) -> None:
    calls = {"n": 0}

    def replace_in_hires(patcher: forge.UnetPatcher) -> forge.UnetPatcher:
        calls["n"] += 1
        return replace_all_attn1(patcher) if calls["n"] % 2 == 0 else patcher

    webui = forge.ForgeWebUI(engine, lazy=False)
    _, processed = webui.run(
        tome=custom_args(), sampler=forge.ForgeSampler(other_extension=replace_in_hires), enable_hr=True, steps=2
    )
    assert processed.extra_generation_params[NOTE] == (
        "hires pass: merged in 0 of 4 blocks (attention replaced by another extension)"
    )


@pytest.mark.parametrize("mode", ["merge", "kv"])
def test_attn1_patch_of_another_extension_still_merges(engine: forge.Engine, mode: str) -> None:
    """Once any attn1 patch exists, Forge passes keys/values explicitly: ours merges or pools them too."""
    alone = forge.ForgeWebUI(engine, extension=False, lazy=False)
    p0, _ = alone.run(sampler=forge.ForgeSampler(other_extension=pass_through_attn1_patch))
    webui = forge.ForgeWebUI(engine, lazy=False)
    plain, _ = webui.run(tome=custom_args(mode=mode))
    p, processed = webui.run(
        tome=custom_args(mode=mode), sampler=forge.ForgeSampler(other_extension=pass_through_attn1_patch)
    )
    assert NOTE not in processed.extra_generation_params
    assert not torch.equal(p0.sampler.outputs()[-1], p.sampler.outputs()[-1])
    # The pass-through patch changes nothing, so merging through it gives what merging without it gives.
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(plain.sampler.outputs(), p.sampler.outputs()))


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("how", ["wrapper", "in place"])
def test_compiled_unet_that_ignores_the_patch_is_noted(engine: forge.Engine, how: str) -> None:
    """A host that drops torch.compile's guards on modules may keep running the graph it traced before the patch:
    the UNet's own hooks run (eagerly, around the graph), its blocks' do not, and the note says so. Since ToMe marks
    the latent's sizes static for each call (a tensor guard, which such filters keep), dynamo traces again and the
    image merges: then no note. Either way the note tells what ran."""
    unet = engine.forge_objects.unet.model.diffusion_model
    options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    graphs = harness.GraphCounter()
    if how == "wrapper":
        engine.forge_objects.unet.model.diffusion_model = torch.compile(unet, backend=graphs, options=options)
    else:
        unet.compile(backend=graphs, options=options)
    webui = forge.ForgeWebUI(engine, lazy=False)
    plain, _ = webui.run(tome=tome_args(False))
    p, processed = webui.run(tome=custom_args())
    if all(torch.equal(a, b) for a, b in zip(plain.sampler.outputs(), p.sampler.outputs(), strict=True)):
        assert processed.extra_generation_params[NOTE] == (
            "merged in 0 of 4 blocks (the blocks ran without ToMe's hooks: another extension replaced them, or a "
            "torch.compile graph traced before the patch, run with its guards on modules dropped)"
        )
        assert graphs.graphs == 1
    else:
        assert NOTE not in processed.extra_generation_params and graphs.graphs == 2
    assert not patched(engine)


def test_sdxl_merges_with_auto_levels_and_notes_level_1() -> None:
    engine = forge.Engine(forge.build_unet(forge.SDXL_DEPTHS, seed=3), is_sdxl=True)
    webui = forge.ForgeWebUI(engine, lazy=False)
    _p, processed = webui.run(tome=custom_args())
    assert NOTE not in processed.extra_generation_params
    assert tome_core.describe(engine.forge_objects.unet.model.diffusion_model, 64, 64, FIRST)[0].merging == 2
    _, processed = webui.run(tome=custom_args(max_downsample="1"))
    assert processed.extra_generation_params[NOTE] == (
        "merged in 0 of 0 blocks (no transformer block at the selected downsampling levels 1; this model has them "
        "at 2, 4: try max downsample auto)"
    )


def test_model_without_a_unet_gets_a_note_not_an_error() -> None:
    engine = forge.Engine(forge.NotAUNet())
    webui = forge.ForgeWebUI(engine, lazy=True)
    _, processed = webui.run(tome=custom_args())
    # A transformer of no family ToMe reduces: the core's words, naming its class.
    assert processed.extra_generation_params[NOTE] == "not applied: NotAUNet is not a model ToMe patches"
    assert errors.reported == []


# ---------------------------------------------------------------------------------------------- no leaks


def test_failed_generation_is_healed_by_the_next(engine: forge.Engine) -> None:
    alone = forge.ForgeWebUI(engine, extension=False, lazy=False)
    p0, _ = alone.run()
    webui = forge.ForgeWebUI(engine, lazy=False)
    p = webui.make_p("txt2img", custom_args(), sampler=forge.ForgeSampler(fail_at=("first", 1)))
    with pytest.raises(RuntimeError):
        forge.process_images(p, to_load=engine)
    assert patched(engine)  # postprocess did not run, as in the host
    webui = forge.ForgeWebUI(engine, lazy=False)
    off, _ = webui.run(tome=tome_args(False))
    assert not patched(engine)
    assert all(torch.equal(a, b) for a, b in zip(p0.sampler.outputs(), off.sampler.outputs(), strict=True))


def test_checkpoint_change_leaves_the_old_unet_clean(engine: forge.Engine) -> None:
    webui = forge.ForgeWebUI(engine, lazy=False)
    p = webui.make_p("txt2img", custom_args())
    other = forge.Engine(forge.build_unet(forge.SD1_DEPTHS, seed=5))
    original = p.sampler.sample

    def switch_mid_generation(p: Any, pass_name: str, steps: int) -> Any:
        out = original(p, pass_name, steps)
        sd_models.load(other, main=True)  # a checkpoint change fires on_model_loaded for the new engine
        return out

    p.sampler.sample = switch_mid_generation
    forge.process_images(p, to_load=engine)
    webui.run(tome=tome_args(False))
    assert not patched(engine) and not patched(other)


@pytest.mark.usefixtures("fresh_dynamo")
def test_reforge_torch_compile_runs_tome_merged() -> None:
    """reForge's `--torch-compile` puts a compiled wrapper at `diffusion_model` when the model loads: the patch goes
    on the module it wraps, whose graph traces again (once), and the image is the eager merged one. A second
    generation compiles nothing; one without ToMe is the compiled image without ToMe again."""
    eager_engine = forge.Engine(forge.build_unet(forge.SD1_DEPTHS, seed=0))
    eager, _ = forge.ForgeWebUI(eager_engine, lazy=False).run(tome=custom_args())
    engine = forge.Engine(forge.build_unet(forge.SD1_DEPTHS, seed=0))
    graphs = harness.GraphCounter()
    unet = forge.reforge_torch_compile(engine, graphs)
    webui = forge.ForgeWebUI(engine, lazy=False)
    plain, _ = webui.run(tome=tome_args(False))
    merged, processed = webui.run(tome=custom_args())
    assert NOTE not in processed.extra_generation_params
    assert {r.config for r in merged.sampler.records} == {FIRST}
    assert not torch.equal(merged.sampler.outputs()[-1], plain.sampler.outputs()[-1])
    outputs = zip(merged.sampler.outputs(), eager.sampler.outputs(), strict=True)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in outputs)
    assert graphs.graphs == 2
    webui.run(tome=custom_args())
    off, _ = webui.run(tome=tome_args(False))
    assert graphs.graphs == 2
    assert all(torch.equal(a, b) for a, b in zip(off.sampler.outputs(), plain.sampler.outputs(), strict=True))
    assert not tome_core.is_patched(unet) and errors.reported == []
