"""The extension in a Forge Neo-shaped host (`webui_stub.neo`): Forge 2's order and model objects, Neo's own
`apply_token_merging` (with its epsilon scaling), its engines without a UNet and its built-in Torch Compile Integrated,
each as read from Neo's tree and seen running it (docs/hosts.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import errors, shared
from webui_stub import forge, neo
from webui_stub.harness import custom_args, tome_args

import tome_core
from tome_core import TomeConfig
from tome_webui import hosts

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


@pytest.mark.parametrize("model", neo.TRANSFORMER_ENGINES, ids=lambda m: m.__name__)
def test_model_without_a_unet_gets_a_note_and_the_host_image(model: type[neo.Flux]) -> None:
    engine = model()
    p0, _ = neo.NeoWebUI(engine, extension=False, lazy=False).run()
    webui = neo.NeoWebUI(engine, lazy=True)
    p, processed = webui.run(tome=custom_args())
    assert processed.extra_generation_params[NOTE] == f"not applied: {model.__name__} has no UNet to patch"
    assert all(torch.equal(a, b) for a, b in zip(p0.sampler.outputs(), p.sampler.outputs(), strict=True))
    assert errors.reported == []


def test_off_is_bitwise_the_host_without_the_extension(engine: neo.StableDiffusion) -> None:
    p0, _ = neo.NeoWebUI(engine, extension=False, lazy=False).run(enable_hr=True, steps=2)
    webui = neo.NeoWebUI(engine, lazy=False)
    webui.run(tome=custom_args(), enable_hr=True, steps=2)
    off, processed = webui.run(tome=tome_args(False), enable_hr=True, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(p0.sampler.outputs(), off.sampler.outputs(), strict=True))
    assert not any(key.startswith("ToMe") for key in processed.extra_generation_params)


# ---------------------------------------------------------------------------------------------- Torch Compile


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Each test traces its own UNet: without a reset, the recompile limit makes dynamo fall back to eager."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


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
